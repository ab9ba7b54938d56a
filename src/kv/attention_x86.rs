//! AVX2 micro-kernels for the fused CPU attention ([`super::attention`]) over a block of keys or
//! values gathered into contiguous f32 rows: scores of one query against 8 keys at once, and
//! the weighted sum of values with a query's output chunk held in registers.
//!
//! Both give the bits of the one-pair-at-a-time code they replace ([`crate::simd::dot`] and
//! [`crate::simd::axpy`]), so a row's attention does not depend on the kernel, the tile it is
//! in or the CPU:
//! - a score is 8 lanes, lane `l` summing `q[8c + l] · k[8c + l]` over chunks `c` in order
//!   (a product then a sum, never fused), then the lanes added left to right: the 8 keys'
//!   accumulators are transposed so that 7 vector adds do the 8 left-to-right lane sums;
//! - an output element is `o + p_j · v_j[i]` over positions `j` in order.

use std::arch::x86_64::*;

use crate::simd;
use crate::simd::x86::{Packed, Rows8};

/// `out[d] = dot(q, keys[d]) · scale` for the `out.len()` keys in `keys` (rows of `q.len()`).
///
/// # Safety
/// AVX2 and FMA must be present; `q.len()` a multiple of 8 and `keys.len() ≥ out.len() ·
/// q.len()` (asserted).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn scores(q: &[f32], keys: &[f32], scale: f32, out: &mut [f32]) {
    simd::x86::dots::<false>(q, keys, scale, out)
}

/// `out += Σ_j p[j] · values[j]` over `j` in order (rows of `out.len()`), 64 output elements
/// at a time in registers.
///
/// # Safety
/// AVX2 and FMA must be present; `out.len()` a multiple of 8 and `values.len() ≥ p.len() ·
/// out.len()` (asserted).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn weigh(p: &[f32], values: &[f32], out: &mut [f32]) {
    let hd = out.len();
    assert!(hd.is_multiple_of(8) && values.len() >= p.len() * hd);
    weigh_rows(p, &Packed { p: values.as_ptr(), hd }, out)
}

/// Scores of `q` against rows read in place from the pool (`rows.0.len() ≥ out.len()`, each
/// `q.len()` values): the bits of [`scores`] on the same rows gathered.
///
/// # Safety
/// AVX2, FMA and F16C must be present ([`has_f16c`]); `q.len()` a multiple of 8; every row
/// pointer valid for `q.len()` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scores_in_place<R: Rows8>(q: &[f32], rows: &R, scale: f32, out: &mut [f32]) {
    assert!(q.len().is_multiple_of(8));
    simd::x86::dots_rows::<false, true, R>(q, rows, scale, out)
}

/// [`weigh`] over rows read in place from the pool (`p.len()` of them).
///
/// # Safety
/// As [`scores_in_place`], each row `out.len()` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn weigh_in_place<R: Rows8>(p: &[f32], rows: &R, out: &mut [f32]) {
    assert!(out.len().is_multiple_of(8));
    weigh_rows(p, rows, out)
}

#[inline(always)]
unsafe fn weigh_rows<R: Rows8>(p: &[f32], rows: &R, out: &mut [f32]) {
    let hd = out.len();
    for h0 in (0..hd).step_by(64) {
        let chunks = ((hd - h0) / 8).min(8);
        if chunks == 8 {
            weigh_chunks::<8, R>(p, rows, h0, out);
        } else {
            for c in 0..chunks {
                weigh_chunks::<1, R>(p, rows, h0 + c * 8, out);
            }
        }
    }
}

/// [`weigh`] for output elements `h0 .. h0 + 8·C`.
#[inline(always)]
unsafe fn weigh_chunks<const C: usize, R: Rows8>(p: &[f32], rows: &R, h0: usize, out: &mut [f32]) {
    let o = out.as_mut_ptr().add(h0);
    let mut acc = [_mm256_setzero_ps(); C];
    for (c, a) in acc.iter_mut().enumerate() {
        *a = _mm256_loadu_ps(o.add(c * 8));
    }
    for (j, &pj) in p.iter().enumerate() {
        let pv = _mm256_set1_ps(pj);
        for (c, a) in acc.iter_mut().enumerate() {
            *a = _mm256_add_ps(*a, _mm256_mul_ps(pv, rows.load8(j, h0 + c * 8)));
        }
    }
    for (c, a) in acc.iter().enumerate() {
        _mm256_storeu_ps(o.add(c * 8), *a);
    }
}

/// Whether the CPU has F16C (checked once).
pub(super) fn has_f16c() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| std::is_x86_feature_detected!("avx") && std::is_x86_feature_detected!("f16c"))
}

/// `dst = src` widened to f32 (exact), 8 values per `vcvtph2ps`.
///
/// # Safety
/// AVX and F16C must be present ([`has_f16c`]); `dst.len() == src.len()` (asserted).
#[target_feature(enable = "avx,f16c")]
pub(super) unsafe fn widen_f16(src: &[half::f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len());
    let full = src.len() / 8 * 8;
    for i in (0..full).step_by(8) {
        let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
        _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
    }
    for (o, v) in dst[full..].iter_mut().zip(&src[full..]) {
        *o = v.to_f32();
    }
}
