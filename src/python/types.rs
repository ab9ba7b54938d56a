//! What Python receives: chunks, summaries and tool calls as read-only objects with attribute
//! access (as the `openai` package's objects have), and their conversions from engine types.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::json::to_python;
use crate::engine;
use crate::experts::router::Decision;
use crate::tokenizer::tools;

#[pyclass(module = "expert_runtime", frozen, get_all)]
#[derive(Clone)]
pub struct FunctionCall {
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

/// A tool call of an answer, in OpenAI's shape: `call.function.name`, `call.function.arguments`.
#[pyclass(module = "expert_runtime", frozen, get_all)]
#[derive(Clone)]
pub struct ToolCall {
    pub id: String,
    /// Always `"function"`.
    #[pyo3(name = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

#[pymethods]
impl ToolCall {
    /// `{"id", "type", "function": {"name", "arguments"}}`, as a chat message's `tool_calls`.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        call_dict(py, &self.id, &self.function.name, &self.function.arguments)
    }

    fn __repr__(&self) -> String {
        format!("ToolCall(id={:?}, function={:?}, arguments={:?})", self.id, self.function.name, self.function.arguments)
    }
}

pub fn call_dict<'py>(py: Python<'py>, id: &str, name: &str, arguments: &str) -> PyResult<Bound<'py, PyDict>> {
    let f = PyDict::new(py);
    f.set_item("name", name)?;
    f.set_item("arguments", arguments)?;
    let d = PyDict::new(py);
    d.set_item("id", id)?;
    d.set_item("type", "function")?;
    d.set_item("function", f)?;
    Ok(d)
}

impl From<tools::ToolCall> for ToolCall {
    fn from(c: tools::ToolCall) -> Self {
        Self { id: c.id, kind: "function", function: FunctionCall { name: c.name, arguments: c.arguments } }
    }
}

#[pyclass(module = "expert_runtime", frozen, get_all)]
#[derive(Clone)]
pub struct FunctionDelta {
    pub name: Option<String>,
    pub arguments: String,
}

/// A piece of a tool call as it streams: the first piece of a call has `id`, `type` and
/// `function.name`; the rest extend `function.arguments`.
#[pyclass(module = "expert_runtime", frozen, get_all)]
#[derive(Clone)]
pub struct ToolCallDelta {
    pub index: usize,
    pub id: Option<String>,
    #[pyo3(name = "type")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

impl From<tools::ToolCallDelta> for ToolCallDelta {
    fn from(d: tools::ToolCallDelta) -> Self {
        Self {
            index: d.index,
            kind: d.id.as_ref().map(|_| "function"),
            id: d.id,
            function: FunctionDelta { name: d.name, arguments: d.arguments },
        }
    }
}

/// One generated token.
#[pyclass(module = "expert_runtime", frozen)]
pub struct TokenChunk {
    #[pyo3(get)]
    pub token_id: u32,
    /// Its text (may be empty while a multi-byte character is incomplete; tool-call markup is
    /// never here).
    #[pyo3(get)]
    pub text: String,
    /// The thought text this token wrote (thinking models), else `None`.
    #[pyo3(get)]
    pub reasoning: Option<String>,
    /// The model's own log-probability of the token (before any format mask).
    #[pyo3(get)]
    pub logprob: f64,
    /// `[(token_id, logprob), …]`, best first, when `top_logprobs` was asked for.
    #[pyo3(get)]
    pub top_logprobs: Option<Vec<(u32, f64)>>,
    /// The first piece of a tool call this token wrote.
    #[pyo3(get)]
    pub tool_call_delta: Option<ToolCallDelta>,
    /// Every piece of tool calls this token wrote (rarely more than one).
    #[pyo3(get)]
    pub tool_call_deltas: Option<Vec<ToolCallDelta>>,
    /// First chunk only: the experts the request runs under, in application order.
    #[pyo3(get)]
    pub experts: Option<Vec<String>>,
    routing: Option<Decision>,
}

#[pymethods]
impl TokenChunk {
    fn __repr__(&self) -> String {
        format!("TokenChunk(token_id={}, text={:?}, logprob={:.4})", self.token_id, self.text, self.logprob)
    }

    /// First chunk only, for `experts="auto"`: the router's decision, as a dict.
    #[getter]
    fn routing<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.routing.as_ref().map(|d| to_python(py, d)).transpose()
    }
}

impl From<engine::TokenChunk> for TokenChunk {
    fn from(c: engine::TokenChunk) -> Self {
        let deltas: Vec<ToolCallDelta> = c.tool_call_deltas.into_iter().map(Into::into).collect();
        Self {
            token_id: c.token_id,
            text: c.text,
            reasoning: (!c.reasoning.is_empty()).then_some(c.reasoning),
            logprob: c.logprob as f64,
            top_logprobs: c.top_logprobs.map(|v| v.into_iter().map(|(t, lp)| (t, lp as f64)).collect()),
            tool_call_delta: deltas.first().cloned(),
            tool_call_deltas: (!deltas.is_empty()).then_some(deltas),
            experts: c.start.as_ref().map(|s| s.experts.clone()),
            routing: c.start.and_then(|s| s.routing),
        }
    }
}

#[pyclass(module = "expert_runtime", frozen, get_all)]
#[derive(Clone)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens served from the KV cache (the session's earlier turns, a shared prefix).
    pub cached_tokens: usize,
    /// Tokens proposed by speculative decoding and checked by the model.
    pub draft_tokens: usize,
    /// Of `draft_tokens`, those the model agreed with.
    pub accepted_draft_tokens: usize,
    /// Of `completion_tokens`, those of the thought (thinking models).
    pub reasoning_tokens: usize,
}

#[pyclass(module = "expert_runtime", frozen, get_all)]
#[derive(Clone)]
pub struct Timings {
    pub ttft_ms: f64,
    pub prepare_ms: f64,
    pub format_ms: f64,
    pub tokens_per_second: f64,
    pub prefill_tokens_per_second: f64,
}

/// A request's summary.
#[pyclass(module = "expert_runtime", frozen)]
pub struct Completion {
    #[pyo3(get)]
    pub text: String,
    /// The thought before the answer (thinking models), else `None`.
    #[pyo3(get)]
    pub reasoning: Option<String>,
    #[pyo3(get)]
    pub tokens: Vec<u32>,
    /// `"stop"` | `"length"` | `"cancelled"` | `"tool_calls"`.
    #[pyo3(get)]
    pub finish_reason: &'static str,
    #[pyo3(get)]
    pub usage: Usage,
    #[pyo3(get)]
    pub timings: Timings,
    /// The experts that ran, in application order.
    #[pyo3(get)]
    pub experts: Vec<String>,
    #[pyo3(get)]
    pub tool_calls: Option<Vec<ToolCall>>,
    routing: Option<Decision>,
}

#[pymethods]
impl Completion {
    /// The router's decision when the request asked for `experts="auto"`, as a dict.
    #[getter]
    fn routing<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.routing.as_ref().map(|d| to_python(py, d)).transpose()
    }

    fn __repr__(&self) -> String {
        format!(
            "Completion(text={:?}, finish_reason={:?}, completion_tokens={})",
            self.text, self.finish_reason, self.usage.completion_tokens
        )
    }
}

impl From<engine::Completion> for Completion {
    fn from(c: engine::Completion) -> Self {
        Self {
            text: c.text,
            reasoning: c.reasoning,
            tokens: c.tokens,
            finish_reason: c.finish_reason.as_str(),
            usage: Usage {
                prompt_tokens: c.usage.prompt_tokens,
                completion_tokens: c.usage.completion_tokens,
                cached_tokens: c.usage.cached_tokens,
                draft_tokens: c.usage.draft_tokens,
                accepted_draft_tokens: c.usage.accepted_draft_tokens,
                reasoning_tokens: c.usage.reasoning_tokens,
            },
            timings: Timings {
                ttft_ms: c.timings.ttft_ms,
                prepare_ms: c.timings.prepare_ms,
                format_ms: c.timings.format_ms,
                tokens_per_second: c.timings.tokens_per_second,
                prefill_tokens_per_second: c.timings.prefill_tokens_per_second,
            },
            experts: c.experts,
            tool_calls: (!c.tool_calls.is_empty()).then(|| c.tool_calls.into_iter().map(Into::into).collect()),
            routing: c.routing,
        }
    }
}
