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

use candle_core::quantized::k_quants::{BlockQ4_1, BlockQ5_1, GgmlType};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;

use super::q8::Packed32;

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

/// A 2-D Q4_1 or Q5_1 tensor requantized to Q8_0 straight into our packed layout, a row at a
/// time on the rayon pool: each row is widened by candle's `to_float` and quantized as
/// candle's `BlockQ8_0::from_float` would ([`Packed32::from_rows`]), so the bytes equal those
/// of [`for_cpu`] and then [`Packed32::from_qtensor`], without the whole-tensor f32 copy and
/// candle's scalar, single-threaded quantizer (measured: 46% of SmolLM2's load). `None` for
/// other types and shapes, or where the blocks are not aligned for reading in place.
pub fn packed_q8_0(q: &QTensor) -> Result<Option<Packed32>> {
    fn rows<T: GgmlType + Sync>(bytes: &[u8], n: usize, k: usize) -> Result<Option<Packed32>> {
        let per_row = k / T::BLCK_SIZE;
        if !k.is_multiple_of(T::BLCK_SIZE)
            || n.checked_mul(per_row).and_then(|b| b.checked_mul(std::mem::size_of::<T>())) != Some(bytes.len())
            || bytes.as_ptr().align_offset(std::mem::align_of::<T>()) != 0
        {
            return Ok(None);
        }
        // SAFETY: `T` is one of candle's `#[repr(C)]` blocks of plain integers and f16s (any bit
        // pattern is a value); the length is `n * per_row` blocks exactly and the pointer is
        // aligned for `T`, both checked above; the slice borrows `bytes` for this call only.
        let blocks: &[T] = unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), n * per_row) };
        Ok(Some(Packed32::from_rows(n, k, |r, out| {
            T::to_float(&blocks[r * per_row..(r + 1) * per_row], out);
            Ok(())
        })?))
    }
    let Ok((n, k)) = q.shape().dims2() else { return Ok(None) };
    let data = q.data()?;
    match q.dtype() {
        GgmlDType::Q4_1 => rows::<BlockQ4_1>(&data, n, k),
        GgmlDType::Q5_1 => rows::<BlockQ5_1>(&data, n, k),
        _ => Ok(None),
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

    /// The direct Q4_1 / Q5_1 → packed Q8_0 path gives the bytes of the two-step one.
    #[test]
    fn packed_q8_0_equals_requantizing_the_whole_tensor() {
        let dev = Device::Cpu;
        // 40 rows: two tiles, the second partly padding.
        let w = Tensor::randn(0f32, 0.05, (40, 256), &dev).unwrap();
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q5_1] {
            let q = QTensor::quantize(&w, dtype).unwrap();
            let direct = packed_q8_0(&q).unwrap().expect("a 2-D aligned tensor");
            let two_step = Packed32::from_qtensor(&for_cpu(q, &dev).unwrap()).unwrap();
            assert!(direct.tile_bytes() == two_step.tile_bytes(), "{dtype:?}");
        }
        let q8 = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        assert!(packed_q8_0(&q8).unwrap().is_none());
    }

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
