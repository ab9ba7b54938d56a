//! The grammar that forces a tool call: `toolChoice: 'required'` or a named tool.
//!
//! A call is the family's opening marker, a JSON object `{"name": <tool>, "<args key>":
//! <arguments valid against the tool's parameters schema>}` and the closing marker. The
//! object is a JSON-schema sub-grammar per tool (llguidance `@name` references from a Lark
//! top level), written compactly like every constrained JSON value (`constraint::json_grammar`).

use llguidance::api::{GrammarWithLexer, TopLevelGrammar};
use serde_json::{json, Value};

use super::constraint::json_grammar;

/// How the calls are written (from the template family's syntax).
pub struct CallLayout<'a> {
    pub open: &'a str,
    pub close: &'a str,
    pub separator: &'a str,
    pub args_key: &'a str,
    /// Several calls may follow each other.
    pub parallel: bool,
}

/// Lark string literal (JSON string escapes are valid Lark escapes).
fn lit(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// The grammar of one or more calls to any of `tools` (`(name, parameters schema)`).
pub fn tool_call_grammar(layout: &CallLayout<'_>, tools: &[(&str, &Value)]) -> TopLevelGrammar {
    let bodies: Vec<String> = (0..tools.len()).map(|i| format!("@tool_{i}")).collect();
    let mut call = String::new();
    if !layout.open.is_empty() {
        call.push_str(&lit(layout.open));
        call.push(' ');
    }
    call.push_str("body");
    if !layout.close.is_empty() {
        call.push(' ');
        call.push_str(&lit(layout.close));
    }
    let start = if layout.parallel && !layout.separator.is_empty() {
        format!("start: call ({} call)*\n", lit(layout.separator))
    } else {
        "start: call\n".to_string()
    };
    let lark = format!("{start}call: {call}\nbody: {}\n", bodies.join(" | "));
    let mut grammars = vec![GrammarWithLexer::from_lark(lark)];
    for (i, (name, params)) in tools.iter().enumerate() {
        let mut params = if params.is_object() || params.is_boolean() { (*params).clone() } else { json!({ "type": "object" }) };
        // The parameters schema sits under `properties/<args key>` of the call's schema: its
        // own references (`#/$defs/…`, as Pydantic and Zod write them, or `#`) are rebased there.
        rebase_refs(&mut params, &format!("#/properties/{}", pointer_escape(layout.args_key)));
        let schema = json!({
            "type": "object",
            "properties": { "name": { "const": name }, layout.args_key: params },
            "required": ["name", layout.args_key],
            "additionalProperties": false,
        });
        let mut g = json_grammar(schema).grammars.remove(0);
        g.name = Some(format!("tool_{i}"));
        grammars.push(g);
    }
    TopLevelGrammar { grammars, max_tokens: None }
}

/// `s` as a JSON-pointer token (`~` → `~0`, `/` → `~1`).
fn pointer_escape(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

/// Prefixes every document-local `$ref` (`#…`) in `schema` with `base`, leaving data (`const`,
/// `enum`, `default`, `examples`) alone. Walks with a stack of its own: depth is the schema's.
fn rebase_refs(schema: &mut Value, base: &str) {
    let mut todo = vec![schema];
    while let Some(v) = todo.pop() {
        match v {
            Value::Object(m) => {
                for (k, child) in m.iter_mut() {
                    match (k.as_str(), child) {
                        ("$ref", Value::String(r)) if r.starts_with('#') => *r = format!("{base}{}", &r[1..]),
                        ("const" | "enum" | "default" | "examples", _) => {}
                        (_, child) => todo.push(child),
                    }
                }
            }
            Value::Array(a) => todo.extend(a.iter_mut()),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::constraint::{GrammarCompiler, ResponseFormat, TokenVocab};

    #[test]
    fn forced_calls_accept_valid_calls_only() {
        let mut bytes: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        bytes.push(b"\xff<eos>".to_vec());
        let eos = 256;
        let comp = GrammarCompiler::new(TokenVocab {
            bytes,
            eos: vec![eos],
            tokenize: Box::new(|s: &[u8]| s.iter().map(|&b| b as u32).collect()),
        })
        .unwrap();
        let params = json!({ "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"], "additionalProperties": false });
        let empty = json!({ "type": "object", "properties": {}, "additionalProperties": false });
        let layout =
            CallLayout { open: "<tool_call>\n", close: "\n</tool_call>", separator: "\n", args_key: "arguments", parallel: true };
        let g = tool_call_grammar(&layout, &[("get_weather", &params), ("now", &empty)]);
        let accepts = |text: &str| {
            let mut c = comp.compile(&ResponseFormat::Compiled(g.clone())).unwrap().unwrap();
            for b in text.bytes() {
                c.compute_mask().unwrap();
                if !c.mask().unwrap().is_allowed(b as u32) {
                    return false;
                }
                c.commit(b as u32).unwrap();
            }
            c.is_accepting()
        };
        assert!(accepts("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"));
        assert!(accepts(
            "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"
        ));
        assert!(!accepts("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"), "city is required");
        assert!(!accepts("<tool_call>\n{\"name\": \"other\""));
        assert!(!accepts("Sure! <tool_call>"));
        let single = CallLayout { parallel: false, ..layout };
        let g1 = tool_call_grammar(&single, &[("now", &empty)]);
        let mut c = comp.compile(&ResponseFormat::Compiled(g1)).unwrap().unwrap();
        for b in "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>".bytes() {
            c.compute_mask().unwrap();
            assert!(c.mask().unwrap().is_allowed(b as u32));
            c.commit(b as u32).unwrap();
        }
        c.compute_mask().unwrap();
        assert!(c.mask().unwrap().is_allowed(eos));
        assert!(!c.mask().unwrap().is_allowed(b'\n' as u32), "one call only");

        // Parameters with `$defs` and references to them (Pydantic's shape), and to their root.
        let pydantic = json!({
            "$defs": { "City": { "type": "object", "properties": { "name": { "type": "string", "enum": ["Paris"] } }, "required": ["name"], "additionalProperties": false } },
            "type": "object",
            "properties": { "city": { "$ref": "#/$defs/City" }, "next": { "anyOf": [{ "$ref": "#" }, { "type": "null" }] }, "note": { "const": { "$ref": "#/x" } } },
            "required": ["city", "next"],
            "additionalProperties": false,
        });
        let g = tool_call_grammar(&single, &[("trip", &pydantic)]);
        let accepts = |text: &str| {
            let mut c = comp.compile(&ResponseFormat::Compiled(g.clone())).unwrap().unwrap();
            text.bytes().all(|b| {
                c.compute_mask().unwrap();
                c.mask().unwrap().is_allowed(b as u32) && c.commit(b as u32).is_ok()
            }) && c.is_accepting()
        };
        let call = |args: &str| format!("<tool_call>\n{{\"name\": \"trip\", \"arguments\": {args}}}\n</tool_call>");
        assert!(accepts(&call(r#"{"city": {"name": "Paris"}, "next": null}"#)));
        assert!(accepts(&call(r#"{"city": {"name": "Paris"}, "next": {"city": {"name": "Paris"}, "next": null}}"#)));
        assert!(!accepts(&call(r#"{"city": {"name": "Rome"}, "next": null}"#)));
    }
}
