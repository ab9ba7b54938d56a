//! AVX2 kernels shared by the CPU kernels: a vector's dot products with many rows at once,
//! with the bits of [`super::dot`] for each row. A row's dot is 8 lanes, lane `l` summing
//! `v[8c + l] · row[8c + l]` over chunks `c` in order (a product then a sum, never fused),
//! then the lanes added left to right; 8 rows' accumulators are transposed so that 7 vector
//! adds do the 8 left-to-right lane sums.

use std::arch::x86_64::*;

/// Where a kernel reads rows from: 8 values of row `j` from element `c`, as f32.
pub(crate) trait Rows8 {
    /// # Safety
    /// Row `j` must exist and hold `c + 8` values; for f16 rows the caller has F16C.
    unsafe fn load8(&self, j: usize, c: usize) -> __m256;
}

/// Rows of `hd` f32 side by side from `p`.
pub(crate) struct Packed {
    pub p: *const f32,
    pub hd: usize,
}

impl Rows8 for Packed {
    #[inline(always)]
    unsafe fn load8(&self, j: usize, c: usize) -> __m256 {
        _mm256_loadu_ps(self.p.add(j * self.hd + c))
    }
}

/// f32 rows wherever they are.
pub(crate) struct F32Rows<'a>(pub &'a [*const f32]);

impl Rows8 for F32Rows<'_> {
    #[inline(always)]
    unsafe fn load8(&self, j: usize, c: usize) -> __m256 {
        _mm256_loadu_ps(self.0.get_unchecked(j).add(c))
    }
}

/// f16 rows wherever they are, widened (exactly) as they are read.
pub(crate) struct F16Rows<'a>(pub &'a [*const half::f16]);

impl Rows8 for F16Rows<'_> {
    #[inline(always)]
    unsafe fn load8(&self, j: usize, c: usize) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(self.0.get_unchecked(j).add(c) as *const __m128i))
    }
}

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
    dots_rows::<ADD, false, _>(q, &Packed { p: keys.as_ptr(), hd }, scale, out)
}

/// [`dots`] over rows read through `rows` (`out.len()` of them), the same bits: groups of 8,
/// and a last group of fewer padded with copies of its last row whose results are dropped
/// (its lanes then sum as [`super::dot`] does: `−0 + a₀ + … + a₇`, then `+ −0`, which leaves
/// every bit as it is).
///
/// `ROW_BY_ROW` reads each row start to end before the next (rows streamed from memory: in
/// that order the hardware prefetchers keep up, and a decode row's scores ran 1.7× faster);
/// otherwise the 8 rows a column at a time (rows in L1: more independent sums in flight, and
/// a prompt tile's scores ran 12% faster). Each row's sum is taken in the same order either way.
///
/// # Safety
/// As [`dots`]; `rows` holds `out.len()` rows of `q.len()` values (a multiple of 8).
#[inline(always)]
pub(crate) unsafe fn dots_rows<const ADD: bool, const ROW_BY_ROW: bool, R: Rows8>(
    q: &[f32],
    rows: &R,
    scale: f32,
    out: &mut [f32],
) {
    let (hd, n) = (q.len(), out.len());
    let sv = _mm256_set1_ps(scale);
    for g in (0..n).step_by(8) {
        let m = (n - g).min(8);
        let mut acc = [_mm256_setzero_ps(); 8];
        if ROW_BY_ROW {
            for (d, a) in acc.iter_mut().enumerate() {
                for c in (0..hd).step_by(8) {
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(_mm256_loadu_ps(q.as_ptr().add(c)), rows.load8(g + d.min(m - 1), c)));
                }
            }
        } else {
            for c in (0..hd).step_by(8) {
                let qc = _mm256_loadu_ps(q.as_ptr().add(c));
                for (d, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(qc, rows.load8(g + d.min(m - 1), c)));
                }
            }
        }
        let s = _mm256_mul_ps(lane_sums(acc), sv);
        let mut t = [0f32; 8];
        let op = if m == 8 { out.as_mut_ptr().add(g) } else { t.as_mut_ptr() };
        if ADD && m < 8 {
            t[..m].copy_from_slice(&out[g..g + m]);
        }
        _mm256_storeu_ps(op, if ADD { _mm256_add_ps(_mm256_loadu_ps(op), s) } else { s });
        if m < 8 {
            out[g..g + m].copy_from_slice(&t[..m]);
        }
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
