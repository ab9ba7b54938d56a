//! Gemma 3 (`gemma3_text`) against HF transformers on `gemma3-tiny`
//! (`scripts/gen_gemma3_fixtures.py`): four layers, sliding (window 8) and full with their own
//! rotary bases, q/k norms, `query_pre_attn_scalar`, sandwich norms applied as `1 + w`, a
//! GELU-tanh MLP, √hidden embeddings and soft-capped logits. The 25-token prompt and its 16
//! new tokens run far past the window; the short prompt never leaves it.

use crate::common::{argmax, fixture, ids, load, log_softmax, read_json};
use crate::parity::{check_reference, BF16_TOL, F16_TOL, F32_TOL};
use expert_runtime::engine::LoadOptions;
use expert_runtime::model::decoder::Logits;
use serde_json::Value;

const NAME: &str = "gemma3-tiny";

fn reference() -> Value {
    read_json(&fixture(NAME).join("reference.json"))
}

#[test]
fn gemma3_f32_past_the_window() {
    check_reference(&fixture(NAME), NAME, &reference(), "f32", "f32", F32_TOL, false);
}

#[test]
fn gemma3_f32_within_the_window() {
    check_reference(&fixture(NAME), NAME, &reference()["prompt_short"], "f32", "f32", F32_TOL, false);
}

/// bf16 and f16 run the generic attention path (the fused kernel takes f32 queries), windows
/// included.
#[test]
fn gemma3_bf16_and_f16() {
    check_reference(&fixture(NAME), NAME, &reference(), "bf16", "bf16", BF16_TOL, false);
    check_reference(&fixture(NAME), NAME, &reference(), "f16", "f16", F16_TOL, false);
}

/// The prompt's last position, prefilled in one pass: every logprob of the vocabulary.
#[test]
fn gemma3_prefill_logprobs_over_the_vocabulary() {
    let r = reference();
    let model = load(&fixture(NAME), &LoadOptions::default());
    let mut cache = model.new_cache(64).unwrap();
    let logits: Vec<f32> = model.forward(&ids(&r["prompt_ids"]), &mut cache, Logits::Last).unwrap().to_vec1().unwrap();
    let lp = log_softmax(&logits);
    let want: Vec<f32> = r["f32"]["prefill_logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
    assert_eq!(lp.len(), want.len());
    let worst = lp.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst <= F32_TOL, "max |Δlogprob| over the vocabulary {worst}");
}

/// The fixture can tell each Gemma 3 feature from its absence: HF's greedy run of every wrong
/// variant (window ignored or off by one, the 1/√head_dim scale, no soft-cap, no embedding
/// scale, norms without the +1, the global base on local layers) differs from the reference
/// our decoder matches, in its tokens, or (the soft-cap, which keeps every argmax) in its
/// logprobs by at least 0.01. Our own free-running greedy decode gives the reference's tokens.
#[test]
fn gemma3_each_feature_is_visible_in_the_fixture() {
    let r = reference();
    let steps = r["f32"]["steps"].as_array().unwrap();
    let want: Vec<u32> = steps.iter().map(|s| s["token"].as_u64().unwrap() as u32).collect();
    let want_lp: Vec<f64> = steps.iter().map(|s| s["logprob"].as_f64().unwrap()).collect();
    let ablations = r["ablations"]["f32"].as_object().unwrap();
    assert_eq!(ablations.len(), 8);
    for (name, a) in ablations {
        let toks: Vec<u32> = a["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
        let lps = a["logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap());
        let moved = lps.zip(&want_lp).map(|(a, b)| (a - b).abs()).fold(0f64, f64::max);
        assert!(toks != want || moved >= 0.01, "{name}: indistinguishable from the reference");
    }
    let model = load(&fixture(NAME), &LoadOptions::default());
    let mut cache = model.new_cache(64).unwrap();
    let mut input = ids(&r["prompt_ids"]);
    let mut got = Vec::new();
    for _ in 0..want.len() {
        let logits: Vec<f32> = model.forward(&input, &mut cache, Logits::Last).unwrap().to_vec1().unwrap();
        let t = argmax(&log_softmax(&logits));
        got.push(t);
        input = vec![t];
    }
    assert_eq!(got, want);
}

/// A GGUF as llama.cpp's converter writes one (`gemma3-gguf-tiny`,
/// `scripts/gen_gemma3_gguf_fixture.py`): llama.cpp's fixed layout (every sixth layer full, a
/// local base of 10,000, scores scaled by 1/√head_dim) and norms stored as `1 + w`. Our decode
/// of the file follows HF past the window, over the whole vocabulary at the prefill, and gives
/// the greedy tokens llama.cpp gave on the same file.
#[test]
fn gemma3_gguf_as_llama_cpp_writes_it() {
    const GGUF_NAME: &str = "gemma3-gguf-tiny";
    let r = read_json(&fixture(GGUF_NAME).join("reference.json"));
    let path = fixture(GGUF_NAME).join("model-f32.gguf");
    check_reference(&path, GGUF_NAME, &r, "f32", "f32", F32_TOL, false);

    let model = load(&path, &LoadOptions::default());
    let mut cache = model.new_cache(64).unwrap();
    let mut input = ids(&r["prompt_ids"]);
    let mut tokens = Vec::new();
    for step in 0..r["llamacpp"]["tokens"].as_array().unwrap().len() {
        let lp = log_softmax(&model.forward(&input, &mut cache, Logits::Last).unwrap().to_vec1::<f32>().unwrap());
        if step == 0 {
            let want = r["f32"]["prefill_logprobs"].as_array().unwrap();
            assert_eq!(lp.len(), want.len());
            let worst = lp.iter().zip(want).map(|(a, b)| (a - b.as_f64().unwrap() as f32).abs()).fold(0f32, f32::max);
            assert!(worst <= F32_TOL, "prefill: max |Δlogprob| over the vocabulary {worst}");
        }
        tokens.push(argmax(&lp));
        input = vec![*tokens.last().unwrap()];
    }
    assert_eq!(tokens, ids(&r["llamacpp"]["tokens"]), "greedy tokens differ from llama.cpp's on the same file");
}
