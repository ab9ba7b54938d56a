//! What a SmolLM3 `config.json` (`smollm3`) adds to Llama's fields, with transformers' defaults
//! where a field is absent (`SmolLM3Config`):
//! - which layers skip RoPE: `no_rope_layers` (one per layer, 1 = rotate, 0 = no RoPE), or
//!   else every `no_rope_layer_interval`-th layer (default 4: layers 3, 7, 11, …);
//! - a sliding window only with `use_sliding_window: true`, on the layers `layer_types` marks
//!   (by default the no-RoPE ones), of `sliding_window` positions;
//! - the rotary base defaults to 2,000,000 and the embeddings are tied by default.
//!
//! A GGUF file (`general.architecture` `smollm3`, written by llama.cpp's converter as a Llama
//! with its Q/K rows permuted) holds none of this: llama.cpp's loader fixes every fourth layer
//! without RoPE, and so does [`gguf_no_rope_layers`].

use serde_json::Value;

use super::config::{ModelConfig, MAX_LAYERS};
use super::window_config;
use crate::error::{EngineError, Result};

const MODEL_TYPE: &str = "smollm3";
/// transformers' and llama.cpp's interval of the layers without RoPE.
const INTERVAL: usize = 4;
/// `SmolLM3Config`'s rotary base.
const DEFAULT_THETA: f64 = 2_000_000.0;

fn invalid(m: String) -> EngineError {
    EngineError::InvalidModel(format!("config.json ({MODEL_TYPE}): {m}"))
}

/// Per layer, whether it skips RoPE: every `interval`-th one.
fn every(interval: usize, n: usize) -> Vec<bool> {
    (0..n).map(|i| (i + 1).is_multiple_of(interval)).collect()
}

/// llama.cpp's fixed SmolLM3 pattern: every fourth layer without RoPE.
pub fn gguf_no_rope_layers(n: usize) -> Vec<bool> {
    every(INTERVAL, n)
}

/// Reads the SmolLM3 fields of `raw` into `cfg` (whose common fields are read).
pub fn read(raw: &Value, cfg: &mut ModelConfig) -> Result<()> {
    let n = cfg.num_layers;
    let get = |k: &str| raw.get(k).filter(|v| !v.is_null());
    cfg.no_rope_layers = match get("no_rope_layers") {
        Some(Value::Array(flags)) => {
            if flags.len() != n {
                return Err(invalid(format!("no_rope_layers has {} entries for {n} layers", flags.len())));
            }
            let flag = |v: &Value| match v.as_u64() {
                Some(1) => Ok(false),
                Some(0) => Ok(true),
                _ => Err(invalid(format!("no_rope_layers entries must be 0 or 1, got {v}"))),
            };
            flags.iter().map(flag).collect::<Result<_>>()?
        }
        Some(v) => return Err(invalid(format!("no_rope_layers must be a list, got {v}"))),
        None => {
            let interval = match get("no_rope_layer_interval") {
                None => INTERVAL,
                Some(v) => v.as_u64().filter(|&i| i >= 1 && i <= MAX_LAYERS as u64).ok_or_else(|| {
                    invalid(format!("no_rope_layer_interval must be a whole number in 1..={MAX_LAYERS}, got {v}"))
                })? as usize,
            };
            every(interval, n)
        }
    };
    let use_window = match get("use_sliding_window") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(invalid(format!("use_sliding_window must be true or false, got {v}"))),
    };
    // Read (and so checked) either way; applied only when turned on, as in HF.
    let types = window_config::layer_types(raw, MODEL_TYPE, n)?;
    let window = window_config::window(raw, MODEL_TYPE, None)?;
    if use_window {
        let sliding = types.unwrap_or_else(|| cfg.no_rope_layers.clone());
        window_config::apply(cfg, sliding, window);
    }
    let theta_set = get("rope_theta").is_some() || raw.get("rope_parameters").and_then(|p| p.get("rope_theta")).is_some();
    if !theta_set {
        cfg.rope_theta = DEFAULT_THETA;
    }
    if get("tie_word_embeddings").is_none() {
        cfg.tie_word_embeddings = true;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(extra: Value) -> Value {
        crate::model::config::test_config("smollm3", 8, extra)
    }

    fn load(v: &Value) -> Result<ModelConfig> {
        ModelConfig::from_hf_json(&v.to_string())
    }

    #[test]
    fn reads_no_rope_layers_and_transformers_defaults() {
        let c = load(&config(json!({}))).unwrap();
        assert_eq!(c.no_rope_layers, vec![false, false, false, true, false, false, false, true]);
        assert_eq!((c.rope_theta, c.tie_word_embeddings, c.sliding_window), (DEFAULT_THETA, true, None));
        let c =
            load(&config(json!({"no_rope_layers": [1, 0, 1, 1, 1, 1, 1, 0], "rope_theta": 5e4, "tie_word_embeddings": false})))
                .unwrap();
        assert_eq!(c.no_rope_layers, vec![false, true, false, false, false, false, false, true]);
        assert_eq!((c.rope_theta, c.tie_word_embeddings), (5e4, false));
        let c =
            load(&config(json!({"no_rope_layer_interval": 2, "rope_parameters": {"rope_theta": 7.0, "rope_type": "default"}})))
                .unwrap();
        assert_eq!(c.no_rope_layers, vec![false, true, false, true, false, true, false, true]);
        assert_eq!(c.rope_theta, 7.0);
    }

    #[test]
    fn a_window_applies_only_when_turned_on() {
        let c = load(&config(json!({"sliding_window": 4}))).unwrap();
        assert_eq!((c.sliding_window, c.sliding_layers.iter().any(|&s| s)), (None, false));
        // On: the no-RoPE layers slide unless layer_types says otherwise.
        let c = load(&config(json!({"sliding_window": 4, "use_sliding_window": true}))).unwrap();
        assert_eq!((c.sliding_window, c.sliding_layers.clone()), (Some(4), c.no_rope_layers.clone()));
    }

    #[test]
    fn absurd_values_are_typed_errors() {
        let cases: [(&str, Value); 9] = [
            ("no_rope_layers", json!([1, 1])),
            ("no_rope_layers", json!([1, 1, 1, 2, 1, 1, 1, 1])),
            ("no_rope_layers", json!([1, 1, 1, -1, 1, 1, 1, 1])),
            ("no_rope_layers", json!("all")),
            ("no_rope_layer_interval", json!(0)),
            ("no_rope_layer_interval", json!(1u64 << 40)),
            ("use_sliding_window", json!("yes")),
            ("sliding_window", json!(0)),
            ("layer_types", json!(["full_attention"])),
        ];
        for (k, value) in cases {
            let e = load(&config(json!({ k: value.clone() }))).unwrap_err();
            assert_eq!(e.code(), "INVALID_MODEL", "{k} = {value}: {e}");
        }
        let huge = json!(vec![1; 1 << 16]);
        assert_eq!(load(&config(json!({ "no_rope_layers": huge }))).unwrap_err().code(), "INVALID_MODEL");
    }
}
