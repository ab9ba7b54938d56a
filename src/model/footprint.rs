//! What a model's weights will take once loaded, from the tensor headers alone: each tensor's
//! stored form under the load's [`WeightPolicy`] and dtype, by the same rules the loader
//! applies.
//!
//! - A GGUF block-quantized tensor stays in its format (its file bytes), or becomes dense in
//!   the model's dtype under `dequantize`.
//! - A dense matrix is quantized under `quantize` into the format [`Quantize::format`] picks
//!   for its role and row length (the embedding and output matrices at higher precision), or
//!   stays dense in the model's dtype: read in place from the memory map (safetensors on CPU,
//!   the file's dtype being the model's) or copied.
//! - Vectors (norms, biases) stay dense in the model's dtype.
//!
//! The sum is an estimate, not an accounting: a repacked layout may add a few bytes per
//! block, and a tensor the model does not use (a GGUF's `rope_freqs`) is counted.

use std::collections::BTreeMap;

use candle_core::quantized::GgmlDType;
use candle_core::DType;

use super::loader::{self, ModelFormat, WeightPolicy};
use super::quantize::{format_name, DenseType, Role};
use crate::error::{EngineError, Result};
use crate::files;

/// What the loaded weights take, in all and by format.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WeightFootprint {
    pub bytes: u64,
    /// Of `bytes`, those read in place from a memory-mapped file (pages of the file, resident
    /// once read).
    pub mapped_bytes: u64,
    /// `(format, bytes)`, most bytes first: `f32`, `q8_0`, `q6_k`, …
    pub formats: Vec<(String, u64)>,
}

/// How a tensor is stored in its file.
#[derive(Clone, Copy, Debug)]
enum Stored {
    Dense(DenseType),
    /// A GGUF block format, with its bytes in the file.
    Blocks(GgmlDType, u64),
    /// Anything else (integer tensors, f64): counted at its file bytes.
    Other(u64),
}

/// The embedding and output matrices, by their HF and GGUF names.
fn role(name: &str) -> Role {
    let name = name.strip_suffix(".weight").unwrap_or(name);
    let embedding = name.ends_with("embed_tokens") || name.ends_with("lm_head") || name == "token_embd" || name == "output";
    if embedding {
        Role::Embedding
    } else {
        Role::Projection
    }
}

fn dense_name(d: DType) -> &'static str {
    match d {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        _ => "f32",
    }
}

/// Where the weights go: on CPU, block formats no kernel of ours runs are requantized
/// ([`super::repack`]) and block matrices are packed in tiles of [`TILE_ROWS`] rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Target {
    dtype: DType,
    on_cpu: bool,
    /// Dense tensors of the file's dtype may be read in place from the memory map.
    in_place: bool,
}

/// Rows per tile of the CPU's packed block matrices (`tiled::TN`): a matrix's rows are padded
/// to a multiple.
const TILE_ROWS: u64 = 16;

/// Bytes of `elements` values of a `dims` matrix in block format `f`, its rows padded to whole
/// tiles on CPU.
fn block_bytes(f: GgmlDType, dims: &[usize], elements: u64, on_cpu: bool) -> u64 {
    let k = dims.last().copied().unwrap_or(0) as u64;
    let rows = elements.checked_div(k).unwrap_or(0);
    let rows = if on_cpu && dims.len() >= 2 { rows.div_ceil(TILE_ROWS) * TILE_ROWS } else { rows };
    let blocks_per_row = k / f.block_size() as u64;
    rows.saturating_mul(blocks_per_row).saturating_mul(f.type_size() as u64)
}

/// `(format, bytes, mapped)` of one tensor once loaded.
fn loaded(name: &str, dims: &[usize], stored: Stored, policy: WeightPolicy, to: Target) -> (String, u64, bool) {
    let elements = dims.iter().fold(1u64, |n, &d| n.saturating_mul(d as u64));
    let dtype = to.dtype;
    let dense = |n: u64| (dense_name(dtype).to_string(), n.saturating_mul(dtype.size_in_bytes() as u64));
    match stored {
        Stored::Other(bytes) => ("other".into(), bytes, false),
        Stored::Blocks(format, bytes) if !policy.dequantize => {
            let runs_as = match format {
                GgmlDType::Q4_1 | GgmlDType::Q5_1 if to.on_cpu => GgmlDType::Q8_0,
                f => f,
            };
            let packed = matches!(
                runs_as,
                GgmlDType::Q8_0 | GgmlDType::Q4_0 | GgmlDType::Q5_0 | GgmlDType::Q4K | GgmlDType::Q5K | GgmlDType::Q6K
            );
            let bytes =
                if runs_as != format || (to.on_cpu && packed) { block_bytes(runs_as, dims, elements, to.on_cpu) } else { bytes };
            (format_name(runs_as), bytes, false)
        }
        Stored::Blocks(..) => {
            let (f, b) = dense(elements);
            (f, b, false)
        }
        Stored::Dense(file_type) => {
            let k = dims.last().copied().unwrap_or(0);
            let block = (dims.len() >= 2).then(|| policy.quantize.format(role(name), k)).flatten();
            match block {
                Some(f) => (format_name(f), block_bytes(f, dims, elements, to.on_cpu), false),
                None => {
                    let same = matches!(
                        (file_type, dtype),
                        (DenseType::F32, DType::F32) | (DenseType::F16, DType::F16) | (DenseType::BF16, DType::BF16)
                    );
                    let mapped = to.in_place && policy.mmap && dims.len() == 2 && same;
                    let (f, b) = dense(elements);
                    (f, b, mapped)
                }
            }
        }
    }
}

/// The footprint of `format`'s weights loaded under `policy` in `dtype`; `on_cpu`: whether
/// dense weights may be read in place from a memory map.
pub fn weight_footprint(format: &ModelFormat, policy: WeightPolicy, dtype: DType, on_cpu: bool) -> Result<WeightFootprint> {
    let mut by_format: BTreeMap<String, u64> = BTreeMap::new();
    let mut out = WeightFootprint::default();
    let mut add = |name: &str, dims: &[usize], stored: Stored, in_place: bool| {
        let (f, bytes, mapped) = loaded(name, dims, stored, policy, Target { dtype, on_cpu, in_place });
        *by_format.entry(f).or_default() += bytes;
        out.bytes = out.bytes.saturating_add(bytes);
        if mapped {
            out.mapped_bytes = out.mapped_bytes.saturating_add(bytes);
        }
    };
    match format {
        ModelFormat::HfDir(dir) => {
            for p in loader::safetensors_files(dir)? {
                let bad = |e: &dyn std::fmt::Display| EngineError::InvalidModel(format!("{}: {e}", p.display()));
                files::regular_file_len(&p).map_err(|e| bad(&e))?;
                let file = std::fs::File::open(&p).map_err(|e| bad(&e))?;
                // SAFETY: mapped read-only for this call; `read_metadata` checks the header
                // against the map's length and no tensor data is read.
                let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| bad(&e))?;
                let (_, metadata) = safetensors::SafeTensors::read_metadata(&map).map_err(|e| bad(&e))?;
                for (name, info) in metadata.tensors() {
                    let bytes = info.data_offsets.1.saturating_sub(info.data_offsets.0) as u64;
                    let stored = DenseType::of_safetensors(info.dtype).map_or(Stored::Other(bytes), Stored::Dense);
                    add(&name, &info.shape, stored, on_cpu);
                }
            }
        }
        ModelFormat::Gguf(src) => {
            let content = src.content();
            for (name, info) in &content.tensor_infos {
                let (_, bytes) = loader::gguf_tensor_extent(content, name, src.file_len())?;
                let stored = match DenseType::of_ggml(info.ggml_dtype) {
                    Some(d) => Stored::Dense(d),
                    None => Stored::Blocks(info.ggml_dtype, bytes),
                };
                add(name, info.shape.dims(), stored, false);
            }
        }
    }
    let mut formats: Vec<(String, u64)> = by_format.into_iter().collect();
    formats.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out.formats = formats;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::quantize::Quantize;

    #[test]
    fn tensors_take_the_form_the_loader_gives_them() {
        let none = WeightPolicy { dequantize: false, quantize: Quantize::None, mmap: true };
        let q4 = WeightPolicy { quantize: Quantize::Q4_0, ..none };
        let f32s = Stored::Dense(DenseType::F32);
        let cpu = Target { dtype: DType::F32, on_cpu: true, in_place: true };
        let up = "model.layers.0.mlp.up_proj.weight";
        // Dense f32 read in place on CPU; copied (and counted) as f16 when the dtype differs.
        assert_eq!(loaded(up, &[64, 32], f32s, none, cpu), ("f32".into(), 8192, true));
        assert_eq!(loaded(up, &[64, 32], f32s, none, Target { dtype: DType::F16, ..cpu }), ("f16".into(), 4096, false));
        // q4_0 projections, the embedding as q6_k (256-value blocks of 210 bytes) when its
        // rows allow; rows padded to whole tiles of 16 on CPU only.
        assert_eq!(loaded(up, &[64, 32], f32s, q4, cpu), ("q4_0".into(), 64 * 18, false));
        assert_eq!(loaded(up, &[10, 32], f32s, q4, cpu), ("q4_0".into(), 16 * 18, false));
        let gpu = Target { dtype: DType::BF16, on_cpu: false, in_place: false };
        assert_eq!(loaded(up, &[10, 32], f32s, q4, gpu), ("q4_0".into(), 10 * 18, false));
        assert_eq!(loaded("model.embed_tokens.weight", &[16, 256], f32s, q4, cpu), ("q6_k".into(), 16 * 210, false));
        assert_eq!(loaded("token_embd.weight", &[16, 32], f32s, q4, cpu), ("q8_0".into(), 16 * 34, false));
        // Norms stay dense; a row no block divides stays dense.
        assert_eq!(loaded("model.norm.weight", &[64], f32s, q4, cpu).1, 256);
        assert_eq!(loaded(up, &[4, 33], f32s, q4, cpu).0, "f32");
        // A GGUF block tensor keeps its bytes (Q4_1 runs as Q8_0 on CPU), or is dense under
        // dequantize.
        let q4_1 = Stored::Blocks(GgmlDType::Q4_1, 16 * 20);
        assert_eq!(loaded("blk.0.ffn_up.weight", &[16, 32], q4_1, none, gpu), ("q4_1".into(), 16 * 20, false));
        assert_eq!(loaded("blk.0.ffn_up.weight", &[16, 32], q4_1, none, cpu), ("q8_0".into(), 16 * 34, false));
        let deq = WeightPolicy { dequantize: true, ..none };
        assert_eq!(loaded("blk.0.ffn_up.weight", &[16, 32], q4_1, deq, cpu), ("f32".into(), 2048, false));
    }
}
