//! Response formats, tools and tool calls across the boundary. Schemas cross as JSON text
//! (`JSON.stringify` in lib/session.ts), parsed here with serde_json's nesting limit.

use napi_derive::napi;

use super::error::invalid;
use crate::engine::ToolChoice;
use crate::sampling::constraint::MAX_FORMAT_BYTES;
use crate::sampling::ResponseFormat;
use crate::tokenizer::tools::ToolCallDelta;
use crate::tokenizer::{ToolCall, ToolSpec};

#[napi(object)]
pub struct NativeResponseFormat {
    /// 'text' | 'json_object' | 'json_schema' | 'regex' | 'grammar'
    #[napi(js_name = "type")]
    pub kind: String,
    /// JSON text of the schema (`json_schema`).
    pub schema: Option<String>,
    pub pattern: Option<String>,
    pub grammar: Option<String>,
}

#[napi(object)]
pub struct NativeTool {
    pub name: String,
    pub description: Option<String>,
    /// JSON text of the parameters schema.
    pub parameters: Option<String>,
}

#[napi(object)]
#[derive(Clone)]
pub struct JsFunctionCall {
    pub name: String,
    pub arguments: String,
}

#[napi(object)]
#[derive(Clone)]
pub struct JsToolCall {
    pub id: String,
    /// Always 'function'.
    #[napi(js_name = "type")]
    pub kind: String,
    pub function: JsFunctionCall,
}

#[napi(object)]
pub struct JsFunctionDelta {
    pub name: Option<String>,
    pub arguments: String,
}

/// A piece of a tool call, as OpenAI streams them: the first piece of a call has `id`,
/// `type` and `function.name`.
#[napi(object)]
pub struct JsToolCallDelta {
    pub index: u32,
    pub id: Option<String>,
    #[napi(js_name = "type")]
    pub kind: Option<String>,
    pub function: JsFunctionDelta,
}

fn parse_json(what: &str, text: &str) -> napi::Result<serde_json::Value> {
    if text.len() > MAX_FORMAT_BYTES {
        return Err(invalid(format!("{what} is {} bytes of JSON; at most {MAX_FORMAT_BYTES} are accepted", text.len())));
    }
    serde_json::from_str(text).map_err(|e| invalid(format!("{what} is not valid JSON: {e}")))
}

impl NativeResponseFormat {
    pub fn into_engine(self) -> napi::Result<ResponseFormat> {
        let need =
            |v: Option<String>, field: &str| v.ok_or_else(|| invalid(format!("responseFormat '{}' needs {field}", self.kind)));
        Ok(match self.kind.as_str() {
            "text" => ResponseFormat::Text,
            "json_object" => ResponseFormat::JsonObject,
            "json_schema" => {
                let schema = parse_json("responseFormat.schema", &need(self.schema.clone(), "a schema")?)?;
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err(invalid("responseFormat.schema must be a JSON schema object"));
                }
                ResponseFormat::JsonSchema { schema }
            }
            "regex" => ResponseFormat::Regex(need(self.pattern.clone(), "a pattern")?),
            "grammar" => ResponseFormat::Grammar(need(self.grammar.clone(), "a grammar")?),
            other => {
                return Err(invalid(format!(
                    "responseFormat.type must be 'text', 'json_object', 'json_schema', 'regex' or 'grammar', got {:?}",
                    other.chars().take(40).collect::<String>()
                )))
            }
        })
    }
}

impl NativeTool {
    pub fn into_engine(self) -> napi::Result<ToolSpec> {
        let parameters = match &self.parameters {
            Some(p) => parse_json(&format!("the parameters of tool {:?}", self.name), p)?,
            None => serde_json::json!({ "type": "object", "properties": {} }),
        };
        Ok(ToolSpec { name: self.name, description: self.description, parameters })
    }
}

/// `toolChoice`: 'auto' | 'none' | 'required', or (as `name`) a tool's name.
pub fn tool_choice(choice: Option<String>, name: Option<String>) -> napi::Result<ToolChoice> {
    Ok(match (choice.as_deref(), name) {
        (_, Some(n)) => ToolChoice::Named(n),
        (None | Some("auto"), None) => ToolChoice::Auto,
        (Some("none"), None) => ToolChoice::None,
        (Some("required"), None) => ToolChoice::Required,
        (Some(other), None) => {
            return Err(invalid(format!(
                "toolChoice must be 'auto', 'none', 'required' or {{ type: 'function', function: {{ name }} }}, got {:?}",
                other.chars().take(40).collect::<String>()
            )))
        }
    })
}

impl From<ToolCall> for JsToolCall {
    fn from(c: ToolCall) -> Self {
        Self { id: c.id, kind: "function".into(), function: JsFunctionCall { name: c.name, arguments: c.arguments } }
    }
}

impl From<JsToolCall> for ToolCall {
    fn from(c: JsToolCall) -> Self {
        Self { id: c.id, name: c.function.name, arguments: c.function.arguments }
    }
}

impl From<ToolCallDelta> for JsToolCallDelta {
    fn from(d: ToolCallDelta) -> Self {
        Self {
            index: u32::try_from(d.index).unwrap_or(u32::MAX),
            kind: d.id.as_ref().map(|_| "function".into()),
            id: d.id,
            function: JsFunctionDelta { name: d.name, arguments: d.arguments },
        }
    }
}
