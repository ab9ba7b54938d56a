//! The engine: one thread that owns the model, its sessions' caches and the scheduler loop.
//! Callers (the napi layer, Rust tests) talk to it only through [`Engine`], which sends
//! commands over a channel and hands back a receiver of per-request events. Nothing here
//! blocks the caller's thread except the synchronous `SESSION_BUSY` check.

pub mod context_shift;
pub mod delivery;
pub mod device;
pub mod embedding;
pub mod fit;
pub mod kv_events;
pub mod load;
pub mod persist;
pub mod prepare;
pub mod profile;
pub mod readback;
pub mod request;
pub mod routing;
pub mod scheduler;
pub mod sequence;
pub mod session_file;
pub mod speculative;
pub mod stats;
pub mod structured;
pub mod thinking;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

pub use request::{
    Completion, Event, ExpertChoice, FinishReason, GenerateOptions, Input, Pooling, SessionShared, TokenChunk, ToolChoice,
};
pub use routing::EmbedOptions;
pub use speculative::{DraftModel, SpeculativeOptions};

use crate::error::{EngineError, Result};
use crate::experts::{Expert, ExpertLoadOptions, Registry};
pub use crate::kv::KvCacheOptions;
use crate::model::Decoder;
use crate::tokenizer::{ChatMessage, Tokenizer};
pub use context_shift::ContextShift;
pub use delivery::Delivery;
pub use device::{device_memory, device_name, select_device, DeviceMemory};
pub use load::{load_model, GenerationDefaults, LoadOptions, Loaded};
use prepare::Pending;
use request::{Command, GenerateRequest, Prompt};
use scheduler::{Scheduler, SchedulerConfig, DEFAULT_STEP_TOKENS, DEVICE_STEP_TOKENS};

pub use stats::{EngineStats, StatsSnapshot};

/// The smallest default KV pool (in positions) tried when the budget cannot be reserved.
const MIN_DEFAULT_POOL: usize = 8192;

#[derive(Clone, Debug, serde::Serialize)]
pub struct ModelInfo {
    pub architecture: String,
    /// The family as the checkpoint names it (`granite`, `mistral`, `gemma3_text`, …).
    pub family: String,
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
    /// The RoPE scaling the model runs with (serialized with snake_case keys).
    #[serde(serialize_with = "rope_scaling_snake_case")]
    pub rope_scaling: Option<crate::model::rope::RopeScaling>,
    /// What the KV pool stores keys and values as.
    pub kv_cache_dtype: String,
    /// What the weights run as: `none` (dense), or their block formats, most bytes first.
    pub quantization: String,
    /// Bytes of the weights (mapped weights count the file bytes they read).
    pub weight_bytes: u64,
    /// What the caller should know about how the model runs (a context past what it supports).
    pub warnings: Vec<String>,
}

fn rope_scaling_snake_case<S: serde::Serializer>(
    v: &Option<crate::model::rope::RopeScaling>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&v.as_ref().map(|r| r.to_json(false)), s)
}

pub struct Engine {
    tx: Mutex<Option<Sender<Command>>>,
    pub info: ModelInfo,
    next_session: AtomicU64,
    /// The model's memory as callers reach it; [`Engine::shutdown`] drops it, so a disposed
    /// runtime frees its weights, experts and KV pool whatever handles (sessions, experts,
    /// streams) the caller still holds.
    live: RwLock<Option<Live>>,
    stats: Arc<EngineStats>,
    router: RwLock<Arc<crate::experts::router::Router>>,
    /// The router's generic reference queries, embedded when the first expert with routing
    /// examples loads.
    generic_reference: GenericReference,
    /// The resident experts' keyword index, with the registry generation it was built for.
    route_index: routing::IndexCache,
    /// Where the model was loaded from, and its fingerprint once computed (`persist`).
    model_path: std::path::PathBuf,
    fingerprint: std::sync::OnceLock<std::result::Result<String, String>>,
}

type GenericReference = Arc<Mutex<Option<Arc<Vec<Vec<f32>>>>>>;

struct Live {
    tokenizer: Arc<Tokenizer>,
    /// The tokenizer with its grammar compiler, for preparing requests.
    formats: Arc<structured::Formats>,
    /// Read-only weights, shared with the engine thread: expert loading validates and builds
    /// adapters against them on its own thread.
    model: Arc<Decoder>,
    experts: Arc<Registry>,
}

/// A session's handle: its id and the state shared with the engine.
#[derive(Clone)]
pub struct SessionHandle {
    pub id: u64,
    pub shared: Arc<SessionShared>,
}

/// A running request: its event stream, its cancellation flag, and the record of what its
/// consumer received.
pub struct Generation {
    pub events: UnboundedReceiver<Event>,
    pub cancel: Arc<AtomicBool>,
    pub delivery: Delivery,
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
        if let Err(e) = load::check_options(&opts) {
            let _ = ready_tx.send(Err(e));
            return ready_rx;
        }
        let path = path.to_path_buf();
        load::configure_candle_threads(opts.threads);
        // The engine's threads read the model's files and run its chat template and grammars'
        // masks: untrusted input (`crate::stack`).
        let spawned = crate::stack::untrusted_thread("expert-runtime-engine").spawn(move || {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(opts.threads.unwrap_or(0))
                .stack_size(crate::stack::UNTRUSTED_STACK)
                .build();
            let pool = match pool {
                Ok(p) => p,
                Err(e) => {
                    let _ = ready_tx.send(Err(EngineError::Internal(format!("thread pool: {e}"))));
                    return;
                }
            };
            pool.install(move || match catch_panic(|| Self::start(&path, &opts, progress)) {
                Ok((engine, scheduler, rx)) => {
                    if ready_tx.send(Ok(engine)).is_ok() {
                        scheduler.run(rx);
                    }
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            });
        });
        if let Err(e) = spawned {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let _ = tx.send(Err(EngineError::Internal(format!("cannot start the engine thread: {e}"))));
            return rx;
        }
        ready_rx
    }

    /// Loads the model and builds the engine's parts: the handle callers hold, the scheduler
    /// the engine thread runs, and the command channel between them.
    fn start(
        path: &Path,
        opts: &LoadOptions,
        progress: Box<dyn Fn(u64, u64) + Send>,
    ) -> Result<(Arc<Engine>, Scheduler, Receiver<Command>)> {
        let device = select_device(opts.device.as_deref())?;
        let loaded = load_model(path, opts, &device, &*progress);
        // Release the progress callback now: a JS callback held past the load would keep the
        // event loop alive.
        drop(progress);
        let Loaded { model, tokenizer, defaults, warnings, kv_room } = loaded?;
        let eos = load::end_of_generation_ids(&model.cfg, &defaults, Some(&tokenizer));
        let context_length = model.max_positions();
        let kv_dtype = crate::kv::sizing::kv_dtype(opts.kv_cache.dtype.as_deref(), model.dtype)?;
        let info = ModelInfo {
            architecture: model.cfg.arch.name().into(),
            family: model.cfg.family.clone(),
            dtype: load::dtype_name(model.dtype).into(),
            device: if model.device.is_cpu() { "cpu".into() } else { "cuda".into() },
            device_name: device_name(&model.device),
            device_memory_total: device_memory(&model.device).map(|m| m.total),
            vocab_size: model.cfg.vocab_size,
            context_length,
            num_layers: model.cfg.num_layers,
            hidden_size: model.cfg.hidden_size,
            eos_token_ids: eos.clone(),
            rope_scaling: model.cfg.rope_scaling.clone(),
            kv_cache_dtype: kv_dtype.name().into(),
            quantization: model.quantization(),
            weight_bytes: model.weight_bytes() as u64,
            warnings,
        };
        let (tokenizer, model) = (Arc::new(tokenizer), Arc::new(model));
        let stats = Arc::new(EngineStats::default());
        // The pool holds `maxTokens` positions of every layer that keeps positions: a block
        // per table group per `blockSize` positions (a group's unused slots included).
        let layout = model.kv_layout();
        let tables = layout.tables.len().max(1);
        let bytes_per_token = layout.pool_bytes_per_token(model.cfg.num_kv_heads, model.cfg.head_dim, kv_dtype);
        let mut memory = load::kv_memory(&model.device);
        // Under a budget the pool takes what the weights leave of it: all of it for
        // `contextLength: 'auto'` (whose context was chosen to fit there), at most that otherwise.
        if let Some(room) = kv_room {
            let room_usize = usize::try_from(room).unwrap_or(usize::MAX);
            memory.budget = if opts.context_auto { room_usize } else { memory.budget.min(room_usize) };
            memory.limit = memory.limit.min(room);
        }
        // Recurrent layers' states come first: a slot per sequence that may hold one.
        let (state_slots, memory, max_bytes) =
            crate::kv::sizing::state_slots(&opts.kv_cache, layout.state_bytes_per_sequence(), memory)?;
        let kv_opts = crate::kv::KvCacheOptions { max_bytes, ..opts.kv_cache.clone() };
        let (num_blocks, block_size) = crate::kv::sizing::pool_shape(&kv_opts, bytes_per_token, context_length, memory)?;
        let num_blocks = num_blocks.saturating_mul(tables).min(u32::MAX as usize - 1);
        let mut cfg = SchedulerConfig {
            context_length,
            num_blocks,
            block_size,
            step_tokens: if model.device.is_cpu() { DEFAULT_STEP_TOKENS } else { DEVICE_STEP_TOKENS },
            prefix_cache: opts.kv_cache.prefix_cache.unwrap_or(true),
            kv_dtype,
            idle_release: crate::kv::sizing::idle_release(&opts.kv_cache),
            state_slots,
            disk: None,
        };
        // A disk tier's keys start from the model's fingerprint (its files are read once, here)
        // and the pool's layout: blocks are only ever found by the model and pool that wrote them.
        let fingerprint = std::sync::OnceLock::new();
        if let Some(disk) = &opts.kv_cache.disk {
            let _ = std::fs::create_dir_all(&disk.dir);
            let fp = persist::fingerprint_remembered(&info, path, &disk.dir)
                .map_err(|e| EngineError::Internal(format!("cannot fingerprint the model: {e}")))?;
            let layout = format!(
                "{}|{}|{}|{}|{}|{}",
                kv_dtype.name(),
                block_size,
                model.cfg.num_layers,
                model.cfg.num_kv_heads,
                model.cfg.head_dim,
                bytes_per_token
            );
            cfg.disk = Some((disk.clone(), crate::kv::disk::DiskTier::namespace(&fp, &layout)));
            let _ = fingerprint.set(Ok(fp));
        }
        // The default pool is "what the budget holds": where the process may not reserve that
        // much (an address-space limit, an overcommit policy), take half, down to one context
        // or MIN_DEFAULT_POOL positions. A pool the caller sized is what they asked for, or an
        // error.
        let floor = context_length.min(MIN_DEFAULT_POOL);
        let scheduler = loop {
            match Scheduler::new(model.clone(), tokenizer.clone(), defaults.clone(), eos.clone(), cfg.clone(), stats.clone()) {
                Err(EngineError::OutOfMemory(_))
                    if opts.kv_cache.max_tokens.is_none()
                        && opts.kv_cache.max_bytes.is_none()
                        && (cfg.num_blocks / 2) * block_size >= floor =>
                {
                    cfg.num_blocks /= 2
                }
                r => break r?,
            }
        };
        let (tx, rx) = channel();
        let formats = Arc::new(structured::Formats::new(tokenizer.clone(), model.cfg.vocab_size, info.eos_token_ids.clone()));
        let live = Live { tokenizer, formats, model, experts: Arc::new(Registry::default()) };
        let engine = Arc::new(Engine {
            tx: Mutex::new(Some(tx)),
            info,
            next_session: AtomicU64::new(1),
            live: RwLock::new(Some(live)),
            stats,
            router: RwLock::new(Arc::new(crate::experts::router::Router::new(Default::default())?)),
            generic_reference: GenericReference::default(),
            route_index: routing::IndexCache::default(),
            model_path: path.to_path_buf(),
            fingerprint,
        });
        Ok((engine, scheduler, rx))
    }

    /// Blocking load, for Rust callers and tests.
    pub fn load_blocking(path: &Path, opts: LoadOptions) -> Result<Arc<Engine>> {
        Self::spawn(path, opts, Box::new(|_, _| {}))
            .blocking_recv()
            .map_err(|_| EngineError::Internal("the engine thread exited during load".into()))?
    }

    fn send(&self, cmd: Command) -> Result<()> {
        self.sender()?.send(cmd).map_err(|_| EngineError::Disposed("the engine has stopped".into()))
    }

    fn sender(&self) -> Result<Sender<Command>> {
        self.tx.lock().unwrap().clone().ok_or_else(disposed)
    }

    /// Runs `f` on the live parts; `DISPOSED` after [`Self::shutdown`].
    fn with_live<T>(&self, f: impl FnOnce(&Live) -> T) -> Result<T> {
        self.live.read().unwrap().as_ref().map(f).ok_or_else(disposed)
    }

    /// The model's tokenizer and chat template.
    pub fn tokenizer(&self) -> Result<Arc<Tokenizer>> {
        self.with_live(|l| l.tokenizer.clone())
    }

    /// The resident experts.
    pub fn experts(&self) -> Result<Arc<Registry>> {
        self.with_live(|l| l.experts.clone())
    }

    /// A session; `experts` is its default expert set (names must be loaded) or `Auto`.
    pub fn create_session(&self, system: Option<String>, experts: ExpertChoice) -> Result<SessionHandle> {
        self.create_session_with(system, experts, ContextShift::None)
    }

    /// [`Self::create_session`] with what a chat turn that does not fit the context does.
    pub fn create_session_with(
        &self,
        system: Option<String>,
        experts: ExpertChoice,
        context_shift: ContextShift,
    ) -> Result<SessionHandle> {
        if let ExpertChoice::Named(names) = &experts {
            self.experts()?.resolve(names)?;
        }
        let id = self.next_session.fetch_add(1, Ordering::Relaxed);
        let history = system.iter().map(|s| ChatMessage::new("system", s.clone())).collect();
        let shared = Arc::new(SessionShared {
            busy: AtomicBool::new(false),
            history: Mutex::new(history),
            system,
            experts: Mutex::new(experts),
            context_shift,
        });
        self.send(Command::CreateSession { id, shared: shared.clone() })?;
        Ok(SessionHandle { id, shared })
    }

    /// Queues a request: it is tokenized on a preparation thread ([`prepare`]), then runs on
    /// the engine thread. Fails at once with `SESSION_BUSY` when the session is running one.
    pub fn generate(&self, session: &SessionHandle, input: Input, options: GenerateOptions) -> Result<Generation> {
        if session.shared.busy.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return Err(EngineError::SessionBusy("this session is already generating; await it or cancel it first".into()));
        }
        self.queue(session, input, options).inspect_err(|_| session.shared.busy.store(false, Ordering::Release))
    }

    fn queue(&self, session: &SessionHandle, input: Input, options: GenerateOptions) -> Result<Generation> {
        prepare::check_input(&input, self.info.context_length)?;
        let tx = self.sender()?;
        let live = self.live.read().unwrap();
        let live = live.as_ref().ok_or_else(disposed)?;
        // The request pins its experts now (or when the router has chosen them): a later
        // unload or hot-swap does not affect it.
        if let Some(d) = options.speculative.as_ref().and_then(|s| s.draft.as_ref()) {
            d.check_compatible(live.model.cfg.vocab_size, &live.tokenizer)?;
        }
        let choice = options.experts.clone().unwrap_or_else(|| session.shared.experts.lock().unwrap().clone());
        let experts = match &choice {
            ExpertChoice::Named(names) => live.experts.resolve(names)?,
            ExpertChoice::Auto => crate::experts::ExpertSet::none(),
        };
        let (events_tx, events) = unbounded_channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let delivery = Delivery::new(session.id, session.shared.clone(), tx.clone());
        let request = GenerateRequest {
            session: session.id,
            prompt: Prompt::Tokens(Vec::new()),
            options,
            experts,
            routing: None,
            events: events_tx,
            cancel: cancel.clone(),
            structured: Default::default(),
            thinking: None,
        };
        let pending = Pending { input, shared: session.shared.clone(), request, tx, context_length: self.info.context_length };
        match choice {
            ExpertChoice::Named(_) => prepare::submit(live.formats.clone(), pending)?,
            ExpertChoice::Auto => self.route_and_submit(live, pending)?,
        }
        Ok(Generation { events, cancel, delivery })
    }

    /// This runtime's model as another runtime's draft model (`speculative: { type: 'draft' }`).
    pub fn draft_model(&self) -> Result<DraftModel> {
        let live = self.live.read().unwrap();
        let live = live.as_ref().ok_or_else(disposed)?;
        Ok(DraftModel { decoder: live.model.clone(), tokenizer: live.tokenizer.clone() })
    }

    /// Replaces the session's default expert set. Refused with `SESSION_BUSY` while the session
    /// generates (a running request keeps the set it started with); the next request
    /// re-evaluates the session's history under the new set.
    pub fn set_session_experts(&self, session: &SessionHandle, experts: ExpertChoice) -> Result<()> {
        if session.shared.busy.load(Ordering::Acquire) {
            return Err(EngineError::SessionBusy("cannot change the experts of a session while it is generating".into()));
        }
        if let ExpertChoice::Named(names) = &experts {
            self.experts()?.resolve(names)?;
        }
        *session.shared.experts.lock().unwrap() = experts;
        Ok(())
    }

    /// Reads and validates a PEFT adapter on a thread of its own (the engine thread keeps
    /// generating), then makes it available by name. Resolves with the resident expert.
    pub fn load_expert(&self, path: &Path, opts: ExpertLoadOptions) -> tokio::sync::oneshot::Receiver<Result<Arc<Expert>>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let parts =
            self.with_live(|l| (l.model.clone(), l.experts.clone(), l.tokenizer.clone())).and_then(|p| Ok((p, self.sender()?)));
        let ((model, registry, tok), sender) = match parts {
            Ok(parts) => parts,
            Err(e) => {
                let _ = tx.send(Err(e));
                return rx;
            }
        };
        let path = path.to_path_buf();
        let generic = self.generic_reference.clone();
        // With a disk tier, blocks computed under the adapter are kept there under its
        // fingerprint, which reads its files.
        let fingerprint = self.stats.kv_disk_enabled.load(Ordering::Relaxed);
        let spawned = crate::stack::untrusted_thread("expert-runtime-adapter").spawn(move || {
            let r = catch_panic(|| {
                crate::backend::bind_thread(&model.device)?;
                let mut e = crate::experts::load_expert(&path, &opts, &model, registry.next_id())?;
                e.source = Some((path.clone(), opts.scale));
                if fingerprint {
                    e.fingerprint()?;
                }
                // The manifest's routing examples, embedded by the base model on the engine
                // thread (this thread waits; generation goes on).
                routing::embed_examples(&tok, &sender, &generic, &mut e)?;
                let e = Arc::new(e);
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
        self.load_expert(path, opts).blocking_recv().map_err(|_| EngineError::Internal("the adapter loader exited".into()))?
    }

    /// Removes an expert from the registry; its memory is freed when no running request pins
    /// it any more. `false` when it was not loaded (already unloaded).
    pub fn unload_expert(&self, name: &str, id: u64) -> bool {
        self.experts().is_ok_and(|r| r.remove(name, id))
    }

    /// Clears the session's history (back to its system prompt) and cache.
    pub fn reset_session(&self, session: &SessionHandle) -> Result<()> {
        let system = session.shared.system.iter().map(|s| ChatMessage::new("system", s.clone())).collect();
        self.replace_history(session, system, "reset a session")
    }

    /// Replaces the session's history with `messages` (a saved conversation, say) without
    /// generating; the session's token stream starts over, and the next turn reuses whatever
    /// of the rendered conversation is still cached. `SESSION_BUSY` while generating.
    pub fn set_history(&self, session: &SessionHandle, messages: Vec<ChatMessage>) -> Result<()> {
        self.replace_history(session, messages, "set the history of a session")
    }

    /// The session's history becomes `messages` and its token stream starts over.
    fn replace_history(&self, session: &SessionHandle, messages: Vec<ChatMessage>, what: &str) -> Result<()> {
        if session.shared.busy.load(Ordering::Acquire) {
            return Err(EngineError::SessionBusy(format!("cannot {what} while it is generating")));
        }
        *session.shared.history.lock().unwrap() = messages;
        self.send(Command::ResetSession { id: session.id })
    }

    pub fn drop_session(&self, id: u64) {
        let _ = self.send(Command::DropSession { id });
    }

    /// Stops the engine thread after cancelling what runs; resolves when the model is freed.
    pub fn shutdown(&self) -> tokio::sync::oneshot::Receiver<()> {
        // Drop the caller side's references first: the engine thread holds the last ones.
        // (An expert load in flight keeps the weights until it ends.)
        let live = self.live.write().unwrap().take();
        drop(live);
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
        let mut s = self.stats.snapshot();
        s.memory.weights = self.info.weight_bytes;
        s.memory.experts =
            self.with_live(|l| l.experts.list().iter().fold(0u64, |n, e| n.saturating_add(e.bytes as u64))).unwrap_or(0);
        s
    }

    pub fn is_disposed(&self) -> bool {
        self.tx.lock().unwrap().is_none()
    }

    /// Starts recording KV events for a publisher (see [`kv_events`]); they are taken with
    /// [`Self::take_kv_events`].
    pub fn start_kv_events(&self) {
        self.stats.kv_events.start();
    }

    /// Up to `max` KV events, oldest first.
    pub fn take_kv_events(&self, max: usize) -> Vec<crate::kv::prefix::IndexEvent> {
        self.stats.kv_events.take(max)
    }

    /// Positions per KV block.
    pub fn kv_block_size(&self) -> usize {
        self.stats.kv_block_size.load(Ordering::Relaxed) as usize
    }
}

fn disposed() -> EngineError {
    EngineError::Disposed("the runtime was disposed".into())
}

fn catch_panic<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|p| Err(EngineError::Internal(format!("panic while loading: {}", crate::error::panic_message(&*p)))))
}
