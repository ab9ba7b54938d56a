//! Which layers attend within a sliding window, and the window, as HF configs say it:
//! `layer_types` (`sliding_attention` / `full_attention`, one per layer) and `sliding_window`.
//! Shared by the families that have them (Gemma 3, Mistral, Ministral); each decides what an
//! absent field means, as its transformers config class does.
//!
//! - Mistral (`mistral`): no layer types; every layer slides when `sliding_window` is set, and
//!   an absent `sliding_window` means 4096 (`MistralConfig`'s default) where `null` means none.
//! - Ministral (`ministral`): `layer_types`, else every layer sliding when there is a window
//!   (default 4096) and full otherwise; a sliding layer without a window attends to everything.

use serde_json::Value;

use super::config::{ModelConfig, MAX_POSITIONS};
use crate::error::{EngineError, Result};

/// transformers' default window for Gemma 3, Mistral and Ministral.
pub const DEFAULT_WINDOW: usize = 4096;

fn invalid(model_type: &str, m: String) -> EngineError {
    EngineError::InvalidModel(format!("config.json ({model_type}): {m}"))
}

/// Per layer, whether `layer_types` makes it sliding; `None` when the field is absent or null.
/// A list of the wrong length or not a list is `INVALID_MODEL`, a layer type we do not run
/// (chunked attention, say) `UNSUPPORTED_ARCHITECTURE` naming it.
pub fn layer_types(raw: &Value, model_type: &str, num_layers: usize) -> Result<Option<Vec<bool>>> {
    match raw.get("layer_types").filter(|v| !v.is_null()) {
        None => Ok(None),
        Some(Value::Array(types)) => {
            if types.len() != num_layers {
                return Err(invalid(model_type, format!("layer_types has {} entries for {num_layers} layers", types.len())));
            }
            let kind = |t: &Value| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(EngineError::UnsupportedArchitecture(format!("config.json ({model_type}): layer type {t}"))),
            };
            types.iter().map(kind).collect::<Result<_>>().map(Some)
        }
        Some(v) => Err(invalid(model_type, format!("layer_types must be a list, got {v}"))),
    }
}

/// `sliding_window`: `default` when absent, `None` when null, else a whole number of positions
/// in `1..=MAX_POSITIONS` (`INVALID_MODEL` otherwise: 0, negative, fractional, 2^40).
pub fn window(raw: &Value, model_type: &str, default: Option<usize>) -> Result<Option<usize>> {
    match raw.get("sliding_window") {
        None => Ok(default),
        Some(Value::Null) => Ok(None),
        Some(v) => {
            v.as_u64().filter(|&w| w >= 1 && w <= MAX_POSITIONS as u64).map(|w| Some(w as usize)).ok_or_else(|| {
                invalid(model_type, format!("sliding_window must be a whole number in 1..={MAX_POSITIONS}, got {v}"))
            })
        }
    }
}

/// Sets `cfg`'s sliding layers and window from per-layer flags and a window: a layer slides
/// only where it is marked sliding and there is a window.
pub fn apply(cfg: &mut ModelConfig, sliding: Vec<bool>, window: Option<usize>) {
    cfg.sliding_layers = match window {
        Some(_) => sliding,
        None => vec![false; cfg.num_layers],
    };
    cfg.sliding_window = window.filter(|_| cfg.sliding_layers.iter().any(|&s| s));
}

/// Reads a Mistral (`mistral`) or Ministral (`ministral`) config's window and layer types.
pub fn read_mistral(raw: &Value, model_type: &str, cfg: &mut ModelConfig) -> Result<()> {
    let window = window(raw, model_type, Some(DEFAULT_WINDOW))?;
    let sliding = match model_type {
        "ministral" => layer_types(raw, model_type, cfg.num_layers)?,
        // MistralConfig has no layer types (a `layer_types` is refused by `unimplemented`).
        _ => None,
    };
    apply(cfg, sliding.unwrap_or_else(|| vec![true; cfg.num_layers]), window);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(model_type: &str, extra: Value) -> Value {
        crate::model::config::test_config(model_type, 3, extra)
    }

    fn load(v: &Value) -> Result<ModelConfig> {
        ModelConfig::from_hf_json(&v.to_string())
    }

    fn windows(v: &Value) -> (Vec<bool>, Option<usize>) {
        let c = load(v).unwrap();
        (c.sliding_layers, c.sliding_window)
    }

    #[test]
    fn mistral_slides_every_layer_with_transformers_default() {
        let all = vec![true; 3];
        assert_eq!(windows(&config("mistral", json!({"sliding_window": 6}))), (all.clone(), Some(6)));
        // Absent means MistralConfig's 4096; null means none (Mistral 7B v0.2 and later).
        assert_eq!(windows(&config("mistral", json!({}))), (all, Some(DEFAULT_WINDOW)));
        assert_eq!(windows(&config("mistral", json!({"sliding_window": null}))), (vec![false; 3], None));
        // A Llama config's window is not Llama's: still refused.
        assert_eq!(load(&config("llama", json!({"sliding_window": 6}))).unwrap_err().code(), "UNSUPPORTED_ARCHITECTURE");
        assert_eq!(
            load(&config("mistral", json!({"layer_types": ["sliding_attention", "full_attention", "sliding_attention"]})))
                .unwrap_err()
                .code(),
            "UNSUPPORTED_ARCHITECTURE"
        );
    }

    #[test]
    fn ministral_reads_layer_types() {
        let types = json!(["sliding_attention", "full_attention", "sliding_attention"]);
        let v = config("ministral", json!({"sliding_window": 5, "layer_types": types}));
        assert_eq!(windows(&v), (vec![true, false, true], Some(5)));
        assert_eq!(windows(&config("ministral", json!({}))), (vec![true; 3], Some(DEFAULT_WINDOW)));
        // Sliding layers without a window attend to everything, as in HF.
        let v = config("ministral", json!({"sliding_window": null, "layer_types": types}));
        assert_eq!(windows(&v), (vec![false; 3], None));
        let full = json!(["full_attention", "full_attention", "full_attention"]);
        assert_eq!(windows(&config("ministral", json!({"sliding_window": 5, "layer_types": full}))), (vec![false; 3], None));
    }

    #[test]
    fn absurd_values_are_typed_errors() {
        let cases: [(&str, Value, &str); 8] = [
            ("sliding_window", 0.into(), "INVALID_MODEL"),
            ("sliding_window", (1u64 << 40).into(), "INVALID_MODEL"),
            ("sliding_window", (-8).into(), "INVALID_MODEL"),
            ("sliding_window", 4.5.into(), "INVALID_MODEL"),
            ("sliding_window", "4096".into(), "INVALID_MODEL"),
            ("layer_types", json!(["sliding_attention"]), "INVALID_MODEL"),
            ("layer_types", json!(["chunked_attention", "full_attention", "full_attention"]), "UNSUPPORTED_ARCHITECTURE"),
            ("layer_types", json!({"0": "full_attention"}), "INVALID_MODEL"),
        ];
        for (k, value, code) in cases {
            let v = config("ministral", json!({ k: value.clone() }));
            assert_eq!(load(&v).unwrap_err().code(), code, "{k} = {value}");
        }
        let huge = json!(vec!["sliding_attention"; 1 << 16]);
        assert_eq!(load(&config("ministral", json!({ "layer_types": huge }))).unwrap_err().code(), "INVALID_MODEL");
    }
}
