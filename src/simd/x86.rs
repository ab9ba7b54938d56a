//! AVX2 kernels shared by the CPU kernels: a vector's dot products with many rows at once,
//! with the bits of [`super::dot`] for each row. A row's dot is 8 lanes, lane `l` summing
//! `v[8c + l] · row[8c + l]` over chunks `c` in order (a product then a sum, never fused),
//! then the lanes added left to right; 8 rows' accumulators are transposed so that 7 vector
//! adds do the 8 left-to-right lane sums.

use std::arch::x86_64::*;

/// `out[d] = dot(q, keys[d]) · scale`, or with `ADD` `out[d] += dot(q, keys[d]) · scale`, for
/// the `out.len()` rows in `keys` (each `q.len()` long).
///
/// # Safety
/// AVX2 and FMA must be present; `q.len()` a multiple of 8 and `keys.len() ≥ out.len() ·
/// q.len()` (asserted).
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dots<const ADD: bool>(q: &[f32], keys: &[f32], scale: f32, out: &mut [f32]) {
    let hd = q.len();
    assert!(hd.is_multiple_of(8) && keys.len() >= out.len() * hd);
    let full = out.len() / 8 * 8;
    let sv = _mm256_set1_ps(scale);
    for g in (0..full).step_by(8) {
        let kp = keys.as_ptr().add(g * hd);
        let mut acc = [_mm256_setzero_ps(); 8];
        for c in (0..hd).step_by(8) {
            let qc = _mm256_loadu_ps(q.as_ptr().add(c));
            for (d, a) in acc.iter_mut().enumerate() {
                *a = _mm256_add_ps(*a, _mm256_mul_ps(qc, _mm256_loadu_ps(kp.add(d * hd + c))));
            }
        }
        let op = out.as_mut_ptr().add(g);
        let s = _mm256_mul_ps(lane_sums(acc), sv);
        _mm256_storeu_ps(op, if ADD { _mm256_add_ps(_mm256_loadu_ps(op), s) } else { s });
    }
    for (d, o) in out.iter_mut().enumerate().skip(full) {
        let s = super::dot(q, &keys[d * hd..][..hd]) * scale;
        *o = if ADD { *o + s } else { s };
    }
}

/// Lane `d` of the result is `((a_d[0] + a_d[1]) + a_d[2]) + … + a_d[7]`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn lane_sums(a: [__m256; 8]) -> __m256 {
    // 8 × 8 transpose: `t[l]` holds lane `l` of each accumulator.
    let (t0, t1) = (_mm256_unpacklo_ps(a[0], a[1]), _mm256_unpackhi_ps(a[0], a[1]));
    let (t2, t3) = (_mm256_unpacklo_ps(a[2], a[3]), _mm256_unpackhi_ps(a[2], a[3]));
    let (t4, t5) = (_mm256_unpacklo_ps(a[4], a[5]), _mm256_unpackhi_ps(a[4], a[5]));
    let (t6, t7) = (_mm256_unpacklo_ps(a[6], a[7]), _mm256_unpackhi_ps(a[6], a[7]));
    let u = [
        _mm256_shuffle_ps::<0x44>(t0, t2),
        _mm256_shuffle_ps::<0xEE>(t0, t2),
        _mm256_shuffle_ps::<0x44>(t1, t3),
        _mm256_shuffle_ps::<0xEE>(t1, t3),
    ];
    let w = [
        _mm256_shuffle_ps::<0x44>(t4, t6),
        _mm256_shuffle_ps::<0xEE>(t4, t6),
        _mm256_shuffle_ps::<0x44>(t5, t7),
        _mm256_shuffle_ps::<0xEE>(t5, t7),
    ];
    let t = [
        _mm256_permute2f128_ps::<0x20>(u[0], w[0]),
        _mm256_permute2f128_ps::<0x20>(u[1], w[1]),
        _mm256_permute2f128_ps::<0x20>(u[2], w[2]),
        _mm256_permute2f128_ps::<0x20>(u[3], w[3]),
        _mm256_permute2f128_ps::<0x31>(u[0], w[0]),
        _mm256_permute2f128_ps::<0x31>(u[1], w[1]),
        _mm256_permute2f128_ps::<0x31>(u[2], w[2]),
        _mm256_permute2f128_ps::<0x31>(u[3], w[3]),
    ];
    let mut s = t[0];
    for x in &t[1..] {
        s = _mm256_add_ps(s, *x);
    }
    s
}
