//! Chat templates: rendering a model's own Jinja chat template with minijinja, configured to
//! behave like Hugging Face transformers' renderer (`chat_template_utils._compile_jinja_template`).
//!
//! Design notes:
//! * Whitespace: `trim_blocks=True`, `lstrip_blocks=True` as HF does. `keep_trailing_newline`
//!   stays at Jinja's default (`False`) because HF does not change it: a template file ending in
//!   "\n" (chat_template.jinja usually does) must not add a newline to the prompt.
//! * Python string/dict methods (`.startswith`, `.split`, `.strip`, `.items()`, ...) come from
//!   `minijinja_contrib::pycompat`; contrib's extra filters/functions are registered as well.
//! * HF globals: `raise_exception(msg)` (fails rendering with `msg`), `strftime_now(fmt)` (current
//!   time; we format in UTC, HF uses local time).
//! * `tojson` is replaced by a Python-compatible implementation of HF's filter
//!   (`json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`):
//!   separators `", "`/`": "` (`","`/`": "` with an indent), no HTML escaping, non-ASCII kept.
//! * transformers' `{% generation %}`/`{% endgeneration %}` markers (assistant-mask extension)
//!   are removed before compiling; they do not affect the rendered text.
//! * Without a template, [`render_chatml`] is the fallback (plain ChatML).
//! * Templates come from files we do not trust: each render has [`TEMPLATE_FUEL`] instructions
//!   (a loop that never ends fails instead of freezing the caller) and its output is capped at
//!   [`MAX_RENDERED_BYTES`]. Filters that pad to a width the template chooses (`indent`,
//!   `format`) are bounded by [`MAX_PAD`], so one call cannot ask for gigabytes. What fuel
//!   cannot bound is a value that doubles in a loop (`{% set s = s ~ s %}`): a few dozen
//!   instructions reach gigabytes. So each render runs on a thread of its own under
//!   [`crate::bounded`]: at most [`render_memory`] bytes held and [`RENDER_TIME`] of waiting.
//!   A template stopped there is retired: every later render fails at once with the same
//!   message (its stopped thread keeps what it held, so it must not happen again and again).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Error, ErrorKind, Value};

use super::ChatMessage;
use crate::bounded::{self, Exceeded, Limits};

mod globals;
mod tojson;

pub use globals::MAX_PAD;
use globals::{bounded_format, bounded_indent, raise_exception, strftime_now};
use tojson::tojson;

const TEMPLATE_NAME: &str = "chat_template";

/// Instructions one render may execute: a real template spends a few hundred per message, so
/// this covers conversations far longer than any context, and an endless loop stops within
/// about a second.
pub const TEMPLATE_FUEL: u64 = 10_000_000;

/// Most bytes one render may produce (a prompt larger than this cannot fit any context).
pub const MAX_RENDERED_BYTES: usize = 64 << 20;

/// Most bytes one render of `input_bytes` may produce: [`MAX_RENDERED_BYTES`], and a quarter
/// of its memory ([`render_memory`]), so that a template that only prints a lot fails here,
/// cleanly, rather than at its memory budget.
pub fn max_output(input_bytes: usize) -> usize {
    MAX_RENDERED_BYTES.min(render_memory(input_bytes) / 4)
}

std::thread_local! {
    /// The output cap of the render running on this thread ([`max_output`]), for filters that
    /// build large strings.
    static OUTPUT_CAP: std::cell::Cell<usize> = const { std::cell::Cell::new(MAX_RENDERED_BYTES) };
}

/// Most bytes the render on this thread may produce, and so any one filter call in it.
fn output_cap() -> usize {
    OUTPUT_CAP.with(std::cell::Cell::get)
}

/// Memory a render may hold, however small its input: far more than any real template needs
/// for a conversation that fits a context.
pub const RENDER_MEMORY_BASE: usize = 32 << 20;

/// How long a caller waits for one render. Fuel bounds the template's own instructions to
/// about a second; this bounds the work of filters over huge lazy values.
pub const RENDER_TIME: Duration = Duration::from_secs(10);

/// Memory a render of `input_bytes` of messages and tools may hold: [`RENDER_MEMORY_BASE`]
/// plus eight times the input (the context, its copies in the template's own strings, the
/// output), within 2 GiB.
pub fn render_memory(input_bytes: usize) -> usize {
    RENDER_MEMORY_BASE.saturating_add(input_bytes.saturating_mul(8)).min(2 << 30)
}

/// Collects rendered text, failing once it passes `cap` bytes.
struct CappedOutput {
    buf: Vec<u8>,
    cap: usize,
}

impl std::io::Write for CappedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + buf.len() > self.cap {
            return Err(std::io::Error::other(format!("the rendered prompt exceeds {} bytes", self.cap)));
        }
        self.buf.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Arc<Environment<'static>>,
    source: String,
    /// Why the template was stopped, once it has been: it is not run again.
    retired: OnceLock<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChatTemplate")
    }
}

/// Variables handed to the template besides the messages.
pub struct RenderArgs<'a> {
    pub add_generation_prompt: bool,
    pub enable_thinking: Option<bool>,
    pub bos_token: Option<&'a str>,
    pub eos_token: Option<&'a str>,
    /// The request's tools in OpenAI form (`[{type: 'function', function: {…}}]`).
    pub tools: Option<serde_json::Value>,
}

impl ChatTemplate {
    /// Compiles `source`; `origin` names where it came from, for error messages.
    pub fn new(source: &str, origin: &str) -> Result<Self, String> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(|e| format!("chat template ({origin}): {e}"))?;
        env.set_syntax(syntax);
        env.set_fuel(Some(TEMPLATE_FUEL));
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_filter("indent", bounded_indent);
        env.add_filter("format", bounded_format);
        env.add_template_owned(TEMPLATE_NAME, strip_generation_tags(source))
            .map_err(|e| format!("chat template ({origin}) does not compile: {}", describe(&e)))?;
        // minijinja fills some process-wide caches on first use (the text of small integers).
        // Filled here, outside any bounded thread, they are never left half-made by a render
        // stopped in the middle of filling them (which would block every later render).
        let _ = env.render_str("{{ 1 }}{{ 2.5 }}{{ 'a' ~ 3 }}{{ range(2) | list | tojson }}", ());
        Ok(Self { env: Arc::new(env), source: source.to_string(), retired: OnceLock::new() })
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders the conversation.
    pub fn render(&self, messages: &[ChatMessage], args: &RenderArgs<'_>) -> Result<String, String> {
        self.render_inner(messages, args).map_err(|e| e.message)
    }

    /// Renders a one-message conversation and fails only when the template exhausted its fuel
    /// or its output cap: a defect no conversation avoids. Other errors (a template that
    /// insists on a system message, say) depend on the conversation and are left to requests.
    pub fn check_bounded(&self, args: &RenderArgs<'_>) -> Result<(), String> {
        let hello = [ChatMessage::new("user", "Hello")];
        match self.render_inner(&hello, args) {
            Err(e) if e.exhausted => Err(e.message),
            _ => Ok(()),
        }
    }

    fn render_inner(&self, messages: &[ChatMessage], args: &RenderArgs<'_>) -> Result<String, RenderError> {
        if let Some(why) = self.retired.get() {
            return Err(RenderError { exhausted: true, message: why.clone() });
        }
        let input = input_bytes(messages, args);
        let limits = Limits { memory: render_memory(input), time: RENDER_TIME };
        let (env, ctx, cap) = (self.env.clone(), context(messages, args), max_output(input));
        let failed = |message: String| RenderError { exhausted: false, message };
        // The thread name is what the adversarial suite looks for (a stopped one stays parked).
        match bounded::run("chat-template", limits, move || render_on(&env, ctx, cap)) {
            Ok(Ok(rendered)) => rendered,
            Ok(Err(panic)) => Err(failed(format!("chat template rendering failed: {panic}"))),
            Err(Exceeded::Spawn) => Err(failed("chat template rendering failed: no thread could be started".into())),
            Err(e) => {
                let message = format!("the chat template was stopped: {e}");
                let message = self.retired.get_or_init(|| message).clone();
                Err(RenderError { exhausted: true, message })
            }
        }
    }
}

/// Renders the template in `env` with `ctx` into at most `cap` bytes (on a bounded thread).
fn render_on(env: &Environment<'static>, ctx: Value, cap: usize) -> Result<String, RenderError> {
    let failed = |e: Error| RenderError {
        exhausted: matches!(e.kind(), ErrorKind::OutOfFuel | ErrorKind::WriteFailure),
        message: format!("chat template rendering failed: {}", describe(&e)),
    };
    let tmpl = env.get_template(TEMPLATE_NAME).map_err(failed)?;
    OUTPUT_CAP.with(|c| c.set(cap));
    let mut out = CappedOutput { buf: Vec::new(), cap };
    tmpl.render_captured_to(ctx, &mut out).map_err(failed)?;
    String::from_utf8(out.buf)
        .map_err(|e| RenderError { exhausted: false, message: format!("chat template rendering failed: {e}") })
}

/// The bytes of text a render is given: the messages' strings and the tools as JSON.
fn input_bytes(messages: &[ChatMessage], args: &RenderArgs<'_>) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Count(0);
    if let Some(tools) = &args.tools {
        let _ = serde_json::to_writer(&mut n, tools);
    }
    let strings = messages.iter().map(|m| {
        let calls: usize = m.tool_calls.iter().map(|c| c.id.len() + c.name.len() + c.arguments.len()).sum();
        m.role.len()
            + m.content.len()
            + calls
            + m.tool_call_id.as_ref().map_or(0, String::len)
            + m.reasoning.as_ref().map_or(0, String::len)
    });
    strings.fold(n.0, usize::saturating_add)
}

/// A failed render; `exhausted` when it ran out of fuel or output room.
struct RenderError {
    message: String,
    exhausted: bool,
}

/// The template context: `messages` (list of `{role, content}` maps), `add_generation_prompt`,
/// `bos_token`/`eos_token` when known, and `enable_thinking` when given.
fn context(messages: &[ChatMessage], args: &RenderArgs<'_>) -> Value {
    let msgs: Value = messages.iter().map(message_value).collect();
    let mut pairs: Vec<(&str, Value)> =
        vec![("messages", msgs), ("add_generation_prompt", Value::from(args.add_generation_prompt))];
    if let Some(b) = args.bos_token {
        pairs.push(("bos_token", Value::from(b)));
    }
    if let Some(e) = args.eos_token {
        pairs.push(("eos_token", Value::from(e)));
    }
    if let Some(t) = args.enable_thinking {
        pairs.push(("enable_thinking", Value::from(t)));
    }
    if let Some(tools) = &args.tools {
        pairs.push(("tools", Value::from(minijinja::value::Serde(tools))));
    }
    Value::from_pairs(pairs)
}

/// `{role, content}`, plus `tool_calls` (`[{id, type: 'function', function: {name,
/// arguments}}]`, arguments as an object, as HF templates expect), `tool_call_id` and
/// `reasoning_content` (the turn's thought) when set.
fn message_value(m: &ChatMessage) -> Value {
    let mut pairs = vec![("role", Value::from(m.role.as_str())), ("content", Value::from(m.content.as_str()))];
    if !m.tool_calls.is_empty() {
        let calls: Value = m
            .tool_calls
            .iter()
            .map(|c| {
                let args = serde_json::from_str::<serde_json::Value>(&c.arguments)
                    .map(|v| Value::from(minijinja::value::Serde(&v)))
                    .unwrap_or_else(|_| Value::from(c.arguments.as_str()));
                let function = Value::from_pairs([("name", Value::from(c.name.as_str())), ("arguments", args)]);
                Value::from_pairs([("id", Value::from(c.id.as_str())), ("type", Value::from("function")), ("function", function)])
            })
            .collect();
        pairs.push(("tool_calls", calls));
    }
    if let Some(id) = &m.tool_call_id {
        pairs.push(("tool_call_id", Value::from(id.as_str())));
    }
    if let Some(r) = &m.reasoning {
        pairs.push(("reasoning_content", Value::from(r.as_str())));
    }
    Value::from_pairs(pairs)
}

/// Plain ChatML, used when the model ships no chat template:
/// `<|im_start|>{role}\n{content}<|im_end|>\n` per message, then `<|im_start|>assistant\n` when
/// `add_generation_prompt`.
pub fn render_chatml(messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    let mut out = String::new();
    for m in messages {
        out.push_str("<|im_start|>");
        out.push_str(&m.role);
        out.push('\n');
        out.push_str(&m.content);
        out.push_str("<|im_end|>\n");
    }
    if add_generation_prompt {
        out.push_str("<|im_start|>assistant\n");
    }
    out
}

/// Error text including minijinja's detail and source chain (it carries the template line).
fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// Removes `{% generation %}` / `{% endgeneration %}` tags (any whitespace-control variant).
fn strip_generation_tags(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        // The closing `%}` comes after the opening `{%` (in `{%}` they overlap).
        if let Some(end) = tag[2..].find("%}").map(|e| e + 2) {
            let inner = tag[2..end].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
            if inner == "generation" || inner == "endgeneration" {
                rest = &tag[end + 2..];
                continue;
            }
            out.push_str(&tag[..end + 2]);
            rest = &tag[end + 2..];
        } else {
            out.push_str(tag);
            rest = "";
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests;

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
#[path = "template_stack_tests.rs"]
mod stack_tests;
