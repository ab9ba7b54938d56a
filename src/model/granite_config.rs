//! Granite 3 (`granite`, `GraniteForCausalLM`): Llama's network with four multipliers, each 1 by
//! default in transformers' `GraniteConfig`:
//! - `embedding_multiplier` multiplies the input embeddings (virtual tokens included: transformers
//!   applies it to `inputs_embeds`);
//! - `residual_multiplier` multiplies each block's output before its residual add;
//! - `attention_multiplier` is the attention score scale itself, in place of `1/√head_dim` (so
//!   a config without it runs unscaled scores, as transformers does);
//! - `logits_scaling` divides the logits.
//!
//! A GGUF file (`general.architecture` `granite`, written by llama.cpp's converter as a Llama
//! with its Q/K rows permuted) stores them as `granite.embedding_scale`, `granite.residual_scale`,
//! `granite.attention.scale` and `granite.logit_scale`.

use serde_json::Value;

use super::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::gguf_meta::{self, Metadata};

/// Granite's multipliers. Each is neutral at 1 except the attention one, which replaces
/// `1/√head_dim` (neutral only at that value).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Multipliers {
    pub embedding: f64,
    pub residual: f64,
    pub attention: f64,
    pub logits_scaling: f64,
}

/// The largest multiplier accepted: far past the released models' (embedding 12, logits
/// scaling 16), short of values that overflow f32 activations in one step.
const MAX: f64 = 1e6;

fn check(field: &str, m: f64, from: &str) -> Result<f64> {
    if m.is_finite() && m > 0.0 && m <= MAX {
        Ok(m)
    } else {
        Err(EngineError::InvalidModel(format!("{from}: {field} must be a finite number in (0, {MAX}], got {m}")))
    }
}

/// A `config.json` multiplier: 1 when absent or null.
fn checked(field: &str, v: Option<&Value>, from: &str) -> Result<f64> {
    match v {
        None | Some(Value::Null) => Ok(1.0),
        Some(x) => match x.as_f64() {
            Some(m) => check(field, m, from),
            None => Err(EngineError::InvalidModel(format!("{from}: {field} must be a number, got {x}"))),
        },
    }
}

/// Reads the Granite fields of a `config.json` into `cfg` (whose common fields are read).
pub fn read(raw: &Value, cfg: &mut ModelConfig) -> Result<()> {
    let get = |k: &str| checked(k, raw.get(k), "config.json (granite)");
    cfg.multipliers = Some(Multipliers {
        embedding: get("embedding_multiplier")?,
        residual: get("residual_multiplier")?,
        attention: get("attention_multiplier")?,
        logits_scaling: get("logits_scaling")?,
    });
    Ok(())
}

/// Reads them from a `granite` GGUF's metadata as llama.cpp's converter writes them; like
/// llama.cpp's loader, a file without one of the four is refused.
pub fn read_gguf(md: &Metadata, cfg: &mut ModelConfig) -> Result<()> {
    let get = |k: &str| -> Result<f64> {
        let key = format!("granite.{k}");
        match gguf_meta::get_f64(md, &key).map_err(|e| EngineError::InvalidModel(format!("GGUF: {e}")))? {
            None => Err(EngineError::InvalidModel(format!("GGUF metadata lacks {key}"))),
            Some(m) => check(&key, m, "GGUF"),
        }
    };
    cfg.multipliers = Some(Multipliers {
        embedding: get("embedding_scale")?,
        residual: get("residual_scale")?,
        attention: get("attention.scale")?,
        logits_scaling: get("logit_scale")?,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> Value {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/__test__/fixtures/granite-tiny/config.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn load(v: &Value) -> Result<ModelConfig> {
        ModelConfig::from_hf_json(&v.to_string())
    }

    #[test]
    fn reads_the_multipliers_with_transformers_defaults() {
        let m = load(&fixture()).unwrap().multipliers.unwrap();
        assert_eq!(m, Multipliers { embedding: 4.0, residual: 0.5, attention: 0.125, logits_scaling: 2.0 });
        let mut v = fixture();
        for k in ["embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"] {
            v.as_object_mut().unwrap().remove(k);
        }
        // transformers' defaults: every multiplier 1, unscaled attention scores included.
        let m = load(&v).unwrap().multipliers.unwrap();
        assert_eq!(m, Multipliers { embedding: 1.0, residual: 1.0, attention: 1.0, logits_scaling: 1.0 });
    }

    #[test]
    fn bad_multipliers_are_typed_errors() {
        for k in ["embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"] {
            for bad in [serde_json::json!(0), serde_json::json!(-1.0), serde_json::json!(1e300), serde_json::json!("2")] {
                let mut v = fixture();
                v[k] = bad.clone();
                assert_eq!(load(&v).unwrap_err().code(), "INVALID_MODEL", "{k} = {bad}");
            }
        }
        // On another family the same fields are refused by name, never ignored.
        let mut v = fixture();
        v["model_type"] = "llama".into();
        assert_eq!(load(&v).unwrap_err().code(), "UNSUPPORTED_ARCHITECTURE");
    }

    /// A `granite` GGUF: its four keys read; one missing (llama.cpp's loader requires all four)
    /// or out of range is a typed error.
    #[test]
    fn a_gguf_needs_its_four_scales() {
        use candle_core::quantized::gguf_file::Value as G;
        let mut md = Metadata::new();
        for (k, v) in [
            ("general.architecture", G::String("granite".into())),
            ("granite.embedding_length", G::U32(64)),
            ("granite.feed_forward_length", G::U32(96)),
            ("granite.block_count", G::U32(3)),
            ("granite.attention.head_count", G::U32(4)),
            ("granite.vocab_size", G::U32(400)),
            ("granite.embedding_scale", G::F32(4.0)),
            ("granite.residual_scale", G::F32(0.5)),
            ("granite.attention.scale", G::F32(0.125)),
            ("granite.logit_scale", G::F32(2.0)),
        ] {
            md.insert(k.into(), v);
        }
        let m = ModelConfig::from_gguf(&md).unwrap().multipliers.unwrap();
        assert_eq!(m, Multipliers { embedding: 4.0, residual: 0.5, attention: 0.125, logits_scaling: 2.0 });
        for k in ["embedding_scale", "residual_scale", "attention.scale", "logit_scale"] {
            let key = format!("granite.{k}");
            for bad in [None, Some(G::F32(f32::NAN)), Some(G::F32(0.0)), Some(G::String("2".into()))] {
                let mut md = md.clone();
                match bad {
                    None => md.remove(&key),
                    Some(v) => md.insert(key.clone(), v),
                };
                assert_eq!(ModelConfig::from_gguf(&md).unwrap_err().code(), "INVALID_MODEL", "{key}");
            }
        }
    }
}
