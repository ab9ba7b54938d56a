//! CPU vector support: which instruction set the hand-written kernels use, and portable
//! vector loops written so the compiler vectorises them.
//!
//! The kernels (packed Q8_0 matmul, fused paged attention, fused LoRA) have two paths: an
//! AVX2 + FMA one on x86-64 and a portable one everywhere else. [`level`] picks the path once
//! per process from what the CPU reports at run time; `EXPERT_RUNTIME_SIMD=portable` forces
//! the portable path (tests run it on machines that have AVX2, so both paths stay covered).
//! The Q8_0 matrix kernel ([`crate::model::q8`]) adds an AVX-512 VNNI path of its own, with
//! the same results as its AVX2 and portable ones. candle's own kernels may take other wide
//! paths, which is why tests never compare our results with candle's bit for bit.
//!
//! [`dot`] and [`axpy`] are inlined both into functions compiled with
//! `#[target_feature(enable = "avx2,fma")]` and into portable ones; Rust never contracts
//! `a * b + c` into an FMA on its own, so both sum in the same order with the same roundings
//! and their results do not depend on the CPU.

use std::sync::OnceLock;

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
    *LEVEL.get_or_init(|| {
        let forced = std::env::var("EXPERT_RUNTIME_SIMD").is_ok_and(|v| v.eq_ignore_ascii_case("portable"));
        if forced {
            Level::Portable
        } else {
            best_level()
        }
    })
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
}
