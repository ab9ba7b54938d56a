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
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};

use super::ChatMessage;
use crate::bounded::{self, Exceeded, Limits};

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
        m.role.len() + m.content.len() + calls + m.tool_call_id.as_ref().map_or(0, String::len)
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
/// arguments}}]`, arguments as an object, as HF templates expect) and `tool_call_id` when set.
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

// ---------------------------------------------------------------------------------------------
// HF globals
// ---------------------------------------------------------------------------------------------

/// Widest padding `indent` and `format` may produce: far beyond any chat template's needs.
pub const MAX_PAD: usize = 1024;

fn too_wide(what: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("{what} is wider than {MAX_PAD} characters"))
}

/// Jinja's `indent(width=4, first=false, blank=false)` with `width` at most [`MAX_PAD`] and
/// the result within the render's output cap.
fn bounded_indent(
    value: String,
    width: Option<usize>,
    first: Option<bool>,
    blank: Option<bool>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let width = match width {
        Some(w) => w,
        None => kwargs.get::<Option<usize>>("width")?.unwrap_or(4),
    };
    let first = first.map_or_else(|| kwargs.get::<Option<bool>>("first").map(|v| v.unwrap_or(false)), Ok)?;
    let blank = blank.map_or_else(|| kwargs.get::<Option<bool>>("blank").map(|v| v.unwrap_or(false)), Ok)?;
    kwargs.assert_all_used()?;
    if width > MAX_PAD {
        return Err(too_wide("indent"));
    }
    let text = value.strip_suffix('\n').unwrap_or(&value);
    let text = text.strip_suffix('\r').unwrap_or(text);
    let lines = text.split('\n').count();
    if lines.saturating_mul(width + 1).saturating_add(text.len()) > output_cap() {
        return Err(Error::new(ErrorKind::InvalidOperation, "indent: the result would exceed the rendering limit"));
    }
    let pad = " ".repeat(width);
    let mut out = String::with_capacity(text.len() + lines * (width + 1));
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let is_blank = line.is_empty() || line == "\r";
        if (i > 0 || first) && (!is_blank || blank) {
            out.push_str(&pad);
        }
        out.push_str(line);
    }
    Ok(Value::from(out))
}

/// minijinja's `format` with every width and precision in the format string at most
/// [`MAX_PAD`] (and none taken from the arguments).
fn bounded_format(
    state: &mut minijinja::State,
    format_str: &Value,
    args: minijinja::value::Rest<minijinja::value::ValueOrKwargs>,
) -> Result<Value, Error> {
    if let Some(f) = format_str.as_str() {
        let mut digits = 0usize;
        let mut in_spec = false;
        for c in f.chars() {
            match c {
                '%' | ':' => (in_spec, digits) = (true, 0),
                '*' if in_spec => return Err(too_wide("a format width taken from the arguments")),
                '0'..='9' if in_spec => {
                    digits = digits.saturating_mul(10).saturating_add(c as usize - '0' as usize);
                    if digits > MAX_PAD {
                        return Err(too_wide("a format width"));
                    }
                }
                '.' | '-' | '+' | ' ' | '#' | '<' | '>' | '^' | '=' if in_spec => digits = 0,
                _ => in_spec = false,
            }
        }
    }
    minijinja::filters::format(state, format_str, args)
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, format!("raise_exception: {msg}")))
}

fn strftime_now(fmt: String) -> Result<Value, Error> {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    Ok(Value::from(strftime_utc(&fmt, secs)))
}

/// (year, month 1-12, day 1-31) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// A C `strftime` subset, in UTC: %Y %y %m %d %e %j %H %I %M %S %p %A %a %B %b %h %F %T %D %Z %z
/// %n %t %%; unknown directives are copied through.
pub(crate) fn strftime_utc(fmt: &str, unix_secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    let days = unix_secs.div_euclid(86_400);
    let sod = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (sod / 3600, (sod / 60) % 60, sod % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday (index 3)
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let h12 = if hh % 12 == 0 { 12 } else { hh % 12 };

    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('H') => out.push_str(&format!("{hh:02}")),
            Some('I') => out.push_str(&format!("{h12:02}")),
            Some('M') => out.push_str(&format!("{mm:02}")),
            Some('S') => out.push_str(&format!("{ss:02}")),
            Some('p') => out.push_str(if hh < 12 { "AM" } else { "PM" }),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('B') => out.push_str(MONTHS[m as usize - 1]),
            Some('b') | Some('h') => out.push_str(&MONTHS[m as usize - 1][..3]),
            Some('F') => out.push_str(&format!("{y}-{m:02}-{d:02}")),
            Some('T') => out.push_str(&format!("{hh:02}:{mm:02}:{ss:02}")),
            Some('D') => out.push_str(&format!("{m:02}/{d:02}/{:02}", y.rem_euclid(100))),
            Some('Z') => out.push_str("UTC"),
            Some('z') => out.push_str("+0000"),
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 } as i64;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

// ---------------------------------------------------------------------------------------------
// tojson, Python-style
// ---------------------------------------------------------------------------------------------

/// `x|tojson(indent=None, separators=None, sort_keys=False, ensure_ascii=False)` with the output of
/// Python's `json.dumps` (the filter transformers installs).
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent: Option<String> = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.kind() {
            ValueKind::String => Some(v.as_str().unwrap_or("").to_owned()),
            ValueKind::Number => {
                let n = usize::try_from(v.clone()).unwrap_or(0);
                if n > output_cap() {
                    return Err(Error::new(ErrorKind::InvalidOperation, format!("tojson: indent {n} is too large")));
                }
                Some(" ".repeat(n))
            }
            _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: indent must be an integer or a string")),
        },
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let separators = kwargs.get::<Option<Value>>("separators")?;
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() && !v.is_undefined() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match (parts.first().and_then(|p| p.as_str()), parts.get(1).and_then(|p| p.as_str())) {
                (Some(a), Some(b)) if parts.len() == 2 => (a.to_owned(), b.to_owned()),
                _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be a pair of strings")),
            }
        }
        _ => (if indent.is_some() { ",".into() } else { ", ".into() }, ": ".into()),
    };
    kwargs.assert_all_used()?;
    let mut w = PyJson { out: String::new(), indent, item_sep, key_sep, sort_keys, ensure_ascii };
    w.value(value, 0)?;
    Ok(Value::from_safe_string(w.out))
}

struct PyJson {
    out: String,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl PyJson {
    fn newline(&mut self, level: usize) -> Result<(), Error> {
        if let Some(ind) = &self.indent {
            // The indent repeats once per level: stop at the render cap, not at memory's end.
            let cap = output_cap();
            if ind.len().saturating_mul(level).saturating_add(self.out.len()) >= cap {
                return Err(Error::new(ErrorKind::InvalidOperation, format!("tojson: the output exceeds {cap} bytes")));
            }
            self.out.push('\n');
            for _ in 0..level {
                self.out.push_str(ind);
            }
        }
        Ok(())
    }

    fn value(&mut self, v: &Value, level: usize) -> Result<(), Error> {
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self.out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => self.number(v),
            ValueKind::String | ValueKind::Plain => {
                let s = v.to_string();
                self.string(&s)
            }
            ValueKind::Bytes => {
                let items: Vec<Value> = v.as_bytes().unwrap_or(&[]).iter().map(|b| Value::from(*b)).collect();
                self.seq(&items, level)?
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.seq(&items, level)?
            }
            ValueKind::Map => {
                let mut entries: Vec<(String, Value)> = Vec::new();
                for k in v.try_iter()? {
                    let val = v.get_item(&k)?;
                    entries.push((key_string(&k), val));
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                if entries.is_empty() {
                    self.out.push_str("{}");
                    return Ok(());
                }
                self.out.push('{');
                for (i, (k, val)) in entries.iter().enumerate() {
                    if i > 0 {
                        let sep = self.item_sep.clone();
                        self.out.push_str(&sep);
                    }
                    self.newline(level + 1)?;
                    self.string(k);
                    let sep = self.key_sep.clone();
                    self.out.push_str(&sep);
                    self.value(val, level + 1)?;
                }
                self.newline(level)?;
                self.out.push('}');
            }
            ValueKind::Invalid => {
                return Err(Error::new(ErrorKind::InvalidOperation, "tojson: invalid value"));
            }
            _ => {
                let s = v.to_string();
                self.string(&s)
            }
        }
        Ok(())
    }

    fn seq(&mut self, items: &[Value], level: usize) -> Result<(), Error> {
        if items.is_empty() {
            self.out.push_str("[]");
            return Ok(());
        }
        self.out.push('[');
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                let sep = self.item_sep.clone();
                self.out.push_str(&sep);
            }
            self.newline(level + 1)?;
            self.value(item, level + 1)?;
        }
        self.newline(level)?;
        self.out.push(']');
        Ok(())
    }

    fn number(&mut self, v: &Value) {
        if v.is_integer() {
            // i128/u128 print fine through Display.
            self.out.push_str(&v.to_string());
            return;
        }
        let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
        self.out.push_str(&py_float_repr(f));
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{8}' => self.out.push_str("\\b"),
                '\u{c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 => self.out.push_str(&format!("\\u{:04x}", c as u32)),
                c if self.ensure_ascii && (c as u32) > 0x7e => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        self.out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// Python's `json.dumps` key coercion: str as is, numbers/bools/None to their JSON text.
fn key_string(k: &Value) -> String {
    match k.kind() {
        ValueKind::String => k.as_str().unwrap_or("").to_owned(),
        ValueKind::Bool => (if k.is_true() { "true" } else { "false" }).to_owned(),
        ValueKind::None | ValueKind::Undefined => "null".to_owned(),
        ValueKind::Number if !k.is_integer() => py_float_repr(f64::try_from(k.clone()).unwrap_or(f64::NAN)),
        _ => k.to_string(),
    }
}

/// `repr(float)` as Python prints it in JSON: `1.0`, `0.1`, `1e+16`, `1.5e-07`, `NaN`, `Infinity`.
fn py_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    let abs = f.abs();
    if abs != 0.0 && !(1e-4..1e16).contains(&abs) {
        // Scientific: shortest round-trip mantissa, exponent with sign and at least 2 digits.
        let s = format!("{f:e}");
        let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mant}e{sign}{:02}", exp.abs());
    }
    let s = format!("{f}");
    if s.contains('.') {
        s
    } else {
        format!("{s}.0")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, ctx: Value) -> String {
        let t = ChatTemplate::new(src, "test").unwrap();
        t.env.get_template(TEMPLATE_NAME).unwrap().render(ctx).unwrap()
    }

    #[test]
    fn endless_and_exploding_templates_fail_instead_of_hanging() {
        let user = [ChatMessage::new("user", "hi")];
        let args =
            RenderArgs { add_generation_prompt: true, enable_thinking: None, bos_token: None, eos_token: None, tools: None };
        // Nested loops over large ranges: far more instructions than the fuel allows.
        let endless = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        let e = ChatTemplate::new(endless, "test").unwrap().render(&user, &args).unwrap_err();
        assert!(e.contains("fuel"), "{e}");
        // Output past the cap: 90,000 iterations of 1,000 bytes (90 MB).
        let big = format!("{{% for i in range(90000) %}}{}{{% endfor %}}", "x".repeat(1000));
        let e = ChatTemplate::new(&big, "test").unwrap().render(&user, &args).unwrap_err();
        assert!(e.contains(&format!("exceeds {} bytes", max_output("userhi".len()))), "{e}");
        // A normal template is unaffected.
        let ok = ChatTemplate::new("{% for m in messages %}{{ m.role }}: {{ m.content }}{% endfor %}", "test").unwrap();
        assert_eq!(ok.render(&user, &args).unwrap(), "user: hi");
    }

    #[test]
    fn growing_values_are_stopped_and_the_template_retired() {
        let user = [ChatMessage::new("user", "hi")];
        let args =
            RenderArgs { add_generation_prompt: true, enable_thinking: None, bos_token: None, eos_token: None, tools: None };
        let doubling = [
            "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
            "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | length }}",
            // No namespace: a macro that calls itself with its argument doubled.
            "{% macro f(s, n) %}{% if n > 0 %}{{ f(s ~ s, n - 1) }}{% else %}{{ s | length }}{% endif %}{% endmacro %}{{ f('x', 64) }}",
            // A string squared by `replace`.
            "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s | replace('x', ns.s) %}{% endfor %}{{ ns.s }}",
        ];
        for src in doubling {
            let t = ChatTemplate::new(src, "test").unwrap();
            let e = t.check_bounded(&args).unwrap_err();
            assert!(e.contains("stopped") && e.contains("MiB of memory"), "{src}: {e}");
            // Retired: refused at once from then on, with the same message.
            let t0 = std::time::Instant::now();
            assert_eq!(t.render(&user, &args).unwrap_err(), e);
            assert!(t0.elapsed() < std::time::Duration::from_millis(50));
        }
    }

    #[test]
    fn a_long_conversation_renders_within_its_memory_budget() {
        // Each message's content copied a few times over (a string built up, then printed):
        // what real templates do, at 8 MB of input.
        let src = "{% set ns = namespace(all='') %}{% for m in messages %}{% set ns.all = ns.all ~ m.content %}\
                   <{{ m.role }}>{{ m.content | trim }}{% endfor %}{{ ns.all | length }}";
        let t = ChatTemplate::new(src, "test").unwrap();
        let msgs: Vec<_> = (0..8).map(|i| ChatMessage::new("user", format!("{i}").repeat(1 << 20))).collect();
        let args =
            RenderArgs { add_generation_prompt: true, enable_thinking: None, bos_token: None, eos_token: None, tools: None };
        let out = t.render(&msgs, &args).unwrap();
        assert!(out.ends_with(&(8usize << 20).to_string()), "{}", &out[out.len() - 20..]);
        assert!(render_memory(8 << 20) > 64 << 20);
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let v = Value::from_pairs([
            ("name", Value::from("get_weather")),
            ("args", Value::from_iter([Value::from(1), Value::from(2.5), Value::from(true)])),
            ("text", Value::from("a\"b\\c\n<tag> & 'q' café 日本")),
            ("none", Value::from(())),
            ("empty", Value::from_iter(Vec::<Value>::new())),
        ]);
        let out = render("{{ x | tojson }}", Value::from_pairs([("x", v.clone())]));
        assert_eq!(
            out,
            r#"{"name": "get_weather", "args": [1, 2.5, true], "text": "a\"b\\c\n<tag> & 'q' café 日本", "none": null, "empty": []}"#
        );
        let out = render(
            "{{ x | tojson(indent=2) }}",
            Value::from_pairs([("x", Value::from_pairs([("a", Value::from_iter([Value::from(1)]))]))]),
        );
        assert_eq!(out, "{\n  \"a\": [\n    1\n  ]\n}");
        let out = render("{{ x | tojson(sort_keys=true) }}", Value::from_pairs([("x", Value::from_pairs([("b", 1), ("a", 2)]))]));
        assert_eq!(out, r#"{"a": 2, "b": 1}"#);
        assert_eq!(py_float_repr(1e16), "1e+16");
        assert_eq!(py_float_repr(1.5e-7), "1.5e-07");
        assert_eq!(py_float_repr(3.0), "3.0");
        assert_eq!(py_float_repr(0.1), "0.1");
    }

    #[test]
    fn hf_whitespace_and_helpers() {
        // trim_blocks + lstrip_blocks, trailing newline dropped, python methods, loop controls.
        let src = "{% for m in messages %}\n    {% if m.role == 'skip' %}{% continue %}{% endif %}\n{{ m.content.strip().upper() }}|{{ m.content.startswith(' h') }}\n{% endfor %}\n";
        let ctx = Value::from_pairs([(
            "messages",
            Value::from_iter([
                Value::from_pairs([("role", "user"), ("content", " hi ")]),
                Value::from_pairs([("role", "skip"), ("content", "x")]),
            ]),
        )]);
        assert_eq!(render(src, ctx), "HI|True\n"); // Python-style bool printing, as jinja2
        let t = ChatTemplate::new("{{ raise_exception('bad role') }}", "test").unwrap();
        let err = t
            .render(
                &[],
                &RenderArgs {
                    add_generation_prompt: false,
                    enable_thinking: None,
                    bos_token: None,
                    eos_token: None,
                    tools: None,
                },
            )
            .unwrap_err();
        assert!(err.contains("bad role"), "{err}");
        assert_eq!(strip_generation_tags("a{%- generation -%}b{% endgeneration %}c{% if x %}"), "abc{% if x %}");
    }

    #[test]
    fn overlapping_block_delimiters_do_not_panic() {
        // Found by fuzzing (fuzz/corpus/chat_template/regress-overlapping-tag): `{%}` used to
        // slice `tag[2..1]`.
        assert_eq!(strip_generation_tags("{%}"), "{%}");
        assert_eq!(strip_generation_tags("{%}%}a{% generation %}b"), "{%}%}ab");
        assert_eq!(strip_generation_tags("a{%}{% endgeneration %}"), "a{%}{% endgeneration %}");
        assert!(ChatTemplate::new("{%}", "test").is_err());
    }

    #[test]
    fn tojson_indent_is_bounded() {
        // Found with the chat_template fuzz target (fuzz/corpus/chat_template/regress-tojson-indent):
        // `indent=3000000000` allocated 3 GB for the indent string.
        let args =
            RenderArgs { add_generation_prompt: false, enable_thinking: None, bos_token: None, eos_token: None, tools: None };
        let render = |src: &str| ChatTemplate::new(src, "test").unwrap().render(&[], &args);
        let e = render("{{ [1] | tojson(indent=3000000000) }}").unwrap_err();
        assert!(e.contains("indent 3000000000 is too large"), "{e}");
        // A wide indent times the nesting depth passes the cap before it is written.
        let e = render("{{ [[[[[[1]]]]]] | tojson(indent=2000000) }}").unwrap_err();
        assert!(e.contains("exceeds"), "{e}");
        assert_eq!(render("{{ [[1]] | tojson(indent=1) }}").unwrap(), "[\n [\n  1\n ]\n]");
    }

    #[test]
    fn strftime_subset() {
        // 2024-02-29 13:05:09 UTC was a Thursday.
        let t = 1_709_211_909;
        assert_eq!(
            strftime_utc("%Y-%m-%d %H:%M:%S %A %a %B %b %j %I%p %%", t),
            "2024-02-29 13:05:09 Thursday Thu February Feb 060 01PM %"
        );
        assert_eq!(strftime_utc("%d %b %Y", 0), "01 Jan 1970");
    }

    #[test]
    fn chatml_fallback() {
        let msgs = [ChatMessage::new("user", "hi")];
        assert_eq!(render_chatml(&msgs, true), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
#[path = "template_stack_tests.rs"]
mod stack_tests;
