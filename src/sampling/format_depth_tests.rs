use serde_json::{json, Value};

use super::*;
use crate::sampling::constraint::{Constraint, GrammarCompiler, ResponseFormat, TokenVocab};

/// `$defs` a0 … a(n-1), each `wrap`ping a reference to the next; the last is a string.
fn ref_chain(n: usize, wrap: impl Fn(Value) -> Value) -> Value {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        let next = if i + 1 < n { json!({ "$ref": format!("#/$defs/a{}", i + 1) }) } else { json!({ "type": "string" }) };
        defs.insert(format!("a{i}"), if i + 1 < n { wrap(next) } else { next });
    }
    json!({ "$defs": defs, "$ref": "#/$defs/a0" })
}

/// Nested `n` deep through `key` (`items`, `not`, …).
fn nested(n: usize, wrap: impl Fn(Value) -> Value) -> Value {
    (0..n).fold(json!({ "type": "integer" }), |inner, _| wrap(inner))
}

fn rule_chain(n: usize, body: impl Fn(usize) -> String) -> String {
    let mut g = String::from("start: r0\n");
    for i in 0..n {
        g.push_str(&format!("r{i}: {}\n", if i + 1 < n { body(i + 1) } else { "\"x\"".into() }));
    }
    g
}

#[test]
fn real_schemas_measure_small() {
    // A Pydantic-style schema: models in $defs, referenced from properties and lists.
    let pydantic = json!({
        "$defs": {
            "Address": { "type": "object", "properties": { "street": { "type": "string" }, "zip": { "type": "string" } } },
            "Person": { "type": "object", "properties": {
                "name": { "type": "string" },
                "address": { "$ref": "#/$defs/Address" },
                "friends": { "type": "array", "items": { "$ref": "#/$defs/Person" } },
            } },
        },
        "type": "object",
        "properties": { "people": { "type": "array", "items": { "$ref": "#/$defs/Person" } } },
    });
    let d = schema_depth(&pydantic);
    assert!((4..40).contains(&d), "{d}");
    assert_eq!(schema_depth(&json!(true)), 0);
    assert_eq!(schema_depth(&json!({})), 1);
    assert_eq!(schema_depth(&json!({ "type": "object", "properties": { "a": { "type": "string" } } })), 3);
}

#[test]
fn reference_chains_count_every_link() {
    let d = schema_depth(&ref_chain(650, |r| r));
    assert!(d >= 650, "{d}");
    // A cycle counts each member once, however often it is entered.
    let cycle = json!({ "$defs": { "a": { "$ref": "#/$defs/b" }, "b": { "anyOf": [{ "$ref": "#/$defs/a" }, { "type": "null" }] } }, "$ref": "#/$defs/a" });
    let d = schema_depth(&cycle);
    assert!((3..12).contains(&d), "{d}");
    // Escaped and percent-encoded pointers resolve; a pointer to nowhere adds nothing.
    let escaped = json!({ "$defs": { "a/b~c": { "$ref": "#/$defs/d%20e" }, "d e": nested(50, |i| json!({ "not": i })) }, "$ref": "#/$defs/a~1b~0c" });
    assert!(schema_depth(&escaped) >= 50);
    assert!(schema_depth(&json!({ "$ref": "#/$defs/missing" })) < 3);
}

#[test]
fn references_through_ids_and_anchors_count_conservatively() {
    let mut defs = serde_json::Map::new();
    for i in 0..300 {
        defs.insert(
            format!("a{i}"),
            json!({ "$id": format!("urn:a{i}"), "$anchor": format!("x{i}"), "$ref": format!("urn:a{}#x{}", i + 1, i + 1) }),
        );
    }
    assert!(schema_depth(&json!({ "$defs": defs, "$ref": "urn:a0" })) >= 300);
}

#[test]
fn lark_rule_and_token_chains_count_every_link() {
    assert!(lark_depth(&rule_chain(800, |k| format!("r{k}"))) >= 800);
    let mut tokens = String::from("start: T0\n");
    for i in 0..800 {
        tokens.push_str(&format!("T{i}: {}\n", if i + 1 < 800 { format!("T{}", i + 1) } else { "\"x\"".into() }));
    }
    assert!(lark_depth(&tokens) >= 800);
    // Recursion through one rule is one level; strings, regexes and comments name nothing.
    let g = "start: expr\nexpr: expr \"+\" term | term  // r9 r10\nterm: /[0-9]+/ | \"(\" expr \")\" | \"r3 r4\"\n";
    let d = lark_depth(g);
    assert!((2..10).contains(&d), "{d}");
    // An embedded JSON schema adds its depth.
    let embedded = format!("start: %json {}\n", ref_chain(300, |r| r));
    assert!(lark_depth(&embedded) >= 300);
    // Definitions with priorities, attributes and modifiers are found.
    let g = "?start: a\n!a.2: b\nb[max_tokens=5]: c\nc: \"x\"\n%import common.NUMBER\n";
    assert!(lark_depth(g) >= 4);
}

fn vocab() -> TokenVocab {
    let mut bytes: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    bytes.push(b"\xff<eos>".to_vec());
    TokenVocab { bytes, eos: vec![256], tokenize: Box::new(|s: &[u8]| s.iter().map(|&b| b as u32).collect()) }
}

/// Compiles `format` on a thread with the untrusted stack and then takes a few steps of the
/// constraint on one with a 2 MiB stack (as the engine's workers have), and fails when either
/// touched more than a quarter of its stack. Returns the compile result.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn compile_within_stack(what: &str, format: ResponseFormat) -> Result<(), String> {
    use crate::stack::{peak_use, UNTRUSTED_STACK};
    let (made, used) = peak_use(UNTRUSTED_STACK, move || GrammarCompiler::new(vocab()).unwrap().compile(&format));
    assert!(used < UNTRUSTED_STACK / 4, "{what}: compiling used {used} bytes of stack");
    let Some(mut c): Option<Constraint> = made? else { return Ok(()) };
    let (_, used) = peak_use(2 << 20, move || {
        for _ in 0..8 {
            c.compute_mask().unwrap();
            let Some(t) = c.mask().and_then(|m| (0..256u32).find(|&t| m.is_allowed(t))) else { break };
            if c.commit(t).unwrap() {
                break;
            }
        }
    });
    assert!(used < (2 << 20) / 4, "{what}: decoding used {used} bytes of stack");
    Ok(())
}

/// Every shape of deep format, as deep as the bound lets it be: compiled within a quarter of
/// the stack; twice as deep: refused before compiling.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn the_deepest_accepted_formats_fit_the_stack() {
    type Shape = (&'static str, usize, fn(usize) -> ResponseFormat);
    let shapes: Vec<Shape> = vec![
        ("$ref chain", 1, |n| ResponseFormat::JsonSchema { schema: ref_chain(n, |r| r) }),
        ("$ref with a sibling type", 1, |n| ResponseFormat::JsonSchema {
            schema: ref_chain(n, |r| json!({ "$ref": r["$ref"], "type": "string" })),
        }),
        ("anyOf of $ref", 3, |n| ResponseFormat::JsonSchema {
            schema: ref_chain(n, |r| json!({ "anyOf": [r, { "type": "null" }] })),
        }),
        ("allOf of $ref", 3, |n| ResponseFormat::JsonSchema {
            schema: ref_chain(n, |r| json!({ "allOf": [r, { "type": "string" }] })),
        }),
        ("property of $ref", 3, |n| ResponseFormat::JsonSchema {
            schema: ref_chain(n, |r| json!({ "type": "object", "properties": { "x": r }, "required": ["x"] })),
        }),
        ("items", 1, |n| ResponseFormat::JsonSchema {
            schema: nested(n, |i| json!({ "type": "array", "items": i, "maxItems": 1 })),
        }),
        ("properties", 2, |n| ResponseFormat::JsonSchema {
            schema: nested(n, |i| json!({ "type": "object", "properties": { "x": i } })),
        }),
        ("anyOf", 2, |n| ResponseFormat::JsonSchema { schema: nested(n, |i| json!({ "anyOf": [i, { "type": "null" }] })) }),
        ("rule chain", 1, |n| ResponseFormat::Grammar(rule_chain(n, |k| format!("r{k}")))),
        ("rule chain in brackets", 3, |n| ResponseFormat::Grammar(rule_chain(n, |k| format!("\"a\" (\"b\" [r{k}])")))),
        ("token chain", 1, |n| {
            let mut g = String::from("start: T0\n");
            for i in 0..n {
                g.push_str(&format!("T{i}: {}\n", if i + 1 < n { format!("\"a\" T{}", i + 1) } else { "\"x\"".into() }));
            }
            ResponseFormat::Grammar(g)
        }),
    ];
    for (what, per_link, make) in shapes {
        let n = MAX_FORMAT_DEPTH / per_link - 4;
        let depth = match make(n) {
            ResponseFormat::JsonSchema { schema } => schema_depth(&schema),
            ResponseFormat::Grammar(g) => lark_depth(&g),
            _ => unreachable!(),
        };
        assert!(depth <= MAX_FORMAT_DEPTH && depth + 4 * per_link + 8 >= MAX_FORMAT_DEPTH, "{what}: {n} links measure {depth}");
        // Accepted (compiled, or refused by llguidance for its own reasons), within the stack.
        let _ = compile_within_stack(what, make(n));
        let e = compile_within_stack(what, make(2 * n)).expect_err(what);
        assert!(e.contains("nests too deeply"), "{what}: {e}");
    }
}
