//! Fast Q4_0 and Q6_K quantizers for quantize-on-load, bit-identical to candle's reference
//! ones (`BlockQ4_0::from_float`, `BlockQ6K::from_float`, which follow ggml's
//! `quantize_row_*_ref`), so a weight quantized here is the same bytes as before.
//!
//! Why: on the Qwen3-0.6B shape, `quantize: 'q4_0'` spent three quarters of its load in those
//! two functions, mostly in Q6_K's scale search for the embedding (16 sub-blocks of 16 values
//! per block, each an iterative least-squares fit with a library `roundf` call per value).
//!
//! How: the same arithmetic, in the same order, rearranged to run in vector lanes.
//! - Q6_K: the 16 sub-blocks of a block are independent fits, so they run side by side, one per
//!   vector lane: two blocks at a time with AVX2 (four vectors of 8) and on the portable path,
//!   four with AVX-512 (four vectors of 16). The fit is written once ([`fit_simd`]) over a small
//!   trait of vector operations, plus a plain-array version for other CPUs. Each lane keeps its
//!   own sequential order of operations, so its roundings are the scalar code's. Where the
//!   scalar code leaves a loop early for one sub-block, the lanes go on with the update masked
//!   off; that is exact because each pass is a pure function of the lane's state, and a pass
//!   that changed nothing leaves the state as it was, so running it again changes nothing again.
//! - Rounding is `f32::round` (half away from zero) without a library call, on values already
//!   clamped to the small integer range the result is clamped to (the same result for every
//!   input, NaN and infinities included).
//! - Q4_0: per block of 32, the max-magnitude scan and the 4-bit codes (AVX2 intrinsics, or
//!   plain loops).
//!
//! The output is written straight into candle's block structs viewed as bytes: they are
//! `repr(C)` with the byte layout of GGUF's blocks (candle itself loads GGUF files by
//! reinterpreting bytes as them), so the bytes written here are what `QTensor::data` returns.

use candle_core::quantized::k_quants::{BlockQ4_0, BlockQ6K};
use half::f16;

use crate::simd::{level, Level};

/// Values per Q4_0 block, bytes per block.
const Q4_0_VALUES: usize = 32;
const Q4_0_BYTES: usize = 2 + Q4_0_VALUES / 2;
/// Values per Q6_K super-block, its sub-block length and count, bytes per block.
const QK_K: usize = 256;
const SUB: usize = 16;
const LANES: usize = QK_K / SUB;
const Q6K_BYTES: usize = QK_K / 2 + QK_K / 4 + LANES + 2;

const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == Q4_0_BYTES);
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == Q6K_BYTES);

/// Quantizes `x` (`len = 32 · out.len()`) into Q4_0 blocks.
pub fn q4_0(x: &[f32], out: &mut [BlockQ4_0]) {
    assert_eq!(x.len(), out.len() * Q4_0_VALUES, "q4_0: the values do not fill the blocks");
    // SAFETY: `BlockQ4_0` is `repr(C)` with only byte and f16 fields and no padding (its size
    // is asserted above), so any byte pattern is a valid value and the slice is its bytes.
    let bytes = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u8, out.len() * Q4_0_BYTES) };
    match level() {
        // SAFETY: this level is only chosen after AVX2 was detected.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2Fma => unsafe { q4_0_avx2(x, bytes) },
        Level::Portable => q4_0_bytes(x, bytes),
    }
}

/// Quantizes `x` (`len = 256 · out.len()`) into Q6_K blocks.
pub fn q6_k(x: &[f32], out: &mut [BlockQ6K]) {
    assert_eq!(x.len(), out.len() * QK_K, "q6_k: the values do not fill the blocks");
    // SAFETY: as in `q4_0`: `repr(C)`, byte / i8 / f16 fields, no padding (size asserted).
    let bytes = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u8, out.len() * Q6K_BYTES) };
    match level() {
        // SAFETY: AVX-512F was detected (and AVX2, for this level).
        #[cfg(target_arch = "x86_64")]
        Level::Avx2Fma if has_avx512f() => unsafe { q6_k_avx512(x, bytes) },
        // SAFETY: this level is only chosen after AVX2 was detected.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2Fma => unsafe { q6_k_avx2(x, bytes) },
        Level::Portable => q6_k_bytes(x, bytes),
    }
}

/// [`q4_0_bytes`] in AVX2: the same operations per value (a product, then a sum), the
/// max-magnitude value found by mask, the codes packed with integer shuffles.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn q4_0_avx2(x: &[f32], out: &mut [u8]) {
    use std::arch::x86_64::*;
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let (zero, half8, fifteen) = (_mm256_setzero_ps(), _mm256_set1_ps(8.5), _mm256_set1_ps(15.0));
    for (xs, o) in x.chunks_exact(Q4_0_VALUES).zip(out.chunks_exact_mut(Q4_0_BYTES)) {
        let p = xs.as_ptr();
        let v = [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24))];
        let a = v.map(|v| _mm256_and_ps(v, abs_mask));
        // NaN never wins `>` in the scalar scan: max_ps(NaN, m) keeps m.
        let m = a.iter().fold(zero, |m, &a| _mm256_max_ps(a, m));
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)));
        let max = if amax > 0.0 {
            let am = _mm256_set1_ps(amax);
            let bits = a
                .iter()
                .enumerate()
                .fold(0u32, |b, (i, &a)| b | ((_mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(a, am)) as u32) << (8 * i)));
            xs[bits.trailing_zeros() as usize]
        } else {
            0.0
        };
        let d = max / -8.0;
        let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        o[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        // max_ps(NaN, 0) is 0; clamping to [0, 15] before truncating equals truncating, then
        // capping at 15.
        let c = v.map(|v| {
            let t = _mm256_max_ps(_mm256_add_ps(_mm256_mul_ps(v, id), half8), zero);
            _mm256_cvttps_epi32(_mm256_min_ps(t, fifteen))
        });
        let lo = _mm256_or_si256(c[0], _mm256_slli_epi32::<4>(c[2]));
        let hi = _mm256_or_si256(c[1], _mm256_slli_epi32::<4>(c[3]));
        // 16 int32 codes in order → 16 bytes (packs work per 128-bit half; put them back).
        let w = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(lo, hi));
        let b = _mm256_packus_epi16(w, w);
        let b = _mm256_permute4x64_epi64::<0b00_00_10_00>(b);
        _mm_storeu_si128(o.as_mut_ptr().add(2) as *mut __m128i, _mm256_castsi256_si128(b));
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn q6_k_avx2(x: &[f32], out: &mut [u8]) {
    q6_k_with::<32>(x, out, |xs| fit_simd::<simd::Avx2, 4, 32>(xs), |x, d, o| requantize_avx2(x, d, o))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn q6_k_avx512(x: &[f32], out: &mut [u8]) {
    q6_k_with::<64>(x, out, |xs| fit_simd::<simd::Avx512, 4, 64>(xs), |x, d, o| requantize_avx2(x, d, o))
}

/// Whether this CPU has AVX-512 (the Q6_K fit's widest path).
#[cfg(target_arch = "x86_64")]
fn has_avx512f() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| std::is_x86_feature_detected!("avx512f"))
}

#[inline(always)]
fn q4_0_bytes(x: &[f32], out: &mut [u8]) {
    for (xs, o) in x.chunks_exact(Q4_0_VALUES).zip(out.chunks_exact_mut(Q4_0_BYTES)) {
        let xs: &[f32; Q4_0_VALUES] = xs.try_into().expect("a whole block");
        let amax = xs.iter().fold(0f32, |m, v| if v.abs() > m { v.abs() } else { m });
        // The first value of the largest magnitude, with its sign (+0 when all are zero).
        let max = xs.iter().copied().find(|v| v.abs() == amax && amax > 0.0).unwrap_or(0.0);
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        o[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        let code = |v: f32| {
            // `(v · id + 8.5) as u8`, capped at 15: truncation, with NaN and negatives to 0.
            let t = v * id + 8.5;
            let t = if t > 0.0 { t.trunc() } else { 0.0 };
            (if t > 15.0 { 15.0 } else { t }) as u8
        };
        let (lo, hi) = xs.split_at(Q4_0_VALUES / 2);
        for ((q, &a), &b) in o[2..].iter_mut().zip(lo).zip(hi) {
            *q = code(a) | (code(b) << 4);
        }
    }
}

/// `v.round() as i32` clamped to `lo..=hi` (integers), as an f32: NaN gives 0, as the
/// saturating cast does. Clamping first is exact for integer bounds and keeps `v` small.
#[inline(always)]
fn round_clamped(v: f32, lo: f32, hi: f32) -> f32 {
    let v = if v.is_nan() { 0.0 } else { v };
    let v = if v < lo { lo } else { v };
    let v = if v > hi { hi } else { v };
    let t = v.trunc();
    let f = v - t;
    t + if f >= 0.5 {
        1.0
    } else if f <= -0.5 {
        -1.0
    } else {
        0.0
    }
}

/// Sub-blocks fitted side by side on the portable path and with AVX2: two blocks' worth, so
/// that independent chains of dependent operations (each lane's sums are sequential) overlap.
const FIT: usize = 2 * LANES;

#[inline(always)]
fn q6_k_bytes(x: &[f32], out: &mut [u8]) {
    q6_k_with::<FIT>(x, out, fit_transposed::<FIT>, requantize)
}

/// Q6_K blocks `N / 16` at a time, their sub-blocks fitted by `fit`; a last, partial group is
/// filled up with repeats of its blocks.
#[inline(always)]
fn q6_k_with<const N: usize>(
    x: &[f32],
    out: &mut [u8],
    fit: impl Fn(&[f32]) -> ([f32; N], [[f32; N]; SUB]),
    requant: impl Fn(&[f32], f32, &mut [u8]),
) {
    let blocks = N / LANES;
    for (xs, o) in x.chunks(blocks * QK_K).zip(out.chunks_mut(blocks * Q6K_BYTES)) {
        // Only a partial group needs these (an empty `Vec` does not allocate).
        let pad: Vec<f32>;
        let mut pad_out = Vec::new();
        let whole = xs.len() == blocks * QK_K;
        let (xs, o2): (&[f32], &mut [u8]) = if whole {
            (xs, &mut *o)
        } else {
            // The last blocks, repeated to fill the lanes (the copies' results are dropped).
            pad = (0..blocks * QK_K).map(|i| xs[i % xs.len()]).collect();
            pad_out.resize(blocks * Q6K_BYTES, 0u8);
            (&pad, &mut pad_out)
        };
        let (scales, ls) = fit(xs);
        for (b, (xs, ob)) in xs.chunks_exact(QK_K).zip(o2.chunks_exact_mut(Q6K_BYTES)).enumerate() {
            finish_q6_k(xs, &scales[b * LANES..][..LANES], (&ls, b * LANES), &requant, ob);
        }
        if !whole {
            let n = o.len();
            o.copy_from_slice(&pad_out[..n]);
        }
    }
}

/// [`fit_sub_blocks`] of `N / 16` whole blocks in their natural order (`xs.len() = 16 · N`).
#[inline(always)]
fn fit_transposed<const N: usize>(xs: &[f32]) -> ([f32; N], [[f32; N]; SUB]) {
    // Transposed: xt[i][lane] is value i of sub-block `lane`.
    let xt: [[f32; N]; SUB] = std::array::from_fn(|i| std::array::from_fn(|l| xs[l * SUB + i]));
    fit_sub_blocks(&xt)
}

/// The scale of each sub-block and its codes `0..64` (`ls[i][lane]`, as f32): ggml's
/// `make_qx_quants(16, 32, x, L, rmse_type 1, no weights)` in every lane at once.
#[inline(always)]
fn fit_sub_blocks<const N: usize>(xt: &[[f32; N]; SUB]) -> ([f32; N], [[f32; N]; SUB]) {
    const NMAX: f32 = 32.0;
    let q = |v: f32| round_clamped(v, -NMAX, NMAX - 1.0);
    let mut amax = [0f32; N];
    let mut max = [0f32; N];
    for xi in xt {
        for j in 0..N {
            let ax = xi[j].abs();
            let take = ax > amax[j];
            amax[j] = if take { ax } else { amax[j] };
            max[j] = if take { xi[j] } else { max[j] };
        }
    }
    // The first estimate.
    let iscale: [f32; N] = std::array::from_fn(|j| -NMAX / max[j]);
    let mut ls = [[0f32; N]; SUB];
    let mut sumlx = [0f32; N];
    let mut suml2 = [0f32; N];
    for (xi, li) in xt.iter().zip(ls.iter_mut()) {
        for j in 0..N {
            let (x, l) = (xi[j], q(iscale[j] * xi[j]));
            let w = x * x;
            li[j] = l;
            sumlx[j] += w * x * l;
            suml2[j] += w * l * l;
        }
    }
    let mut scale: [f32; N] = std::array::from_fn(|j| sumlx[j] / suml2[j]);
    let mut best: [f32; N] = std::array::from_fn(|j| scale[j] * sumlx[j]);
    // Up to three refits from the fitted scale, each kept only if it fits better.
    for _ in 0..3 {
        let iscale: [f32; N] = std::array::from_fn(|j| 1.0 / scale[j]);
        let mut slx = [0f32; N];
        let mut sl2 = [0f32; N];
        let mut changed = [false; N];
        for (xi, li) in xt.iter().zip(&ls) {
            for j in 0..N {
                let (x, l) = (xi[j], q(iscale[j] * xi[j]));
                let w = x * x;
                changed[j] |= l != li[j];
                slx[j] += w * x * l;
                sl2[j] += w * l * l;
            }
        }
        // The scalar code stops on `!changed || sl2 == 0 || slx² <= best · sl2` (NaN goes on).
        let keep: [bool; N] = std::array::from_fn(|j| {
            changed[j] & (sl2[j] != 0.0) & (slx[j] * slx[j]).partial_cmp(&(best[j] * sl2[j])).is_none_or(|o| o.is_gt())
        });
        if !keep.contains(&true) {
            break;
        }
        for (xi, li) in xt.iter().zip(ls.iter_mut()) {
            for j in 0..N {
                li[j] = if keep[j] { q(iscale[j] * xi[j]) } else { li[j] };
            }
        }
        for j in 0..N {
            sumlx[j] = if keep[j] { slx[j] } else { sumlx[j] };
            suml2[j] = if keep[j] { sl2[j] } else { suml2[j] };
            scale[j] = if keep[j] { sumlx[j] / suml2[j] } else { scale[j] };
            best[j] = if keep[j] { scale[j] * sumlx[j] } else { best[j] };
        }
    }
    // Up to five passes of one-value-at-a-time improvement.
    for _ in 0..5 {
        let mut any = [false; N];
        for (xi, li) in xt.iter().zip(ls.iter_mut()) {
            for j in 0..N {
                let (x, l) = (xi[j], li[j]);
                let w = x * x;
                let slx = sumlx[j] - w * x * l;
                let sl2 = suml2[j] - w * l * l;
                let new_l = q(x * sl2 / slx);
                let slx_new = slx + w * x * new_l;
                let sl2_new = sl2 + w * new_l * new_l;
                // `&`, not `&&`: no branches, so the lanes vectorise.
                let take =
                    (slx > 0.0) & (new_l != l) & (sl2_new > 0.0) & (slx_new * slx_new * suml2[j] > sumlx[j] * sumlx[j] * sl2_new);
                li[j] = if take { new_l } else { l };
                sumlx[j] = if take { slx_new } else { sumlx[j] };
                suml2[j] = if take { sl2_new } else { suml2[j] };
                any[j] |= take;
            }
        }
        // The scalar code sets `scale = sumlx / suml2` at each improvement: the last one
        // counts, so it is divided once, after the pass.
        for j in 0..N {
            scale[j] = if any[j] { sumlx[j] / suml2[j] } else { scale[j] };
        }
        if !any.contains(&true) {
            break;
        }
    }
    // An all-zero sub-block: scale 0, codes 0.
    for j in 0..N {
        let zero = amax[j] == 0.0;
        scale[j] = if zero { 0.0 } else { scale[j] };
        for li in ls.iter_mut() {
            li[j] = if zero { 0.0 } else { li[j] + NMAX };
        }
    }
    (scale, ls)
}

#[cfg(target_arch = "x86_64")]
mod simd;
#[cfg(target_arch = "x86_64")]
mod vector_fit;
#[cfg(target_arch = "x86_64")]
use vector_fit::{code, fit_simd};

/// [`requantize`] in AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn requantize_avx2(x: &[f32], dj: f32, out: &mut [u8]) {
    use std::arch::x86_64::*;
    assert!(x.len() == SUB && out.len() == SUB);
    let (d, off) = (_mm256_set1_ps(dj), _mm256_set1_ps(32.0));
    let c = [0, 8].map(|h| {
        let v = _mm256_div_ps(_mm256_loadu_ps(x.as_ptr().add(h)), d);
        _mm256_cvttps_epi32(_mm256_add_ps(code::<simd::Avx2>(v), off))
    });
    let w = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(c[0], c[1]));
    let b = _mm256_permute4x64_epi64::<0b00_00_10_00>(_mm256_packus_epi16(w, w));
    _mm_storeu_si128(out.as_mut_ptr() as *mut __m128i, _mm256_castsi256_si128(b));
}

/// The codes `0..64` of a sub-block's 16 values `x` with its quantized scale `dj` (≠ 0).
#[inline(always)]
fn requantize(x: &[f32], dj: f32, out: &mut [u8]) {
    for (c, &x) in out.iter_mut().zip(x) {
        *c = (round_clamped(x / dj, -32.0, 31.0) + 32.0) as u8;
    }
}

/// The block scale, the sub-block scales as int8, the codes requantized with them
/// (`requant`), and the packing into `ql` / `qh` / `scales` / `d` (ggml's `block_q6_K`).
/// Where a sub-block's quantized scale is 0 its fitted codes stay: `fitted[i][lanes + j]`.
#[inline(always)]
fn finish_q6_k<const N: usize>(
    xs: &[f32],
    scales: &[f32],
    (fitted, lanes): (&[[f32; N]; SUB], usize),
    requant: impl Fn(&[f32], f32, &mut [u8]),
    o: &mut [u8],
) {
    let mut max_scale = 0f32;
    let mut max_abs_scale = 0f32;
    for &s in scales {
        if s.abs() > max_abs_scale {
            max_abs_scale = s.abs();
            max_scale = s;
        }
    }
    let iscale = -128.0 / max_scale;
    let d = f16::from_f32(1.0 / iscale);
    let mut sc = [0i8; LANES];
    for (y, &s) in sc.iter_mut().zip(scales) {
        // `nearest_int(v).min(127) as i8`: the wrapping cast keeps the low byte.
        *y = (round_i32(iscale * s).min(127)) as i8;
    }
    let mut l = [0u8; QK_K];
    for (j, (&y, lj)) in sc.iter().zip(l.chunks_exact_mut(SUB)).enumerate() {
        let dj = d.to_f32() * y as f32;
        if dj == 0.0 {
            for (c, f) in lj.iter_mut().zip(fitted) {
                *c = f[lanes + j] as u8;
            }
        } else {
            requant(&xs[j * SUB..(j + 1) * SUB], dj, lj);
        }
    }
    let (ql, rest) = o.split_at_mut(QK_K / 2);
    let (qh, rest) = rest.split_at_mut(QK_K / 4);
    let (so, dout) = rest.split_at_mut(LANES);
    for half in 0..2 {
        let l = &l[half * 128..(half + 1) * 128];
        let ql = &mut ql[half * 64..(half + 1) * 64];
        let qh = &mut qh[half * 32..(half + 1) * 32];
        for i in 0..32 {
            let (a, b, c, e) = (l[i], l[i + 32], l[i + 64], l[i + 96]);
            ql[i] = (a & 0xF) | ((c & 0xF) << 4);
            ql[i + 32] = (b & 0xF) | ((e & 0xF) << 4);
            qh[i] = (a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6);
        }
    }
    for (o, &s) in so.iter_mut().zip(&sc) {
        *o = s as u8;
    }
    dout.copy_from_slice(&d.to_le_bytes());
}

/// `v.round() as i32` (half away from zero, saturating, NaN to 0) without a library call.
#[inline(always)]
fn round_i32(v: f32) -> i32 {
    let t = v as i32; // truncation toward zero, saturating
    let f = v - t as f32;
    if f >= 0.5 {
        t.saturating_add(1)
    } else if f <= -0.5 {
        t.saturating_sub(1)
    } else {
        t
    }
}

#[cfg(test)]
mod tests;
