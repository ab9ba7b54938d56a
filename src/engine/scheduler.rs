//! The engine loop: continuous batching over a paged, prefix-shared KV pool.
//!
//! Every round the loop (1) takes the commands that arrived, (2) drops cancelled requests,
//! (3) admits queued requests in arrival order while the pool has room, and (4) runs **one
//! forward pass for every running request**: each decoding request contributes one row and
//! each prefilling one a chunk of its prompt, within a per-step token budget, so a long prompt
//! never stalls the others and a new session's first token arrives while the rest decode.
//! Rows are ordered by expert set: each set is one segment whose adapters apply to its rows
//! only.
//!
//! Memory: a session keeps its blocks between turns (its next turn reuses them). A request is
//! admitted only once it holds every block it can need (`prompt + maxTokens`, capped by the
//! context and the pool), so a running request never waits for memory and never loses its
//! blocks. To find room the pool recycles unreferenced cached blocks first, then evicts idle
//! sessions, least recently used first; an evicted session re-prefills on its next turn (from
//! the prefix cache where blocks survive). A prompt larger than the whole pool fails with
//! `KV_CACHE_EXHAUSTED`.
//!
//! Prefix sharing: every full block is registered under (previous block, expert set, tokens).
//! On admission the new prompt is matched block by block against the index, then the longest
//! partial match within the next block is copied (copy-on-write); whichever reuses more — the
//! session's own cache or the index — wins.
//!
//! A panic or error inside a step fails the requests of that batch with its error, releases
//! their sessions' blocks (their state is then unknown) and leaves the engine running.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

mod admission;
#[path = "scheduler_idle.rs"]
mod idle;
mod persist;
mod step;

use super::embedding::Embeddings;
use super::load::GenerationDefaults;
use super::profile::StepProfile;
use super::request::{Command, Completion, Event, FinishReason, GenerateRequest, Prompt, SessionShared};
use super::sequence::Sequence;
use super::stats::EngineStats;
use crate::error::{EngineError, Result};
use crate::kv::manager::virtual_key;
use crate::kv::{BlockTable, KvManager};
use crate::model::Decoder;
use crate::sampling::{Sampler, SamplingParams};
use crate::tokenizer::{ChatMessage, Tokenizer};

/// Rows one forward pass evaluates at most on CPU (decode rows first, then prompt chunks).
/// Large enough for efficient prefill matmuls, small enough that decoding sessions keep a
/// steady pace while a long prompt is read.
pub const DEFAULT_STEP_TOKENS: usize = 256;

/// The same on a GPU, where a pass costs about the same whether it has 1 row or a few thousand
/// (its time goes to issuing the kernels: 11.1 ms for 1 row, 12.2 ms for 64 on an H200 with
/// the Qwen3-0.6B shape, `EXPERT_RUNTIME_PROFILE`): fewer, larger passes read a prompt faster
/// and cost the decoding sessions less.
pub const DEVICE_STEP_TOKENS: usize = 2048;

struct SessionState {
    shared: Arc<SessionShared>,
    /// The session's token stream without the pending token: what is cached or being
    /// evaluated. Cached positions are a prefix of `virtual tokens ++ tokens`.
    tokens: Vec<u32>,
    /// The last token sampled by the previous request: part of the stream but not evaluated
    /// yet (a raw continuation starts with it).
    pending: Option<u32>,
    table: BlockTable,
    /// Load ids of the experts `table` was computed under.
    set_key: Vec<u64>,
    /// Prompt-tuning virtual tokens at the start of `table`.
    n_virtual: usize,
    /// Tick of the last request start or end (LRU eviction).
    last_used: u64,
    /// A request of this session holds blocks and runs.
    running: bool,
    /// Positions of `table` that any sequence with the same tokens may share: all of them,
    /// except under `dynamic` RoPE scaling (see `Decoder::rope_exact_until`).
    shareable: usize,
    /// With recurrent layers: where the prefix index's blocks for this prompt end past any state
    /// snapshot; a prompt chunk ends there so that one is taken (see `KvManager::snapshot`).
    snapshot_at: Option<usize>,
}

impl SessionState {
    fn stream(&self) -> Vec<u32> {
        let mut v = self.tokens.clone();
        v.extend(self.pending);
        v
    }

    /// Positions a finished prompt occupies: virtual tokens plus the stream.
    fn target(&self) -> usize {
        self.n_virtual + self.tokens.len()
    }

    fn key_at(&self, p: usize) -> u32 {
        if p < self.n_virtual {
            virtual_key(p)
        } else {
            self.tokens[p - self.n_virtual]
        }
    }
}

/// Whose rows a planned chunk holds: a generation request (index into `running`) or an
/// embedding text (index into `embeds.running`).
#[derive(Clone, Copy, Debug)]
enum Row {
    Generate(usize),
    Embed(usize),
}

/// One chunk of a step: `n` rows of `row` from position `pos`.
#[derive(Clone, Copy, Debug)]
struct Planned {
    row: Row,
    pos: usize,
    n: usize,
}

#[derive(Clone)]
pub struct SchedulerConfig {
    pub context_length: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    pub step_tokens: usize,
    /// Look up and register shared prefix blocks.
    pub prefix_cache: bool,
    /// What the pool stores keys and values as.
    pub kv_dtype: crate::kv::KvFormat,
    /// Idle this long, the pool gives its unused blocks' memory back (`None`: never).
    pub idle_release: Option<std::time::Duration>,
    /// Sequences that may hold a recurrent state at once, and snapshots of shared prefixes
    /// (models with recurrent layers).
    pub state_slots: (usize, usize),
    /// The prefix cache's disk tier and the namespace its keys start from.
    pub disk: Option<(crate::kv::disk::DiskOptions, crate::kv::disk::DiskKey)>,
}

pub struct Scheduler {
    model: Arc<Decoder>,
    tokenizer: Arc<Tokenizer>,
    defaults: GenerationDefaults,
    eos: Vec<u32>,
    context_length: usize,
    step_tokens: usize,
    kv: KvManager,
    sessions: HashMap<u64, SessionState>,
    /// Accepted, waiting for blocks (arrival order).
    waiting: VecDeque<Sequence>,
    /// Admitted (admission order).
    running: Vec<Sequence>,
    /// Embedding requests: their texts are evaluated as rows of the same passes.
    embeds: Embeddings,
    tick: u64,
    stats: Arc<EngineStats>,
    last_memory_probe: std::time::Instant,
    profile: StepProfile,
    idle_release: Option<std::time::Duration>,
    /// A hash of the expert ids of the running and waiting requests, as last published.
    experts_in_flight: u64,
    /// KV events not yet handed to the queue (`None`: not recording).
    kv_events: Option<Vec<crate::kv::prefix::IndexEvent>>,
}

/// How often `publish` asks the driver for free GPU memory (a driver call per step would be
/// noise at thousands of steps a second).
const MEMORY_PROBE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

impl Scheduler {
    pub fn new(
        model: Arc<Decoder>,
        tokenizer: Arc<Tokenizer>,
        defaults: GenerationDefaults,
        eos: Vec<u32>,
        cfg: SchedulerConfig,
        stats: Arc<EngineStats>,
    ) -> Result<Self> {
        let store = model.new_store_with_states(cfg.num_blocks, cfg.block_size, cfg.kv_dtype, cfg.state_slots)?;
        stats.kv_blocks_total.store(cfg.num_blocks as u64, Ordering::Relaxed);
        stats.kv_block_size.store(cfg.block_size as u64, Ordering::Relaxed);
        let per_token = store.cache_layout().bytes_per_token(store.kv_heads, store.head_dim, store.format);
        stats.kv_bytes_per_token.store(per_token as u64, Ordering::Relaxed);
        stats.kv_block_bytes.store(store.bytes_per_block() as u64, Ordering::Relaxed);
        stats.kv_state_slots.store(store.state_sequences() as u64, Ordering::Relaxed);
        stats.kv_state_bytes_per_sequence.store(store.states().bytes_per_slot() as u64, Ordering::Relaxed);
        let image_bytes = store.bytes_per_block();
        let mut kv = KvManager::try_new(store, cfg.prefix_cache)?;
        if let Some((opts, namespace)) = &cfg.disk {
            kv.set_disk(crate::kv::disk::DiskTier::open(opts, *namespace, image_bytes, stats.kv_disk.clone())?)?;
            stats.kv_disk_enabled.store(true, Ordering::Relaxed);
        }
        // A pass writes at most a step's tokens of a sequence, a block, or a decode row with
        // every draft.
        kv.set_pass_limit(cfg.step_tokens.max(cfg.block_size).max(crate::engine::speculative::MAX_DRAFT + 1));
        stats.kv_on_device.store(!model.device.is_cpu(), Ordering::Relaxed);
        stats.publish_device_memory(&model.device);
        Ok(Self {
            model,
            tokenizer,
            defaults,
            eos,
            context_length: cfg.context_length,
            step_tokens: cfg.step_tokens.max(1),
            kv,
            sessions: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            embeds: Embeddings::default(),
            tick: 0,
            stats,
            last_memory_probe: std::time::Instant::now(),
            profile: StepProfile::from_env(),
            idle_release: cfg.idle_release,
            experts_in_flight: 0,
            kv_events: None,
        })
    }

    /// Runs until `Shutdown` or until every sender is gone.
    pub fn run(mut self, rx: Receiver<Command>) {
        loop {
            // 1. Commands: block while idle, otherwise drain what arrived since the last round.
            loop {
                let idle = self.running.is_empty() && self.waiting.is_empty() && self.embeds.is_idle();
                let cmd = if idle {
                    self.publish();
                    match self.recv_idle(&rx) {
                        Some(c) => c,
                        None => return,
                    }
                } else {
                    match rx.try_recv() {
                        Ok(c) => c,
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => return,
                    }
                };
                if let Command::Shutdown { done } = cmd {
                    self.cancel_all();
                    // The model and the KV pool are freed before the caller hears it is done.
                    drop(self);
                    crate::memory::return_freed_memory();
                    let _ = done.send(());
                    return;
                }
                self.handle(cmd);
            }
            // 2–4. Cancellations, admissions, one batched step.
            self.reap_cancelled();
            self.admit_waiting();
            self.admit_embeds();
            if !self.running.is_empty() || !self.embeds.running.is_empty() {
                self.step_guarded();
            }
            self.publish();
        }
    }

    fn publish(&mut self) {
        let s = &self.stats;
        s.kv_blocks_used.store(self.kv.used_blocks() as u64, Ordering::Relaxed);
        s.kv_blocks_cached.store(self.kv.cached_blocks() as u64, Ordering::Relaxed);
        s.kv_blocks_behind_window.store(self.kv.blocks_behind_window(), Ordering::Relaxed);
        s.kv_blocks_touched.store(self.kv.touched_blocks() as u64, Ordering::Relaxed);
        s.kv_state_slots_used.store((self.kv.total_states() - self.kv.free_states()) as u64, Ordering::Relaxed);
        s.sessions.store(self.sessions.len() as u64, Ordering::Relaxed);
        s.running_requests.store(self.running.len() as u64, Ordering::Relaxed);
        s.queued_requests.store(self.waiting.len() as u64, Ordering::Relaxed);
        if !self.model.device.is_cpu() && self.last_memory_probe.elapsed() >= MEMORY_PROBE_INTERVAL {
            s.publish_device_memory(&self.model.device);
            self.last_memory_probe = std::time::Instant::now();
        }
        self.publish_experts_in_flight();
        self.publish_kv_events();
    }

    /// Moves the prefix index's events to the queue a publisher drains (see `kv_events`).
    fn publish_kv_events(&mut self) {
        if self.kv_events.is_none() {
            if !self.stats.kv_events.is_on() {
                return;
            }
            self.kv.record_events(true);
            self.kv_events = Some(Vec::new());
        }
        let pending = self.kv_events.as_mut().expect("recording");
        pending.extend(self.kv.take_events());
        self.stats.kv_events.offer(pending);
    }

    /// Publishes the names of the experts running and waiting requests use, when their ids
    /// changed since the last time (a hash of them is compared at every step).
    fn publish_experts_in_flight(&mut self) {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.running.iter().for_each(|s| s.experts.experts().iter().for_each(|e| e.id.hash(&mut h)));
        u64::MAX.hash(&mut h);
        self.waiting.iter().for_each(|s| s.experts.experts().iter().for_each(|e| e.id.hash(&mut h)));
        let key = h.finish();
        if key == self.experts_in_flight {
            return;
        }
        self.experts_in_flight = key;
        let names = |seqs: &mut dyn Iterator<Item = &Sequence>| {
            let set: std::collections::BTreeSet<String> =
                seqs.flat_map(|s| s.experts.experts().iter().map(|e| e.name.clone())).collect();
            set.into_iter().collect::<Vec<_>>()
        };
        let now = crate::engine::stats::ExpertsInFlight {
            running: names(&mut self.running.iter()),
            waiting: names(&mut self.waiting.iter()),
        };
        *self.stats.experts_in_flight.lock().unwrap_or_else(|e| e.into_inner()) = now;
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::CreateSession { id, shared } => {
                let s = SessionState {
                    shared,
                    tokens: Vec::new(),
                    pending: None,
                    table: BlockTable::default(),
                    set_key: Vec::new(),
                    n_virtual: 0,
                    last_used: self.tick,
                    running: false,
                    shareable: usize::MAX,
                    snapshot_at: None,
                };
                self.sessions.insert(id, s);
            }
            Command::ResetSession { id } => {
                if let Some(s) = self.sessions.get_mut(&id) {
                    self.kv.free(&mut s.table);
                    s.tokens.clear();
                    s.pending = None;
                }
            }
            Command::Undeliver { id, tokens } => {
                // The consumer sends this only when no newer request had started on the
                // session, so none was queued before it (one channel, in order).
                if let Some(s) = self.sessions.get_mut(&id).filter(|s| !s.running) {
                    let mut stream = s.stream();
                    stream.truncate(stream.len().saturating_sub(tokens));
                    s.pending = None;
                    s.tokens = stream;
                }
            }
            Command::DropSession { id } => {
                self.running
                    .iter()
                    .chain(&self.waiting)
                    .filter(|q| q.session == id)
                    .for_each(|q| q.cancel.store(true, Ordering::Relaxed));
                if let Some(mut s) = self.sessions.remove(&id) {
                    self.kv.free(&mut s.table);
                }
            }
            Command::Generate(req) => {
                let events = req.events.clone();
                let session = req.session;
                if let Err(e) = self.accept(*req) {
                    if let Some(s) = self.sessions.get(&session) {
                        s.shared.busy.store(false, Ordering::Release);
                    }
                    let _ = events.send(Event::Error(e));
                }
            }
            Command::Embed(req) => {
                if let Err((e, reply)) = self.embeds.submit(*req, self.context_length, self.kv.total_positions()) {
                    super::embedding::call(reply, Err(e));
                }
            }
            Command::SaveSession { id, reply } => reply(self.save_session(id)),
            Command::RestoreSession { id, shared, snapshot, reply } => reply(self.restore_session(id, shared, *snapshot)),
            Command::Shutdown { .. } => unreachable!("handled by run"),
        }
    }

    /// Validates a prepared request (tokenized by `engine::prepare`) and queues it.
    fn accept(&mut self, mut req: GenerateRequest) -> Result<()> {
        let started = Instant::now();
        let state = self.sessions.get(&req.session).ok_or_else(|| EngineError::Disposed("session was disposed".into()))?;
        if req.cancel.load(Ordering::Relaxed) {
            // Cancelled before it started: nothing ran, nothing joins the history.
            state.shared.busy.store(false, Ordering::Release);
            let _ = req.events.send(Event::Done(Box::new(Completion::cancelled_unstarted())));
            return Ok(());
        }
        let params = self.sampling_params(&req)?;

        // 1. The full token sequence this turn runs on.
        let prompt = std::mem::replace(&mut req.prompt, Prompt::Tokens(Vec::new()));
        let is_chat = matches!(prompt, Prompt::Chat { .. });
        let (full, messages, dropped): (Vec<u32>, Vec<ChatMessage>, usize) = match prompt {
            Prompt::Chat { ids, messages, dropped } => (ids, messages, dropped),
            Prompt::Text(t) => {
                let mut v = state.stream();
                v.extend(self.tokenizer.text_ids(*t, v.is_empty()).map_err(EngineError::InvalidModel)?);
                (v, Vec::new(), 0)
            }
            Prompt::Tokens(ids) => {
                if let Some(bad) = ids.iter().find(|&&t| t as usize >= self.model.cfg.vocab_size) {
                    return Err(EngineError::InvalidArgument(format!(
                        "token id {bad} is out of range (vocab size {})",
                        self.model.cfg.vocab_size
                    )));
                }
                let mut v = state.stream();
                v.extend_from_slice(&ids);
                (v, Vec::new(), 0)
            }
        };
        if full.is_empty() || !is_chat && full.len() == state.stream().len() {
            return Err(EngineError::InvalidArgument("the input is empty".into()));
        }
        let n_virtual = req.experts.num_virtual_tokens();
        let extra = if n_virtual > 0 { format!(" (plus {n_virtual} virtual tokens of prompt tuning)") } else { String::new() };
        if n_virtual + full.len() > self.context_length {
            return Err(EngineError::ContextOverflow(format!(
                "the prompt has {} tokens{extra} but the context length is {}",
                full.len(),
                self.context_length
            )));
        }
        let pool_positions = self.kv.total_positions();
        if n_virtual + full.len() > pool_positions {
            return Err(EngineError::KvCacheExhausted(format!(
                "the prompt has {} tokens{extra} but the KV cache holds {pool_positions} in all (kvCache.maxTokens)",
                full.len()
            )));
        }

        // 2. Commit chat messages to the history now that the request is accepted, less the
        //    oldest turns `contextShift` left out.
        let mut history = state.shared.history.lock().unwrap();
        let head = super::context_shift::leading_system(&history);
        let end = (head + dropped).min(history.len());
        history.drain(head..end);
        history.extend(messages);
        drop(history);

        let room = self.context_length - n_virtual - full.len();
        let max_tokens = req.options.max_tokens.unwrap_or(room.max(1));
        let sampler = Sampler::new(params, self.model.cfg.vocab_size);
        self.waiting.push_back(Sequence::new(req, full, is_chat, sampler, max_tokens, self.eos.clone(), started));
        Ok(())
    }

    fn sampling_params(&self, req: &GenerateRequest) -> Result<SamplingParams> {
        let o = &req.options;
        let p = o.sampling.resolve(&self.defaults.sampling).map_err(EngineError::InvalidArgument)?;
        if o.max_tokens == Some(0) {
            return Err(EngineError::InvalidArgument("maxTokens must be a positive integer (1 or more), got 0".into()));
        }
        Ok(p)
    }

    /// Ends requests that were cancelled, whose stream was dropped or whose session is gone.
    fn reap_cancelled(&mut self) {
        let mut i = 0;
        while i < self.waiting.len() {
            if self.waiting[i].is_cancelled() || !self.sessions.contains_key(&self.waiting[i].session) {
                let seq = self.waiting.remove(i).expect("index in range");
                self.finish(seq, FinishReason::Cancelled);
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].is_cancelled() || !self.sessions.contains_key(&self.running[i].session) {
                let seq = self.running.remove(i);
                self.finish(seq, FinishReason::Cancelled);
            } else {
                i += 1;
            }
        }
    }

    fn finish(&mut self, seq: Sequence, reason: FinishReason) {
        let id = seq.session;
        let is_chat = seq.is_chat;
        let last = seq.last_token;
        let admitted = seq.admitted;
        let (mut done, events) = seq.finish(&self.tokenizer, reason);
        self.tick += 1;
        if let Some(s) = self.sessions.get_mut(&id) {
            if admitted {
                // The last sampled token is never evaluated by this request.
                s.pending = last;
                s.running = false;
                self.kv.shrink(&mut s.table);
            }
            s.last_used = self.tick;
            if is_chat {
                let mut history = s.shared.history.lock().unwrap();
                let mut turn = ChatMessage::new("assistant", done.text.clone());
                turn.tool_calls.clone_from(&done.tool_calls);
                turn.reasoning = done.reasoning.clone().filter(|r| !r.is_empty());
                history.push(turn);
                done.history_index = Some(history.len() - 1);
            }
            s.shared.busy.store(false, Ordering::Release);
        }
        // Counters first: a caller that sees the end reads stats without this request.
        self.publish();
        let _ = events.send(Event::Done(Box::new(done)));
    }

    fn fail(&mut self, seq: Sequence, e: EngineError) {
        if let Some(s) = self.sessions.get_mut(&seq.session) {
            self.kv.free(&mut s.table);
            s.tokens.clear();
            s.pending = None;
            s.running = false;
            s.shared.busy.store(false, Ordering::Release);
        }
        self.publish();
        let _ = seq.events.send(Event::Error(e));
    }

    fn cancel_all(&mut self) {
        for seq in self.running.drain(..).chain(self.waiting.drain(..)) {
            let _ = seq.events.send(Event::Error(EngineError::Disposed("the runtime was disposed".into())));
        }
        self.embeds.fail_all(EngineError::Disposed("the runtime was disposed".into()));
    }
}
