//! Block-quantized KV rows: every 32 consecutive values of a row share one f16 scale `d`.
//!
//! - `q8_0`: one byte per value, `x ≈ d · (q − 128)`, `d = max|x| / 127` (34 bytes per 32
//!   values, as llama.cpp's `q8_0`).
//! - `q4_0`: one nibble per value, `x ≈ d · (q − 8)`, `d = m / −8` where `m` is the value of
//!   largest magnitude (so it maps exactly to a level), values `j` and `j + 16` of a block
//!   sharing byte `j` (low, high nibble): 18 bytes per 32 values, as llama.cpp's `q4_0`.
//!
//! Quantizing and dequantizing whole tensors are candle ops, so the same code writes and
//! reads the pool on every device; the fused CPU attention kernel dequantizes one head's row
//! at a time as it reads it ([`dequant_row`]). The quantized values are stored offset to be
//! unsigned (`u8` tensors), the scales as `f16` tensors `[rows, cols / 32]`.

use candle_core::{DType, Tensor, D};

use crate::error::{EngineError, Result};

/// Values per block.
pub const BLOCK: usize = 32;

/// A block-quantized pool format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quant {
    Q8_0,
    Q4_0,
}

impl Quant {
    pub fn name(self) -> &'static str {
        match self {
            Quant::Q8_0 => "q8_0",
            Quant::Q4_0 => "q4_0",
        }
    }

    /// Bytes of quantized values for `cols` values (scales apart).
    pub fn packed_cols(self, cols: usize) -> usize {
        match self {
            Quant::Q8_0 => cols,
            Quant::Q4_0 => cols / 2,
        }
    }

    /// Bytes per `cols` values, scales included.
    pub fn row_bytes(self, cols: usize) -> usize {
        self.packed_cols(cols) + cols / BLOCK * 2
    }

    /// `x` `[rows, cols]` (cols a multiple of 32) → `(values u8 [rows, packed_cols], scales f16
    /// [rows, cols / 32])`.
    pub fn quantize(self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let (rows, cols) = x.dims2()?;
        let nb = cols / BLOCK;
        let x = x.to_dtype(DType::F32)?.reshape((rows, nb, BLOCK))?;
        // Zero (or NaN) blocks get a zero scale; the clamp keeps 1/d finite, and 0 · huge = 0.
        let (d, q) = match self {
            Quant::Q8_0 => {
                let amax = x.abs()?.max_keepdim(D::Minus1)?;
                let d = (&amax / 127.0)?;
                let id = (amax.clamp(1e-30f32, f32::INFINITY)?.recip()? * 127.0)?;
                let q = (x.broadcast_mul(&id)?.round()?.clamp(-127f32, 127f32)? + 128.0)?;
                (d, q.reshape((rows, cols))?)
            }
            Quant::Q4_0 => {
                let at = x.abs()?.argmax_keepdim(D::Minus1)?;
                let m = x.gather(&at, D::Minus1)?;
                let d = (&m / -8.0)?;
                // 1/d with d's sign; |d| clamped away from 0 (then x is 0 too).
                let sign = m.ge(0f32)?.to_dtype(DType::F32)?.affine(-2.0, 1.0)?;
                let id = (d.abs()?.clamp(1e-30f32, f32::INFINITY)?.recip()? * sign)?;
                let q = (x.broadcast_mul(&id)? + 8.5)?.floor()?.clamp(0f32, 15f32)?;
                let packed = (q.narrow(2, 0, 16)? + (q.narrow(2, 16, 16)? * 16.0)?)?;
                (d, packed.reshape((rows, cols / 2))?)
            }
        };
        let q = q.to_dtype(DType::U8)?;
        let d = d.reshape((rows, nb))?.to_dtype(DType::F16)?;
        Ok((q, d))
    }

    /// Inverse of [`Self::quantize`]: `[rows, cols]` in `dtype`.
    pub fn dequantize(self, q: &Tensor, d: &Tensor, dtype: DType) -> Result<Tensor> {
        let (rows, nb) = d.dims2()?;
        let d = d.to_dtype(DType::F32)?.reshape((rows, nb, 1))?;
        let q = q.to_dtype(DType::F32)?;
        let vals = match self {
            Quant::Q8_0 => (q.reshape((rows, nb, BLOCK))? - 128.0)?,
            Quant::Q4_0 => {
                let b = q.reshape((rows, nb, BLOCK / 2))?;
                let hi = (&b / 16.0)?.floor()?;
                let lo = (&b - (&hi * 16.0)?)?;
                (Tensor::cat(&[lo, hi], 2)? - 8.0)?
            }
        };
        Ok(vals.broadcast_mul(&d)?.reshape((rows, nb * BLOCK))?.to_dtype(dtype)?)
    }

    /// Checks that rows of `kv_heads · head_dim` values split into whole blocks per head.
    pub fn check_head_dim(self, head_dim: usize) -> Result<()> {
        if !head_dim.is_multiple_of(BLOCK) {
            return Err(EngineError::InvalidArgument(format!(
                "kvCache.dtype '{}' needs a head dimension that is a multiple of {BLOCK} (this model's is {head_dim}); \
                 use 'f16' or 'bf16'",
                self.name()
            )));
        }
        Ok(())
    }
}

/// One head's row for the fused kernel: `q` its packed values, `d` its `out.len() / 32`
/// scales; writes the values into `out`.
#[inline(always)]
pub fn dequant_row(quant: Quant, q: &[u8], d: &[half::f16], out: &mut [f32]) {
    match quant {
        Quant::Q8_0 => {
            for ((o, q), d) in out.chunks_exact_mut(BLOCK).zip(q.chunks_exact(BLOCK)).zip(d) {
                let d = d.to_f32();
                for (o, &q) in o.iter_mut().zip(q) {
                    *o = (q as i32 - 128) as f32 * d;
                }
            }
        }
        Quant::Q4_0 => {
            for ((o, q), d) in out.chunks_exact_mut(BLOCK).zip(q.chunks_exact(BLOCK / 2)).zip(d) {
                let d = d.to_f32();
                let (lo, hi) = o.split_at_mut(BLOCK / 2);
                for ((l, h), &b) in lo.iter_mut().zip(hi).zip(q) {
                    *l = ((b & 15) as i32 - 8) as f32 * d;
                    *h = ((b >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn roundtrip(quant: Quant, x: &Tensor) -> (Tensor, Tensor, Tensor) {
        let (q, d) = quant.quantize(x).unwrap();
        let y = quant.dequantize(&q, &d, DType::F32).unwrap();
        (q, d, y)
    }

    /// Every value comes back within half a step of its block (plus the f16 rounding of the
    /// scale), or for q4_0 one step (the level +8 does not exist: values near −m clamp to +7);
    /// zero blocks stay zero; the row kernel reads what the tensor ops read.
    #[test]
    fn blocks_round_trip_within_half_a_step() {
        let dev = Device::Cpu;
        let mut x = Tensor::randn(0f32, 3.0, (5, 128), &dev).unwrap();
        x = x.slice_assign(&[0..1, 32..64], &Tensor::zeros((1, 32), DType::F32, &dev).unwrap()).unwrap();
        for (quant, levels, steps) in [(Quant::Q8_0, 127f32, 0.5f32), (Quant::Q4_0, 8f32, 1.0f32)] {
            let (q, d, y) = roundtrip(quant, &x);
            assert_eq!(q.dims(), &[5, quant.packed_cols(128)]);
            assert_eq!(d.dims(), &[5, 4]);
            let xv: Vec<Vec<f32>> = x.to_vec2().unwrap();
            let yv: Vec<Vec<f32>> = y.to_vec2().unwrap();
            for (r, (xr, yr)) in xv.iter().zip(&yv).enumerate() {
                for (b, (xb, yb)) in xr.chunks(32).zip(yr.chunks(32)).enumerate() {
                    let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let step = amax / levels;
                    for (a, b2) in xb.iter().zip(yb) {
                        assert!((a - b2).abs() <= step * steps + amax * 2e-3 + 1e-6, "{quant:?} row {r} block {b}: {a} vs {b2}");
                    }
                }
            }
            assert!(yv[0][32..64].iter().all(|&v| v == 0.0), "{quant:?}: a zero block stays zero");
            // The fused kernel's row reader.
            let qv: Vec<Vec<u8>> = q.to_vec2().unwrap();
            let dv: Vec<Vec<half::f16>> = d.to_vec2().unwrap();
            for r in 0..5 {
                let mut out = vec![0f32; 128];
                dequant_row(quant, &qv[r], &dv[r], &mut out);
                assert_eq!(out, yv[r], "{quant:?} row {r}");
            }
        }
    }

    /// q4_0 maps the value of largest magnitude exactly onto the level −8.
    #[test]
    fn q4_0_keeps_the_largest_value() {
        let dev = Device::Cpu;
        let mut v: Vec<f32> = (0..32).map(|i| (i as f32 - 10.0) / 4.0).collect();
        v[7] = -6.0;
        let x = Tensor::from_vec(v, (1, 32), &dev).unwrap();
        let (_, _, y) = roundtrip(Quant::Q4_0, &x);
        assert_eq!(y.to_vec2::<f32>().unwrap()[0][7], -6.0);
    }

    /// NaN or infinite activations do not panic; what they store is finite bytes.
    #[test]
    fn non_finite_values_do_not_panic() {
        let dev = Device::Cpu;
        let x = Tensor::from_vec([f32::NAN, f32::INFINITY, -1.0, 2.0].repeat(8), (1, 32), &dev).unwrap();
        for quant in [Quant::Q8_0, Quant::Q4_0] {
            let _ = roundtrip(quant, &x);
        }
    }

    #[test]
    fn head_dims_must_be_whole_blocks() {
        assert!(Quant::Q8_0.check_head_dim(128).is_ok());
        let e = Quant::Q4_0.check_head_dim(16).unwrap_err();
        assert!(matches!(e, EngineError::InvalidArgument(_)) && e.to_string().contains("q4_0"), "{e}");
    }
}
