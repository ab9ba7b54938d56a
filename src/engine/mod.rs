//! The engine: one thread that owns the model, its sessions' caches and the scheduler loop.
//! Callers (the napi layer, Rust tests) talk to it only through [`Engine`], which sends
//! commands over a channel and hands back a receiver of per-request events. Nothing here
//! blocks the caller's thread except the synchronous `SESSION_BUSY` check.

pub mod device;
pub mod request;
pub mod scheduler;
pub mod sequence;
pub mod stats;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};

use candle_core::{DType, Device};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

pub use request::{Completion, Event, FinishReason, GenerateOptions, Input, SessionShared, TokenChunk};

pub use device::{device_memory, device_name, select_device, DeviceMemory};
use crate::experts::{Expert, ExpertLoadOptions, Registry};
use crate::error::{EngineError, Result};
use crate::model::config::token_id_list;
use crate::model::loader::{self, GgufSource, SafetensorsSource, WeightSource};
use crate::model::{Decoder, ModelConfig};
use crate::tokenizer::{ChatMessage, Tokenizer};
use request::{Command, GenerateRequest};
use scheduler::{Scheduler, SchedulerConfig, DEFAULT_STEP_TOKENS};
pub use stats::{EngineStats, StatsSnapshot};

#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// `auto` | `cpu` | `cuda` | `cuda:N`.
    pub device: Option<String>,
    /// `auto` | `f32` | `f16` | `bf16`.
    pub dtype: Option<String>,
    pub context_length: Option<usize>,
    pub threads: Option<usize>,
    /// Dequantize GGUF weights at load (exact f32 matmuls instead of quantized kernels).
    pub dequantize: bool,
    pub kv_cache: KvCacheOptions,
}

/// Bounds of the shared KV pool.
#[derive(Clone, Debug, Default)]
pub struct KvCacheOptions {
    /// Positions per block (default 16).
    pub block_size: Option<usize>,
    /// Positions the pool holds over all sessions (default: see [`default_kv_tokens`]).
    pub max_tokens: Option<usize>,
    /// Share full blocks between sequences with the same prefix (default true).
    pub prefix_cache: Option<bool>,
}

pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// The default pool size in positions: a quarter of the machine's memory on CPU, half of the
/// GPU memory still free after the weights on CUDA; at most 64 full contexts, at least one
/// block. On CPU the memory is committed only as blocks are first written; on a GPU the pool
/// is allocated at load.
pub fn default_kv_tokens(device: &Device, bytes_per_token: usize, context_length: usize) -> usize {
    let budget = match device_memory(device) {
        Some(m) => m.free as usize / 2,
        None => total_memory().unwrap_or(8 << 30) / 4,
    };
    (budget / bytes_per_token.max(1)).min(64 * context_length)
}

fn total_memory() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// `(blocks, block size)` of the pool for `model`.
fn kv_pool_shape(opts: &KvCacheOptions, model: &Decoder, context_length: usize) -> Result<(usize, usize)> {
    let bs = opts.block_size.unwrap_or(DEFAULT_BLOCK_SIZE);
    if bs == 0 || bs > 1024 {
        return Err(EngineError::InvalidArgument(format!("kvCache.blockSize must be between 1 and 1024 (got {bs})")));
    }
    let bpt = crate::kv::store::bytes_per_token(model.cfg.num_layers, model.cfg.num_kv_heads, model.cfg.head_dim, model.dtype);
    let tokens = match opts.max_tokens {
        Some(n) if n < bs => {
            return Err(EngineError::InvalidArgument(format!(
                "kvCache.maxTokens must be at least one block ({bs} positions; got {n})"
            )))
        }
        Some(n) => n,
        None => default_kv_tokens(&model.device, bpt, context_length).max(bs),
    };
    Ok((tokens / bs, bs))
}

/// Sampling defaults from `generation_config.json`.
#[derive(Clone, Debug, Default)]
pub struct GenerationDefaults {
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub eos_token_ids: Vec<u32>,
}

#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub architecture: String,
    pub dtype: String,
    /// `cpu` | `cuda`.
    pub device: String,
    /// `cpu`, or the GPU's name.
    pub device_name: String,
    /// The GPU's memory in bytes; `None` on CPU.
    pub device_memory_total: Option<u64>,
    pub vocab_size: usize,
    pub context_length: usize,
    pub num_layers: usize,
    pub hidden_size: usize,
    pub eos_token_ids: Vec<u32>,
}

pub struct Engine {
    tx: Mutex<Option<Sender<Command>>>,
    pub info: ModelInfo,
    pub tokenizer: Arc<Tokenizer>,
    next_session: AtomicU64,
    /// Read-only weights, shared with the engine thread: expert loading validates and builds
    /// adapters against them on its own thread.
    model: Arc<Decoder>,
    pub experts: Arc<Registry>,
    stats: Arc<EngineStats>,
}

/// A session's handle: its id and the state shared with the engine.
#[derive(Clone)]
pub struct SessionHandle {
    pub id: u64,
    pub shared: Arc<SessionShared>,
}

/// A running request: its event stream and its cancellation flag.
pub struct Generation {
    pub events: UnboundedReceiver<Event>,
    pub cancel: Arc<AtomicBool>,
}

fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        _ => "other",
    }
}

/// `auto` on CPU is f32: candle's CPU matmuls are fastest in f32 (f16 and especially bf16
/// go through slower conversion paths) and f32 is exact. On CUDA it is bf16.
fn select_dtype(name: Option<&str>, device: &Device) -> Result<DType> {
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

fn read_generation_config(dir: &Path) -> Result<GenerationDefaults> {
    let p = dir.join("generation_config.json");
    let Ok(text) = std::fs::read_to_string(&p) else { return Ok(GenerationDefaults::default()) };
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| EngineError::invalid_model(p.display(), e))?;
    let f = |k: &str| v.get(k).and_then(|x| x.as_f64()).map(|x| x as f32);
    let sample = v.get("do_sample").and_then(|x| x.as_bool()).unwrap_or(true);
    Ok(GenerationDefaults {
        // `do_sample: false` in HF means greedy.
        temperature: if sample { f("temperature") } else { Some(0.0) },
        top_k: v.get("top_k").and_then(|x| x.as_u64()).map(|x| x as usize),
        top_p: f("top_p"),
        min_p: f("min_p"),
        repetition_penalty: f("repetition_penalty"),
        eos_token_ids: token_id_list(v.get("eos_token_id")),
    })
}

/// A model read from disk, before it is handed to an engine thread.
pub struct Loaded {
    pub model: Decoder,
    pub tokenizer: Tokenizer,
    pub defaults: GenerationDefaults,
}

/// Reads a model directory or GGUF file (used by the engine thread and by tests/benches).
pub fn load_model(path: &Path, opts: &LoadOptions, device: &Device, progress: &dyn Fn(u64, u64)) -> Result<Loaded> {
    if !path.exists() {
        return Err(EngineError::ModelNotFound(path.display().to_string()));
    }
    let dtype = select_dtype(opts.dtype.as_deref(), device)?;
    let ctx = |cfg: &ModelConfig| -> Result<usize> {
        match opts.context_length {
            Some(0) => Err(EngineError::InvalidArgument("contextLength must be positive".into())),
            Some(n) if n > cfg.max_position_embeddings => Err(EngineError::InvalidArgument(format!(
                "contextLength {n} exceeds the model's maximum of {} (RoPE scaling is not supported yet)",
                cfg.max_position_embeddings
            ))),
            Some(n) => Ok(n),
            None => Ok(cfg.max_position_embeddings),
        }
    };
    if path.is_dir() {
        let cfg_path = path.join("config.json");
        let text = std::fs::read_to_string(&cfg_path)
            .map_err(|e| EngineError::InvalidModel(format!("{}: {e}", cfg_path.display())))?;
        let cfg = ModelConfig::from_hf_json(&text)?;
        let tokenizer = Tokenizer::from_dir(path).map_err(EngineError::InvalidModel)?;
        let defaults = read_generation_config(path)?;
        let files = loader::safetensors_files(path)?;
        let mut src = SafetensorsSource::open(&files, device, Some(progress))?;
        let n = ctx(&cfg)?;
        let model = Decoder::load(cfg, &mut src, dtype, device, n)?;
        Ok(Loaded { model, tokenizer, defaults })
    } else if loader::is_gguf(path) {
        let mut src = GgufSource::open(path, device, Some(progress))?.dequantize(opts.dequantize);
        let mut cfg = ModelConfig::from_gguf(src.metadata())?;
        cfg.tie_word_embeddings = !src.contains("lm_head");
        let tokenizer = Tokenizer::from_gguf(src.metadata()).map_err(EngineError::InvalidModel)?;
        let n = ctx(&cfg)?;
        let model = Decoder::load(cfg, &mut src as &mut dyn WeightSource, dtype, device, n)?;
        Ok(Loaded { model, tokenizer, defaults: GenerationDefaults::default() })
    } else {
        Err(EngineError::InvalidModel(format!(
            "{} is neither a model directory nor a GGUF file",
            path.display()
        )))
    }
}

/// candle sizes its global CPU pools (the quantized-matmul barrier pool and its rayon pool)
/// from `CANDLE_NUM_THREADS` / `RAYON_NUM_THREADS`; when they are unset it re-reads
/// `/proc/cpuinfo` on every dense matmul (measured: 12–15% of SmolLM2 decode). The first
/// runtime sets them (to `threads`, default one per core) unless the user already has;
/// the pools are per process, so later runtimes share them.
fn configure_candle_threads(threads: Option<usize>) {
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

impl Engine {
    /// Starts the engine thread, which loads the model; the receiver resolves once the model is
    /// ready (or failed to load). `progress` is called on the engine thread.
    pub fn spawn(
        path: &Path,
        opts: LoadOptions,
        progress: Box<dyn Fn(u64, u64) + Send>,
    ) -> tokio::sync::oneshot::Receiver<Result<Arc<Engine>>> {
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let path = path.to_path_buf();
        configure_candle_threads(opts.threads);
        let spawned = std::thread::Builder::new().name("expert-runtime-engine".into()).spawn(move || {
            let pool = match rayon::ThreadPoolBuilder::new().num_threads(opts.threads.unwrap_or(0)).build() {
                Ok(p) => p,
                Err(e) => {
                    let _ = ready_tx.send(Err(EngineError::Internal(format!("thread pool: {e}"))));
                    return;
                }
            };
            pool.install(move || {
                let loaded = catch_panic(|| {
                    let device = select_device(opts.device.as_deref())?;
                    load_model(&path, &opts, &device, &*progress)
                });
                // Release the progress callback now: a JS callback held past the load would
                // keep the event loop alive.
                drop(progress);
                let Loaded { model, tokenizer, defaults } = match loaded {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let mut eos: Vec<u32> = model.cfg.eos_token_ids.clone();
                eos.extend(defaults.eos_token_ids.iter().copied());
                eos.extend(tokenizer.eos_token_ids());
                eos.sort_unstable();
                eos.dedup();
                let context_length = model.max_positions();
                let info = ModelInfo {
                    architecture: model.cfg.arch.name().into(),
                    dtype: dtype_name(model.dtype).into(),
                    device: if model.device.is_cpu() { "cpu".into() } else { "cuda".into() },
                    device_name: device_name(&model.device),
                    device_memory_total: device_memory(&model.device).map(|m| m.total),
                    vocab_size: model.cfg.vocab_size,
                    context_length,
                    num_layers: model.cfg.num_layers,
                    hidden_size: model.cfg.hidden_size,
                    eos_token_ids: eos.clone(),
                };
                let tokenizer = Arc::new(tokenizer);
                let model = Arc::new(model);
                let stats = Arc::new(EngineStats::default());
                let scheduler = kv_pool_shape(&opts.kv_cache, &model, context_length).and_then(|(num_blocks, block_size)| {
                    let cfg = SchedulerConfig {
                        context_length,
                        num_blocks,
                        block_size,
                        step_tokens: DEFAULT_STEP_TOKENS,
                        prefix_cache: opts.kv_cache.prefix_cache.unwrap_or(true),
                    };
                    Scheduler::new(model.clone(), tokenizer.clone(), defaults, eos.clone(), cfg, stats.clone())
                });
                let scheduler = match scheduler {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let (tx, rx) = channel();
                let engine = Arc::new(Engine {
                    tx: Mutex::new(Some(tx)),
                    info,
                    tokenizer: tokenizer.clone(),
                    next_session: AtomicU64::new(1),
                    model: model.clone(),
                    experts: Arc::new(Registry::default()),
                    stats,
                });
                if ready_tx.send(Ok(engine)).is_err() {
                    return;
                }
                scheduler.run(rx);
            });
        });
        if let Err(e) = spawned {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let _ = tx.send(Err(EngineError::Internal(format!("cannot start the engine thread: {e}"))));
            return rx;
        }
        ready_rx
    }

    /// Blocking load, for Rust callers and tests.
    pub fn load_blocking(path: &Path, opts: LoadOptions) -> Result<Arc<Engine>> {
        Self::spawn(path, opts, Box::new(|_, _| {}))
            .blocking_recv()
            .map_err(|_| EngineError::Internal("the engine thread exited during load".into()))?
    }

    fn send(&self, cmd: Command) -> Result<()> {
        let tx = self.tx.lock().unwrap();
        let tx = tx.as_ref().ok_or_else(|| EngineError::Disposed("the runtime was disposed".into()))?;
        tx.send(cmd).map_err(|_| EngineError::Disposed("the engine has stopped".into()))
    }

    /// A session; `experts` is its default expert set (names must be loaded).
    pub fn create_session(&self, system: Option<String>, experts: Vec<String>) -> Result<SessionHandle> {
        self.experts.resolve(&experts)?;
        let id = self.next_session.fetch_add(1, Ordering::Relaxed);
        let history = system.iter().map(|s| ChatMessage { role: "system".into(), content: s.clone() }).collect();
        let shared = Arc::new(SessionShared {
            busy: AtomicBool::new(false),
            history: Mutex::new(history),
            system,
            experts: Mutex::new(experts),
        });
        self.send(Command::CreateSession { id, shared: shared.clone() })?;
        Ok(SessionHandle { id, shared })
    }

    /// Queues a request. Fails at once with `SESSION_BUSY` when the session is running one.
    pub fn generate(&self, session: &SessionHandle, input: Input, options: GenerateOptions) -> Result<Generation> {
        if session.shared.busy.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return Err(EngineError::SessionBusy("this session is already generating; await it or cancel it first".into()));
        }
        // The request pins its experts now: a later unload or hot-swap does not affect it.
        let names = options.experts.clone().unwrap_or_else(|| session.shared.experts.lock().unwrap().clone());
        let experts = match self.experts.resolve(&names) {
            Ok(set) => set,
            Err(e) => {
                session.shared.busy.store(false, Ordering::Release);
                return Err(e);
            }
        };
        let (events_tx, events) = unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let req = GenerateRequest { session: session.id, input, options, experts, events: events_tx, cancel: cancel.clone() };
        if let Err(e) = self.send(Command::Generate(Box::new(req))) {
            session.shared.busy.store(false, Ordering::Release);
            return Err(e);
        }
        Ok(Generation { events, cancel })
    }

    /// Replaces the session's default expert set. Refused with `SESSION_BUSY` while the session
    /// generates (a running request keeps the set it started with); the next request
    /// re-evaluates the session's history under the new set.
    pub fn set_session_experts(&self, session: &SessionHandle, names: Vec<String>) -> Result<()> {
        if session.shared.busy.load(Ordering::Acquire) {
            return Err(EngineError::SessionBusy("cannot change the experts of a session while it is generating".into()));
        }
        self.experts.resolve(&names)?;
        *session.shared.experts.lock().unwrap() = names;
        Ok(())
    }

    /// Reads and validates a PEFT adapter on a thread of its own (the engine thread keeps
    /// generating), then makes it available by name. Resolves with the resident expert.
    pub fn load_expert(&self, path: &Path, opts: ExpertLoadOptions) -> tokio::sync::oneshot::Receiver<Result<Arc<Expert>>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.is_disposed() {
            let _ = tx.send(Err(EngineError::Disposed("the runtime was disposed".into())));
            return rx;
        }
        let (model, registry, path) = (self.model.clone(), self.experts.clone(), path.to_path_buf());
        let spawned = std::thread::Builder::new().name("expert-runtime-adapter".into()).spawn(move || {
            let r = catch_panic(|| {
                let e = Arc::new(crate::experts::load_expert(&path, &opts, &model, registry.next_id())?);
                registry.insert(e.clone())?;
                Ok(e)
            });
            let _ = tx.send(r);
        });
        if let Err(e) = spawned {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let _ = tx.send(Err(EngineError::Internal(format!("cannot start the adapter loader: {e}"))));
            return rx;
        }
        rx
    }

    /// Blocking [`Self::load_expert`], for Rust callers and tests.
    pub fn load_expert_blocking(&self, path: &Path, opts: ExpertLoadOptions) -> Result<Arc<Expert>> {
        self.load_expert(path, opts)
            .blocking_recv()
            .map_err(|_| EngineError::Internal("the adapter loader exited".into()))?
    }

    /// Removes an expert from the registry; its memory is freed when no running request pins
    /// it any more. `false` when it was not loaded (already unloaded).
    pub fn unload_expert(&self, name: &str, id: u64) -> bool {
        self.experts.remove(name, id)
    }

    /// Clears the session's history (back to its system prompt) and cache.
    pub fn reset_session(&self, session: &SessionHandle) -> Result<()> {
        if session.shared.busy.load(Ordering::Acquire) {
            return Err(EngineError::SessionBusy("cannot reset a session while it is generating".into()));
        }
        let mut h = session.shared.history.lock().unwrap();
        h.clear();
        if let Some(s) = &session.shared.system {
            h.push(ChatMessage { role: "system".into(), content: s.clone() });
        }
        self.send(Command::ResetSession { id: session.id })
    }

    pub fn drop_session(&self, id: u64) {
        let _ = self.send(Command::DropSession { id });
    }

    /// Stops the engine thread after cancelling what runs; resolves when the model is freed.
    pub fn shutdown(&self) -> tokio::sync::oneshot::Receiver<()> {
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        match self.tx.lock().unwrap().take() {
            Some(tx) => {
                if tx.send(Command::Shutdown { done: done_tx }).is_err() {
                    // Already stopped: resolve at once.
                    let (t, r) = tokio::sync::oneshot::channel();
                    let _ = t.send(());
                    return r;
                }
            }
            None => {
                let _ = done_tx.send(());
            }
        }
        done_rx
    }

    /// KV pool and scheduler counters, as of the engine's last step.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    pub fn is_disposed(&self) -> bool {
        self.tx.lock().unwrap().is_none()
    }
}

fn catch_panic<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
        Err(EngineError::Internal(format!("panic while loading: {}", msg.unwrap_or_default())))
    })
}
