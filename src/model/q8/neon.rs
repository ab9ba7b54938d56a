//! The NEON paths of [`super`] (aarch64): the integers and float steps of
//! `tile_row_portable`, a tile's 16 outputs as 4 vectors of 4 lanes. Per 16 bytes of a line
//! (4 rows' 4-byte groups) one [`Dots::add`] (SDOT, or widening multiplies) per activation row,
//! 2 rows sharing each weight load. Q8_0's stored `u = q + 128` goes back to `q` by flipping
//! the sign bit; Q5_0 / Q4_0's `u` (below 32) multiply as they are, from `−bias · Σ q_x`.
//!
//! Every read is inside the slices `super::tile_rows` asserts: a tile's block column is
//! `format.tile_q()` quant bytes and `TILE_S` scale bytes, activation row `r` has `k` quants
//! and `nb` scales and sums.

// Lane groups `c` and rows `r` index registers and pointer offsets together.
#![allow(clippy::needless_range_loop)]

use std::arch::aarch64::*;

use super::{nibbles, Format, QuantRows, QK, TILE_Q, TILE_S, TN};
use crate::simd::neon::{f16x4, quad, scale_add, Dots};

/// Rows from `r0` (`out.len()` of them) against one tile, 2 sharing each weight load.
///
/// # Safety
/// With `DOT`, the CPU must have SDOT; slices as asserted by `super::tile_rows`.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows<const DOT: bool>(
    format: Format,
    qs: &[u8],
    ss: &[u8],
    nb: usize,
    xs: &QuantRows,
    k: usize,
    r0: usize,
    out: &mut [[f32; TN]],
) {
    for (i, o) in out.chunks_mut(2).enumerate() {
        let r = r0 + i * 2;
        match (format, o.len()) {
            (Format::Q8_0, 2) => rows_q8::<DOT, 2>(qs, ss, nb, xs, k, r, o),
            (Format::Q8_0, _) => rows_q8::<DOT, 1>(qs, ss, nb, xs, k, r, o),
            (Format::Q5_0, 2) => rows_nibbles::<DOT, 2, true>(qs, ss, nb, xs, k, r, o),
            (Format::Q5_0, _) => rows_nibbles::<DOT, 1, true>(qs, ss, nb, xs, k, r, o),
            (Format::Q4_0, 2) => rows_nibbles::<DOT, 2, false>(qs, ss, nb, xs, k, r, o),
            (Format::Q4_0, _) => rows_nibbles::<DOT, 1, false>(qs, ss, nb, xs, k, r, o),
        }
    }
}

/// `R` rows from `r0` against one Q8_0 tile.
#[inline(always)]
unsafe fn rows_q8<const DOT: bool, const R: usize>(
    qs: &[u8],
    ss: &[u8],
    nb: usize,
    xs: &QuantRows,
    k: usize,
    r0: usize,
    out: &mut [[f32; TN]],
) {
    let sign = vdupq_n_u8(0x80);
    let mut acc = [[vdupq_n_f32(0.0); 4]; R];
    let xq = xs.q.as_ptr().add(r0 * k);
    for b in 0..nb {
        let blk = qs.as_ptr().add(b * TILE_Q);
        let mut isum = [[Dots::zero(); 4]; R];
        for j in 0..8 {
            let x: [int8x16_t; R] = std::array::from_fn(|r| quad(xq.add(r * k + b * QK + j * 4)));
            for c in 0..4 {
                let w = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(blk.add(j * 64 + c * 16)), sign));
                for r in 0..R {
                    isum[r][c].add::<DOT>(w, x[r]);
                }
            }
        }
        fold::<DOT, R>(&mut acc, &isum, ss, nb, xs, r0, b, 0);
    }
    store(&acc, out);
}

/// `R` rows from `r0` against one Q4_0 (`HI = false`) or Q5_0 tile.
#[inline(always)]
unsafe fn rows_nibbles<const DOT: bool, const R: usize, const HI: bool>(
    qs: &[u8],
    ss: &[u8],
    nb: usize,
    xs: &QuantRows,
    k: usize,
    r0: usize,
    out: &mut [[f32; TN]],
) {
    let format = if HI { Format::Q5_0 } else { Format::Q4_0 };
    let tq = format.tile_q();
    let mut acc = [[vdupq_n_f32(0.0); 4]; R];
    let xq = xs.q.as_ptr().add(r0 * k);
    for b in 0..nb {
        let blk = qs.as_ptr().add(b * tq);
        let mut isum = [[Dots::zero(); 4]; R];
        for c in 0..4 {
            let qh = if HI { vld1q_u8(blk.add(nibbles::GROUP + c * 16)) } else { vdupq_n_u8(0) };
            for p in 0..4 {
                let (lo, hi) = nibbles::neon::operands::<HI>(vld1q_u8(blk.add(p * nibbles::LINE + c * 16)), qh, p);
                for r in 0..R {
                    let x = xq.add(r * k + b * QK + p * 8);
                    isum[r][c].add::<DOT>(lo, quad(x));
                    isum[r][c].add::<DOT>(hi, quad(x.add(4)));
                }
            }
        }
        fold::<DOT, R>(&mut acc, &isum, ss, nb, xs, r0, b, format.bias());
    }
    store(&acc, out);
}

/// Block `b`'s sums folded into the accumulators: `acc + (d_w · d_x) · (Σ − bias · Σ q_x)`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn fold<const DOT: bool, const R: usize>(
    acc: &mut [[float32x4_t; 4]; R],
    isum: &[[Dots; 4]; R],
    ss: &[u8],
    nb: usize,
    xs: &QuantRows,
    r0: usize,
    b: usize,
    bias: i32,
) {
    for c in 0..4 {
        let dw = f16x4(ss.as_ptr().add(b * TILE_S + c * 8));
        for r in 0..R {
            let at = (r0 + r) * nb + b;
            let i = vaddq_s32(isum[r][c].sum::<DOT>(), vdupq_n_s32(-bias * *xs.s.get_unchecked(at)));
            acc[r][c] = scale_add(acc[r][c], dw, *xs.d.get_unchecked(at), i);
        }
    }
}

#[inline(always)]
unsafe fn store<const R: usize>(acc: &[[float32x4_t; 4]; R], out: &mut [[f32; TN]]) {
    for (a, o) in acc.iter().zip(out.iter_mut()) {
        for (c, v) in a.iter().enumerate() {
            vst1q_f32(o.as_mut_ptr().add(c * 4), *v);
        }
    }
}
