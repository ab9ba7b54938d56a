//! LoRA and rsLoRA: `y += s · B (A x)` with `A [r, in]`, `B [out, r]`.
//!
//! `B` is kept transposed (`Bᵀ [r, out]`) so the second product is `r` contiguous AXPYs over
//! the output, which vectorise well. Decode rows on CPU/f32 run a fused kernel over every
//! active LoRA of the module (one output buffer, one tensor add); other shapes and devices use
//! two matmuls per adapter.

use candle_core::{DType, Tensor};

use crate::backend::cpu_kernels;
use crate::error::{EngineError, Result};
use crate::simd;

/// Up to this many rows, the fused CPU kernel; from here on (prefill), matmuls. Below ~16
/// rows candle's per-op overhead (four ops per adapter and module) costs more than the
/// kernel's arithmetic, whose `Bᵀ` re-reads per row stay in cache.
const KERNEL_MAX_ROWS: usize = 16;
/// `A x` is split across the thread pool from this many multiply-adds on.
const PARALLEL_AX_MACS: usize = 1 << 14;
/// Outputs per parallel chunk of the kernel's AXPY phase.
const KERNEL_CHUNK: usize = 512;

pub struct LowRank {
    /// `[r, in]`.
    pub a: Tensor,
    /// `Bᵀ`: `[r, out]`.
    pub bt: Tensor,
    /// `α / r`, or `α / √r` for rsLoRA (times the user's scale).
    pub scale: f64,
}

impl LowRank {
    /// From PEFT's `A [r, in]` and the transpose of its `B [out, r]`, both contiguous.
    pub fn new(a: Tensor, bt: Tensor, scale: f64) -> Self {
        Self { a, bt, scale }
    }

    pub fn rank(&self) -> usize {
        self.a.dim(0).unwrap_or(0)
    }

    /// `B (A x)` without the scale: `[rows, out]`.
    pub fn unscaled(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.matmul(&self.a.t()?)?.matmul(&self.bt)?)
    }

    pub fn bytes(&self) -> usize {
        (self.a.elem_count() + self.bt.elem_count()) * self.a.dtype().size_in_bytes()
    }
}

/// `y + Σ s_i B_i (A_i x)` over `adapters`.
pub fn add_deltas(y: Tensor, x: &Tensor, adapters: &[&LowRank]) -> Result<Tensor> {
    let rows = x.dim(0)?;
    if rows <= KERNEL_MAX_ROWS
        && cpu_kernels(x.device())
        && x.dtype() == DType::F32
        && adapters.iter().all(|l| l.a.dtype() == DType::F32)
    {
        let delta = fused_cpu(x, adapters, simd::level())?;
        return Ok((y + delta)?);
    }
    let mut y = y;
    for l in adapters {
        y = (y + (l.unscaled(x)? * l.scale)?)?;
    }
    Ok(y)
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

fn fused_cpu(x: &Tensor, adapters: &[&LowRank], level: simd::Level) -> Result<Tensor> {
    use rayon::prelude::*;
    let x = x.contiguous()?;
    let (rows, inp) = x.dims2()?;
    let out = adapters[0].bt.dim(1)?;
    let mut y = vec![0f32; rows * out];
    with_slice(&x, |xs| -> Result<()> {
        for l in adapters {
            let r = l.rank();
            with_slice(&l.a, |a| {
                with_slice(&l.bt, |bt| {
                    // 1. t = s · A x for every row: [rows, r].
                    let mut t = vec![0f32; rows * r];
                    let ax = |(i, tj): (usize, &mut f32)| {
                        let (row, j) = (i / r, i % r);
                        *tj = simd::dot_at(level, &a[j * inp..(j + 1) * inp], &xs[row * inp..(row + 1) * inp]) * l.scale as f32;
                    };
                    if rows * r * inp >= PARALLEL_AX_MACS {
                        t.par_iter_mut().enumerate().for_each(ax);
                    } else {
                        t.iter_mut().enumerate().for_each(ax);
                    }
                    // 2. y[row] += Σ_j t[row, j] · Bᵀ[j], split by output chunks.
                    for (row, yr) in y.chunks_exact_mut(out).enumerate() {
                        let tr = &t[row * r..(row + 1) * r];
                        yr.par_chunks_mut(KERNEL_CHUNK).enumerate().for_each(|(c, yc)| {
                            let o0 = c * KERNEL_CHUNK;
                            for (j, &tj) in tr.iter().enumerate() {
                                simd::axpy_at(level, tj, &bt[j * out + o0..j * out + o0 + yc.len()], yc);
                            }
                        });
                    }
                })
            })??;
        }
        Ok(())
    })??;
    Ok(Tensor::from_vec(y, (rows, out), x.device())?)
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
            LowRank::new(a, b.t().unwrap().contiguous().unwrap(), 0.5 * seed)
        };
        let (l1, l2) = (lr(4, 1.0), lr(16, 0.3));
        for rows in [1, 3, 9] {
            let x = Tensor::randn(0f32, 1.0, (rows, 300), &dev).unwrap();
            let y = Tensor::randn(0f32, 1.0, (rows, 1100), &dev).unwrap();
            let want =
                ((&y + (l1.unscaled(&x).unwrap() * 0.5).unwrap()).unwrap() + (l2.unscaled(&x).unwrap() * 0.15).unwrap()).unwrap();
            let got = add_deltas(y.clone(), &x, &[&l1, &l2]).unwrap();
            let d = (got - &want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(d < 1e-4, "rows {rows}: max |Δ| {d}");
            // Each kernel path this CPU has, and they agree bit for bit (same summation order).
            let deltas: Vec<Vec<f32>> = crate::simd::levels()
                .into_iter()
                .map(|l| fused_cpu(&x, &[&l1, &l2], l).unwrap().flatten_all().unwrap().to_vec1().unwrap())
                .collect();
            for (l, delta) in crate::simd::levels().into_iter().zip(&deltas) {
                let got = (&y + Tensor::from_slice(delta, (rows, 1100), &dev).unwrap()).unwrap();
                let d = (got - &want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
                assert!(d < 1e-4, "{l:?} rows {rows}: max |Δ| {d}");
                assert_eq!(delta, &deltas[0], "{l:?} differs from the portable path");
            }
        }
    }
}
