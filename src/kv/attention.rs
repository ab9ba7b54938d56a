//! Fused single-query ("decode step") attention over the KV cache.
//!
//! During generation each forward pass carries one new token, so attention is a handful of
//! matrix–vector products. candle's generic path (`matmul` → `softmax` → `matmul`) pays for a
//! GEMM dispatch, a strided copy of the cache view and two intermediate tensors per layer; here
//! the scores, softmax and weighted sum of values are fused and read K and V straight out of
//! the cache buffers.
//!
//! Design:
//! - **This is the one seam where the attention kernel is backend-specific.** The decoder calls
//!   [`decode_attention`] with the query and the cache views returned by
//!   [`KvCache::append`](super::KvCache::append); when it returns `None` the decoder falls back
//!   to the generic candle ops. A CUDA paged-attention kernel (block tables into a shared KV
//!   pool) is meant to replace the CPU path *here*, behind the same signature, without the
//!   decoder changing.
//! - Applies when the device is CPU, all of q/K/V are f32, and there is one query (`seq == 1`,
//!   no mask needed: the query sees every cached position). Anything else returns `None`.
//! - Grouped-query attention: query head `h` reads KV head `h / (num_heads / num_kv_heads)`.
//!   The work is split per KV head so the query heads of a group share every K/V row load.
//! - Numerics match the generic path: scores `q·k · 1/sqrt(head_dim)` in f32, softmax with
//!   max-subtraction in f32, then `Σ p·v` in f32.
//! - KV heads run in parallel (rayon, on the current pool) when the cache is large enough to
//!   repay the fork/join; small caches run inline. The only allocation per layer is the output
//!   tensor; scores live in a thread-local scratch buffer that only ever grows.
//! - An AVX2+FMA path is chosen at run time (`is_x86_feature_detected!`); a portable scalar
//!   path covers everything else.

use std::cell::RefCell;

use candle_core::{CpuStorage, DType, Storage, Tensor};
use rayon::prelude::*;

use crate::error::Result;

/// Below this many K elements per layer (`kv_heads · len · head_dim`), run inline: the
/// fork/join costs more than the work (a few µs).
const PAR_MIN_ELEMS: usize = 1 << 15;

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Attention for one query position. `q` is `[num_heads, 1, head_dim]`; `k` and `v` are the
/// cache views `[num_kv_heads, len, head_dim]` (rows contiguous, heads at any stride). Returns
/// `[1, num_heads * head_dim]` (heads concatenated, ready for `o_proj`), or `None` when this
/// kernel does not apply and the caller must use the generic path.
pub fn decode_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Option<Tensor>> {
    if !q.device().is_cpu() || q.dtype() != DType::F32 || k.dtype() != DType::F32 || v.dtype() != DType::F32 {
        return Ok(None);
    }
    let (Ok((nh, one, hd)), Ok((nkv, len, khd)), Ok(vdims)) = (q.dims3(), k.dims3(), v.dims3()) else {
        return Ok(None);
    };
    if one != 1 || khd != hd || vdims != (nkv, len, hd) || nkv == 0 || nh % nkv != 0 || hd == 0 || len == 0 {
        return Ok(None);
    }
    let (qs, ql) = q.storage_and_layout();
    let (ks, kl) = k.storage_and_layout();
    let (vs, vl) = v.storage_and_layout();
    let (Storage::Cpu(CpuStorage::F32(qd)), Storage::Cpu(CpuStorage::F32(kd)), Storage::Cpu(CpuStorage::F32(vd))) =
        (&*qs, &*ks, &*vs)
    else {
        return Ok(None);
    };
    let Some((q0, q1)) = ql.contiguous_offsets() else { return Ok(None) };
    let (Some(kv_k), Some(kv_v)) = (KvHeads::new(kd, kl, nkv, len, hd), KvHeads::new(vd, vl, nkv, len, hd)) else {
        return Ok(None);
    };
    let mut out = vec![0f32; nh * hd];
    attend(&qd[q0..q1], &kv_k, &kv_v, nkv, nh / nkv, len, hd, &mut out, Simd::detect());
    drop((qs, ks, vs));
    Ok(Some(Tensor::from_vec(out, (1, nh * hd), q.device())?))
}

/// One layer's K (or V) in the cache: head `g`'s rows are `data[g * head_stride..][..len * hd]`.
struct KvHeads<'a> {
    data: &'a [f32],
    head_stride: usize,
    len: usize,
}

impl<'a> KvHeads<'a> {
    /// Accepts `[heads, len, hd]` layouts with contiguous rows (row stride `hd`, element
    /// stride 1) and any head stride, checking that every row lies inside `data`.
    fn new(data: &'a [f32], l: &candle_core::Layout, heads: usize, len: usize, hd: usize) -> Option<Self> {
        let st = l.stride();
        if st.len() != 3 || (st[2] != 1 && hd > 1) || (st[1] != hd && len > 1) {
            return None;
        }
        let start = l.start_offset();
        let end = start + (heads - 1) * st[0] + len * hd;
        if end > data.len() {
            return None;
        }
        Some(Self { data: &data[start..end], head_stride: st[0], len })
    }

    fn head(&self, g: usize, hd: usize) -> &'a [f32] {
        &self.data[g * self.head_stride..][..self.len * hd]
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Simd {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2Fma,
}

impl Simd {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            return Simd::Avx2Fma;
        }
        Simd::Scalar
    }
}

/// `q`: `[nkv * rep, hd]`; `out`: same shape. Splits per KV head, in parallel when large.
#[allow(clippy::too_many_arguments)]
fn attend(q: &[f32], k: &KvHeads, v: &KvHeads, nkv: usize, rep: usize, len: usize, hd: usize, out: &mut [f32], simd: Simd) {
    let scale = 1.0 / (hd as f32).sqrt();
    let group = |g: usize, o: &mut [f32]| {
        SCORES.with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < rep * len {
                s.resize(rep * len, 0.0);
            }
            let q = &q[g * rep * hd..(g + 1) * rep * hd];
            attend_group(q, k.head(g, hd), v.head(g, hd), len, hd, rep, scale, &mut s[..rep * len], o, simd);
        })
    };
    if nkv > 1 && nkv * len * hd >= PAR_MIN_ELEMS {
        out.par_chunks_mut(rep * hd).enumerate().for_each(|(g, o)| group(g, o));
    } else {
        out.chunks_mut(rep * hd).enumerate().for_each(|(g, o)| group(g, o));
    }
}

/// One KV head and its `rep` query heads. `q`, `out`: `[rep, hd]`; `k`, `v`: `[len, hd]`;
/// `sc`: `[rep, len]` scratch.
#[allow(clippy::too_many_arguments)]
fn attend_group(q: &[f32], k: &[f32], v: &[f32], len: usize, hd: usize, rep: usize, scale: f32, sc: &mut [f32], out: &mut [f32], simd: Simd) {
    assert!(q.len() == rep * hd && out.len() == rep * hd && k.len() == len * hd && v.len() == len * hd && sc.len() == rep * len);
    match simd {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx2Fma` is only constructed after detecting avx2 and fma; the lengths the
        // kernel relies on were asserted above.
        Simd::Avx2Fma => unsafe { avx2::scores(q, k, len, hd, rep, scale, sc) },
        Simd::Scalar => scalar_scores(q, k, len, hd, rep, scale, sc),
    }
    for s in sc.chunks_mut(len) {
        softmax_in_place(s);
    }
    match simd {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Simd::Avx2Fma => unsafe { avx2::weighted_sum(sc, v, len, hd, rep, out) },
        Simd::Scalar => scalar_weighted_sum(sc, v, len, hd, rep, out),
    }
}

fn softmax_in_place(s: &mut [f32]) {
    let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for x in s.iter_mut() {
        *x = (*x - m).exp();
        sum += *x;
    }
    let inv = 1.0 / sum;
    s.iter_mut().for_each(|x| *x *= inv);
}

fn scalar_scores(q: &[f32], k: &[f32], len: usize, hd: usize, rep: usize, scale: f32, sc: &mut [f32]) {
    for (j, kr) in k.chunks_exact(hd).enumerate() {
        for (r, qr) in q.chunks_exact(hd).take(rep).enumerate() {
            sc[r * len + j] = qr.iter().zip(kr).map(|(a, b)| a * b).sum::<f32>() * scale;
        }
    }
}

fn scalar_weighted_sum(sc: &[f32], v: &[f32], len: usize, hd: usize, rep: usize, out: &mut [f32]) {
    out.fill(0.0);
    for (j, vr) in v.chunks_exact(hd).enumerate() {
        for (r, o) in out.chunks_exact_mut(hd).enumerate().take(rep) {
            let p = sc[r * len + j];
            o.iter_mut().zip(vr).for_each(|(o, x)| *o += p * x);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The only unsafe code here: 8-wide loads/stores through raw pointers. Every pointer
    //! stays inside a slice whose length the caller asserted (`[rep, hd]` / `[len, hd]`), and
    //! each 8-wide access at column `c` satisfies `c + 8 <= hd`; columns past the last
    //! multiple of 8 are handled with scalar code.
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(v: __m256) -> f32 {
        let a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let a = _mm_add_ps(a, _mm_movehl_ps(a, a));
        let a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
        _mm_cvtss_f32(a)
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot(a: *const f32, b: *const f32, hd: usize) -> f32 {
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut c = 0;
        while c + 16 <= hd {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(c)), _mm256_loadu_ps(b.add(c)), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(c + 8)), _mm256_loadu_ps(b.add(c + 8)), a1);
            c += 16;
        }
        if c + 8 <= hd {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(c)), _mm256_loadu_ps(b.add(c)), a0);
            c += 8;
        }
        let mut s = hsum(_mm256_add_ps(a0, a1));
        while c < hd {
            s += *a.add(c) * *b.add(c);
            c += 1;
        }
        s
    }

    /// `sc[r * len + j] = q[r] · k[j] * scale`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn scores(q: &[f32], k: &[f32], len: usize, hd: usize, rep: usize, scale: f32, sc: &mut [f32]) {
        for j in 0..len {
            let kr = k.as_ptr().add(j * hd);
            for r in 0..rep {
                sc[r * len + j] = dot(q.as_ptr().add(r * hd), kr, hd) * scale;
            }
        }
    }

    /// `out[r] = Σ_j sc[r * len + j] · v[j]`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn weighted_sum(sc: &[f32], v: &[f32], len: usize, hd: usize, rep: usize, out: &mut [f32]) {
        out.fill(0.0);
        for j in 0..len {
            let vr = v.as_ptr().add(j * hd);
            for r in 0..rep {
                let p = sc[r * len + j];
                let w = _mm256_set1_ps(p);
                let o = out.as_mut_ptr().add(r * hd);
                let mut c = 0;
                while c + 8 <= hd {
                    _mm256_storeu_ps(o.add(c), _mm256_fmadd_ps(w, _mm256_loadu_ps(vr.add(c)), _mm256_loadu_ps(o.add(c))));
                    c += 8;
                }
                while c < hd {
                    *o.add(c) += p * *vr.add(c);
                    c += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// The generic path the decoder uses otherwise: matmul → softmax → matmul.
    fn reference(q: &Tensor, k: &Tensor, v: &Tensor) -> Tensor {
        let (nh, _, hd) = q.dims3().unwrap();
        let nkv = k.dim(0).unwrap();
        let q = q.reshape((nkv, nh / nkv, hd)).unwrap();
        let scores = (q.matmul(&k.t().unwrap()).unwrap() * (1.0 / (hd as f64).sqrt())).unwrap();
        let probs = candle_nn::ops::softmax_last_dim(&scores).unwrap();
        probs.matmul(v).unwrap().reshape((1, nh * hd)).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
    }

    #[test]
    fn matches_generic_path() {
        let dev = Device::Cpu;
        let mut paths = vec![Simd::Scalar];
        if Simd::detect() != Simd::Scalar {
            paths.push(Simd::detect());
        }
        for (nh, nkv) in [(8, 2), (8, 1), (4, 4)] {
            for hd in [16, 64, 128] {
                for len in [1, 17, 300] {
                    // Cache-shaped buffers with spare capacity, viewed like `KvCache::append` does.
                    let cap = len + 7;
                    let q = Tensor::randn(0f32, 1.0, (nh, 1, hd), &dev).unwrap();
                    let kb = (Tensor::randn(0f32, 1.0, (nkv, cap, hd), &dev).unwrap() * 2.0).unwrap();
                    let vb = Tensor::randn(0f32, 1.0, (nkv, cap, hd), &dev).unwrap();
                    let (k, v) = (kb.narrow(1, 0, len).unwrap(), vb.narrow(1, 0, len).unwrap());
                    let want = reference(&q, &k, &v);
                    let got = decode_attention(&q, &k, &v).unwrap().expect("kernel applies");
                    assert_eq!(got.dims(), &[1, nh * hd]);
                    let d = max_diff(&got, &want);
                    assert!(d < 1e-5, "nh={nh} nkv={nkv} hd={hd} len={len}: max |Δ| = {d}");
                    // Each SIMD path explicitly, too.
                    let qv = q.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                    let (kd, vd) = (kb.flatten_all().unwrap().to_vec1::<f32>().unwrap(), vb.flatten_all().unwrap().to_vec1::<f32>().unwrap());
                    let kh = KvHeads { data: &kd, head_stride: cap * hd, len };
                    let vh = KvHeads { data: &vd, head_stride: cap * hd, len };
                    for &simd in &paths {
                        let mut out = vec![0f32; nh * hd];
                        attend(&qv, &kh, &vh, nkv, nh / nkv, len, hd, &mut out, simd);
                        let got = Tensor::from_vec(out, (1, nh * hd), &dev).unwrap();
                        let d = max_diff(&got, &want);
                        assert!(d < 1e-5, "{simd:?} nh={nh} nkv={nkv} hd={hd} len={len}: max |Δ| = {d}");
                    }
                }
            }
        }
    }

    #[test]
    fn declines_other_cases() {
        let dev = Device::Cpu;
        let q = Tensor::zeros((4, 2, 16), DType::F32, &dev).unwrap(); // two queries
        let k = Tensor::zeros((2, 5, 16), DType::F32, &dev).unwrap();
        assert!(decode_attention(&q, &k, &k).unwrap().is_none());
        let q = Tensor::zeros((4, 1, 16), DType::F16, &dev).unwrap();
        let k16 = k.to_dtype(DType::F16).unwrap();
        assert!(decode_attention(&q, &k16, &k16).unwrap().is_none());
        // Rows not contiguous (a transposed view).
        let q = Tensor::zeros((4, 1, 16), DType::F32, &dev).unwrap();
        let kt = Tensor::zeros((2, 16, 5), DType::F32, &dev).unwrap().transpose(1, 2).unwrap();
        assert!(decode_attention(&q, &kt, &kt).unwrap().is_none());
    }
}
