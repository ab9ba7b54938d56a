//! A model's answer through the tool-call splitter (`ToolStream::push` / `finish`), in pieces:
//! it must never panic, an answer with no call comes back as exactly its text (less, when it
//! was cut off, a last piece that starts the call marker), a call cut off is dropped, and
//! every call it reports names a declared tool with
//! a JSON object as arguments, none repeating another.
//!
//! Input layout: one byte choosing the syntax (bit 0 clear: Hermes, set: Llama 3 JSON) and
//! whether the answer was cut off at maxTokens (bit 1), then the answer's text; 0x00 bytes
//! split it into the pieces fed one at a time.

#![no_main]

mod common;

use expert_runtime::tokenizer::tools::{ToolOutcome, ToolStream, HERMES, LLAMA3_JSON};
use expert_runtime::tokenizer::ToolSpec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(init: common::report_panics_once(), |data: &[u8]| {
    let Some((&syntax, rest)) = data.split_first() else { return };
    let Some(text) = common::text(rest) else { return };
    let cut_off = syntax & 2 != 0;
    let syntax = if syntax % 2 == 0 { &HERMES } else { &LLAMA3_JSON };
    let tools: Vec<ToolSpec> = ["get_weather", "f"]
        .iter()
        .map(|n| ToolSpec { name: n.to_string(), description: None, parameters: serde_json::json!({ "type": "object" }), strict: None })
        .collect();
    let mut s = ToolStream::new(syntax, &tools);
    let mut out = String::new();
    let mut announced = 0;
    for piece in text.split('\0') {
        let (t, deltas) = s.push(piece);
        out.push_str(&t);
        for d in deltas {
            if d.id.is_some() {
                assert_eq!(d.index, announced, "calls are announced in order");
                announced += 1;
            }
            assert!(d.index < announced.max(1), "a delta for a call never announced");
        }
    }
    let (t, outcome) = s.finish(cut_off);
    out.push_str(&t);
    let whole: String = text.split('\0').collect();
    match outcome {
        ToolOutcome::Text if !cut_off => assert_eq!(out, whole, "an answer without calls comes back whole"),
        ToolOutcome::Text => {
            let dropped = whole.strip_prefix(out.as_str()).expect("what comes back starts the answer");
            assert!(dropped.is_empty() || syntax.open.trim().starts_with(dropped.trim_start()), "only a marker start is dropped: {dropped:?}");
        }
        ToolOutcome::Calls(calls) => {
            let mut seen = Vec::new();
            for c in calls {
                assert!(tools.iter().any(|t| t.name == c.name));
                let v: serde_json::Value = serde_json::from_str(&c.arguments).expect("arguments are JSON");
                assert!(v.is_object());
                assert!(!seen.contains(&(c.name.clone(), v.clone())), "a repeated call is never reported");
                seen.push((c.name, v));
            }
        }
        // A complete malformed call comes back as text (with the text around it, in the order it
        // was released); one cut off is dropped.
        ToolOutcome::Malformed => assert!(out.len() <= whole.len(), "nothing is added to the answer"),
    }
});
