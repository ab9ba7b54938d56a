//! A request's input and options from Python: the same shapes as Node's in Python spelling.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use super::args::{self, dict, seq, string, Kwargs};
use super::error::{invalid, to_py};
use super::json::{to_json, to_json_text};
use super::types;
use crate::engine::{self, structured, ExpertChoice, ToolChoice};
use crate::sampling::{ResponseFormat, SamplingOverrides};
use crate::tokenizer::{ChatMessage, ToolCall, ToolSpec};

pub const GENERATE_OPTIONS: &[&str] = &[
    "max_tokens",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "seed",
    "stop",
    "top_logprobs",
    "thinking",
    "enable_thinking",
    "experts",
    "parse_special_tokens",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "speculative",
];

const INPUT_SHAPES: &str = "input must be a str, a list of {\"role\", \"content\"} dicts, {\"text\": str} or {\"tokens\": [int]}";

/// `str` (one user turn), a list of message dicts, `{"text": …}` or `{"tokens": […]}`.
pub fn input(v: &Bound<'_, PyAny>) -> PyResult<engine::Input> {
    if v.is_instance_of::<PyString>() {
        return Ok(engine::Input::Chat(vec![ChatMessage::new("user", string(v, "input")?)]));
    }
    if let Ok(d) = v.cast::<PyDict>() {
        let text = d.get_item("text")?;
        let tokens = d.get_item("tokens")?;
        return match (text, tokens, d.len()) {
            (Some(t), None, 1) => Ok(engine::Input::Text(string(&t, "input['text']")?)),
            (None, Some(t), 1) => {
                let ids = seq(&t, "input['tokens']")?;
                Ok(engine::Input::Tokens(ids.iter().map(|x| args::int::<u32>(x, "each token id")).collect::<PyResult<_>>()?))
            }
            _ => Err(invalid(INPUT_SHAPES)),
        };
    }
    let items = seq(v, "input").map_err(|_| invalid(INPUT_SHAPES))?;
    Ok(engine::Input::Chat(items.iter().map(message).collect::<PyResult<_>>()?))
}

/// A chat message dict: `role`, `content`, and `tool_calls` (an assistant turn's calls) or
/// `tool_call_id` (a `tool` turn's answer).
pub fn message(v: &Bound<'_, PyAny>) -> PyResult<ChatMessage> {
    let d = dict(v, "each message")?;
    let k = Kwargs::new(Some(&d), &["role", "content", "tool_calls", "tool_call_id", "reasoning"], "a message")?;
    let role = k.string("role")?.ok_or_else(|| invalid("each message needs a string role"))?;
    // An assistant turn that only called tools may have `content: None`, as OpenAI's does.
    if !d.contains("content")? {
        return Err(invalid("each message needs a content (a string, or None for a turn that only called tools)"));
    }
    let content = k.string("content")?.unwrap_or_default();
    let tool_calls = match k.any("tool_calls")? {
        Some(calls) => seq(&calls, "tool_calls")?.iter().map(tool_call).collect::<PyResult<_>>()?,
        None => Vec::new(),
    };
    Ok(ChatMessage { role, content, tool_calls, tool_call_id: k.string("tool_call_id")?, reasoning: k.string("reasoning")? })
}

/// `{"id", "type": "function", "function": {"name", "arguments"}}` (arguments: JSON text, or a
/// dict written as JSON), or a `ToolCall` from an earlier answer.
fn tool_call(v: &Bound<'_, PyAny>) -> PyResult<ToolCall> {
    if let Ok(c) = v.cast::<types::ToolCall>() {
        let c = c.get();
        return Ok(ToolCall { id: c.id.clone(), name: c.function.name.clone(), arguments: c.function.arguments.clone() });
    }
    let shape = "each tool call must be {\"id\": str, \"type\": \"function\", \"function\": {\"name\": str, \"arguments\": str}}";
    let d = dict(v, "each tool call").map_err(|_| invalid(shape))?;
    let k = Kwargs::new(Some(&d), &["id", "type", "function"], "a tool call")?;
    if k.string("type")?.is_some_and(|t| t != "function") {
        return Err(invalid(shape));
    }
    let f = dict(&k.any("function")?.ok_or_else(|| invalid(shape))?, "function")?;
    let f = Kwargs::new(Some(&f), &["name", "arguments"], "a tool call's function")?;
    let arguments = match f.any("arguments")? {
        Some(a) if a.is_instance_of::<PyString>() => string(&a, "arguments")?,
        Some(a) => to_json_text(&a, "arguments")?,
        None => "{}".into(),
    };
    Ok(ToolCall {
        id: k.string("id")?.ok_or_else(|| invalid(shape))?,
        name: f.string("name")?.ok_or_else(|| invalid(shape))?,
        arguments,
    })
}

/// `experts`: a list of names, or `"auto"` (the router picks per request).
pub fn expert_choice(v: &Bound<'_, PyAny>) -> PyResult<ExpertChoice> {
    if v.is_instance_of::<PyString>() {
        return match string(v, "experts")?.as_str() {
            "auto" => Ok(ExpertChoice::Auto),
            _ => Err(invalid("experts must be a list of expert names or \"auto\"")),
        };
    }
    Ok(ExpertChoice::Named(args::strings(v, "experts")?))
}

/// Keyword options of `generate` / `complete`. Ranges are checked once by the engine
/// (`SamplingParams::validate`): NaN, a negative temperature or a top_p of 2 are refused there.
pub fn generate_options(kw: Option<&Bound<'_, PyDict>>) -> PyResult<engine::GenerateOptions> {
    let k = Kwargs::new(kw, GENERATE_OPTIONS, "generate")?;
    let f32_of = |key: &str| k.f64(key).map(|v| v.map(|x| x as f32));
    let stop = match k.any("stop")? {
        Some(s) if s.is_instance_of::<PyString>() => vec![string(&s, "stop")?],
        Some(s) => args::strings(&s, "stop")?,
        None => Vec::new(),
    };
    let tool_choice = match k.any("tool_choice")? {
        None => ToolChoice::Auto,
        Some(c) if c.is_instance_of::<PyString>() => {
            ToolChoice::parse("tool_choice", Some(&string(&c, "tool_choice")?), None).map_err(to_py)?
        }
        Some(c) => {
            let bad = || {
                invalid(
                    "tool_choice must be 'auto', 'none', 'required' or {\"type\": \"function\", \"function\": {\"name\": str}}",
                )
            };
            let d = dict(&c, "tool_choice").map_err(|_| bad())?;
            let k = Kwargs::new(Some(&d), &["type", "function"], "tool_choice")?;
            let f = dict(&k.any("function")?.ok_or_else(bad)?, "tool_choice['function']")?;
            let name = Kwargs::new(Some(&f), &["name"], "tool_choice['function']")?.string("name")?.ok_or_else(bad)?;
            ToolChoice::Named(name)
        }
    };
    let (enable_thinking, thinking_budget) = thinking(k.any("thinking")?, k.bool("enable_thinking")?)?;
    Ok(engine::GenerateOptions {
        max_tokens: k.positive_u32("max_tokens")?.map(|n| n as usize),
        sampling: SamplingOverrides {
            temperature: f32_of("temperature")?,
            top_k: k.u32("top_k")?.map(|n| n as usize),
            top_p: f32_of("top_p")?,
            min_p: f32_of("min_p")?,
            repetition_penalty: f32_of("repetition_penalty")?,
            frequency_penalty: f32_of("frequency_penalty")?,
            presence_penalty: f32_of("presence_penalty")?,
            seed: k.u64("seed")?,
            top_logprobs: k.u32("top_logprobs")?.map(|n| n as usize),
        },
        stop,
        enable_thinking,
        thinking_budget,
        experts: k.any("experts")?.map(|v| expert_choice(&v)).transpose()?,
        parse_special_tokens: k.bool("parse_special_tokens")?.unwrap_or(false),
        response_format: k.any("response_format")?.map(|v| response_format(&v)).transpose()?,
        tools: match k.any("tools")? {
            Some(t) => seq(&t, "tools")?.iter().map(tool).collect::<PyResult<_>>()?,
            None => Vec::new(),
        },
        tool_choice,
        parallel_tool_calls: k.bool("parallel_tool_calls")?,
        speculative: k.any("speculative")?.map(|v| speculative(&v)).transpose()?,
    })
}

/// `thinking`: `True` / `False`, or `{"budget_tokens": int}` (0: no thought); `enable_thinking`
/// is its boolean alias (both given must agree).
fn thinking(v: Option<Bound<'_, PyAny>>, alias: Option<bool>) -> PyResult<(Option<bool>, Option<usize>)> {
    let (on, budget) = match v {
        None => (None, None),
        Some(v) if v.is_instance_of::<pyo3::types::PyBool>() => (Some(args::boolean(&v, "thinking")?), None),
        Some(v) => {
            let d = dict(&v, "thinking").map_err(|_| invalid("thinking must be True, False or {\"budget_tokens\": int}"))?;
            let k = Kwargs::new(Some(&d), &["budget_tokens"], "thinking")?;
            let b = k.u32("budget_tokens")?.ok_or_else(|| invalid("thinking needs an integer 'budget_tokens'"))?;
            (Some(b > 0), Some(b as usize))
        }
    };
    match (on, alias) {
        (Some(a), Some(b)) if a != b => Err(invalid("thinking and enable_thinking disagree; give one of them")),
        (on, alias) => Ok((on.or(alias), budget)),
    }
}

/// `{"type": "ngram", "max_draft"?: int, "ngram"?: int, "min_ngram"?: int}` or `{"type":
/// "draft", "model": Runtime, "max_draft"?: int}` (another loaded runtime with the same
/// tokenizer proposes the drafts; the engine checks the vocabulary and which fields go with
/// which type).
fn speculative(v: &Bound<'_, PyAny>) -> PyResult<engine::SpeculativeOptions> {
    let d = dict(v, "speculative")?;
    let k = Kwargs::new(Some(&d), &["type", "max_draft", "ngram", "min_ngram", "model"], "speculative")?;
    let kind = k.string("type")?.ok_or_else(|| invalid("speculative needs a string 'type'"))?;
    let n = |name: &str| k.u32(name).map(|v| v.map(|x| x as usize));
    let draft = match k.any("model")? {
        Some(m) => {
            let rt = m.cast::<super::runtime::Runtime>().map_err(|_| invalid("speculative.model must be a Runtime"))?;
            Some(rt.get().draft_model()?)
        }
        None => None,
    };
    engine::SpeculativeOptions::new(&kind, n("max_draft")?, n("ngram")?, n("min_ngram")?, draft).map_err(to_py)
}

/// `{"type": "json_schema", "schema": {...}}` (or OpenAI's `{"type": "json_schema",
/// "json_schema": {"name", "schema", "strict"}}`), `{"type": "regex", "pattern"}`,
/// `{"type": "grammar", "grammar"}`, `{"type": "json_object"}`, `{"type": "text"}`.
fn response_format(v: &Bound<'_, PyAny>) -> PyResult<ResponseFormat> {
    let d = dict(v, "response_format")?;
    let k = Kwargs::new(Some(&d), &["type", "schema", "json_schema", "name", "strict", "pattern", "grammar"], "response_format")?;
    let kind = k.string("type")?.ok_or_else(|| invalid("response_format needs a string 'type'"))?;
    let mut schema = k.any("schema")?;
    let mut strict = k.bool("strict")?;
    if let Some(js) = k.any("json_schema")? {
        let js = dict(&js, "response_format['json_schema']")?;
        let jk = Kwargs::new(Some(&js), &["name", "schema", "strict", "description"], "response_format['json_schema']")?;
        schema = schema.or(jk.any("schema")?);
        strict = strict.or(jk.bool("strict")?);
    }
    let schema = schema.map(|s| to_json(&s, "response_format['schema']")).transpose()?;
    structured::response_format("response_format", &kind, schema, strict, k.string("pattern")?, k.string("grammar")?)
        .map_err(to_py)
}

/// `{"type": "function", "function": {"name", "description", "parameters"}}`.
fn tool(v: &Bound<'_, PyAny>) -> PyResult<ToolSpec> {
    let shape =
        "each tool must be {\"type\": \"function\", \"function\": {\"name\": str, \"description\"?: str, \"parameters\"?: dict}}";
    let d = dict(v, "each tool").map_err(|_| invalid(shape))?;
    let k = Kwargs::new(Some(&d), &["type", "function"], "a tool")?;
    if k.string("type")?.as_deref() != Some("function") {
        return Err(invalid(shape));
    }
    let f = dict(&k.any("function")?.ok_or_else(|| invalid(shape))?, "a tool's function")?;
    let f = Kwargs::new(Some(&f), &["name", "description", "parameters", "strict"], "a tool's function")?;
    let name = f.string("name")?.ok_or_else(|| invalid(shape))?;
    let parameters = match f.any("parameters")? {
        Some(p) => to_json(&p, &format!("the parameters of tool {name:?}"))?,
        None => serde_json::json!({ "type": "object", "properties": {} }),
    };
    Ok(ToolSpec { name, description: f.string("description")?, parameters, strict: f.bool("strict")? })
}
