//! Plain JS objects crossing the boundary (`#[napi(object)]`), and their conversions.

use napi_derive::napi;

use super::error::{invalid, to_napi};
use super::structured::{tool_choice, JsToolCall, JsToolCallDelta, NativeResponseFormat, NativeTool};
use crate::engine::{self, Completion, TokenChunk};
use crate::experts::router::{Decision, RouterSettings, Weights};
use crate::sampling::SamplingOverrides;
use crate::tokenizer::ChatMessage;

#[napi(object)]
#[derive(Default)]
pub struct NativeLoadOptions {
    pub device: Option<String>,
    pub dtype: Option<String>,
    pub context_length: Option<u32>,
    /// JSON text of the `ropeScaling` option (`null` turns the model's own scaling off).
    pub rope_scaling: Option<String>,
    pub threads: Option<u32>,
    pub kv_cache: Option<NativeKvCacheOptions>,
    pub quantize: Option<String>,
    pub mmap: Option<bool>,
    /// `contextLength: 'auto'`.
    pub context_length_auto: Option<bool>,
    pub memory_limit: Option<f64>,
}

#[napi(object)]
#[derive(Default)]
pub struct NativeKvCacheOptions {
    pub block_size: Option<u32>,
    pub max_tokens: Option<f64>,
    pub max_bytes: Option<f64>,
    pub idle_release_ms: Option<f64>,
    pub prefix_cache: Option<bool>,
    pub dtype: Option<String>,
    pub max_sequences: Option<u32>,
    pub disk: Option<NativeKvDiskOptions>,
}

/// `kvCache.disk`: the prefix cache's disk tier.
#[napi(object)]
pub struct NativeKvDiskOptions {
    pub dir: String,
    pub max_bytes: f64,
}

#[napi(object)]
pub struct RuntimeStats {
    pub kv_blocks_total: f64,
    pub kv_blocks_used: f64,
    pub kv_blocks_cached: f64,
    pub kv_blocks_touched: f64,
    pub kv_block_size: f64,
    pub kv_bytes: f64,
    pub kv_bytes_per_token: f64,
    pub sessions: f64,
    pub active_requests: f64,
    pub queued_requests: f64,
    pub prefix_cache_hit_tokens: f64,
    pub evicted_blocks: f64,
    pub waited_requests: f64,
    pub kv_blocks_released: f64,
    pub kv_blocks_behind_window: f64,
    pub kv_state_slots: f64,
    pub kv_state_slots_used: f64,
    pub kv_state_bytes: f64,
    pub kv_state_bytes_per_sequence: f64,
    pub kv_device_bytes: f64,
    pub device_memory_free: Option<f64>,
    pub device_memory_total: Option<f64>,
    pub memory: NativeMemoryByKind,
    pub kv_disk: Option<NativeKvDiskStats>,
    pub running_experts: Vec<String>,
    pub waiting_experts: Vec<String>,
    pub kv_events_dropped: f64,
}

/// A KV event (vLLM's `BlockStored` / `BlockRemoved`): `kind` `stored` or `removed`; hashes are
/// the prefix index's content ids (below 2^53 in any real run: one per registered block).
#[napi(object)]
pub struct NativeKvEvent {
    pub kind: String,
    pub block_hash: f64,
    pub parent_block_hash: Option<f64>,
    pub token_ids: Vec<u32>,
    pub block_size: u32,
    pub lora_id: Option<f64>,
}

impl NativeKvEvent {
    pub fn new(e: crate::kv::prefix::IndexEvent, block_size: u32) -> Self {
        use crate::kv::prefix::IndexEvent;
        match e {
            IndexEvent::Stored { cid, parent, experts, tokens } => Self {
                kind: "stored".into(),
                block_hash: cid as f64,
                parent_block_hash: parent.map(|p| p as f64),
                token_ids: tokens,
                block_size,
                lora_id: crate::engine::kv_events::lora_id(&experts).map(|l| l as f64),
            },
            IndexEvent::Removed { cid } => Self {
                kind: "removed".into(),
                block_hash: cid as f64,
                parent_block_hash: None,
                token_ids: Vec::new(),
                block_size,
                lora_id: None,
            },
        }
    }
}

/// What the prefix cache's disk tier did since load (`stats().kvDisk`).
#[napi(object)]
pub struct NativeKvDiskStats {
    pub written_blocks: f64,
    pub dropped_blocks: f64,
    pub failed_blocks: f64,
    pub read_blocks: f64,
    pub rejected_blocks: f64,
    pub evicted_blocks: f64,
    pub bytes: f64,
}

/// Resident bytes by kind (`stats().memory`).
#[napi(object)]
pub struct NativeMemoryByKind {
    pub weights: f64,
    pub kv: f64,
    pub state: f64,
    pub experts: f64,
}

impl From<engine::StatsSnapshot> for RuntimeStats {
    fn from(s: engine::StatsSnapshot) -> Self {
        Self {
            kv_blocks_total: s.kv_blocks_total as f64,
            kv_blocks_used: s.kv_blocks_used as f64,
            kv_blocks_cached: s.kv_blocks_cached as f64,
            kv_blocks_touched: s.kv_blocks_touched as f64,
            kv_block_size: s.kv_block_size as f64,
            kv_bytes: s.kv_bytes as f64,
            kv_bytes_per_token: s.kv_bytes_per_token as f64,
            sessions: s.sessions as f64,
            active_requests: s.active_requests as f64,
            queued_requests: s.queued_requests as f64,
            prefix_cache_hit_tokens: s.prefix_cache_hit_tokens as f64,
            evicted_blocks: s.evicted_blocks as f64,
            waited_requests: s.waited_requests as f64,
            kv_blocks_released: s.kv_blocks_released as f64,
            kv_blocks_behind_window: s.kv_blocks_behind_window as f64,
            kv_state_slots: s.kv_state_slots as f64,
            kv_state_slots_used: s.kv_state_slots_used as f64,
            kv_state_bytes: s.kv_state_bytes as f64,
            kv_state_bytes_per_sequence: s.kv_state_bytes_per_sequence as f64,
            kv_device_bytes: s.kv_device_bytes as f64,
            device_memory_free: s.device_memory_free.map(|b| b as f64),
            device_memory_total: s.device_memory_total.map(|b| b as f64),
            memory: NativeMemoryByKind {
                weights: s.memory.weights as f64,
                kv: s.memory.kv as f64,
                state: s.memory.state as f64,
                experts: s.memory.experts as f64,
            },
            kv_disk: s.kv_disk.map(|d| NativeKvDiskStats {
                written_blocks: d.written_blocks as f64,
                dropped_blocks: d.dropped_blocks as f64,
                failed_blocks: d.failed_blocks as f64,
                read_blocks: d.read_blocks as f64,
                rejected_blocks: d.rejected_blocks as f64,
                evicted_blocks: d.evicted_blocks as f64,
                bytes: d.bytes as f64,
            }),
            running_experts: s.running_experts,
            waiting_experts: s.waiting_experts,
            kv_events_dropped: s.kv_events_dropped as f64,
        }
    }
}

#[napi(object)]
pub struct NativeExpertOptions {
    pub name: Option<String>,
    /// The name when neither `name` nor the manifest gives one (instead of the directory's).
    pub default_name: Option<String>,
    pub scale: Option<f64>,
    pub mmap: Option<bool>,
}

#[napi(object)]
pub struct LoadProgress {
    pub loaded_bytes: f64,
    pub total_bytes: f64,
}

#[napi(object)]
pub struct RuntimeInfo {
    pub architecture: String,
    pub family: String,
    pub dtype: String,
    pub device: String,
    pub device_name: String,
    pub device_memory_total: Option<f64>,
    pub vocab_size: u32,
    pub context_length: u32,
    pub num_layers: u32,
    pub hidden_size: u32,
    pub eos_token_ids: Vec<u32>,
    /// JSON text of the RoPE scaling the model runs with; `None` when it has none.
    pub rope_scaling: Option<String>,
    pub kv_cache_dtype: String,
    pub quantization: String,
    pub weight_bytes: f64,
    pub warnings: Vec<String>,
}

#[napi(object)]
#[derive(Clone)]
pub struct JsChatMessage {
    pub role: String,
    pub content: String,
    /// The calls an assistant turn made.
    pub tool_calls: Option<Vec<JsToolCall>>,
    /// For a `tool` message: the id of the call it answers.
    pub tool_call_id: Option<String>,
    /// An assistant turn's thought.
    pub reasoning: Option<String>,
}

/// The normalised input: exactly one of the fields is set (lib/session.ts builds it).
#[napi(object)]
pub struct NativeInput {
    pub messages: Option<Vec<JsChatMessage>>,
    pub text: Option<String>,
    pub tokens: Option<Vec<u32>>,
}

#[napi(object)]
#[derive(Default)]
pub struct NativeGenerateOptions {
    pub max_tokens: Option<u32>,
    pub temperature: Option<f64>,
    pub top_k: Option<u32>,
    pub top_p: Option<f64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub seed: Option<f64>,
    pub stop: Option<Vec<String>>,
    pub top_logprobs: Option<u32>,
    pub enable_thinking: Option<bool>,
    /// `thinking: { budgetTokens }` (0: no thought).
    pub thinking_budget: Option<u32>,
    pub experts: Option<Vec<String>>,
    /// `experts: 'auto'` (then `experts` is unset): the router picks the set.
    pub experts_auto: Option<bool>,
    pub parse_special_tokens: Option<bool>,
    pub response_format: Option<NativeResponseFormat>,
    pub tools: Option<Vec<NativeTool>>,
    /// 'auto' | 'none' | 'required' (a named tool is `toolChoiceName`).
    pub tool_choice: Option<String>,
    pub tool_choice_name: Option<String>,
    pub parallel_tool_calls: Option<bool>,
    pub speculative: Option<NativeSpeculative>,
}

/// `speculative`: drafted tokens checked in one pass (see `engine::speculative`).
#[napi(object)]
pub struct NativeSpeculative {
    /// 'ngram' (prompt lookup) or 'draft' (the model is passed beside the options).
    #[napi(js_name = "type")]
    pub kind: String,
    pub max_draft: Option<u32>,
    pub ngram: Option<u32>,
    pub min_ngram: Option<u32>,
}

impl NativeSpeculative {
    fn into_engine(self, draft: Option<engine::DraftModel>) -> napi::Result<engine::SpeculativeOptions> {
        let n = |v: Option<u32>| v.map(|x| x as usize);
        engine::SpeculativeOptions::new(&self.kind, n(self.max_draft), n(self.ngram), n(self.min_ngram), draft).map_err(to_napi)
    }
}

#[napi(object)]
pub struct TopLogprob {
    pub token_id: u32,
    pub logprob: f64,
}

#[napi(object)]
pub struct JsTokenChunk {
    pub token_id: u32,
    pub text: String,
    /// The thought text this token wrote (set only when it wrote some).
    pub reasoning: Option<String>,
    pub logprob: f64,
    pub top_logprobs: Option<Vec<TopLogprob>>,
    /// The first piece of a tool call this token wrote (`toolCallDeltas` has them all).
    pub tool_call_delta: Option<JsToolCallDelta>,
    /// Every piece of tool calls this token wrote (rarely more than one).
    pub tool_call_deltas: Option<Vec<JsToolCallDelta>>,
    /// First chunk only: the experts the request runs under, in application order.
    pub experts: Option<Vec<String>>,
    /// First chunk only, for `experts: 'auto'`: the router's decision.
    pub routing: Option<JsRouteDecision>,
}

#[napi(object)]
pub struct JsUsage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub cached_tokens: u32,
    /// Tokens proposed by speculative decoding and checked by the model.
    pub draft_tokens: u32,
    /// Of `draftTokens`, those the model agreed with.
    pub accepted_draft_tokens: u32,
    /// Of `completionTokens`, those of the thought (thinking models).
    pub reasoning_tokens: u32,
}

#[napi(object)]
pub struct JsTimings {
    pub ttft_ms: f64,
    /// Preparing the request off the engine thread (rendering, tokenizing, compiling its format).
    pub prepare_ms: f64,
    /// Of `prepareMs`, compiling the response format (0 without one).
    pub format_ms: f64,
    pub tokens_per_second: f64,
    pub prefill_tokens_per_second: f64,
}

#[napi(object)]
pub struct JsCompletion {
    pub text: String,
    /// The thought before the answer (thinking models only).
    pub reasoning: Option<String>,
    pub tokens: Vec<u32>,
    pub finish_reason: String,
    pub usage: JsUsage,
    pub timings: JsTimings,
    /// The experts that ran, in application order.
    pub experts: Vec<String>,
    /// The router's decision when the request asked for `auto`.
    pub routing: Option<JsRouteDecision>,
    /// The tool calls of the answer (`finishReason: 'tool_calls'`).
    pub tool_calls: Option<Vec<JsToolCall>>,
}

#[napi(object)]
pub struct JsExpertScore {
    pub name: String,
    pub score: f64,
    pub keyword_hits: Vec<String>,
    pub exclude_hits: Vec<String>,
    pub similarity: Option<f64>,
}

#[napi(object)]
pub struct JsRouteDecision {
    /// The query's similarity to the nearest generic reference query (null without an
    /// embedding).
    pub generic_similarity: Option<f64>,
    pub experts: Vec<String>,
    pub generic: bool,
    pub scores: Vec<JsExpertScore>,
    pub reason: String,
}

impl From<Decision> for JsRouteDecision {
    fn from(d: Decision) -> Self {
        Self {
            generic_similarity: d.generic_similarity,
            experts: d.experts,
            generic: d.generic,
            scores: d
                .scores
                .into_iter()
                .map(|s| JsExpertScore {
                    name: s.name,
                    // -Infinity (a score that overflowed) crosses as the most negative number.
                    score: if s.score.is_finite() { s.score } else { f64::MIN },
                    keyword_hits: s.keyword_hits,
                    exclude_hits: s.exclude_hits,
                    similarity: s.similarity,
                })
                .collect(),
            reason: d.reason,
        }
    }
}

#[napi(object)]
pub struct NativeEmbedOptions {
    /// `mean` | `last`.
    pub pooling: Option<String>,
    pub normalize: Option<bool>,
    pub experts: Option<Vec<String>>,
}

#[napi(object)]
pub struct JsRouterWeights {
    pub keywords: f64,
    pub similarity: f64,
}

#[napi(object)]
pub struct JsRouterSettings {
    pub threshold: f64,
    pub max_experts: u32,
    pub generic_patterns: Vec<String>,
    pub weights: JsRouterWeights,
    pub history_turns: u32,
    pub generic_min_keyword_hits: u32,
}

impl From<RouterSettings> for JsRouterSettings {
    fn from(s: RouterSettings) -> Self {
        Self {
            threshold: s.threshold,
            max_experts: s.max_experts as u32,
            generic_patterns: s.generic_patterns,
            weights: JsRouterWeights { keywords: s.weights.keywords, similarity: s.weights.similarity },
            history_turns: s.history_turns.min(u32::MAX as usize) as u32,
            generic_min_keyword_hits: s.generic_min_keyword_hits.min(u32::MAX as usize) as u32,
        }
    }
}

impl From<JsRouterSettings> for RouterSettings {
    fn from(s: JsRouterSettings) -> Self {
        Self {
            threshold: s.threshold,
            max_experts: s.max_experts as usize,
            generic_patterns: s.generic_patterns,
            weights: Weights { keywords: s.weights.keywords, similarity: s.weights.similarity },
            history_turns: s.history_turns as usize,
            generic_min_keyword_hits: s.generic_min_keyword_hits as usize,
        }
    }
}

impl From<ChatMessage> for JsChatMessage {
    fn from(m: ChatMessage) -> Self {
        Self {
            role: m.role,
            content: m.content,
            tool_calls: (!m.tool_calls.is_empty()).then(|| m.tool_calls.into_iter().map(Into::into).collect()),
            tool_call_id: m.tool_call_id,
            reasoning: m.reasoning,
        }
    }
}

impl From<JsChatMessage> for ChatMessage {
    fn from(m: JsChatMessage) -> Self {
        Self {
            role: m.role,
            content: m.content,
            tool_calls: m.tool_calls.unwrap_or_default().into_iter().map(Into::into).collect(),
            tool_call_id: m.tool_call_id,
            reasoning: m.reasoning,
        }
    }
}

impl From<TokenChunk> for JsTokenChunk {
    fn from(c: TokenChunk) -> Self {
        Self {
            token_id: c.token_id,
            text: c.text,
            reasoning: (!c.reasoning.is_empty()).then_some(c.reasoning),
            logprob: c.logprob as f64,
            top_logprobs: c
                .top_logprobs
                .map(|v| v.into_iter().map(|(token_id, lp)| TopLogprob { token_id, logprob: lp as f64 }).collect()),
            tool_call_delta: c.tool_call_deltas.first().cloned().map(Into::into),
            tool_call_deltas: (!c.tool_call_deltas.is_empty()).then(|| c.tool_call_deltas.into_iter().map(Into::into).collect()),
            experts: c.start.as_ref().map(|s| s.experts.clone()),
            routing: c.start.and_then(|s| s.routing).map(Into::into),
        }
    }
}

impl From<Completion> for JsCompletion {
    fn from(c: Completion) -> Self {
        Self {
            text: c.text,
            reasoning: c.reasoning,
            tokens: c.tokens,
            finish_reason: c.finish_reason.as_str().into(),
            usage: JsUsage {
                prompt_tokens: c.usage.prompt_tokens as u32,
                completion_tokens: c.usage.completion_tokens as u32,
                cached_tokens: c.usage.cached_tokens as u32,
                draft_tokens: c.usage.draft_tokens as u32,
                accepted_draft_tokens: c.usage.accepted_draft_tokens as u32,
                reasoning_tokens: c.usage.reasoning_tokens as u32,
            },
            timings: JsTimings {
                ttft_ms: c.timings.ttft_ms,
                prepare_ms: c.timings.prepare_ms,
                format_ms: c.timings.format_ms,
                tokens_per_second: c.timings.tokens_per_second,
                prefill_tokens_per_second: c.timings.prefill_tokens_per_second,
            },
            experts: c.experts,
            routing: c.routing.map(Into::into),
            tool_calls: (!c.tool_calls.is_empty()).then(|| c.tool_calls.into_iter().map(Into::into).collect()),
        }
    }
}

impl NativeInput {
    pub fn into_engine(self) -> napi::Result<engine::Input> {
        match (self.messages, self.text, self.tokens) {
            (Some(m), None, None) => Ok(engine::Input::Chat(m.into_iter().map(Into::into).collect())),
            (None, Some(t), None) => Ok(engine::Input::Text(t)),
            (None, None, Some(t)) => Ok(engine::Input::Tokens(t)),
            _ => Err(invalid("input must be a string, a ChatMessage[], { text } or { tokens }")),
        }
    }
}

impl NativeGenerateOptions {
    /// Types were checked in TypeScript (`lib/session.ts`) and ranges are checked once by
    /// `SamplingParams::validate`; this only converts (a non-finite number stays non-finite
    /// and is refused there).
    pub fn into_engine(self, draft: Option<engine::DraftModel>) -> napi::Result<engine::GenerateOptions> {
        let f32_of = |v: Option<f64>| v.map(|x| x as f32);
        Ok(engine::GenerateOptions {
            max_tokens: self.max_tokens.map(|n| n as usize),
            sampling: SamplingOverrides {
                temperature: f32_of(self.temperature),
                top_k: self.top_k.map(|n| n as usize),
                top_p: f32_of(self.top_p),
                min_p: f32_of(self.min_p),
                repetition_penalty: f32_of(self.repetition_penalty),
                frequency_penalty: f32_of(self.frequency_penalty),
                presence_penalty: f32_of(self.presence_penalty),
                // TypeScript admits only safe non-negative integers.
                seed: self.seed.map(|s| s as u64),
                top_logprobs: self.top_logprobs.map(|n| n as usize),
            },
            stop: self.stop.unwrap_or_default(),
            enable_thinking: self.enable_thinking,
            thinking_budget: self.thinking_budget.map(|n| n as usize),
            experts: match (self.experts_auto, self.experts) {
                (Some(true), None) => Some(engine::ExpertChoice::Auto),
                (Some(true), Some(_)) => return Err(invalid("experts is either 'auto' or a list of names")),
                (_, names) => names.map(engine::ExpertChoice::Named),
            },
            parse_special_tokens: self.parse_special_tokens.unwrap_or(false),
            response_format: self.response_format.map(NativeResponseFormat::into_engine).transpose()?,
            tools: self.tools.unwrap_or_default().into_iter().map(NativeTool::into_engine).collect::<napi::Result<_>>()?,
            tool_choice: tool_choice(self.tool_choice, self.tool_choice_name)?,
            parallel_tool_calls: self.parallel_tool_calls,
            speculative: match self.speculative {
                Some(s) => Some(s.into_engine(draft)?),
                None if draft.is_some() => return Err(invalid("a draft runtime was given without speculative options")),
                None => None,
            },
        })
    }
}
