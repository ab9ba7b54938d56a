//! The AVX-512 VNNI and AVX2 paths of [`super`]: the integers and float steps of
//! `tile_row_portable`, 16 outputs per vector (VNNI) or two halves of 8 (AVX2).
//!
//! Every read is inside the slices `super::tile_rows` asserts: a tile super-block is
//! `kind.block_bytes()` long and holds each offset used here; activation row `r` has `k`
//! quants, `nsb` scales and `16 · nsb` / `8 · nsb` sums.

use std::arch::x86_64::*;
use std::ptr::read_unaligned;

use super::{nibbles, Ahead, Kind, QuantRows, Row, LINE, NIBBLES, TN};

impl Row {
    /// Quants `at..at + 8` as two 4-byte groups (two loads, so each broadcast can be folded
    /// into the instruction that uses it).
    #[inline(always)]
    unsafe fn quads(&self, at: usize) -> (i32, i32) {
        (read_unaligned(self.q.add(at) as *const i32), read_unaligned(self.q.add(at + 4) as *const i32))
    }

    /// Sums `2t, 2t + 1` of 16 (`wide: false`) or 32 values as one `i16` pair.
    #[inline(always)]
    unsafe fn sum_pair(&self, wide: bool, t: usize) -> i32 {
        read_unaligned((if wide { self.s32 } else { self.s16 }).add(2 * t) as *const i32)
    }
}

/// Rows from `r0` (`out.len()` of them) against one tile, 4 sharing each weight load.
///
/// # Safety
/// AVX-512 F/BW/VL and VNNI must be present; slices as asserted by `super::tile_rows`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn rows_vnni(
    kind: Kind,
    tile: &[u8],
    nsb: usize,
    xs: &QuantRows,
    r0: usize,
    out: &mut [[f32; TN]],
    ahead: Ahead,
) {
    for (i, o) in out.chunks_mut(4).enumerate() {
        let r = r0 + i * 4;
        let a = ahead.for_pass(i);
        macro_rules! rows {
            ($f:ident $(, $hi:literal)?) => {
                match o.len() {
                    4 => $f::<4 $(, $hi)?>(kind, tile, nsb, xs, r, o, a),
                    3 => $f::<3 $(, $hi)?>(kind, tile, nsb, xs, r, o, a),
                    2 => $f::<2 $(, $hi)?>(kind, tile, nsb, xs, r, o, a),
                    _ => $f::<1 $(, $hi)?>(kind, tile, nsb, xs, r, o, a),
                }
            };
        }
        match kind {
            Kind::Q4K => rows!(q45_vnni, false),
            Kind::Q5K => rows!(q45_vnni, true),
            Kind::Q6K => rows!(q6_vnni),
        }
    }
}

/// `R` rows against one Q4_K (`HI = false`) or Q5_K tile.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q45_vnni<const R: usize, const HI: bool>(
    kind: Kind,
    tile: &[u8],
    nsb: usize,
    xs: &QuantRows,
    r0: usize,
    out: &mut [[f32; TN]],
    ahead: Ahead,
) {
    let low16 = _mm512_set1_epi32(0xFFFF);
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..nsb {
        let blk = tile.as_ptr().add(b * kind.block_bytes());
        let x: [Row; R] = std::array::from_fn(|r| Row::at(xs, nsb, r0 + r, b));
        let (mut isum, mut imin) = ([_mm512_setzero_si512(); R], [_mm512_setzero_si512(); R]);
        for t in 0..4 {
            ahead.fetch_part(blk, kind.block_bytes(), t, 4);
            let scales = _mm512_cvtepu8_epi16(_mm256_loadu_si256(blk.add(kind.scales_at() + t * 32) as *const __m256i));
            let mins = _mm512_cvtepu8_epi16(_mm256_loadu_si256(blk.add(kind.mins_at() + t * 32) as *const __m256i));
            for r in 0..R {
                imin[r] = _mm512_dpwssd_epi32(imin[r], mins, _mm512_set1_epi32(x[r].sum_pair(true, t)));
            }
            for h in 0..2 {
                let j = 2 * t + h;
                let sc = if h == 0 { _mm512_and_si512(scales, low16) } else { _mm512_srli_epi32::<16>(scales) };
                let qh = if HI { _mm512_loadu_si512(blk.add(NIBBLES + j * LINE) as *const _) } else { _mm512_setzero_si512() };
                let mut s = [_mm512_setzero_si512(); R];
                // Line `l` of the sub-block, its fifth bits from `qh` (Q5_K).
                macro_rules! line {
                    ($l:literal) => {{
                        let w = _mm512_loadu_si512(blk.add((4 * j + $l) * LINE) as *const _);
                        let (lo, hi) = nibbles::x86::vnni_operands::<HI>(w, qh, $l);
                        for r in 0..R {
                            let (a, c) = x[r].quads(32 * j + 8 * $l);
                            s[r] = _mm512_dpbusd_epi32(s[r], lo, _mm512_set1_epi32(a));
                            s[r] = _mm512_dpbusd_epi32(s[r], hi, _mm512_set1_epi32(c));
                        }
                    }};
                }
                line!(0);
                line!(1);
                line!(2);
                line!(3);
                for r in 0..R {
                    isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(s[r], sc));
                }
            }
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(kind.d_at()) as *const __m256i));
        let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(kind.d_at() + 32) as *const __m256i));
        for r in 0..R {
            let dx = _mm512_set1_ps(x[r].d);
            let plus = _mm512_mul_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(isum[r]));
            let minus = _mm512_mul_ps(_mm512_mul_ps(dmin, dx), _mm512_cvtepi32_ps(imin[r]));
            acc[r] = _mm512_sub_ps(_mm512_add_ps(acc[r], plus), minus);
        }
    }
    for (a, o) in acc.iter().zip(out.iter_mut()) {
        _mm512_storeu_ps(o.as_mut_ptr(), *a);
    }
}

/// `R` rows against one Q6_K tile.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q6_vnni<const R: usize>(
    kind: Kind,
    tile: &[u8],
    nsb: usize,
    xs: &QuantRows,
    r0: usize,
    out: &mut [[f32; TN]],
    ahead: Ahead,
) {
    let (nib, bits) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..nsb {
        let blk = tile.as_ptr().add(b * kind.block_bytes());
        let x: [Row; R] = std::array::from_fn(|r| Row::at(xs, nsb, r0 + r, b));
        // `isum`: Σ sc_j Σ q_w q_x; `offset`: Σ sc_j Σ q_x (the weights' −32, applied at the end).
        let (mut isum, mut offset) = ([_mm512_setzero_si512(); R], [_mm512_setzero_si512(); R]);
        for t in 0..8 {
            ahead.fetch_part(blk, kind.block_bytes(), t, 8);
            let scales = _mm512_cvtepi8_epi16(_mm256_loadu_si256(blk.add(kind.scales_at() + t * 32) as *const __m256i));
            for r in 0..R {
                offset[r] = _mm512_dpwssd_epi32(offset[r], scales, _mm512_set1_epi32(x[r].sum_pair(false, t)));
            }
            for h in 0..2 {
                let j = 2 * t + h;
                let sc = if h == 0 {
                    _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(scales))
                } else {
                    _mm512_srai_epi32::<16>(scales)
                };
                let qh = _mm512_loadu_si512(blk.add(NIBBLES + j * LINE) as *const _);
                let mut s = [_mm512_setzero_si512(); R];
                // Line `l` of the group: bits 4–5 of its low nibbles' values are bits `4l`, of
                // its high nibbles' `4l + 2`, shifted to bits 4–5.
                macro_rules! line {
                    ($l:literal, $lo:expr, $hi:expr) => {{
                        let w = _mm512_loadu_si512(blk.add((2 * j + $l) * LINE) as *const _);
                        let lo = _mm512_ternarylogic_epi32::<0xEA>($lo, bits, _mm512_and_si512(w, nib));
                        let hi = _mm512_ternarylogic_epi32::<0xEA>($hi, bits, _mm512_and_si512(_mm512_srli_epi16::<4>(w), nib));
                        for r in 0..R {
                            let (a, c) = x[r].quads(16 * j + 8 * $l);
                            s[r] = _mm512_dpbusd_epi32(s[r], lo, _mm512_set1_epi32(a));
                            s[r] = _mm512_dpbusd_epi32(s[r], hi, _mm512_set1_epi32(c));
                        }
                    }};
                }
                line!(0, _mm512_slli_epi16::<4>(qh), _mm512_slli_epi16::<2>(qh));
                line!(1, qh, _mm512_srli_epi16::<2>(qh));
                for r in 0..R {
                    isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(s[r], sc));
                }
            }
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(kind.d_at()) as *const __m256i));
        for r in 0..R {
            let i = _mm512_sub_epi32(isum[r], _mm512_slli_epi32::<5>(offset[r]));
            acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps(x[r].d)), _mm512_cvtepi32_ps(i)));
        }
    }
    for (a, o) in acc.iter().zip(out.iter_mut()) {
        _mm512_storeu_ps(o.as_mut_ptr(), *a);
    }
}

/// Rows from `r0` (`out.len()` of them) against one tile, 2 sharing each weight load.
///
/// # Safety
/// AVX2 and F16C must be present; slices as asserted by `super::tile_rows`.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn rows_avx2(
    kind: Kind,
    tile: &[u8],
    nsb: usize,
    xs: &QuantRows,
    r0: usize,
    out: &mut [[f32; TN]],
    ahead: Ahead,
) {
    for (i, o) in out.chunks_mut(2).enumerate() {
        let r = r0 + i * 2;
        let a = ahead.for_pass(i);
        match o.len() {
            2 => avx2::<2>(kind, tile, nsb, xs, r, o, a),
            _ => avx2::<1>(kind, tile, nsb, xs, r, o, a),
        }
    }
}

/// `R` rows against one tile of any kind, as two halves of 8 lanes. A line's two `maddubs`
/// results are added as `i16` before widening: each is a sum of two products of at most
/// `63 · 128`, so the four stay below `2¹⁵`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn avx2<const R: usize>(
    kind: Kind,
    tile: &[u8],
    nsb: usize,
    xs: &QuantRows,
    r0: usize,
    out: &mut [[f32; TN]],
    ahead: Ahead,
) {
    let (ones, low16, bits) = (_mm256_set1_epi16(1), _mm256_set1_epi32(0xFFFF), _mm256_set1_epi8(0x30));
    let q6 = kind == Kind::Q6K;
    let lines = if q6 { 2 } else { 4 };
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for b in 0..nsb {
        let blk = tile.as_ptr().add(b * kind.block_bytes());
        ahead.fetch(blk, kind.block_bytes());
        let x: [Row; R] = std::array::from_fn(|r| Row::at(xs, nsb, r0 + r, b));
        let (mut isum, mut imin) = ([[_mm256_setzero_si256(); 2]; R], [[_mm256_setzero_si256(); 2]; R]);
        for (half, h16) in [0, 16].into_iter().enumerate() {
            for t in 0..kind.groups() / 2 {
                let pairs = blk.add(kind.scales_at() + t * 32 + h16) as *const __m128i;
                let scales =
                    if q6 { _mm256_cvtepi8_epi16(_mm_loadu_si128(pairs)) } else { _mm256_cvtepu8_epi16(_mm_loadu_si128(pairs)) };
                if q6 {
                    for r in 0..R {
                        let p = _mm256_madd_epi16(scales, _mm256_set1_epi32(x[r].sum_pair(false, t)));
                        imin[r][half] = _mm256_add_epi32(imin[r][half], p);
                    }
                } else {
                    let mins = _mm256_cvtepu8_epi16(_mm_loadu_si128(blk.add(kind.mins_at() + t * 32 + h16) as *const __m128i));
                    for r in 0..R {
                        let p = _mm256_madd_epi16(mins, _mm256_set1_epi32(x[r].sum_pair(true, t)));
                        imin[r][half] = _mm256_add_epi32(imin[r][half], p);
                    }
                }
                for h in 0..2 {
                    let j = 2 * t + h;
                    let sc = match (q6, h) {
                        (false, 0) => _mm256_and_si256(scales, low16),
                        (false, _) => _mm256_srli_epi32::<16>(scales),
                        (true, 0) => _mm256_srai_epi32::<16>(_mm256_slli_epi32::<16>(scales)),
                        (true, _) => _mm256_srai_epi32::<16>(scales),
                    };
                    let qh = if kind == Kind::Q4K {
                        _mm256_setzero_si256()
                    } else {
                        _mm256_loadu_si256(blk.add(NIBBLES + j * LINE + 2 * h16) as *const __m256i)
                    };
                    let mut s = [_mm256_setzero_si256(); R];
                    for l in 0..lines {
                        let w = _mm256_loadu_si256(blk.add((lines * j + l) * LINE + 2 * h16) as *const __m256i);
                        let (mut lo, mut hi) = nibbles::x86::avx2_operands(w, qh, l, kind == Kind::Q5K);
                        if q6 {
                            // Bits `4l` and `4l + 2` to bits 4–5: a variable shift of the 32-bit
                            // lanes, then two bits per byte kept.
                            let (sl, sh) = (_mm_cvtsi32_si128(4 * l as i32), _mm_cvtsi32_si128(4 * l as i32 + 2));
                            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi32::<4>(_mm256_srl_epi32(qh, sl)), bits));
                            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi32::<4>(_mm256_srl_epi32(qh, sh)), bits));
                        }
                        let at = (lines * j + l) * 8;
                        for r in 0..R {
                            let (a, c) = x[r].quads(at);
                            let pairs = _mm256_add_epi16(
                                _mm256_maddubs_epi16(lo, _mm256_set1_epi32(a)),
                                _mm256_maddubs_epi16(hi, _mm256_set1_epi32(c)),
                            );
                            s[r] = _mm256_add_epi32(s[r], _mm256_madd_epi16(pairs, ones));
                        }
                    }
                    for r in 0..R {
                        isum[r][half] = _mm256_add_epi32(isum[r][half], _mm256_mullo_epi32(s[r], sc));
                    }
                }
            }
            let d = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(kind.d_at() + h16) as *const __m128i));
            for r in 0..R {
                let dx = _mm256_set1_ps(x[r].d);
                acc[r][half] = if q6 {
                    let i = _mm256_sub_epi32(isum[r][half], _mm256_slli_epi32::<5>(imin[r][half]));
                    _mm256_add_ps(acc[r][half], _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(i)))
                } else {
                    let dmin = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(kind.d_at() + 32 + h16) as *const __m128i));
                    let plus = _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(isum[r][half]));
                    let minus = _mm256_mul_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(imin[r][half]));
                    _mm256_sub_ps(_mm256_add_ps(acc[r][half], plus), minus)
                };
            }
        }
    }
    for (a, o) in acc.iter().zip(out.iter_mut()) {
        _mm256_storeu_ps(o.as_mut_ptr(), a[0]);
        _mm256_storeu_ps(o.as_mut_ptr().add(8), a[1]);
    }
}
