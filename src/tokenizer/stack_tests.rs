//! A tokenizer.json comes from a model directory we do not trust: its normalizers and
//! pre-tokenizers nest (within serde_json's depth limit) and carry regexes that Oniguruma
//! parses by recursion (within its parse-depth limit). The deepest ones those limits let
//! through load and tokenize within a quarter of the stack of the threads that do it
//! ([`crate::stack::UNTRUSTED_STACK`]); deeper ones fail with an error.

use std::path::PathBuf;

use serde_json::{json, Value};

use super::Tokenizer;
use crate::stack::{peak_use, UNTRUSTED_STACK};

fn fixture() -> Value {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("__test__/fixtures/qwen3-tiny/tokenizer.json");
    serde_json::from_str(&std::fs::read_to_string(dir).unwrap()).unwrap()
}

/// Loads `tokenizer` from a directory of its own and tokenizes a short text, measuring the
/// stack both use.
fn load_and_encode(what: &str, tokenizer: Value) -> (Result<Vec<u32>, String>, usize) {
    let dir = std::env::temp_dir().join(format!("expert-runtime-stack-{}-{what}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let d = dir.clone();
    let out = peak_use(UNTRUSTED_STACK, move || Tokenizer::from_dir(&d)?.encode("((((a)))) deep text", false));
    std::fs::remove_dir_all(&dir).unwrap();
    out
}

#[test]
fn the_deepest_tokenizers_fit_the_stack_and_deeper_ones_fail() {
    let deep_regex = |n: usize| format!("{}a{}", "(".repeat(n), ")".repeat(n));
    let mut cases: Vec<(&str, Value)> = Vec::new();
    for (what, n) in [("split-4000", 4000), ("split-50000", 50_000)] {
        let mut t = fixture();
        t["pre_tokenizer"] =
            json!({ "type": "Split", "pattern": { "Regex": deep_regex(n) }, "behavior": "Isolated", "invert": false });
        cases.push((what, t));
    }
    let mut t = fixture();
    t["normalizer"] = json!({ "type": "Replace", "pattern": { "Regex": deep_regex(4000) }, "content": "b" });
    cases.push(("replace-4000", t));
    // Sequences of sequences, as deep as serde_json's nesting limit allows (and past it).
    for (what, n) in [("sequence-60", 60), ("sequence-1000", 1000)] {
        let mut t = fixture();
        t["normalizer"] =
            (0..n).fold(json!({ "type": "Lowercase" }), |inner, _| json!({ "type": "Sequence", "normalizers": [inner] }));
        cases.push((what, t));
    }
    for (what, t) in cases {
        let (out, used) = load_and_encode(what, t);
        assert!(used < UNTRUSTED_STACK / 4, "{what}: {used} bytes of stack");
        if what.ends_with("50000") || what.ends_with("1000") {
            assert!(out.is_err(), "{what} should be refused");
        }
    }
}
