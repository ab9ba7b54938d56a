//! Building an [`Expert`] from a PEFT directory against a loaded base model: every targeted
//! module must exist with tensors whose shapes fit it; nothing else may be in the file. The
//! weights are made resident on the model's device in its dtype.
//!
//! GGUF Llama bases store q/k rows permuted for interleaved RoPE; adapters are trained in HF
//! layout, so their output rows on those modules are permuted the same way at load.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::dora::Dora;
use super::ia3::Ia3;
use super::lokr::Lokr;
use super::lora::{Factor, LowRank};
use super::manifest::{family, Manifest};
use super::peft::{is_vision_tensor, parse_module_key, read_safetensors, AdapterConfig, PeftType, RawTensor};
use super::{Expert, ExpertKind, ModuleAdapter, Proj, Slot};
use crate::error::{EngineError, Result};
use crate::files;
use crate::model::linear::Linear;
use crate::model::Decoder;

#[derive(Clone, Debug)]
pub struct ExpertLoadOptions {
    /// Overrides the manifest's name (default: manifest `name`, else `default_name`, else the
    /// directory name).
    pub name: Option<String>,
    /// The name when neither `name` nor the manifest gives one, in place of the directory's (a
    /// Hub download's directory is named by its commit; the repository's name is better).
    pub default_name: Option<String>,
    /// Multiplies the adapter's effect: the LoRA/DoRA/LoKr scaling, or IA³ vectors as
    /// `1 + scale · (l − 1)`. Not applicable to prompt tuning.
    pub scale: f64,
    /// Read f32 / f16 LoRA/DoRA factors in place from the memory-mapped file (CPU f32 models), with
    /// no copy and no read of their values at load; `false` copies and checks every value.
    pub mmap: bool,
}

impl Default for ExpertLoadOptions {
    fn default() -> Self {
        Self { name: None, default_name: None, scale: 1.0, mmap: true }
    }
}

/// The tensors of one module, by parameter name (`lora_A.weight`, …).
type ModuleTensors = HashMap<String, RawTensor>;

/// Reads, validates and makes resident the adapter at `dir`.
pub fn load_expert(dir: &Path, opts: &ExpertLoadOptions, model: &Decoder, id: u64) -> Result<Expert> {
    if !dir.exists() {
        return Err(EngineError::ExpertNotFound(format!("no adapter at {}", dir.display())));
    }
    if !dir.is_dir() {
        return Err(not_a_peft_directory(dir));
    }
    if !opts.scale.is_finite() {
        return Err(EngineError::InvalidArgument(format!("scale must be a finite number, got {}", opts.scale)));
    }
    let start = std::time::Instant::now();
    let mut cfg = read_config(dir)?;
    cfg.fused = model.fused;
    // 1. The manifest and the base model it names.
    let manifest = read_manifest(dir, &cfg, model)?;
    let name = expert_name(dir, opts, manifest.as_ref())?;
    // 2. The weights.
    let mut tensors = read_weights(dir)?;
    if cfg.peft_type == PeftType::PromptTuning {
        return prompt_expert(&cfg, &mut tensors, opts, model, id, name, manifest);
    }
    // 3. The modules the config targets, by their paths in the model the adapter was trained on.
    let with_vision = tensors.len();
    tensors.retain(|k, _| !is_vision_tensor(k));
    let vision_tensors = with_vision - tensors.len();
    cfg.set_layer_prefix(tensors.keys())?;
    let targeted = targeted_slots(&cfg, model)?;
    // 4. Group the tensors by module; anything else is not an adapter we can apply.
    let by_slot = group_by_slot(tensors, &targeted, model)?;
    // 5. Build and check every targeted module.
    let kind = match cfg.peft_type {
        PeftType::Lora if cfg.use_dora => ExpertKind::Dora,
        PeftType::Lora => ExpertKind::Lora,
        PeftType::Ia3 => ExpertKind::Ia3,
        PeftType::Lokr => ExpertKind::Lokr,
        PeftType::PromptTuning => unreachable!("handled above"),
    };
    // Built on the host and moved to a GPU in one copy per dtype (a rank-16 LoRA on every
    // projection of a 28-layer model is 392 tensors: one upload each would cost tens of
    // milliseconds). DoRA reads the base weight where it lives, so it is built there.
    let staging = if cfg.use_dora { model.device.clone() } else { Device::Cpu };
    // Factors read in place need the kernels that read f32 from host memory.
    let mmap = opts.mmap && model.device.is_cpu() && model.dtype == DType::F32;
    let build = ModuleBuilder { cfg: &cfg, model, dtype: model.dtype, device: &staging, scale: opts.scale, mmap };
    let parsed = start.elapsed();
    let built = build.modules(targeted, by_slot);
    let built = built.map_err(|e| wrong_base(e, &cfg, model))?;
    let made = start.elapsed();
    let mut built = built;
    if !staging.same_device(&model.device) {
        let tensors = built.modules.iter_mut().flatten().flat_map(ModuleAdapter::tensors_mut).collect();
        upload_together(tensors, &model.device)?;
    }
    if std::env::var("EXPERT_RUNTIME_PROFILE").is_ok_and(|v| !v.is_empty() && v != "0") {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        eprintln!(
            "expert-runtime profile: loadExpert {name}: parse {:.2} ms, build {:.2} ms, upload {:.2} ms ({} bytes)",
            ms(parsed),
            ms(made - parsed),
            ms(start.elapsed() - made),
            built.bytes
        );
    }
    Ok(Expert {
        examples: Vec::new(),
        source: None,
        fingerprint: Default::default(),
        id,
        name,
        kind,
        rank: (kind != ExpertKind::Ia3).then_some(built.max_rank),
        target_modules: built.names.into_iter().collect(),
        bytes: built.bytes,
        mapped_bytes: built.mapped_bytes,
        skipped_vision_tensors: vision_tensors,
        manifest,
        modules: built.modules,
        prompt: None,
        device: model.device.clone(),
    })
}

/// Moves host tensors to `device` with one copy per dtype: each becomes a view (`narrow` +
/// `reshape`, contiguous) of one device buffer, which lives as long as any of them.
fn upload_together(tensors: Vec<&mut Tensor>, device: &Device) -> Result<()> {
    let mut by_dtype: Vec<(DType, Vec<&mut Tensor>)> = Vec::new();
    for t in tensors {
        match by_dtype.iter_mut().find(|(d, _)| *d == t.dtype()) {
            Some((_, group)) => group.push(t),
            None => by_dtype.push((t.dtype(), vec![t])),
        }
    }
    for (dtype, group) in by_dtype {
        let all = match dtype {
            DType::BF16 => gather::<half::bf16>(&group)?,
            DType::F16 => gather::<half::f16>(&group)?,
            DType::F32 => gather::<f32>(&group)?,
            _ => Tensor::cat(&group.iter().map(|t| t.flatten_all()).collect::<candle_core::Result<Vec<_>>>()?, 0)?,
        }
        .to_device(device)?;
        let mut offset = 0;
        for t in group {
            let n = t.elem_count();
            *t = all.narrow(0, offset, n)?.reshape(t.shape())?;
            offset += n;
        }
    }
    Ok(())
}

/// The host tensors' values one after another in one tensor, copied in parallel (a LoRA on every
/// projection is hundreds of tensors and tens of megabytes).
fn gather<T: candle_core::WithDType>(group: &[&mut Tensor]) -> Result<Tensor> {
    use rayon::prelude::*;
    let total = group.iter().map(|t| t.elem_count()).sum();
    let mut out = vec![T::zero(); total];
    let mut rest = out.as_mut_slice();
    let mut pairs = Vec::with_capacity(group.len());
    for t in group {
        let (dst, tail) = std::mem::take(&mut rest).split_at_mut(t.elem_count());
        pairs.push((dst, &**t));
        rest = tail;
    }
    pairs.into_par_iter().try_for_each(|(dst, t)| -> Result<()> {
        let (storage, layout) = t.storage_and_layout();
        let candle_core::Storage::Cpu(cpu) = &*storage else {
            return Err(EngineError::Internal("an adapter tensor to upload is not on the host".into()));
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            return Err(EngineError::Internal("an adapter tensor to upload is not contiguous".into()));
        };
        dst.copy_from_slice(&cpu.as_slice::<T>()?[start..end]);
        Ok(())
    })?;
    Ok(Tensor::from_vec(out, total, &Device::Cpu)?)
}

/// What a path to a file instead of an adapter directory gets: a GGUF adapter (llama.cpp's LoRA
/// format) or a lone safetensors file are named as such, with what to pass instead.
fn not_a_peft_directory(path: &Path) -> EngineError {
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    let shown = path.display();
    match ext.as_deref() {
        Some("gguf") => EngineError::UnsupportedAdapter(format!(
            "{shown} is a GGUF file; experts are PEFT adapter directories (adapter_config.json and \
             adapter_model.safetensors, as PEFT's save_pretrained writes them): pass the directory the \
             adapter was trained into"
        )),
        Some("safetensors") => EngineError::InvalidAdapter(format!(
            "{shown} is a file; pass the adapter's directory (the one holding adapter_config.json beside it)"
        )),
        _ => EngineError::InvalidAdapter(format!(
            "{shown} is a file; an expert is a PEFT adapter directory (adapter_config.json and adapter_model.safetensors)"
        )),
    }
}

/// Says what a tensor that does not fit the model means: the adapter was made for another base
/// model. Names the base the adapter declares and the model this runtime runs.
fn wrong_base(e: EngineError, cfg: &AdapterConfig, model: &Decoder) -> EngineError {
    let EngineError::InvalidAdapter(detail) = &e else { return e };
    if !detail.contains(SHAPE_MISMATCH) {
        return e;
    }
    let declared = match (&cfg.base_model, &cfg.base_model_class) {
        (Some(name), Some(class)) => format!("{name} ({class})"),
        (Some(name), None) => name.clone(),
        (None, Some(class)) => format!("a {class}"),
        (None, None) => "another base model (adapter_config.json names none)".into(),
    };
    let m = &model.cfg;
    EngineError::InvalidAdapter(format!(
        "this adapter was trained for {declared}, not for the model this runtime runs (a {} model with \
         hidden size {}, {} layers); load it on its own base model ({detail})",
        m.arch.name(),
        m.hidden_size,
        m.num_layers
    ))
}

/// How every shape check of an adapter tensor words a mismatch (see [`wrong_base`]).
const SHAPE_MISMATCH: &str = "has shape";

/// `adapter_config.json`.
fn read_config(dir: &Path) -> Result<AdapterConfig> {
    let cfg_path = dir.join("adapter_config.json");
    let text = files::read_text(&cfg_path).map_err(|e| EngineError::InvalidAdapter(format!("{}: {e}", cfg_path.display())))?;
    AdapterConfig::parse(&text)
}

/// `manifest.json` (optional), checked against the base model, and the base model class the
/// adapter config names checked against the model's family.
fn read_manifest(dir: &Path, cfg: &AdapterConfig, model: &Decoder) -> Result<Option<Manifest>> {
    let manifest = match files::read_text(&dir.join("manifest.json")) {
        Ok(t) => Some(Manifest::parse(&t)?),
        Err(files::ReadError::NotFound) => None,
        Err(e) => return Err(EngineError::invalid_adapter("manifest.json", e)),
    };
    if let Some(m) = &manifest {
        m.check_base(&model.cfg)?;
    }
    if let Some(class) = &cfg.base_model_class {
        if family(class).is_some_and(|f| f != model.cfg.arch) {
            return Err(EngineError::InvalidAdapter(format!(
                "the adapter was trained on a {class}, but this runtime runs a {} model",
                model.cfg.arch.name()
            )));
        }
    }
    Ok(manifest)
}

/// The option's name, else the manifest's, else the default name, else the directory's.
fn expert_name(dir: &Path, opts: &ExpertLoadOptions, manifest: Option<&Manifest>) -> Result<String> {
    opts.name
        .clone()
        .or_else(|| manifest.and_then(|m| m.name.clone()))
        .or_else(|| opts.default_name.clone())
        .or_else(|| dir.canonicalize().ok().and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())))
        .filter(|n| !n.is_empty())
        .ok_or_else(|| EngineError::InvalidArgument("the expert needs a name".into()))
}

/// `adapter_model.safetensors`, by tensor name.
fn read_weights(dir: &Path) -> Result<HashMap<String, RawTensor>> {
    let weights = dir.join("adapter_model.safetensors");
    if !weights.is_file() {
        let hint = if dir.join("adapter_model.bin").is_file() {
            " (adapter_model.bin is a pickle; save with safe_serialization=True)"
        } else {
            ""
        };
        return Err(EngineError::InvalidAdapter(format!("{} is missing{hint}", weights.display())));
    }
    read_safetensors(&weights)
}

/// A prompt-tuning expert: virtual token embeddings, no modules.
fn prompt_expert(
    cfg: &AdapterConfig,
    tensors: &mut HashMap<String, RawTensor>,
    opts: &ExpertLoadOptions,
    model: &Decoder,
    id: u64,
    name: String,
    manifest: Option<Manifest>,
) -> Result<Expert> {
    if opts.scale != 1.0 {
        return Err(EngineError::InvalidArgument("scale does not apply to a prompt-tuning expert".into()));
    }
    if model.plan.per_layer_input.is_some() {
        // transformers rebuilds the per-layer inputs from each row's token, which a virtual
        // token does not have (its Gemma 4 refuses such input too).
        return Err(EngineError::UnsupportedAdapter(
            "prompt tuning on a model with per-layer input embeddings (Gemma 4): its virtual tokens have no per-layer inputs"
                .into(),
        ));
    }
    let dtype = model.dtype;
    let prompt = super::prompt::load(cfg, tensors, model.cfg.hidden_size, dtype, &model.device)?;
    let bytes = prompt.elem_count() * dtype.size_in_bytes();
    Ok(Expert {
        examples: Vec::new(),
        source: None,
        fingerprint: Default::default(),
        id,
        name,
        kind: ExpertKind::Prompt,
        rank: None,
        target_modules: Vec::new(),
        bytes,
        mapped_bytes: 0,
        skipped_vision_tensors: 0,
        manifest,
        modules: Vec::new(),
        prompt: Some(prompt),
        device: model.device.clone(),
    })
}

/// Every layer's projections the config targets; none is an error.
fn targeted_slots(cfg: &AdapterConfig, model: &Decoder) -> Result<Vec<Slot>> {
    // PEFT wraps the modules that exist: a layer sharing an earlier layer's keys and values
    // (Gemma 4) has no k_proj or v_proj.
    let targeted: Vec<Slot> = (0..model.cfg.num_layers)
        .flat_map(|l| Proj::ALL.into_iter().map(move |p| Slot::new(l, p)))
        .filter(|s| model.linear(*s).is_some() && cfg.targets(*s))
        .collect();
    // A GGUF Qwen3.5 stores a Gated DeltaNet's value heads in ggml's order, not the order the
    // adapter was trained on: its rows would land on other heads.
    let tiled = |l: usize| {
        use crate::model::plan::{Mixer, Recurrent};
        matches!(model.plan.layers[l].mixer, Mixer::Recurrent(Recurrent::GatedDeltaNet(d)) if d.tiled_heads)
    };
    if let Some(s) = targeted.iter().find(|s| matches!(s.proj, Proj::LinQkv | Proj::LinZ | Proj::LinOut) && tiled(s.layer)) {
        return Err(EngineError::UnsupportedAdapter(format!(
            "{}: an adapter on a Gated DeltaNet of a GGUF base (its value heads are stored in llama.cpp's order); load the \
             safetensors checkpoint to use it",
            s.path()
        )));
    }
    if targeted.is_empty() {
        let foreign = cfg.target_modules.as_ref().map(|t| t.unadaptable_names()).unwrap_or_default();
        if !foreign.is_empty() {
            return Err(EngineError::UnsupportedAdapter(format!(
                "target_modules {foreign:?}: only the q/k/v/o/gate/up/down projections of decoder layers can be adapted"
            )));
        }
        let mut names: Vec<&str> = Proj::ALL.iter().map(|&p| model.fused.module_name(p)).collect();
        names.dedup();
        return Err(EngineError::InvalidAdapter(format!(
            "target_modules selects none of this model's linear modules ({})",
            names.join(", ")
        )));
    }
    Ok(targeted)
}

/// The tensors grouped by the targeted module they belong to; a tensor of no module, of a layer
/// the model lacks or of an untargeted module is an error. A fused module's tensors are cut into
/// its parts' ([`fused_part`]).
fn group_by_slot(
    tensors: HashMap<String, RawTensor>,
    targeted: &[Slot],
    model: &Decoder,
) -> Result<HashMap<Slot, ModuleTensors>> {
    let mut is_targeted = vec![false; model.cfg.num_layers * Proj::ALL.len()];
    for s in targeted {
        is_targeted[s.index()] = true;
    }
    let mut by_slot: HashMap<Slot, ModuleTensors> = HashMap::new();
    for (key, t) in tensors {
        let Some((layer, parts, param)) = parse_module_key(&key, model.fused) else {
            if key.contains(".mlp.experts.") || key.contains(".mlp.gate.") {
                return Err(EngineError::UnsupportedAdapter(format!(
                    "tensor {key}: a routed FFN's MoE experts and router cannot be adapted (only attention and dense MLP \
                     projections)"
                )));
            }
            let unsupported = ["embed_tokens", "lm_head", "modules_to_save", "lora_embedding", "norm"];
            if unsupported.iter().any(|u| key.contains(u)) {
                return Err(EngineError::UnsupportedAdapter(format!(
                    "tensor {key}: only the linear projections of decoder layers can be adapted"
                )));
            }
            return Err(EngineError::InvalidAdapter(format!("unexpected tensor {key}")));
        };
        if layer >= model.cfg.num_layers {
            return Err(EngineError::InvalidAdapter(format!(
                "tensor {key} is for layer {layer} but the model has {} layers",
                model.cfg.num_layers
            )));
        }
        if parts.iter().any(|&p| !is_targeted[Slot::new(layer, p).index()]) {
            return Err(EngineError::InvalidAdapter(format!("tensor {key} is for a module the adapter config does not target")));
        }
        if let [proj] = parts {
            by_slot.entry(Slot::new(layer, *proj)).or_default().insert(param.to_string(), t);
            continue;
        }
        let rows = parts
            .iter()
            .map(|&p| model.linear(Slot::new(layer, p)).map(|l| l.out_features))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| EngineError::InvalidAdapter(format!("tensor {key} is for a module this model does not have")))?;
        let mut start = 0;
        for (&proj, &n) in parts.iter().zip(&rows) {
            let part = fused_part(&key, param, &t, start, n, rows.iter().sum())?;
            by_slot.entry(Slot::new(layer, proj)).or_default().insert(param.to_string(), part);
            start += n;
        }
    }
    Ok(by_slot)
}

/// Parameter `param` (tensor `key`) of a fused module for the part at rows `start..start + rows`
/// of the module's `total` output rows. A fused projection is its parts' rows stacked, so an
/// adapter on it is exactly the parts' adapters: LoRA's `B` (and DoRA's magnitude, one per output
/// row, taken over each row's own norm) and an output-side IA³ vector are cut by rows; LoRA's `A`
/// and an input-side IA³ vector are the same for every part. LoKr's Kronecker factors do not cut
/// along the parts' rows in general: refused.
fn fused_part(key: &str, param: &str, t: &RawTensor, start: usize, rows: usize, total: usize) -> Result<RawTensor> {
    let by_rows = match param {
        "lora_B.weight" | "lora_magnitude_vector" | "lora_magnitude_vector.weight" => true,
        "ia3_l" => t.shape.first() == Some(&total) && t.shape.get(1).is_none_or(|&d| d == 1),
        p if p.starts_with("lokr_") => {
            return Err(EngineError::UnsupportedAdapter(format!(
                "tensor {key}: LoKr on a fused module (qkv_proj, gate_up_proj) is not supported; \
                 target the other modules, or use LoRA, DoRA or IA3 there"
            )))
        }
        _ => false,
    };
    if !by_rows {
        // Shared by the parts (its shape is checked against each part's module).
        return Ok(t.clone());
    }
    if t.shape.first() != Some(&total) {
        return Err(EngineError::InvalidAdapter(format!("tensor {key} {SHAPE_MISMATCH} {:?}, expected {total} rows", t.shape)));
    }
    t.rows(start, rows).ok_or_else(|| EngineError::InvalidAdapter(format!("tensor {key} {SHAPE_MISMATCH} {:?}", t.shape)))
}

/// What [`ModuleBuilder::modules`] built.
struct BuiltModules {
    /// By [`Slot::index`]; `None` where the expert leaves the module alone.
    modules: Vec<Option<ModuleAdapter>>,
    /// The adapted projections' names.
    names: BTreeSet<String>,
    bytes: usize,
    /// Of `bytes`, the factors read in place.
    mapped_bytes: usize,
    max_rank: usize,
}

struct ModuleBuilder<'a> {
    cfg: &'a AdapterConfig,
    model: &'a Decoder,
    dtype: DType,
    device: &'a Device,
    scale: f64,
    /// Whether f32 LoRA factors are read in place from the file's map.
    mmap: bool,
}

impl ModuleBuilder<'_> {
    /// Every targeted module, built from its tensors (`by_slot`).
    fn modules(&self, targeted: Vec<Slot>, mut by_slot: HashMap<Slot, ModuleTensors>) -> Result<BuiltModules> {
        let mut built = BuiltModules {
            modules: (0..self.model.cfg.num_layers * Proj::ALL.len()).map(|_| None).collect(),
            names: BTreeSet::new(),
            bytes: 0,
            mapped_bytes: 0,
            max_rank: 0,
        };
        let work: Vec<(Slot, ModuleTensors)> =
            targeted.into_iter().map(|slot| (slot, by_slot.remove(&slot).unwrap_or_default())).collect();
        // Modules are independent: built in parallel on the host (a GPU staging device is
        // driven from this thread only) when they read and convert values. A LoRA read in
        // place is header bookkeeping only (~1 µs a module): the thread pool's fan-out would
        // cost more than it saves. Results keep the module order, so the error reported is
        // the first module's, as in a sequential build.
        let in_place = self.mmap
            && self.cfg.peft_type == PeftType::Lora
            && !self.cfg.use_dora
            && work.iter().all(|(_, ts)| ts.values().all(RawTensor::is_mappable));
        let build = |(slot, ts): (Slot, ModuleTensors)| self.module(slot, ts).map(|built| (slot, built));
        let results: Vec<Result<(Slot, (ModuleAdapter, usize))>> = if self.device.is_cpu() && !in_place {
            use rayon::prelude::*;
            work.into_par_iter().map(build).collect()
        } else {
            work.into_iter().map(build).collect()
        };
        for result in results {
            let (slot, (adapter, rank)) = result?;
            built.mapped_bytes += match &adapter {
                ModuleAdapter::Lora(l) => l.mapped_bytes(),
                ModuleAdapter::Dora(d) => d.lr.mapped_bytes(),
                _ => 0,
            };
            built.bytes += match &adapter {
                ModuleAdapter::Lora(l) => l.bytes(),
                ModuleAdapter::Dora(d) => d.bytes(),
                ModuleAdapter::Ia3(a) => a.bytes(),
                ModuleAdapter::Lokr(k) => k.bytes(),
            };
            built.max_rank = built.max_rank.max(rank);
            built.names.insert(self.cfg.fused.module_name(slot.proj).to_string());
            built.modules[slot.index()] = Some(adapter);
        }
        Ok(built)
    }

    /// The adapter of one module and its rank (0 for IA³).
    fn module(&self, slot: Slot, ts: ModuleTensors) -> Result<(ModuleAdapter, usize)> {
        let perm = self.out_permutation(slot)?;
        let lin =
            self.model.linear(slot).ok_or_else(|| EngineError::Internal(format!("{} is targeted but absent", slot.path())))?;
        let mut m = ModuleInput { slot, path: self.cfg.path(slot), lin, ts, perm };
        let (adapter, rank) = match self.cfg.peft_type {
            PeftType::Lora => self.lora(&mut m)?,
            PeftType::Ia3 => (self.ia3(&mut m)?, 0),
            PeftType::Lokr => self.lokr(&mut m)?,
            PeftType::PromptTuning => unreachable!("no modules"),
        };
        if let Some(extra) = m.ts.keys().next() {
            return Err(EngineError::InvalidAdapter(format!("unexpected tensor {}", m.key(extra))));
        }
        Ok((adapter, rank))
    }

    /// LoRA (or DoRA with `use_dora`) and its rank.
    fn lora(&self, m: &mut ModuleInput) -> Result<(ModuleAdapter, usize)> {
        let (out, inp) = (m.lin.out_features, m.lin.in_features);
        let (r, alpha) = self.cfg.rank_alpha(m.slot);
        let a = m.take("lora_A.weight", Some(&[r, inp]))?;
        let b = m.take("lora_B.weight", Some(&[out, r]))?;
        let s = if self.cfg.use_rslora { alpha / (r as f64).sqrt() } else { alpha / r as f64 } * self.scale;
        // In place where the file's dtype and layout are what the kernels read (permuted rows
        // are not); otherwise converted once.
        let in_place = |t: &RawTensor| self.mmap.then(|| t.mapped()).flatten().map(Factor::Mapped);
        let a = match in_place(&a) {
            Some(f) => f,
            None => Factor::Tensor(a.to_tensor(self.dtype, self.device)?),
        };
        let b = match in_place(&b).filter(|_| m.perm.is_none()) {
            Some(f) => f,
            None => Factor::Tensor(permute(b.to_tensor(self.dtype, self.device)?, m.perm.as_ref(), 0)?),
        };
        let lr = LowRank::new(a, b, s);
        if !self.cfg.use_dora {
            return Ok((ModuleAdapter::Lora(lr), r));
        }
        let mag =
            m.ts.remove("lora_magnitude_vector")
                .or_else(|| m.ts.remove("lora_magnitude_vector.weight"))
                .ok_or_else(|| EngineError::InvalidAdapter(format!("missing tensor {}", m.key("lora_magnitude_vector"))))?;
        if mag.shape != [out] {
            return Err(EngineError::InvalidAdapter(format!(
                "tensor {} has shape {:?}, expected [{out}]",
                m.key("lora_magnitude_vector"),
                mag.shape
            )));
        }
        let mag = permute(mag.to_tensor(DType::F32, self.device)?, m.perm.as_ref(), 0)?;
        Ok((ModuleAdapter::Dora(Dora::new(lr, &mag, &m.lin.dequantized_f32()?, self.dtype)?), r))
    }

    /// IA³: one vector over the input (feed-forward modules) or the output.
    fn ia3(&self, m: &mut ModuleInput) -> Result<ModuleAdapter> {
        let (out, inp) = (m.lin.out_features, m.lin.in_features);
        let ff = self.cfg.is_feedforward(m.slot);
        let v = if ff { m.take("ia3_l", Some(&[1, inp]))? } else { m.take("ia3_l", Some(&[out, 1]))? };
        let n = v.shape.iter().product::<usize>();
        let mut v = v.to_tensor(DType::F32, self.device)?.reshape(n)?;
        if self.scale != 1.0 {
            v = (((v - 1.0)? * self.scale)? + 1.0)?;
        }
        let v = if ff { v } else { permute(v, m.perm.as_ref(), 0)? };
        Ok(ModuleAdapter::Ia3(Ia3 { scale: v.to_dtype(self.dtype)?, on_input: ff }))
    }

    /// LoKr (`w1 ⊗ w2`) and its rank.
    fn lokr(&self, m: &mut ModuleInput) -> Result<(ModuleAdapter, usize)> {
        let (out, inp) = (m.lin.out_features, m.lin.in_features);
        let (r, alpha) = self.cfg.rank_alpha(m.slot);
        let w1 = self.factor(m, "lokr_w1")?;
        let w2 = self.factor(m, "lokr_w2")?;
        if m.ts.contains_key("lokr_t2") {
            return Err(EngineError::UnsupportedAdapter(format!(
                "{}: LoKr Tucker factors (convolutions only)",
                m.key("lokr_t2")
            )));
        }
        let ((p, q), (k, n)) = (w1.dims2()?, w2.dims2()?);
        if p * k != out || q * n != inp {
            return Err(EngineError::InvalidAdapter(format!(
                "{}: w1 {:?} ⊗ w2 {:?} is [{}, {}], but the module is [{out}, {inp}]",
                m.key("lokr_w1"),
                [p, q],
                [k, n],
                p * k,
                q * n
            )));
        }
        Ok((ModuleAdapter::Lokr(Lokr { w1, w2, scale: alpha / r as f64 * self.scale, out_perm: m.perm.take() }), r))
    }

    /// A LoKr factor, full (`{name}`) or as `{name}_a @ {name}_b`.
    fn factor(&self, m: &mut ModuleInput, name: &str) -> Result<Tensor> {
        if let Some(w) = m.ts.remove(name) {
            if w.shape.len() != 2 {
                return Err(EngineError::InvalidAdapter(format!("tensor {} must be 2-D, has shape {:?}", m.key(name), w.shape)));
            }
            return w.to_tensor(self.dtype, self.device);
        }
        let (an, bn) = (format!("{name}_a"), format!("{name}_b"));
        let a =
            m.ts.remove(&an)
                .ok_or_else(|| EngineError::InvalidAdapter(format!("missing tensor {} (or {})", m.key(name), m.key(&an))))?;
        let b = m.ts.remove(&bn).ok_or_else(|| EngineError::InvalidAdapter(format!("missing tensor {}", m.key(&bn))))?;
        if a.shape.len() != 2 || b.shape.len() != 2 || a.shape[1] != b.shape[0] || a.shape[1] == 0 {
            return Err(EngineError::InvalidAdapter(format!(
                "tensors {} {:?} and {} {:?} do not multiply",
                m.key(&an),
                a.shape,
                m.key(&bn),
                b.shape
            )));
        }
        let a = a.to_tensor(DType::F32, self.device)?;
        let b = b.to_tensor(DType::F32, self.device)?;
        Ok(a.matmul(&b)?.to_dtype(self.dtype)?)
    }

    /// For q/k of a base whose rows are permuted for interleaved RoPE, the index tensor whose
    /// element `g` is the HF row that row `g` of the base holds.
    fn out_permutation(&self, slot: Slot) -> Result<Option<Tensor>> {
        let cfg = &self.model.cfg;
        let heads = match slot.proj {
            Proj::Q => cfg.num_heads,
            Proj::K => cfg.num_kv_heads,
            _ => return Ok(None),
        };
        if !cfg.rope_interleaved {
            return Ok(None);
        }
        let p = interleave_permutation(heads, cfg.head_dim);
        Ok(Some(Tensor::from_vec(p, heads * cfg.head_dim, self.device)?))
    }
}

/// One module being built: where it is, the base linear it adapts, its tensors (removed as
/// they are used; any left at the end is an error) and, for permuted q/k rows, the row order.
struct ModuleInput<'a> {
    slot: Slot,
    /// Its module path in the model the adapter was trained on (a fused module's, for a part).
    path: String,
    lin: &'a Linear,
    ts: ModuleTensors,
    perm: Option<Tensor>,
}

impl ModuleInput<'_> {
    /// The full tensor name of parameter `p`, for messages.
    fn key(&self, p: &str) -> String {
        format!("base_model.model.{}.{p}", self.path)
    }

    /// Removes tensor `p`, checking its shape when `shape` is given.
    fn take(&mut self, p: &str, shape: Option<&[usize]>) -> Result<RawTensor> {
        let t = self.ts.remove(p).ok_or_else(|| EngineError::InvalidAdapter(format!("missing tensor {}", self.key(p))))?;
        if let Some(s) = shape {
            if t.shape != s {
                return Err(EngineError::InvalidAdapter(format!(
                    "tensor {} has shape {:?}, expected {s:?}",
                    self.key(p),
                    t.shape
                )));
            }
        }
        Ok(t)
    }
}

/// llama.cpp's Q/K row permutation: row `h·hd + 2i + j` holds HF row `h·hd + j·hd/2 + i`.
pub fn interleave_permutation(heads: usize, head_dim: usize) -> Vec<u32> {
    let half = head_dim / 2;
    let mut p = Vec::with_capacity(heads * head_dim);
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                p.push((h * head_dim + j * half + i) as u32);
            }
        }
    }
    p
}

/// `t` reordered along `dim` by the index tensor `perm`, or `t` itself.
fn permute(t: Tensor, perm: Option<&Tensor>, dim: usize) -> Result<Tensor> {
    Ok(match perm {
        Some(p) => t.index_select(p, dim)?,
        None => t,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One f32 tensor `t` of `shape`, values 0, 1, 2, ….
    fn raw(shape: &[usize]) -> RawTensor {
        let n: usize = shape.iter().product();
        let header = format!(r#"{{"t":{{"dtype":"F32","shape":{shape:?},"data_offsets":[0,{}]}}}}"#, 4 * n);
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        (0..n).for_each(|i| bytes.extend_from_slice(&(i as f32).to_le_bytes()));
        super::super::peft::parse_safetensors(&bytes, "test").unwrap().remove("t").unwrap()
    }

    /// A fused module's factors cut for one part: by rows where they are per output row, shared
    /// where they are per input; LoKr refused; a factor of the wrong height is a shape error.
    #[test]
    fn fused_module_factors_are_cut_by_rows_or_shared() {
        let key = "base_model.model.model.layers.0.self_attn.qkv_proj.lora_B.weight";
        let b = fused_part(key, "lora_B.weight", &raw(&[6, 2]), 2, 3, 6).unwrap();
        assert_eq!((b.shape.clone(), b.values().unwrap()), (vec![3, 2], vec![4.0, 5.0, 6.0, 7.0, 8.0, 9.0]));
        let m = fused_part(key, "lora_magnitude_vector", &raw(&[6]), 4, 2, 6).unwrap();
        assert_eq!(m.values().unwrap(), vec![4.0, 5.0]);
        assert_eq!(fused_part(key, "ia3_l", &raw(&[6, 1]), 0, 2, 6).unwrap().values().unwrap(), vec![0.0, 1.0]);
        // Shared: LoRA's A, and IA³'s input vector (a feed-forward module's).
        assert_eq!(fused_part(key, "lora_A.weight", &raw(&[2, 4]), 2, 3, 6).unwrap().shape, vec![2, 4]);
        assert_eq!(fused_part(key, "ia3_l", &raw(&[1, 4]), 2, 3, 6).unwrap().shape, vec![1, 4]);
        let e = fused_part(key, "lokr_w1", &raw(&[2, 2]), 0, 2, 6).err().unwrap();
        assert_eq!(e.code(), "UNSUPPORTED_ADAPTER", "{e}");
        let e = fused_part(key, "lora_B.weight", &raw(&[5, 2]), 0, 2, 6).err().unwrap();
        assert!(matches!(&e, EngineError::InvalidAdapter(m) if m.contains(SHAPE_MISMATCH)), "{e:?}");
    }

    #[test]
    fn interleave_permutation_matches_llama_cpp() {
        // 1 head of 4: HF rows [0, 1 | 2, 3] (halves) become [0, 2, 1, 3] (pairs).
        assert_eq!(interleave_permutation(1, 4), vec![0, 2, 1, 3]);
        assert_eq!(interleave_permutation(2, 4), vec![0, 2, 1, 3, 4, 6, 5, 7]);
    }

    /// Tensors moved together keep their values, shapes and dtypes, as contiguous views of one
    /// buffer per dtype.
    #[test]
    fn upload_together_keeps_every_tensor() {
        let dev = Device::Cpu;
        let a = Tensor::arange(0f32, 12.0, &dev).unwrap().reshape((3, 4)).unwrap();
        let b = Tensor::arange(100f32, 105.0, &dev).unwrap().to_dtype(DType::BF16).unwrap();
        let c = Tensor::arange(20f32, 26.0, &dev).unwrap().reshape((2, 3)).unwrap();
        let d = Tensor::new(&[3u32, 1, 2], &dev).unwrap();
        // A view that starts inside its buffer.
        let e = Tensor::arange(0f32, 10.0, &dev).unwrap().narrow(0, 3, 4).unwrap();
        let (mut a2, mut b2, mut c2, mut d2, mut e2) = (a.clone(), b.clone(), c.clone(), d.clone(), e.clone());
        upload_together(vec![&mut a2, &mut b2, &mut c2, &mut d2, &mut e2], &dev).unwrap();
        for (orig, moved) in [(&a, &a2), (&b, &b2), (&c, &c2), (&d, &d2), (&e, &e2)] {
            assert_eq!(orig.shape(), moved.shape());
            assert_eq!(orig.dtype(), moved.dtype());
            assert!(moved.is_contiguous());
            let (x, y) = (orig.to_dtype(DType::F32).unwrap(), moved.to_dtype(DType::F32).unwrap());
            assert_eq!(x.flatten_all().unwrap().to_vec1::<f32>().unwrap(), y.flatten_all().unwrap().to_vec1::<f32>().unwrap());
        }
        // c follows a in the same f32 buffer.
        assert_eq!(c2.layout().start_offset(), 12);
    }
}
