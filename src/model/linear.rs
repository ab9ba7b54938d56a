//! A linear layer over dense or GGUF-quantized weights: `y = x Wᵀ + b`.
//!
//! The weight stays in its stored form (dense tensor or `QMatMul` blocks); adapters add their
//! own contribution on top of `forward` later and never touch `w`.

use candle_core::quantized::QMatMul;
use candle_core::{DType, Module, Tensor};

use super::q8::PackedQ8_0;

use crate::error::Result;

/// From this many rows on (prefill), a quantized weight is dequantized for the call and
/// multiplied with a dense GEMM: on CPU that beats candle's block-dot kernels several times
/// over at prefill sizes, and the dequantized copy lives only for the call.
const DENSE_PREFILL_ROWS: usize = 32;

pub enum Weight {
    /// `[out, in]` in the model dtype.
    Dense(Tensor),
    Quantized(QMatMul),
    /// Q8_0 on CPU, repacked for our own decode kernel ([`super::q8`]); the only copy kept.
    Q8Packed(PackedQ8_0),
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
        let y = match &self.weight {
            Weight::Dense(w) => x.matmul(&w.t()?)?,
            Weight::Quantized(QMatMul::QTensor(q)) if x.dim(0)? >= DENSE_PREFILL_ROWS && x.device().is_cpu() => {
                let w = q.dequantize(x.device())?.to_dtype(x.dtype())?;
                x.matmul(&w.t()?)?
            }
            Weight::Q8Packed(p) if x.dim(0)? >= DENSE_PREFILL_ROWS => {
                let w = Tensor::from_vec(p.dequantize(), (p.rows(), p.cols()), x.device())?.to_dtype(x.dtype())?;
                x.matmul(&w.t()?)?
            }
            Weight::Q8Packed(p) => {
                let dt = x.dtype();
                let rows = x.dim(0)?;
                let xf = x.to_dtype(DType::F32)?.contiguous()?;
                let mut out = vec![0f32; rows * p.rows()];
                {
                    let (storage, layout) = xf.storage_and_layout();
                    let candle_core::Storage::Cpu(cpu) = &*storage else {
                        return Err(crate::error::EngineError::InvalidModel("Q8Packed weight needs a CPU tensor".into()));
                    };
                    let xs = &cpu.as_slice::<f32>()?[layout.start_offset()..][..rows * p.cols()];
                    p.matmul(xs, rows, &mut out);
                }
                Tensor::from_vec(out, (rows, p.rows()), x.device())?.to_dtype(dt)?
            }
            Weight::Quantized(q) => {
                // Quantized kernels take f32 activations; the result is cast back.
                let dt = x.dtype();
                q.forward(&x.to_dtype(candle_core::DType::F32)?)?.to_dtype(dt)?
            }
        };
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }

    /// Rows of the weight as embeddings (tied lm_head / token embeddings share one tensor).
    pub fn embedding(&self, ids: &Tensor) -> Result<Tensor> {
        Ok(match &self.weight {
            Weight::Dense(w) => w.index_select(ids, 0)?,
            Weight::Quantized(q) => q.embedding(ids)?,
            Weight::Q8Packed(p) => {
                let ids_v: Vec<u32> = ids.flatten_all()?.to_dtype(DType::U32)?.to_vec1()?;
                let k = p.cols();
                let mut out = vec![0f32; ids_v.len() * k];
                for (&id, row) in ids_v.iter().zip(out.chunks_exact_mut(k)) {
                    if id as usize >= p.rows() {
                        return Err(crate::error::EngineError::InvalidArgument(format!(
                            "token id {id} out of range for an embedding of {} rows",
                            p.rows()
                        )));
                    }
                    p.dequantize_row(id as usize, row);
                }
                let mut dims = ids.dims().to_vec();
                dims.push(k);
                Tensor::from_vec(out, dims, ids.device())?
            }
        })
    }

    pub fn is_quantized(&self) -> bool {
        matches!(self.weight, Weight::Quantized(QMatMul::QTensor(_)) | Weight::Q8Packed(_))
    }
}
