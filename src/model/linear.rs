//! A linear layer over dense or GGUF-quantized weights: `y = x Wᵀ + b`.
//!
//! The weight stays in its stored form (dense tensor or `QMatMul` blocks); adapters add their
//! own contribution on top of `forward` later and never touch `w`.

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{Device, Module, Tensor};

use super::kquant::{self, PackedK};
use super::mapped::Mapped;
use super::q8::{self, Packed32};
use super::tiled::PackedMatrix;

use crate::backend::cpu_kernels;
use crate::error::Result;

/// From this many rows on (prefill), a quantized weight is dequantized for the call and
/// multiplied with a dense GEMM: on CPU that beats candle's block-dot kernels several times
/// over at prefill sizes, and the dequantized copy lives only for the call.
const DENSE_PREFILL_ROWS: usize = 32;

/// A dense single-row product (decode) over at least this many weights is split by output
/// rows across the thread pool: candle's GEMV runs on one thread, and decode of a dense model
/// is bound by how fast the weights stream from memory. (Mapped weights split the same way.)
pub(super) const PARALLEL_GEMV_ELEMS: usize = 1 << 20;

/// Output rows per piece of a split single-row product over `out` rows: one piece per thread.
pub(super) fn gemv_chunk_rows(out: usize) -> usize {
    out.div_ceil(rayon::current_num_threads().clamp(1, 16)).max(1)
}

/// `x [1, in] · wᵀ` with `w [out, in]` split into one contiguous row range per thread; each
/// output element is the same dot product as in the unsplit GEMV.
fn parallel_gemv(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    use rayon::prelude::*;
    let out = w.dim(0)?;
    let chunk = gemv_chunk_rows(out);
    let pieces = (0..out.div_ceil(chunk))
        .into_par_iter()
        .map(|i| {
            let start = i * chunk;
            let len = chunk.min(out - start);
            Ok(x.matmul(&w.narrow(0, start, len)?.t()?)?)
        })
        .collect::<Result<Vec<Tensor>>>()?;
    Ok(Tensor::cat(&pieces, 1)?)
}

pub enum Weight {
    /// `[out, in]` in the model dtype.
    Dense(Tensor),
    Quantized(QMatMul),
    /// Q8_0, Q5_0 or Q4_0 on CPU, repacked (losslessly) for our own integer kernel
    /// ([`super::q8`]), which runs every row count with the same arithmetic; the only copy kept.
    Packed32(Packed32),
    /// Q4_K / Q5_K / Q6_K on CPU, repacked (losslessly) for our own integer kernel
    /// ([`super::kquant`]), which runs every row count with the same arithmetic; the only copy.
    KPacked(PackedK),
    /// Dense, read in place from a memory-mapped file ([`super::mapped`]); CPU only.
    Mapped(Mapped),
}

impl Weight {
    /// A block-quantized tensor as the engine runs it: on CPU, types without a SIMD kernel are
    /// repacked ([`super::repack`]) and Q8_0 goes to our own kernel's layout (the `QTensor`
    /// is dropped: weights are stored once); elsewhere candle's `QMatMul`. `q` may be on the
    /// CPU for any device (quantized on load): it is moved to `device` here.
    pub fn from_qtensor(q: QTensor, device: &Device) -> Result<Self> {
        if cpu_kernels(device) {
            if let Some(packed) = super::repack::packed_q8_0(&q)? {
                return Ok(Weight::Packed32(packed));
            }
            let q = super::repack::for_cpu(q, device)?;
            return Ok(if q8::Format::of(q.dtype()).is_some() && q.shape().dims().len() == 2 {
                Weight::Packed32(Packed32::from_qtensor(&q)?)
            } else if kquant::Kind::of(q.dtype()).is_some() && q.shape().dims().len() == 2 {
                Weight::KPacked(PackedK::from_qtensor(&q)?)
            } else {
                Weight::Quantized(QMatMul::from_qtensor(q)?)
            });
        }
        let q = if q.device().same_device(device) {
            q
        } else {
            QTensor::new(QStorage::from_data(q.data()?, device, q.dtype())?, q.shape().clone())?
        };
        Ok(Weight::Quantized(QMatMul::from_qtensor(q)?))
    }

    /// Whether a 2-D matrix of block type `dtype` goes straight into one of our packed
    /// layouts on `device` ([`Self::from_ggml_bytes`]).
    pub fn packs_from_bytes(dtype: GgmlDType, device: &Device) -> bool {
        cpu_kernels(device) && (q8::Format::of(dtype).is_some() || kquant::Kind::of(dtype).is_some())
    }

    /// A `[n, k]` matrix of a type [`Self::packs_from_bytes`] accepts, from its ggml blocks as a
    /// GGUF stores them (row-major): what [`Self::from_qtensor`] makes of the same blocks,
    /// without the `QTensor` copy in between.
    pub fn from_ggml_bytes(dtype: GgmlDType, bytes: &[u8], n: usize, k: usize) -> Result<Self> {
        if let Some(format) = q8::Format::of(dtype) {
            return Ok(Weight::Packed32(Packed32::from_ggml_bytes(format, bytes, n, k)?));
        }
        match kquant::Kind::of(dtype) {
            Some(kind) => Ok(Weight::KPacked(PackedK::from_ggml_bytes(kind, bytes, n, k)?)),
            None => Err(crate::error::EngineError::Internal(format!("no packed layout for {dtype:?}"))),
        }
    }

    /// Bytes the weight occupies (mapped weights: the bytes of the file they read).
    pub fn size_in_bytes(&self) -> usize {
        match self {
            Weight::Dense(w) => w.elem_count() * w.dtype().size_in_bytes(),
            Weight::Quantized(QMatMul::QTensor(q)) => q.storage_size_in_bytes(),
            Weight::Quantized(QMatMul::Tensor(w) | QMatMul::TensorF16(w)) => w.elem_count() * w.dtype().size_in_bytes(),
            Weight::Packed32(p) => p.size_in_bytes(),
            Weight::KPacked(p) => p.size_in_bytes(),
            Weight::Mapped(m) => m.size_in_bytes(),
        }
    }

    /// What the weight runs as: `q8_0`, `q4_k`, … for block formats, `None` when dense.
    pub fn format(&self) -> Option<String> {
        match self {
            Weight::Quantized(QMatMul::QTensor(q)) => Some(super::quantize::format_name(q.dtype())),
            Weight::Packed32(p) => Some(super::quantize::format_name(p.format().dtype())),
            Weight::KPacked(p) => Some(super::quantize::format_name(p.kind().dtype())),
            _ => None,
        }
    }
}

pub struct Linear {
    pub weight: Weight,
    pub bias: Option<Tensor>,
    pub out_features: usize,
    pub in_features: usize,
}

impl Linear {
    /// `x`: `[rows, in]` → `[rows, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.forward_no_bias(x)?;
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }

    /// `x Wᵀ` without the bias.
    pub fn forward_no_bias(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match &self.weight {
            Weight::Dense(w) if x.dim(0)? == 1 && cpu_kernels(x.device()) && w.elem_count() >= PARALLEL_GEMV_ELEMS => {
                parallel_gemv(x, w)?
            }
            Weight::Dense(w) => x.matmul(&w.t()?)?,
            Weight::Quantized(QMatMul::QTensor(q)) if x.dim(0)? >= DENSE_PREFILL_ROWS && cpu_kernels(x.device()) => {
                let w = q.dequantize(x.device())?.to_dtype(x.dtype())?;
                x.matmul(&w.t()?)?
            }
            Weight::Packed32(p) => p.forward(x)?,
            Weight::KPacked(p) => p.forward(x)?,
            Weight::Mapped(m) => m.forward(x)?.to_dtype(x.dtype())?,
            Weight::Quantized(q) => {
                // Quantized kernels take f32 activations; the result is cast back.
                let dt = x.dtype();
                q.forward(&x.to_dtype(candle_core::DType::F32)?)?.to_dtype(dt)?
            }
        })
    }

    /// The weight `[out, in]` in f32, dequantized when stored quantized (adapters that depend
    /// on the base weight, such as DoRA's norms, read it once at load).
    pub fn dequantized_f32(&self) -> Result<Tensor> {
        let f32 = candle_core::DType::F32;
        Ok(match &self.weight {
            Weight::Dense(w) => w.to_dtype(f32)?,
            Weight::Quantized(QMatMul::QTensor(q)) => q.dequantize(&q.device())?.to_dtype(f32)?,
            Weight::Quantized(QMatMul::Tensor(w) | QMatMul::TensorF16(w)) => w.to_dtype(f32)?,
            Weight::Packed32(p) => Tensor::from_vec(p.dequantize(), (p.rows(), p.cols()), &candle_core::Device::Cpu)?,
            Weight::KPacked(p) => Tensor::from_vec(p.dequantize(), (p.rows(), p.cols()), &candle_core::Device::Cpu)?,
            Weight::Mapped(m) => m.to_tensor()?.to_dtype(f32)?,
        })
    }

    /// Rows of the weight as embeddings (tied lm_head / token embeddings share one tensor).
    pub fn embedding(&self, ids: &Tensor) -> Result<Tensor> {
        Ok(match &self.weight {
            Weight::Dense(w) => w.index_select(ids, 0)?,
            Weight::Quantized(q) => q.embedding(ids)?,
            Weight::Packed32(p) => p.embedding(ids)?,
            Weight::KPacked(p) => p.embedding(ids)?,
            Weight::Mapped(m) => m.embedding(ids)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::GgmlDType;
    use candle_core::{DType, Device};

    #[test]
    fn parallel_gemv_equals_the_plain_product() {
        let dev = Device::Cpu;
        // 2051 rows: not a multiple of the thread count; over the threshold so `forward` splits.
        let w = Tensor::randn(0f32, 1.0, (2051, 600), &dev).unwrap();
        let x = Tensor::randn(0f32, 1.0, (1, 600), &dev).unwrap();
        assert!(w.elem_count() >= PARALLEL_GEMV_ELEMS);
        let want: Vec<f32> = x.matmul(&w.t().unwrap()).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let lin = Linear { weight: Weight::Dense(w.clone()), bias: None, out_features: 2051, in_features: 600 };
        for got in [parallel_gemv(&x, &w).unwrap(), lin.forward(&x).unwrap()] {
            assert_eq!(got.dims(), &[1, 2051]);
            let got: Vec<f32> = got.flatten_all().unwrap().to_vec1().unwrap();
            let d = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(d < 1e-4, "max |Δ| {d}");
        }
        // f16 weights take the same path.
        let (w16, x16) = (w.to_dtype(DType::F16).unwrap(), x.to_dtype(DType::F16).unwrap());
        let a = parallel_gemv(&x16, &w16).unwrap().to_dtype(DType::F32).unwrap();
        let b = x16.matmul(&w16.t().unwrap()).unwrap().to_dtype(DType::F32).unwrap();
        let d = (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(d < 0.5, "f16 max |Δ| {d}");
    }

    /// A row multiplied by a K-quant weight gives the same bits alone and among any number of
    /// rows (decode, batches, speculative verification, prefill, prefix-cache hits): the
    /// weights load into our own kernel ([`super::kquant`]), whatever the row count.
    #[test]
    fn k_quant_rows_do_not_depend_on_the_rows_beside_them() {
        use candle_core::quantized::QTensor;
        let dev = Device::Cpu;
        for dtype in [GgmlDType::Q4K, GgmlDType::Q5K, GgmlDType::Q6K] {
            let w = Tensor::randn(0f32, 1.0, (64, 512), &dev).unwrap();
            let q = QTensor::quantize(&w, dtype).unwrap();
            let lin = Linear { weight: Weight::from_qtensor(q, &dev).unwrap(), bias: None, out_features: 64, in_features: 512 };
            assert!(matches!(lin.weight, Weight::KPacked(_)), "{dtype:?}");
            let x = Tensor::randn(0f32, 1.0, (70, 512), &dev).unwrap();
            let all: Vec<Vec<f32>> = lin.forward(&x).unwrap().to_vec2().unwrap();
            for rows in [1, 2, 3, 5, 9, 31, 32, 33, 64] {
                let some: Vec<Vec<f32>> = lin.forward(&x.narrow(0, 0, rows).unwrap()).unwrap().to_vec2().unwrap();
                assert_eq!(some[..], all[..rows], "{dtype:?}, {rows} rows");
            }
            // And close to the dense product (quantization error only).
            let want: Vec<Vec<f32>> = x.matmul(&lin.dequantized_f32().unwrap().t().unwrap()).unwrap().to_vec2().unwrap();
            let d = all.iter().flatten().zip(want.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(d < 1.0, "{dtype:?}: max |Δ| {d} against the dequantized weight");
        }
    }
}
