//! CPU vector support: which instruction set the hand-written kernels use, and portable
//! vector loops written so the compiler vectorises them.
//!
//! The f32 kernels (fused paged attention, fused LoRA) have two paths: an AVX2 + FMA one on
//! x86-64 and a portable one everywhere else (on aarch64 the compiler vectorises it for NEON). [`level`] picks the path once
//! per process from what the CPU reports at run time; `EXPERT_RUNTIME_SIMD=portable` forces
//! the portable path (tests run it on machines that have AVX2, so both paths stay covered).
//! The integer matrix kernels ([`crate::model::q8`], [`crate::model::kquant`]) choose their
//! own paths (AVX2, AVX-512 VNNI, AMX; NEON with or without SDOT on aarch64, from [`neon`]),
//! with the same results as their portable ones; [`forced_portable`] turns them off too. candle's own kernels may take other
//! wide paths, which is why tests never compare our results with candle's bit for bit.
//!
//! [`dot`] and [`axpy`] are inlined both into functions compiled with
//! `#[target_feature(enable = "avx2,fma")]` and into portable ones; Rust never contracts
//! `a * b + c` into an FMA on its own, so both sum in the same order with the same roundings
//! and their results do not depend on the CPU. [`exp`] (the attention softmax's) is built
//! from products and sums for the same reason: a library `expf` may differ between systems.

use std::sync::OnceLock;

#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

/// A kernel path.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Level {
    /// Plain Rust, any CPU.
    Portable,
    /// x86-64 with AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    Avx2Fma,
}

/// The path the kernels take in this process (detected once).
pub fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| if forced_portable() { Level::Portable } else { best_level() })
}

/// Whether `EXPERT_RUNTIME_SIMD=portable` asks every kernel for its portable path.
pub fn forced_portable() -> bool {
    static FORCED: OnceLock<bool> = OnceLock::new();
    *FORCED.get_or_init(|| std::env::var("EXPERT_RUNTIME_SIMD").is_ok_and(|v| v.eq_ignore_ascii_case("portable")))
}

/// Every path this CPU can run, portable first (tests run each of them).
pub fn levels() -> Vec<Level> {
    let mut v = vec![Level::Portable];
    if best_level() != Level::Portable {
        v.push(best_level());
    }
    v
}

fn best_level() -> Level {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        return Level::Avx2Fma;
    }
    Level::Portable
}

/// `Σ a·b` with eight independent accumulators (then a fixed-order reduction).
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// `out[d] += dot(v, rows[d])` for the `out.len()` rows of `v.len()` elements in `rows`,
/// compiled for `level`: the bits of one [`dot`] per row, on every path.
pub fn dots_add_at(level: Level, v: &[f32], rows: &[f32], out: &mut [f32]) {
    let n = v.len();
    assert!(rows.len() >= out.len() * n);
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2Fma && n.is_multiple_of(8) {
        // SAFETY: `Avx2Fma` is only constructed after detecting both features; the length
        // conditions are the ones checked above.
        return unsafe { x86::dots::<true>(v, rows, 1.0, out) };
    }
    for (d, o) in out.iter_mut().enumerate() {
        *o += dot_at(level, v, &rows[d * n..][..n]);
    }
}

/// `y += alpha · x`.
#[inline(always)]
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_avx2(alpha: f32, x: &[f32], y: &mut [f32]) {
    axpy(alpha, x, y)
}

/// [`dot`] compiled for `level` (for callers outside a `target_feature` function).
pub fn dot_at(level: Level, a: &[f32], b: &[f32]) -> f32 {
    match level {
        // SAFETY: `Avx2Fma` is only constructed after detecting both features.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2Fma => unsafe { dot_avx2(a, b) },
        Level::Portable => dot(a, b),
    }
}

/// [`axpy`] compiled for `level`.
pub fn axpy_at(level: Level, alpha: f32, x: &[f32], y: &mut [f32]) {
    match level {
        // SAFETY: as in `dot_at`.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2Fma => unsafe { axpy_avx2(alpha, x, y) },
        Level::Portable => axpy(alpha, x, y),
    }
}

/// `e^x` in f32 from products and sums only (no library call, no fused multiply-add), so the
/// scalar form here and the 8-lane AVX2 form in [`exp_sub_sum_at`] give the same bits on every
/// CPU: `x = n · ln 2 + r` with `n` rounded to nearest-even and `ln 2` split in two (the high
/// part has 9 bits, so `n · hi` is exact), `e^r` by its Taylor polynomial to `r⁶` (|r| ≤ ln2/2,
/// truncation ≤ 1e-7 relative), times `2ⁿ` built from its exponent bits. Within about 2 ulp of
/// the exact value. `x` is clamped to ±88 first (`e^-88` becomes 0, NaN stays NaN).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let t = x.clamp(-88.0, 88.0);
    let n = (t * std::f32::consts::LOG2_E).round_ties_even();
    let r = (t - n * LN2_HI) - n * LN2_LO;
    let mut p = EXP_C[0];
    for c in &EXP_C[1..] {
        p = p * r + c;
    }
    p * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// GELU with the tanh approximation (HF's `gelu_pytorch_tanh`),
/// `0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))`, in place, with `tanh(u)` as
/// `1 − 2 / (e^{2u} + 1)` over [`exp`]: within about 1e-7 of the exact value (absolute, in the
/// tanh), the same bits on every level, and vectorised instead of a library `tanhf` per value.
#[inline(always)]
fn gelu_tanh(x: &mut [f32]) {
    const C: f32 = 0.797_884_6; // √(2/π)
    for v in x.iter_mut() {
        let x = *v;
        let u = C * (x + 0.044_715 * (x * x * x));
        let t = 1.0 - 2.0 / (exp(2.0 * u) + 1.0);
        *v = 0.5 * x * (1.0 + t);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu_tanh_avx2(x: &mut [f32]) {
    gelu_tanh(x)
}

/// [`gelu_tanh`] compiled for `level`.
pub fn gelu_tanh_at(level: Level, x: &mut [f32]) {
    match level {
        // SAFETY: as in `dot_at`.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2Fma => unsafe { gelu_tanh_avx2(x) },
        Level::Portable => gelu_tanh(x),
    }
}

/// `ln 2 = LN2_HI + LN2_LO`, the high part with 9 significant bits.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Taylor coefficients of `e^r`, highest power first: `1/6!, 1/5!, …, 1/1!, 1`.
const EXP_C: [f32; 7] = [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0];

/// `x[i] = exp(x[i] - m)` for every element; returns their sum, in 8 lanes (element `i` in
/// lane `i % 8` of the full chunks) added left to right, then the tail in order.
#[inline(always)]
fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
    let mut acc = [0f32; 8];
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        for (v, a) in c.iter_mut().zip(acc.iter_mut()) {
            *v = exp(*v - m);
            *a += *v;
        }
    }
    finish_exp_sum(acc, chunks.into_remainder(), m)
}

/// The tail and the lane sum of [`exp_sub_sum`], shared by its forms.
#[inline(always)]
fn finish_exp_sum(acc: [f32; 8], tail: &mut [f32], m: f32) -> f32 {
    let mut t = 0f32;
    for v in tail {
        *v = exp(*v - m);
        t += *v;
    }
    let mut s = acc[0];
    for a in &acc[1..] {
        s += a;
    }
    s + t
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_sub_sum_avx2(x: &mut [f32], m: f32) -> f32 {
    use std::arch::x86_64::*;
    let full = x.len() / 8 * 8;
    let mv = _mm256_set1_ps(m);
    let (lo, hi) = (_mm256_set1_ps(-88.0), _mm256_set1_ps(88.0));
    let (log2e, ln2_hi, ln2_lo) = (_mm256_set1_ps(std::f32::consts::LOG2_E), _mm256_set1_ps(LN2_HI), _mm256_set1_ps(LN2_LO));
    let mut acc = _mm256_setzero_ps();
    for i in (0..full).step_by(8) {
        let p = x.as_mut_ptr().add(i);
        let v = _mm256_sub_ps(_mm256_loadu_ps(p), mv);
        let t = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
        let n = _mm256_round_ps(_mm256_mul_ps(t, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        let r = _mm256_sub_ps(_mm256_sub_ps(t, _mm256_mul_ps(n, ln2_hi)), _mm256_mul_ps(n, ln2_lo));
        let mut poly = _mm256_set1_ps(EXP_C[0]);
        for c in &EXP_C[1..] {
            poly = _mm256_add_ps(_mm256_mul_ps(poly, r), _mm256_set1_ps(*c));
        }
        let bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
        let e = _mm256_mul_ps(poly, _mm256_castsi256_ps(bits));
        // NaN lanes keep their NaN, as the scalar form returns it.
        let e = _mm256_blendv_ps(e, v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        _mm256_storeu_ps(p, e);
        acc = _mm256_add_ps(acc, e);
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
    finish_exp_sum(lanes, &mut x[full..], m)
}

/// `exp_sub_sum` for `level`: `x[i] = exp(x[i] - m)`, returning the sum; same bits on every
/// level.
pub fn exp_sub_sum_at(level: Level, x: &mut [f32], m: f32) -> f32 {
    match level {
        // SAFETY: as in `dot_at`.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2Fma => unsafe { exp_sub_sum_avx2(x, m) },
        Level::Portable => exp_sub_sum(x, m),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_level_gives_the_same_bits() {
        let a: Vec<f32> = (0..1003).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        let b: Vec<f32> = (0..1003).map(|i| ((i * 53 % 97) as f32 - 48.0) / 3.0).collect();
        let want = dot(&a, &b);
        let mut y0 = b.clone();
        axpy(0.37, &a, &mut y0);
        for l in levels() {
            assert_eq!(dot_at(l, &a, &b).to_bits(), want.to_bits(), "{l:?}");
            let mut y = b.clone();
            axpy_at(l, 0.37, &a, &mut y);
            assert_eq!(y, y0, "{l:?}");
        }
        assert!(levels().contains(&level()));
    }

    #[test]
    fn gelu_tanh_is_the_tanh_form_and_every_level_agrees() {
        let xs: Vec<f32> =
            (0..20_001).map(|i| -12.0 + 24.0 * i as f32 / 20_000.0).chain([0.0, -0.0, 1e-30, 60.0, -60.0]).collect();
        let mut want = xs.clone();
        gelu_tanh(&mut want);
        for (&x, &g) in xs.iter().zip(&want) {
            let x64 = x as f64;
            let exact = 0.5 * x64 * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x64 + 0.044715 * x64.powi(3))).tanh());
            assert!((g as f64 - exact).abs() <= 2e-7 * (1.0 + x64.abs()), "gelu({x}) = {g}, exact {exact}");
        }
        for l in levels() {
            let mut got = xs.clone();
            gelu_tanh_at(l, &mut got);
            assert_eq!(got, want, "{l:?}");
        }
        let mut nan = [f32::NAN];
        gelu_tanh(&mut nan);
        assert!(nan[0].is_nan());
    }

    #[test]
    fn exp_is_within_two_ulp_and_every_level_agrees() {
        let mut worst = 0f64;
        for i in 0..200_000 {
            let x = -87.0 + 87.5 * i as f32 / 200_000.0;
            let (got, want) = (exp(x) as f64, (x as f64).exp());
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(worst < 2.5e-7, "relative error {worst:e}");
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(0.0), 1.0);
        // Lengths with and without a tail; NaN, infinities and huge values among ordinary ones.
        for len in [1, 7, 8, 9, 64, 203] {
            let mut x: Vec<f32> = (0..len).map(|i| ((i * 7919 % 2003) as f32 - 1800.0) / 37.0).collect();
            if len > 8 {
                x[3] = f32::NAN;
                x[5] = f32::NEG_INFINITY;
                x[6] = 1e30;
                x[8] = -1e30;
            }
            let m = 2.5;
            let mut want = x.clone();
            let want_sum = exp_sub_sum(&mut want, m);
            for l in levels() {
                let mut y = x.clone();
                let sum = exp_sub_sum_at(l, &mut y, m);
                assert_eq!(sum.to_bits(), want_sum.to_bits(), "{l:?} len {len}");
                assert!(y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{l:?} len {len}");
            }
            for (a, &v) in want.iter().zip(&x) {
                assert_eq!(a.to_bits(), exp(v - m).to_bits());
            }
        }
    }
}
