//! Granite 3 (`granite`: Llama's network with embedding, residual and attention multipliers and
//! a logit divisor) against HF transformers and PEFT on `granite-tiny`
//! (`scripts/gen_granite_fixtures.py`), from its safetensors and from its GGUF as llama.cpp
//! writes one (`granite`, Q/K rows permuted, the multipliers as `granite.*_scale` keys).

use crate::common::{fixture, greedy_decode, ids, load, read_json};
use crate::experts::{check_case_in, F32_TOL as PEFT_TOL};
use crate::parity::{check_reference, hf_half_gap, BF16_TOL, F16_TOL, F32_TOL};
use expert_runtime::engine::LoadOptions;
use serde_json::Value;

const NAME: &str = "granite-tiny";

fn reference() -> Value {
    read_json(&fixture(NAME).join("reference.json"))
}

#[test]
fn granite_f32_from_safetensors_and_gguf() {
    let r = reference();
    check_reference(&fixture(NAME), NAME, &r, "f32", "f32", F32_TOL, false);
    check_reference(&fixture(NAME).join("model-f32.gguf"), NAME, &r, "f32", "f32", F32_TOL, false);
}

#[test]
fn granite_bf16_and_f16() {
    let r = reference();
    check_reference(&fixture(NAME), NAME, &r, "bf16", "bf16", BF16_TOL.max(2.0 * hf_half_gap(&r, "bf16")), false);
    check_reference(&fixture(NAME), NAME, &r, "f16", "f16", F16_TOL.max(2.0 * hf_half_gap(&r, "f16")), false);
}

/// Each multiplier shows in the fixture: HF's greedy run with any of the first three at its
/// neutral value gives other tokens, and without the logit divisor (monotone: same tokens)
/// other logprobs. Our free-running decode of the GGUF gives llama.cpp's tokens on that file.
#[test]
fn granite_each_multiplier_is_visible_and_llama_cpp_agrees() {
    let r = reference();
    let steps = r["f32"]["steps"].as_array().unwrap();
    let want: Vec<u32> = steps.iter().map(|s| s["token"].as_u64().unwrap() as u32).collect();
    for (k, a) in r["ablations"]["f32"].as_object().unwrap() {
        let toks = ids(&a["tokens"]);
        if k == "logits_scaling" {
            assert_eq!(toks, want);
            let moved = a["logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .zip(steps)
                .any(|(x, s)| (x.as_f64().unwrap() - s["logprob"].as_f64().unwrap()).abs() >= 0.01);
            assert!(moved, "{k}");
        } else {
            assert_ne!(toks, want, "{k}");
        }
    }
    let model = load(&fixture(NAME).join("model-f32.gguf"), &LoadOptions::default());
    assert_eq!(greedy_decode(&model, &ids(&r["prompt_ids"]), want.len()), ids(&r["llamacpp"]["tokens"]));
}

/// LoRA, DoRA and IA³ on all seven projections and prompt tuning (whose virtual tokens Granite's
/// embedding multiplier scales) against PEFT, on the safetensors and on the GGUF.
#[test]
fn granite_experts_match_peft() {
    let dir = fixture(NAME).join("experts");
    let r = read_json(&dir.join("reference.json"));
    for case in ["base", "lora", "dora", "ia3", "prompt"] {
        check_case_in(&r, &dir, case, &fixture(NAME), false, PEFT_TOL);
        check_case_in(&r, &dir, case, &fixture(NAME).join("model-f32.gguf"), false, PEFT_TOL);
    }
}
