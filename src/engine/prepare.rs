//! Turning a request's input into tokens, off the engine thread.
//!
//! Rendering a long conversation and tokenizing a large prompt take time proportional to the
//! input (seconds for megabytes). On the engine thread that would stall every other session's
//! decoding; on the caller's thread it would block the JS event loop. So each request is
//! prepared on a small pool of its own ([`Preparer`]) and reaches the engine thread already
//! tokenized; the engine only checks lengths and queues it. The pool is one per process (its
//! threads idle between requests), so loading and disposing runtimes creates no threads for it.
//!
//! The session's state a preparation reads cannot change under it: the session is busy from
//! `Engine::generate` until its request ends, and a busy session refuses `reset`. The one
//! thing that depends on the engine's state, whether raw text starts the session's token
//! stream (and so gets BOS), is decided on the engine thread ([`Prompt::Text`]).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::{Arc, OnceLock};

use super::context_shift::{self, answer_room, ContextShift, Window};
use super::request::{Command, Event, GenerateOptions, GenerateRequest, Input, Prompt, SessionShared};
use super::structured::{Formats, Structured};
use super::thinking::{self, ThinkingPlan};
use crate::error::{panic_message, EngineError, Result};
use crate::tokenizer::reasoning::ReasoningSyntax;
use crate::tokenizer::{ChatMessage, Tokenizer, ToolSpec};

/// Most messages one request may carry.
pub const MAX_MESSAGES: usize = 4096;
/// Bytes of text a request may carry per token of the context. Real text runs 3 to 5 bytes a
/// token; a request far beyond that cannot fit the context, and rendering and tokenizing it
/// first would cost about 80 times its size in memory (100,000 messages of 3.6 MB took 290 MB
/// before they were refused as too long).
pub const MAX_INPUT_BYTES_PER_TOKEN: usize = 32;
/// A request may always carry this much text, however short the context.
pub const MIN_INPUT_BYTES: usize = 256 << 10;

/// Refuses, before anything is built from it, an input with more than [`MAX_MESSAGES`]
/// messages or more text than a context of `context_length` tokens can hold
/// ([`MAX_INPUT_BYTES_PER_TOKEN`]).
pub fn check_input(input: &Input, context_length: usize) -> Result<()> {
    let bytes = match input {
        Input::Chat(messages) => {
            if messages.len() > MAX_MESSAGES {
                return Err(EngineError::InvalidArgument(format!(
                    "a request may carry at most {MAX_MESSAGES} messages, got {}; send the conversation's recent turns, \
                     or keep it in a session, which sends only the new ones",
                    messages.len()
                )));
            }
            messages.iter().map(message_bytes).fold(0usize, usize::saturating_add)
        }
        Input::Text(t) => t.len(),
        Input::Tokens(_) => 0,
    };
    check_text_bytes(bytes, context_length)
}

/// Refuses `bytes` of input text, more than a context of `context_length` tokens can hold.
pub fn check_text_bytes(bytes: usize, context_length: usize) -> Result<()> {
    let max_bytes = context_length.saturating_mul(MAX_INPUT_BYTES_PER_TOKEN).max(MIN_INPUT_BYTES);
    if bytes > max_bytes {
        return Err(EngineError::ContextOverflow(format!(
            "the input is {bytes} bytes of text, more than a {context_length}-token context can hold \
             (at most {max_bytes} bytes are accepted); shorten it or split it across requests"
        )));
    }
    Ok(())
}

/// Text bytes of one message: what the chat template renders of it.
pub fn message_bytes(m: &ChatMessage) -> usize {
    let calls = m.tool_calls.iter().map(|c| c.id.len() + c.name.len() + c.arguments.len()).fold(0usize, usize::saturating_add);
    (m.role.len() + m.content.len() + m.tool_call_id.as_ref().map_or(0, String::len))
        .saturating_add(m.reasoning.as_ref().map_or(0, String::len))
        .saturating_add(calls)
}

/// Threads that prepare requests: enough that one huge prompt does not hold up the rest.
fn pool_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 8)
}

/// A request waiting for its tokens, with what it goes to the engine with.
pub struct Pending {
    pub input: Input,
    pub shared: Arc<SessionShared>,
    pub request: GenerateRequest,
    pub tx: Sender<Command>,
    /// The runtime's context length, for `contextShift`.
    pub context_length: usize,
}

pub(super) fn pool() -> Result<&'static rayon::ThreadPool> {
    static POOL: OnceLock<std::result::Result<rayon::ThreadPool, String>> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(pool_threads())
            .thread_name(|i| format!("expert-runtime-prepare-{i}"))
            // Grammars and chat templates recurse over untrusted input (`crate::stack`).
            .stack_size(crate::stack::UNTRUSTED_STACK)
            // Jobs catch their own panics; a panic escaping one would otherwise abort the
            // process (rayon's default for spawned jobs).
            .panic_handler(|_| {})
            .build()
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| EngineError::Internal(format!("cannot start the prompt preparation threads: {e}")))
}

/// Runs `job` on the pool (after what was submitted before it). The job catches its own
/// panics.
pub fn spawn(job: impl FnOnce() + Send + 'static) -> Result<()> {
    pool()?.spawn_fifo(job);
    Ok(())
}

/// Tokenizes `p.input` on the pool (in arrival order), then queues the request on the engine.
/// A failure ends the request with its error and frees the session.
pub fn submit(formats: Arc<Formats>, p: Pending) -> Result<()> {
    pool()?.spawn_fifo(move || {
        let Pending { input, shared, mut request, tx, context_length } = p;
        let t0 = std::time::Instant::now();
        let prepared = if request.cancel.load(Ordering::Relaxed) {
            // Cancelled while queued: the engine ends it without tokenizing anything.
            Ok((Prompt::Tokens(Vec::new()), Structured::default()))
        } else {
            catch_unwind(AssertUnwindSafe(|| {
                // The format first: a bad schema fails before a long prompt is tokenized.
                let structured = formats.prepare(&request.options)?;
                let tools: &[ToolSpec] = if structured.tools.is_some() { &request.options.tools } else { &[] };
                // What a chat turn may use when it has to drop old turns: the context, less
                // prompt tuning's virtual tokens and the room kept for the answer.
                let budget = context_length
                    .saturating_sub(request.experts.num_virtual_tokens())
                    .saturating_sub(answer_room(request.options.max_tokens, context_length));
                let syntax = super::thinking::syntax_for(&formats.tokenizer, &request.experts);
                let (prompt, thinking) = tokenize(&formats.tokenizer, &shared, input, &request.options, tools, budget, syntax)?;
                request.thinking = thinking;
                Ok((prompt, structured))
            }))
            .unwrap_or_else(|p| Err(EngineError::Internal(format!("panic while preparing the prompt: {}", panic_message(&*p)))))
        };
        let err = match prepared {
            Ok((prompt, structured)) => {
                request.prompt = prompt;
                request.structured = structured;
                request.structured.prepare_ms = t0.elapsed().as_secs_f64() * 1e3;
                let Err(back) = tx.send(Command::Generate(Box::new(request))) else { return };
                let Command::Generate(r) = back.0 else { return };
                (EngineError::Disposed("the runtime was disposed".into()), r.events)
            }
            Err(e) => (e, request.events),
        };
        // Free the session before the caller sees the error, so it can retry at once.
        shared.busy.store(false, Ordering::Release);
        let _ = err.1.send(Event::Error(err.0));
    });
    Ok(())
}

/// The tokens of `input` for a session whose history is `shared.history`. A chat turn of a
/// `drop-oldest` session is fitted into `budget` tokens. A chat turn of a model that thinks
/// (`syntax`) gets its thinking plan.
fn tokenize(
    tok: &Tokenizer,
    shared: &SessionShared,
    input: Input,
    options: &GenerateOptions,
    tools: &[ToolSpec],
    budget: usize,
    syntax: Option<ReasoningSyntax>,
) -> Result<(Prompt, Option<ThinkingPlan>)> {
    let (enabled, thought_budget) = thinking::requested(options)?;
    Ok(match input {
        Input::Chat(messages) => {
            let history = shared.history.lock().unwrap().clone();
            let encode = |c: &[ChatMessage]| {
                let mut ids = tok.encode_chat(c, true, enabled, tools)?;
                if let Some(s) = &syntax {
                    thinking::settle_prompt(tok, s, enabled, &mut ids)?;
                }
                Ok(ids)
            };
            // Without a shift, nothing is dropped however long the conversation (the engine
            // reports the overflow).
            let budget = if shared.context_shift == ContextShift::DropOldest { budget } else { usize::MAX };
            let Window { ids, dropped } = context_shift::fit(&history, &messages, budget, encode)?;
            let plan = syntax.map(|s| thinking::plan(tok, s, thought_budget, &ids)).transpose()?;
            (Prompt::Chat { ids, messages, dropped }, plan)
        }
        Input::Text(text) => (
            Prompt::Text(Box::new(
                tok.encode_continuation(&text, options.parse_special_tokens).map_err(EngineError::InvalidModel)?,
            )),
            None,
        ),
        Input::Tokens(ids) => (Prompt::Tokens(ids), None),
    })
}
