//! Gemma 4 text (`gemma4_text`: Gemma 3's sandwich layers with wider heads on the full layers,
//! proportional RoPE there, value norms, unscaled scores, per-layer input embeddings, a scalar
//! per layer, and the last layers attending with earlier layers' keys and values) against HF
//! transformers and PEFT on `gemma4-tiny` (`scripts/gen_gemma4_fixtures.py`), from its
//! safetensors and from its GGUF as llama.cpp's converter writes it (`gemma4`: per-layer widths
//! as lists, `_swa` keys for the sliding layers, proportional RoPE as a `rope_freqs` tensor).

use crate::common::{fixture, greedy_decode, ids, load, read_json};
use crate::experts::{check_case_in, model, F32_TOL as PEFT_TOL};
use crate::parity::{check_reference, hf_half_gap, BF16_TOL, F16_TOL, F32_TOL};
use expert_runtime::engine::LoadOptions;
use expert_runtime::experts::{load_expert, ExpertLoadOptions};
use expert_runtime::model::decoder::Logits;
use serde_json::Value;

const NAME: &str = "gemma4-tiny";

fn reference() -> Value {
    read_json(&fixture(NAME).join("reference.json"))
}

/// The 25-token prompt and 16 new tokens run far past the window of 6.
#[test]
fn gemma4_f32_bf16_f16_from_safetensors() {
    let r = reference();
    check_reference(&fixture(NAME), NAME, &r, "f32", "f32", F32_TOL, false);
    check_reference(&fixture(NAME), NAME, &r, "bf16", "bf16", BF16_TOL.max(2.0 * hf_half_gap(&r, "bf16")), false);
    check_reference(&fixture(NAME), NAME, &r, "f16", "f16", F16_TOL.max(2.0 * hf_half_gap(&r, "f16")), false);
}

/// The GGUF answers as HF, and our free-running decode of it gives llama.cpp's tokens.
#[test]
fn gemma4_gguf_answers_as_hf_and_llama_cpp() {
    let r = reference();
    let gguf = fixture(NAME).join("model-f32.gguf");
    check_reference(&gguf, NAME, &r, "f32", "f32", F32_TOL, false);
    let model = load(&gguf, &LoadOptions::default());
    let want = ids(&r["llamacpp"]["tokens"]);
    assert_eq!(greedy_decode(&model, &ids(&r["prompt_ids"]), want.len()), want);
}

/// What the fixture can tell apart: HF's greedy run with each feature off (per-layer inputs,
/// their embedding scale, KV sharing, proportional RoPE, the layer scalars, the window) gives
/// other tokens; without the final soft-cap, other logprobs.
#[test]
fn gemma4_each_feature_is_visible() {
    let r = reference();
    let steps = r["f32"]["steps"].as_array().unwrap();
    let want: Vec<u32> = steps.iter().map(|s| s["token"].as_u64().unwrap() as u32).collect();
    let ablations = r["ablations"]["f32"].as_object().unwrap();
    for k in [
        "per_layer_inputs_off",
        "per_layer_embed_unscaled",
        "shared_layers_own_kv",
        "full_rope_default",
        "layer_scalar_1",
        "window_ignored",
    ] {
        assert_ne!(ids(&ablations[k]["tokens"]), want, "{k}");
    }
    let moved = ablations["no_final_softcap"]["logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .zip(steps)
        .any(|(x, s)| (x.as_f64().unwrap() - s["logprob"].as_f64().unwrap()).abs() >= 0.01);
    assert!(moved, "the final soft-cap");
}

/// LoRA, DoRA and IA³ on every projection the layers have (the KV-sharing layers have no k or v)
/// against PEFT. Prompt tuning is refused by name: a virtual token has no per-layer inputs (HF
/// refuses it too).
#[test]
fn gemma4_experts_match_peft_and_prompt_tuning_is_refused() {
    let dir = fixture(NAME).join("experts");
    let r = read_json(&dir.join("reference.json"));
    for case in ["base", "lora", "dora", "ia3"] {
        check_case_in(&r, &dir, case, &fixture(NAME), false, PEFT_TOL);
        check_case_in(&r, &dir, case, &fixture(NAME).join("model-f32.gguf"), false, PEFT_TOL);
    }
    // A prompt-tuning expert of the same hidden size (granite-tiny's, 64).
    let m = model(&fixture(NAME), false);
    let prompt = fixture("granite-tiny").join("experts").join("prompt");
    let e = load_expert(&prompt, &ExpertLoadOptions::default(), &m, 1).err().expect("refused");
    assert_eq!(e.code(), "UNSUPPORTED_ADAPTER", "{e}");
    assert!(e.to_string().contains("per-layer input"), "{e}");
}

/// The text model of a multimodal Gemma 4 checkpoint (`Gemma4ForConditionalGeneration`:
/// `model.language_model.*` beside vision and audio towers) answers as HF, and a LoRA trained on
/// the whole model (PEFT also adapted the towers' projections) as PEFT: its 20 tower tensors are
/// counted and not loaded.
#[test]
fn gemma4_multimodal_text_model_and_expert_match_hf() {
    const MM: &str = "gemma4-mm-tiny";
    let r = read_json(&fixture(MM).join("reference.json"));
    check_reference(&fixture(MM), MM, &r, "f32", "f32", F32_TOL, false);
    let dir = fixture(MM).join("experts");
    let refs = read_json(&dir.join("reference.json"));
    for case in ["base", "lora"] {
        check_case_in(&refs, &dir, case, &fixture(MM), false, PEFT_TOL);
    }
    let m = model(&fixture(MM), false);
    let e = load_expert(&dir.join("lora"), &ExpertLoadOptions::default(), &m, 1).unwrap();
    assert_eq!(e.skipped_vision_tensors, 20);
}

/// A bf16 checkpoint computed in f32 on the CPU reads its per-layer input table in place, each
/// looked-up row widened from bf16 (exact), instead of holding an f32 copy twice the file's size
/// (9.4 GB for E2B): the same logits as the copy (`mmap: false`), bit for bit.
#[test]
fn gemma4_per_layer_input_table_is_read_in_place_from_a_bf16_file() {
    use candle_core::{DType, Device};
    let dir = std::env::temp_dir().join(format!("er-gemma4-bf16-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(fixture(NAME).join(f), dir.join(f)).unwrap();
    }
    let tensors = candle_core::safetensors::load(fixture(NAME).join("model.safetensors"), &Device::Cpu).unwrap();
    let bf16: std::collections::HashMap<String, candle_core::Tensor> =
        tensors.into_iter().map(|(k, t)| (k, t.to_dtype(DType::BF16).unwrap())).collect();
    let table = bf16["model.embed_tokens_per_layer.weight"].elem_count() * 2;
    candle_core::safetensors::save(&bf16, dir.join("model.safetensors")).unwrap();

    let prompt = ids(&reference()["prompt_ids"]);
    let logits = |mmap: bool| {
        let model = load(&dir, &LoadOptions { dtype: Some("f32".into()), mmap: Some(mmap), ..Default::default() });
        let mut cache = model.new_cache(64).unwrap();
        let logits: Vec<f32> = model.forward(&prompt, &mut cache, Logits::Last).unwrap().to_vec1().unwrap();
        (logits, model.mapped_bytes())
    };
    let ((mapped, in_place), (copied, none)) = (logits(true), logits(false));
    assert_eq!((in_place, none), (table, 0));
    assert_eq!(mapped, copied);
    std::fs::remove_dir_all(dir).unwrap();
}
