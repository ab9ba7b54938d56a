//! An HF `config.json`: parsing and validation (`ModelConfig::from_hf_json`), then what the
//! runtime derives from a loaded config without tensors: the parameter count and the check of
//! an adapter manifest's `base_model` against it.

#![no_main]

mod common;

use expert_runtime::experts::manifest::{parameter_count, Manifest};
use expert_runtime::model::config::ModelConfig;
use libfuzzer_sys::fuzz_target;

const MANIFESTS: [&str; 3] = [
    r#"{"base_model": "Qwen/Qwen3-0.6B"}"#,
    r#"{"base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"}"#,
    r#"{"base_model": {"architecture": "qwen3", "hidden_size": 1024, "num_layers": 28, "vocab_size": 151936}}"#,
];

fuzz_target!(init: common::report_panics_once(), |data: &[u8]| {
    let Some(text) = common::text(data) else { return };
    let cfg = ModelConfig::from_hf_json(text);
    common::show("config", &cfg);
    let Ok(cfg) = cfg else { return };
    let _ = parameter_count(&cfg);
    for m in MANIFESTS {
        common::show("check_base", &Manifest::parse(m).expect("a valid manifest").check_base(&cfg));
    }
});
