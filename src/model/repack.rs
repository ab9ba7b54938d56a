//! Load-time repacking of GGUF block types that no kernel of ours runs into Q8_0, which ours
//! does ([`super::q8`]).
//!
//! Q4_1 / Q5_1 (`d · q + m`) are not multiples of one scale; they are dequantized and
//! requantized to Q8_0, whose step (`amax / 127`) is ~1/17 of the Q4_1 step. (Q8_0, Q5_0 and
//! Q4_0 go to our kernel as they are, losslessly; so do Q4_K, Q5_K and Q6_K, to
//! [`super::kquant`].)
//!
//! Found on SmolLM2 (Q4_1): candle's scalar Q4_1 path flipped the greedy answer (its Q8_1
//! activation block sums are rounded to f16 twice) and ran slower than f32.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;

use crate::error::Result;

/// Repacks `q` when no kernel of ours runs its type; returns it unchanged otherwise.
pub fn for_cpu(q: QTensor, device: &Device) -> Result<QTensor> {
    match q.dtype() {
        GgmlDType::Q4_1 | GgmlDType::Q5_1 => Ok(QTensor::quantize(&q.dequantize(device)?, GgmlDType::Q8_0)?),
        _ => Ok(q),
    }
}
