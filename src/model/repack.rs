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
//!
//! On aarch64 CPUs without SDOT (Cortex-A72 / A53 class, e.g. a Raspberry Pi 4), the types
//! only candle runs (Q2_K, Q3_K, Q8_1, Q8_K) are requantized to Q8_0 as well: candle's NEON
//! dot products issue SDOT without asking the CPU, and there it is an illegal instruction,
//! which would kill the host process.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;

use crate::error::Result;

/// Repacks `q` when no kernel of ours runs its type; returns it unchanged otherwise.
pub fn for_cpu(q: QTensor, device: &Device) -> Result<QTensor> {
    match q.dtype() {
        GgmlDType::Q4_1 | GgmlDType::Q5_1 => Ok(QTensor::quantize(&q.dequantize(device)?, GgmlDType::Q8_0)?),
        GgmlDType::Q2K | GgmlDType::Q3K | GgmlDType::Q8_1 | GgmlDType::Q8K if !candle_dots_run_here() => {
            Ok(QTensor::quantize(&q.dequantize(device)?, GgmlDType::Q8_0)?)
        }
        _ => Ok(q),
    }
}

/// Whether candle's quantized dot products can run on this CPU (see the module note).
pub fn candle_dots_run_here() -> bool {
    #[cfg(target_arch = "aarch64")]
    return crate::simd::neon::has_dotprod();
    #[cfg(not(target_arch = "aarch64"))]
    true
}

#[cfg(test)]
mod tests {
    use candle_core::Tensor;

    use super::*;

    /// Q4_1 always, and the types only candle runs where its dot products cannot, become Q8_0
    /// with the values of the original blocks to within Q8_0's step.
    #[test]
    fn types_without_a_kernel_here_become_q8_0() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 0.05, (32, 256), &dev).unwrap();
        for (dtype, moved) in [
            (GgmlDType::Q4_1, true),
            (GgmlDType::Q3K, !candle_dots_run_here()),
            (GgmlDType::Q2K, !candle_dots_run_here()),
            (GgmlDType::Q4K, false),
            (GgmlDType::Q8_0, false),
        ] {
            let q = QTensor::quantize(&w, dtype).unwrap();
            let before: Vec<f32> = q.dequantize(&dev).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let r = for_cpu(q, &dev).unwrap();
            assert_eq!(r.dtype(), if moved { GgmlDType::Q8_0 } else { dtype }, "{dtype:?}");
            let after: Vec<f32> = r.dequantize(&dev).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            for c in before.chunks(32).zip(after.chunks(32)) {
                let step = c.0.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                assert!(c.0.iter().zip(c.1).all(|(a, b)| (a - b).abs() <= step), "{dtype:?}");
            }
        }
    }
}
