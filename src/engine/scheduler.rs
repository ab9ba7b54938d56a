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
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

#[path = "scheduler_idle.rs"]
mod idle;

use super::embedding::{Embeddings, TextJob};
use super::load::GenerationDefaults;
use super::profile::{Phase, StepProfile};
use super::readback::{read_rows, RowLogits};
use super::request::{Command, Completion, Event, FinishReason, GenerateRequest, Prompt, SessionShared};
use super::sequence::Sequence;
use super::stats::EngineStats;
use crate::error::{panic_message, EngineError, Result};
use crate::kv::manager::virtual_key;
use crate::kv::{BlockTable, KvManager};
use crate::model::decoder::{Logits, PassOutput, SeqChunk};
use crate::model::Decoder;
use crate::sampling::{Constraint, Sampled, Sampler, SamplingParams};
use crate::tokenizer::{ChatMessage, Tokenizer};
use llguidance::toktrie::SimpleVob;

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
        let store = model.new_store(cfg.num_blocks, cfg.block_size, cfg.kv_dtype)?;
        stats.kv_blocks_total.store(cfg.num_blocks as u64, Ordering::Relaxed);
        stats.kv_block_size.store(cfg.block_size as u64, Ordering::Relaxed);
        stats.kv_bytes_per_token.store(store.bytes_per_token() as u64, Ordering::Relaxed);
        let kv = KvManager::try_new(store, cfg.prefix_cache)?;
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
        s.kv_blocks_touched.store(self.kv.touched_blocks() as u64, Ordering::Relaxed);
        s.sessions.store(self.sessions.len() as u64, Ordering::Relaxed);
        s.running_requests.store(self.running.len() as u64, Ordering::Relaxed);
        s.queued_requests.store(self.waiting.len() as u64, Ordering::Relaxed);
        if !self.model.device.is_cpu() && self.last_memory_probe.elapsed() >= MEMORY_PROBE_INTERVAL {
            s.publish_device_memory(&self.model.device);
            self.last_memory_probe = std::time::Instant::now();
        }
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

    /// Admits queued requests in arrival order while their blocks can be found.
    fn admit_waiting(&mut self) {
        while let Some(mut seq) = self.waiting.pop_front() {
            match catch_unwind(AssertUnwindSafe(|| self.admit(&mut seq))) {
                Ok(Ok(true)) => self.running.push(seq),
                Ok(Ok(false)) => {
                    if self.running.is_empty() {
                        // Nothing will free blocks: cannot happen when accounting is right.
                        self.fail(seq, EngineError::KvCacheExhausted("no KV blocks could be found for this request".into()));
                        continue;
                    }
                    self.waiting.push_front(seq);
                    return;
                }
                Ok(Err(e)) => self.fail(seq, e),
                Err(p) => self.fail(seq, EngineError::Internal(format!("admission panicked: {}", panic_message(&*p)))),
            }
        }
    }

    /// Gives `seq` its blocks: reuses the session's own cache or the prefix index (whichever
    /// covers more of the prompt), then reserves every block the request can need. `Ok(false)`
    /// when the pool has no room yet (nothing changed that matters: the session keeps a valid
    /// prefix of its cache).
    fn admit(&mut self, seq: &mut Sequence) -> Result<bool> {
        let id = seq.session;
        let set_key = seq.experts.key();
        let n_v = seq.n_virtual;
        let keys: Vec<u32> = (0..n_v).map(virtual_key).chain(seq.prompt.iter().copied()).collect();
        let cap = self.context_length.min(self.kv.total_positions());
        let need_blocks = self.kv.blocks_for((keys.len() + seq.max_tokens - 1).min(cap));
        // At least the last prompt token is evaluated, so there are logits to sample from.
        let reusable = &keys[..keys.len() - 1];

        // 1. What the session's own cache and the prefix index each cover.
        let st = self.sessions.get(&id).ok_or_else(|| EngineError::Disposed("session was disposed".into()))?;
        let own = if st.set_key == set_key && st.n_virtual == n_v {
            // The table may hold positions past the stream (tokens produced but never delivered
            // are dropped from the stream by `Command::Undeliver`): only the stream's own are
            // reusable.
            reusable.iter().take(st.table.len().min(st.target())).enumerate().take_while(|&(p, &k)| st.key_at(p) == k).count()
        } else {
            0
        };
        let mut hit = self.kv.match_prefix(reusable, &set_key);
        // `dynamic` RoPE: a sequence longer than the original length rotates every position
        // by its own length, so nothing cached fits it (and what it writes fits nothing else).
        let shareable = match self.model.rope_exact_until() {
            Some(n) if keys.len() > n => 0,
            Some(n) => n,
            None => usize::MAX,
        };
        let own = own.min(st.shareable).min(shareable);
        if hit.tokens > shareable {
            hit = crate::kv::manager::PrefixHit::default();
        }

        // 2. Take the better one and make room for the rest.
        let st = self.sessions.get_mut(&id).expect("checked above");
        if own >= hit.tokens {
            let new = self.kv.prepare_resume(&mut st.table, own, need_blocks);
            if !self.make_room(new, id) {
                return Ok(false);
            }
            let st = self.sessions.get_mut(&id).expect("not evicted");
            assert!(self.kv.resume(&mut st.table, own, need_blocks)?, "room was made");
        } else {
            // Pin the match before anything is evicted, then drop the session's own blocks.
            let hit = self.kv.pin(hit);
            self.kv.free(&mut st.table);
            if !self.make_room(self.kv.blocks_to_adopt(&hit, need_blocks), id) {
                self.kv.unpin(hit);
                return Ok(false);
            }
            let shared = hit.tokens();
            let st = self.sessions.get_mut(&id).expect("not evicted");
            assert!(self.kv.adopt(&mut st.table, hit, need_blocks)?, "room was made");
            self.stats.prefix_cache_hit_tokens.fetch_add(shared as u64, Ordering::Relaxed);
        }

        // 3. The session now runs this turn.
        self.tick += 1;
        let st = self.sessions.get_mut(&id).expect("not evicted");
        st.tokens = std::mem::take(&mut seq.prompt);
        st.pending = None;
        st.set_key = set_key;
        st.n_virtual = n_v;
        st.running = true;
        st.shareable = shareable;
        st.last_used = self.tick;
        seq.usage.cached_tokens = st.table.len().saturating_sub(n_v);
        seq.limit = self.context_length.min(st.table.capacity(self.kv.block_size()));
        seq.admitted = true;
        Ok(true)
    }

    /// Frees blocks until `n` can be allocated: cached blocks are recycled by the pool itself;
    /// beyond them, idle sessions other than `except` lose their blocks, least recently used
    /// first. False when even that is not enough.
    fn make_room(&mut self, n: usize, except: u64) -> bool {
        while self.kv.available() < n {
            let victim = self
                .sessions
                .iter()
                .filter(|(&id, s)| id != except && !s.running && !s.table.is_empty())
                .min_by_key(|(&id, s)| (s.last_used, id))
                .map(|(&id, _)| id);
            let Some(v) = victim else { return false };
            let s = self.sessions.get_mut(&v).expect("just found");
            let held = s.table.num_blocks() as u64;
            self.kv.free(&mut s.table);
            self.stats.evicted_blocks.fetch_add(held, Ordering::Relaxed);
        }
        true
    }

    /// Admits queued embedding texts in arrival order while their blocks can be found.
    fn admit_embeds(&mut self) {
        while let Some(mut job) = self.embeds.waiting.pop_front() {
            let need = self.kv.blocks_for(job.target());
            let new = self.kv.prepare_resume(&mut job.table, 0, need);
            let admitted = self.make_room(new, 0) && self.kv.resume(&mut job.table, 0, need).unwrap_or(false);
            if admitted {
                self.embeds.running.push(job);
                continue;
            }
            let request = job.request;
            self.embeds.waiting.push_front(job);
            if self.running.is_empty() && self.embeds.running.is_empty() {
                // Nothing will free blocks: cannot happen when accounting is right.
                let e = EngineError::KvCacheExhausted("no KV blocks could be found for this text".into());
                for mut j in self.embeds.fail(request, e) {
                    self.kv.free(&mut j.table);
                }
                continue;
            }
            return;
        }
    }

    /// One batched step; a failure fails the requests of the batch.
    fn step_guarded(&mut self) {
        let outcome = catch_unwind(AssertUnwindSafe(|| self.step()));
        let err = match outcome {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e,
            Err(p) => EngineError::Internal(format!("engine step panicked: {}", panic_message(&*p))),
        };
        for seq in std::mem::take(&mut self.running) {
            self.fail(seq, err.clone());
        }
        for id in Embeddings::requests_of(&self.embeds.running) {
            for mut j in self.embeds.fail(id, err.clone()) {
                self.kv.free(&mut j.table);
            }
        }
    }

    /// One forward pass over every running request, then sampling where a prompt or a decode
    /// row completed, and pooling for the embedding rows.
    fn step(&mut self) -> Result<()> {
        self.profile.start();
        let plan = self.plan_step();
        self.profile.lap(Phase::Plan);

        // 2. The batched forward pass, while a worker computes the grammar masks of the
        //    constrained requests (they depend only on the tokens already sampled).
        let mut constrained: Vec<(usize, Box<Constraint>)> =
            self.running.iter_mut().enumerate().filter_map(|(i, seq)| seq.constraint.take().map(|c| (i, c))).collect();
        let mut out = None;
        let forward = || {
            let chunks: Vec<SeqChunk> = plan
                .iter()
                .map(|&Planned { row, pos, n }| {
                    let (tokens, n_virtual, blocks, target, experts): (&[u32], _, _, _, _) = match row {
                        Row::Generate(i) => {
                            let seq = &self.running[i];
                            let st = &self.sessions[&seq.session];
                            (&st.tokens, st.n_virtual, st.table.blocks(), st.target(), &seq.experts)
                        }
                        Row::Embed(j) => {
                            let job = &self.embeds.running[j];
                            (&job.tokens, job.n_virtual, job.table.blocks(), job.target(), &job.experts)
                        }
                    };
                    let logits = match row {
                        Row::Embed(_) => Logits::Hidden,
                        // A speculative step needs the pending token's row and each draft's.
                        Row::Generate(i) if pos + n == target && self.running[i].drafted() > 0 => Logits::All,
                        Row::Generate(_) if pos + n == target => Logits::Last,
                        Row::Generate(_) => Logits::None,
                    };
                    let virtual_rows = pos.min(n_virtual)..(pos + n).min(n_virtual);
                    let t0 = pos.max(n_virtual) - n_virtual;
                    let t1 = pos + n - n_virtual;
                    SeqChunk { tokens: &tokens[t0..t1], virtual_rows, pos, seq_len: target, blocks, logits, experts }
                })
                .collect();
            self.model.forward_batch(&chunks, self.kv.store())
        };
        if constrained.is_empty() {
            out = Some(forward());
        } else {
            super::prepare::pool()?.in_place_scope(|scope| {
                scope.spawn(|_| {
                    for (_, c) in constrained.iter_mut() {
                        // A failure leaves the constraint without a mask: that request fails below.
                        let _ = c.compute_mask();
                    }
                });
                out = Some(forward());
            });
        }
        for (i, c) in constrained {
            self.running[i].constraint = Some(c);
        }
        let PassOutput { logits, hidden, greedy } = out.expect("the forward pass ran")?;
        self.profile.lap(Phase::Forward);
        let rows: Vec<RowLogits> = match logits {
            Some(l) => {
                if self.profile.on() {
                    l.device().synchronize()?;
                    self.profile.lap(Phase::Device);
                }
                read_rows(&l, &self.greedy_rows(&plan), greedy.as_ref())?
            }
            None => Vec::new(),
        };
        let hidden: Vec<Vec<f32>> = match hidden {
            Some(h) => h.to_vec2()?,
            None => Vec::new(),
        };
        self.profile.lap(Phase::Readback);
        self.pool_embeddings(&plan, &hidden);
        self.advance_and_sample(&plan, &rows);
        self.profile.lap(Phase::Sample);
        self.profile.step_done(plan.iter().map(|p| p.n).sum());
        Ok(())
    }

    /// For each logits row of the pass (in plan order), whether its request wants only the
    /// greedy token and its logprob (no grammar mask, see [`Sampler::greedy_only`]).
    fn greedy_rows(&self, plan: &[Planned]) -> Vec<bool> {
        let mut out = Vec::new();
        for &Planned { row, pos, n } in plan {
            let Row::Generate(i) = row else { continue };
            let seq = &self.running[i];
            if pos + n == self.sessions[&seq.session].target() {
                let greedy = seq.constraint.is_none() && seq.sampler.greedy_only();
                out.extend(std::iter::repeat_n(greedy, 1 + seq.drafted()));
            }
        }
        out
    }

    /// Step 1: a row for each decoding request, then embedding texts and prompt chunks within
    /// the per-step token budget, grouped by expert set (each set is one adapter segment).
    /// Embedding texts take at most half the budget while a prompt is being read.
    fn plan_step(&mut self) -> Vec<Planned> {
        let mut decoding = 0;
        for seq in &mut self.running {
            let st = self.sessions.get_mut(&seq.session).expect("reaped");
            if st.table.len() == st.target() {
                st.tokens.push(seq.last_token.expect("a decode step follows a sampled token"));
                // Drafts fit the positions the request holds and the tokens it may still emit
                // (the pass emits at most one more than it drafts).
                let room =
                    seq.limit.saturating_sub(st.target()).min(seq.max_tokens.saturating_sub(seq.usage.completion_tokens + 1));
                if let Some(d) = &mut seq.drafter {
                    st.tokens.extend_from_slice(d.propose(&st.tokens, room));
                }
            }
            let left = st.target() - st.table.len();
            if left == 1 + seq.drafted() {
                decoding += left;
            }
        }
        let mut budget = self.step_tokens.saturating_sub(decoding).max(self.kv.block_size());
        let mut plan: Vec<Planned> = Vec::with_capacity(self.running.len() + self.embeds.running.len());
        let prefilling = self.running.iter().any(|seq| {
            let st = &self.sessions[&seq.session];
            st.target() - st.table.len() > 1 + seq.drafted()
        });
        let mut embed_budget = if prefilling { budget / 2 } else { budget };
        for (j, job) in self.embeds.running.iter().enumerate() {
            let n = (job.target() - job.table.len()).min(embed_budget);
            if n == 0 {
                break;
            }
            embed_budget -= n;
            budget -= n;
            plan.push(Planned { row: Row::Embed(j), pos: job.table.len(), n });
        }
        for (i, seq) in self.running.iter().enumerate() {
            let st = &self.sessions[&seq.session];
            let left = st.target() - st.table.len();
            let decode_rows = 1 + seq.drafted();
            let n = if left == decode_rows { left } else { left.min(budget) };
            if n == 0 {
                continue;
            }
            if left > decode_rows {
                budget -= n;
            }
            plan.push(Planned { row: Row::Generate(i), pos: st.table.len(), n });
        }
        plan.sort_by_cached_key(|p| match p.row {
            Row::Generate(i) => self.running[i].experts.key(),
            Row::Embed(j) => self.embeds.running[j].experts.key(),
        });
        plan
    }

    /// Step 3a: advance the embedding texts' tables and pool their hidden rows (`hidden`, in
    /// plan order); a finished text frees its blocks.
    fn pool_embeddings(&mut self, plan: &[Planned], hidden: &[Vec<f32>]) {
        let mut next_row = 0;
        let mut finished = Vec::new();
        for &Planned { row, pos, n } in plan {
            let Row::Embed(j) = row else { continue };
            let job = &mut self.embeds.running[j];
            let token_rows = pos + n - pos.max(job.n_virtual).min(pos + n);
            job.absorb(&hidden[next_row..next_row + token_rows]);
            next_row += token_rows;
            job.table.advance(pos + n);
            if job.is_done() {
                finished.push(j);
            }
        }
        finished.sort_unstable_by(|a, b| b.cmp(a));
        for j in finished {
            let mut job: TextJob = self.embeds.running.remove(j);
            self.kv.free(&mut job.table);
            self.embeds.complete(job);
        }
    }

    /// Step 3b: advance the tables, register filled blocks, sample where logits came back
    /// (`rows`, in plan order), and finish the requests that ended.
    fn advance_and_sample(&mut self, plan: &[Planned], rows: &[RowLogits]) {
        let mut next_row = 0;
        let mut done = Vec::new();
        let mut failed = Vec::new();
        for &Planned { row, pos, n } in plan {
            let Row::Generate(i) = row else { continue };
            let seq = &mut self.running[i];
            let st = self.sessions.get_mut(&seq.session).expect("reaped");
            let drafted = seq.drafted();
            if drafted > 0 {
                let ended = verify_drafts(seq, st, pos, &rows[next_row..next_row + 1 + drafted], &self.tokenizer);
                next_row += 1 + drafted;
                self.kv.cache_full_blocks(&st.table, pos, st.shareable, &st.set_key, |p| st.key_at(p));
                if let Some(reason) = ended {
                    done.push((i, reason));
                }
                continue;
            }
            st.table.advance(pos + n);
            self.kv.cache_full_blocks(&st.table, pos, st.shareable, &st.set_key, |p| st.key_at(p));
            if pos + n < st.target() {
                continue;
            }
            let row = &rows[next_row];
            next_row += 1;
            if seq.last_token.is_none() {
                seq.mark_prefill_done();
            }
            let mask = match &seq.constraint {
                Some(c) if !c.has_mask() => {
                    failed.push(i);
                    continue;
                }
                Some(c) => c.mask(),
                None => None,
            };
            let sampled = sample_row(&mut seq.sampler, row, &st.tokens, mask);
            let room_left = st.table.len() < seq.limit;
            if let Some(reason) = seq.on_token(&self.tokenizer, sampled, room_left) {
                done.push((i, reason));
            }
        }
        let mut ended: Vec<(usize, Option<FinishReason>)> =
            done.into_iter().map(|(i, r)| (i, Some(r))).chain(failed.into_iter().map(|i| (i, None))).collect();
        ended.sort_by_key(|&(i, _)| std::cmp::Reverse(i));
        for (i, reason) in ended {
            let seq = self.running.remove(i);
            match reason {
                Some(reason) => self.finish(seq, reason),
                None => {
                    let e = EngineError::Internal("the output constraint failed to compute the allowed tokens".into());
                    self.fail(seq, e)
                }
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

/// Samples one row of logits with `context` as the tokens before it (for penalties).
fn sample_row(sampler: &mut Sampler, row: &RowLogits, context: &[u32], mask: Option<&SimpleVob>) -> Sampled {
    match row {
        RowLogits::Full(row) => sampler.sample_masked(row, context, mask),
        // Only rows without a mask are reduced on the device.
        &RowLogits::Greedy { token, log_sum } => Sampled { token, logprob: -log_sum, top_logprobs: Vec::new() },
    }
}

/// Step 3b for a speculative chunk (see `engine::speculative`): the chunk evaluated the pending
/// token and the drafts after it from `pos`; `rows` are their logits. Samples each row as plain
/// decoding would, keeps drafts while they equal the sampled token, then drops the rest from
/// the stream; the table advances over the evaluated positions that stay. Returns why the
/// request ended, if it did.
fn verify_drafts(
    seq: &mut Sequence,
    st: &mut SessionState,
    pos: usize,
    rows: &[RowLogits],
    tok: &Tokenizer,
) -> Option<FinishReason> {
    // Index in `st.tokens` of the token row 0 evaluated; the drafts follow it there.
    let base = pos - st.n_virtual;
    let drafted = rows.len() - 1;
    let mut used = 0;
    let mut accepted = 0;
    let mut ended = None;
    for (r, row) in rows.iter().enumerate() {
        let sampled = sample_row(&mut seq.sampler, row, &st.tokens[..base + r + 1], None);
        let hit = r < drafted && st.tokens[base + r + 1] == sampled.token;
        used = r + 1;
        ended = seq.on_token(tok, sampled, pos + used < seq.limit);
        accepted += hit as usize;
        if ended.is_some() || !hit {
            break;
        }
    }
    st.tokens.truncate(base + used);
    st.table.advance(pos + used);
    seq.usage.draft_tokens += drafted;
    seq.usage.accepted_draft_tokens += accepted;
    if let Some(d) = &mut seq.drafter {
        d.verified(accepted);
    }
    ended
}
