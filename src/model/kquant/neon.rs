//! The NEON paths of [`super`] (aarch64): the integers and float steps of
//! `tile_row_portable`, a tile's 16 outputs as 4 vectors of 4 lanes, 2 activation rows sharing
//! each weight load. Per 16 bytes of a line (4 rows' 4-byte groups) one [`Dots::add`] (SDOT,
//! or widening multiplies) per row and operand; the stored `q` (below 64) multiply as they
//! are; the scales and mins of 4 rows come from one 8-byte load of their pairs.
//!
//! Every read is inside the slices `super::tile_rows` asserts: a tile super-block is
//! `kind.block_bytes()` long and holds each offset used here; activation row `r` has `k`
//! quants, `nsb` scales and `16 · nsb` / `8 · nsb` sums.

// Lane groups `c` and rows `r` index registers and pointer offsets together.
#![allow(clippy::needless_range_loop)]

use std::arch::aarch64::*;

use super::{nibbles, Kind, QuantRows, Row, LINE, NIBBLES, TN};
use crate::simd::neon::{f16x4, quad, Dots};

/// Rows from `r0` (`out.len()` of them) against one tile, 2 sharing each weight load.
///
/// # Safety
/// With `DOT`, the CPU must have SDOT; slices as asserted by `super::tile_rows`.
pub(super) unsafe fn rows<const DOT: bool>(
    kind: Kind,
    tile: &[u8],
    nsb: usize,
    xs: &QuantRows,
    r0: usize,
    out: &mut [[f32; TN]],
) {
    for (i, o) in out.chunks_mut(2).enumerate() {
        let r = r0 + i * 2;
        match (kind, o.len()) {
            (Kind::Q4K, 2) => q45::<DOT, 2, false>(kind, tile, nsb, xs, r, o),
            (Kind::Q4K, _) => q45::<DOT, 1, false>(kind, tile, nsb, xs, r, o),
            (Kind::Q5K, 2) => q45::<DOT, 2, true>(kind, tile, nsb, xs, r, o),
            (Kind::Q5K, _) => q45::<DOT, 1, true>(kind, tile, nsb, xs, r, o),
            (Kind::Q6K, 2) => q6::<DOT, 2>(kind, tile, nsb, xs, r, o),
            (Kind::Q6K, _) => q6::<DOT, 1>(kind, tile, nsb, xs, r, o),
        }
    }
}

/// Sub-block `j`'s scales (or mins) of rows `4c..4c + 4` from their pairs at `pairs`, as
/// `i32` (Q6_K's are signed).
#[inline(always)]
unsafe fn scales4<const SIGNED: bool>(pairs: *const u8, j: usize, c: usize) -> int32x4_t {
    // Rows 4c..4c+4 of pair `j / 2`: 8 bytes, the row's sub-block `j & !1` then `j | 1`; as
    // 32-bit lanes after widening, the even sub-block is the low half.
    let v = vld1_u8(pairs.add((j / 2) * 32 + c * 8));
    let lanes = if SIGNED { vreinterpretq_s32_s16(vmovl_s8(vreinterpret_s8_u8(v))) } else { vreinterpretq_s32_u16(vmovl_u8(v)) };
    match (SIGNED, j % 2) {
        (false, 0) => vandq_s32(lanes, vdupq_n_s32(0xFFFF)),
        (false, _) => vreinterpretq_s32_u32(vshrq_n_u32::<16>(vreinterpretq_u32_s32(lanes))),
        (true, 0) => vshrq_n_s32::<16>(vshlq_n_s32::<16>(lanes)),
        (true, _) => vshrq_n_s32::<16>(lanes),
    }
}

/// `R` rows against one Q4_K (`HI = false`) or Q5_K tile.
#[inline(always)]
unsafe fn q45<const DOT: bool, const R: usize, const HI: bool>(
    kind: Kind,
    tile: &[u8],
    nsb: usize,
    xs: &QuantRows,
    r0: usize,
    out: &mut [[f32; TN]],
) {
    let mut acc = [[vdupq_n_f32(0.0); 4]; R];
    for b in 0..nsb {
        let blk = tile.as_ptr().add(b * kind.block_bytes());
        let x: [Row; R] = std::array::from_fn(|r| Row::at(xs, nsb, r0 + r, b));
        for c in 0..4 {
            let (mut isum, mut imin) = ([vdupq_n_s32(0); R], [vdupq_n_s32(0); R]);
            for j in 0..8 {
                let sc = scales4::<false>(blk.add(kind.scales_at()), j, c);
                let m = scales4::<false>(blk.add(kind.mins_at()), j, c);
                let qh = if HI { vld1q_u8(blk.add(NIBBLES + j * LINE + c * 16)) } else { vdupq_n_u8(0) };
                let mut s = [Dots::zero(); R];
                for l in 0..4 {
                    let w = vld1q_u8(blk.add((4 * j + l) * LINE + c * 16));
                    let (lo, hi) = nibbles::neon::operands::<HI>(w, qh, l);
                    for r in 0..R {
                        let at = x[r].q.add(32 * j + 8 * l);
                        s[r].add::<DOT>(lo, quad(at));
                        s[r].add::<DOT>(hi, quad(at.add(4)));
                    }
                }
                for r in 0..R {
                    isum[r] = vmlaq_s32(isum[r], s[r].sum::<DOT>(), sc);
                    imin[r] = vmlaq_n_s32(imin[r], m, *x[r].s32.add(j) as i32);
                }
            }
            let d = f16x4(blk.add(kind.d_at() + c * 8));
            let dmin = f16x4(blk.add(kind.d_at() + 32 + c * 8));
            for r in 0..R {
                let plus = vmulq_f32(vmulq_n_f32(d, x[r].d), vcvtq_f32_s32(isum[r]));
                let minus = vmulq_f32(vmulq_n_f32(dmin, x[r].d), vcvtq_f32_s32(imin[r]));
                acc[r][c] = vsubq_f32(vaddq_f32(acc[r][c], plus), minus);
            }
        }
    }
    store(&acc, out);
}

/// `R` rows against one Q6_K tile.
#[inline(always)]
unsafe fn q6<const DOT: bool, const R: usize>(
    kind: Kind,
    tile: &[u8],
    nsb: usize,
    xs: &QuantRows,
    r0: usize,
    out: &mut [[f32; TN]],
) {
    let (nib, bits) = (vdupq_n_u8(0x0F), vdupq_n_u8(0x30));
    let mut acc = [[vdupq_n_f32(0.0); 4]; R];
    for b in 0..nsb {
        let blk = tile.as_ptr().add(b * kind.block_bytes());
        let x: [Row; R] = std::array::from_fn(|r| Row::at(xs, nsb, r0 + r, b));
        for c in 0..4 {
            // `isum`: Σ sc_j Σ q_w q_x; `offset`: Σ sc_j Σ q_x (the weights' −32, applied at the end).
            let (mut isum, mut offset) = ([vdupq_n_s32(0); R], [vdupq_n_s32(0); R]);
            for j in 0..16 {
                let sc = scales4::<true>(blk.add(kind.scales_at()), j, c);
                let qh = vld1q_u8(blk.add(NIBBLES + j * LINE + c * 16));
                let mut s = [Dots::zero(); R];
                for l in 0..2 {
                    // Bits `4l` (low nibbles' values) and `4l + 2` (high) of `qh` to bits 4–5.
                    let w = vld1q_u8(blk.add((2 * j + l) * LINE + c * 16));
                    let bl = vandq_u8(vshlq_u8(qh, vdupq_n_s8(4 - 4 * l as i8)), bits);
                    let bh = vandq_u8(vshlq_u8(qh, vdupq_n_s8(2 - 4 * l as i8)), bits);
                    let lo = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(w, nib), bl));
                    let hi = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8::<4>(w), bh));
                    for r in 0..R {
                        let at = x[r].q.add(16 * j + 8 * l);
                        s[r].add::<DOT>(lo, quad(at));
                        s[r].add::<DOT>(hi, quad(at.add(4)));
                    }
                }
                for r in 0..R {
                    isum[r] = vmlaq_s32(isum[r], s[r].sum::<DOT>(), sc);
                    offset[r] = vmlaq_n_s32(offset[r], sc, *x[r].s16.add(j) as i32);
                }
            }
            let d = f16x4(blk.add(kind.d_at() + c * 8));
            for r in 0..R {
                let i = vsubq_s32(isum[r], vshlq_n_s32::<5>(offset[r]));
                acc[r][c] = vaddq_f32(acc[r][c], vmulq_f32(vmulq_n_f32(d, x[r].d), vcvtq_f32_s32(i)));
            }
        }
    }
    store(&acc, out);
}

#[inline(always)]
unsafe fn store<const R: usize>(acc: &[[float32x4_t; 4]; R], out: &mut [[f32; TN]]) {
    for (a, o) in acc.iter().zip(out.iter_mut()) {
        for (c, v) in a.iter().enumerate() {
            vst1q_f32(o.as_mut_ptr().add(c * 4), *v);
        }
    }
}
