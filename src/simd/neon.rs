//! NEON pieces the integer matrix kernels share on aarch64 ([`crate::model::q8`],
//! [`crate::model::kquant`]): the exact integer dot products of 4 rows' 4-byte groups with one
//! broadcast 4-byte group of activations, with SDOT where the CPU has it (FEAT_DotProd: Apple
//! M1 and later, Neoverse N1 / Graviton 2 and later) and with widening multiplies everywhere
//! else, and the f16 → f32 conversion of the weights' scales.
//!
//! Both dot forms give the same exact integers (no saturation: every product is at most
//! `128 · 128` in magnitude and is widened before it is added), so the float steps after them,
//! written once in each kernel, give the bits of the portable path.
//!
//! SDOT is emitted with inline assembly: its intrinsic (`vdotq_s32`) is not stable in Rust,
//! and the assembler directive enables the instruction for that one statement, so the code
//! around it needs no target feature. It is only reached with `DOT = true`, which the kernels
//! only choose after [`has_dotprod`] said yes.

use std::arch::aarch64::*;
use std::arch::asm;

/// Whether this CPU has SDOT / UDOT (detected by the standard library, once).
pub(crate) fn has_dotprod() -> bool {
    std::arch::is_aarch64_feature_detected!("dotprod")
}

/// The running sums of 4 lanes (4 weight rows): with SDOT one vector, lane `i` the sum for
/// row `i`; without it two, each lane holding one half of a row's sum (`[0]`: rows 0, 1;
/// `[1]`: rows 2, 3), added pairwise by [`Dots::sum`].
#[derive(Clone, Copy)]
pub(crate) struct Dots([int32x4_t; 2]);

impl Dots {
    #[inline(always)]
    pub(crate) fn zero() -> Dots {
        // SAFETY: NEON is part of every aarch64 target Rust builds for.
        unsafe { Dots([vdupq_n_s32(0), vdupq_n_s32(0)]) }
    }

    /// Adds `Σ_t w[4i + t] · x[t]` to lane `i` (`x`'s 4 bytes repeated 4 times, as
    /// [`quad`] loads them).
    ///
    /// # Safety
    /// With `DOT`, the CPU must have SDOT ([`has_dotprod`]).
    #[inline(always)]
    pub(crate) unsafe fn add<const DOT: bool>(&mut self, w: int8x16_t, x: int8x16_t) {
        if DOT {
            asm!(
                ".arch_extension dotprod",
                "sdot {acc:v}.4s, {w:v}.16b, {x:v}.16b",
                acc = inout(vreg) self.0[0],
                w = in(vreg) w,
                x = in(vreg) x,
                options(pure, nomem, nostack, preserves_flags),
            );
        } else {
            // 8 products of two rows' 4 bytes, as i16 (exact), added in pairs into i32.
            self.0[0] = vpadalq_s16(self.0[0], vmull_s8(vget_low_s8(w), vget_low_s8(x)));
            self.0[1] = vpadalq_s16(self.0[1], vmull_high_s8(w, x));
        }
    }

    /// The 4 rows' sums.
    #[inline(always)]
    pub(crate) fn sum<const DOT: bool>(self) -> int32x4_t {
        // SAFETY: NEON is part of every aarch64 target.
        if DOT {
            self.0[0]
        } else {
            unsafe { vpaddq_s32(self.0[0], self.0[1]) }
        }
    }
}

/// The 4 bytes at `p` in each 32-bit lane.
///
/// # Safety
/// `p..p + 4` must be readable.
#[inline(always)]
pub(crate) unsafe fn quad(p: *const i8) -> int8x16_t {
    vreinterpretq_s8_s32(vdupq_n_s32(std::ptr::read_unaligned(p as *const i32)))
}

/// The 4 f16 (little-endian bits) at `p` as f32, exactly (`fcvtl`, base AArch64).
///
/// # Safety
/// `p..p + 8` must be readable.
#[inline(always)]
pub(crate) unsafe fn f16x4(p: *const u8) -> float32x4_t {
    let h = vld1_u16(p as *const u16);
    let f: float32x4_t;
    asm!("fcvtl {f:v}.4s, {h:v}.4h", f = out(vreg) f, h = in(vreg) h, options(pure, nomem, nostack, preserves_flags));
    f
}

/// `acc + (s · d) · i` in f32, each step rounded (no fused multiply-add): the epilogue every
/// path of the kernels shares.
#[inline(always)]
pub(crate) fn scale_add(acc: float32x4_t, s: float32x4_t, d: f32, i: int32x4_t) -> float32x4_t {
    // SAFETY: NEON is part of every aarch64 target.
    unsafe { vaddq_f32(acc, vmulq_f32(vmulq_n_f32(s, d), vcvtq_f32_s32(i))) }
}
