//! Response formats, tools and tool calls across the boundary. Schemas cross as JSON text
//! (`JSON.stringify` in lib/session.ts), parsed here with serde_json's nesting limit.

use napi_derive::napi;

use super::error::to_napi;
use crate::engine::{structured, ToolChoice};
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
    /// `json_schema`: false keeps objects that do not say `additionalProperties` open.
    pub strict: Option<bool>,
    pub pattern: Option<String>,
    pub grammar: Option<String>,
}

#[napi(object)]
pub struct NativeTool {
    pub name: String,
    pub description: Option<String>,
    /// JSON text of the parameters schema.
    pub parameters: Option<String>,
    /// false keeps objects of `parameters` that do not say `additionalProperties` open.
    pub strict: Option<bool>,
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

impl NativeResponseFormat {
    pub fn into_engine(self) -> napi::Result<ResponseFormat> {
        let schema = self.schema.as_deref().map(|t| structured::parse_json_text("responseFormat.schema", t)).transpose();
        let schema = schema.map_err(to_napi)?;
        structured::response_format("responseFormat", &self.kind, schema, self.strict, self.pattern, self.grammar)
            .map_err(to_napi)
    }
}

impl NativeTool {
    pub fn into_engine(self) -> napi::Result<ToolSpec> {
        let parameters = match &self.parameters {
            Some(p) => structured::parse_json_text(&format!("the parameters of tool {:?}", self.name), p).map_err(to_napi)?,
            None => serde_json::json!({ "type": "object", "properties": {} }),
        };
        Ok(ToolSpec { name: self.name, description: self.description, parameters, strict: self.strict })
    }
}

/// `toolChoice`: 'auto' | 'none' | 'required', or (as `name`) a tool's name.
pub fn tool_choice(choice: Option<String>, name: Option<String>) -> napi::Result<ToolChoice> {
    ToolChoice::parse("toolChoice", choice.as_deref(), name).map_err(to_napi)
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
