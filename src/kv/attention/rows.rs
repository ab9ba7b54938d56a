//! How the fused kernel reads the pool: one KV head of one sequence through its block table
//! ([`KvView`]), its rows from a float pool ([`Dense`]: f32 as is, f16 / bf16 widened exactly)
//! or a block-quantized one ([`Quantized`]: dequantized per row), as f32 rows, into a buffer, or
//! in place.

use std::cell::RefCell;

use crate::kv::quant::{dequant_row, Quant};
use crate::kv::BlockId;

/// An element of the KV pool the fused kernel reads: f32 as is; half precision widened to f32
/// (exactly) into a per-thread row buffer first.
trait KvElem: Copy + Send + Sync {
    /// `f(row as f32)`.
    fn with_f32<R>(row: &[Self], f: impl FnOnce(&[f32]) -> R) -> R;

    /// `row` as f32 into `dst` (same length).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the gathering kernels are x86's
    fn widen_into(row: &[Self], dst: &mut [f32]);

    /// `row` where the in-place kernels can read it (f32, f16).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn in_place(row: &[Self]) -> RowPtr {
        let _ = row;
        RowPtr::None
    }
}

/// A pool row the in-place kernels read as it is ([`KvElem::in_place`]).
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) enum RowPtr {
    F32(*const f32),
    F16(*const half::f16),
    None,
}

thread_local! {
    static WIDE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

impl KvElem for f32 {
    #[inline(always)]
    fn with_f32<R>(row: &[f32], f: impl FnOnce(&[f32]) -> R) -> R {
        f(row)
    }

    #[inline(always)]
    fn widen_into(row: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(row)
    }

    #[inline(always)]
    fn in_place(row: &[f32]) -> RowPtr {
        RowPtr::F32(row.as_ptr())
    }
}

macro_rules! half_elem {
    ($t:ty, $widen:ident $(, $ptr:ident)?) => {
        impl KvElem for $t {
            #[inline(always)]
            fn with_f32<R>(row: &[$t], f: impl FnOnce(&[f32]) -> R) -> R {
                WIDE.with(|w| {
                    let mut w = w.borrow_mut();
                    w.resize(row.len(), 0.0);
                    $widen(row, &mut w);
                    f(&w)
                })
            }

            #[inline(always)]
            fn widen_into(row: &[$t], dst: &mut [f32]) {
                $widen(row, dst)
            }
            $(
                #[inline(always)]
                fn in_place(row: &[$t]) -> RowPtr {
                    RowPtr::$ptr(row.as_ptr())
                }
            )?
        }
    };
}
half_elem!(half::f16, widen, F16);
half_elem!(half::bf16, widen_bf16);

/// f16 widened exactly, 8 at a time with F16C where the CPU has it (`half`'s slice
/// conversion, which checks the CPU on every call, took twice as long per row as reading an
/// f32 row from memory).
#[inline(always)]
pub(super) fn widen(row: &[half::f16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::kv::attention_x86::has_f16c() {
        // SAFETY: F16C (and the AVX it implies) was detected; the lengths are checked inside.
        return unsafe { crate::kv::attention_x86::widen_f16(row, dst) };
    }
    use half::slice::HalfFloatSliceExt;
    row.convert_to_f32_slice(dst)
}

/// bf16 widened exactly (its bits are an f32's upper half); the loop vectorises.
#[inline(always)]
pub(super) fn widen_bf16(row: &[half::bf16], dst: &mut [f32]) {
    for (o, v) in dst.iter_mut().zip(row) {
        *o = f32::from_bits((v.to_bits() as u32) << 16);
    }
}

/// Where the fused kernel reads one KV head's rows from.
pub(super) trait KvRows: Sync {
    /// `f(row)` of K (`value == false`) or V at pool slot `slot`, as f32.
    fn with_row<R>(&self, value: bool, slot: usize, f: impl FnOnce(&[f32]) -> R) -> R;

    /// The same row written into `dst` (the head size long): no staging buffer between.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn row_into(&self, value: bool, slot: usize, dst: &mut [f32]);

    /// The same row where the in-place kernels can read it, if they can.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn row_ptr(&self, value: bool, slot: usize) -> RowPtr {
        let _ = (value, slot);
        RowPtr::None
    }
}

/// `(stride, offset, len)`: a slot's row is `data[slot · stride + offset ..][..len]`.
pub(super) type RowAt = (usize, usize, usize);

#[inline(always)]
fn row_of<T>(data: &[T], (stride, offset, len): RowAt, slot: usize) -> &[T] {
    &data[slot * stride + offset..][..len]
}

/// A float pool.
pub(super) struct Dense<'a, T> {
    pub(super) k: &'a [T],
    pub(super) v: &'a [T],
    pub(super) at: RowAt,
}

impl<T: KvElem> KvRows for Dense<'_, T> {
    #[inline(always)]
    fn with_row<R>(&self, value: bool, slot: usize, f: impl FnOnce(&[f32]) -> R) -> R {
        T::with_f32(row_of(if value { self.v } else { self.k }, self.at, slot), f)
    }

    #[inline(always)]
    fn row_into(&self, value: bool, slot: usize, dst: &mut [f32]) {
        T::widen_into(row_of(if value { self.v } else { self.k }, self.at, slot), dst)
    }

    #[inline(always)]
    fn row_ptr(&self, value: bool, slot: usize) -> RowPtr {
        T::in_place(row_of(if value { self.v } else { self.k }, self.at, slot))
    }
}

/// A block-quantized pool: packed values and their scales, dequantized per row as read.
pub(super) struct Quantized<'a> {
    pub(super) quant: Quant,
    pub(super) k: &'a [u8],
    pub(super) v: &'a [u8],
    pub(super) kd: &'a [half::f16],
    pub(super) vd: &'a [half::f16],
    pub(super) q: RowAt,
    pub(super) d: RowAt,
    pub(super) hd: usize,
}

impl KvRows for Quantized<'_> {
    #[inline(always)]
    fn with_row<R>(&self, value: bool, slot: usize, f: impl FnOnce(&[f32]) -> R) -> R {
        let (q, d) = if value { (self.v, self.vd) } else { (self.k, self.kd) };
        WIDE.with(|w| {
            let mut w = w.borrow_mut();
            w.resize(self.hd, 0.0);
            dequant_row(self.quant, row_of(q, self.q, slot), row_of(d, self.d, slot), &mut w);
            f(&w)
        })
    }

    #[inline(always)]
    fn row_into(&self, value: bool, slot: usize, dst: &mut [f32]) {
        let (q, d) = if value { (self.v, self.vd) } else { (self.k, self.kd) };
        dequant_row(self.quant, row_of(q, self.q, slot), row_of(d, self.d, slot), dst)
    }
}

/// One KV head of one sequence: position `j`'s rows are read from `rows` at pool slot
/// `slot(j)`, through the sequence's block table.
pub(super) struct KvView<'a, S> {
    pub(super) rows: S,
    pub(super) blocks: &'a [BlockId],
    pub(super) bs: usize,
    pub(super) hd: usize,
}

impl<S> KvView<'_, S> {
    /// Calls `f(j, slot)` for positions `from..to` with their pool slots.
    #[inline(always)]
    pub(super) fn for_rows(&self, from: usize, to: usize, mut f: impl FnMut(usize, usize)) {
        for (bi, &b) in self.blocks.iter().enumerate().skip(from / self.bs) {
            let first = bi * self.bs;
            if first >= to {
                break;
            }
            let base = b as usize * self.bs;
            for o in from.saturating_sub(first)..self.bs.min(to - first) {
                f(first + o, base + o);
            }
        }
    }
}
