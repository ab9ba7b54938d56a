//! Embeddings (`Engine::embed`) against HF transformers' `last_hidden_state`, pooled the same
//! way (`__test__/fixtures/embeddings.json`, from `scripts/gen_embedding_refs.py`), through the
//! engine's batched passes: several texts of different lengths in one call equal each alone,
//! and an embedding under a LoRA equals PEFT's.

use std::sync::Arc;

use crate::common::{fixture, ids, read_json};
use expert_runtime::engine::{EmbedOptions, Engine, LoadOptions, Pooling};
use expert_runtime::experts::ExpertLoadOptions;
use serde_json::Value;

fn engine(model: &str) -> Arc<Engine> {
    let opts = LoadOptions { dtype: Some("f32".into()), device: Some("cpu".into()), ..Default::default() };
    Engine::load_blocking(&fixture(model), opts).unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn opts(pooling: Pooling, experts: &[&str]) -> EmbedOptions {
    EmbedOptions { pooling, normalize: false, experts: experts.iter().map(|s| s.to_string()).collect() }
}

/// Checks `engine`'s embeddings of `cases` (the fixture's texts) under `experts`.
fn check(engine: &Engine, cases: &[Value], experts: &[&str], what: &str) {
    let texts: Vec<String> = cases.iter().map(|c| c["text"].as_str().unwrap().to_string()).collect();
    let tok = engine.tokenizer().unwrap();
    for (t, c) in texts.iter().zip(cases) {
        assert_eq!(tok.encode_text(t, true, false).unwrap(), ids(&c["ids"]), "{what}: token ids of {t:?}");
    }
    for (pooling, field) in [(Pooling::Mean, "mean"), (Pooling::Last, "last")] {
        let batch = engine.embed_blocking(texts.clone(), opts(pooling, experts)).unwrap();
        assert_eq!(batch.len(), texts.len());
        for (i, c) in cases.iter().enumerate() {
            let want = floats(&c[field]);
            let d = max_diff(&batch[i], &want);
            assert!(d <= 1e-4, "{what} {field} text {i}: max |Δ| {d} vs HF");
            let alone = engine.embed_blocking(vec![texts[i].clone()], opts(pooling, experts)).unwrap();
            let d = max_diff(&alone[0], &batch[i]);
            assert!(d <= 1e-5, "{what} {field} text {i}: alone vs in a batch differ by {d}");
        }
    }
    // Normalized: the same direction at unit length.
    let unit = engine.embed_blocking(texts.clone(), EmbedOptions { normalize: true, ..opts(Pooling::Mean, experts) }).unwrap();
    for (v, c) in unit.iter().zip(cases) {
        let raw = floats(&c["mean"]);
        let n = raw.iter().map(|x| x * x).sum::<f32>().sqrt();
        let want: Vec<f32> = raw.iter().map(|x| x / n).collect();
        assert!(max_diff(v, &want) <= 1e-5, "{what}: normalized");
    }
}

#[test]
fn embeddings_equal_hf_last_hidden_state_pooled() {
    let refs = read_json(&fixture("embeddings.json"));
    let models = refs["models"].as_object().unwrap();
    assert_eq!(models.len(), 3, "all three families");
    for (name, m) in models {
        let e = engine(name);
        assert_eq!(e.info.hidden_size as u64, m["hidden_size"].as_u64().unwrap());
        check(&e, m["texts"].as_array().unwrap(), &[], name);
    }
}

#[test]
fn embeddings_under_an_expert_equal_peft() {
    let refs = read_json(&fixture("embeddings.json"));
    let a = &refs["adapters"]["lora"];
    let e = engine(a["base"].as_str().unwrap());
    e.load_expert_blocking(&fixture("adapters/lora"), ExpertLoadOptions { name: Some("l".into()), ..Default::default() })
        .unwrap();
    check(&e, a["texts"].as_array().unwrap(), &["l"], "lora");
}

#[test]
fn embeddings_run_beside_generation_and_refuse_bad_input() {
    let e = engine("qwen3-tiny");
    // While a session decodes, an embedding is rows of the same passes; both finish.
    let s = e.create_session(None, Default::default()).unwrap();
    let opts_gen = expert_runtime::engine::GenerateOptions { max_tokens: Some(40), ..Default::default() };
    let mut g = e.generate(&s, expert_runtime::engine::Input::Text("hello there".into()), opts_gen).unwrap();
    let v = e.embed_blocking(vec!["one".into(), "two words".into()], opts(Pooling::Mean, &[])).unwrap();
    assert_eq!(v.len(), 2);
    let mut tokens = 0;
    while let Some(ev) = g.events.blocking_recv() {
        match ev {
            expert_runtime::engine::Event::Token(_) => tokens += 1,
            expert_runtime::engine::Event::Done(_) => break,
            expert_runtime::engine::Event::Error(err) => panic!("{err}"),
        }
    }
    assert_eq!(tokens, 40);

    assert!(e.embed_blocking(Vec::new(), opts(Pooling::Mean, &[])).unwrap().is_empty());
    let err = |texts: Vec<String>, o: EmbedOptions| e.embed_blocking(texts, o).unwrap_err().code();
    assert_eq!(err(vec!["a".into(), String::new()], opts(Pooling::Mean, &[])), "INVALID_ARGUMENT", "an empty text");
    assert_eq!(err(vec!["a".into()], opts(Pooling::Mean, &["nope"])), "EXPERT_NOT_FOUND");
    let long = "word ".repeat(e.info.context_length);
    assert_eq!(err(vec![long], opts(Pooling::Mean, &[])), "CONTEXT_OVERFLOW");
    // The engine is still healthy.
    assert_eq!(e.embed_blocking(vec!["again".into()], opts(Pooling::Last, &[])).unwrap().len(), 1);
}
