//! Gemma 4 shaped like its 26B-A4B model (`attention_k_eq_v` and `enable_moe_block`) against HF
//! transformers and PEFT on `gemma4-moe-tiny` (`scripts/gen_gemma4_moe_fixture.py`): the full
//! layer takes its values from its key projection (one KV head there, two on the sliding layers),
//! and every layer runs a routed FFN of 8 MoE experts (top 2, a scaled-norm router with per-expert
//! scales) beside its MLP; from safetensors (experts stacked, as transformers 5 saves them) and
//! from the GGUF as llama.cpp's converter writes it (no `attn_v` on the full layer,
//! `ffn_gate_up_exps`, the router's scales as `….scale` tensors).

use crate::common::{fixture, greedy_decode, ids, load, read_json};
use crate::experts::{check_case_in, F32_TOL as PEFT_TOL};
use crate::parity::{check_reference, hf_half_gap, BF16_TOL, F16_TOL, F32_TOL};
use expert_runtime::engine::LoadOptions;
use serde_json::Value;

const NAME: &str = "gemma4-moe-tiny";

fn reference() -> Value {
    read_json(&fixture(NAME).join("reference.json"))
}

#[test]
fn gemma4_moe_f32_bf16_f16_from_safetensors_and_gguf() {
    let r = reference();
    check_reference(&fixture(NAME), NAME, &r, "f32", "f32", F32_TOL, false);
    check_reference(&fixture(NAME), NAME, &r, "bf16", "bf16", BF16_TOL.max(2.0 * hf_half_gap(&r, "bf16")), false);
    check_reference(&fixture(NAME), NAME, &r, "f16", "f16", F16_TOL.max(2.0 * hf_half_gap(&r, "f16")), false);
    check_reference(&fixture(NAME).join("model-f32.gguf"), NAME, &r, "f32", "f32", F32_TOL, false);
}

/// Each part of the block shows: HF's greedy run without the MoE experts' branch, without the
/// MLP's, with the per-expert or router scales at 1, or with one MoE expert per token, gives other
/// tokens. Our free-running decode of the GGUF gives llama.cpp's tokens on that file.
#[test]
fn gemma4_moe_each_part_is_visible_and_llama_cpp_agrees() {
    let r = reference();
    let want = ids(&Value::Array(r["f32"]["steps"].as_array().unwrap().iter().map(|s| s["token"].clone()).collect()));
    for k in ["moe_off", "dense_mlp_off", "per_expert_scale_1", "router_scale_1", "top1"] {
        assert_ne!(ids(&r["ablations"]["f32"][k]["tokens"]), want, "{k}");
    }
    let model = load(&fixture(NAME).join("model-f32.gguf"), &LoadOptions::default());
    let llama = ids(&r["llamacpp"]["tokens"]);
    assert_eq!(greedy_decode(&model, &ids(&r["prompt_ids"]), llama.len()), llama);
}

/// LoRA, DoRA and IA³ on the attention projections (the full layer has no v_proj) and the dense
/// MLP against PEFT, on the safetensors and on the GGUF.
#[test]
fn gemma4_moe_experts_match_peft() {
    let dir = fixture(NAME).join("experts");
    let r = read_json(&dir.join("reference.json"));
    for case in ["base", "lora", "dora", "ia3"] {
        check_case_in(&r, &dir, case, &fixture(NAME), false, PEFT_TOL);
        check_case_in(&r, &dir, case, &fixture(NAME).join("model-f32.gguf"), false, PEFT_TOL);
    }
}
