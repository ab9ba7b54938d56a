//! Loading a model for the engine: the load options, the dtype, the context length, the
//! tokenizer and `generation_config.json`, and the CPU thread pools.

use std::path::Path;

use candle_core::{DType, Device};

use super::device::device_memory;
use crate::error::{EngineError, Result};
use crate::files;
use crate::kv::sizing::KvMemory;
use crate::kv::KvCacheOptions;
use crate::model::config::{token_id_list, MAX_POSITIONS};
use crate::model::loader::{self, ModelFormat, WeightPolicy};
use crate::model::quantize::Quantize;
use crate::model::rope::{RopeScaling, Source};
use crate::model::{Decoder, ModelConfig};
use crate::sampling::SamplingOverrides;
use crate::tokenizer::Tokenizer;

#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// `auto` | `cpu` | `cuda` | `cuda:N`.
    pub device: Option<String>,
    /// `auto` | `f32` | `f16` | `bf16`.
    pub dtype: Option<String>,
    pub context_length: Option<usize>,
    /// Replaces the model's own RoPE scaling (`ropeScaling`: a JSON object, camelCase or
    /// snake_case keys; `{ "type": "default" }` turns scaling off).
    pub rope_scaling: Option<serde_json::Value>,
    pub threads: Option<usize>,
    /// Dequantize GGUF weights at load (exact f32 matmuls instead of quantized kernels).
    pub dequantize: bool,
    /// `none` | `q8_0` | `q4_0` | `q4_k`: quantize dense weights as they are read.
    pub quantize: Option<String>,
    /// Read dense weights in place from the memory-mapped file where the file's dtype is the
    /// model's (CPU); `Some(false)` copies them. Default: on.
    pub mmap: Option<bool>,
    pub kv_cache: KvCacheOptions,
    /// `contextLength: 'auto'`: the longest context that fits `memory_limit` ([`super::fit`]).
    pub context_auto: bool,
    /// Bytes the runtime may take in all (weights, KV, state, tables, scratch): a load that
    /// cannot fit is refused, and the KV pool is bounded by what the rest leaves. Default for
    /// `contextLength: 'auto'`: what the device has free, less a margin; otherwise no bound.
    pub memory_limit: Option<u64>,
}

/// Defaults from `generation_config.json`.
#[derive(Clone, Debug, Default)]
pub struct GenerationDefaults {
    pub sampling: SamplingOverrides,
    pub eos_token_ids: Vec<u32>,
}

/// A model read from disk, before it is handed to an engine thread.
pub struct Loaded {
    pub model: Decoder,
    pub tokenizer: Tokenizer,
    pub defaults: GenerationDefaults,
    /// What the caller should know about how the model runs (`rt.info.warnings`).
    pub warnings: Vec<String>,
    /// With `memoryLimit` or `contextLength: 'auto'`: the bytes the KV pool and the states may
    /// take (the budget less the weights, tables and scratch).
    pub kv_room: Option<u64>,
}

pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        _ => "other",
    }
}

/// `auto` on CPU is f32: candle's CPU matmuls are fastest in f32 (f16 and especially bf16
/// go through slower conversion paths) and f32 is exact. On CUDA it is bf16.
pub(crate) fn select_dtype(name: Option<&str>, device: &Device) -> Result<DType> {
    Ok(match name.unwrap_or("auto") {
        "auto" => {
            if device.is_cpu() {
                DType::F32
            } else {
                DType::BF16
            }
        }
        "f32" => DType::F32,
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        other => return Err(EngineError::InvalidArgument(format!("unknown dtype '{other}' (auto, f32, f16, bf16)"))),
    })
}

/// The `contextLength` option checked against what the model supports (with its RoPE
/// scaling): past that length the load succeeds but says so in `warnings`, since quality
/// degrades there. Without the option: the model's declared length, or the scaled length when
/// the caller chose the scaling or the config's scaling is `dynamic`.
pub(crate) fn context_length(opts: &LoadOptions, cfg: &ModelConfig, warnings: &mut Vec<String>) -> Result<usize> {
    let max_pos = cfg.max_position_embeddings;
    let scaling = cfg.rope_scaling.as_ref();
    let supported = scaling.map_or(max_pos, |s| s.scaled_length(max_pos));
    let n = match opts.context_length {
        Some(0) => return Err(EngineError::InvalidArgument("contextLength must be positive".into())),
        Some(n) if n > MAX_POSITIONS => {
            return Err(EngineError::InvalidArgument(format!(
                "contextLength {n} is more than this engine supports ({MAX_POSITIONS})"
            )))
        }
        Some(n) => n,
        None if opts.rope_scaling.is_some() => supported.max(max_pos),
        // A config's `dynamic` scaling stretches as the sequence grows, to `factor` times the
        // original context (vLLM's default length for it); the others keep the declared one.
        None if matches!(scaling, Some(RopeScaling::Dynamic { .. })) => supported.max(max_pos),
        None => max_pos,
    };
    if n > supported {
        let native = scaling.map_or(max_pos, |s| s.original_length(max_pos));
        let how = match scaling {
            Some(s) => format!("{supported} positions with its '{}' RoPE scaling", s.type_name()),
            None => format!("{supported} positions and has no RoPE scaling"),
        };
        warnings.push(format!(
            "contextLength {n} is past what this model supports ({how}): quality degrades past position {supported}; \
             set ropeScaling (e.g. {{ type: 'yarn', factor: {}, originalMaxPositionEmbeddings: {native} }}) to stretch it",
            n.div_ceil(native.max(1))
        ));
    }
    Ok(n)
}

/// `generation_config.json` of an HF model directory (defaults when there is none).
pub fn read_generation_config(dir: &Path) -> Result<GenerationDefaults> {
    let p = dir.join("generation_config.json");
    let text = match files::read_text(&p) {
        Ok(t) => t,
        Err(files::ReadError::NotFound) => return Ok(GenerationDefaults::default()),
        Err(e) => return Err(EngineError::invalid_model(p.display(), e)),
    };
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| EngineError::invalid_model(p.display(), e))?;
    let sampling = SamplingOverrides::from_generation_config(&v);
    // Defaults every request would inherit: a bad one fails the load, not every request.
    sampling.resolve(&SamplingOverrides::default()).map_err(|e| EngineError::invalid_model(p.display(), e))?;
    Ok(GenerationDefaults { sampling, eos_token_ids: token_id_list(v.get("eos_token_id")) })
}

/// The ids that end a generation: the config's, `generation_config.json`'s and the
/// tokenizer's (when it could be built), sorted, each once.
pub fn end_of_generation_ids(cfg: &ModelConfig, defaults: &GenerationDefaults, tokenizer: Option<&Tokenizer>) -> Vec<u32> {
    let mut eos: Vec<u32> = cfg.eos_token_ids.clone();
    eos.extend(defaults.eos_token_ids.iter().copied());
    eos.extend(tokenizer.map(Tokenizer::eos_token_ids).unwrap_or_default());
    eos.sort_unstable();
    eos.dedup();
    eos
}

/// The tokenizer and chat template, tried once at load so that their defects are
/// `INVALID_MODEL` now rather than a failure of every request: ids past the model's
/// vocabulary (in the vocabulary or added by the post-processor), a tokenizer that fails (or
/// panics) on plain text, a template that never ends
/// or explodes on the simplest conversation.
fn check_tokenizer(tokenizer: &Tokenizer, cfg: &ModelConfig) -> Result<()> {
    if tokenizer.vocab_size() > cfg.vocab_size {
        return Err(EngineError::InvalidModel(format!(
            "the tokenizer has ids up to {} but the model's vocabulary has {} entries",
            tokenizer.vocab_size() - 1,
            cfg.vocab_size
        )));
    }
    // The ids the tokenizer adds itself (a post-processor's BOS) must exist in the model too.
    let ids = tokenizer.encode("Hello, world! 123 日本", true).map_err(EngineError::InvalidModel)?;
    if let Some(bad) = ids.iter().find(|&&t| t as usize >= cfg.vocab_size) {
        return Err(EngineError::InvalidModel(format!(
            "the tokenizer produces id {bad} but the model's vocabulary has {} entries",
            cfg.vocab_size
        )));
    }
    tokenizer.check_chat_template().map_err(EngineError::InvalidModel)
}

/// The weight policy of the load options.
pub(crate) fn weight_policy(opts: &LoadOptions) -> Result<WeightPolicy> {
    let policy = WeightPolicy {
        dequantize: opts.dequantize,
        quantize: Quantize::parse(opts.quantize.as_deref())?,
        mmap: opts.mmap.unwrap_or(true),
    };
    if opts.dequantize && policy.quantize != Quantize::None {
        return Err(EngineError::InvalidArgument("dequantize and quantize cannot be combined".into()));
    }
    Ok(policy)
}

/// The `ropeScaling` option, replacing the config's own.
pub(crate) fn apply_rope_option(opts: &LoadOptions, config: &mut ModelConfig) -> Result<()> {
    if let Some(v) = &opts.rope_scaling {
        config.rope_scaling = RopeScaling::parse(v, Source::Option, config.max_position_embeddings, None)?;
    }
    Ok(())
}

/// Reads a model directory or GGUF file (used by the engine thread and by tests/benches).
pub fn load_model(path: &Path, opts: &LoadOptions, device: &Device, progress: &dyn Fn(u64, u64)) -> Result<Loaded> {
    let policy = weight_policy(opts)?;
    let mut files = loader::open(path, device, progress, policy)?;
    let dtype = select_dtype(opts.dtype.as_deref(), device)?;
    apply_rope_option(opts, &mut files.config)?;
    let mut warnings = Vec::new();
    // A budget is checked before any weight is read: a model that cannot fit is refused now.
    let (n, kv_room) = if opts.context_auto || opts.memory_limit.is_some() {
        let fit = super::fit::plan(&files.config, &files.format, opts, device, policy)?;
        if let Some(why) = fit.does_not_fit {
            return Err(EngineError::OutOfMemory(why));
        }
        let fixed = fit.total_bytes.saturating_sub(fit.kv_bytes).saturating_sub(fit.state_bytes);
        let n = if opts.context_auto { fit.context_length } else { context_length(opts, &files.config, &mut warnings)? };
        (n, Some(fit.memory_limit.saturating_sub(fixed)))
    } else {
        (context_length(opts, &files.config, &mut warnings)?, None)
    };
    let config = files.config.clone();
    let ((tokenizer, defaults), model) = match &files.format {
        ModelFormat::Gguf(src) => {
            let tokenizer = Tokenizer::from_gguf(src.metadata()).map_err(EngineError::InvalidModel)?;
            check_tokenizer(&tokenizer, &config)?;
            ((tokenizer, GenerationDefaults::default()), load_weights(files, device, progress, dtype, n)?)
        }
        // A model directory's tokenizer (a JSON parse of up to tens of MB, on one core) is read
        // on a thread of its own while the weights load.
        ModelFormat::HfDir(dir) => {
            let dir = dir.clone();
            std::thread::scope(|scope| {
                let tokenizer = crate::stack::untrusted_thread("expert-runtime-tokenizer")
                    .spawn_scoped(scope, || -> Result<_> {
                        let t = Tokenizer::from_dir(&dir).map_err(EngineError::InvalidModel)?;
                        check_tokenizer(&t, &config)?;
                        Ok((t, read_generation_config(&dir)?))
                    })
                    .map_err(|e| EngineError::Internal(format!("cannot start the tokenizer thread: {e}")))?;
                let model = load_weights(files, device, progress, dtype, n);
                let tokenizer = tokenizer.join().map_err(|p| {
                    EngineError::InvalidModel(format!("reading the tokenizer failed: {}", crate::error::panic_message(&*p)))
                })?;
                // A tokenizer's defect is reported first, as when it was read before the weights.
                Ok::<_, EngineError>((tokenizer?, model?))
            })?
        }
    };
    Ok(Loaded { model, tokenizer, defaults, warnings, kv_room })
}

/// The decoder from the opened files' weights.
fn load_weights<'a>(
    files: loader::ModelFiles<'a>,
    device: &Device,
    progress: loader::Progress<'a>,
    dtype: DType,
    n: usize,
) -> Result<Decoder> {
    let (config, mut weights) = files.into_weights(device, progress)?;
    Decoder::load(config, weights.as_mut(), dtype, device, n)
}

/// What the KV pool may take, from one query of the device. By default: half of the GPU
/// memory still free after the weights on CUDA, a quarter of the machine's memory on CPU
/// (committed only as blocks are first written there; allocated at load on a GPU). At most:
/// the GPU's free memory, or the machine's memory (unknown: no limit).
pub fn kv_memory(device: &Device) -> KvMemory {
    let (budget, total, limit) = match device_memory(device) {
        Some(m) => (m.free / 2, m.total, m.free),
        None => match files::total_memory() {
            Some(total) => (total / 4, total, total),
            None => ((8u64 << 30) / 4, u64::MAX, u64::MAX),
        },
    };
    KvMemory { budget: usize::try_from(budget).unwrap_or(usize::MAX), total, limit }
}

/// Most threads a runtime may ask for per core of the machine: more only adds contention, and
/// an absurd count (1e6) would spawn that many OS threads.
pub const MAX_THREADS_PER_CORE: usize = 4;

/// Option checks that must run before anything is started (threads are spawned from them).
pub fn check_options(opts: &LoadOptions) -> Result<()> {
    crate::kv::sizing::kv_dtype(opts.kv_cache.dtype.as_deref(), DType::F32)?;
    Quantize::parse(opts.quantize.as_deref())?;
    if let Some(n) = opts.threads {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let max = cores * MAX_THREADS_PER_CORE;
        if n == 0 || n > max {
            return Err(EngineError::InvalidArgument(format!(
                "threads must be between 1 and {max} ({MAX_THREADS_PER_CORE} per core of this machine), got {n}"
            )));
        }
    }
    Ok(())
}

/// candle sizes its global CPU pools (the quantized-matmul barrier pool and its rayon pool)
/// from `CANDLE_NUM_THREADS` / `RAYON_NUM_THREADS`; when they are unset it re-reads
/// `/proc/cpuinfo` on every dense matmul (measured: 12–15% of SmolLM2 decode). The first
/// runtime sets them (to `threads`, default one per core) unless the user already has;
/// the pools are per process, so later runtimes share them.
pub fn configure_candle_threads(threads: Option<usize>) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let n = threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
        for var in ["CANDLE_NUM_THREADS", "RAYON_NUM_THREADS"] {
            if std::env::var_os(var).is_none() {
                // Set before any candle pool exists; nothing else reads these variables.
                std::env::set_var(var, n.to_string());
            }
        }
    });
}
