//! One running request: its sampler, incremental detokenizer, stop-string matcher and
//! counters. The scheduler feeds it one sampled token at a time and it decides what text to
//! release and whether to finish.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::request::{ChunkStart, Completion, Event, FinishReason, GenerateRequest, Timings, TokenChunk, Usage};
use crate::experts::router::Decision;
use crate::experts::ExpertSet;
use crate::sampling::{Constraint, Sampled, Sampler};
use crate::tokenizer::tools::{ToolOutcome, ToolStream};
use crate::tokenizer::{IncrementalDecoder, Tokenizer, ToolCall};

/// Holds back text that could still become a stop string, across token boundaries.
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        Self { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), pending: String::new() }
    }

    /// Adds `delta`; returns the text that is safe to emit and whether a stop string matched
    /// (the stop string and anything after it are never emitted).
    pub fn push(&mut self, delta: &str) -> (String, bool) {
        self.pending.push_str(delta);
        if let Some(at) = self.stops.iter().filter_map(|s| self.pending.find(s.as_str())).min() {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, true);
        }
        // Keep the longest suffix of `pending` that is a proper prefix of some stop string.
        let keep = self
            .stops
            .iter()
            .map(|s| {
                (1..s.len().min(self.pending.len() + 1))
                    .rev()
                    .find(|&n| s.is_char_boundary(n) && self.pending.ends_with(&s[..n]))
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, false)
    }

    /// Text still held back when generation ends for another reason.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

pub struct Sequence {
    pub session: u64,
    /// The full token stream this turn runs on (the session's stream plus the new input);
    /// moved into the session when the request is admitted.
    pub prompt: Vec<u32>,
    /// Prompt-tuning virtual tokens before `prompt`.
    pub n_virtual: usize,
    /// Positions the request may fill: the context length, or less when its reserved blocks
    /// end sooner (a pool smaller than the context).
    pub limit: usize,
    /// Whether the request holds its blocks and runs (otherwise it waits for room).
    pub admitted: bool,
    /// Whether it has waited for room at least once (counted once in the stats).
    pub waited: bool,
    /// The last sampled token, fed to the model in the next decode step.
    pub last_token: Option<u32>,
    pub sampler: Sampler,
    pub max_tokens: usize,
    pub eos: Vec<u32>,
    pub events: UnboundedSender<Event>,
    pub cancel: Arc<AtomicBool>,
    pub is_chat: bool,
    /// The experts pinned for the whole request.
    pub experts: ExpertSet,
    routing: Option<Decision>,
    /// The grammar the output obeys (its mask is computed by the scheduler each step).
    pub constraint: Option<Box<Constraint>>,
    /// Proposes draft tokens when the request asked for speculative decoding (never with a
    /// grammar: its mask is computed one token at a time).
    pub drafter: Option<super::speculative::Drafter>,
    /// A grammar that waits for the answer while the model thinks.
    deferred: Option<Box<Constraint>>,
    /// Splits a thinking model's thought from its answer.
    thinking: Option<super::thinking::Thinking>,
    /// Splits the text into plain text and tool calls, when the request offers tools.
    tools: Option<ToolStream>,
    tool_calls: Vec<ToolCall>,
    /// (prepare_ms, format_ms) of the request's preparation.
    prepared: (f64, f64),
    detok: IncrementalDecoder,
    stop: StopMatcher,
    want_top: bool,
    stopped_by_string: bool,
    text: String,
    tokens: Vec<u32>,
    pub usage: Usage,
    started: Instant,
    prefill_done: Option<Instant>,
    first_token: Option<Instant>,
}

impl Sequence {
    /// A queued request: `req` with the token stream it runs on (`prompt`, after the chat
    /// template), its sampler and token budget, and the time it arrived.
    pub fn new(
        req: GenerateRequest,
        prompt: Vec<u32>,
        is_chat: bool,
        sampler: Sampler,
        max_tokens: usize,
        eos: Vec<u32>,
        started: Instant,
    ) -> Self {
        let GenerateRequest { session, prompt: _, options, experts, routing, events, cancel, structured, thinking } = req;
        let constrained = structured.constraint.is_some();
        let thinking = thinking.map(|plan| super::thinking::Thinking::new(plan, constrained));
        let (constraint, deferred) = match &thinking {
            Some(t) if !t.answering() => (None, structured.constraint),
            _ => (structured.constraint, None),
        };
        Self {
            session,
            usage: Usage { prompt_tokens: prompt.len(), ..Usage::default() },
            prompt,
            n_virtual: experts.num_virtual_tokens(),
            limit: 0,
            admitted: false,
            waited: false,
            last_token: None,
            want_top: sampler.params().top_logprobs > 0,
            sampler,
            max_tokens,
            eos,
            events,
            cancel,
            is_chat,
            experts,
            routing,
            drafter: options.speculative.filter(|_| !constrained).map(super::speculative::Drafter::new),
            constraint,
            deferred,
            thinking,
            tools: structured.tools,
            tool_calls: Vec::new(),
            prepared: (structured.prepare_ms, structured.compile_ms),
            detok: IncrementalDecoder::new(),
            stop: StopMatcher::new(options.stop),
            stopped_by_string: false,
            text: String::new(),
            tokens: Vec::new(),
            started,
            prefill_done: None,
            first_token: None,
        }
    }

    /// Cancelled by the caller, or nobody listens any more (the JS stream was dropped).
    pub fn is_cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed) || self.events.is_closed()
    }

    /// The token this request must emit next whatever the model prefers (closing a thought at
    /// its budget, see `engine::thinking`).
    pub fn forced_token(&self) -> Option<u32> {
        self.thinking.as_ref().and_then(|t| t.forced())
    }

    /// Draft tokens appended to the session's stream for this step (0: plain decoding).
    pub fn drafted(&self) -> usize {
        self.drafter.as_ref().map_or(0, |d| d.pending().len())
    }

    pub fn mark_prefill_done(&mut self) {
        self.prefill_done = Some(Instant::now());
    }

    /// Handles one sampled token: emits its chunk and returns `Some(reason)` when the
    /// request is over. `room_left` is false when the context has no position for another token.
    pub fn on_token(&mut self, tok: &Tokenizer, s: Sampled, room_left: bool) -> Option<FinishReason> {
        let now = Instant::now();
        self.first_token.get_or_insert(now);
        self.usage.completion_tokens += 1;
        self.tokens.push(s.token);
        self.sampler.accept(s.token);
        let is_eos = self.eos.contains(&s.token);
        let (mut text, stopped) = if is_eos {
            (String::new(), false)
        } else {
            let delta = self.detok.push(tok, s.token).unwrap_or_default();
            self.stop.push(&delta)
        };
        self.stopped_by_string = stopped;
        // The grammar advances past the token; once it is complete the answer is over. (A
        // failure here cannot come from a token the mask allowed; it ends the answer.)
        let grammar_done = match (&mut self.constraint, is_eos) {
            (Some(c), false) => c.commit(s.token).unwrap_or(true),
            _ => false,
        };
        let mut reason = if is_eos || stopped || grammar_done {
            Some(FinishReason::Stop)
        } else if self.usage.completion_tokens >= self.max_tokens || !room_left {
            Some(FinishReason::Length)
        } else {
            None
        };
        // The last chunk carries what is still held back (an incomplete UTF-8 tail, a partial
        // stop-string match), so the chunks concatenate to the summary's text.
        if reason.is_some() && !stopped {
            text.push_str(&self.release_held(tok));
        }
        let (text, reasoning) = self.split_thought(&text, reason.is_some());
        let (mut text, tool_call_deltas) = match &mut self.tools {
            Some(t) => t.push(&text),
            None => (text, Vec::new()),
        };
        // A call that repeats an earlier one is a loop: the answer ends with the calls so far.
        if reason.is_none() && self.tools.as_ref().is_some_and(ToolStream::looped) {
            reason = Some(FinishReason::Stop);
        }
        if let Some(r) = reason {
            text.push_str(&self.finish_tools(r));
        }
        self.text.push_str(&text);
        let start = (self.usage.completion_tokens == 1).then(|| {
            let experts = self.experts.experts().iter().map(|e| e.name.clone()).collect();
            Box::new(ChunkStart { experts, routing: self.routing.clone() })
        });
        let chunk = TokenChunk {
            token_id: s.token,
            text,
            reasoning,
            logprob: s.logprob,
            top_logprobs: self.want_top.then_some(s.top_logprobs),
            tool_call_deltas,
            start,
        };
        let _ = self.events.send(Event::Token(chunk));
        self.last_token = Some(s.token);
        reason
    }

    /// Splits a token's text into answer and thought (all answer for a model that does not
    /// think); `last`: the output ends with it. Once the answer starts, its grammar applies.
    fn split_thought(&mut self, text: &str, last: bool) -> (String, String) {
        let Some(t) = &mut self.thinking else { return (text.to_string(), String::new()) };
        let (mut out, thought) = t.push(text);
        self.usage.reasoning_tokens += thought as usize;
        if last {
            let rest = t.finish("");
            out.answer.push_str(&rest.answer);
            out.thought.push_str(&rest.thought);
        }
        if self.deferred.is_some() && t.answering() {
            self.constraint = self.deferred.take();
        }
        (out.answer, out.thought)
    }

    /// Ends the tool-call splitter (once): records the calls and returns the text it still
    /// held (all of a malformed call's text).
    fn finish_tools(&mut self, reason: FinishReason) -> String {
        let Some(mut t) = self.tools.take() else { return String::new() };
        let (rest, outcome) = t.finish(reason == FinishReason::Length);
        if let ToolOutcome::Calls(calls) = outcome {
            self.tool_calls = calls;
        }
        rest
    }

    /// Flushes the detokenizer and the stop matcher (lossy: an incomplete character becomes
    /// U+FFFD). Empty when called again.
    fn release_held(&mut self, tok: &Tokenizer) -> String {
        let tail = self.detok.flush(tok).unwrap_or_default();
        let (mut out, _) = self.stop.push(&tail);
        out.push_str(&self.stop.finish());
        out
    }

    /// Builds the summary. The caller updates the session, then sends it with
    /// [`Sequence::send_done`], so a JS caller that sees the end finds the session free.
    pub fn finish(mut self, tok: &Tokenizer, reason: FinishReason) -> (Completion, UnboundedSender<Event>) {
        // Release what the detokenizer and the stop matcher held (done by `on_token` already
        // when it ended the request). Not after a cancellation: the text was never delivered
        // in a chunk, and the summary is what the chunks delivered.
        if reason != FinishReason::Cancelled && !self.stopped_by_string {
            let out = self.release_held(tok);
            let out = match &mut self.thinking {
                Some(t) => t.finish(&out).answer,
                None => out,
            };
            let out = match &mut self.tools {
                Some(t) => t.push(&out).0,
                None => out,
            };
            self.text.push_str(&out);
        }
        if reason != FinishReason::Cancelled {
            let rest = self.finish_tools(reason);
            self.text.push_str(&rest);
        }
        let reason = if reason == FinishReason::Stop && !self.tool_calls.is_empty() { FinishReason::ToolCalls } else { reason };
        let now = Instant::now();
        let first = self.first_token.unwrap_or(now);
        let decode_n = self.usage.completion_tokens.saturating_sub(1) as f64;
        let decode_s = now.duration_since(first).as_secs_f64();
        let prefill_s = self.prefill_done.unwrap_or(now).duration_since(self.started).as_secs_f64();
        let evaluated = (self.usage.prompt_tokens - self.usage.cached_tokens) as f64;
        let timings = Timings {
            ttft_ms: first.duration_since(self.started).as_secs_f64() * 1e3,
            tokens_per_second: if decode_n > 0.0 && decode_s > 0.0 {
                decode_n / decode_s
            } else {
                self.usage.completion_tokens as f64 / now.duration_since(self.started).as_secs_f64().max(1e-9)
            },
            prefill_tokens_per_second: if prefill_s > 0.0 { evaluated / prefill_s } else { 0.0 },
            prepare_ms: self.prepared.0,
            format_ms: self.prepared.1,
        };
        let done = Completion {
            text: self.text,
            reasoning: self.thinking.map(|t| t.thought),
            tokens: self.tokens,
            finish_reason: reason,
            usage: self.usage,
            timings,
            history_index: None,
            experts: self.experts.experts().iter().map(|e| e.name.clone()).collect(),
            routing: self.routing,
            tool_calls: self.tool_calls,
        };
        (done, self.events)
    }
}

#[cfg(test)]
mod tests {
    use super::StopMatcher;

    #[test]
    fn stop_string_split_across_pushes_is_not_emitted() {
        let mut m = StopMatcher::new(vec!["</end>".into()]);
        assert_eq!(m.push("hello </"), ("hello ".to_string(), false));
        assert_eq!(m.push("en"), (String::new(), false));
        assert_eq!(m.push("d> tail"), (String::new(), true));
    }

    #[test]
    fn held_back_prefix_is_released_when_it_diverges() {
        let mut m = StopMatcher::new(vec!["STOP".into(), "xyz".into()]);
        assert_eq!(m.push("aST"), ("a".to_string(), false));
        assert_eq!(m.push("x"), ("ST".to_string(), false));
        assert_eq!(m.finish(), "x");
    }

    #[test]
    fn earliest_stop_wins() {
        let mut m = StopMatcher::new(vec!["b".into(), "a".into()]);
        assert_eq!(m.push("xxab"), ("xx".to_string(), true));
    }
}
