//! A response format from a request (`GrammarCompiler::compile`, then masks and commits): it must
//! always return, ok or error, within llguidance's fuel, and a compiled constraint must keep
//! producing masks (or stop) for every token it allows.
//!
//! Input layout: one kind byte (0 JSON schema, 1 regex, 2 Lark grammar, 3 forced tool call
//! whose parameters are the JSON; a JSON text goes through `json_schema::prepare` first, strict
//! when the byte's bit 2 is clear), then the format text. The vocabulary is the 256 single
//! bytes, a few JSON-ish words and an end-of-sequence token; the tokens fed back are the
//! allowed ids chosen round-robin by the input's own bytes.

#![no_main]

mod common;

use expert_runtime::sampling::constraint::{GrammarCompiler, ResponseFormat, TokenVocab};
use expert_runtime::sampling::json_schema;
use expert_runtime::sampling::tool_grammar::{tool_call_grammar, CallLayout};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn compiler() -> &'static GrammarCompiler {
    static C: OnceLock<GrammarCompiler> = OnceLock::new();
    C.get_or_init(|| {
        let mut bytes: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        for w in ["{\"", "\": ", ", ", "true", "false", "null", "\"}", "<tool_call>"] {
            bytes.push(w.as_bytes().to_vec());
        }
        bytes.push(b"\xff<eos>".to_vec());
        let eos = bytes.len() as u32 - 1;
        let tokenize = Box::new(|s: &[u8]| s.iter().map(|&b| b as u32).collect());
        GrammarCompiler::new(TokenVocab { bytes, eos: vec![eos], tokenize }).expect("the fuzz vocabulary builds")
    })
}

fuzz_target!(init: common::report_panics_once(), |data: &[u8]| common::on_untrusted_stack(|| run(data)));

fn run(data: &[u8]) {
    let Some((&kind, rest)) = data.split_first() else { return };
    let Some(text) = common::text(rest) else { return };
    let format = match kind % 4 {
        0 | 3 => match serde_json::from_str::<serde_json::Value>(text).map(|v| json_schema::prepare(v, kind & 4 == 0)) {
            Ok(Err(_)) => return,
            Ok(Ok(schema)) if kind % 4 == 0 => ResponseFormat::JsonSchema { schema },
            Ok(Ok(params)) => {
                let layout = CallLayout { open: "<tool_call>\n", close: "\n</tool_call>", separator: "\n", args_key: "arguments", parallel: true };
                ResponseFormat::Compiled(tool_call_grammar(&layout, &[("f", &params)]))
            }
            Err(_) => return,
        },
        1 => ResponseFormat::Regex(text.to_string()),
        _ => ResponseFormat::Grammar(text.to_string()),
    };
    let compiled = compiler().compile(&format);
    common::show("compile", &compiled);
    let Ok(Some(mut c)) = compiled else { return };
    for step in 0..64 {
        if c.compute_mask().is_err() {
            return;
        }
        let Some(mask) = c.mask() else { return };
        let allowed = mask.to_list();
        let Some(&first) = allowed.first() else { return };
        let pick = allowed.get(rest.get(step).copied().unwrap_or(0) as usize % allowed.len()).copied().unwrap_or(first);
        match c.commit(pick) {
            Ok(true) | Err(_) => return,
            Ok(false) => {}
        }
    }
}
