//! The text model of a multimodal Gemma 3 checkpoint (`gemma3` with a `text_config`,
//! `Gemma3ForConditionalGeneration`) against HF and PEFT on `gemma3-mm-tiny`
//! (`scripts/gen_gemma3_multimodal_fixture.py`): gemma3-tiny's text weights nested under
//! `language_model.model.*` beside a vision tower, a `text_config` that names only what
//! differs from transformers' defaults, and LoRA experts trained on the whole model (one with
//! vision-tower tensors). The 25-token prompt runs past the 8-token window.

use std::path::{Path, PathBuf};

use crate::common::fixture;
use crate::experts::{check_case_in, model, F32_TOL};
use expert_runtime::experts::{load_expert, ExpertLoadOptions};
use serde_json::Value;

const NAME: &str = "gemma3-mm-tiny";

fn reference() -> Value {
    crate::common::read_json(&fixture(NAME).join("reference.json"))
}

fn check(case: &str, dir: &Path) {
    check_case_in(&reference(), &fixture(NAME), case, dir, false, F32_TOL);
}

#[test]
fn gemma3_multimodal_text_model_matches_hf() {
    check("base", &fixture(NAME));
}

/// PEFT also adapted the vision tower's q/k/v: those tensors are counted and not loaded, and
/// the text answers still equal PEFT's.
#[test]
fn gemma3_multimodal_lora_with_vision_tower_tensors() {
    check("lora", &fixture(NAME));
    let m = model(&fixture(NAME), false);
    let e = load_expert(&fixture(NAME).join("lora"), &ExpertLoadOptions::default(), &m, 1).unwrap();
    assert_eq!(e.skipped_vision_tensors, 6);
    let e = load_expert(&fixture(NAME).join("lora_regex"), &ExpertLoadOptions::default(), &m, 2).unwrap();
    assert_eq!(e.skipped_vision_tensors, 0);
}

/// `target_modules` as a regex over the nested module paths (`model.language_model.layers.*`).
#[test]
fn gemma3_multimodal_lora_targeted_by_regex() {
    check("lora_regex", &fixture(NAME));
}

/// A copy of the fixture whose tensors are renamed `from` → `to` (weights, and the adapter's
/// when `adapter` is given), in a fresh directory.
fn renamed_copy(tag: &str, from: &str, to: &str, adapter: Option<&str>) -> PathBuf {
    let src = fixture(NAME);
    let dir = std::env::temp_dir().join(format!("er-{NAME}-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    rename_tensors(&src.join("model.safetensors"), &dir.join("model.safetensors"), from, to);
    if let Some(a) = adapter {
        std::fs::create_dir_all(dir.join(a)).unwrap();
        std::fs::copy(src.join(a).join("adapter_config.json"), dir.join(a).join("adapter_config.json")).unwrap();
        rename_tensors(&src.join(a).join("adapter_model.safetensors"), &dir.join(a).join("adapter_model.safetensors"), from, to);
    }
    dir
}

fn rename_tensors(src: &Path, dst: &Path, from: &str, to: &str) {
    let bytes = std::fs::read(src).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let renamed: Vec<(String, safetensors::tensor::TensorView<'_>)> =
        st.tensors().into_iter().map(|(name, view)| (name.replace(from, to), view)).collect();
    safetensors::serialize_to_file(renamed, None, dst).unwrap();
}

/// transformers 4.52 to 4.57 save the language model as `model.language_model.*` (and PEFT
/// its adapters so): the same answers.
#[test]
fn gemma3_multimodal_checkpoint_of_transformers_4_52() {
    let dir = renamed_copy("tf452", "language_model.model.", "model.language_model.", None);
    check("base", &dir);
    let _ = std::fs::remove_dir_all(&dir);
    // The adapter written by PEFT under transformers 4.50 (`base_model.model.language_model.model.*`).
    let dir = renamed_copy("peft450", "model.model.language_model.", "model.language_model.model.", Some("lora_regex"));
    let r = reference();
    check_case_in(&r, &dir, "lora_regex", &fixture(NAME), false, F32_TOL);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A checkpoint whose language-model tensors are missing fails with a typed error naming one.
#[test]
fn gemma3_multimodal_without_its_language_model_is_refused() {
    let dir = renamed_copy("nolm", "language_model.model.", "text_tower.", None);
    let opts = expert_runtime::engine::LoadOptions { dtype: Some("f32".into()), ..Default::default() };
    let err = expert_runtime::engine::load_model(&dir, &opts, &candle_core::Device::Cpu, &|_, _| {})
        .err()
        .expect("a checkpoint without its language model must not load");
    assert!(err.to_string().contains("model.embed_tokens.weight is missing"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
