//! Phi-3 and Phi-4-mini (`phi3`, `Phi3ForCausalLM`): Llama's network with
//! - the Q, K and V projections stored as one `qkv_proj` and the gate and up projections as one
//!   `gate_up_proj` (read as their parts: see `WeightSource::linear_parts`);
//! - `partial_rotary_factor` (Phi-4-mini: 0.75): RoPE turns the leading
//!   `⌊head_dim · factor⌋` features of each head;
//! - `sliding_window` on every layer when set (Phi-3-mini-4k: 2047);
//! - `longrope` scaling (Phi-3.5, Phi-4-mini), read by [`super::rope`].
//!
//! A GGUF file (`general.architecture` `phi3`, written by llama.cpp's converter) stores the
//! rotary dimension as `phi3.rope.dimension_count`, the window as `phi3.attention.sliding_window`
//! (0: none) and LongRoPE as two tensors, `rope_factors_long` and `rope_factors_short`, beside
//! `phi3.rope.scaling.original_context_length` and `phi3.rope.scaling.attn_factor`.

use serde_json::Value;

use super::config::{ModelConfig, MAX_POSITIONS};
use super::loader::WeightSource;
use super::rope::RopeScaling;
use super::window_config;
use crate::error::{EngineError, Result};
use crate::gguf_meta::{self, Metadata};

/// `Phi3Config`'s `original_max_position_embeddings` when a config leaves it out.
pub const DEFAULT_ORIGINAL_LENGTH: usize = 4096;

fn invalid(m: String) -> EngineError {
    EngineError::InvalidModel(format!("config.json (phi3): {m}"))
}

/// Reads the Phi-3 fields of a `config.json` into `cfg` (whose common fields are read).
pub fn read(raw: &Value, cfg: &mut ModelConfig) -> Result<()> {
    // transformers 5 keeps the factor in `rope_parameters` (where it wins, as HF's `setdefault`
    // lets it); 4.x configs have it at the top level.
    let factor = [
        raw.pointer("/rope_parameters/partial_rotary_factor"),
        raw.pointer("/rope_scaling/partial_rotary_factor"),
        raw.get("partial_rotary_factor"),
    ]
    .into_iter()
    .flatten()
    .find(|v| !v.is_null());
    if let Some(v) = factor {
        let f = v
            .as_f64()
            .filter(|f| f.is_finite() && *f > 0.0 && *f <= 1.0)
            .ok_or_else(|| invalid(format!("partial_rotary_factor must be a number in (0, 1], got {v}")))?;
        // HF: `int(head_dim * partial_rotary_factor)`.
        let dim = (cfg.head_dim as f64 * f).floor() as usize;
        if dim < 2 || !dim.is_multiple_of(2) {
            return Err(invalid(format!(
                "partial_rotary_factor {f} of head dimension {} rotates {dim} features; RoPE needs an even number, at least 2",
                cfg.head_dim
            )));
        }
        cfg.rotary_dim = Some(dim);
    }
    // Every layer slides when there is a window. One as long as the context never slides (Phi-4-mini
    // declares 262,144 over a 131,072 context): those layers are read as full attention.
    let window = window_config::window(raw, "phi3", None)?.filter(|&w| w < cfg.max_position_embeddings);
    window_config::apply(cfg, vec![true; cfg.num_layers], window);
    Ok(())
}

/// The `original_max_position_embeddings` HF sees for a Phi-3 config: its own, else the class
/// default (HF always prefers it to the scaling object's).
pub fn original_length(declared: Option<usize>) -> usize {
    declared.unwrap_or(DEFAULT_ORIGINAL_LENGTH)
}

/// Reads the rotary dimension and the window of a `phi3` GGUF into `cfg`.
pub fn read_gguf(md: &Metadata, cfg: &mut ModelConfig) -> Result<()> {
    let num = |k: &str| gguf_meta::get_u64(md, &format!("phi3.{k}")).map_err(|e| EngineError::InvalidModel(format!("GGUF: {e}")));
    if let Some(d) = num("rope.dimension_count")? {
        if d < 2 || d > cfg.head_dim as u64 || d % 2 != 0 {
            return Err(EngineError::InvalidModel(format!(
                "GGUF: phi3.rope.dimension_count {d} must be even and in 2..={} (the head dimension)",
                cfg.head_dim
            )));
        }
        cfg.rotary_dim = (d as usize != cfg.head_dim).then_some(d as usize);
    }
    let window = match num("attention.sliding_window")? {
        None | Some(0) => None,
        Some(w) if w > MAX_POSITIONS as u64 => {
            return Err(EngineError::InvalidModel(format!("GGUF: phi3.attention.sliding_window {w} is past {MAX_POSITIONS}")))
        }
        Some(w) => Some(w as usize).filter(|&w| w < cfg.max_position_embeddings),
    };
    window_config::apply(cfg, vec![true; cfg.num_layers], window);
    Ok(())
}

/// LongRoPE's metadata in a `phi3` GGUF: the original context length and the attention factor.
pub struct LongRopeKeys {
    original: Option<u64>,
    attention_factor: Option<f64>,
}

impl LongRopeKeys {
    pub fn read(md: &Metadata) -> Result<Self> {
        let err = |e| EngineError::InvalidModel(format!("GGUF: {e}"));
        Ok(Self {
            original: gguf_meta::get_u64(md, "phi3.rope.scaling.original_context_length").map_err(err)?,
            attention_factor: gguf_meta::get_f64(md, "phi3.rope.scaling.attn_factor").map_err(err)?,
        })
    }

    /// LongRoPE from the `rope_factors_short` and `rope_factors_long` tensors (one factor per
    /// rotated pair) and these keys; `None` when the file has no factors (Phi-3-mini-4k).
    pub fn scaling(&self, src: &mut dyn WeightSource, cfg: &ModelConfig) -> Result<Option<RopeScaling>> {
        if !src.contains("rope_factors_long") && !src.contains("rope_factors_short") {
            return Ok(None);
        }
        let half = cfg.rotary_dim.unwrap_or(cfg.head_dim) / 2;
        let mut factors = |name: &str| -> Result<Vec<f32>> {
            let v: Vec<f32> = src.tensor(&format!("{name}.weight"), &[half], candle_core::DType::F32)?.to_vec1()?;
            match v.iter().find(|f| !(f.is_finite() && **f > 0.0 && **f <= 1e6)) {
                Some(f) => Err(EngineError::InvalidModel(format!(
                    "GGUF: {name} holds {f}; factors must be finite, positive, at most 1e6"
                ))),
                None => Ok(v),
            }
        };
        let (short_factor, long_factor) = (factors("rope_factors_short")?, factors("rope_factors_long")?);
        let original = match self.original {
            Some(n) if (1..=MAX_POSITIONS as u64).contains(&n) => n as usize,
            Some(n) => {
                return Err(EngineError::InvalidModel(format!(
                    "GGUF: phi3.rope.scaling.original_context_length {n} must be in 1..={MAX_POSITIONS}"
                )))
            }
            None => {
                return Err(EngineError::InvalidModel("GGUF metadata lacks phi3.rope.scaling.original_context_length".into()))
            }
        };
        let attention_factor = match self.attention_factor {
            None => 1.0,
            Some(a) if a.is_finite() && a > 0.0 && a < 1e3 => a,
            Some(a) => {
                return Err(EngineError::InvalidModel(format!(
                    "GGUF: phi3.rope.scaling.attn_factor {a} must be finite and positive"
                )))
            }
        };
        Ok(Some(RopeScaling::LongRope {
            short_factor,
            long_factor,
            original_max_position_embeddings: original,
            attention_factor,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn load(extra: Value) -> Result<ModelConfig> {
        let mut c = crate::model::config::test_config("phi3", 2, extra);
        c["hidden_size"] = 32.into();
        c["num_attention_heads"] = 2.into();
        ModelConfig::from_hf_json(&c.to_string())
    }

    fn longrope(short: Value, long: Value) -> Value {
        json!({"rope_scaling": {"type": "longrope", "short_factor": short, "long_factor": long}})
    }

    #[test]
    fn reads_partial_rotary_window_and_longrope() {
        let c = load(json!({"partial_rotary_factor": 0.75, "sliding_window": 8})).unwrap();
        assert_eq!((c.rotary_dim, c.sliding_window, c.sliding_layers.clone()), (Some(12), Some(8), vec![true, true]));
        // transformers 5 form: the factor in rope_parameters wins.
        let c = load(json!({"partial_rotary_factor": 1.0, "rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.5}}))
            .unwrap();
        assert_eq!(c.rotary_dim, Some(8));
        // A window as long as the context never slides.
        let c = load(json!({"sliding_window": 64})).unwrap();
        assert_eq!((c.sliding_window, c.rotary_dim), (None, None));
        // LongRoPE: one factor per pair; the original length from the top level (Phi3Config's
        // default 4096 when absent), the attention factor from the lengths' ratio.
        let mut v = longrope(json!(vec![1.0; 8]), json!(vec![2.0; 8]));
        v["original_max_position_embeddings"] = 16.into();
        let c = load(v).unwrap();
        let Some(RopeScaling::LongRope { original_max_position_embeddings, attention_factor, .. }) = c.rope_scaling else {
            panic!("{:?}", c.rope_scaling)
        };
        assert_eq!(original_max_position_embeddings, 16);
        assert!((attention_factor - (1.0 + 4f64.ln() / 16f64.ln()).sqrt()).abs() < 1e-12);
    }

    #[test]
    fn absurd_values_are_typed_errors() {
        let bad = [
            json!({"partial_rotary_factor": 0.0}),
            json!({"partial_rotary_factor": -0.5}),
            json!({"partial_rotary_factor": 1.5}),
            json!({"partial_rotary_factor": "0.5"}),
            json!({"partial_rotary_factor": 0.01}),
            json!({"partial_rotary_factor": 0.35}),
            json!({"sliding_window": 0}),
            json!({"sliding_window": -4}),
            json!({"sliding_window": 1e300}),
            longrope(json!(vec![1.0; 7]), json!(vec![2.0; 8])),
            longrope(json!(vec![1.0; 8]), json!(null)),
            longrope(json!([1.0, -1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]), json!(vec![2.0; 8])),
            longrope(json!(vec![1e300; 8]), json!(vec![2.0; 8])),
            longrope(json!("1,2"), json!(vec![2.0; 8])),
            longrope(json!(vec![1.0; 1 << 20]), json!(vec![2.0; 8])),
        ];
        for extra in bad {
            let e = load(extra.clone()).expect_err(&extra.to_string());
            assert_eq!(e.code(), "INVALID_MODEL", "{extra}: {e}");
        }
        let mut v = longrope(json!(vec![1.0; 8]), json!(vec![2.0; 8]));
        v["original_max_position_embeddings"] = 0.into();
        assert_eq!(load(v).unwrap_err().code(), "INVALID_MODEL");
    }
}
