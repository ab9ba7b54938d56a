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
use half::f16;

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

/// A LoRA matrix: a tensor on the model's device, or f32 / f16 read in place from the file.
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

    pub fn bytes(&self) -> usize {
        match self {
            Self::Tensor(t) => t.elem_count() * t.dtype().size_in_bytes(),
            Self::Mapped(m) => m.size_in_bytes(),
        }
    }

    /// Bytes read in place from the adapter file's map (0 for a tensor).
    pub fn mapped_bytes(&self) -> usize {
        match self {
            Self::Tensor(_) => 0,
            Self::Mapped(m) => m.size_in_bytes(),
        }
    }

    /// The matrix as a tensor (a copy for a mapped one), `[rows, cols]`.
    pub fn to_tensor(&self) -> Result<Tensor> {
        match self {
            Self::Tensor(t) => Ok(t.clone()),
            Self::Mapped(m) => m.to_tensor(),
        }
    }

    /// `x · selfᵀ`: `[rows, self.rows]`, in `x`'s dtype.
    fn matmul_t(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Tensor(t) => Ok(x.matmul(&t.t()?)?),
            Self::Mapped(m) if m.dtype() == x.dtype() => m.forward(x),
            // A half-precision factor under f32 activations: widened for this product (the
            // CPU kernels widen as they read instead; this path serves other shapes only).
            Self::Mapped(m) => Ok(x.matmul(&m.to_tensor()?.to_dtype(x.dtype())?.t()?)?),
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

    /// `s · B (A x)`: `[rows, out]`, through the CPU kernels where they apply.
    pub fn delta(&self, x: &Tensor) -> Result<Tensor> {
        if cpu_kernels(x.device()) && x.dtype() == DType::F32 && self.on_cpu_kernels() {
            let out = self.b.dims2()?.0;
            return add_deltas_cpu(vec![0f32; x.dim(0)? * out], out, x, &[self], simd::level());
        }
        Ok((self.unscaled(x)? * self.scale)?)
    }

    pub fn bytes(&self) -> usize {
        self.a.bytes() + self.b.bytes()
    }

    /// Of [`Self::bytes`], those read in place from the adapter file.
    pub fn mapped_bytes(&self) -> usize {
        self.a.mapped_bytes() + self.b.mapped_bytes()
    }

    /// Whether the CPU kernels read both factors (CPU f32 tensors, or mapped f32 / f16).
    fn on_cpu_kernels(&self) -> bool {
        let cpu = |f: &Factor| match f {
            Factor::Tensor(t) => t.device().is_cpu() && t.dtype() == DType::F32,
            Factor::Mapped(m) => matches!(m.dtype(), DType::F32 | DType::F16),
        };
        cpu(&self.a) && cpu(&self.b)
    }
}

/// A factor's elements as the CPU kernels read them. f16 is widened to f32 as it is read,
/// exactly, so a half-precision adapter read in place computes what its f32 copy would.
#[derive(Clone, Copy)]
enum Elems<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

impl<'a> Elems<'a> {
    /// Elements `range` as f32: borrowed, or widened into `scratch`.
    fn f32s<'s>(self, range: std::ops::Range<usize>, scratch: &'s mut Vec<f32>) -> &'s [f32]
    where
        'a: 's,
    {
        match self {
            Self::F32(v) => &v[range],
            Self::F16(v) => {
                use half::slice::HalfFloatSliceExt;
                scratch.resize(range.len(), 0.0);
                v[range].convert_to_f32_slice(scratch);
                scratch
            }
        }
    }

    fn len(self) -> usize {
        match self {
            Self::F32(v) => v.len(),
            Self::F16(v) => v.len(),
        }
    }
}

/// `y + Σ s_i B_i (A_i x)` over `adapters`.
pub fn add_deltas(y: Tensor, x: &Tensor, adapters: &[&LowRank]) -> Result<Tensor> {
    if cpu_kernels(x.device())
        && x.dtype() == DType::F32
        && y.dtype() == DType::F32
        && adapters.iter().all(|l| l.on_cpu_kernels())
    {
        return add_deltas_cpu(y.flatten_all()?.to_vec1()?, y.dim(1)?, x, adapters, simd::level());
    }
    let mut y = y;
    for l in adapters {
        y = (y + (l.unscaled(x)? * l.scale)?)?;
    }
    Ok(y)
}

/// [`add_deltas`] on CPU f32: every adapter's delta added into `acc` (`[rows, out]`, a copy
/// of `y`; decode rows by the fused kernel, prefill rows by `gemm` accumulating in place), one
/// new tensor. Allocating a delta per adapter and adding tensors cost more than the low-rank
/// products on a 512-token prefill (a fresh `[512, 3072]` f32 buffer is 6 MB of page faults).
fn add_deltas_cpu(mut acc: Vec<f32>, out: usize, x: &Tensor, adapters: &[&LowRank], level: simd::Level) -> Result<Tensor> {
    let x = x.contiguous()?;
    let (rows, inp) = x.dims2()?;
    if acc.len() != rows * out
        || adapters
            .iter()
            .any(|l| !matches!((l.a.dims2(), l.b.dims2()), (Ok((r, i)), Ok((o, r2))) if i == inp && o == out && r2 == r))
    {
        return Err(EngineError::Internal(format!(
            "LoRA factors that do not fit a [{rows}, {inp}] -> {} outputs of {out} module",
            acc.len()
        )));
    }
    let factors: Vec<&Factor> = adapters.iter().flat_map(|l| [&l.a, &l.b]).collect();
    with_slice(&x, |xs| {
        with_all_elems(&factors, |elems| {
            let loras: Vec<KernelLora> = adapters
                .iter()
                .zip(elems.chunks_exact(2))
                .map(|(l, ab)| KernelLora { a: ab[0], b: ab[1], r: l.rank(), scale: l.scale as f32 })
                .collect();
            if rows <= KERNEL_MAX_ROWS {
                fused_rows(xs, inp, &loras, &mut acc, out, level);
                return;
            }
            let (mut sa, mut sb) = (Vec::new(), Vec::new());
            for l in &loras {
                let (a, b) = (l.a.f32s(0..l.a.len(), &mut sa), l.b.f32s(0..l.b.len(), &mut sb));
                let mut t = vec![0f32; rows * l.r];
                matmul_t_add(xs, rows, a, l.r, inp, &mut t, 1.0);
                matmul_t_add(&t, rows, b, out, l.r, &mut acc, l.scale);
            }
        })
    })??;
    Ok(Tensor::from_vec(acc, (rows, out), x.device())?)
}

/// Borrows a contiguous CPU f32 tensor's elements.
fn with_slice<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    Ok(f(cpu_f32(&storage, layout)?))
}

/// The elements of a contiguous CPU f32 tensor, from its storage and layout.
fn cpu_f32<'a>(storage: &'a candle_core::Storage, layout: &candle_core::Layout) -> Result<&'a [f32]> {
    let candle_core::Storage::Cpu(cpu) = storage else {
        return Err(EngineError::Internal("the LoRA kernel needs CPU tensors".into()));
    };
    let (start, end) =
        layout.contiguous_offsets().ok_or_else(|| EngineError::Internal("the LoRA kernel needs contiguous tensors".into()))?;
    Ok(&cpu.as_slice::<f32>()?[start..end])
}

/// Borrows the elements of every factor (CPU f32 tensors, mapped f32 / f16 matrices) for `f`.
fn with_all_elems<R>(factors: &[&Factor], f: impl FnOnce(&[Elems]) -> R) -> Result<R> {
    // The storage of tensor factors stays locked for reading while `f` runs.
    let held: Vec<_> = factors
        .iter()
        .map(|fa| match fa {
            Factor::Tensor(t) => Some(t.storage_and_layout()),
            Factor::Mapped(_) => None,
        })
        .collect();
    let mut elems = Vec::with_capacity(factors.len());
    for (fa, h) in factors.iter().zip(&held) {
        elems.push(match (fa, h) {
            (Factor::Mapped(m), _) if m.dtype() == DType::F16 => Elems::F16(m.values()?),
            (Factor::Mapped(m), _) => Elems::F32(m.values()?),
            (Factor::Tensor(_), Some((storage, layout))) => Elems::F32(cpu_f32(storage, layout)?),
            (Factor::Tensor(_), None) => unreachable!("held above"),
        });
    }
    Ok(f(&elems))
}

/// One adapter as the fused kernel reads it: `A`, `B`, rank and scale.
struct KernelLora<'a> {
    a: Elems<'a>,
    b: Elems<'a>,
    r: usize,
    scale: f32,
}

/// The fused decode kernel: `acc[row] += Σ_i B_i (s_i · A_i x[row])` over the adapters, for
/// `x` rows of the module's input width. Two parallel phases for all adapters together (a
/// fork-join costs about what one adapter's arithmetic does on a decode row); each element
/// of `acc` adds the adapters' terms in their order, as one adapter at a time would.
fn fused_rows(xs: &[f32], inp: usize, loras: &[KernelLora], acc: &mut [f32], out: usize, level: simd::Level) {
    use rayon::prelude::*;
    let rows = xs.len() / inp;
    if rows == 0 || loras.is_empty() {
        return;
    }
    // 1. t_i = s_i · A_i x for every row: [rows, r_i], one dot per element, all adapters'
    //    elements in one parallel loop.
    let offsets: Vec<usize> = loras
        .iter()
        .scan(0, |o, l| {
            let at = *o;
            *o += rows * l.r;
            Some(at)
        })
        .collect();
    let mut t_all = vec![0f32; loras.iter().map(|l| rows * l.r).sum()];
    let element = |scratch: &mut Vec<f32>, (e, tj): (usize, &mut f32)| {
        let i = offsets.partition_point(|&o| o <= e) - 1;
        let l = &loras[i];
        let (row, j) = ((e - offsets[i]) / l.r, (e - offsets[i]) % l.r);
        let aj = l.a.f32s(j * inp..(j + 1) * inp, scratch);
        *tj = simd::dot_at(level, aj, &xs[row * inp..(row + 1) * inp]) * l.scale;
    };
    if t_all.len() * inp >= PARALLEL_AX_MACS {
        t_all.par_iter_mut().enumerate().for_each_init(Vec::new, element);
    } else {
        let mut scratch = Vec::new();
        t_all.iter_mut().enumerate().for_each(|e| element(&mut scratch, e));
    }
    let ts: Vec<&[f32]> = loras.iter().zip(&offsets).map(|(l, &o)| &t_all[o..o + rows * l.r]).collect();
    // 2. acc[row, o] += t_i[row] · B_i[o], split by output chunks: each chunk of each B is read
    //    from memory (and widened) once and stays in cache for every row.
    let mut chunks: Vec<Vec<&mut [f32]>> = (0..out.div_ceil(KERNEL_CHUNK)).map(|_| Vec::with_capacity(rows)).collect();
    for yr in acc.chunks_exact_mut(out) {
        for (c, yc) in yr.chunks_mut(KERNEL_CHUNK).enumerate() {
            chunks[c].push(yc);
        }
    }
    chunks.par_iter_mut().enumerate().for_each_init(Vec::new, |scratch, (c, ys)| {
        let (o0, len) = (c * KERNEL_CHUNK, ys[0].len());
        for (l, t) in loras.iter().zip(&ts) {
            let bc = l.b.f32s(o0 * l.r..(o0 + len) * l.r, scratch);
            for (row, yc) in ys.iter_mut().enumerate() {
                simd::dots_add_at(level, &t[row * l.r..(row + 1) * l.r], bc, yc);
            }
        }
    });
}

/// [`add_deltas_cpu`] on `y`'s values, for tests.
#[cfg(test)]
fn on_cpu(y: &Tensor, x: &Tensor, adapters: &[&LowRank], level: simd::Level) -> Result<Tensor> {
    add_deltas_cpu(y.flatten_all()?.to_vec1()?, y.dim(1)?, x, adapters, level)
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
                .map(|l| on_cpu(&y, &x, &[&l1, &l2], l).unwrap().flatten_all().unwrap().to_vec1().unwrap())
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

    /// `t`'s values rounded to f16, behind `pad` bytes in a read-only anonymous map.
    fn mapped_f16(t: &Tensor, pad: usize) -> Factor {
        let (n, k) = t.dims2().unwrap();
        let values: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        let mut map = memmap2::MmapMut::map_anon(pad + 2 * values.len()).unwrap();
        for (i, v) in values.iter().enumerate() {
            map[pad + 2 * i..pad + 2 * i + 2].copy_from_slice(&f16::from_f32(*v).to_le_bytes());
        }
        let map = Arc::new(map.make_read_only().unwrap());
        Factor::Mapped(Mapped::new(map, pad, n, k, DType::F16).unwrap())
    }

    #[test]
    fn half_precision_factors_read_in_place_give_the_bits_of_their_f32_copy() {
        let dev = Device::Cpu;
        let round = |t: Tensor| t.to_dtype(DType::F16).unwrap().to_dtype(DType::F32).unwrap();
        let a = round(Tensor::randn(0f32, 1.0, (8, 300), &dev).unwrap());
        let b = round(Tensor::randn(0f32, 1.0, (1100, 8), &dev).unwrap());
        let resident = LowRank::new(Factor::Tensor(a.clone()), Factor::Tensor(b.clone()), 0.5);
        let in_place = LowRank::new(mapped_f16(&a, 2), mapped_f16(&b, 2 * 8 * 300 + 6), 0.5);
        assert_eq!(in_place.bytes() * 2, resident.bytes());
        for rows in [1, 4, 16, 17, 33] {
            let x = Tensor::randn(0f32, 1.0, (rows, 300), &dev).unwrap();
            let y = Tensor::randn(0f32, 1.0, (rows, 1100), &dev).unwrap();
            for level in crate::simd::levels() {
                let want: Vec<f32> = on_cpu(&y, &x, &[&resident], level).unwrap().flatten_all().unwrap().to_vec1().unwrap();
                let got: Vec<f32> = on_cpu(&y, &x, &[&in_place], level).unwrap().flatten_all().unwrap().to_vec1().unwrap();
                assert_eq!(got, want, "{level:?} rows {rows}");
            }
            // The delta alone (DoRA's path) and the matmul path agree with the kernel.
            let d: Vec<f32> = in_place.delta(&x).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let m: Vec<f32> = (in_place.unscaled(&x).unwrap() * 0.5).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let diff = d.iter().zip(&m).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max);
            assert!(diff < 1e-3, "rows {rows}: {diff}");
        }
    }

    #[test]
    fn factors_read_in_place_give_the_bits_of_resident_ones() {
        let dev = Device::Cpu;
        let a = Tensor::randn(0f32, 1.0, (16, 300), &dev).unwrap();
        let b = Tensor::randn(0f32, 1.0, (1100, 16), &dev).unwrap();
        let resident = LowRank::new(Factor::Tensor(a.clone()), Factor::Tensor(b.clone()), 0.25);
        let in_place = LowRank::new(mapped(&a, 64), mapped(&b, 4 * 16 * 300 + 128), 0.25);
        assert_eq!(in_place.mapped_bytes(), in_place.bytes());
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
