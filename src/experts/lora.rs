//! LoRA and rsLoRA: `y += s · B (A x)` with `A [r, in]`, `B [out, r]`, both as PEFT stores
//! them.
//!
//! - **Zero-copy.** On a CPU f32 model, f32 factors are read in place from the adapter file's
//!   memory map ([`Factor::Mapped`]): attaching an adapter parses its header and nothing else,
//!   and the pages are shared with the page cache. Other dtypes, devices and permuted rows
//!   (GGUF Llama q/k) hold converted tensors ([`Factor::Tensor`]).
//! - **Decode rows** on CPU/f32 run a fused kernel over every active LoRA of the module (one
//!   output buffer, one tensor add): `t = s · A x`, then each output is a dot of `t` with its
//!   row of `B` (8 rows at a time, [`simd::dots_add_at`]). Prefill rows and other devices use
//!   two matmuls per adapter (through `gemm` in place for mapped factors).

use candle_core::{DType, Tensor};

use crate::backend::cpu_kernels;
use crate::error::{EngineError, Result};
use crate::model::mapped::{matmul_t_add, Mapped};
use crate::simd;

/// Up to this many rows, the fused CPU kernel; from here on (prefill), matmuls. Below ~16
/// rows candle's per-op overhead (four ops per adapter and module) costs more than the
/// kernel's arithmetic, whose `B` re-reads per row stay in cache.
const KERNEL_MAX_ROWS: usize = 16;
/// `A x` is split across the thread pool from this many multiply-adds on.
const PARALLEL_AX_MACS: usize = 1 << 14;
/// Outputs per parallel chunk of the kernel's second phase.
const KERNEL_CHUNK: usize = 512;

/// A LoRA matrix: a tensor on the model's device, or f32 read in place from the file.
pub enum Factor {
    Tensor(Tensor),
    Mapped(Mapped),
}

impl Factor {
    pub fn dims2(&self) -> Result<(usize, usize)> {
        Ok(match self {
            Self::Tensor(t) => t.dims2()?,
            Self::Mapped(m) => m.dims(),
        })
    }

    pub fn dtype(&self) -> DType {
        match self {
            Self::Tensor(t) => t.dtype(),
            Self::Mapped(m) => m.dtype(),
        }
    }

    pub fn bytes(&self) -> usize {
        match self {
            Self::Tensor(t) => t.elem_count() * t.dtype().size_in_bytes(),
            Self::Mapped(m) => m.size_in_bytes(),
        }
    }

    /// Whether the values live in the adapter file's map.
    pub fn is_mapped(&self) -> bool {
        matches!(self, Self::Mapped(_))
    }

    /// The matrix as a tensor (a copy for a mapped one), `[rows, cols]`.
    pub fn to_tensor(&self) -> Result<Tensor> {
        match self {
            Self::Tensor(t) => Ok(t.clone()),
            Self::Mapped(m) => m.to_tensor(),
        }
    }

    /// `x · selfᵀ`: `[rows, self.rows]`.
    fn matmul_t(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Tensor(t) => Ok(x.matmul(&t.t()?)?),
            Self::Mapped(m) => m.forward(x),
        }
    }

    /// Borrows the elements of a CPU f32 matrix.
    fn with_f32<R>(&self, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
        match self {
            Self::Tensor(t) => with_slice(t, f),
            Self::Mapped(m) => Ok(f(m.f32s()?)),
        }
    }

    /// The tensor to move to another device (none for a mapped matrix, which is CPU-only).
    pub fn tensor_mut(&mut self) -> Option<&mut Tensor> {
        match self {
            Self::Tensor(t) => Some(t),
            Self::Mapped(_) => None,
        }
    }
}

pub struct LowRank {
    /// `[r, in]`.
    pub a: Factor,
    /// `[out, r]`.
    pub b: Factor,
    /// `α / r`, or `α / √r` for rsLoRA (times the user's scale).
    pub scale: f64,
}

impl LowRank {
    /// From PEFT's `A [r, in]` and `B [out, r]`.
    pub fn new(a: Factor, b: Factor, scale: f64) -> Self {
        Self { a, b, scale }
    }

    pub fn rank(&self) -> usize {
        self.a.dims2().map_or(0, |d| d.0)
    }

    /// `B (A x)` without the scale: `[rows, out]`.
    pub fn unscaled(&self, x: &Tensor) -> Result<Tensor> {
        self.b.matmul_t(&self.a.matmul_t(x)?)
    }

    pub fn bytes(&self) -> usize {
        self.a.bytes() + self.b.bytes()
    }

    fn is_cpu_f32(&self) -> bool {
        let cpu = |f: &Factor| match f {
            Factor::Tensor(t) => t.device().is_cpu() && t.dtype() == DType::F32,
            Factor::Mapped(m) => m.dtype() == DType::F32,
        };
        cpu(&self.a) && cpu(&self.b)
    }
}

/// `y + Σ s_i B_i (A_i x)` over `adapters`.
pub fn add_deltas(y: Tensor, x: &Tensor, adapters: &[&LowRank]) -> Result<Tensor> {
    if cpu_kernels(x.device()) && x.dtype() == DType::F32 && y.dtype() == DType::F32 && adapters.iter().all(|l| l.is_cpu_f32()) {
        return add_deltas_cpu(&y, x, adapters, simd::level());
    }
    let mut y = y;
    for l in adapters {
        y = (y + (l.unscaled(x)? * l.scale)?)?;
    }
    Ok(y)
}

/// [`add_deltas`] on CPU f32: one copy of `y`, every adapter's delta added into it (decode
/// rows by the fused kernel, prefill rows by `gemm` accumulating in place), one new tensor.
/// Allocating a delta per adapter and adding tensors cost more than the low-rank products on
/// a 512-token prefill (a fresh `[512, 3072]` f32 buffer is 6 MB of page faults).
fn add_deltas_cpu(y: &Tensor, x: &Tensor, adapters: &[&LowRank], level: simd::Level) -> Result<Tensor> {
    let x = x.contiguous()?;
    let (rows, inp) = x.dims2()?;
    let (y_rows, out) = y.dims2()?;
    let mut acc: Vec<f32> = y.flatten_all()?.to_vec1()?;
    if y_rows != rows
        || adapters
            .iter()
            .any(|l| !matches!((l.a.dims2(), l.b.dims2()), (Ok((r, i)), Ok((o, r2))) if i == inp && o == out && r2 == r))
    {
        return Err(EngineError::Internal(format!("LoRA factors that do not fit a [{rows}, {inp}] -> [{y_rows}, {out}] module")));
    }
    with_slice(&x, |xs| -> Result<()> {
        for l in adapters {
            l.a.with_f32(|a| {
                l.b.with_f32(|b| {
                    if rows <= KERNEL_MAX_ROWS {
                        fused_rows(xs, a, b, l.rank(), l.scale as f32, &mut acc, level);
                    } else {
                        let r = l.rank();
                        let mut t = vec![0f32; rows * r];
                        matmul_t_add(xs, rows, a, r, inp, &mut t, 1.0);
                        matmul_t_add(&t, rows, b, out, r, &mut acc, l.scale as f32);
                    }
                })
            })??;
        }
        Ok(())
    })??;
    Ok(Tensor::from_vec(acc, (rows, out), x.device())?)
}

/// Borrows a contiguous CPU f32 tensor's elements.
fn with_slice<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*storage else {
        return Err(EngineError::Internal("the LoRA kernel needs CPU tensors".into()));
    };
    let all = cpu.as_slice::<f32>()?;
    let (start, end) =
        layout.contiguous_offsets().ok_or_else(|| EngineError::Internal("the LoRA kernel needs contiguous tensors".into()))?;
    Ok(f(&all[start..end]))
}

/// The fused decode kernel: `acc[row] += B (s · A x[row])` for `x` rows of `A`'s width.
fn fused_rows(xs: &[f32], a: &[f32], b: &[f32], r: usize, scale: f32, acc: &mut [f32], level: simd::Level) {
    use rayon::prelude::*;
    let inp = a.len() / r;
    let out = b.len() / r;
    let rows = xs.len() / inp;
    // 1. t = s · A x for every row: [rows, r].
    let mut t = vec![0f32; rows * r];
    let ax = |(i, tj): (usize, &mut f32)| {
        let (row, j) = (i / r, i % r);
        *tj = simd::dot_at(level, &a[j * inp..(j + 1) * inp], &xs[row * inp..(row + 1) * inp]) * scale;
    };
    if rows * r * inp >= PARALLEL_AX_MACS {
        t.par_iter_mut().enumerate().for_each(ax);
    } else {
        t.iter_mut().enumerate().for_each(ax);
    }
    // 2. acc[row, o] += t[row] · B[o], split by output chunks: each chunk of B is read from
    //    memory once and stays in cache for every row.
    let mut chunks: Vec<Vec<&mut [f32]>> = (0..out.div_ceil(KERNEL_CHUNK)).map(|_| Vec::with_capacity(rows)).collect();
    for yr in acc.chunks_exact_mut(out) {
        for (c, yc) in yr.chunks_mut(KERNEL_CHUNK).enumerate() {
            chunks[c].push(yc);
        }
    }
    chunks.par_iter_mut().enumerate().for_each(|(c, ys)| {
        for (row, yc) in ys.iter_mut().enumerate() {
            simd::dots_add_at(level, &t[row * r..(row + 1) * r], &b[c * KERNEL_CHUNK * r..][..yc.len() * r], yc);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn fused_kernel_equals_the_matmul_path() {
        let dev = Device::Cpu;
        let lr = |r: usize, seed: f64| {
            let a = (Tensor::randn(0f32, 1.0, (r, 300), &dev).unwrap() * seed).unwrap();
            let b = Tensor::randn(0f32, 1.0, (1100, r), &dev).unwrap();
            LowRank::new(Factor::Tensor(a), Factor::Tensor(b), 0.5 * seed)
        };
        let (l1, l2) = (lr(4, 1.0), lr(16, 0.3));
        // Decode rows (the fused kernel) and prefill rows (gemm accumulating in place).
        for rows in [1, 3, 9, 16, 17, 40] {
            let x = Tensor::randn(0f32, 1.0, (rows, 300), &dev).unwrap();
            let y = Tensor::randn(0f32, 1.0, (rows, 1100), &dev).unwrap();
            let want =
                ((&y + (l1.unscaled(&x).unwrap() * 0.5).unwrap()).unwrap() + (l2.unscaled(&x).unwrap() * 0.15).unwrap()).unwrap();
            // Each kernel path this CPU has, and they agree bit for bit (same summation order).
            let outs: Vec<Vec<f32>> = crate::simd::levels()
                .into_iter()
                .map(|l| add_deltas_cpu(&y, &x, &[&l1, &l2], l).unwrap().flatten_all().unwrap().to_vec1().unwrap())
                .collect();
            for (l, got) in crate::simd::levels().into_iter().zip(&outs) {
                let got = Tensor::from_slice(got, (rows, 1100), &dev).unwrap();
                let d = (got - &want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
                assert!(d < 1e-4, "{l:?} rows {rows}: max |Δ| {d}");
            }
            if rows <= KERNEL_MAX_ROWS {
                for (l, got) in crate::simd::levels().into_iter().zip(&outs) {
                    assert_eq!(got, &outs[0], "{l:?} differs from the portable path");
                }
            }
            let got: Vec<f32> = add_deltas(y.clone(), &x, &[&l1, &l2]).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            assert_eq!(got, outs[outs.len() - 1]);
        }
    }

    #[test]
    fn factors_that_do_not_fit_are_an_error_not_a_panic() {
        let dev = Device::Cpu;
        let a = Tensor::zeros((4, 300), DType::F32, &dev).unwrap();
        let b = Tensor::zeros((1100, 4), DType::F32, &dev).unwrap();
        let l = LowRank::new(Factor::Tensor(a), Factor::Tensor(b), 1.0);
        let x = Tensor::zeros((2, 299), DType::F32, &dev).unwrap();
        let y = Tensor::zeros((2, 1100), DType::F32, &dev).unwrap();
        assert_eq!(add_deltas(y, &x, &[&l]).unwrap_err().code(), "INTERNAL");
    }
}

#[cfg(test)]
mod mapped_tests {
    use super::*;
    use candle_core::Device;
    use std::sync::Arc;

    /// `t`'s f32 values behind `pad` bytes in a read-only anonymous map, as a mapped factor.
    fn mapped(t: &Tensor, pad: usize) -> Factor {
        let (n, k) = t.dims2().unwrap();
        let values: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        let mut map = memmap2::MmapMut::map_anon(pad + 4 * values.len()).unwrap();
        for (i, v) in values.iter().enumerate() {
            map[pad + 4 * i..pad + 4 * i + 4].copy_from_slice(&v.to_le_bytes());
        }
        let map = Arc::new(map.make_read_only().unwrap());
        Factor::Mapped(Mapped::new(map, pad, n, k, DType::F32).unwrap())
    }

    #[test]
    fn factors_read_in_place_give_the_bits_of_resident_ones() {
        let dev = Device::Cpu;
        let a = Tensor::randn(0f32, 1.0, (16, 300), &dev).unwrap();
        let b = Tensor::randn(0f32, 1.0, (1100, 16), &dev).unwrap();
        let resident = LowRank::new(Factor::Tensor(a.clone()), Factor::Tensor(b.clone()), 0.25);
        let in_place = LowRank::new(mapped(&a, 64), mapped(&b, 4 * 16 * 300 + 128), 0.25);
        assert!(in_place.a.is_mapped() && in_place.b.is_mapped());
        assert_eq!(in_place.bytes(), resident.bytes());
        // Decode rows (the fused kernel) and prefill rows (matmuls through gemm in place).
        for rows in [1, 5, 16, 17, 40] {
            let x = Tensor::randn(0f32, 1.0, (rows, 300), &dev).unwrap();
            let y = Tensor::randn(0f32, 1.0, (rows, 1100), &dev).unwrap();
            let want: Vec<f32> = add_deltas(y.clone(), &x, &[&resident]).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let got: Vec<f32> = add_deltas(y.clone(), &x, &[&in_place]).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            if rows <= KERNEL_MAX_ROWS {
                assert_eq!(got, want, "rows {rows}");
            } else {
                let d = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0f32, f32::max);
                assert!(d < 1e-4, "rows {rows}: max |Δ| {d}");
            }
        }
    }
}
