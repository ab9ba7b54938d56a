//! Weight sources: an HF directory of (optionally sharded) safetensors, memory-mapped, or a
//! GGUF file. Both answer requests by the HF tensor name (`model.layers.0.self_attn.q_proj`),
//! so the decoder is written once; the GGUF source translates to llama.cpp names
//! (`blk.0.attn_q`).
//!
//! Every failure to read a tensor (missing, wrong shape, truncated file) is reported as
//! `INVALID_MODEL` naming the tensor, and every requested shape is checked here, once.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use memmap2::Mmap;

use super::config::ModelConfig;
use super::linear::{Linear, Weight};
use super::mapped::Mapped;
use super::quantize::{self, DenseType, Quantize, Role};
use super::table::{MappedRows, Table};
use crate::backend::cpu_kernels;
use crate::error::{EngineError, Result};
use crate::files;

/// Reports `(loaded_bytes, total_bytes)` as tensors are read.
pub type Progress<'a> = &'a dyn Fn(u64, u64);

/// How a source stores the weights it reads.
#[derive(Clone, Copy, Debug, Default)]
pub struct WeightPolicy {
    /// Store GGUF-quantized weights dense (exact f32 matmuls instead of quantized kernels).
    pub dequantize: bool,
    /// Quantize dense weights as they are read ([`super::quantize`]).
    pub quantize: Quantize,
    /// Read dense safetensors weights in place from the memory map when the file holds them
    /// in the model's dtype, on CPU ([`super::mapped`]); otherwise they are copied.
    pub mmap: bool,
}

/// Where a model's tensors come from.
pub trait WeightSource {
    /// A dense tensor (norm weights, biases) in `dtype`, shape-checked.
    fn tensor(&mut self, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor>;
    /// A linear layer `[out, inp]`, quantized when the file stores it quantized.
    fn linear(&mut self, name: &str, out: usize, inp: usize, bias: bool, dtype: DType) -> Result<Linear>;
    /// The linear layers of a fused projection (Phi-3's `qkv_proj`, `gate_up_proj`): tensor
    /// `fused` is `[Σ rows, inp]`, and each part `(name, rows)` is its next block of rows, read as
    /// linear `name` would be (quantized as the file stores it, or by the load policy).
    fn linear_parts(&mut self, fused: &str, parts: &[(&str, usize)], inp: usize, bias: bool, dtype: DType)
        -> Result<Vec<Linear>>;
    /// The linear layers stacked in tensor `stacked` of `shape` `[n, rows, inp]` (routed MoE
    /// experts: GGUF's `ffn_gate_exps`, transformers 5's `experts.gate_up_proj`), without biases:
    /// its `n · rows` rows cut into `parts` as [`Self::linear_parts`] cuts a fused projection.
    fn linear_stack(&mut self, stacked: &str, shape: [usize; 3], parts: &[(&str, usize)], dtype: DType) -> Result<Vec<Linear>>;
    /// A matrix `[rows, cols]` that is only looked up by row ([`super::table`]); by default read
    /// as linear `name`'s weight.
    fn lookup_table(&mut self, name: &str, rows: usize, cols: usize, dtype: DType) -> Result<Table> {
        Ok(Table::Linear(self.linear(name, rows, cols, false, dtype)?))
    }
    fn contains(&self, name: &str) -> bool;
    /// Whether norm weights that the model applies as `1 + w` are stored with the 1 added
    /// (llama.cpp's converter adds it for the Gemma families), so they are read as they are.
    fn norms_hold_one_plus(&self) -> bool {
        false
    }

    /// Whether a Gated DeltaNet's decay is stored as `A = −exp(A_log)` (llama.cpp's `ssm_a`,
    /// read as `linear_attn.A`) rather than as `A_log`.
    fn decay_as_a(&self) -> bool {
        false
    }
}

// ---------------------------------------------------------------- entry point

/// A model opened for loading: its configuration, and where its weights and tokenizer are.
pub struct ModelFiles<'a> {
    pub config: ModelConfig,
    pub format: ModelFormat<'a>,
    policy: WeightPolicy,
}

pub enum ModelFormat<'a> {
    /// An HF directory (`config.json`, safetensors, `tokenizer.json`, …).
    HfDir(PathBuf),
    /// A GGUF file, header read (its metadata holds the tokenizer too).
    Gguf(Box<GgufSource<'a>>),
}

/// Opens `path` — an HF model directory or a GGUF file, told apart by what is there — and
/// reads its configuration. Weights are read later, from [`ModelFiles::into_weights`], as
/// `policy` says.
pub fn open<'a>(path: &Path, device: &Device, progress: Progress<'a>, policy: WeightPolicy) -> Result<ModelFiles<'a>> {
    if !path.exists() {
        return Err(EngineError::ModelNotFound(path.display().to_string()));
    }
    if path.is_dir() {
        let cfg_path = path.join("config.json");
        let text = files::read_text(&cfg_path).map_err(|e| EngineError::InvalidModel(format!("{}: {e}", cfg_path.display())))?;
        let config = ModelConfig::from_hf_json(&text)?;
        Ok(ModelFiles { config, format: ModelFormat::HfDir(path.to_path_buf()), policy })
    } else if is_gguf(path) {
        let mut src = GgufSource::open(path, device, Some(progress))?.policy(policy);
        let mut config = ModelConfig::from_gguf(src.metadata())?;
        config.tie_word_embeddings = !src.contains("lm_head");
        if config.arch == super::config::Arch::Gemma4 {
            super::gemma4_config::gguf_values_from_keys(&mut config, |t| src.content().tensor_infos.contains_key(t))?;
        }
        if config.arch == super::config::Arch::Gemma4 && src.contains("rope_freqs") {
            // Gemma 4's full layers: proportional RoPE as per-frequency divisors (1e30 where a
            // pair does not turn), over the full layers' head dimension.
            let factors: Vec<f32> = src.tensor("rope_freqs.weight", &[config.head_dim_full() / 2], DType::F32)?.to_vec1()?;
            if let Some(f) = factors.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
                return Err(EngineError::InvalidModel(format!("rope_freqs holds {f}; factors must be finite and positive")));
            }
            config.rope_scaling = Some(super::rope::RopeScaling::FrequencyFactors { factors });
        }
        if config.family == "phi3" {
            // LongRoPE's factors are tensors in a GGUF file.
            let keys = super::phi3_config::LongRopeKeys::read(src.metadata())?;
            config.rope_scaling = keys.scaling(&mut src, &config)?.or(config.rope_scaling);
        }
        Ok(ModelFiles { config, format: ModelFormat::Gguf(Box::new(src)), policy })
    } else {
        Err(EngineError::InvalidModel(format!("{} is neither a model directory nor a GGUF file", path.display())))
    }
}

impl<'a> ModelFiles<'a> {
    /// The weights: the directory's safetensors (memory-mapped now), or the GGUF file.
    pub fn into_weights(self, device: &Device, progress: Progress<'a>) -> Result<(ModelConfig, Box<dyn WeightSource + 'a>)> {
        let weights: Box<dyn WeightSource + 'a> = match self.format {
            ModelFormat::HfDir(dir) => {
                let mut src = SafetensorsSource::open(&safetensors_files(&dir)?, device, Some(progress), self.policy)?;
                if self.config.text_of_multimodal {
                    src.keep_text_model()?;
                }
                if self.config.arch == super::config::Arch::Lfm2 {
                    src.rename(super::hybrid_config::LFM2_NAMES)?;
                }
                Box::new(src)
            }
            ModelFormat::Gguf(src) => src,
        };
        Ok((self.config, weights))
    }
}

// ---------------------------------------------------------------- safetensors

/// A tensor's place in one of the mapped files.
struct Entry {
    file: usize,
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    /// Byte range of its data in the map.
    start: usize,
    len: usize,
}

pub struct SafetensorsSource<'a> {
    maps: Vec<Arc<Mmap>>,
    entries: HashMap<String, Entry>,
    device: Device,
    policy: WeightPolicy,
    loaded: u64,
    total: u64,
    progress: Option<Progress<'a>>,
}

/// `model.safetensors`, or the shard list of `model.safetensors.index.json`.
pub fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    if !index.is_file() {
        return Err(EngineError::InvalidModel(format!(
            "{} has neither model.safetensors nor model.safetensors.index.json",
            dir.display()
        )));
    }
    let text = files::read_text(&index).map_err(|e| EngineError::invalid_model(index.display(), e))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| EngineError::invalid_model(index.display(), e))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| EngineError::InvalidModel(format!("{} has no weight_map", index.display())))?;
    let mut files: Vec<String> = map.values().filter_map(|f| f.as_str().map(String::from)).collect();
    files.sort();
    files.dedup();
    files
        .into_iter()
        .map(|f| {
            let p = dir.join(&f);
            if p.is_file() {
                Ok(p)
            } else {
                Err(EngineError::InvalidModel(format!("shard {f} listed in the index is missing")))
            }
        })
        .collect()
}

/// The candle dtype of a safetensors float dtype; `None` for the others (no weight is stored so).
fn float_dtype(d: safetensors::Dtype) -> Option<DType> {
    Some(match d {
        safetensors::Dtype::F32 => DType::F32,
        safetensors::Dtype::F16 => DType::F16,
        safetensors::Dtype::BF16 => DType::BF16,
        safetensors::Dtype::F64 => DType::F64,
        _ => return None,
    })
}

impl<'a> SafetensorsSource<'a> {
    pub fn open(files: &[PathBuf], device: &Device, progress: Option<Progress<'a>>, policy: WeightPolicy) -> Result<Self> {
        let mut maps = Vec::with_capacity(files.len());
        let mut entries = HashMap::new();
        for (i, f) in files.iter().enumerate() {
            files::regular_file_len(f).map_err(|e| EngineError::invalid_model(f.display(), e))?;
            let file = File::open(f).map_err(|e| EngineError::invalid_model(f.display(), e))?;
            // SAFETY: the map is private and read-only. A file truncated on disk while mapped
            // faults on access (see `super::mapped`); every tensor's byte range is validated
            // against the map's length by `safetensors` before any access.
            let map = unsafe { Mmap::map(&file) }.map_err(|e| EngineError::invalid_model(f.display(), e))?;
            let st = safetensors::SafeTensors::deserialize(&map).map_err(|e| EngineError::invalid_model(f.display(), e))?;
            for (name, view) in st.tensors() {
                let start = view.data().as_ptr() as usize - map.as_ptr() as usize;
                let entry = Entry { file: i, dtype: view.dtype(), shape: view.shape().to_vec(), start, len: view.data().len() };
                entries.insert(name, entry);
            }
            maps.push(Arc::new(map));
        }
        let total = entries.values().map(|e| e.len as u64).sum();
        Ok(Self { maps, entries, device: device.clone(), policy, loaded: 0, total, progress })
    }

    /// Keeps the text model of a multimodal checkpoint under a text model's names: its tensors
    /// are `language_model.model.*` as transformers 4.50 and 5.x save them, or
    /// `model.language_model.*` as 4.52 to 4.57 do, and `lm_head.*` / `language_model.lm_head.*`
    /// when untied. The vision tower and its projector are dropped (images are not an input).
    pub fn keep_text_model(&mut self) -> Result<()> {
        const NESTED: [(&str, &str); 4] = [
            ("language_model.model.", "model."),
            ("model.language_model.", "model."),
            ("language_model.lm_head.", "lm_head."),
            ("lm_head.", "lm_head."),
        ];
        let mut text = HashMap::new();
        for (name, entry) in std::mem::take(&mut self.entries) {
            let Some(renamed) = NESTED.iter().find_map(|(from, to)| name.strip_prefix(from).map(|rest| format!("{to}{rest}")))
            else {
                continue;
            };
            if text.contains_key(&renamed) {
                return Err(EngineError::InvalidModel(format!(
                    "tensor {renamed} is stored twice (as {name} and under another name)"
                )));
            }
            text.insert(renamed, entry);
        }
        self.total = text.values().map(|e| e.len as u64).sum();
        self.entries = text;
        Ok(())
    }

    /// Renames tensors whose name contains a `from` of `names` to hold its `to` there instead
    /// (a family that names the common modules its own way).
    pub fn rename(&mut self, names: &[(&str, &str)]) -> Result<()> {
        let mut out = HashMap::with_capacity(self.entries.len());
        for (name, entry) in std::mem::take(&mut self.entries) {
            let renamed =
                names.iter().find(|(from, _)| name.contains(from)).map_or(name.clone(), |(f, t)| name.replacen(f, t, 1));
            if out.insert(renamed.clone(), entry).is_some() {
                return Err(EngineError::InvalidModel(format!(
                    "tensor {renamed} is stored twice (as {name} and under another name)"
                )));
            }
        }
        self.entries = out;
        Ok(())
    }

    /// The entry of tensor `name`, its shape checked.
    fn entry(&self, name: &str, shape: &[usize]) -> Result<&Entry> {
        let e = self.entries.get(name).ok_or_else(|| EngineError::InvalidModel(format!("tensor {name} is missing")))?;
        if e.shape != shape {
            return Err(EngineError::InvalidModel(format!("tensor {name} has shape {:?}, expected {shape:?}", e.shape)));
        }
        if float_dtype(e.dtype).is_none() {
            return Err(EngineError::InvalidModel(format!("tensor {name} is {:?}; weights must be f32, f16 or bf16", e.dtype)));
        }
        Ok(e)
    }

    fn bytes(&self, e: &Entry) -> &[u8] {
        &self.maps[e.file][e.start..e.start + e.len]
    }

    fn advance(&mut self, bytes: usize) {
        self.loaded += bytes as u64;
        if let Some(p) = self.progress {
            p(self.loaded, self.total);
        }
    }

    /// The weight of linear `name` (`[out, inp]`), quantized, mapped or copied per the policy,
    /// with the bytes it takes in the file.
    fn weight(&self, name: &str, out: usize, inp: usize, dtype: DType) -> Result<(Weight, usize)> {
        let wname = format!("{name}.weight");
        let e = self.entry(&wname, &[out, inp])?;
        let w = self.weight_of(name, &wname, e, dtype);
        self.release(e);
        Ok((w?, e.len))
    }

    /// The weight held by entry `e` (`[out, inp]`, all or part of tensor `wname`), read as linear
    /// `name`'s.
    fn weight_of(&self, name: &str, wname: &str, e: &Entry, dtype: DType) -> Result<Weight> {
        let (out, inp) = (e.shape[0], e.shape[1]);
        let file_dtype = float_dtype(e.dtype).unwrap_or(DType::F64);
        if let Some(format) = self.policy.quantize.format(Role::of(name), inp) {
            let dense = DenseType::of_safetensors(e.dtype)
                .ok_or_else(|| EngineError::InvalidModel(format!("tensor {wname}: f64 weights cannot be quantized on load")))?;
            return quantize::quantize_bytes(self.bytes(e), dense, (out, inp), format, wname, &self.device);
        }
        if self.policy.mmap && cpu_kernels(&self.device) && file_dtype == dtype {
            if let Some(m) = Mapped::new(self.maps[e.file].clone(), e.start, out, inp, dtype) {
                return Ok(Weight::Mapped(m));
            }
        }
        Ok(Weight::Dense(self.copy(wname, e, dtype)?))
    }

    /// Drops `e`'s pages of the map from the process's resident memory once its data has
    /// been copied or quantized, so a load that does not keep the map's pages peaks near
    /// the size of what it keeps, not that plus the file. The pages stay in the page cache.
    fn release(&self, e: &Entry) {
        #[cfg(unix)]
        // SAFETY: the map is private, read-only and unmodified: a dropped page that is touched
        // again is read back from the file, unchanged. A failure only leaves pages resident.
        let _ = unsafe { self.maps[e.file].unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, e.start, e.len) };
        #[cfg(not(unix))]
        let _ = e;
    }

    /// Tensor `wname` of `shape` (its last dimension the input size) read as the consecutive
    /// row blocks `parts`, each as linear `name` would be (a part is a byte range of the tensor).
    fn cut_rows(&mut self, wname: &str, shape: &[usize], parts: &[(&str, usize)], dtype: DType) -> Result<Vec<Result<Weight>>> {
        let (&inp, lead) = shape.split_last().ok_or_else(|| EngineError::Internal(format!("{wname}: no shape")))?;
        let total: usize = lead.iter().product();
        let e = self.entry(wname, shape)?;
        let row_bytes = e.len / total.max(1);
        let mut weights = Vec::with_capacity(parts.len());
        let mut row = 0;
        for &(name, rows) in parts {
            let part = Entry { shape: vec![rows, inp], start: e.start + row * row_bytes, len: rows * row_bytes, ..*e };
            weights.push(self.weight_of(name, wname, &part, dtype));
            row += rows;
        }
        self.release(e);
        let len = e.len;
        self.advance(len);
        Ok(weights)
    }

    fn copy(&self, name: &str, e: &Entry, dtype: DType) -> Result<Tensor> {
        let file_dtype = float_dtype(e.dtype).unwrap_or(DType::F64);
        Tensor::from_raw_buffer(self.bytes(e), file_dtype, &e.shape, &self.device)
            .and_then(|t| t.to_dtype(dtype))
            .map_err(|err| EngineError::invalid_model(format!("tensor {name}"), err))
    }
}

impl WeightSource for SafetensorsSource<'_> {
    fn tensor(&mut self, name: &str, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let e = self.entry(name, shape)?;
        let (t, len) = (self.copy(name, e, dtype), e.len);
        self.release(e);
        self.advance(len);
        let t = t?;
        Ok(t)
    }

    fn linear(&mut self, name: &str, out: usize, inp: usize, bias: bool, dtype: DType) -> Result<Linear> {
        let (weight, len) = self.weight(name, out, inp, dtype)?;
        self.advance(len);
        let bias = if bias { Some(self.tensor(&format!("{name}.bias"), &[out], dtype)?) } else { None };
        Ok(Linear { weight, bias, out_features: out, in_features: inp })
    }

    fn linear_parts(
        &mut self,
        fused: &str,
        parts: &[(&str, usize)],
        inp: usize,
        bias: bool,
        dtype: DType,
    ) -> Result<Vec<Linear>> {
        let wname = format!("{fused}.weight");
        let total = parts.iter().map(|p| p.1).sum::<usize>();
        let weights = self.cut_rows(&wname, &[total, inp], parts, dtype)?;
        let bias = if bias { Some(self.tensor(&format!("{fused}.bias"), &[total], dtype)?) } else { None };
        split_linears(weights, parts, inp, bias)
    }

    fn linear_stack(&mut self, stacked: &str, shape: [usize; 3], parts: &[(&str, usize)], dtype: DType) -> Result<Vec<Linear>> {
        check_stack(stacked, shape, parts)?;
        // transformers' stacked parameters have no `.weight` suffix.
        let weights = self.cut_rows(stacked, &shape, parts, dtype)?;
        split_linears(weights, parts, shape[2], None)
    }

    /// Read in place from the map in the file's float dtype where the policy maps weights on the
    /// CPU (whatever the model's dtype: a lookup needs no kernel), else as a linear weight.
    fn lookup_table(&mut self, name: &str, rows: usize, cols: usize, dtype: DType) -> Result<Table> {
        if self.policy.mmap && cpu_kernels(&self.device) {
            let e = self.entry(&format!("{name}.weight"), &[rows, cols])?;
            let mapped = float_dtype(e.dtype).and_then(|d| MappedRows::new(self.maps[e.file].clone(), e.start, rows, cols, d));
            if let Some(m) = mapped {
                let len = e.len;
                self.advance(len);
                return Ok(Table::Mapped(m));
            }
        }
        Ok(Table::Linear(self.linear(name, rows, cols, false, dtype)?))
    }

    /// Whether tensor `name`, or a module's weight `{name}.weight`, is there.
    fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name) || self.entries.contains_key(&format!("{name}.weight"))
    }
}

/// A stack's parts must cover its rows exactly (an internal invariant of the callers).
pub(super) fn check_stack(stacked: &str, shape: [usize; 3], parts: &[(&str, usize)]) -> Result<()> {
    let rows = parts.iter().map(|p| p.1).sum::<usize>();
    if shape[0].checked_mul(shape[1]) != Some(rows) {
        return Err(EngineError::Internal(format!("{stacked}: parts of {rows} rows for a stack of {shape:?}")));
    }
    Ok(())
}

/// The linears of a fused projection from their weights and the fused bias (cut the same way).
pub(super) fn split_linears(
    weights: Vec<Result<Weight>>,
    parts: &[(&str, usize)],
    inp: usize,
    bias: Option<Tensor>,
) -> Result<Vec<Linear>> {
    let mut row = 0;
    let mut out = Vec::with_capacity(parts.len());
    for (w, &(_, rows)) in weights.into_iter().zip(parts) {
        let bias = bias.as_ref().map(|b| b.narrow(0, row, rows)?.contiguous()).transpose()?;
        out.push(Linear { weight: w?, bias, out_features: rows, in_features: inp });
        row += rows;
    }
    Ok(out)
}

// ---------------------------------------------------------------- GGUF

pub use super::gguf_source::{gguf_tensor_bytes, gguf_tensor_extent, is_gguf, read_gguf_header, GgufSource};

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{gguf_file, GgmlDType};
    use candle_core::Shape;

    /// A GGUF v3 header with no tensors and one `U32` metadata entry.
    fn header_with_u32(key: &str, value: u32) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        for n in [3u32.to_le_bytes().as_slice(), &0u64.to_le_bytes(), &1u64.to_le_bytes()] {
            b.extend_from_slice(n);
        }
        b.extend_from_slice(&(key.len() as u64).to_le_bytes());
        b.extend_from_slice(key.as_bytes());
        b.extend_from_slice(&4u32.to_le_bytes()); // GGUF_TYPE_UINT32
        b.extend_from_slice(&value.to_le_bytes());
        b
    }

    #[test]
    fn a_header_that_panics_candle_is_an_invalid_model() {
        // fuzz/corpus/gguf/regress-alignment-zero.gguf: candle divides by general.alignment.
        let e = read_gguf_header(&mut std::io::Cursor::new(header_with_u32("general.alignment", 0)), "x.gguf").unwrap_err();
        assert!(matches!(&e, EngineError::InvalidModel(m) if m.starts_with("GGUF header of x.gguf")), "{e:?}");
        let c = read_gguf_header(&mut std::io::Cursor::new(header_with_u32("general.alignment", 64)), "x.gguf").unwrap();
        assert_eq!(c.tensor_data_offset % 64, 0);
    }

    #[test]
    fn tensor_sizes_and_offsets_from_the_file_are_checked() {
        let info = |dims: Vec<usize>, ggml_dtype, offset| gguf_file::TensorInfo { shape: Shape::from(dims), ggml_dtype, offset };
        assert_eq!(gguf_tensor_bytes(&info(vec![2, 64], GgmlDType::Q8_0, 0)), Some(2 * 2 * 34));
        // Element counts that overflow (candle's elem_count would panic or wrap), and ones that
        // are not whole blocks.
        assert_eq!(gguf_tensor_bytes(&info(vec![1 << 40, 1 << 40], GgmlDType::F32, 0)), None);
        assert_eq!(gguf_tensor_bytes(&info(vec![1 << 62], GgmlDType::F32, 0)), None);
        assert_eq!(gguf_tensor_bytes(&info(vec![2, 16], GgmlDType::Q8_0, 0)), Some(34));
        assert_eq!(gguf_tensor_bytes(&info(vec![3], GgmlDType::Q8_0, 0)), None);

        let mut content = read_gguf_header(&mut std::io::Cursor::new(header_with_u32("general.alignment", 32)), "x").unwrap();
        for (name, t) in [
            ("ok", info(vec![4], GgmlDType::F32, 0)),
            ("huge", info(vec![1 << 40, 1 << 40], GgmlDType::F32, 0)),
            ("past_end", info(vec![4], GgmlDType::F32, 1000)),
            ("wraps", info(vec![4], GgmlDType::F32, u64::MAX - 8)),
            // fuzz/corpus/gguf/regress-empty-tensor.gguf: candle's read of an empty tensor made
            // a slice from a dangling u8 pointer cast to f16 blocks (misaligned: UB, an abort
            // with debug assertions).
            ("empty", info(vec![0, 64], GgmlDType::F16, 0)),
        ] {
            content.tensor_infos.insert(name.into(), t);
        }
        let file_len = content.tensor_data_offset + 16;
        assert_eq!(gguf_tensor_extent(&content, "ok", file_len).unwrap(), (content.tensor_data_offset, 16));
        for name in ["huge", "past_end", "wraps", "empty", "missing"] {
            let e = gguf_tensor_extent(&content, name, file_len).unwrap_err();
            assert_eq!(e.code(), "INVALID_MODEL", "{name}: {e}");
        }
    }
}
