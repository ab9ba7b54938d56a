//! Function calling, on the text side: how each chat-template family writes a tool call (as
//! data, [`ToolSyntax`]), which family a template belongs to ([`ToolFormat::detect`]), the
//! instructions for templates that know no tools, and [`ToolStream`], which splits a model's
//! answer into plain text and tool calls as it streams.
//!
//! Design note
//! -----------
//! * A family is a row of data: the markers around a call's JSON body, the key its arguments
//!   sit under, whether several calls may follow each other. Recognising a template is a table
//!   of (marker the template source contains → family), first match wins; a template with no
//!   marker gets the Hermes syntax and a system prompt describing the tools
//!   ([`tool_instructions`]), since it would not render `tools` itself.
//! * [`ToolStream`] sees the answer's text deltas in order. Text outside calls is released at
//!   once (minus a tail that could still become an opening marker); a call's body is withheld.
//!   Once the body shows its `"name"`, the call is announced (`id`, `name`), then its arguments
//!   are released as they are written, until the arguments value closes (a small JSON scanner
//!   tracks depth, strings and escapes). At the end, every body must parse as
//!   `{"name": <a tool>, "<args key>": {…}}`; if one does not (a small model's slip with
//!   `toolChoice: 'auto'`), no call is reported and the withheld text is released as plain
//!   text instead.
//! * A call cut off before its end (`maxTokens`) is dropped, never released as text: its
//!   markup (and perhaps its announced deltas) went out as a call. The complete calls before
//!   it are kept. So is the end of an answer cut off in a start of the marker (`<tool_c`).
//! * A call identical to an earlier one of the same answer (name and arguments) is a loop, not
//!   parallelism (a small model repeats a forced call until `maxTokens`): it is dropped and
//!   [`ToolStream::looped`] tells the caller to end the answer. So that a dropped call was
//!   never streamed, the deltas of every call after the first are held until it is complete.

use rand::distr::{Alphanumeric, SampleString};
use serde_json::Value;

/// How one template family writes tool calls.
#[derive(Debug, PartialEq, Eq)]
pub struct ToolSyntax {
    pub family: &'static str,
    /// Written before each call's JSON body (empty: the body is bare JSON).
    pub open: &'static str,
    /// Written after each call's JSON body.
    pub close: &'static str,
    /// Between two calls in one answer.
    pub separator: &'static str,
    /// The key the arguments object sits under.
    pub args_key: &'static str,
    /// A marker the model may write before a bare JSON call (skipped).
    pub prefix: &'static str,
    /// Whether one answer may hold several calls.
    pub parallel: bool,
}

/// `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`: Qwen2, Qwen2.5, Qwen3 (and
/// the syntax taught to templates without tool support).
pub const HERMES: ToolSyntax = ToolSyntax {
    family: "hermes",
    open: "<tool_call>\n",
    close: "\n</tool_call>",
    separator: "\n",
    args_key: "arguments",
    prefix: "",
    parallel: true,
};

/// Llama 3.1+ JSON tool calling: the whole answer is `{"name": …, "parameters": {…}}`.
pub const LLAMA3_JSON: ToolSyntax = ToolSyntax {
    family: "llama3-json",
    open: "",
    close: "",
    separator: "",
    args_key: "parameters",
    prefix: "<|python_tag|>",
    parallel: false,
};

/// (text in the template source → family), first match wins.
const FAMILIES: &[(&str, &ToolSyntax)] =
    &[("<tool_call>", &HERMES), ("<|python_tag|>", &LLAMA3_JSON), ("\"parameters\"", &LLAMA3_JSON)];

/// A tool the model may call (OpenAI's `{type: 'function', function: {…}}`).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: Option<String>,
    /// JSON schema of the arguments object.
    pub parameters: Value,
    /// OpenAI's `strict`: `Some(false)` keeps objects of `parameters` that do not say
    /// `additionalProperties` open when a call is forced (see `sampling::json_schema`).
    pub strict: Option<bool>,
}

impl ToolSpec {
    /// The OpenAI form templates expect in `tools`.
    pub fn to_json(&self) -> Value {
        let mut f = serde_json::Map::new();
        f.insert("name".into(), Value::String(self.name.clone()));
        if let Some(d) = &self.description {
            f.insert("description".into(), Value::String(d.clone()));
        }
        f.insert("parameters".into(), self.parameters.clone());
        serde_json::json!({ "type": "function", "function": Value::Object(f) })
    }
}

/// How a template handles tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToolFormat {
    pub syntax: &'static ToolSyntax,
    /// The template renders `tools` and tool messages itself.
    pub native: bool,
}

impl ToolFormat {
    /// The family of a chat template (`None`: no template).
    pub fn detect(template: Option<&str>) -> Self {
        let Some(src) = template else { return Self { syntax: &HERMES, native: false } };
        let syntax = FAMILIES.iter().find(|(marker, _)| src.contains(marker)).map(|(_, s)| *s);
        match syntax {
            Some(syntax) if src.contains("tools") => Self { syntax, native: true },
            _ => Self { syntax: &HERMES, native: false },
        }
    }
}

/// The system-prompt text that teaches a template without tool support the tools and the
/// Hermes call syntax.
pub fn tool_instructions(tools: &[ToolSpec]) -> String {
    let mut s =
        String::from("You can call functions to help answer. The available functions, one JSON signature per line:\n<tools>\n");
    for t in tools {
        s.push_str(&serde_json::to_string(&t.to_json()).unwrap_or_default());
        s.push('\n');
    }
    s.push_str(
        "</tools>\nTo call a function, answer with a JSON object giving its name and arguments between tags, like this:\n\
         <tool_call>\n{\"name\": \"function_name\", \"arguments\": {\"argument\": \"value\"}}\n</tool_call>",
    );
    s
}

/// The conversation for a template that knows no tools: the tool instructions join the
/// system message (one is added when there is none), an assistant turn's calls are written
/// out in the Hermes syntax, and a `tool` message becomes a user turn holding
/// `<tool_response>…</tool_response>`.
pub fn as_plain_chat(messages: &[super::ChatMessage], tools: &[ToolSpec]) -> Vec<super::ChatMessage> {
    let mut out: Vec<super::ChatMessage> = messages
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if m.role == "tool" {
                m.role = "user".into();
                m.content = format!("<tool_response>\n{}\n</tool_response>", m.content);
                m.tool_call_id = None;
            }
            for c in std::mem::take(&mut m.tool_calls) {
                if !m.content.is_empty() {
                    m.content.push('\n');
                }
                let body = serde_json::json!({ "name": c.name, "arguments": serde_json::from_str::<Value>(&c.arguments).unwrap_or(Value::String(c.arguments.clone())) });
                m.content.push_str(&format!("{}{}{}", HERMES.open, body, HERMES.close));
            }
            m
        })
        .collect();
    if !tools.is_empty() {
        let text = tool_instructions(tools);
        match out.first_mut() {
            Some(first) if first.role == "system" => {
                first.content.push_str("\n\n");
                first.content.push_str(&text);
            }
            _ => out.insert(0, super::ChatMessage::new("system", text)),
        }
    }
    out
}

/// `v` with `f` applied to every string in it (keys included).
pub fn escape_strings(v: Value, f: &impl Fn(&str) -> String) -> Value {
    match v {
        Value::String(s) => Value::String(f(&s)),
        Value::Array(a) => Value::Array(a.into_iter().map(|x| escape_strings(x, f)).collect()),
        Value::Object(o) => Value::Object(o.into_iter().map(|(k, x)| (f(&k), escape_strings(x, f))).collect()),
        other => other,
    }
}

/// One tool call the model made.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

/// A piece of a tool call as it streams: the first piece of a call has `id` and `name`, the
/// rest extend `arguments`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCallDelta {
    pub index: usize,
    pub id: Option<String>,
    pub name: Option<String>,
    pub arguments: String,
}

/// A new call id (`call_` and 24 letters and digits).
pub fn new_call_id() -> String {
    format!("call_{}", Alphanumeric.sample_string(&mut rand::rng(), 24))
}

/// Finds where a JSON value that starts at the beginning of `s` ends.
#[derive(Clone, Debug, Default)]
struct JsonScan {
    depth: usize,
    started: bool,
    in_string: bool,
    escaped: bool,
}

impl JsonScan {
    /// Feeds `s`; returns the byte offset just past the value's end when it ends within `s`.
    /// Leading whitespace is skipped. Only objects and arrays are tracked (tool arguments are
    /// objects); a scalar ends at the first delimiter.
    fn feed(&mut self, s: &str) -> Option<usize> {
        for (i, c) in s.char_indices() {
            if self.in_string {
                match (self.escaped, c) {
                    (true, _) => self.escaped = false,
                    (false, '\\') => self.escaped = true,
                    (false, '"') => {
                        self.in_string = false;
                        if self.depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                continue;
            }
            match c {
                c if c.is_whitespace() && !self.started => {}
                '"' => {
                    self.started = true;
                    self.in_string = true;
                }
                '{' | '[' => {
                    self.started = true;
                    self.depth += 1;
                }
                '}' | ']' => {
                    if self.depth == 0 {
                        return Some(i);
                    }
                    self.depth -= 1;
                    if self.depth == 0 {
                        return Some(i + c.len_utf8());
                    }
                }
                ',' if self.depth == 0 && self.started => return Some(i),
                _ => self.started = true,
            }
        }
        None
    }
}

/// A call whose body is being read.
#[derive(Debug, Default)]
struct Body {
    /// The body text so far (after the opening marker).
    text: String,
    /// Where the arguments value starts in `text`, once the name was seen.
    args_start: Option<usize>,
    /// How much of the arguments was released.
    released: usize,
    /// Where the arguments value ends, once it did.
    args_end: Option<usize>,
    args_scan: JsonScan,
    /// The whole body object, for syntaxes without a closing marker.
    outer_scan: JsonScan,
    outer_scanned: usize,
    id: Option<String>,
    /// Deltas held until the call is complete (calls after the first, which may repeat one).
    held: Vec<ToolCallDelta>,
}

#[derive(Debug)]
enum State {
    /// Bare-JSON syntax, nothing but whitespace seen yet.
    Undecided,
    Text,
    Body(Body),
    /// Bare-JSON syntax after the call (or an answer that is not a call): plain text.
    Done,
}

/// What the stream decided at the end.
#[derive(Debug, PartialEq, Eq)]
pub enum ToolOutcome {
    /// No tool call was made.
    Text,
    /// These calls, all well-formed.
    Calls(Vec<ToolCall>),
    /// A call was started but is malformed or unfinished; its text was released as text.
    Malformed,
}

/// Splits an answer into plain text and tool calls as it streams (see the module note).
#[derive(Debug)]
pub struct ToolStream {
    syntax: &'static ToolSyntax,
    tools: Vec<String>,
    state: State,
    /// Text not yet released: a possible marker prefix (in `Text`), whitespace (in `Undecided`).
    pending: String,
    /// Every byte not released as text, in order (markers and bodies).
    withheld: String,
    calls: Vec<ToolCall>,
    malformed: bool,
    /// A call repeated an earlier one: the answer should end.
    looped: bool,
}

impl ToolStream {
    pub fn new(syntax: &'static ToolSyntax, tools: &[ToolSpec]) -> Self {
        let state = if syntax.open.is_empty() { State::Undecided } else { State::Text };
        Self {
            syntax,
            tools: tools.iter().map(|t| t.name.clone()).collect(),
            state,
            pending: String::new(),
            withheld: String::new(),
            calls: Vec::new(),
            malformed: false,
            looped: false,
        }
    }

    /// Whether the model repeated a call it made before in this answer (a loop): the caller
    /// ends the answer, and the repeat is not among the calls.
    pub fn looped(&self) -> bool {
        self.looped
    }

    fn open_marker(&self) -> &'static str {
        self.syntax.open.trim()
    }

    fn close_marker(&self) -> &'static str {
        self.syntax.close.trim()
    }

    /// Feeds the next text delta; returns the plain text to release and the call pieces.
    pub fn push(&mut self, delta: &str) -> (String, Vec<ToolCallDelta>) {
        let mut text = String::new();
        let mut deltas = Vec::new();
        self.pending.push_str(delta);
        loop {
            let progressed = match std::mem::replace(&mut self.state, State::Done) {
                State::Undecided => self.step_undecided(&mut text),
                State::Text => self.step_text(&mut text),
                State::Body(body) => self.step_body(body, &mut text, &mut deltas),
                State::Done => {
                    text.push_str(&std::mem::take(&mut self.pending));
                    false
                }
            };
            if !progressed {
                break;
            }
        }
        (text, deltas)
    }

    /// Bare JSON: the first non-blank character decides between a call and plain text.
    fn step_undecided(&mut self, text: &mut String) -> bool {
        let lead = self.pending.trim_start();
        let lead = lead.strip_prefix(self.syntax.prefix).unwrap_or(lead).trim_start();
        if lead.is_empty() || (!self.syntax.prefix.is_empty() && self.syntax.prefix.starts_with(self.pending.trim_start())) {
            self.state = State::Undecided;
            return false;
        }
        if lead.starts_with('{') {
            let skipped = self.pending.len() - lead.len();
            self.withheld.push_str(&self.pending[..skipped]);
            self.pending.drain(..skipped);
            self.state = State::Body(Body::default());
        } else {
            text.push_str(&std::mem::take(&mut self.pending));
            self.state = State::Done;
        }
        true
    }

    fn step_text(&mut self, text: &mut String) -> bool {
        let marker = self.open_marker();
        // Between calls, blank text is the separator, not content.
        let between_calls = !self.calls.is_empty();
        if let Some(i) = self.pending.find(marker) {
            let before = &self.pending[..i];
            if between_calls && before.trim().is_empty() {
                self.withheld.push_str(before);
            } else {
                text.push_str(before);
            }
            self.withheld.push_str(marker);
            self.pending.drain(..i + marker.len());
            self.state = State::Body(Body::default());
            return true;
        }
        self.state = State::Text;
        // Keep a tail that could still become the marker.
        let keep = (1..marker.len().min(self.pending.len() + 1))
            .rev()
            .find(|&n| marker.is_char_boundary(n) && self.pending.ends_with(&marker[..n]))
            .unwrap_or(0);
        let cut = self.pending.len() - keep;
        if between_calls && self.pending[..cut].trim().is_empty() {
            return false;
        }
        text.push_str(&self.pending[..cut]);
        self.pending.drain(..cut);
        false
    }

    fn step_body(&mut self, mut body: Body, text: &mut String, out: &mut Vec<ToolCallDelta>) -> bool {
        body.text.push_str(&std::mem::take(&mut self.pending));
        let index = self.calls.len();
        // The first call streams at once; later ones are held until complete.
        let mut held = std::mem::take(&mut body.held);
        let deltas = if index == 0 { &mut *out } else { &mut held };
        // 1. Announce the call once its name is known.
        if body.args_start.is_none() {
            if let Some((name, at)) = name_and_args_start(&body.text) {
                let id = new_call_id();
                body.id = Some(id.clone());
                body.args_start = Some(at);
                body.released = at;
                deltas.push(ToolCallDelta { index, id: Some(id), name: Some(name), arguments: String::new() });
            }
        }
        // 2. Release the arguments written so far, up to their end.
        if let (Some(_), None) = (body.args_start, body.args_end) {
            if !body.args_scan.started {
                // Blanks before the value are not part of the arguments.
                let rest = &body.text[body.released..];
                let blank = rest.len() - rest.trim_start().len();
                body.released += blank;
                body.args_start = Some(body.released);
            }
            let from = body.released;
            if let Some(end) = body.args_scan.feed(&body.text[from..]) {
                body.args_end = Some(from + end);
            }
            let upto = body.args_end.unwrap_or(body.text.len());
            if upto > from {
                push_args(deltas, index, &body.text[from..upto]);
                body.released = upto;
            }
        }
        // 3. Find the end of the call.
        let end = if self.close_marker().is_empty() {
            let from = body.outer_scanned;
            body.outer_scanned = body.text.len();
            body.outer_scan.feed(&body.text[from..]).map(|e| (from + e, from + e))
        } else {
            body.text.find(self.close_marker()).map(|i| (i, i + self.close_marker().len()))
        };
        let Some((body_end, consumed)) = end else {
            body.held = held;
            self.state = State::Body(body);
            return false;
        };
        self.withheld.push_str(&body.text[..consumed]);
        self.pending = body.text[consumed..].to_string();
        self.finish_call(&body, body_end, &mut held);
        let repeat = self.calls.last().filter(|c| !c.name.is_empty()).is_some_and(|last| {
            let same = |c: &ToolCall| c.name == last.name && same_json(&c.arguments, &last.arguments);
            self.calls[..self.calls.len() - 1].iter().any(same)
        });
        if repeat {
            self.calls.pop();
            self.looped = true;
        } else {
            out.append(&mut held);
        }
        self.state = if self.syntax.open.is_empty() { State::Done } else { State::Text };
        if self.malformed {
            // Not a call after all: everything withheld goes out as text, and so does the rest.
            text.push_str(&std::mem::take(&mut self.withheld));
            self.state = State::Done;
        }
        true
    }

    /// Validates a complete body and records the call (announcing it now if its name came
    /// after its arguments).
    fn finish_call(&mut self, body: &Body, body_end: usize, deltas: &mut Vec<ToolCallDelta>) {
        let index = self.calls.len();
        let Some((name, mut arguments)) = parse_body(&body.text[..body_end], self.syntax.args_key, &self.tools) else {
            self.malformed = true;
            // Keep counting calls so later pieces do not reuse this index.
            self.calls.push(ToolCall { id: String::new(), name: String::new(), arguments: String::new() });
            return;
        };
        let id = match &body.id {
            Some(id) => {
                // The arguments exactly as released in the deltas, when they are the object.
                if let (Some(a), Some(b)) = (body.args_start, body.args_end) {
                    let raw = body.text[a..b].trim();
                    if serde_json::from_str::<Value>(raw).is_ok_and(|v| v.is_object()) {
                        arguments = raw.to_string();
                    }
                }
                id.clone()
            }
            None => {
                let id = new_call_id();
                deltas.push(ToolCallDelta {
                    index,
                    id: Some(id.clone()),
                    name: Some(name.clone()),
                    arguments: arguments.clone(),
                });
                id
            }
        };
        self.calls.push(ToolCall { id, name, arguments });
    }

    /// Ends the stream: the text still held back (released as plain text when the calls are
    /// malformed or there were none) and the outcome. `cut_off`: the answer ended at
    /// `maxTokens` or the context, not by itself.
    pub fn finish(&mut self, cut_off: bool) -> (String, ToolOutcome) {
        // An answer cut off in a start of the call marker (`<tool_c`): the start of a call,
        // dropped with it. (A lone `<` is text.)
        let tail = self.pending.trim_start();
        let marker_start = cut_off && matches!(self.state, State::Text) && tail.len() > 1 && self.open_marker().starts_with(tail);
        let mut rest = std::mem::take(&mut self.pending);
        if marker_start {
            rest.clear();
        }
        let mut unfinished = false;
        if let State::Body(body) = std::mem::replace(&mut self.state, State::Done) {
            // A call cut off: dropped (see the module note), unless it is bare JSON that was
            // never announced as a call (then it may be an answer that is JSON).
            if self.syntax.open.is_empty() && body.id.is_none() && self.calls.is_empty() {
                self.withheld.push_str(&body.text);
                let mut text = std::mem::take(&mut self.withheld);
                text.push_str(&rest);
                return (text, ToolOutcome::Malformed);
            }
            unfinished = true;
        }
        if self.malformed {
            // (After a malformed call the withheld text was released already.)
            let mut text = std::mem::take(&mut self.withheld);
            text.push_str(&rest);
            return (text, ToolOutcome::Malformed);
        }
        if self.calls.is_empty() {
            return (
                if unfinished { String::new() } else { rest },
                if unfinished { ToolOutcome::Malformed } else { ToolOutcome::Text },
            );
        }
        // Trailing whitespace after the last call is not content.
        if rest.trim().is_empty() {
            rest.clear();
        }
        (rest, ToolOutcome::Calls(std::mem::take(&mut self.calls)))
    }
}

/// Whether two arguments texts are the same JSON value (key order aside).
fn same_json(a: &str, b: &str) -> bool {
    match (serde_json::from_str::<Value>(a), serde_json::from_str::<Value>(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// Appends argument text to the last delta of call `index`, or starts a new delta.
fn push_args(deltas: &mut Vec<ToolCallDelta>, index: usize, s: &str) {
    match deltas.last_mut() {
        Some(d) if d.index == index => d.arguments.push_str(s),
        _ => deltas.push(ToolCallDelta { index, id: None, name: None, arguments: s.to_string() }),
    }
}

/// `{"name": "<name>", "arguments": ` at the start of a body: the name and where the
/// arguments value starts. The arguments key may be `arguments` or `parameters`.
fn name_and_args_start(body: &str) -> Option<(String, usize)> {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let re = RE.get_or_init(|| {
        regex::Regex::new(r#"^\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*"#).unwrap()
    });
    let caps = re.captures(body)?;
    let name: String = serde_json::from_str(caps.get(1)?.as_str()).ok()?;
    Some((name, caps.get(0)?.end()))
}

/// `{"name": <known tool>, "<args key>": {…}}` → the name and the arguments as JSON text
/// (arguments given as a string holding a JSON object are accepted too).
fn parse_body(body: &str, args_key: &str, tools: &[String]) -> Option<(String, String)> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let obj = v.as_object()?;
    let name = obj.get("name")?.as_str()?;
    if !tools.iter().any(|t| t == name) {
        return None;
    }
    let args = obj.get(args_key).or_else(|| obj.get("arguments")).or_else(|| obj.get("parameters"))?;
    let args = match args {
        Value::Object(_) => args.clone(),
        Value::String(s) => serde_json::from_str::<Value>(s).ok().filter(Value::is_object)?,
        _ => return None,
    };
    Some((name.to_string(), serde_json::to_string(&args).ok()?))
}

#[cfg(test)]
#[path = "tools_tests.rs"]
mod tests;
