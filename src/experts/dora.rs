//! DoRA: LoRA plus a learned magnitude per output row. PEFT computes
//! `y = m / ‖W + sBA‖ ⊙ (W x + s B A x) + b`, the norm taken over each row of the updated
//! weight and treated as a constant. The norm depends only on weights, so it is computed once
//! at load; the forward pass adds `(g − 1) ⊙ W x + g ⊙ s B A x` with `g = m / ‖W + sBA‖`.

use candle_core::{DType, Tensor};

use super::lora::LowRank;
use crate::error::Result;

pub struct Dora {
    pub lr: LowRank,
    /// `g = m / ‖W + sBA‖` per output row, `[out]`.
    pub g: Tensor,
    /// `g − 1`.
    pub g_minus_1: Tensor,
}

impl Dora {
    /// `base_f32`: the base weight `[out, in]` in f32 (dequantized when the base is quantized);
    /// `magnitude`: PEFT's `lora_magnitude_vector` `[out]`.
    /// `dtype`: the model's (the rescaling vectors are applied to its activations).
    pub fn new(lr: LowRank, magnitude: &Tensor, base_f32: &Tensor, dtype: DType) -> Result<Self> {
        let a = lr.a.to_tensor()?.to_dtype(DType::F32)?;
        let b = lr.b.to_tensor()?.to_dtype(DType::F32)?;
        let updated = (base_f32 + (b.matmul(&a)? * lr.scale)?)?;
        let norm = updated.sqr()?.sum(1)?.sqrt()?;
        let g = (magnitude.to_dtype(DType::F32)? / norm)?;
        let g_minus_1 = (&g - 1.0)?;
        Ok(Self { lr, g: g.to_dtype(dtype)?, g_minus_1: g_minus_1.to_dtype(dtype)? })
    }

    /// The change to the bias-free base output `base = W x_in`: `[rows, out]`.
    pub fn delta(&self, x: &Tensor, base: &Tensor) -> Result<Tensor> {
        let lora = self.lr.delta(x)?;
        Ok((base.broadcast_mul(&self.g_minus_1)? + lora.broadcast_mul(&self.g)?)?)
    }

    pub fn bytes(&self) -> usize {
        self.lr.bytes() + 2 * self.g.elem_count() * self.g.dtype().size_in_bytes()
    }
}
