//! The vector operations [`fit_simd`](super::fit_simd) and [`code`](super::code) use, for
//! AVX2 and AVX-512. All are `#[inline(always)]`: they are compiled inside the
//! `#[target_feature]` entry points.

use std::arch::x86_64::*;

/// Comparisons are quiet; `ne` is false and `ne_u` / `nle_u` true when a NaN is involved.
pub(super) trait Simd {
    const WIDTH: usize;
    type V: Copy;
    type M: Copy;
    unsafe fn splat(v: f32) -> Self::V;
    /// `p[0], p[16], p[32], …`, one per lane.
    unsafe fn gather16(p: *const f32) -> Self::V;
    unsafe fn store(p: *mut f32, v: Self::V);
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn div(a: Self::V, b: Self::V) -> Self::V;
    /// The smaller / larger of each pair of lanes, for lanes that are not NaN.
    unsafe fn min(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn abs(v: Self::V) -> Self::V;
    /// The sign bit of each lane (a signed zero).
    unsafe fn sign(v: Self::V) -> Self::V;
    unsafe fn or(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn floor(v: Self::V) -> Self::V;
    unsafe fn gt(a: Self::V, b: Self::V) -> Self::M;
    unsafe fn ge(a: Self::V, b: Self::V) -> Self::M;
    unsafe fn ne(a: Self::V, b: Self::V) -> Self::M;
    unsafe fn ne_u(a: Self::V, b: Self::V) -> Self::M;
    unsafe fn nle_u(a: Self::V, b: Self::V) -> Self::M;
    /// Lanes that are not NaN.
    unsafe fn ord(v: Self::V) -> Self::M;
    unsafe fn and_m(a: Self::M, b: Self::M) -> Self::M;
    unsafe fn or_m(a: Self::M, b: Self::M) -> Self::M;
    unsafe fn no_mask() -> Self::M;
    unsafe fn none(m: Self::M) -> bool;
    /// `if_true` where `m`, else `if_false`.
    unsafe fn select(m: Self::M, if_false: Self::V, if_true: Self::V) -> Self::V;
    /// `v` where `m`, else +0.
    unsafe fn keep(v: Self::V, m: Self::M) -> Self::V;
}

pub(super) struct Avx2;
pub(super) struct Avx512;

impl Simd for Avx2 {
    const WIDTH: usize = 8;
    type V = __m256;
    type M = __m256;
    #[inline(always)]
    unsafe fn splat(v: f32) -> __m256 {
        _mm256_set1_ps(v)
    }
    #[inline(always)]
    unsafe fn gather16(p: *const f32) -> __m256 {
        _mm256_i32gather_ps::<4>(p, _mm256_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112))
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        _mm256_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: __m256, b: __m256) -> __m256 {
        _mm256_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        _mm256_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn div(a: __m256, b: __m256) -> __m256 {
        _mm256_div_ps(a, b)
    }
    #[inline(always)]
    unsafe fn min(a: __m256, b: __m256) -> __m256 {
        _mm256_min_ps(a, b)
    }
    #[inline(always)]
    unsafe fn max(a: __m256, b: __m256) -> __m256 {
        _mm256_max_ps(a, b)
    }
    #[inline(always)]
    unsafe fn abs(v: __m256) -> __m256 {
        _mm256_andnot_ps(_mm256_set1_ps(-0.0), v)
    }
    #[inline(always)]
    unsafe fn sign(v: __m256) -> __m256 {
        _mm256_and_ps(_mm256_set1_ps(-0.0), v)
    }
    #[inline(always)]
    unsafe fn or(a: __m256, b: __m256) -> __m256 {
        _mm256_or_ps(a, b)
    }
    #[inline(always)]
    unsafe fn floor(v: __m256) -> __m256 {
        _mm256_round_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(v)
    }
    #[inline(always)]
    unsafe fn gt(a: __m256, b: __m256) -> __m256 {
        _mm256_cmp_ps::<_CMP_GT_OQ>(a, b)
    }
    #[inline(always)]
    unsafe fn ge(a: __m256, b: __m256) -> __m256 {
        _mm256_cmp_ps::<_CMP_GE_OQ>(a, b)
    }
    #[inline(always)]
    unsafe fn ne(a: __m256, b: __m256) -> __m256 {
        _mm256_cmp_ps::<_CMP_NEQ_OQ>(a, b)
    }
    #[inline(always)]
    unsafe fn ne_u(a: __m256, b: __m256) -> __m256 {
        _mm256_cmp_ps::<_CMP_NEQ_UQ>(a, b)
    }
    #[inline(always)]
    unsafe fn nle_u(a: __m256, b: __m256) -> __m256 {
        _mm256_cmp_ps::<_CMP_NLE_UQ>(a, b)
    }
    #[inline(always)]
    unsafe fn ord(v: __m256) -> __m256 {
        _mm256_cmp_ps::<_CMP_ORD_Q>(v, v)
    }
    #[inline(always)]
    unsafe fn and_m(a: __m256, b: __m256) -> __m256 {
        _mm256_and_ps(a, b)
    }
    #[inline(always)]
    unsafe fn or_m(a: __m256, b: __m256) -> __m256 {
        _mm256_or_ps(a, b)
    }
    #[inline(always)]
    unsafe fn no_mask() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn none(m: __m256) -> bool {
        _mm256_movemask_ps(m) == 0
    }
    #[inline(always)]
    unsafe fn select(m: __m256, if_false: __m256, if_true: __m256) -> __m256 {
        _mm256_blendv_ps(if_false, if_true, m)
    }
    #[inline(always)]
    unsafe fn keep(v: __m256, m: __m256) -> __m256 {
        _mm256_and_ps(v, m)
    }
}

impl Simd for Avx512 {
    const WIDTH: usize = 16;
    type V = __m512;
    type M = __mmask16;
    #[inline(always)]
    unsafe fn splat(v: f32) -> __m512 {
        _mm512_set1_ps(v)
    }
    #[inline(always)]
    unsafe fn gather16(p: *const f32) -> __m512 {
        let idx =
            _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(16));
        _mm512_i32gather_ps::<4>(idx, p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        _mm512_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: __m512, b: __m512) -> __m512 {
        _mm512_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        _mm512_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn div(a: __m512, b: __m512) -> __m512 {
        _mm512_div_ps(a, b)
    }
    #[inline(always)]
    unsafe fn min(a: __m512, b: __m512) -> __m512 {
        _mm512_min_ps(a, b)
    }
    #[inline(always)]
    unsafe fn max(a: __m512, b: __m512) -> __m512 {
        _mm512_max_ps(a, b)
    }
    #[inline(always)]
    unsafe fn abs(v: __m512) -> __m512 {
        _mm512_abs_ps(v)
    }
    #[inline(always)]
    unsafe fn sign(v: __m512) -> __m512 {
        _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(i32::MIN)))
    }
    #[inline(always)]
    unsafe fn or(a: __m512, b: __m512) -> __m512 {
        _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(a), _mm512_castps_si512(b)))
    }
    #[inline(always)]
    unsafe fn floor(v: __m512) -> __m512 {
        _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(v)
    }
    #[inline(always)]
    unsafe fn gt(a: __m512, b: __m512) -> __mmask16 {
        _mm512_cmp_ps_mask::<_CMP_GT_OQ>(a, b)
    }
    #[inline(always)]
    unsafe fn ge(a: __m512, b: __m512) -> __mmask16 {
        _mm512_cmp_ps_mask::<_CMP_GE_OQ>(a, b)
    }
    #[inline(always)]
    unsafe fn ne(a: __m512, b: __m512) -> __mmask16 {
        _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(a, b)
    }
    #[inline(always)]
    unsafe fn ne_u(a: __m512, b: __m512) -> __mmask16 {
        _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(a, b)
    }
    #[inline(always)]
    unsafe fn nle_u(a: __m512, b: __m512) -> __mmask16 {
        _mm512_cmp_ps_mask::<_CMP_NLE_UQ>(a, b)
    }
    #[inline(always)]
    unsafe fn ord(v: __m512) -> __mmask16 {
        _mm512_cmp_ps_mask::<_CMP_ORD_Q>(v, v)
    }
    #[inline(always)]
    unsafe fn and_m(a: __mmask16, b: __mmask16) -> __mmask16 {
        a & b
    }
    #[inline(always)]
    unsafe fn or_m(a: __mmask16, b: __mmask16) -> __mmask16 {
        a | b
    }
    #[inline(always)]
    unsafe fn no_mask() -> __mmask16 {
        0
    }
    #[inline(always)]
    unsafe fn none(m: __mmask16) -> bool {
        m == 0
    }
    #[inline(always)]
    unsafe fn select(m: __mmask16, if_false: __m512, if_true: __m512) -> __m512 {
        _mm512_mask_blend_ps(m, if_false, if_true)
    }
    #[inline(always)]
    unsafe fn keep(v: __m512, m: __mmask16) -> __m512 {
        _mm512_maskz_mov_ps(m, v)
    }
}
