//! Our own Q8_0 matrix–vector kernel for CPU decode (one activation row at a time).
//!
//! Design:
//! - **Layout.** At load a `[n, k]` Q8_0 tensor (34-byte blocks: f16 scale + 32 i8) is repacked
//!   into groups of 4 output rows. For each block column `b` a group stores the four scales as
//!   f32 (16 B, converted once from f16, exactly) followed by the four rows' 32 quants (128 B):
//!   144 B per block-quad. One pass over a group streams 4 rows with one contiguous read and
//!   reuses each activation block 4 times. `n` is padded up to a multiple of 4 with zero rows
//!   (scale 0), never written to the output. Size: 36 B per 32 weights (Q8_0: 34 B), and this
//!   is the only copy kept: prefill (≥ 32 rows) and embeddings dequantize from it.
//! - **Numerics.** The activation row is quantized to Q8_0 exactly like ggml/candle
//!   (`d = amax / 127`, `q = round(x / d)` with `1/d` from the unrounded `d`, `d` stored
//!   through f16), and each output is `Σ_blocks (d_w · d_x) · Σ q_w q_x` accumulated in an
//!   8-lane f32 FMA vector then horizontally summed in candle's order (the AVX2 path is the
//!   same arithmetic as candle's AVX2 `vec_dot_q8_0_q8_0`; on CPUs with AVX-512 VNNI candle
//!   takes other kernels that quantize activations in 256-blocks, so candle is not a bit-exact
//!   reference). The portable path (no AVX2/FMA, or `EXPERT_RUNTIME_SIMD=portable`) sums
//!   blocks sequentially. Tests hold every path to the exact f64 product of the dequantized
//!   weights and the quantized activations, within the f32 summation bound.
//! - **Threads.** Output rows are split into chunks of whole 4-row groups on rayon (candle's
//!   own pool spins on a barrier); small matrices run on the calling thread.
//! - **Allocation.** Besides the output, none per call: the quantized activation lives in a
//!   thread-local scratch (a fresh one is used if that scratch is already borrowed, e.g. a
//!   re-entrant call from rayon work stealing).

use std::cell::RefCell;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Tensor};
use half::f16;
use rayon::prelude::*;

use crate::error::{EngineError, Result};
use crate::simd::{self, Level};

/// Q8_0 block length.
pub const QK: usize = 32;
const Q8_0_BYTES: usize = 2 + QK;
/// Bytes of one block column of a 4-row group: 4 f32 scales + 4 × 32 quants.
const GROUP_BLOCK_BYTES: usize = 4 * 4 + 4 * QK;

/// A `[n, k]` Q8_0 weight repacked in 4-row groups (see the module note).
pub struct PackedQ8_0 {
    data: Vec<u8>,
    n: usize,
    k: usize,
}

thread_local! {
    static SCRATCH: RefCell<(Vec<i8>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Quantizes `x` (`len = k`) to Q8_0 exactly as candle's `BlockQ8_0::from_float`; the scales
/// are returned already widened to f32 (the f16 rounding is kept).
pub fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32]) {
    match simd::level() {
        // SAFETY: `Avx2Fma` is only constructed after AVX2 and FMA were detected.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2Fma => unsafe { quantize_row_avx2(x, q, d) },
        Level::Portable => quantize_row_body(x, q, d),
    }
}

/// The same code compiled for AVX2: `round` becomes an exact inline sequence instead of a
/// `roundf` call per value (quantize-on-load runs it over every weight).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_row_avx2(x: &[f32], q: &mut [i8], d: &mut [f32]) {
    quantize_row_body(x, q, d)
}

#[inline(always)]
fn quantize_row_body(x: &[f32], q: &mut [i8], d: &mut [f32]) {
    for (b, xs) in x.chunks_exact(QK).enumerate() {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let s = amax / 127.0;
        let id = if s != 0.0 { 1.0 / s } else { 0.0 };
        d[b] = f16::from_f32(s).to_f32();
        for (o, v) in q[b * QK..(b + 1) * QK].iter_mut().zip(xs) {
            *o = (v * id).round() as i8;
        }
    }
}

impl PackedQ8_0 {
    /// `x [rows, k]` (any float dtype, CPU) → `[rows, n]` in `x`'s dtype: the packed kernel for
    /// few rows, a dense GEMM over the dequantized weight from `dense_from_rows` rows on.
    pub fn forward(&self, x: &Tensor, dense_from_rows: usize) -> Result<Tensor> {
        let rows = x.dim(0)?;
        if rows >= dense_from_rows {
            let w = Tensor::from_vec(self.dequantize(), (self.rows(), self.cols()), x.device())?.to_dtype(x.dtype())?;
            return Ok(x.matmul(&w.t()?)?);
        }
        let xf = x.to_dtype(DType::F32)?.contiguous()?;
        let mut out = vec![0f32; rows * self.rows()];
        {
            let (storage, layout) = xf.storage_and_layout();
            let candle_core::Storage::Cpu(cpu) = &*storage else {
                return Err(EngineError::InvalidModel("a packed Q8_0 weight needs a CPU tensor".into()));
            };
            let xs = &cpu.as_slice::<f32>()?[layout.start_offset()..][..rows * self.cols()];
            self.matmul(xs, rows, &mut out);
        }
        Ok(Tensor::from_vec(out, (rows, self.rows()), x.device())?.to_dtype(x.dtype())?)
    }

    /// Rows `ids` of the weight, dequantized: `[ids.., k]` in f32.
    pub fn embedding(&self, ids: &Tensor) -> Result<Tensor> {
        let ids_v: Vec<u32> = ids.flatten_all()?.to_dtype(DType::U32)?.to_vec1()?;
        let k = self.cols();
        let mut out = vec![0f32; ids_v.len() * k];
        for (&id, row) in ids_v.iter().zip(out.chunks_exact_mut(k)) {
            if id as usize >= self.rows() {
                return Err(EngineError::InvalidArgument(format!(
                    "token id {id} out of range for an embedding of {} rows",
                    self.rows()
                )));
            }
            self.dequantize_row(id as usize, row);
        }
        let mut dims = ids.dims().to_vec();
        dims.push(k);
        Ok(Tensor::from_vec(out, dims, ids.device())?)
    }

    /// Quantizes a `[n, k]` matrix straight into the packed layout (quantize on load): `row(r,
    /// out)` writes row `r` in f32 into `out` (`len = k`). The blocks are those of
    /// [`quantize_row`] (candle's and ggml's Q8_0 quantizer), so the result equals
    /// [`Self::from_qtensor`] of the same matrix quantized by candle. Groups of 4 rows run in
    /// parallel; a failing `row` fails the whole.
    pub fn from_rows(n: usize, k: usize, row: impl Fn(usize, &mut [f32]) -> Result<()> + Sync) -> Result<Self> {
        if n == 0 || k == 0 || !k.is_multiple_of(QK) {
            return Err(EngineError::Internal(format!("a [{n}, {k}] matrix cannot be packed as Q8_0")));
        }
        let nb = k / QK;
        let gbytes = nb * GROUP_BLOCK_BYTES;
        let mut data = Vec::new();
        data.try_reserve_exact(n.div_ceil(4) * gbytes)
            .map_err(|_| EngineError::OutOfMemory(format!("cannot allocate a [{n}, {k}] Q8_0 matrix")))?;
        data.resize(n.div_ceil(4) * gbytes, 0u8);
        data.par_chunks_mut(gbytes).enumerate().try_for_each_init(
            || (vec![0f32; k], vec![0i8; k], vec![0f32; nb]),
            |(x, q, d), (g, dst)| -> Result<()> {
                for r in 0..4.min(n - g * 4) {
                    row(g * 4 + r, x)?;
                    quantize_row(x, q, d);
                    for b in 0..nb {
                        let o = b * GROUP_BLOCK_BYTES;
                        dst[o + r * 4..o + r * 4 + 4].copy_from_slice(&d[b].to_le_bytes());
                        for (t, &v) in dst[o + 16 + r * QK..o + 16 + (r + 1) * QK].iter_mut().zip(&q[b * QK..(b + 1) * QK]) {
                            *t = v as u8;
                        }
                    }
                }
                Ok(())
            },
        )?;
        Ok(Self { data, n, k })
    }

    /// Repacks a 2-D Q8_0 `QTensor` of shape `[n, k]`.
    pub fn from_qtensor(q: &QTensor) -> Result<Self> {
        if q.dtype() != GgmlDType::Q8_0 {
            return Err(EngineError::InvalidModel(format!("PackedQ8_0 needs Q8_0, got {:?}", q.dtype())));
        }
        let (n, k) = q.shape().dims2()?;
        Ok(Self::from_q8_0_bytes(&q.data()?, n, k))
    }

    /// Repacks raw GGUF Q8_0 blocks (row-major, `k / 32` blocks per row).
    pub fn from_q8_0_bytes(bytes: &[u8], n: usize, k: usize) -> Self {
        assert!(k.is_multiple_of(QK), "Q8_0 row length {k} is not a multiple of {QK}");
        let nb = k / QK;
        assert_eq!(bytes.len(), n * nb * Q8_0_BYTES, "Q8_0 byte count does not match [{n}, {k}]");
        let groups = n.div_ceil(4);
        let gbytes = nb * GROUP_BLOCK_BYTES;
        let mut data = vec![0u8; groups * gbytes];
        data.par_chunks_mut(gbytes).enumerate().for_each(|(g, dst)| {
            for r in 0..4 {
                let row = g * 4 + r;
                if row >= n {
                    break; // padding rows stay zero (scale 0)
                }
                for b in 0..nb {
                    let src = &bytes[(row * nb + b) * Q8_0_BYTES..][..Q8_0_BYTES];
                    let d = f16::from_le_bytes([src[0], src[1]]).to_f32();
                    let o = b * GROUP_BLOCK_BYTES;
                    dst[o + r * 4..o + r * 4 + 4].copy_from_slice(&d.to_le_bytes());
                    dst[o + 16 + r * QK..o + 16 + (r + 1) * QK].copy_from_slice(&src[2..]);
                }
            }
        });
        Self { data, n, k }
    }

    pub fn rows(&self) -> usize {
        self.n
    }

    pub fn cols(&self) -> usize {
        self.k
    }

    pub fn size_in_bytes(&self) -> usize {
        self.data.len()
    }

    fn group(&self, g: usize) -> &[u8] {
        let gbytes = self.k / QK * GROUP_BLOCK_BYTES;
        &self.data[g * gbytes..(g + 1) * gbytes]
    }

    /// Row `r` dequantized (`q · d`, as candle's `to_float`) into `out` (`len = k`).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.n && out.len() == self.k);
        let g = self.group(r / 4);
        let i = r % 4;
        for (b, o) in out.chunks_exact_mut(QK).enumerate() {
            let blk = &g[b * GROUP_BLOCK_BYTES..][..GROUP_BLOCK_BYTES];
            let d = f32::from_le_bytes(blk[i * 4..i * 4 + 4].try_into().unwrap());
            for (v, &q) in o.iter_mut().zip(&blk[16 + i * QK..16 + (i + 1) * QK]) {
                *v = q as i8 as f32 * d;
            }
        }
    }

    /// The whole matrix dequantized, row-major `[n, k]`.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.n * self.k];
        out.par_chunks_mut(self.k).enumerate().for_each(|(r, o)| self.dequantize_row(r, o));
        out
    }

    /// `out[i] = Σ_j W[i, j] x[j]` for one activation row (`x.len() = k`, `out.len() = n`),
    /// with `x` quantized to Q8_0 first (candle's `QMatMul` semantics).
    pub fn gemv(&self, x: &[f32], out: &mut [f32]) {
        self.gemv_at(simd::level(), x, out)
    }

    fn gemv_at(&self, level: Level, x: &[f32], out: &mut [f32]) {
        assert_eq!(x.len(), self.k);
        assert_eq!(out.len(), self.n);
        let nb = self.k / QK;
        let run = |xq: &mut Vec<i8>, xd: &mut Vec<f32>, out: &mut [f32]| {
            xq.resize(self.k, 0);
            xd.resize(nb, 0.0);
            quantize_row(x, xq, xd);
            self.gemv_quantized(level, xq, xd, out);
        };
        SCRATCH.with(|s| match s.try_borrow_mut() {
            Ok(mut s) => {
                let (xq, xd) = &mut *s;
                run(xq, xd, out)
            }
            Err(_) => run(&mut Vec::new(), &mut Vec::new(), out),
        })
    }

    /// `gemv` for each of `rows` activation rows (`x`: `[rows, k]`, `out`: `[rows, n]`).
    /// Rows are quantized once, then every group of 4 weight rows is read once for all of them
    /// (it stays in cache while the activation rows stream past), so a batch of decode rows
    /// costs about one pass over the weights. Each output is the same integer block dot as in
    /// [`Self::gemv`]: a row's result does not depend on the rows batched with it.
    pub fn matmul(&self, x: &[f32], rows: usize, out: &mut [f32]) {
        self.matmul_at(simd::level(), x, rows, out)
    }

    fn matmul_at(&self, level: Level, x: &[f32], rows: usize, out: &mut [f32]) {
        assert_eq!(x.len(), rows * self.k);
        assert_eq!(out.len(), rows * self.n);
        if rows == 1 {
            return self.gemv_at(level, x, out);
        }
        let nb = self.k / QK;
        let mut xq = vec![0i8; rows * self.k];
        let mut xd = vec![0f32; rows * nb];
        xq.par_chunks_mut(self.k)
            .zip(xd.par_chunks_mut(nb))
            .zip(x.par_chunks(self.k))
            .for_each(|((q, d), xr)| quantize_row(xr, q, d));
        let groups = self.n.div_ceil(4);
        // `t[g][row][0..4]`: the group's four outputs for each row, transposed into `out` after.
        let mut t = vec![0f32; groups * rows * 4];
        let threads = rayon::current_num_threads().max(1);
        let chunk_groups = groups.div_ceil(threads * 4).max(1);
        t.par_chunks_mut(chunk_groups * rows * 4).enumerate().for_each(|(c, tc)| {
            for (i, tg) in tc.chunks_mut(rows * 4).enumerate() {
                let gd = self.group(c * chunk_groups + i);
                for (r, acc) in tg.chunks_exact_mut(4).enumerate() {
                    let acc: &mut [f32; 4] = acc.try_into().expect("chunks of 4");
                    let (q, d) = (&xq[r * self.k..(r + 1) * self.k], &xd[r * nb..(r + 1) * nb]);
                    group4(level, gd, nb, q, d, acc);
                }
            }
        });
        for (r, o) in out.chunks_exact_mut(self.n).enumerate() {
            for (g, og) in o.chunks_mut(4).enumerate() {
                let src = &t[(g * rows + r) * 4..][..og.len()];
                og.copy_from_slice(src);
            }
        }
    }

    fn gemv_quantized(&self, level: Level, xq: &[i8], xd: &[f32], out: &mut [f32]) {
        let nb = self.k / QK;
        let groups = self.n.div_ceil(4);
        // One group: 4 output rows (fewer in the last, padded group).
        let do_group = |g: usize, o: &mut [f32]| {
            let mut acc = [0f32; 4];
            group4(level, self.group(g), nb, xq, xd, &mut acc);
            o.copy_from_slice(&acc[..o.len()]);
        };
        // Chunk of whole groups per task: at least ~64 KiB of weights, and ~4 tasks per thread.
        let threads = rayon::current_num_threads().max(1);
        let min_groups = (64 * 1024 / (nb * GROUP_BLOCK_BYTES)).max(1);
        let chunk_groups = groups.div_ceil(threads * 4).max(min_groups);
        if groups <= chunk_groups || threads == 1 {
            for (g, o) in out.chunks_mut(4).enumerate() {
                do_group(g, o);
            }
        } else {
            out.par_chunks_mut(chunk_groups * 4).enumerate().for_each(|(c, oc)| {
                for (i, o) in oc.chunks_mut(4).enumerate() {
                    do_group(c * chunk_groups + i, o);
                }
            });
        }
    }
}

/// Four rows of one group against a quantized activation row, on `level`'s path.
fn group4(level: Level, gd: &[u8], nb: usize, xq: &[i8], xd: &[f32], acc: &mut [f32; 4]) {
    debug_assert!(gd.len() >= nb * GROUP_BLOCK_BYTES && xq.len() >= nb * QK && xd.len() >= nb);
    match level {
        // SAFETY: `Avx2Fma` is only constructed after AVX2 and FMA were detected; `gd` holds
        // `nb` block-quads of `GROUP_BLOCK_BYTES`, `xq` `nb * 32` quants and `xd` `nb` scales
        // (every caller slices them so; checked in debug builds above).
        #[cfg(target_arch = "x86_64")]
        Level::Avx2Fma => unsafe { avx2::group4(gd, nb, xq, xd, acc) },
        Level::Portable => group4_scalar(gd, nb, xq, xd, acc),
    }
}

/// Portable fallback: per row, integer block dot, scaled and summed in f32.
fn group4_scalar(gd: &[u8], nb: usize, xq: &[i8], xd: &[f32], acc: &mut [f32; 4]) {
    for b in 0..nb {
        let blk = &gd[b * GROUP_BLOCK_BYTES..][..GROUP_BLOCK_BYTES];
        let xb = &xq[b * QK..(b + 1) * QK];
        for (r, a) in acc.iter_mut().enumerate() {
            let dw = f32::from_le_bytes(blk[r * 4..r * 4 + 4].try_into().unwrap());
            let qs = &blk[16 + r * QK..16 + (r + 1) * QK];
            let s: i32 = qs.iter().zip(xb).map(|(&w, &x)| (w as i8 as i32) * (x as i32)).sum();
            *a += (dw * xd[b]) * s as f32;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{GROUP_BLOCK_BYTES, QK};
    use std::arch::x86_64::*;

    /// 8 lanes of i32 pair sums of `x · y` as f32 (ggml's `mul_sum_i8_pairs_float`): `|x|`
    /// times `y` with `x`'s sign, so `maddubs` (u8 × i8) applies; no saturation as
    /// `|q| ≤ 127` (2 · 127² < 2¹⁵).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn mul_sum_i8_pairs_float(x: __m256i, y: __m256i) -> __m256 {
        let ax = _mm256_sign_epi8(x, x);
        let sy = _mm256_sign_epi8(y, x);
        let p16 = _mm256_maddubs_epi16(ax, sy);
        let p32 = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
        _mm256_cvtepi32_ps(p32)
    }

    /// Horizontal sum in candle's `hsum_float_8` order.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum_float_8(x: __m256) -> f32 {
        let res = _mm256_extractf128_ps(x, 1);
        let res = _mm_add_ps(res, _mm256_castps256_ps128(x));
        let res = _mm_add_ps(res, _mm_movehl_ps(res, res));
        let res = _mm_add_ss(res, _mm_movehdup_ps(res));
        _mm_cvtss_f32(res)
    }

    /// Four rows of one group against the quantized activation.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; `gd.len() >= nb * GROUP_BLOCK_BYTES`,
    /// `xq.len() >= nb * 32`, `xd.len() >= nb`. All loads are unaligned loads inside those
    /// slices (checked by the debug asserts).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn group4(gd: &[u8], nb: usize, xq: &[i8], xd: &[f32], out: &mut [f32; 4]) {
        debug_assert!(gd.len() >= nb * GROUP_BLOCK_BYTES && xq.len() >= nb * QK && xd.len() >= nb);
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut p = gd.as_ptr();
        for b in 0..nb {
            let y = _mm256_loadu_si256(xq.as_ptr().add(b * QK) as *const __m256i);
            let dy = *xd.get_unchecked(b);
            let qs = p.add(16);
            for (r, a) in acc.iter_mut().enumerate() {
                let dw = std::ptr::read_unaligned((p as *const f32).add(r));
                let x = _mm256_loadu_si256(qs.add(r * QK) as *const __m256i);
                // Same operand order as candle: d = d_w · d_x, acc = d · q + acc.
                let d = _mm256_set1_ps(dw * dy);
                *a = _mm256_fmadd_ps(d, mul_sum_i8_pairs_float(x, y), *a);
            }
            p = p.add(GROUP_BLOCK_BYTES);
        }
        for r in 0..4 {
            out[r] = hsum_float_8(acc[r]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::QMatMul;
    use candle_core::{Device, Module, Tensor};

    /// Per output: the exact product (f64) of the dequantized weight row and the quantized
    /// activation `q · d` (what every path of our kernel computes before rounding), and the
    /// bound on its f32 rounding: each block term `(d_w · d_x) · Σ q_w q_x` (the integer sum
    /// is exact) takes two roundings and the sum of `nb` terms at most `nb - 1` more, so
    /// `|ours - exact| ≤ γ_{nb+2} Σ |term|` with `γ_m ≈ m · u`, `u = 2⁻²⁴` (we allow `m · 2u`).
    fn exact_with_bound(deq: &[f32], k: usize, xq: &[i8], xd: &[f32]) -> Vec<(f64, f64)> {
        let nb = k / QK;
        deq.chunks_exact(k)
            .map(|w| {
                let (mut sum, mut abs) = (0f64, 0f64);
                for (b, &d) in xd.iter().enumerate().take(nb) {
                    let t: f64 = (b * QK..(b + 1) * QK).map(|j| w[j] as f64 * xq[j] as f64).sum::<f64>() * d as f64;
                    sum += t;
                    abs += t.abs();
                }
                (sum, (nb + 2) as f64 * f32::EPSILON as f64 * abs)
            })
            .collect()
    }

    /// Per output: `Σ_j |w_j| · 0.6 · amax_256(j) / 127`, a bound on what quantizing the
    /// activation to 8 bits moves a product by, for any per-block scheme with blocks of up to
    /// 256 values (Q8_0's 32 as we and candle's AVX2 path use, Q8_K's 256 as candle's AVX-512
    /// VNNI path uses): each value moves by at most half a step plus the f16 rounding of the
    /// scale (127 · 2⁻¹¹ of a step), and a step is at most `amax / 127` of its block.
    fn activation_quantization_bound(deq: &[f32], k: usize, x: &[f32]) -> Vec<f64> {
        let step: Vec<f64> = x
            .chunks(256)
            .flat_map(|c| {
                let amax = c.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                std::iter::repeat_n(0.6 * amax / 127.0, c.len())
            })
            .collect();
        deq.chunks_exact(k).map(|w| w.iter().zip(&step).map(|(w, s)| w.abs() as f64 * s).sum::<f64>() + 1e-6).collect()
    }

    fn check(n: usize, k: usize, rows: usize) {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 0.05, (n, k), &dev).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        let packed = PackedQ8_0::from_qtensor(&q).unwrap();
        let deq: Vec<f32> = q.dequantize(&dev).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let mm = QMatMul::from_qtensor(q).unwrap();
        let x = Tensor::randn(0f32, 1.0, (rows, k), &dev).unwrap();
        let candle: Vec<f32> = mm.forward(&x).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let xv: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
        let mut xq = vec![0i8; k];
        let mut xd = vec![0f32; k / QK];
        for level in simd::levels() {
            let mut y = vec![0f32; rows * n];
            packed.matmul_at(level, &xv, rows, &mut y);
            for r in 0..rows {
                let xr = &xv[r * k..(r + 1) * k];
                // A batched row equals the same row alone, bit for bit.
                let mut alone = vec![0f32; n];
                packed.gemv_at(level, xr, &mut alone);
                assert_eq!(alone[..], y[r * n..(r + 1) * n], "{level:?} [{n}x{k}] row {r} of {rows}");
                // Every output within the f32 rounding bound of the exact product.
                quantize_row(xr, &mut xq, &mut xd);
                for (i, (want, tol)) in exact_with_bound(&deq, k, &xq, &xd).into_iter().enumerate() {
                    let got = y[r * n + i] as f64;
                    assert!(
                        (got - want).abs() <= tol,
                        "{level:?} [{n}x{k}] row {r} out {i}: {got} vs exact {want} (bound {tol:e})"
                    );
                }
                // candle's QMatMul computes the same product by a CPU-dependent path (see the
                // module note): both it and we must be within the activation-quantization bound
                // of the product with the unquantized activation.
                let bounds = activation_quantization_bound(&deq, k, xr);
                for (i, (wr, tol)) in deq.chunks_exact(k).zip(bounds).enumerate() {
                    let truth: f64 = wr.iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let (ours, theirs) = (y[r * n + i] as f64, candle[r * n + i] as f64);
                    assert!((ours - truth).abs() <= tol, "{level:?} [{n}x{k}] out {i}: ours {ours} vs {truth} (bound {tol})");
                    assert!((theirs - truth).abs() <= tol, "[{n}x{k}] out {i}: candle {theirs} vs {truth} (bound {tol})");
                }
            }
        }
        assert_eq!(packed.dequantize(), deq);
        let mut row = vec![0f32; k];
        for r in [0, n / 2, n - 1] {
            packed.dequantize_row(r, &mut row);
            assert_eq!(row[..], deq[r * k..(r + 1) * k]);
        }
    }

    #[test]
    fn every_path_matches_the_exact_product() {
        for &(n, k) in
            &[(1, 576), (3, 576), (17, 1024), (49, 1536), (130, 3072), (1536, 576), (2051, 1024), (256, 3072), (512, 3072)]
        {
            check(n, k, 1);
        }
        check(67, 1024, 3);
        check(130, 3072, 40);
        check(256, 3072, 5);
    }

    /// The bound in `check` is tight enough to catch a wrong result: dropping one block of one
    /// row or using a neighbouring row's scale breaks it.
    #[test]
    fn the_exact_bound_rejects_a_wrong_block() {
        let (n, k) = (8, 1024);
        // Deterministic data (candle's CPU randn cannot be seeded): a random draw could make
        // the dropped block's share small enough to hide in the bound.
        let wv: Vec<f32> = (0..n * k).map(|i| 0.05 * ((i as f32) * 0.731).sin()).collect();
        let w = Tensor::from_vec(wv, (n, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        let deq: Vec<f32> = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let x: Vec<f32> = (0..k).map(|j| ((j as f32) * 1.37).cos()).collect();
        let (mut xq, mut xd) = (vec![0i8; k], vec![0f32; k / QK]);
        quantize_row(&x, &mut xq, &mut xd);
        let exact = exact_with_bound(&deq, k, &xq, &xd);
        let mut broken = deq.clone();
        broken[..QK].iter_mut().for_each(|v| *v = 0.0);
        let (wrong, _) = exact_with_bound(&broken, k, &xq, &xd)[0];
        let (want, tol) = exact[0];
        assert!((wrong - want).abs() > 100.0 * tol, "{wrong} vs {want} ± {tol}");
    }

    #[test]
    fn zero_rows_and_activation() {
        let (n, k) = (6, 64);
        let packed = PackedQ8_0::from_q8_0_bytes(&vec![0u8; n * (k / QK) * Q8_0_BYTES], n, k);
        let mut y = vec![1f32; n];
        packed.gemv(&vec![0f32; k], &mut y);
        assert!(y.iter().all(|v| *v == 0.0));
    }
}
