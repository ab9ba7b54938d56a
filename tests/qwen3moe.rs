//! Qwen3-MoE (`qwen3_moe`: Qwen3's attention with routed FFN blocks of MoE experts) against HF
//! transformers and PEFT on `qwen3moe-tiny` (every layer routed, top-2 of 8, top-k weights
//! renormalised, untied head) and `qwen3moe-mixed-tiny` (one dense layer among routed ones, raw
//! top-k weights, tied head), both from `scripts/gen_qwen3moe_fixtures.py`; from safetensors in
//! the hub's per-expert layout, in transformers 5's stacked layout, and from the GGUF as
//! llama.cpp's converter writes it (`qwen3moe`, stacked `ffn_*_exps`).

use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

use crate::common::{fixture, greedy_decode, ids, load, read_json};
use crate::experts::{check_case_in, model, F32_TOL as PEFT_TOL};
use crate::parity::{check_reference, hf_half_gap, BF16_TOL, F16_TOL, F32_TOL};
use expert_runtime::engine::LoadOptions;
use expert_runtime::experts::{load_expert, ExpertLoadOptions};
use expert_runtime::model::decoder::Logits;
use serde_json::Value;

const NAME: &str = "qwen3moe-tiny";
const MIXED: &str = "qwen3moe-mixed-tiny";

fn reference(name: &str) -> Value {
    read_json(&fixture(name).join("reference.json"))
}

/// f32 and f16 on both fixtures; bf16 on the mixed one. In bf16 a routed model's answer can
/// jump: where two MoE experts' router probabilities are within bf16's rounding of each other, any
/// two correct bf16 implementations may pick differently. On `qwen3moe-tiny` ours does at step 8
/// (HF's bf16 logprob of its token -2.97, ours -4.18; every other step within 0.1 of HF's), so
/// its bf16 run is not compared here; f16's three more mantissa bits keep every pick (max
/// top-5 |Δlogprob| 0.024 and 0.016 against HF's f16).
#[test]
fn qwen3moe_f32_bf16_f16_from_safetensors_and_gguf() {
    for name in [NAME, MIXED] {
        let r = reference(name);
        check_reference(&fixture(name), name, &r, "f32", "f32", F32_TOL, false);
        check_reference(&fixture(name), name, &r, "f16", "f16", F16_TOL.max(2.0 * hf_half_gap(&r, "f16")), false);
    }
    let r = reference(MIXED);
    check_reference(&fixture(MIXED), MIXED, &r, "bf16", "bf16", BF16_TOL.max(2.0 * hf_half_gap(&r, "bf16")), false);
    let r = reference(NAME);
    check_reference(&fixture(NAME).join("model-f32.gguf"), NAME, &r, "f32", "f32", F32_TOL, false);
}

/// What the fixtures tell apart: HF's greedy run with the top-k weights normalised the other
/// way, or with one MoE expert per token instead of two, gives other tokens. Our free-running
/// decode of the GGUF gives llama.cpp's tokens on that file.
#[test]
fn qwen3moe_routing_is_visible_and_llama_cpp_agrees() {
    for (name, ablations) in [(NAME, &["norm_topk_prob", "top1"][..]), (MIXED, &["norm_topk_prob"][..])] {
        let r = reference(name);
        let want: Vec<u32> = r["f32"]["steps"].as_array().unwrap().iter().map(|s| s["token"].as_u64().unwrap() as u32).collect();
        for k in ablations {
            assert_ne!(ids(&r["ablations"]["f32"][k]["tokens"]), want, "{name}: {k}");
        }
    }
    let r = reference(NAME);
    let model = load(&fixture(NAME).join("model-f32.gguf"), &LoadOptions::default());
    let want = ids(&r["llamacpp"]["tokens"]);
    assert_eq!(greedy_decode(&model, &ids(&r["prompt_ids"]), want.len()), want);
}

/// `dir`'s model with its MoE experts rewritten in transformers 5's stacked layout
/// (`mlp.experts.gate_up_proj` `[E, 2I, H]`, each expert's gate rows then its up rows;
/// `mlp.experts.down_proj` `[E, H, I]`), in a directory of its own.
fn stacked_copy(dir: &Path, tag: &str) -> PathBuf {
    let out = std::env::temp_dir().join(format!("er-{tag}-stacked-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(dir.join(f), out.join(f)).unwrap();
    }
    let mut tensors = candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap();
    let layers: Vec<String> =
        tensors.keys().filter_map(|k| k.strip_suffix(".mlp.experts.0.gate_proj.weight").map(String::from)).collect();
    assert!(!layers.is_empty());
    for l in layers {
        let mut gate_up = Vec::new();
        let mut down = Vec::new();
        for e in 0.. {
            let key = |p: &str| format!("{l}.mlp.experts.{e}.{p}.weight");
            let Some(g) = tensors.remove(&key("gate_proj")) else { break };
            let u = tensors.remove(&key("up_proj")).unwrap();
            gate_up.push(Tensor::cat(&[g, u], 0).unwrap());
            down.push(tensors.remove(&key("down_proj")).unwrap());
        }
        tensors.insert(format!("{l}.mlp.experts.gate_up_proj"), Tensor::stack(&gate_up, 0).unwrap());
        tensors.insert(format!("{l}.mlp.experts.down_proj"), Tensor::stack(&down, 0).unwrap());
    }
    assert!(!tensors.keys().any(|k| k.contains(".experts.0.")));
    candle_core::safetensors::save(&tensors, out.join("model.safetensors")).unwrap();
    out
}

/// transformers 5's stacked layout gives the same logits, bit for bit, as the hub's per-expert
/// one (the same weights, cut into the same per-expert matrices).
#[test]
fn qwen3moe_stacked_expert_tensors_load_as_per_expert_ones() {
    for name in [NAME, MIXED] {
        let stacked = stacked_copy(&fixture(name), name);
        let prompt = ids(&reference(name)["prompt_ids"]);
        let logits = |path: &Path| -> Vec<f32> {
            let model = load(path, &LoadOptions::default());
            let mut cache = model.new_cache(64).unwrap();
            model.forward(&prompt, &mut cache, Logits::Last).unwrap().to_vec1().unwrap()
        };
        assert_eq!(logits(&stacked), logits(&fixture(name)), "{name}");
        std::fs::remove_dir_all(stacked).unwrap();
    }
}

/// LoRA, DoRA and IA³ on the attention projections (and the dense layer's MLP in the mixed
/// fixture) and prompt tuning against PEFT, on safetensors and GGUF. A LoRA on the MoE experts'
/// weights (PEFT's `target_parameters`) is refused by name, as are adapter tensors on them.
#[test]
fn qwen3moe_experts_match_peft_and_moe_expert_adapters_are_refused() {
    for name in [NAME, MIXED] {
        let dir = fixture(name).join("experts");
        let r = read_json(&dir.join("reference.json"));
        for case in ["base", "lora", "dora", "ia3", "prompt"] {
            check_case_in(&r, &dir, case, &fixture(name), false, PEFT_TOL);
            if name == NAME {
                check_case_in(&r, &dir, case, &fixture(name).join("model-f32.gguf"), false, PEFT_TOL);
            }
        }
    }
    let m = model(&fixture(NAME), false);
    let e = load_expert(&fixture(NAME).join("experts").join("lora-moe"), &ExpertLoadOptions::default(), &m, 1)
        .err()
        .expect("refused");
    assert_eq!(e.code(), "UNSUPPORTED_ADAPTER", "{e}");
    assert!(e.to_string().contains("target_parameters"), "{e}");

    // The same LoRA's tensors under a config without target_parameters: its tensors on the MoE
    // experts are refused by name.
    let dir = std::env::temp_dir().join(format!("er-qwen3moe-lora-moe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = fixture(NAME).join("experts").join("lora-moe");
    let mut cfg = read_json(&src.join("adapter_config.json"));
    cfg.as_object_mut().unwrap().remove("target_parameters");
    std::fs::write(dir.join("adapter_config.json"), cfg.to_string()).unwrap();
    std::fs::copy(src.join("adapter_model.safetensors"), dir.join("adapter_model.safetensors")).unwrap();
    let e = load_expert(&dir, &ExpertLoadOptions::default(), &m, 1).err().expect("refused");
    assert_eq!(e.code(), "UNSUPPORTED_ADAPTER", "{e}");
    assert!(e.to_string().contains("MoE experts"), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}
