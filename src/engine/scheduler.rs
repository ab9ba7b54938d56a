//! The engine loop. It owns the model and every session's cache, takes commands from the
//! channel between steps, and advances every active request by one step per round (prefill
//! for a new request, one token for the others), so sessions make progress together.
//!
//! A panic inside a step fails that request with `INTERNAL`, resets its session's cache
//! (whose state is then unknown) and leaves the engine running.

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use super::request::{Command, Event, FinishReason, GenerateRequest, Input, SessionShared, Usage};
use super::sequence::Sequence;
use super::GenerationDefaults;
use crate::error::{EngineError, Result};
use crate::kv::KvCache;
use crate::model::decoder::Logits;
use crate::model::Decoder;
use crate::sampling::{Sampler, SamplingParams};
use crate::tokenizer::{ChatMessage, Tokenizer};

struct SessionState {
    shared: Arc<SessionShared>,
    cache: KvCache,
    /// Tokens whose keys/values are in `cache` (same length).
    tokens: Vec<u32>,
    /// The last token sampled by the previous request: part of the session's token stream
    /// but not evaluated yet (a raw continuation starts with it).
    pending: Option<u32>,
    /// Load ids of the experts `cache` was computed under; another set invalidates it.
    set_key: Vec<u64>,
    /// Prompt-tuning virtual tokens at the start of `cache` (when it is not empty).
    n_virtual: usize,
}

impl SessionState {
    /// The session's token stream so far: what is cached plus the pending token.
    fn stream(&self) -> Vec<u32> {
        let mut v = self.tokens.clone();
        v.extend(self.pending);
        v
    }

    fn clear(&mut self) {
        self.cache.clear();
        self.tokens.clear();
        self.pending = None;
    }

    /// Cached positions before the session's tokens (virtual tokens, once evaluated).
    fn virtual_cached(&self) -> usize {
        if self.cache.is_empty() {
            0
        } else {
            self.n_virtual
        }
    }
}

pub struct Scheduler {
    pub model: Arc<Decoder>,
    pub tokenizer: Arc<Tokenizer>,
    pub defaults: GenerationDefaults,
    pub eos: Vec<u32>,
    pub context_length: usize,
    sessions: HashMap<u64, SessionState>,
    active: VecDeque<Sequence>,
}

impl Scheduler {
    pub fn new(model: Arc<Decoder>, tokenizer: Arc<Tokenizer>, defaults: GenerationDefaults, eos: Vec<u32>, context_length: usize) -> Self {
        Self { model, tokenizer, defaults, eos, context_length, sessions: HashMap::new(), active: VecDeque::new() }
    }

    /// Runs until `Shutdown` or until every sender is gone.
    pub fn run(mut self, rx: Receiver<Command>) {
        loop {
            // 1. Commands: block while idle, otherwise drain what arrived since the last round.
            loop {
                let cmd = if self.active.is_empty() {
                    match rx.recv() {
                        Ok(c) => c,
                        Err(_) => return,
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
                    let _ = done.send(());
                    return;
                }
                self.handle(cmd);
            }
            // 2. One step for every active request, in arrival order.
            for _ in 0..self.active.len() {
                let Some(mut seq) = self.active.pop_front() else { break };
                let outcome = catch_unwind(AssertUnwindSafe(|| self.step(&mut seq)));
                match outcome {
                    Ok(Ok(None)) => self.active.push_back(seq),
                    Ok(Ok(Some(reason))) => self.finish(seq, reason),
                    Ok(Err(e)) => self.fail(seq, e),
                    Err(panic) => {
                        let msg = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_else(|| "panic".into());
                        self.fail(seq, EngineError::Internal(format!("engine step panicked: {msg}")));
                    }
                }
            }
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::CreateSession { id, shared } => {
                let cache = self.model.new_cache(self.context_length);
                self.sessions.insert(
                    id,
                    SessionState { shared, cache, tokens: Vec::new(), pending: None, set_key: Vec::new(), n_virtual: 0 },
                );
            }
            Command::ResetSession { id } => {
                if let Some(s) = self.sessions.get_mut(&id) {
                    s.clear();
                }
            }
            Command::DropSession { id } => {
                self.active.iter().filter(|q| q.session == id).for_each(|q| q.cancel.store(true, Ordering::Relaxed));
                self.sessions.remove(&id);
            }
            Command::Generate(req) => {
                let events = req.events.clone();
                let session = req.session;
                if let Err(e) = self.start(*req) {
                    if let Some(s) = self.sessions.get(&session) {
                        s.shared.busy.store(false, Ordering::Release);
                    }
                    let _ = events.send(Event::Error(e));
                }
            }
            Command::Shutdown { .. } => unreachable!("handled by run"),
        }
    }

    /// Validates a request, renders and tokenizes its prompt, reuses the longest cached
    /// prefix and queues it.
    fn start(&mut self, req: GenerateRequest) -> Result<()> {
        let started = Instant::now();
        let params = self.sampling_params(&req)?;
        let tok = self.tokenizer.clone();
        let state = self
            .sessions
            .get_mut(&req.session)
            .ok_or_else(|| EngineError::Disposed("session was disposed".into()))?;

        // 1. The full token sequence this turn runs on.
        let is_chat = matches!(req.input, Input::Chat(_));
        let full: Vec<u32> = match &req.input {
            Input::Chat(msgs) => {
                let mut history = state.shared.history.lock().unwrap().clone();
                history.extend(msgs.iter().cloned());
                let text = tok
                    .apply_chat_template(&history, true, req.options.enable_thinking)
                    .map_err(EngineError::InvalidArgument)?;
                tok.encode(&text, false).map_err(EngineError::Internal)?
            }
            Input::Text(t) => {
                let mut v = state.stream();
                v.extend(tok.encode(t, v.is_empty()).map_err(EngineError::Internal)?);
                v
            }
            Input::Tokens(ids) => {
                if let Some(bad) = ids.iter().find(|&&t| t as usize >= self.model.cfg.vocab_size) {
                    return Err(EngineError::InvalidArgument(format!(
                        "token id {bad} is out of range (vocab size {})",
                        self.model.cfg.vocab_size
                    )));
                }
                let mut v = state.stream();
                v.extend_from_slice(ids);
                v
            }
        };
        if full.is_empty() || !is_chat && full.len() == state.stream().len() {
            return Err(EngineError::InvalidArgument("the input is empty".into()));
        }
        let n_virtual = req.experts.num_virtual_tokens();
        if n_virtual + full.len() > self.context_length {
            let extra = if n_virtual > 0 { format!(" (plus {n_virtual} virtual tokens of prompt tuning)") } else { String::new() };
            return Err(EngineError::ContextOverflow(format!(
                "the prompt has {} tokens{extra} but the context length is {}",
                full.len(),
                self.context_length
            )));
        }

        // 2. A cache computed under another expert set is stale: every position's keys and
        //    values depend on the adapters. The whole stream is re-evaluated.
        let key = req.experts.key();
        if state.set_key != key {
            state.cache.clear();
            state.tokens.clear();
            state.set_key = key;
        }
        state.n_virtual = n_virtual;

        // 3. Reuse the longest common prefix with what the cache holds; at least the last
        //    token is evaluated again so there are logits to sample from. Virtual tokens stay.
        let common = state.tokens.iter().zip(&full).take_while(|(a, b)| a == b).count().min(full.len() - 1);
        let keep = if state.cache.is_empty() { 0 } else { n_virtual + common };
        state.cache.truncate(keep);
        state.tokens.truncate(common);
        state.pending = None;

        // 4. Commit chat messages to the history now that the request is accepted.
        if let Input::Chat(msgs) = &req.input {
            state.shared.history.lock().unwrap().extend(msgs.iter().cloned());
        }

        let room = self.context_length - n_virtual - full.len();
        let max_tokens = req.options.max_tokens.unwrap_or(room.max(1));
        let usage = Usage { prompt_tokens: full.len(), completion_tokens: 0, cached_tokens: common };
        let vocab = self.model.cfg.vocab_size;
        let want_top = req.options.top_logprobs.is_some_and(|n| n > 0);
        let mut seq = Sequence::new(
            req.session,
            full[common..].to_vec(),
            Sampler::new(params, vocab),
            max_tokens,
            self.eos.clone(),
            req.options.stop.clone(),
            want_top,
            req.events,
            req.cancel,
            usage,
            is_chat,
            started,
        );
        seq.experts = req.experts;
        self.active.push_back(seq);
        Ok(())
    }

    fn sampling_params(&self, req: &GenerateRequest) -> Result<SamplingParams> {
        let o = &req.options;
        let d = &self.defaults;
        let lib = SamplingParams::default();
        let p = SamplingParams {
            temperature: o.temperature.or(d.temperature).unwrap_or(lib.temperature),
            top_k: o.top_k.or(d.top_k).unwrap_or(lib.top_k),
            top_p: o.top_p.or(d.top_p).unwrap_or(lib.top_p),
            min_p: o.min_p.or(d.min_p).unwrap_or(lib.min_p),
            repetition_penalty: o.repetition_penalty.or(d.repetition_penalty).unwrap_or(lib.repetition_penalty),
            frequency_penalty: o.frequency_penalty.unwrap_or(lib.frequency_penalty),
            presence_penalty: o.presence_penalty.unwrap_or(lib.presence_penalty),
            seed: o.seed,
            top_logprobs: o.top_logprobs.unwrap_or(0),
        };
        p.validate().map_err(EngineError::InvalidArgument)?;
        if o.max_tokens == Some(0) {
            return Err(EngineError::InvalidArgument("maxTokens must be at least 1".into()));
        }
        Ok(p)
    }

    /// One step: evaluate the pending prompt (first step) or the last sampled token, then
    /// sample the next token.
    fn step(&mut self, seq: &mut Sequence) -> Result<Option<FinishReason>> {
        if seq.is_cancelled() {
            return Ok(Some(FinishReason::Cancelled));
        }
        let state = self.sessions.get_mut(&seq.session).ok_or_else(|| EngineError::Disposed("session was disposed".into()))?;
        let input: Vec<u32> = if !seq.pending_prompt.is_empty() {
            std::mem::take(&mut seq.pending_prompt)
        } else {
            vec![seq.last_token.expect("a decode step follows a sampled token")]
        };
        let logits = self.model.forward_with(&input, &mut state.cache, Logits::Last, &seq.experts)?;
        state.tokens.extend_from_slice(&input);
        if seq.last_token.is_none() {
            seq.mark_prefill_done();
        }
        let logits: Vec<f32> = logits.to_vec1()?;
        let sampled = seq.sampler.sample(&logits, &state.tokens);
        let room_left = state.virtual_cached() + state.tokens.len() < self.context_length;
        Ok(seq.on_token(&self.tokenizer, sampled, room_left))
    }

    fn finish(&mut self, seq: Sequence, reason: FinishReason) {
        let id = seq.session;
        let is_chat = seq.is_chat;
        let last = seq.last_token;
        let (done, events) = seq.finish(&self.tokenizer, reason);
        if let Some(s) = self.sessions.get_mut(&id) {
            // The last sampled token is never evaluated by this request.
            s.pending = last;
            if is_chat {
                s.shared.history.lock().unwrap().push(ChatMessage { role: "assistant".into(), content: done.text.clone() });
            }
            s.shared.busy.store(false, Ordering::Release);
        }
        let _ = events.send(Event::Done(done));
    }

    fn fail(&mut self, seq: Sequence, e: EngineError) {
        if let Some(s) = self.sessions.get_mut(&seq.session) {
            s.clear();
            s.shared.busy.store(false, Ordering::Release);
        }
        let _ = seq.events.send(Event::Error(e));
    }

    fn cancel_all(&mut self) {
        while let Some(seq) = self.active.pop_front() {
            let _ = seq.events.send(Event::Error(EngineError::Disposed("the runtime was disposed".into())));
        }
    }
}
