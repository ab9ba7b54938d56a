use super::*;
use crate::sampling::{Sampler, SamplingParams};

/// A vocabulary of the 256 single bytes, a few multi-byte words and an EOS token.
fn vocab() -> TokenVocab {
    let mut bytes: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    for w in ["{\"", "\": ", ", ", "true", "false", "null", "name", "age"] {
        bytes.push(w.as_bytes().to_vec());
    }
    bytes.push(b"\xff<eos>".to_vec());
    let eos = bytes.len() as u32 - 1;
    // Model rows beyond the tokenizer's vocabulary.
    bytes.push(Vec::new());
    TokenVocab { bytes, eos: vec![eos], tokenize: Box::new(|s: &[u8]| s.iter().map(|&b| b as u32).collect()) }
}

fn compiler() -> GrammarCompiler {
    GrammarCompiler::new(vocab()).unwrap()
}

/// Samples under the constraint from seeded pseudo-random logits until it stops, EOS, or
/// `max` tokens; returns the bytes and whether it ended cleanly.
fn run(c: &mut Constraint, seed: u64, temperature: f32, max: usize) -> (Vec<u8>, bool) {
    let v = vocab();
    let eos = v.eos[0];
    let n = v.bytes.len();
    let mut sampler = Sampler::new(SamplingParams { temperature, seed: Some(seed), ..SamplingParams::default() }, n);
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut out = Vec::new();
    for _ in 0..max {
        let logits: Vec<f32> = (0..n)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 8.0
            })
            .collect();
        c.compute_mask().unwrap();
        let s = sampler.sample_masked(&logits, &[], c.mask());
        assert!(c.mask().unwrap().is_allowed(s.token), "sampled a token the mask forbids");
        if s.token == eos {
            return (out, true);
        }
        out.extend_from_slice(&v.bytes[s.token as usize]);
        if c.commit(s.token).unwrap() {
            return (out, true);
        }
    }
    (out, false)
}

#[test]
fn json_schema_output_parses_and_matches() {
    let schema = serde_json::json!({
        "type": "object",
        "properties": { "name": { "type": "string", "maxLength": 5 }, "age": { "type": "integer", "minimum": 0, "maximum": 99 } },
        "required": ["name", "age"],
        "additionalProperties": false
    });
    let comp = compiler();
    for seed in 0..8 {
        let mut c = comp.compile(&ResponseFormat::JsonSchema { schema: schema.clone() }).unwrap().unwrap();
        let (out, done) = run(&mut c, seed, 0.8, 200);
        assert!(done, "seed {seed}: did not finish: {:?}", String::from_utf8_lossy(&out));
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let obj = v.as_object().unwrap();
        assert_eq!(obj.len(), 2);
        assert!(obj["name"].as_str().unwrap().chars().count() <= 5);
        let age = obj["age"].as_i64().unwrap();
        assert!((0..=99).contains(&age), "{age}");
    }
}

#[test]
fn sampling_never_repeats_a_member_name_or_an_item_of_a_unique_array() {
    // Names "x" and "y" only, and a set of "a" / "b" / "c": random logits would repeat both.
    let schema = serde_json::json!({
        "type": "object",
        "properties": { "tags": { "type": "array", "items": { "enum": ["a", "b", "c"] }, "uniqueItems": true } },
        "required": ["tags"],
        "patternProperties": { "^[xy]$": { "type": "integer", "minimum": 0, "maximum": 9 } },
        "additionalProperties": false
    });
    let schema = crate::sampling::json_schema::prepare(schema, true).unwrap();
    let comp = compiler();
    let mut repeated_without_watch = 0;
    for seed in 0..64 {
        let mut c = comp.compile(&ResponseFormat::JsonSchema { schema: schema.clone() }).unwrap().unwrap();
        let (out, done) = run(&mut c, seed, 1.0, 300);
        let text = String::from_utf8(out).unwrap();
        assert!(done, "seed {seed}: did not finish: {text:?}");
        serde_json::from_str::<serde_json::Value>(&text).unwrap();
        for needle in ["\"x\"", "\"y\"", "\"tags\"", "\"a\"", "\"b\"", "\"c\""] {
            assert!(text.matches(needle).count() <= 1, "seed {seed}: {needle} twice in {text}");
        }
        // The same draws without the watch (shows the test can fail).
        let mut c = comp.compile(&ResponseFormat::JsonSchema { schema: schema.clone() }).unwrap().unwrap();
        c.watch = None;
        let (out, _) = run(&mut c, seed, 1.0, 300);
        let text = String::from_utf8(out).unwrap();
        repeated_without_watch += ["\"x\"", "\"a\"", "\"b\""].iter().any(|n| text.matches(n).count() > 1) as usize;
    }
    assert!(repeated_without_watch > 0);
}

#[test]
fn regex_and_lark_outputs_match() {
    let comp = compiler();
    let rx = regex::Regex::new(r"^[0-9]{3}-[a-z]{2,4}$").unwrap();
    for seed in 0..5 {
        let mut c = comp.compile(&ResponseFormat::Regex("[0-9]{3}-[a-z]{2,4}".into())).unwrap().unwrap();
        let (out, done) = run(&mut c, seed, 1.0, 50);
        assert!(done);
        assert!(rx.is_match(std::str::from_utf8(&out).unwrap()), "{:?}", String::from_utf8_lossy(&out));
    }
    let lark = "start: \"yes\" | \"no\" | \"maybe \" NUM\nNUM: /[1-9][0-9]?/";
    let maybe = regex::Regex::new("^maybe [1-9][0-9]?$").unwrap();
    for seed in 0..5 {
        let mut c = comp.compile(&ResponseFormat::Grammar(lark.into())).unwrap().unwrap();
        let (out, done) = run(&mut c, seed, 1.0, 50);
        assert!(done);
        let s = String::from_utf8(out).unwrap();
        assert!(s == "yes" || s == "no" || maybe.is_match(&s), "{s:?}");
    }
}

#[test]
fn eos_is_allowed_only_when_complete() {
    let comp = compiler();
    let eos = vocab().eos[0];
    let mut c = comp.compile(&ResponseFormat::Regex("ab+".into())).unwrap().unwrap();
    c.compute_mask().unwrap();
    assert!(!c.mask().unwrap().is_allowed(eos));
    assert!(c.mask().unwrap().is_allowed(b'a' as u32));
    assert!(!c.mask().unwrap().is_allowed(b'b' as u32));
    assert!(!c.commit(b'a' as u32).unwrap());
    assert!(!c.commit(b'b' as u32).unwrap());
    c.compute_mask().unwrap();
    assert!(c.mask().unwrap().is_allowed(eos));
    assert!(c.mask().unwrap().is_allowed(b'b' as u32));
    // The padded row past the tokenizer's vocabulary is never allowed.
    assert!(!c.mask().unwrap().is_allowed(eos + 1));
}

#[test]
fn bad_formats_fail_with_a_reason() {
    let comp = compiler();
    let err = |f: ResponseFormat| comp.compile(&f).expect_err("expected an error");
    assert!(err(ResponseFormat::Regex("(unclosed".into())).len() > 5);
    assert!(err(ResponseFormat::Grammar("start: undefined_rule".into())).contains("undefined_rule"));
    assert!(err(ResponseFormat::Grammar("   ".into())).contains("empty"));
    let e = err(ResponseFormat::JsonSchema { schema: serde_json::json!({ "type": "integer", "minimum": 5, "maximum": 1 }) });
    assert!(!e.is_empty());
    let e = err(ResponseFormat::JsonSchema { schema: serde_json::json!({ "$ref": "#/$defs/missing" }) });
    assert!(!e.is_empty());
    let big = "a".repeat(MAX_FORMAT_BYTES + 1);
    assert!(err(ResponseFormat::Regex(big)).contains("at most"));
    assert!(comp.compile(&ResponseFormat::Text).unwrap().is_none());
}

#[test]
fn apply_mask_clears_disallowed_and_out_of_range_ids() {
    let mut m = SimpleVob::alloc(40);
    m.allow_token(3);
    m.allow_token(33);
    let mut logits = vec![1.0f32; 70];
    apply_mask(&m, &mut logits);
    for (i, l) in logits.iter().enumerate() {
        assert_eq!(*l == 1.0, i == 3 || i == 33, "id {i}");
    }
}

#[test]
fn a_model_without_eos_cannot_be_constrained() {
    let mut v = vocab();
    v.eos.clear();
    assert!(GrammarCompiler::new(v).unwrap_err().contains("end-of-sequence"));
}
