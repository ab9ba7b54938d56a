//! A linear layer over dense or GGUF-quantized weights: `y = x Wᵀ + b`.
//!
//! The weight stays in its stored form (dense tensor or `QMatMul` blocks); adapters add their
//! own contribution on top of `forward` later and never touch `w`.

use candle_core::quantized::QMatMul;
use candle_core::{Module, Tensor};

use crate::error::Result;

/// From this many rows on (prefill), a quantized weight is dequantized for the call and
/// multiplied with a dense GEMM: on CPU that beats candle's block-dot kernels several times
/// over at prefill sizes, and the dequantized copy lives only for the call.
const DENSE_PREFILL_ROWS: usize = 32;

pub enum Weight {
    /// `[out, in]` in the model dtype.
    Dense(Tensor),
    Quantized(QMatMul),
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
        })
    }

    pub fn is_quantized(&self) -> bool {
        matches!(self.weight, Weight::Quantized(QMatMul::QTensor(_)))
    }
}
