//! Quantize on load (`quantize: 'q8_0' | 'q4_0' | 'q4_k'`): dense weights (f32 / f16 / bf16,
//! from safetensors or a GGUF) are quantized as they are read, one tensor at a time, into the
//! formats the engine runs fast.
//!
//! - **Streaming.** Rows are read straight from the file's bytes (the memory map for
//!   safetensors), widened to f32 one row at a time per thread and quantized into the final
//!   block buffer; the dense tensor is never materialised. Peak memory is the quantized
//!   weights plus one row per thread.
//! - **Parallel.** Row ranges run on the rayon pool (the load runs on the engine thread, whose
//!   pool is the one the runtime's `threads` sized).
//! - **Numerics.** Blocks are made by candle's reference quantizers (`BlockQ8_0::from_float`
//!   and friends: the same arithmetic as ggml's `quantize_row_*_ref`), or for Q4_0 and Q6_K by
//!   our vectorised ones ([`super::block_quant`]), which give the same bytes; so a weight
//!   quantized here equals the same weight converted to that type by candle.
//! - **What stays dense / which format.** Norms and biases stay dense. The token embedding and
//!   an untied `lm_head` are the most sensitive tensors (every token reads them, every logit
//!   comes from them): under the 4-bit modes they are stored as Q6_K (llama.cpp's
//!   `Q4_K_M` choice for the output), under `q8_0` as Q8_0. K-quant blocks hold 256 values and
//!   the others 32: a row whose length is not a multiple falls back to the next format that
//!   fits (`q4_k` → `q4_0`, `q6_k` → `q8_0`), and a row that fits none stays dense.
//!   `rt.info.quantization` names what was chosen.
//! - **Bad values.** A NaN or infinite weight would quantize into a block scale that poisons
//!   every output of its row: it fails the load as `INVALID_MODEL` naming the tensor and the
//!   element.

use candle_core::quantized::k_quants::{BlockQ4K, BlockQ4_0, BlockQ6K, BlockQ8_0, GgmlType};
use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::Device;
use half::{bf16, f16};
use rayon::prelude::*;

use super::block_quant;
use super::linear::Weight;
use super::q8::Packed32;
use crate::backend::cpu_kernels;
use crate::error::{EngineError, Result};

/// The `quantize` load option.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Quantize {
    /// Weights run in the file's form (dense, or the GGUF's own quantization).
    #[default]
    None,
    Q8_0,
    Q4_0,
    Q4K,
}

/// What a dense matrix is for: the embedding (and output) matrix is kept at higher precision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Embedding,
    Projection,
}

impl Role {
    /// By the HF tensor name of the linear layer.
    pub fn of(name: &str) -> Self {
        if name == "model.embed_tokens" || name == "lm_head" {
            Role::Embedding
        } else {
            Role::Projection
        }
    }
}

impl Quantize {
    pub const NAMES: &'static str = "none, q8_0, q4_0, q4_k";

    pub fn parse(name: Option<&str>) -> Result<Self> {
        Ok(match name.unwrap_or("none") {
            "none" => Quantize::None,
            "q8_0" => Quantize::Q8_0,
            "q4_0" => Quantize::Q4_0,
            "q4_k" => Quantize::Q4K,
            other => {
                return Err(EngineError::InvalidArgument(format!("unknown quantize '{other}' ({})", Self::NAMES)));
            }
        })
    }

    /// The block format a `role` matrix with rows of `k` values is stored in; `None` keeps it
    /// dense (quantization off, or no format's block divides `k`).
    pub fn format(self, role: Role, k: usize) -> Option<GgmlDType> {
        let wanted: &[GgmlDType] = match (self, role) {
            (Quantize::None, _) => &[],
            (Quantize::Q8_0, _) => &[GgmlDType::Q8_0],
            (Quantize::Q4_0 | Quantize::Q4K, Role::Embedding) => &[GgmlDType::Q6K, GgmlDType::Q8_0],
            (Quantize::Q4_0, Role::Projection) => &[GgmlDType::Q4_0],
            (Quantize::Q4K, Role::Projection) => &[GgmlDType::Q4K, GgmlDType::Q4_0],
        };
        wanted.iter().copied().find(|f| k > 0 && k.is_multiple_of(f.block_size()))
    }
}

/// The element type of a dense tensor in a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenseType {
    F32,
    F16,
    BF16,
}

impl DenseType {
    /// The dense type of a safetensors dtype (`None` for the others, f64 included).
    pub fn of_safetensors(d: safetensors::Dtype) -> Option<Self> {
        match d {
            safetensors::Dtype::F32 => Some(DenseType::F32),
            safetensors::Dtype::F16 => Some(DenseType::F16),
            safetensors::Dtype::BF16 => Some(DenseType::BF16),
            _ => None,
        }
    }

    /// The dense type of a GGUF tensor type (`None` for block formats).
    pub fn of_ggml(d: GgmlDType) -> Option<Self> {
        match d {
            GgmlDType::F32 => Some(DenseType::F32),
            GgmlDType::F16 => Some(DenseType::F16),
            GgmlDType::BF16 => Some(DenseType::BF16),
            _ => None,
        }
    }

    pub fn size(self) -> usize {
        match self {
            DenseType::F32 => 4,
            DenseType::F16 | DenseType::BF16 => 2,
        }
    }
}

/// A row-major `[n, k]` matrix as its little-endian bytes in a file (any alignment).
pub struct DenseRows<'a> {
    bytes: &'a [u8],
    dtype: DenseType,
    n: usize,
    k: usize,
}

impl<'a> DenseRows<'a> {
    /// `None` when `bytes` is not exactly `n · k` elements.
    pub fn new(bytes: &'a [u8], dtype: DenseType, n: usize, k: usize) -> Option<Self> {
        let want = n.checked_mul(k)?.checked_mul(dtype.size())?;
        (bytes.len() == want).then_some(Self { bytes, dtype, n, k })
    }

    /// Row `r` widened to f32 into `out`, failing on a non-finite value (`name`: the tensor).
    fn row_checked(&self, r: usize, out: &mut [f32], name: &str) -> Result<()> {
        self.row_f32(r, out);
        check_finite(out, r, name)
    }

    /// Row `r` as f32, checked as [`Self::row_checked`]: read in place when the file holds
    /// it as aligned little-endian f32 (no copy), else widened into `buf`.
    fn row_in_place<'b>(&'b self, r: usize, buf: &'b mut [f32], name: &str) -> Result<&'b [f32]> {
        #[cfg(target_endian = "little")]
        if self.dtype == DenseType::F32 {
            let bytes = &self.bytes[r * self.k * 4..(r + 1) * self.k * 4];
            // SAFETY: any bit pattern is a valid f32; `align_to` only yields the aligned middle.
            let (head, row, tail) = unsafe { bytes.align_to::<f32>() };
            if head.is_empty() && tail.is_empty() {
                check_finite(row, r, name)?;
                return Ok(row);
            }
        }
        self.row_checked(r, buf, name)?;
        Ok(buf)
    }

    /// Row `r` widened to f32 into `out` (`len = k`).
    fn row_f32(&self, r: usize, out: &mut [f32]) {
        let es = self.dtype.size();
        widen_into(self.dtype, &self.bytes[r * self.k * es..(r + 1) * self.k * es], out);
    }
}

/// `INVALID_MODEL` naming the first non-finite value of row `r` of tensor `name`.
fn check_finite(row: &[f32], r: usize, name: &str) -> Result<()> {
    // A branch-free scan first (it vectorises); the position only when there is one.
    if row.iter().fold(true, |ok, v| ok & v.is_finite()) {
        return Ok(());
    }
    match row.iter().position(|v| !v.is_finite()) {
        Some(c) => Err(EngineError::InvalidModel(format!(
            "tensor {name}: weight [{r}, {c}] is {}; a model with non-finite weights cannot be quantized",
            row[c]
        ))),
        None => Ok(()),
    }
}

/// Widens the little-endian values in `bytes` (of `dtype`, any alignment) into `out`, which
/// holds as many values as `bytes` does (a plain copy for f32).
pub fn widen_into(dtype: DenseType, bytes: &[u8], out: &mut [f32]) {
    assert_eq!(bytes.len(), out.len() * dtype.size(), "widen_into: byte count does not match the output");
    match dtype {
        #[cfg(target_endian = "little")]
        // SAFETY: `out` owns exactly `bytes.len()` bytes (asserted above); any bit pattern is a
        // valid f32, and the byte copy has no alignment requirement on `bytes`.
        DenseType::F32 => unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.as_mut_ptr() as *mut u8, bytes.len()) },
        #[cfg(not(target_endian = "little"))]
        DenseType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DenseType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        DenseType::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
    }
}

/// Quantizes the `[n, k]` matrix whose file bytes are `bytes` ([`quantize_weight`]); a byte
/// count that does not match the shape is `INVALID_MODEL`.
pub fn quantize_bytes(
    bytes: &[u8],
    dtype: DenseType,
    (n, k): (usize, usize),
    format: GgmlDType,
    name: &str,
    device: &Device,
) -> Result<Weight> {
    let rows = DenseRows::new(bytes, dtype, n, k)
        .ok_or_else(|| EngineError::InvalidModel(format!("tensor {name}: byte count does not match its shape")))?;
    quantize_weight(&rows, format, name, device)
}

/// Rows quantized per rayon task: enough work to amortise the task, small enough to balance.
const ROWS_PER_TASK: usize = 16;

/// Quantizes `rows` into blocks of `T`, each row by `row_blocks` (a function with the same
/// result as `T::from_float`).
fn quantize_as<T: GgmlType + 'static>(rows: &DenseRows, name: &str, row_blocks: fn(&[f32], &mut [T])) -> Result<QTensor> {
    let per_row = rows.k / T::BLCK_SIZE;
    let mut blocks = Vec::new();
    blocks
        .try_reserve_exact(rows.n * per_row)
        .map_err(|_| EngineError::OutOfMemory(format!("cannot allocate the quantized tensor {name}")))?;
    blocks.resize(rows.n * per_row, T::zeros());
    blocks.par_chunks_mut(per_row * ROWS_PER_TASK).enumerate().try_for_each_init(
        || vec![0f32; rows.k],
        |buf, (task, dst)| -> Result<()> {
            for (i, out) in dst.chunks_exact_mut(per_row).enumerate() {
                row_blocks(rows.row_in_place(task * ROWS_PER_TASK + i, buf, name)?, out);
            }
            Ok(())
        },
    )?;
    Ok(QTensor::new(QStorage::Cpu(Box::new(blocks)), (rows.n, rows.k))?)
}

/// Quantizes `rows` into `format` (one that [`Quantize::format`] chose), on the CPU.
pub fn quantize(rows: &DenseRows, format: GgmlDType, name: &str) -> Result<QTensor> {
    if rows.k == 0 || !rows.k.is_multiple_of(format.block_size()) {
        return Err(EngineError::Internal(format!("{name}: rows of {} cannot be {format:?}", rows.k)));
    }
    match format {
        GgmlDType::Q8_0 => quantize_as::<BlockQ8_0>(rows, name, BlockQ8_0::from_float),
        GgmlDType::Q4_0 => quantize_as::<BlockQ4_0>(rows, name, block_quant::q4_0),
        GgmlDType::Q4K => quantize_as::<BlockQ4K>(rows, name, BlockQ4K::from_float),
        GgmlDType::Q6K => quantize_as::<BlockQ6K>(rows, name, block_quant::q6_k),
        other => Err(EngineError::Internal(format!("{name}: no quantize-on-load for {other:?}"))),
    }
}

/// Quantizes `rows` into `format` as the engine will run it on `device`: Q8_0 on the CPU
/// kernels goes straight into our packed layout ([`Packed32::from_rows`], one pass, no
/// intermediate blocks); the rest through [`quantize`] and [`Weight::from_qtensor`].
pub fn quantize_weight(rows: &DenseRows, format: GgmlDType, name: &str, device: &Device) -> Result<Weight> {
    if format == GgmlDType::Q8_0 && cpu_kernels(device) {
        let packed = Packed32::from_rows(rows.n, rows.k, |r, out| rows.row_checked(r, out, name))?;
        return Ok(Weight::Packed32(packed));
    }
    Weight::from_qtensor(quantize(rows, format, name)?, device)
}

/// The lower-case name of a block format (`q4_k`), as `rt.info.quantization` reports it.
pub fn format_name(f: GgmlDType) -> String {
    format!("{f:?}").to_lowercase().replace("k", "_k").replace("__", "_")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::PackedMatrix;
    use candle_core::{Device, Tensor};

    fn le_bytes(v: &[f32], dtype: DenseType) -> Vec<u8> {
        match dtype {
            DenseType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            DenseType::F16 => v.iter().flat_map(|x| f16::from_f32(*x).to_le_bytes()).collect(),
            DenseType::BF16 => v.iter().flat_map(|x| bf16::from_f32(*x).to_le_bytes()).collect(),
        }
    }

    #[test]
    fn quantizing_rows_equals_candles_whole_tensor_quantization() {
        // 37 rows: not a multiple of the rows per task; 512 columns: two K-quant blocks.
        let (n, k) = (37, 512);
        let x = Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu).unwrap();
        let v: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
        for dtype in [DenseType::F32, DenseType::F16, DenseType::BF16] {
            let bytes = le_bytes(&v, dtype);
            let rows = DenseRows::new(&bytes, dtype, n, k).unwrap();
            // The reference: the same values (after the file's rounding) quantized whole.
            let mut wide = vec![0f32; n * k];
            for (r, o) in wide.chunks_exact_mut(k).enumerate() {
                rows.row_f32(r, o);
            }
            let whole = Tensor::from_vec(wide, (n, k), &Device::Cpu).unwrap();
            // The same bytes one byte further on: f32 rows no longer aligned, so they are
            // copied rather than read in place.
            let mut shifted = vec![0u8; bytes.len() + 1];
            shifted[1..].copy_from_slice(&bytes);
            let unaligned = DenseRows::new(&shifted[1..], dtype, n, k).unwrap();
            for f in [GgmlDType::Q8_0, GgmlDType::Q4_0, GgmlDType::Q4K, GgmlDType::Q6K] {
                let want = QTensor::quantize(&whole, f).unwrap();
                for rows in [&rows, &unaligned] {
                    let got = quantize(rows, f, "w").unwrap();
                    assert_eq!(got.dtype(), f);
                    assert_eq!(got.shape().dims(), &[n, k]);
                    assert_eq!(got.data().unwrap(), want.data().unwrap(), "{dtype:?} → {f:?}");
                }
            }
        }
    }

    #[test]
    fn q8_0_straight_into_the_packed_layout_equals_candles_blocks_repacked() {
        let (n, k) = (37, 256);
        let v: Vec<f32> = Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        // A block of exact zeros (scale 0).
        let mut v = v;
        v[..32].fill(0.0);
        let bytes = le_bytes(&v, DenseType::F32);
        let rows = DenseRows::new(&bytes, DenseType::F32, n, k).unwrap();
        let Weight::Packed32(direct) = quantize_weight(&rows, GgmlDType::Q8_0, "w", &Device::Cpu).unwrap() else {
            panic!("Q8_0 on CPU is packed")
        };
        let via = Packed32::from_qtensor(&quantize(&rows, GgmlDType::Q8_0, "w").unwrap()).unwrap();
        assert_eq!(direct.dequantize(), via.dequantize());
        assert_eq!(direct.size_in_bytes(), via.size_in_bytes());
        let bad = DenseRows::new(&le_bytes(&[f32::NAN; 64], DenseType::F32), DenseType::F32, 1, 64)
            .map(|r| quantize_weight(&r, GgmlDType::Q8_0, "w", &Device::Cpu).err().map(|e| e.code()));
        assert_eq!(bad, Some(Some("INVALID_MODEL")));
    }

    #[test]
    fn widening_reads_each_type_at_any_alignment() {
        let v = [1.5f32, -0.0, 3.0e-5, -65504.0, f32::INFINITY];
        for dtype in [DenseType::F32, DenseType::F16, DenseType::BF16] {
            let want: Vec<f32> = match dtype {
                DenseType::F32 => v.to_vec(),
                DenseType::F16 => v.iter().map(|x| f16::from_f32(*x).to_f32()).collect(),
                DenseType::BF16 => v.iter().map(|x| bf16::from_f32(*x).to_f32()).collect(),
            };
            // One byte of padding first: the values start at an odd address.
            let mut bytes = vec![0u8];
            bytes.extend(le_bytes(&v, dtype));
            let mut got = vec![0f32; v.len()];
            widen_into(dtype, &bytes[1..], &mut got);
            assert_eq!(
                got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{dtype:?}"
            );
        }
    }

    #[test]
    fn non_finite_weights_fail_the_load() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut v = vec![0.5f32; 4 * 64];
            v[2 * 64 + 7] = bad;
            let bytes = le_bytes(&v, DenseType::F32);
            let rows = DenseRows::new(&bytes, DenseType::F32, 4, 64).unwrap();
            let e = quantize(&rows, GgmlDType::Q8_0, "model.layers.0.mlp.up_proj.weight").unwrap_err();
            assert_eq!(e.code(), "INVALID_MODEL");
            assert!(e.to_string().contains("up_proj.weight: weight [2, 7]"), "{e}");
        }
    }

    #[test]
    fn formats_fall_back_to_blocks_that_divide_the_rows() {
        use GgmlDType::*;
        let q = |m: Quantize, role, k| m.format(role, k);
        assert_eq!(q(Quantize::None, Role::Projection, 1024), None);
        assert_eq!(q(Quantize::Q8_0, Role::Embedding, 1024), Some(Q8_0));
        assert_eq!(q(Quantize::Q4_0, Role::Projection, 64), Some(Q4_0));
        assert_eq!(q(Quantize::Q4_0, Role::Embedding, 1024), Some(Q6K));
        assert_eq!(q(Quantize::Q4_0, Role::Embedding, 64), Some(Q8_0));
        assert_eq!(q(Quantize::Q4K, Role::Projection, 1024), Some(Q4K));
        assert_eq!(q(Quantize::Q4K, Role::Projection, 96), Some(Q4_0));
        assert_eq!(q(Quantize::Q4K, Role::Projection, 48), None);
        assert_eq!(q(Quantize::Q8_0, Role::Projection, 0), None);
        assert!(DenseRows::new(&[0u8; 8], DenseType::F32, 1, 3).is_none());
        assert!(DenseRows::new(&[], DenseType::F32, usize::MAX, 2).is_none());
        assert_eq!(format_name(Q4K), "q4_k");
        assert_eq!(format_name(Q8_0), "q8_0");
        assert_eq!(format_name(Q6K), "q6_k");
        assert!(matches!(Quantize::parse(Some("q5")), Err(EngineError::InvalidArgument(_))));
        assert_eq!(Quantize::parse(None).unwrap(), Quantize::None);
    }
}
