//! PEFT's on-disk format: `adapter_config.json` and `adapter_model.safetensors` as
//! `save_pretrained` writes them, and PEFT's rules for which modules an adapter targets
//! (`target_modules` as a list or a regex, `exclude_modules`, `layers_to_transform`,
//! `rank_pattern` / `alpha_pattern`, IA³ `feedforward_modules`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use memmap2::Mmap;
use serde_json::Value;

use super::{Proj, Slot};
use crate::model::adapt::Fused;

use super::st_header::read_header;
use crate::error::{EngineError, Result};
use crate::model::mapped::Mapped;
use crate::model::quantize::{widen_into, DenseType};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeftType {
    Lora,
    Ia3,
    Lokr,
    PromptTuning,
}

/// PEFT's module selectors: a list of names (a module matches its full path or a dotted
/// suffix of it), a regex string (full match of the path), or `all-linear`.
#[derive(Clone, Debug)]
pub enum Modules {
    List(Vec<String>),
    Regex(regex::Regex),
    AllLinear,
}

impl Modules {
    fn parse(v: &Value, field: &str) -> Result<Option<Self>> {
        Ok(match v {
            Value::Null => None,
            Value::String(s) if s == "all-linear" => Some(Self::AllLinear),
            Value::String(s) => {
                Some(Self::Regex(regex::Regex::new(&format!("^(?:{s})$")).map_err(|e| {
                    EngineError::InvalidAdapter(format!("adapter_config.json: {field} is not a valid regex: {e}"))
                })?))
            }
            Value::Array(items) => Some(Self::List(
                items
                    .iter()
                    .map(|i| i.as_str().map(String::from))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| EngineError::InvalidAdapter(format!("adapter_config.json: {field} must list strings")))?,
            )),
            _ => return Err(EngineError::InvalidAdapter(format!("adapter_config.json: {field} must be a list or a string"))),
        })
    }

    /// Whether the module at `path` (`model.layers.0.self_attn.q_proj`) is selected.
    pub fn matches(&self, path: &str) -> bool {
        match self {
            Self::AllLinear => true,
            Self::Regex(r) => r.is_match(path),
            Self::List(names) => {
                names.iter().any(|n| path.strip_suffix(n.as_str()).is_some_and(|rest| rest.is_empty() || rest.ends_with('.')))
            }
        }
    }

    /// Names in a list that are modules of these models but not adaptable here
    /// (`embed_tokens`, `lm_head`).
    pub fn unadaptable_names(&self) -> Vec<String> {
        match self {
            Self::List(names) => names
                .iter()
                .filter(|n| matches!(n.rsplit('.').next().unwrap_or(n), "embed_tokens" | "lm_head"))
                .cloned()
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// The fields of `adapter_config.json` the runtime acts on.
#[derive(Debug)]
pub struct AdapterConfig {
    pub peft_type: PeftType,
    pub r: usize,
    pub alpha: f64,
    pub use_rslora: bool,
    pub use_dora: bool,
    pub rank_pattern: Vec<(regex::Regex, String, usize)>,
    pub alpha_pattern: Vec<(regex::Regex, String, f64)>,
    pub target_modules: Option<Modules>,
    pub exclude_modules: Option<Modules>,
    pub layers_to_transform: Option<Vec<usize>>,
    pub feedforward_modules: Option<Modules>,
    pub num_virtual_tokens: usize,
    pub num_transformer_submodules: usize,
    /// `base_model_class` from PEFT's `auto_mapping`, e.g. `Qwen3ForCausalLM`.
    pub base_model_class: Option<String>,
    /// `base_model_name_or_path`: the model the adapter was trained on, as PEFT recorded it.
    pub base_model: Option<String>,
    /// What the decoder layers' module paths start with in the model PEFT wrapped: one of
    /// [`LAYER_PREFIXES`], read from the tensor names ([`AdapterConfig::set_layer_prefix`]).
    /// `target_modules` regexes and the patterns are matched against those paths.
    pub layer_prefix: &'static str,
    /// The projections the model stores fused: the adapter names them by the fused module
    /// (`qkv_proj`, `gate_up_proj`), as PEFT saw them (set from the model at load).
    pub fused: Fused,
}

/// Where the decoder layers live in the models PEFT wraps: `model.layers.*` in a text model;
/// a multimodal checkpoint's language model nests them (`model.language_model.layers.*` under
/// transformers 4.52 and later, `language_model.model.layers.*` before).
pub const LAYER_PREFIXES: [&str; 3] = ["model.language_model.layers.", "language_model.model.layers.", "model.layers."];

/// The tensors of a multimodal model's vision (and Gemma 4's audio) tower and projectors: an
/// adapter trained on the whole model has them (PEFT matches `q_proj` there too). Images and
/// audio are not inputs of the runtime, so they never change an output: they are counted and
/// not loaded.
pub fn is_vision_tensor(key: &str) -> bool {
    let rest = key.strip_prefix("base_model.model.").unwrap_or(key);
    let rest = rest.strip_prefix("model.").unwrap_or(rest);
    const TOWERS: [&str; 6] =
        ["vision_tower.", "multi_modal_projector.", "audio_tower.", "embed_vision.", "embed_audio.", "vision_model."];
    TOWERS.iter().any(|t| rest.starts_with(t))
}

/// PEFT's `get_pattern_key`: a pattern applies to a module whose path ends with it after a dot.
fn pattern_regex(key: &str) -> Result<regex::Regex> {
    regex::Regex::new(&format!(r"^(?:.*\.)?(?:{key})$"))
        .map_err(|e| EngineError::InvalidAdapter(format!("adapter_config.json: pattern '{key}' is not a valid regex: {e}")))
}

fn peft_type(v: &Value) -> Result<PeftType> {
    match v.get("peft_type").and_then(Value::as_str) {
        Some("LORA") => Ok(PeftType::Lora),
        Some("IA3") => Ok(PeftType::Ia3),
        Some("LOKR") => Ok(PeftType::Lokr),
        Some("PROMPT_TUNING") => Ok(PeftType::PromptTuning),
        Some(other) => Err(EngineError::UnsupportedAdapter(format!(
            "peft_type {other} (supported: LORA (incl. rsLoRA and DoRA), IA3, LOKR, PROMPT_TUNING)"
        ))),
        None => Err(EngineError::InvalidAdapter("adapter_config.json has no peft_type".into())),
    }
}

/// Features whose tensors or semantics the runtime does not implement.
fn refuse_unsupported(v: &Value, peft_type: PeftType) -> Result<()> {
    let non_empty = |k: &str| v.get(k).is_some_and(|x| !x.is_null() && x != &Value::Array(vec![]) && x != &Value::Bool(false));
    if non_empty("modules_to_save") {
        return Err(EngineError::UnsupportedAdapter("modules_to_save (fully trained copies of base modules)".into()));
    }
    if let Some(t) = v.get("target_parameters").filter(|_| non_empty("target_parameters")) {
        let mut shown = t.to_string();
        shown.truncate(shown.char_indices().nth(120).map_or(shown.len(), |(i, _)| i));
        return Err(EngineError::UnsupportedAdapter(format!(
            "target_parameters {shown}: adapters on parameters (such as a routed FFN's MoE expert weights) are not \
             supported; only the linear projections of decoder layers can be adapted"
        )));
    }
    if peft_type == PeftType::Lora {
        if v.get("bias").and_then(Value::as_str).is_some_and(|b| b != "none") {
            return Err(EngineError::UnsupportedAdapter("LoRA with trained biases (bias != \"none\")".into()));
        }
        for k in ["lora_bias", "layer_replication", "trainable_token_indices"] {
            if non_empty(k) {
                return Err(EngineError::UnsupportedAdapter(format!("LoRA option {k}")));
            }
        }
    }
    Ok(())
}

/// `{ pattern: number }` maps (`rank_pattern`, `alpha_pattern`).
fn patterns(v: &Value, k: &str) -> Result<Vec<(regex::Regex, String, f64)>> {
    let Some(obj) = v.get(k).and_then(Value::as_object) else { return Ok(Vec::new()) };
    obj.iter()
        .map(|(key, val)| {
            let x = val
                .as_f64()
                .ok_or_else(|| EngineError::InvalidAdapter(format!("adapter_config.json: {k}.{key} must be a number")))?;
            Ok((pattern_regex(key)?, key.clone(), x))
        })
        .collect()
}

fn layers_to_transform(v: &Value) -> Result<Option<Vec<usize>>> {
    Ok(match v.get("layers_to_transform") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => Some(vec![n.as_u64().unwrap_or(u64::MAX) as usize]),
        Some(Value::Array(a)) => {
            Some(a.iter().map(|x| x.as_u64().map(|n| n as usize)).collect::<Option<Vec<_>>>().ok_or_else(|| {
                EngineError::InvalidAdapter("adapter_config.json: layers_to_transform must list integers".into())
            })?)
        }
        Some(_) => {
            return Err(EngineError::InvalidAdapter(
                "adapter_config.json: layers_to_transform must be an integer or a list".into(),
            ))
        }
    })
}

impl AdapterConfig {
    pub fn parse(text: &str) -> Result<Self> {
        let v: Value = serde_json::from_str(text).map_err(|e| EngineError::invalid_adapter("adapter_config.json", e))?;
        let peft_type = peft_type(&v)?;
        let num = |k: &str| v.get(k).and_then(Value::as_f64);
        let flag = |k: &str| v.get(k).and_then(Value::as_bool).unwrap_or(false);
        let r_raw = num("r").unwrap_or(8.0);
        if matches!(peft_type, PeftType::Lora | PeftType::Lokr) && (r_raw < 1.0 || r_raw.fract() != 0.0) {
            return Err(EngineError::InvalidAdapter(format!("adapter_config.json: r must be a positive integer, got {r_raw}")));
        }
        let alpha = num(if peft_type == PeftType::Lokr { "alpha" } else { "lora_alpha" }).unwrap_or(8.0);
        refuse_unsupported(&v, peft_type)?;
        let rank_pattern = patterns(&v, "rank_pattern")?
            .into_iter()
            .map(|(re, k, x)| {
                if x < 1.0 || x.fract() != 0.0 {
                    return Err(EngineError::InvalidAdapter(format!(
                        "adapter_config.json: rank_pattern.{k} must be a positive integer"
                    )));
                }
                Ok((re, k, x as usize))
            })
            .collect::<Result<_>>()?;
        let modules = |k: &str| Modules::parse(v.get(k).unwrap_or(&Value::Null), k);
        Ok(Self {
            peft_type,
            r: r_raw as usize,
            alpha,
            use_rslora: flag("use_rslora"),
            use_dora: flag("use_dora"),
            rank_pattern,
            alpha_pattern: patterns(&v, "alpha_pattern")?,
            target_modules: modules("target_modules")?,
            exclude_modules: modules("exclude_modules")?,
            layers_to_transform: layers_to_transform(&v)?,
            feedforward_modules: modules("feedforward_modules")?,
            num_virtual_tokens: num("num_virtual_tokens").unwrap_or(0.0) as usize,
            num_transformer_submodules: num("num_transformer_submodules").unwrap_or(1.0) as usize,
            base_model_class: v.pointer("/auto_mapping/base_model_class").and_then(Value::as_str).map(String::from),
            base_model: v.get("base_model_name_or_path").and_then(Value::as_str).map(|s| s.chars().take(200).collect()),
            layer_prefix: "model.layers.",
            fused: Fused::default(),
        })
    }

    /// Reads the layers' path prefix from the adapter's tensor names; names that disagree
    /// (two models' tensors in one file) are an error.
    pub fn set_layer_prefix<'k>(&mut self, keys: impl Iterator<Item = &'k String>) -> Result<()> {
        let mut found: Option<&'static str> = None;
        for key in keys {
            let rest = key.strip_prefix("base_model.model.").unwrap_or(key);
            let Some(p) = LAYER_PREFIXES.iter().find(|p| rest.starts_with(**p)) else { continue };
            match found {
                Some(f) if f != *p => {
                    return Err(EngineError::InvalidAdapter(format!(
                        "tensor {key}: the adapter's tensors name the decoder layers both {f}* and {p}*"
                    )))
                }
                _ => found = Some(p),
            }
        }
        self.layer_prefix = found.unwrap_or("model.layers.");
        Ok(())
    }

    /// The module path of `slot` in the model the adapter was trained on.
    pub fn path(&self, slot: Slot) -> String {
        format!("{}{}.{}.{}", self.layer_prefix, slot.layer, slot.proj.block(), self.fused.module_name(slot.proj))
    }

    /// Whether PEFT would wrap the module at `slot`.
    pub fn targets(&self, slot: Slot) -> bool {
        let path = self.path(slot);
        let Some(t) = &self.target_modules else { return false };
        if !t.matches(&path) {
            return false;
        }
        if self.exclude_modules.as_ref().is_some_and(|e| e.matches(&path)) {
            return false;
        }
        self.layers_to_transform.as_ref().is_none_or(|ls| ls.contains(&slot.layer))
    }

    /// `(r, alpha)` for a module, after `rank_pattern` / `alpha_pattern` (first match wins).
    pub fn rank_alpha(&self, slot: Slot) -> (usize, f64) {
        if self.rank_pattern.is_empty() && self.alpha_pattern.is_empty() {
            return (self.r, self.alpha);
        }
        let path = self.path(slot);
        let r = self.rank_pattern.iter().find(|(re, _, _)| re.is_match(&path)).map_or(self.r, |p| p.2);
        let alpha = self.alpha_pattern.iter().find(|(re, _, _)| re.is_match(&path)).map_or(self.alpha, |p| p.2);
        (r, alpha)
    }

    /// IA³: whether the module scales its input (feed-forward) rather than its output.
    pub fn is_feedforward(&self, slot: Slot) -> bool {
        self.feedforward_modules.as_ref().is_some_and(|f| f.matches(&self.path(slot)))
    }
}

/// A tensor of the adapter file: its shape and where its bytes lie in the file's map. Its
/// values are read when asked for ([`RawTensor::values`], [`RawTensor::to_tensor`]) or used in
/// place ([`RawTensor::mapped`]); the header was validated when the file was parsed.
#[derive(Clone)]
pub struct RawTensor {
    pub shape: Vec<usize>,
    name: String,
    dtype: safetensors::Dtype,
    map: Arc<Mmap>,
    /// Byte offset of the data in `map`.
    offset: usize,
    len: usize,
}

impl RawTensor {
    fn bytes(&self) -> &[u8] {
        &self.map[self.offset..self.offset + self.len]
    }

    /// Rows `start..start + rows` of a tensor of two dimensions or one (a fused module's factor
    /// cut for one of its parts); `None` when the tensor has fewer rows.
    pub fn rows(&self, start: usize, rows: usize) -> Option<RawTensor> {
        let total = *self.shape.first()?;
        if start.checked_add(rows)? > total || self.shape.len() > 2 {
            return None;
        }
        let row_bytes = self.len / total.max(1);
        let mut shape = self.shape.clone();
        shape[0] = rows;
        Some(RawTensor { shape, offset: self.offset + start * row_bytes, len: rows * row_bytes, ..self.clone() })
    }

    /// Whether [`Self::mapped`] can read it in place (f32 or f16).
    pub fn is_mappable(&self) -> bool {
        matches!(self.dtype, safetensors::Dtype::F32 | safetensors::Dtype::F16)
    }

    /// The values widened to f32 (a plain copy for F32); a non-finite value is an error.
    pub fn values(&self) -> Result<Vec<f32>> {
        let data = widen(&self.name, self.dtype, self.bytes())?;
        if let Some(bad) = data.iter().position(|x| !x.is_finite()) {
            return Err(self.non_finite(bad));
        }
        Ok(data)
    }

    fn non_finite(&self, at: usize) -> EngineError {
        EngineError::InvalidAdapter(format!("tensor {} holds a non-finite value at element {at}", self.name))
    }

    pub fn to_tensor(&self, dtype: DType, device: &Device) -> Result<Tensor> {
        let shape = self.shape.as_slice();
        match (dtype, DenseType::of_safetensors(self.dtype)) {
            (DType::BF16, Some(src)) => Ok(Tensor::from_vec(self.narrowed(src, half::bf16::from_f32)?, shape, device)?),
            (DType::F16, Some(src)) => Ok(Tensor::from_vec(self.narrowed(src, half::f16::from_f32)?, shape, device)?),
            _ => Ok(Tensor::from_vec(self.values()?, shape, device)?.to_dtype(dtype)?),
        }
    }

    /// The values converted by `f` from `src` (this tensor's dense type), in parallel chunks on
    /// the thread pool, without an f32 copy of the whole tensor; a non-finite value is an error
    /// (the first one is named, as [`Self::values`] does).
    fn narrowed<T: Copy + Default + Send>(&self, src: DenseType, f: fn(f32) -> T) -> Result<Vec<T>> {
        use rayon::prelude::*;
        const CHUNK: usize = 1 << 14;
        let bytes = self.bytes();
        let size = src.size();
        let mut out = vec![T::default(); bytes.len() / size];
        let bad = out
            .par_chunks_mut(CHUNK)
            .enumerate()
            .filter_map(|(i, o)| {
                let mut wide = vec![0f32; o.len()];
                widen_into(src, &bytes[i * CHUNK * size..][..o.len() * size], &mut wide);
                if let Some(k) = wide.iter().position(|x| !x.is_finite()) {
                    return Some(i * CHUNK + k);
                }
                o.iter_mut().zip(&wide).for_each(|(d, &x)| *d = f(x));
                None
            })
            .min();
        match bad {
            Some(at) => Err(self.non_finite(at)),
            None => Ok(out),
        }
    }

    /// The 2-D f32 or f16 tensor read in place from the map (no copy, values not read); `None`
    /// for another dtype or rank, or data not aligned for its type.
    pub fn mapped(&self) -> Option<Mapped> {
        let &[n, k] = self.shape.as_slice() else { return None };
        let dtype = match self.dtype {
            safetensors::Dtype::F32 => DType::F32,
            safetensors::Dtype::F16 => DType::F16,
            _ => return None,
        };
        Mapped::new(self.map.clone(), self.offset, n, k, dtype)
    }
}

/// Widens one tensor's little-endian bytes to f32 (a plain copy for F32).
fn widen(name: &str, dtype: safetensors::Dtype, bytes: &[u8]) -> Result<Vec<f32>> {
    if let Some(dense) = DenseType::of_safetensors(dtype) {
        let mut v = vec![0f32; bytes.len() / dense.size()];
        widen_into(dense, bytes, &mut v);
        return Ok(v);
    }
    match dtype {
        safetensors::Dtype::F64 => {
            Ok(bytes.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().expect("8-byte chunk")) as f32).collect())
        }
        other => Err(EngineError::InvalidAdapter(format!("tensor {name} has dtype {other:?}; expected a float type"))),
    }
}

/// Every tensor of a safetensors file, keyed by name: the header is parsed and checked (every
/// tensor's byte range inside the file, a float dtype); no value is read.
pub fn read_safetensors(path: &Path) -> Result<HashMap<String, RawTensor>> {
    crate::files::regular_file_len(path).map_err(|e| EngineError::invalid_adapter(path.display(), e))?;
    let file = std::fs::File::open(path).map_err(|e| EngineError::invalid_adapter(path.display(), e))?;
    // SAFETY: a private read-only map, held by every tensor cut from it. `safetensors` checks
    // the header and every tensor's byte range against the map's length before any access. A
    // file truncated on disk while mapped faults on the next read of a lost page (documented
    // with `LoadExpertOptions.mmap`, whose `false` copies the file instead).
    let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| EngineError::invalid_adapter(path.display(), e))?;
    let len = mmap.len();
    parse_prefix(Arc::new(mmap), len, &path.display().to_string())
}

/// [`read_safetensors`] on bytes in memory (copied once into an anonymous map).
pub fn parse_safetensors(bytes: &[u8], origin: &str) -> Result<HashMap<String, RawTensor>> {
    let mut map = memmap2::MmapMut::map_anon(bytes.len().max(1)).map_err(|e| EngineError::invalid_adapter(origin, e))?;
    map[..bytes.len()].copy_from_slice(bytes);
    let map = map.make_read_only().map_err(|e| EngineError::invalid_adapter(origin, e))?;
    // The map is never empty, so it may be a byte longer than `bytes`: parse `bytes` only.
    parse_prefix(Arc::new(map), bytes.len(), origin)
}

/// The tensors of the safetensors file in the first `len` bytes of `map`.
fn parse_prefix(map: Arc<Mmap>, len: usize, origin: &str) -> Result<HashMap<String, RawTensor>> {
    let header = read_header(&map[..len]).map_err(|e| EngineError::invalid_adapter(origin, e))?;
    let mut tensors = HashMap::with_capacity(header.tensors.len());
    for (name, info) in header.tensors {
        let dtype = info.dtype;
        if DenseType::of_safetensors(dtype).is_none() && dtype != safetensors::Dtype::F64 {
            return Err(EngineError::InvalidAdapter(format!("tensor {name} has dtype {dtype:?}; expected a float type")));
        }
        // Validated: the range lies inside the data section, which ends at `len`.
        let (start, end) = info.data_offsets;
        let t = RawTensor {
            shape: info.shape,
            name: name.clone(),
            dtype,
            map: map.clone(),
            offset: header.data_start + start,
            len: end - start,
        };
        tensors.insert(name, t);
    }
    Ok(tensors)
}

/// Splits `base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight` into its module
/// and the parameter name (`lora_A.weight`); the layers may be nested as in a multimodal model
/// ([`LAYER_PREFIXES`]). `None` for anything that is not a parameter of a
/// decoder-layer projection.
pub fn parse_key(key: &str) -> Option<(Slot, &str)> {
    let (layer, parts, param) = parse_module_key(key, Fused::default())?;
    Some((Slot::new(layer, parts[0]), param))
}

/// [`parse_key`] on a model whose checkpoint stores some projections `fused`: the layer, the
/// projections the module holds (in row order: several for `qkv_proj` or `gate_up_proj`) and
/// the parameter name.
pub fn parse_module_key(key: &str, fused: Fused) -> Option<(usize, &'static [Proj], &str)> {
    let rest = key.strip_prefix("base_model.model.").unwrap_or(key);
    let rest = LAYER_PREFIXES.iter().find_map(|p| rest.strip_prefix(p))?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (block, rest) = rest.split_once('.')?;
    let (module, param) = rest.split_once('.')?;
    let parts = fused.parts(module);
    if parts.first()?.block() != block {
        return None;
    }
    Some((layer, parts, param))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A safetensors file of one f32 tensor `w` of `values`.
    fn one_tensor(values: &[f32]) -> HashMap<String, RawTensor> {
        let header = format!(r#"{{"w":{{"dtype":"F32","shape":[{}],"data_offsets":[0,{}]}}}}"#, values.len(), 4 * values.len());
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        values.iter().for_each(|v| bytes.extend_from_slice(&v.to_le_bytes()));
        parse_safetensors(&bytes, "test").unwrap()
    }

    #[test]
    fn half_precision_tensors_convert_in_chunks_as_candle_does() {
        let n = 3 * (1 << 14) + 5;
        let values: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 * 0.013 - 6.5).collect();
        let file = one_tensor(&values);
        let reference = Tensor::new(values.as_slice(), &Device::Cpu).unwrap();
        for dtype in [DType::BF16, DType::F16] {
            let ours = file["w"].to_tensor(dtype, &Device::Cpu).unwrap();
            assert_eq!(ours.dtype(), dtype);
            let want = reference.to_dtype(dtype).unwrap().to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(ours.to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap(), want);
        }
        // The first non-finite value is named, whichever chunk finishes first.
        let mut bad = values.clone();
        bad[2 * (1 << 14) + 3] = f32::INFINITY;
        bad[(1 << 14) + 1] = f32::NAN;
        let e = one_tensor(&bad)["w"].to_tensor(DType::BF16, &Device::Cpu).unwrap_err();
        assert!(e.to_string().contains(&format!("non-finite value at element {}", (1 << 14) + 1)), "{e}");
    }

    #[test]
    fn keys_and_targets_follow_peft() {
        let (slot, p) = parse_key("base_model.model.model.layers.12.mlp.down_proj.lora_B.weight").unwrap();
        assert_eq!((slot.layer, slot.proj, p), (12, Proj::Down, "lora_B.weight"));
        assert!(parse_key("base_model.model.model.layers.1.mlp.q_proj.lora_A.weight").is_none());
        assert!(parse_key("base_model.model.lm_head.lora_A.weight").is_none());

        let cfg = AdapterConfig::parse(
            r#"{"peft_type":"LORA","r":8,"lora_alpha":16,"target_modules":".*\\.(q_proj|up_proj)",
                "layers_to_transform":[0,2],"rank_pattern":{"up_proj":4},"alpha_pattern":{"model.layers.2.self_attn.q_proj":2}}"#,
        )
        .unwrap();
        assert!(cfg.targets(Slot::new(0, Proj::Q)) && cfg.targets(Slot::new(2, Proj::Up)));
        assert!(!cfg.targets(Slot::new(1, Proj::Q)) && !cfg.targets(Slot::new(0, Proj::K)));
        assert_eq!(cfg.rank_alpha(Slot::new(0, Proj::Up)), (4, 16.0));
        assert_eq!(cfg.rank_alpha(Slot::new(2, Proj::Q)), (8, 2.0));
        assert_eq!(cfg.rank_alpha(Slot::new(0, Proj::Q)), (8, 16.0));

        let list = AdapterConfig::parse(
            r#"{"peft_type":"IA3","target_modules":["k_proj","mlp.down_proj"],"feedforward_modules":["down_proj"]}"#,
        )
        .unwrap();
        assert!(
            list.targets(Slot::new(1, Proj::K)) && list.targets(Slot::new(1, Proj::Down)) && !list.targets(Slot::new(1, Proj::V))
        );
        assert!(list.is_feedforward(Slot::new(0, Proj::Down)) && !list.is_feedforward(Slot::new(0, Proj::K)));

        let e = AdapterConfig::parse(r#"{"peft_type":"LOHA","r":4}"#).unwrap_err();
        assert_eq!(e.code(), "UNSUPPORTED_ADAPTER");
        assert!(e.to_string().contains("LOHA"));
        assert_eq!(AdapterConfig::parse(r#"{"peft_type":"LORA","r":0}"#).unwrap_err().code(), "INVALID_ADAPTER");
        assert_eq!(AdapterConfig::parse("{not json").unwrap_err().code(), "INVALID_ADAPTER");
    }

    /// An adapter trained on a multimodal model names the nested language model's layers, and
    /// its regexes match those paths; its vision-tower tensors are told apart.
    #[test]
    fn nested_language_model_paths() {
        let key = |s: &str| format!("base_model.model.{s}.layers.3.self_attn.v_proj.lora_A.weight");
        for nested in ["model.language_model", "language_model.model"] {
            let k = key(nested);
            let (slot, p) = parse_key(&k).unwrap();
            assert_eq!((slot.layer, slot.proj, p), (3, Proj::V, "lora_A.weight"));
        }
        assert!(parse_key(&key("model.vision_tower.encoder")).is_none());
        let mut cfg = AdapterConfig::parse(
            r#"{"peft_type":"LORA","r":2,"target_modules":"model\\.language_model\\.layers\\.\\d+\\.self_attn\\.v_proj"}"#,
        )
        .unwrap();
        assert!(!cfg.targets(Slot::new(3, Proj::V)), "a text model's path does not match");
        cfg.set_layer_prefix([key("model.language_model")].iter()).unwrap();
        assert_eq!(cfg.path(Slot::new(3, Proj::V)), "model.language_model.layers.3.self_attn.v_proj");
        assert!(cfg.targets(Slot::new(3, Proj::V)) && !cfg.targets(Slot::new(3, Proj::Q)));
        let mixed = [key("model.language_model"), key("model")];
        assert_eq!(cfg.set_layer_prefix(mixed.iter()).unwrap_err().code(), "INVALID_ADAPTER");
        for k in [
            "base_model.model.model.vision_tower.encoder.layers.0.self_attn.q_proj.lora_A.weight",
            "base_model.model.vision_tower.vision_model.encoder.layers.0.mlp.fc1.lora_B.weight",
            "base_model.model.multi_modal_projector.mm_input_projection.lora_A.weight",
            // Gemma 4's audio tower and the towers' projections into the text embeddings.
            "base_model.model.model.audio_tower.layers.0.self_attn.q_proj.linear.lora_A.weight",
            "base_model.model.model.embed_vision.embedding_projection.lora_B.weight",
        ] {
            assert!(is_vision_tensor(k), "{k}");
        }
        assert!(!is_vision_tensor(&key("model.language_model")));
    }
}
