//! Structured output for a request: its response format and tools, turned (off the engine
//! thread, while the request is prepared) into the grammar constraint its sampler obeys and
//! the tool-call splitter its text passes through.
//!
//! The grammar compiler holds the model's token trie; it is built on first use, so models
//! that never see a constrained request never pay for it (tens of milliseconds for a 150k
//! vocabulary).

use std::sync::{Arc, OnceLock};

use super::request::{GenerateOptions, ToolChoice};
use crate::error::{EngineError, Result};
use crate::sampling::tool_grammar::{tool_call_grammar, CallLayout};
use crate::sampling::{Constraint, GrammarCompiler, ResponseFormat, TokenVocab};
use crate::tokenizer::tools::ToolStream;
use crate::tokenizer::{Tokenizer, ToolSpec};

/// Most tools one request may declare.
pub const MAX_TOOLS: usize = 128;
/// Longest tool name (OpenAI's limit).
pub const MAX_TOOL_NAME: usize = 64;

/// What a request's structured output needs at run time.
#[derive(Default)]
pub struct Structured {
    pub constraint: Option<Box<Constraint>>,
    pub tools: Option<ToolStream>,
    /// Time spent compiling the grammar (ms).
    pub compile_ms: f64,
    /// Time spent preparing the whole request (ms), set by `prepare::submit`.
    pub prepare_ms: f64,
}

/// The model's tokenizer and its (lazily built) grammar compiler.
pub struct Formats {
    pub tokenizer: Arc<Tokenizer>,
    vocab_size: usize,
    eos: Vec<u32>,
    compiler: OnceLock<std::result::Result<GrammarCompiler, String>>,
}

impl Formats {
    /// `vocab_size`: the model's (logit rows); `eos`: the ids that end a generation.
    pub fn new(tokenizer: Arc<Tokenizer>, vocab_size: usize, eos: Vec<u32>) -> Self {
        Self { tokenizer, vocab_size, eos, compiler: OnceLock::new() }
    }

    fn compiler(&self) -> Result<&GrammarCompiler> {
        self.compiler
            .get_or_init(|| {
                let mut bytes = self.tokenizer.token_bytes()?;
                if bytes.len() < self.vocab_size {
                    bytes.resize(self.vocab_size, Vec::new());
                }
                let tok = self.tokenizer.clone();
                let tokenize =
                    Box::new(move |s: &[u8]| tok.encode_text(&String::from_utf8_lossy(s), false, false).unwrap_or_default());
                GrammarCompiler::new(TokenVocab { bytes, eos: self.eos.clone(), tokenize })
            })
            .as_ref()
            .map_err(|e| EngineError::InvalidArgument(format!("structured output is not available for this model: {e}")))
    }

    /// Checks the request's format and tools and builds what it runs with.
    pub fn prepare(&self, o: &GenerateOptions) -> Result<Structured> {
        check_tools(o)?;
        let calling = !o.tools.is_empty() && o.tool_choice != ToolChoice::None;
        let format = o.response_format.as_ref().filter(|f| !matches!(f, ResponseFormat::Text));
        let forced: Option<Vec<&ToolSpec>> = match (&o.tool_choice, calling) {
            (_, false) | (ToolChoice::Auto, _) | (ToolChoice::None, _) => None,
            (ToolChoice::Required, true) => Some(o.tools.iter().collect()),
            (ToolChoice::Named(n), true) => Some(o.tools.iter().filter(|t| &t.name == n).collect()),
        };
        if format.is_some() && forced.is_some() {
            return Err(EngineError::InvalidArgument(
                "responseFormat cannot be combined with a toolChoice that forces a call ('required' or a named tool)".into(),
            ));
        }
        let syntax = self.tokenizer.tool_format().syntax;
        let grammar = match (format, forced) {
            (Some(f), _) => Some(f.clone()),
            (None, Some(tools)) => {
                let layout = CallLayout {
                    open: syntax.open,
                    close: syntax.close,
                    separator: syntax.separator,
                    args_key: syntax.args_key,
                    // A named tool is called once.
                    parallel: syntax.parallel
                        && o.parallel_tool_calls.unwrap_or(true)
                        && !matches!(o.tool_choice, ToolChoice::Named(_)),
                };
                // Each tool's parameters, closed unless the tool says `strict: false`.
                let params = tools
                    .iter()
                    .map(|t| {
                        let bad = |e: String| {
                            EngineError::InvalidArgument(format!("the parameters of tool {:?} cannot be used: {e}", t.name))
                        };
                        let p =
                            crate::sampling::json_schema::prepare(t.parameters.clone(), t.strict.unwrap_or(true)).map_err(bad)?;
                        if crate::sampling::unique_items::marked(&p) {
                            return Err(bad("uniqueItems is not enforced in tool parameters; \
                                 drop it, or ask for the value with responseFormat instead"
                                .into()));
                        }
                        Ok(p)
                    })
                    .collect::<Result<Vec<_>>>()?;
                let specs: Vec<(&str, &serde_json::Value)> =
                    tools.iter().zip(&params).map(|(t, p)| (t.name.as_str(), p)).collect();
                Some(ResponseFormat::Compiled(tool_call_grammar(&layout, &specs)))
            }
            (None, None) => None,
        };
        let grammar_given = grammar.is_some();
        let t0 = std::time::Instant::now();
        let constraint = match grammar {
            Some(g) => self
                .compiler()?
                .compile(&g)
                .map_err(|e| EngineError::InvalidArgument(format!("{}: {e}", describe(&g))))?
                .map(Box::new),
            None => None,
        };
        Ok(Structured {
            constraint,
            tools: calling.then(|| ToolStream::new(syntax, &o.tools)),
            compile_ms: if grammar_given { t0.elapsed().as_secs_f64() * 1e3 } else { 0.0 },
            prepare_ms: 0.0,
        })
    }
}

fn describe(f: &ResponseFormat) -> &'static str {
    match f {
        ResponseFormat::Text => "responseFormat 'text'",
        ResponseFormat::JsonObject => "responseFormat 'json_object'",
        ResponseFormat::JsonSchema { .. } => "the JSON schema cannot be used",
        ResponseFormat::Regex(_) => "the regex cannot be used",
        ResponseFormat::Grammar(_) => "the grammar cannot be used",
        ResponseFormat::Compiled(_) => "the tools' parameter schemas cannot be used",
    }
}

/// Tool names are 1–64 letters, digits, `_` or `-`, distinct; parameters are a schema object;
/// a named choice names one of the tools.
fn check_tools(o: &GenerateOptions) -> Result<()> {
    let bad = |m: String| Err(EngineError::InvalidArgument(m));
    if o.tools.len() > MAX_TOOLS {
        return bad(format!("at most {MAX_TOOLS} tools may be given, got {}", o.tools.len()));
    }
    let mut seen = std::collections::HashSet::new();
    for t in &o.tools {
        let ok = !t.name.is_empty()
            && t.name.len() <= MAX_TOOL_NAME
            && t.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !ok {
            return bad(format!(
                "tool name {:?} must be 1 to {MAX_TOOL_NAME} letters, digits, '_' or '-'",
                t.name.chars().take(80).collect::<String>()
            ));
        }
        if !seen.insert(t.name.as_str()) {
            return bad(format!("tool {:?} is declared twice", t.name));
        }
        if !t.parameters.is_object() {
            return bad(format!("tool {:?}: parameters must be a JSON schema object", t.name));
        }
    }
    match &o.tool_choice {
        ToolChoice::Named(n) if !o.tools.iter().any(|t| &t.name == n) => {
            bad(format!("toolChoice names {n:?}, which is not among the tools"))
        }
        ToolChoice::Required | ToolChoice::Named(_) if o.tools.is_empty() => bad("toolChoice needs tools".into()),
        _ => Ok(()),
    }
}

/// JSON text a binding received (a schema, tool parameters), at most
/// [`crate::sampling::constraint::MAX_FORMAT_BYTES`], parsed with serde_json's nesting limit.
pub fn parse_json_text(what: &str, text: &str) -> Result<serde_json::Value> {
    use crate::sampling::constraint::MAX_FORMAT_BYTES;
    if text.len() > MAX_FORMAT_BYTES {
        return Err(EngineError::InvalidArgument(format!(
            "{what} is {} bytes of JSON; at most {MAX_FORMAT_BYTES} are accepted",
            text.len()
        )));
    }
    serde_json::from_str(text).map_err(|e| EngineError::InvalidArgument(format!("{what} is not valid JSON: {e}")))
}

/// A response format from the parts a binding received: `kind` is 'text' | 'json_object' |
/// 'json_schema' (with `schema`, and `strict`: `Some(false)` keeps objects that do not say
/// `additionalProperties` open, see `sampling::json_schema`) | 'regex' (with `pattern`) |
/// 'grammar' (with `grammar`). `what` names the option in messages (`responseFormat` in Node,
/// `response_format` in Python).
pub fn response_format(
    what: &str,
    kind: &str,
    schema: Option<serde_json::Value>,
    strict: Option<bool>,
    pattern: Option<String>,
    grammar: Option<String>,
) -> Result<ResponseFormat> {
    let need = |field: &str| EngineError::InvalidArgument(format!("{what} '{kind}' needs {field}"));
    Ok(match kind {
        "text" => ResponseFormat::Text,
        "json_object" => ResponseFormat::JsonObject,
        "json_schema" => {
            let schema = schema.ok_or_else(|| need("a schema"))?;
            if !(schema.is_object() || schema.is_boolean()) {
                return Err(EngineError::InvalidArgument(format!("{what}.schema must be a JSON schema object")));
            }
            let schema = crate::sampling::json_schema::prepare(schema, strict.unwrap_or(true))
                .map_err(|e| EngineError::InvalidArgument(format!("the JSON schema cannot be used: {e}")))?;
            ResponseFormat::JsonSchema { schema }
        }
        "regex" => ResponseFormat::Regex(pattern.ok_or_else(|| need("a pattern"))?),
        "grammar" => ResponseFormat::Grammar(grammar.ok_or_else(|| need("a grammar"))?),
        other => {
            return Err(EngineError::InvalidArgument(format!(
                "{what}.type must be 'text', 'json_object', 'json_schema', 'regex' or 'grammar', got {:?}",
                other.chars().take(40).collect::<String>()
            )))
        }
    })
}

impl ToolChoice {
    /// 'auto' (also `None`) | 'none' | 'required', or a tool's `name`; `what` names the option.
    pub fn parse(what: &str, choice: Option<&str>, name: Option<String>) -> Result<Self> {
        Ok(match (choice, name) {
            (_, Some(n)) => Self::Named(n),
            (None | Some("auto"), None) => Self::Auto,
            (Some("none"), None) => Self::None,
            (Some("required"), None) => Self::Required,
            (Some(other), None) => {
                return Err(EngineError::InvalidArgument(format!(
                    "{what} must be 'auto', 'none', 'required' or {{ type: 'function', function: {{ name }} }}, got {:?}",
                    other.chars().take(40).collect::<String>()
                )))
            }
        })
    }
}
