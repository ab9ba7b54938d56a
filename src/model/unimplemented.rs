//! Config fields that change what attention computes and that the decoder does not implement
//! yet. A checkpoint that sets one is refused with `UNSUPPORTED_ARCHITECTURE` naming the field,
//! never loaded as the nearest family we do run: a Mistral checkpoint with a `sliding_window`
//! read as Llama would attend past its window and answer wrongly with no error.
//!
//! Only settings that are *on* are refused: `sliding_window: null`, a Qwen window with
//! `use_sliding_window: false` (HF ignores it then), `layer_types` of full attention only, a
//! `partial_rotary_factor` of 1 and multipliers of 1 all load.

use serde_json::Value;

use super::config::Arch;
use crate::error::{EngineError, Result};
use crate::gguf_meta::{self, Metadata};

/// Fields that turn on something whenever they hold a value other than null (or false).
const ON_WHEN_SET: [(&str, &str); 6] = [
    ("use_bidirectional_attention", "bidirectional attention"),
    ("attn_logit_softcapping", "attention logit soft-capping"),
    ("final_logit_softcapping", "final logit soft-capping"),
    ("query_pre_attn_scalar", "a query scale other than 1/sqrt(head_dim)"),
    ("attention_chunk_size", "chunked local attention"),
    ("hidden_size_per_layer_input", "per-layer input embeddings"),
];

/// Numeric fields whose neutral value is 1.
const NEUTRAL_ONE: [(&str, &str); 5] = [
    ("partial_rotary_factor", "partial rotary embeddings"),
    ("embedding_multiplier", "an embedding multiplier"),
    ("residual_multiplier", "a residual multiplier"),
    ("attention_multiplier", "an attention multiplier"),
    ("logits_scaling", "logit scaling"),
];

fn refuse(field: &str, value: &Value, what: &str, arch: Arch) -> EngineError {
    let mut shown = value.to_string();
    if let Some((cut, _)) = shown.char_indices().nth(80) {
        shown.truncate(cut);
        shown.push('…');
    }
    EngineError::UnsupportedArchitecture(format!(
        "config.json: {field} = {shown} ({what}) is not implemented for {}; refusing rather than running without it",
        arch.name()
    ))
}

/// Refuses an HF `config.json` (as parsed JSON) that turns on an attention-changing setting the
/// decoder does not implement for `arch` (read from a config of `model_type`).
pub fn check_hf(raw: &Value, arch: Arch, model_type: &str) -> Result<()> {
    let get = |k: &str| raw.get(k).filter(|v| !v.is_null());
    // Qwen2/Qwen3 configs carry a window that HF applies only with `use_sliding_window: true`;
    // for Llama and Mistral a window is always applied.
    let window_applies = match arch {
        Arch::Qwen2 | Arch::Qwen3 => get("use_sliding_window").is_some_and(|v| v != &Value::Bool(false)),
        Arch::Llama => true,
        // Gemma 3's and 4's windows and layer types are read (gemma3_config.rs, gemma4_config.rs).
        Arch::Gemma3 | Arch::Gemma4 => false,
        Arch::Qwen35 | Arch::Lfm2 => get("sliding_window").is_some(),
    };
    let implemented: &[&str] = match (arch, model_type) {
        (Arch::Gemma3, _) => &["layer_types", "query_pre_attn_scalar", "final_logit_softcapping"],
        (Arch::Gemma4, _) => &[
            "layer_types",
            "final_logit_softcapping",
            "hidden_size_per_layer_input",
            "use_bidirectional_attention",
            "attn_logit_softcapping",
            "partial_rotary_factor",
        ],
        // Their layer types (recurrent mixers) and partial rotary factor are read (hybrid_config.rs).
        (Arch::Qwen35, _) => &["layer_types", "partial_rotary_factor"],
        (Arch::Lfm2, _) => &["layer_types"],
        // Their window and layer types are read (window_config.rs).
        (_, "mistral") => &["sliding_window"],
        (_, "ministral") => &["sliding_window", "layer_types"],
        (_, "smollm3") => &["no_rope_layers", "sliding_window", "use_sliding_window", "layer_types"],
        // Its multipliers are read (granite_config.rs).
        (_, "granite") => &["embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"],
        // Its window and partial rotary factor are read (phi3_config.rs).
        (_, "phi3") => &["sliding_window", "partial_rotary_factor"],
        _ => &[],
    };
    let get = |k: &str| get(k).filter(|_| !implemented.contains(&k));
    if let Some(v) = get("use_sliding_window").filter(|v| *v != &Value::Bool(false)) {
        return Err(refuse("use_sliding_window", v, "sliding-window attention", arch));
    }
    if let Some(v) = get("sliding_window").filter(|_| window_applies) {
        return Err(refuse("sliding_window", v, "sliding-window attention", arch));
    }
    if let Some(v) = get("layer_types") {
        let full = v.as_array().is_some_and(|a| a.iter().all(|t| t.as_str() == Some("full_attention")));
        if !full {
            return Err(refuse("layer_types", v, "layers other than full attention", arch));
        }
    }
    if let Some(v) = get("no_rope_layers") {
        // SmolLM3: 1 = the layer uses RoPE, 0 = it does not.
        let all_rope = v.as_array().is_some_and(|a| a.iter().all(|x| x.as_u64() == Some(1)));
        if !all_rope {
            return Err(refuse("no_rope_layers", v, "layers without RoPE", arch));
        }
    }
    for (field, what) in ON_WHEN_SET {
        if let Some(v) = get(field).filter(|v| *v != &Value::Bool(false)) {
            return Err(refuse(field, v, what, arch));
        }
    }
    for (field, what) in NEUTRAL_ONE {
        if let Some(v) = get(field).filter(|v| v.as_f64() != Some(1.0)) {
            return Err(refuse(field, v, what, arch));
        }
    }
    // transformers 5 keeps the partial rotary factor with the other RoPE parameters.
    if !implemented.contains(&"partial_rotary_factor") {
        for at in ["/rope_parameters/partial_rotary_factor", "/rope_scaling/partial_rotary_factor"] {
            if let Some(v) = raw.pointer(at).filter(|v| !v.is_null() && v.as_f64() != Some(1.0)) {
                return Err(refuse(&at[1..].replace('/', "."), v, "partial rotary embeddings", arch));
            }
        }
    }
    Ok(())
}

/// The same for GGUF metadata as llama.cpp writes it (`{arch}.*` keys), given the rotary
/// dimension the reader settled on (the head dimension unless the family reads a partial one).
pub fn check_gguf(md: &Metadata, arch_name: &str, arch: Arch, rotary_dim: usize) -> Result<()> {
    let key = |k: &str| format!("{arch_name}.{k}");
    let refused = |k: &str, shown: String, what: &str| {
        EngineError::UnsupportedArchitecture(format!(
            "GGUF: {} = {shown} ({what}) is not implemented for {}; refusing rather than running without it",
            key(k),
            arch.name()
        ))
    };
    // Gemma 3 runs its window and final soft-cap (read by `gemma3_config::read_gguf`), Phi-3 its
    // window (`phi3_config::read_gguf`).
    let implemented: &[&str] = match (arch, arch_name) {
        (Arch::Gemma3, _) => &["attention.sliding_window", "final_logit_softcapping"],
        (_, "phi3") => &["attention.sliding_window"],
        // Its window, final soft-cap and two rotary dimensions are read (gemma4_config.rs).
        (Arch::Gemma4, _) => &["attention.sliding_window", "final_logit_softcapping", "rope.dimension_count"],
        // Its partial rotary dimension is read (hybrid_config.rs).
        (Arch::Qwen35, _) => &["rope.dimension_count"],
        _ => &[],
    };
    let window = gguf_meta::get_u64(md, &key("attention.sliding_window")).ok().flatten().filter(|&w| w > 0);
    if let Some(w) = window.filter(|_| !implemented.contains(&"attention.sliding_window")) {
        return Err(refused("attention.sliding_window", w.to_string(), "sliding-window attention"));
    }
    for (k, what) in
        [("attn_logit_softcapping", "attention logit soft-capping"), ("final_logit_softcapping", "final logit soft-capping")]
    {
        if implemented.contains(&k) {
            continue;
        }
        if let Some(c) = gguf_meta::get_f64(md, &key(k)).ok().flatten().filter(|&c| c != 0.0) {
            return Err(refused(k, c.to_string(), what));
        }
    }
    let dimension = gguf_meta::get_u64(md, &key("rope.dimension_count")).ok().flatten();
    if let Some(d) = dimension.filter(|_| !implemented.contains(&"rope.dimension_count")) {
        if d != rotary_dim as u64 {
            return Err(refused("rope.dimension_count", format!("{d} of head dim {rotary_dim}"), "partial rotary embeddings"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::ModelConfig;
    use serde_json::json;

    fn config(model_type: &str, extra: Value) -> String {
        crate::model::config::test_config(model_type, 2, extra).to_string()
    }

    fn refused(model_type: &str, extra: Value) -> String {
        match ModelConfig::from_hf_json(&config(model_type, extra.clone())) {
            Err(e) => {
                assert_eq!(e.code(), "UNSUPPORTED_ARCHITECTURE", "{model_type} {extra}: {e}");
                e.to_string()
            }
            Ok(_) => panic!("{model_type} {extra} loaded"),
        }
    }

    #[test]
    fn a_llama_window_is_refused_by_name_a_mistral_one_is_read() {
        let e = refused("llama", json!({"sliding_window": 4096}));
        assert!(e.contains("sliding_window = 4096") && e.contains("sliding-window attention"), "{e}");
        // Mistral's and Ministral's windows run (window_config.rs); their other fields do not.
        let c = ModelConfig::from_hf_json(&config("mistral", json!({"sliding_window": 4096}))).unwrap();
        assert_eq!((c.sliding_window, c.sliding_layers), (Some(4096), vec![true, true]));
        for model_type in ["mistral", "ministral"] {
            let e = refused(model_type, json!({"attention_chunk_size": 8192}));
            assert!(e.contains("attention_chunk_size"), "{e}");
        }
    }

    #[test]
    fn a_qwen_window_counts_only_when_used() {
        let off = json!({"sliding_window": 4096, "use_sliding_window": false, "max_window_layers": 28});
        assert!(ModelConfig::from_hf_json(&config("qwen2", off)).is_ok());
        assert!(ModelConfig::from_hf_json(&config("qwen3", json!({"sliding_window": 4096}))).is_ok());
        let e = refused("qwen2", json!({"sliding_window": 4096, "use_sliding_window": true}));
        assert!(e.contains("use_sliding_window"), "{e}");
    }

    #[test]
    fn every_attention_changing_field_is_refused_when_on() {
        let on = [
            json!({"layer_types": ["sliding_attention", "full_attention"]}),
            json!({"layer_types": "full_attention"}),
            json!({"no_rope_layers": [1, 0]}),
            json!({"attn_logit_softcapping": 50.0}),
            json!({"final_logit_softcapping": 30.0}),
            json!({"query_pre_attn_scalar": 256}),
            json!({"attention_chunk_size": 8192}),
            json!({"hidden_size_per_layer_input": 256}),
            json!({"partial_rotary_factor": 0.75}),
            json!({"partial_rotary_factor": "1"}),
            json!({"rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.5}}),
            json!({"embedding_multiplier": 12.0}),
            json!({"residual_multiplier": 0.22}),
            json!({"attention_multiplier": 0.0078125}),
            json!({"logits_scaling": 8.0}),
            json!({"logits_scaling": f64::MAX}),
        ];
        for extra in on {
            let field = extra.as_object().unwrap().keys().next().unwrap().clone();
            for arch in ["llama", "qwen2", "qwen3"] {
                let e = refused(arch, extra.clone());
                assert!(e.contains(&field), "{arch} {extra}: {e}");
            }
        }
    }

    #[test]
    fn neutral_values_load() {
        let neutral = json!({
            "layer_types": ["full_attention", "full_attention"], "no_rope_layers": [1, 1],
            "attn_logit_softcapping": null, "final_logit_softcapping": null, "partial_rotary_factor": 1.0,
            "embedding_multiplier": 1, "residual_multiplier": 1.0, "attention_multiplier": 1.0, "logits_scaling": 1.0,
            "use_sliding_window": false, "sliding_window": null, "attention_chunk_size": null
        });
        for arch in ["llama", "mistral", "ministral", "qwen2", "qwen3"] {
            ModelConfig::from_hf_json(&config(arch, neutral.clone())).unwrap();
        }
    }

    #[test]
    fn a_huge_value_is_shown_cut_short() {
        let long = "x".repeat(1 << 20);
        let e = refused("llama", json!({"layer_types": [long]}));
        assert!(e.len() < 400, "{}", e.len());
    }
}
