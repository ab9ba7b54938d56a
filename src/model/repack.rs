//! Load-time repacking of GGUF block types that candle runs with a scalar CPU kernel into
//! Q8_0, which has a SIMD (AVX2) one.
//!
//! - Q5_0 → Q8_0 is lossless: a Q5_0 value is `d · (q − 16)` with `q ∈ 0..32`, which is a Q8_0
//!   block with the same `d` and `qs = q − 16`.
//! - Q4_1 / Q5_1 (`d · q + m`) are not multiples of one scale; they are dequantized and
//!   requantized to Q8_0, whose step (`amax / 127`) is ~1/17 of the Q4_1 step.
//!
//! Found on SmolLM2 (Q4_1): candle's scalar Q4_1 path flipped the greedy answer (its Q8_1
//! activation block sums are rounded to f16 twice) and ran slower than f32.

use std::borrow::Cow;

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::Device;

use crate::error::Result;

const QK: usize = 32;
const Q5_0_BYTES: usize = 2 + 4 + QK / 2;
const Q8_0_BYTES: usize = 2 + QK;

/// Repacks `q` when candle has no SIMD CPU kernel for its type; returns it unchanged otherwise.
pub fn for_cpu(q: QTensor, device: &Device) -> Result<QTensor> {
    match q.dtype() {
        GgmlDType::Q5_0 => {
            let bytes = q5_0_to_q8_0(&q.data()?);
            let storage = QStorage::from_data(Cow::Owned(bytes), device, GgmlDType::Q8_0)?;
            Ok(QTensor::new(storage, q.shape().clone())?)
        }
        GgmlDType::Q4_1 | GgmlDType::Q5_1 => Ok(QTensor::quantize(&q.dequantize(device)?, GgmlDType::Q8_0)?),
        _ => Ok(q),
    }
}

/// ggml's `block_q5_0 { f16 d; u8 qh[4]; u8 qs[16] }` → `block_q8_0 { f16 d; i8 qs[32] }`.
fn q5_0_to_q8_0(src: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(src.len() / Q5_0_BYTES * Q8_0_BYTES);
    for b in src.chunks_exact(Q5_0_BYTES) {
        let (d, rest) = b.split_at(2);
        let (qh, qs) = rest.split_at(4);
        let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
        out.extend_from_slice(d);
        let mut vals = [0i8; QK];
        for j in 0..QK / 2 {
            let hi0 = ((qh >> j) << 4) as u8 & 0x10;
            let hi1 = (qh >> (j + 12)) as u8 & 0x10;
            vals[j] = (((qs[j] & 0x0F) | hi0) as i8) - 16;
            vals[j + QK / 2] = (((qs[j] >> 4) | hi1) as i8) - 16;
        }
        out.extend(vals.iter().map(|&v| v as u8));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Tensor;

    #[test]
    fn q5_0_repack_is_lossless() {
        let x = Tensor::randn(0f32, 1.0, (8, 64), &Device::Cpu).unwrap();
        let q5 = QTensor::quantize(&x, GgmlDType::Q5_0).unwrap();
        let want: Vec<f32> = q5.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let q8 = for_cpu(q5, &Device::Cpu).unwrap();
        assert_eq!(q8.dtype(), GgmlDType::Q8_0);
        let got: Vec<f32> = q8.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(got, want);
    }
}
