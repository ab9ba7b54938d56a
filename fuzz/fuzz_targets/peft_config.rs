//! An adapter's `adapter_config.json` (`AdapterConfig::parse`, then the module selection
//! every load runs: targets, rank/alpha patterns, IA³ feed-forward modules) and its
//! `manifest.json` (`Manifest::parse`, then the `base_model` check against real configs).
//! Both parsers get every input: they read the same kind of JSON object.

#![no_main]

mod common;

use std::sync::OnceLock;

use expert_runtime::experts::manifest::{family, Manifest};
use expert_runtime::experts::peft::AdapterConfig;
use expert_runtime::experts::{Proj, Slot};
use expert_runtime::model::config::ModelConfig;
use libfuzzer_sys::fuzz_target;

/// Qwen3-0.6B and SmolLM2-135M as their config.json files declare them.
fn base_models() -> &'static [ModelConfig] {
    static CONFIGS: OnceLock<Vec<ModelConfig>> = OnceLock::new();
    CONFIGS.get_or_init(|| {
        [
            r#"{"model_type":"qwen3","vocab_size":151936,"hidden_size":1024,"intermediate_size":3072,"num_hidden_layers":28,
               "num_attention_heads":16,"num_key_value_heads":8,"head_dim":128,"rms_norm_eps":1e-6,
               "max_position_embeddings":40960,"tie_word_embeddings":true}"#,
            r#"{"model_type":"llama","vocab_size":49152,"hidden_size":576,"intermediate_size":1536,"num_hidden_layers":30,
               "num_attention_heads":9,"num_key_value_heads":3,"rms_norm_eps":1e-5,"max_position_embeddings":8192,
               "tie_word_embeddings":true}"#,
        ]
        .iter()
        .map(|j| ModelConfig::from_hf_json(j).expect("a valid config"))
        .collect()
    })
}

fuzz_target!(init: common::report_panics_once(), |data: &[u8]| {
    let Some(text) = common::text(data) else { return };
    let adapter = AdapterConfig::parse(text);
    common::show("adapter_config", &adapter);
    if let Ok(cfg) = adapter {
        for layer in [0, 1, 2, 27, 29] {
            for proj in Proj::ALL {
                let slot = Slot::new(layer, proj);
                let _ = (cfg.targets(slot), cfg.rank_alpha(slot), cfg.is_feedforward(slot));
            }
        }
        let _ = cfg.target_modules.as_ref().map(|t| t.unadaptable_names());
        let _ = cfg.base_model_class.as_deref().map(family);
    }
    let manifest = Manifest::parse(text);
    common::show("manifest", &manifest);
    if let Ok(m) = manifest {
        for base in base_models() {
            common::show("check_base", &m.check_base(base));
        }
    }
});
