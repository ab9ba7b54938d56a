//! What a Gemma 3 text `config.json` (`gemma3_text`) adds to the common fields, with
//! transformers' defaults where a field is absent (`Gemma3TextConfig`):
//! - which layers slide: `layer_types` (`sliding_attention` / `full_attention`), or else every
//!   layer but each `sliding_window_pattern`-th (default 6). transformers 5.x also writes a
//!   private `_sliding_window_pattern` that does not follow `layer_types`: it is not read;
//! - the window (`sliding_window`, default 4096);
//! - the rotary embeddings: transformers 5.x keys them by layer type
//!   (`rope_parameters: {full_attention: {...}, sliding_attention: {...}}`), 4.x has
//!   `rope_theta` (default 1e6) and `rope_scaling` for the full layers and
//!   `rope_local_base_freq` (default 1e4) for the sliding ones;
//! - `query_pre_attn_scalar` (default 256) and `final_logit_softcapping`;
//! - `head_dim` (default 256) and tied embeddings (default true).
//!
//! A GGUF file (`general.architecture` `gemma3`) carries the window
//! (`gemma3.attention.sliding_window`) but not the rest: llama.cpp's loader fixes them, and so
//! does [`read_gguf`], to read a file as llama.cpp runs it — every sixth layer full (`i % 6 ==
//! 5`), the others sliding with a rotary base of 10,000, and scores scaled by `1/√head_dim`
//! except in the 62-layer (27B) model, `1/√(hidden / heads)` (gemma_pytorch's config).

use serde_json::Value;

use super::config::ModelConfig;
use super::rope::{RopeScaling, Source};
use crate::error::{EngineError, Result};
use crate::gguf_meta::{self, Metadata};

/// Most layers in a repeating pattern (`sliding_window_pattern`).
const MAX_PATTERN: u64 = 1 << 12;

fn invalid(m: String) -> EngineError {
    EngineError::InvalidModel(format!("config.json (gemma3_text): {m}"))
}

/// A positive finite number, or the default when the field is absent or null.
fn positive(raw: &Value, key: &str, default: f64) -> Result<f64> {
    match raw.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => match v.as_f64() {
            Some(x) if x.is_finite() && x > 0.0 => Ok(x),
            _ => Err(invalid(format!("{key} must be a finite positive number, got {v}"))),
        },
    }
}

/// The theta and scaling of one layer type's rotary embedding.
fn rope(v: &Value, default_theta: f64, max_positions: usize, original: Option<usize>) -> Result<(f64, Option<RopeScaling>)> {
    let theta = positive(v, "rope_theta", default_theta)?;
    Ok((theta, RopeScaling::parse(v, Source::Config, max_positions, original)?))
}

/// The text model's config of a multimodal Gemma 3 checkpoint (`model_type` `gemma3` with a
/// `text_config`, as `Gemma3ForConditionalGeneration` writes it), over `Gemma3TextConfig`'s
/// defaults (transformers 4.50 to 5.x) for the fields the common reader requires (google/gemma-3-4b-it's
/// `text_config` names 7 fields); `None` for any other config.
///
/// `final_logit_softcapping` is refused: transformers' `Gemma3ForCausalLM` applies it but
/// `Gemma3ForConditionalGeneration` does not, so the same weights give two answers (no
/// published Gemma 3 sets it).
pub fn multimodal_text_config(raw: &Value) -> Result<Option<Value>> {
    let defaults = serde_json::json!({
        "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131_072,
        "rms_norm_eps": 1e-6, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
    });
    let text = super::multimodal::text_config(raw, "gemma3", "gemma3_text", defaults)?;
    if text.as_ref().and_then(|t| t.get("final_logit_softcapping")).is_some_and(|v| !v.is_null()) {
        return Err(EngineError::UnsupportedArchitecture(
            "config.json (gemma3): text_config.final_logit_softcapping in a multimodal checkpoint \
             (transformers' Gemma3ForConditionalGeneration does not apply it, Gemma3ForCausalLM does)"
                .into(),
        ));
    }
    Ok(text)
}

/// Reads the Gemma 3 fields of `raw` into `cfg` (whose common fields are read).
pub fn read(raw: &Value, cfg: &mut ModelConfig, original: Option<usize>) -> Result<()> {
    let n = cfg.num_layers;
    if raw.get("text_config").is_some() {
        return Err(invalid("a text_config inside the text model's config".into()));
    }
    match raw.get("hidden_activation").or_else(|| raw.get("hidden_act")).and_then(Value::as_str) {
        None | Some("gelu_pytorch_tanh") => {}
        Some(other) => return Err(EngineError::UnsupportedArchitecture(format!("config.json: hidden_activation '{other}'"))),
    }
    if raw.get("head_dim").is_none_or(Value::is_null) {
        cfg.head_dim = 256;
    }
    if raw.get("tie_word_embeddings").is_none_or(Value::is_null) {
        cfg.tie_word_embeddings = true;
    }
    let sliding = match super::window_config::layer_types(raw, "gemma3_text", n)? {
        Some(types) => types,
        None => {
            let pattern = match raw.get("sliding_window_pattern") {
                None | Some(Value::Null) => 6,
                Some(v) => v.as_u64().filter(|p| (1..=MAX_PATTERN).contains(p)).ok_or_else(|| {
                    invalid(format!("sliding_window_pattern must be a whole number in 1..={MAX_PATTERN}, got {v}"))
                })?,
            };
            (0..n).map(|i| !(i as u64 + 1).is_multiple_of(pattern)).collect()
        }
    };
    // A null window leaves the sliding layers unbounded, as in HF's attention.
    let window = super::window_config::window(raw, "gemma3_text", Some(super::window_config::DEFAULT_WINDOW))?;
    super::window_config::apply(cfg, sliding, window);

    let max = cfg.max_position_embeddings;
    let by_type =
        raw.get("rope_parameters").filter(|p| p.get("full_attention").is_some() || p.get("sliding_attention").is_some());
    let (global, local) = match by_type {
        Some(p) => {
            let of = |k: &str, theta| match p.get(k) {
                Some(v) => rope(v, theta, max, original),
                None => Ok((theta, None)),
            };
            (of("full_attention", 1e6)?, of("sliding_attention", 1e4)?)
        }
        None => {
            let mut scaling = None;
            for v in ["rope_scaling", "rope_parameters"].iter().filter_map(|k| raw.get(*k)).filter(|v| !v.is_null()) {
                scaling = scaling.or(RopeScaling::parse(v, Source::Config, max, original)?);
            }
            let theta = match raw.get("rope_parameters").and_then(|p| p.get("rope_theta")) {
                Some(t) => positive(&serde_json::json!({ "t": t }), "t", 1e6)?,
                None => positive(raw, "rope_theta", 1e6)?,
            };
            ((theta, scaling), (positive(raw, "rope_local_base_freq", 1e4)?, None))
        }
    };
    (cfg.rope_theta, cfg.rope_scaling) = global;
    cfg.local_rope = Some(local);
    cfg.query_pre_attn_scalar = Some(positive(raw, "query_pre_attn_scalar", 256.0)?);
    cfg.final_logit_softcap = match raw.get("final_logit_softcapping") {
        None | Some(Value::Null) => None,
        Some(_) => Some(positive(raw, "final_logit_softcapping", 0.0)?),
    };
    Ok(())
}

/// llama.cpp's fixed Gemma 3 layer pattern: every sixth layer attends to everything.
const GGUF_PATTERN: usize = 6;
/// llama.cpp's fixed rotary base of the sliding layers.
const GGUF_LOCAL_BASE: f64 = 10_000.0;
/// The one Gemma 3 size whose score scale is not `1/√head_dim` (27B).
const GGUF_27B_LAYERS: usize = 62;

/// Reads what a `gemma3` GGUF file holds beyond the common keys into `cfg` (whose common
/// fields are read), and fixes the rest as llama.cpp's loader does (see the module's note).
pub fn read_gguf(md: &Metadata, arch_name: &str, cfg: &mut ModelConfig) -> Result<()> {
    let key = |k: &str| format!("{arch_name}.{k}");
    let max = super::config::MAX_POSITIONS;
    let window = gguf_meta::get_u64(md, &key("attention.sliding_window")).ok().flatten();
    cfg.sliding_window = Some(match window {
        Some(w) if (1..=max as u64).contains(&w) => w as usize,
        _ => {
            return Err(EngineError::InvalidModel(format!(
                "GGUF gemma3: {} must be a whole number in 1..={max}, got {window:?}",
                key("attention.sliding_window")
            )))
        }
    });
    cfg.sliding_layers = (0..cfg.num_layers).map(|i| i % GGUF_PATTERN != GGUF_PATTERN - 1).collect();
    cfg.local_rope = Some((GGUF_LOCAL_BASE, None));
    cfg.query_pre_attn_scalar = Some(if cfg.num_layers == GGUF_27B_LAYERS {
        (cfg.hidden_size / cfg.num_heads.max(1)) as f64
    } else {
        cfg.head_dim as f64
    });
    cfg.final_logit_softcap = super::config::gguf_final_logit_softcap(md, arch_name)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> Value {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/__test__/fixtures/gemma3-tiny/config.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn load(v: &Value) -> Result<ModelConfig> {
        ModelConfig::from_hf_json(&v.to_string())
    }

    #[test]
    fn reads_the_fixture_as_written_by_transformers_5() {
        let c = load(&fixture()).unwrap();
        assert_eq!(c.arch, super::super::config::Arch::Gemma3);
        assert_eq!(c.sliding_layers, vec![true, true, false, true]);
        assert_eq!(c.sliding_window, Some(8));
        assert_eq!((c.rope_theta, c.local_rope.clone()), (1e6, Some((1e4, None))));
        assert_eq!((c.query_pre_attn_scalar, c.final_logit_softcap), (Some(24.0), Some(30.0)));
        assert_eq!((c.head_dim, c.tie_word_embeddings), (32, true));
    }

    #[test]
    fn reads_the_4x_form_and_the_defaults() {
        let mut v = fixture();
        let o = v.as_object_mut().unwrap();
        for k in [
            "layer_types",
            "rope_parameters",
            "head_dim",
            "tie_word_embeddings",
            "query_pre_attn_scalar",
            "final_logit_softcapping",
        ] {
            o.remove(k);
        }
        o.insert("sliding_window_pattern".into(), 2.into());
        o.insert("rope_local_base_freq".into(), 5e3.into());
        o.insert("rope_scaling".into(), serde_json::json!({"rope_type": "linear", "factor": 8.0}));
        // head_dim defaults to 256: 4 heads of 256 do not fit a 64-wide model, but the config
        // reader takes them (the loader checks the weights against them).
        let c = load(&v).unwrap();
        assert_eq!(c.sliding_layers, vec![true, false, true, false]);
        assert_eq!(c.rope_theta, 1e6);
        assert_eq!(c.rope_scaling, Some(RopeScaling::Linear { factor: 8.0 }));
        assert_eq!(c.local_rope, Some((5e3, None)));
        assert_eq!(
            (c.query_pre_attn_scalar, c.final_logit_softcap, c.head_dim, c.tie_word_embeddings),
            (Some(256.0), None, 256, true)
        );
    }

    #[test]
    fn bad_values_are_typed_errors() {
        let cases: [(&str, Value, &str); 10] = [
            ("layer_types", serde_json::json!(["sliding_attention"]), "INVALID_MODEL"),
            ("layer_types", serde_json::json!(["x", "x", "x", "x"]), "UNSUPPORTED_ARCHITECTURE"),
            ("layer_types", "full_attention".into(), "INVALID_MODEL"),
            ("sliding_window", 0.into(), "INVALID_MODEL"),
            ("sliding_window", (1u64 << 40).into(), "INVALID_MODEL"),
            ("sliding_window", (-8).into(), "INVALID_MODEL"),
            ("query_pre_attn_scalar", 0.into(), "INVALID_MODEL"),
            ("final_logit_softcapping", (-30.0).into(), "INVALID_MODEL"),
            ("hidden_activation", "relu".into(), "UNSUPPORTED_ARCHITECTURE"),
            ("attn_logit_softcapping", 50.0.into(), "UNSUPPORTED_ARCHITECTURE"),
        ];
        for (k, value, code) in cases {
            let mut v = fixture();
            v[k] = value.clone();
            assert_eq!(load(&v).unwrap_err().code(), code, "{k} = {value}");
        }
        let mut v = fixture();
        v.as_object_mut().unwrap().remove("layer_types");
        v["sliding_window_pattern"] = 0.into();
        assert_eq!(load(&v).unwrap_err().code(), "INVALID_MODEL");
        let mut v = fixture();
        v["text_config"] = serde_json::json!({});
        assert_eq!(load(&v).unwrap_err().code(), "INVALID_MODEL");
    }

    /// google/gemma-3-4b-it's config.json (transformers 4.50): a `text_config` of the fields
    /// that differ from `Gemma3TextConfig`'s defaults, the end-of-turn id at the top level.
    fn multimodal() -> Value {
        serde_json::json!({
            "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255_999, "eoi_token_index": 256_000,
            "eos_token_id": [1, 106], "image_token_index": 262_144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
            "model_type": "gemma3",
            "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                            "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                            "sliding_window": 1024},
            "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
            "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                              "model_type": "siglip_vision_model", "num_attention_heads": 16,
                              "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": false}
        })
    }

    #[test]
    fn reads_a_multimodal_checkpoint_with_transformers_defaults() {
        let c = load(&multimodal()).unwrap();
        assert!(c.text_of_multimodal);
        assert_eq!((c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers), (262_208, 2560, 10240, 34));
        assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim, c.max_position_embeddings), (8, 4, 256, 131_072));
        assert_eq!((c.rms_norm_eps, c.tie_word_embeddings, c.bos_token_id), (1e-6, true, Some(2)));
        assert_eq!(c.eos_token_ids, vec![1, 106]);
        assert_eq!(c.declared_dtype.as_deref(), Some("bfloat16"));
        let full: Vec<usize> = (0..34).filter(|&i| !c.sliding_layers[i]).collect();
        assert_eq!((full, c.sliding_window), (vec![5, 11, 17, 23, 29], Some(1024)));
        assert_eq!((c.rope_theta, c.rope_scaling.clone()), (1e6, Some(RopeScaling::Linear { factor: 8.0 })));
        assert_eq!(
            (c.local_rope.clone(), c.query_pre_attn_scalar, c.final_logit_softcap),
            (Some((1e4, None)), Some(256.0), None)
        );
        // The text model's own field wins over the top level's.
        let mut v = multimodal();
        v["text_config"]["eos_token_id"] = 7.into();
        assert_eq!(load(&v).unwrap().eos_token_ids, vec![7]);
        // A plain text model is not one.
        assert!(!load(&fixture()).unwrap().text_of_multimodal);
    }

    #[test]
    fn a_bad_multimodal_config_is_a_typed_error() {
        let cases: [(&str, Value, &str); 6] = [
            ("/text_config", 5.into(), "INVALID_MODEL"),
            ("/text_config", Value::Null, "INVALID_MODEL"),
            ("/text_config/model_type", "llama".into(), "INVALID_MODEL"),
            ("/text_config/final_logit_softcapping", 30.0.into(), "UNSUPPORTED_ARCHITECTURE"),
            ("/text_config/vocab_size", (1u64 << 40).into(), "INVALID_MODEL"),
            ("/text_config/num_hidden_layers", (-1).into(), "INVALID_MODEL"),
        ];
        for (at, value, code) in cases {
            let mut v = multimodal();
            let (parent, key) = at.rsplit_once('/').unwrap();
            v.pointer_mut(parent).unwrap()[key] = value.clone();
            assert_eq!(load(&v).unwrap_err().code(), code, "{at} = {value}");
        }
    }

    /// A GGUF's window, with the layer pattern, local base and score scale llama.cpp fixes.
    #[test]
    fn a_gguf_reads_as_llama_cpp_fixes_it() {
        use candle_core::quantized::gguf_file::Value as G;
        let mut md = Metadata::new();
        for (k, v) in [
            ("general.architecture", G::String("gemma3".into())),
            ("gemma3.embedding_length", G::U32(640)),
            ("gemma3.feed_forward_length", G::U32(2048)),
            ("gemma3.block_count", G::U32(18)),
            ("gemma3.attention.head_count", G::U32(4)),
            ("gemma3.attention.head_count_kv", G::U32(1)),
            ("gemma3.attention.key_length", G::U32(256)),
            ("gemma3.attention.sliding_window", G::U32(512)),
            ("gemma3.rope.freq_base", G::F32(1e6)),
            ("gemma3.vocab_size", G::U32(1000)),
        ] {
            md.insert(k.into(), v);
        }
        let c = ModelConfig::from_gguf(&md).unwrap();
        let full: Vec<usize> = (0..18).filter(|&i| !c.sliding_layers[i]).collect();
        assert_eq!(full, vec![5, 11, 17]);
        assert_eq!((c.sliding_window, c.local_rope.clone(), c.rope_theta), (Some(512), Some((1e4, None)), 1e6));
        assert_eq!((c.query_pre_attn_scalar, c.final_logit_softcap, c.qk_norm), (Some(256.0), None, true));
        // A soft-cap llama.cpp could not apply, and a layer count no list can hold: typed errors.
        for (k, v) in [
            ("gemma3.final_logit_softcapping", G::F32(f32::NAN)),
            ("gemma3.final_logit_softcapping", G::F64(-30.0)),
            ("gemma3.block_count", G::U64(u64::MAX)),
        ] {
            let mut bad = md.clone();
            bad.insert(k.into(), v);
            assert_eq!(ModelConfig::from_gguf(&bad).unwrap_err().code(), "INVALID_MODEL", "{k}");
        }
        // The 27B's scale is 1/√(hidden / heads).
        md.insert("gemma3.block_count".into(), G::U32(62));
        assert_eq!(ModelConfig::from_gguf(&md).unwrap().query_pre_attn_scalar, Some(160.0));
        // A window past any context, 0, or none: not a file llama.cpp would run.
        for w in [Some(G::U64(u64::MAX)), Some(G::U32(0)), None] {
            match w {
                Some(w) => md.insert("gemma3.attention.sliding_window".into(), w),
                None => md.remove("gemma3.attention.sliding_window"),
            };
            assert_eq!(ModelConfig::from_gguf(&md).unwrap_err().code(), "INVALID_MODEL");
        }
    }
}
