//! What crosses the channel between the binding layer and the engine thread: commands in,
//! per-request events out.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc::UnboundedSender;

use crate::error::EngineError;
use crate::experts::router::Decision;
use crate::experts::ExpertSet;
use crate::sampling::{ResponseFormat, SamplingOverrides};
use crate::tokenizer::tools::ToolCallDelta;
use crate::tokenizer::{ChatMessage, TextTokens, ToolCall, ToolSpec};

/// What a request evaluates. Chat input goes through the model's chat template and into the
/// session's history; raw text and tokens continue the session's token stream as they are.
#[derive(Clone, Debug)]
pub enum Input {
    Chat(Vec<ChatMessage>),
    Text(String),
    Tokens(Vec<u32>),
}

/// Which experts a request runs under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExpertChoice {
    /// These, by name (empty: the base model).
    Named(Vec<String>),
    /// Whatever the router picks for the request (`Engine::route`).
    Auto,
}

impl Default for ExpertChoice {
    fn default() -> Self {
        Self::Named(Vec::new())
    }
}

/// Whether and which tool the model calls (OpenAI's `tool_choice`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// The model decides; a malformed call is returned as text.
    #[default]
    Auto,
    /// Tools are not offered.
    None,
    /// The answer is one or more calls (constrained).
    Required,
    /// The answer is a call to this tool (constrained).
    Named(String),
}

/// Per-request options; `None` falls back to `generation_config.json`, then to library defaults.
#[derive(Clone, Debug, Default)]
pub struct GenerateOptions {
    pub max_tokens: Option<usize>,
    /// Sampling settings this request sets (resolved over the model's defaults).
    pub sampling: SamplingOverrides,
    pub stop: Vec<String>,
    /// Whether a thinking model thinks (`None`: the chat template's default).
    pub enable_thinking: Option<bool>,
    /// Most thought tokens (`Some(0)`: no thought), see `engine::thinking`.
    pub thinking_budget: Option<usize>,
    /// Experts for this request; `None` uses the session's default.
    pub experts: Option<ExpertChoice>,
    /// Raw text input only: special-token spellings in it become control tokens. Chat
    /// content is always plain text.
    pub parse_special_tokens: bool,
    /// What the output must look like (`None`: free text).
    pub response_format: Option<ResponseFormat>,
    /// Functions the model may call.
    pub tools: Vec<ToolSpec>,
    pub tool_choice: ToolChoice,
    /// Several calls in one answer (where the template family allows it); default true.
    pub parallel_tool_calls: Option<bool>,
    /// Speculative decoding by prompt lookup or a draft model (`None`: plain decoding).
    pub speculative: Option<super::speculative::SpeculativeOptions>,
}

/// A request's input once tokenized (off the engine thread, see `engine::prepare`).
pub enum Prompt {
    /// The whole conversation through the chat template; `messages` join the history when
    /// the request is accepted.
    Chat {
        ids: Vec<u32>,
        messages: Vec<ChatMessage>,
        /// History messages (after the leading system ones) left out to fit the context
        /// (`contextShift`); they leave the history when the request is accepted.
        dropped: usize,
    },
    /// Raw text continuing the session's stream (BOS is added when it starts the stream).
    Text(Box<TextTokens>),
    Tokens(Vec<u32>),
}

#[derive(Clone, Debug)]
pub struct TokenChunk {
    pub token_id: u32,
    pub text: String,
    /// The thought text this token wrote (empty outside a thought).
    pub reasoning: String,
    pub logprob: f32,
    pub top_logprobs: Option<Vec<(u32, f32)>>,
    /// Pieces of tool calls this token wrote (its call markup is not in `text`).
    pub tool_call_deltas: Vec<ToolCallDelta>,
    /// The first chunk of a request only: the experts it runs under (in application order)
    /// and, for `experts: 'auto'`, the router's decision. A stream can say which experts run
    /// before it ends.
    pub start: Option<Box<ChunkStart>>,
}

/// What the first chunk of a request says about how it runs.
#[derive(Clone, Debug)]
pub struct ChunkStart {
    pub experts: Vec<String>,
    pub routing: Option<crate::experts::router::Decision>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    Cancelled,
    /// The answer is tool calls.
    ToolCalls,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Cancelled => "cancelled",
            Self::ToolCalls => "tool_calls",
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
    /// Tokens proposed by speculative decoding and checked by the model.
    pub draft_tokens: usize,
    /// Of `draft_tokens`, those the model agreed with (each saved a decode step).
    pub accepted_draft_tokens: usize,
    /// Of `completion_tokens`, those of the thought: its markers and the closing tokens forced
    /// at a budget included (thinking models; 0 otherwise).
    pub reasoning_tokens: usize,
}

#[derive(Clone, Debug, Default)]
pub struct Timings {
    /// Request received by the engine → first token sampled.
    pub ttft_ms: f64,
    /// Decode throughput after the first token (whole request when only one token).
    pub tokens_per_second: f64,
    /// Prompt tokens evaluated (not cached) per second of prefill.
    pub prefill_tokens_per_second: f64,
    /// Preparing the request off the engine thread: rendering, tokenizing, compiling its format.
    pub prepare_ms: f64,
    /// Of `prepare_ms`, compiling the response format or forced tool call (the first one after
    /// load also builds the token trie); 0 without one.
    pub format_ms: f64,
}

#[derive(Clone, Debug)]
pub struct Completion {
    pub text: String,
    /// The thought before the answer (`None`: the model does not think).
    pub reasoning: Option<String>,
    pub tokens: Vec<u32>,
    pub finish_reason: FinishReason,
    pub usage: Usage,
    pub timings: Timings,
    /// Where a chat turn's answer went in the session's history.
    pub history_index: Option<usize>,
    /// The experts that ran, in application order.
    pub experts: Vec<String>,
    /// The router's decision, when the request asked for `auto`.
    pub routing: Option<Decision>,
    /// The tool calls the answer made (then `text` is the text outside them).
    pub tool_calls: Vec<ToolCall>,
}

impl Completion {
    /// The summary of a request cancelled before it started.
    pub fn cancelled_unstarted() -> Self {
        Self {
            text: String::new(),
            reasoning: None,
            tokens: Vec::new(),
            finish_reason: FinishReason::Cancelled,
            usage: Usage::default(),
            timings: Timings::default(),
            history_index: None,
            experts: Vec::new(),
            routing: None,
            tool_calls: Vec::new(),
        }
    }
}

pub enum Event {
    Token(TokenChunk),
    Done(Box<Completion>),
    Error(EngineError),
}

/// State a session shares between its JS handle and the engine thread.
#[derive(Default)]
pub struct SessionShared {
    /// Set by the binding when a request starts, cleared by the engine when it ends: a second
    /// concurrent request is refused synchronously with `SESSION_BUSY`.
    pub busy: AtomicBool,
    pub history: Mutex<Vec<ChatMessage>>,
    pub system: Option<String>,
    /// The session's default experts (a request may override them).
    pub experts: Mutex<ExpertChoice>,
    /// What a chat turn that does not fit the context does.
    pub context_shift: super::context_shift::ContextShift,
}

pub struct GenerateRequest {
    pub session: u64,
    pub prompt: Prompt,
    pub options: GenerateOptions,
    /// The experts this request pinned when it was queued (or when the router chose them).
    pub experts: ExpertSet,
    /// The router's decision, for `auto`.
    pub routing: Option<Decision>,
    pub events: UnboundedSender<Event>,
    pub cancel: Arc<AtomicBool>,
    /// The grammar and tool-call splitter (set when the request is prepared).
    pub structured: super::structured::Structured,
    /// How a thinking model's thought runs (set when a chat request is prepared).
    pub thinking: Option<super::thinking::ThinkingPlan>,
}

/// How an embedding pools the final hidden states of a text's tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Pooling {
    /// The mean over every token (special tokens the tokenizer adds included).
    #[default]
    Mean,
    /// The last token's state.
    Last,
}

/// Called once, on the engine thread, with one un-normalized vector per text (or the error):
/// it must return quickly.
pub type EmbedReply = Box<dyn FnOnce(Result<Vec<Vec<f32>>, EngineError>) + Send>;

/// Texts to embed (already tokenized), as rows of the engine's passes.
pub struct EmbedRequest {
    pub texts: Vec<Vec<u32>>,
    pub pooling: Pooling,
    /// The adapters the texts run under (the embedding under those experts).
    pub experts: ExpertSet,
    pub reply: EmbedReply,
}

/// What the engine thread hands out of a session to save, or takes in to restore one.
#[derive(Clone, Debug)]
pub struct SessionSnapshot {
    /// The stream (cached, then any not yet cached) and the pending token.
    pub tokens: Vec<u32>,
    pub pending: Option<u32>,
    /// The cached positions' blocks and recurrent state.
    pub cache: crate::kv::image::TableImage,
    /// The pool's format name and block size, and one block's image size.
    pub kv_format: String,
    pub block_size: usize,
    pub block_bytes: usize,
    /// The load ids of the experts the cache was computed under, and the virtual (prompt
    /// tuning) positions it starts with.
    pub experts: Vec<u64>,
    pub n_virtual: usize,
}

/// Called once, on the engine thread, with a session's snapshot (or the error).
pub type SaveReply = Box<dyn FnOnce(Result<SessionSnapshot, EngineError>) + Send>;
/// Called once, on the engine thread, when a restored session is in place (or failed).
pub type RestoreReply = Box<dyn FnOnce(Result<(), EngineError>) + Send>;

pub enum Command {
    /// Snapshot a session (it must not be running).
    SaveSession {
        id: u64,
        reply: SaveReply,
    },
    /// A new session `id` from a snapshot.
    RestoreSession {
        id: u64,
        shared: Arc<SessionShared>,
        snapshot: Box<SessionSnapshot>,
        reply: RestoreReply,
    },
    CreateSession {
        id: u64,
        shared: Arc<SessionShared>,
    },
    Generate(Box<GenerateRequest>),
    Embed(Box<EmbedRequest>),
    ResetSession {
        id: u64,
    },
    /// The caller delivered fewer tokens of the session's last request than it produced:
    /// drop the last `tokens` of the session's stream (see `engine::delivery`).
    Undeliver {
        id: u64,
        tokens: usize,
    },
    DropSession {
        id: u64,
    },
    Shutdown {
        done: tokio::sync::oneshot::Sender<()>,
    },
}
