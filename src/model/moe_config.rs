//! What a Qwen3-MoE `config.json` (`qwen3_moe`, `Qwen3MoeForCausalLM`) adds to Qwen3's fields:
//! a routed feed-forward block ("MoE experts", never to be confused with the PEFT experts this
//! engine attaches) in place of the gated MLP on some layers, with transformers' defaults
//! (`Qwen3MoeConfig`) where a field is absent:
//! - `num_experts` (`num_local_experts`), default 128: MoE experts per routed layer, each a
//!   SiLU-gated MLP of `moe_intermediate_size` (default 768);
//! - `num_experts_per_tok`, default 8: how many of them each token runs (the router's top-k);
//! - `norm_topk_prob`, default false: the top-k routing weights renormalised to sum to 1;
//! - which layers route: every `decoder_sparse_step`-th (default 1: all), except those listed in
//!   `mlp_only_layers`, which keep a dense MLP of `intermediate_size`; none when `num_experts`
//!   is 0.
//!
//! A GGUF file (`general.architecture` `qwen3moe`) routes every layer and holds
//! `qwen3moe.expert_count`, `.expert_used_count` and `.expert_feed_forward_length`; llama.cpp
//! always renormalises the top-k weights of this architecture, and so does [`read_gguf`].
//! Shared experts (Qwen2-MoE's `shared_expert_intermediate_size`, GGUF `expert_shared_count`)
//! and gating functions other than softmax are refused by name: not implemented.

use serde_json::Value;

use super::config::{ModelConfig, MAX_DIM};
use crate::error::{EngineError, Result};
use crate::gguf_meta::{self, Metadata};

/// Most MoE experts a layer may declare (released models have up to 512).
pub const MAX_EXPERTS: usize = 1 << 12;

/// A routed feed-forward block as a configuration declares it.
#[derive(Clone, Debug, PartialEq)]
pub struct RoutedFfn {
    pub num_experts: usize,
    /// The router's top-k.
    pub experts_per_token: usize,
    /// Each MoE expert's MLP width.
    pub intermediate_size: usize,
    /// The top-k routing weights renormalised to sum to 1.
    pub norm_topk_prob: bool,
    /// Per layer, whether it routes (the others keep the dense MLP).
    pub routed_layers: Vec<bool>,
}

fn invalid(from: &str, m: String) -> EngineError {
    EngineError::InvalidModel(format!("{from}: {m}"))
}

impl RoutedFfn {
    /// Invariants the layer plan and the routed block rely on, checked once.
    pub(super) fn checked(self, from: &str) -> Result<Self> {
        if self.num_experts > MAX_EXPERTS {
            return Err(invalid(from, format!("{} MoE experts (at most {MAX_EXPERTS})", self.num_experts)));
        }
        if self.routed_layers.iter().any(|&r| r) {
            if self.experts_per_token == 0 || self.experts_per_token > self.num_experts {
                return Err(invalid(
                    from,
                    format!("num_experts_per_tok {} must be in 1..={} (num_experts)", self.experts_per_token, self.num_experts),
                ));
            }
            if self.intermediate_size == 0 || self.intermediate_size > MAX_DIM {
                return Err(invalid(from, format!("moe_intermediate_size {} must be in 1..={MAX_DIM}", self.intermediate_size)));
            }
        }
        Ok(self)
    }
}

/// Reads the routed-FFN fields of a `qwen3_moe` `config.json` into `cfg` (common fields read).
pub fn read(raw: &Value, cfg: &mut ModelConfig) -> Result<()> {
    const FROM: &str = "config.json (qwen3_moe)";
    let get = |k: &str| raw.get(k).filter(|v| !v.is_null());
    for k in ["shared_expert_intermediate_size", "n_shared_experts"] {
        if let Some(v) = get(k).filter(|v| v.as_u64() != Some(0)) {
            return Err(EngineError::UnsupportedArchitecture(format!(
                "{FROM}: {k} = {v} (a shared MoE expert) is not implemented; refusing rather than running without it"
            )));
        }
    }
    let size = |k: &str, default: usize| -> Result<usize> {
        match get(k) {
            None => Ok(default),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| invalid(FROM, format!("{k} must be a whole number, got {v}"))),
        }
    };
    let num_experts = match get("num_experts") {
        Some(_) => size("num_experts", 128)?,
        None => size("num_local_experts", 128)?,
    };
    let n = cfg.num_layers;
    let step = size("decoder_sparse_step", 1)?;
    if step == 0 {
        return Err(invalid(FROM, "decoder_sparse_step must be at least 1".into()));
    }
    let mut routed: Vec<bool> = (0..n).map(|i| num_experts > 0 && (i + 1).is_multiple_of(step)).collect();
    match get("mlp_only_layers") {
        None => {}
        Some(Value::Array(list)) => {
            for v in list {
                match v.as_u64().and_then(|i| usize::try_from(i).ok()).filter(|&i| i < n) {
                    Some(i) => routed[i] = false,
                    None => {
                        return Err(invalid(FROM, format!("mlp_only_layers entries must be layer indices below {n}, got {v}")))
                    }
                }
            }
        }
        Some(v) => return Err(invalid(FROM, format!("mlp_only_layers must be a list, got {v}"))),
    }
    let norm_topk_prob = match get("norm_topk_prob") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(invalid(FROM, format!("norm_topk_prob must be true or false, got {v}"))),
    };
    let moe = RoutedFfn {
        num_experts,
        experts_per_token: size("num_experts_per_tok", 8)?,
        intermediate_size: size("moe_intermediate_size", 768)?,
        norm_topk_prob,
        routed_layers: routed,
    };
    cfg.moe = Some(moe.checked(FROM)?);
    Ok(())
}

/// Reads them from a `qwen3moe` GGUF's metadata as llama.cpp's converter writes them.
pub fn read_gguf(md: &Metadata, arch: &str, cfg: &mut ModelConfig) -> Result<()> {
    let from = format!("GGUF ({arch})");
    let key = |k: &str| format!("{arch}.{k}");
    let num = |k: &str| -> Result<Option<u64>> { gguf_meta::get_u64(md, &key(k)).map_err(|e| invalid(&from, e)) };
    let req = |k: &str| -> Result<usize> {
        num(k)?
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| EngineError::InvalidModel(format!("GGUF metadata lacks {}", key(k))))
    };
    if let Some(s) = num("expert_shared_count")?.filter(|&s| s > 0) {
        return Err(EngineError::UnsupportedArchitecture(format!(
            "GGUF: {} = {s} (shared MoE experts) is not implemented; refusing rather than running without it",
            key("expert_shared_count")
        )));
    }
    // llama.cpp's `LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX` is 1.
    if let Some(g) = num("expert_gating_func")?.filter(|&g| g != 1) {
        return Err(EngineError::UnsupportedArchitecture(format!(
            "GGUF: {} = {g} (a MoE gating function other than softmax) is not implemented",
            key("expert_gating_func")
        )));
    }
    let num_experts = req("expert_count")?;
    let moe = RoutedFfn {
        num_experts,
        experts_per_token: req("expert_used_count")?,
        intermediate_size: req("expert_feed_forward_length")?,
        norm_topk_prob: true,
        routed_layers: vec![num_experts > 0; cfg.num_layers],
    };
    cfg.moe = Some(moe.checked(&from)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::test_config;
    use serde_json::json;

    fn read(extra: Value) -> Result<ModelConfig> {
        ModelConfig::from_hf_json(&test_config("qwen3_moe", 4, extra).to_string())
    }

    #[test]
    fn defaults_and_layer_selection_follow_transformers() {
        let c = read(json!({"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 4})).unwrap();
        let m = c.moe.unwrap();
        assert_eq!((m.num_experts, m.experts_per_token, m.intermediate_size, m.norm_topk_prob), (8, 2, 4, false));
        assert_eq!(m.routed_layers, vec![true; 4]);
        let c = read(json!({"num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 2, "mlp_only_layers": [3],
                            "norm_topk_prob": true}))
        .unwrap();
        let m = c.moe.unwrap();
        assert_eq!((m.routed_layers, m.intermediate_size, m.norm_topk_prob), (vec![false, true, false, false], 768, true));
        // `num_local_experts` is the same field; no experts at all leaves every layer dense.
        let m = read(json!({"num_local_experts": 4, "num_experts_per_tok": 1})).unwrap().moe.unwrap();
        assert_eq!(m.num_experts, 4);
        let m = read(json!({"num_experts": 0})).unwrap().moe.unwrap();
        assert_eq!(m.routed_layers, vec![false; 4]);
    }

    #[test]
    fn absurd_values_are_refused_with_typed_errors() {
        let invalid = [
            json!({"num_experts": 1u64 << 40}),
            json!({"num_experts": -1}),
            json!({"num_experts": 8, "num_experts_per_tok": 9}),
            json!({"num_experts": 8, "num_experts_per_tok": 0}),
            json!({"num_experts": 8, "num_experts_per_tok": 2.5}),
            json!({"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 0}),
            json!({"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 1u64 << 30}),
            json!({"decoder_sparse_step": 0}),
            json!({"mlp_only_layers": [4]}),
            json!({"mlp_only_layers": [-1]}),
            json!({"mlp_only_layers": "all"}),
            json!({"norm_topk_prob": "yes"}),
        ];
        for extra in invalid {
            let e = read(extra.clone()).unwrap_err();
            assert_eq!(e.code(), "INVALID_MODEL", "{extra}: {e}");
        }
        for extra in [json!({"shared_expert_intermediate_size": 512}), json!({"n_shared_experts": 1})] {
            let e = read(extra.clone()).unwrap_err();
            assert_eq!(e.code(), "UNSUPPORTED_ARCHITECTURE", "{extra}: {e}");
            assert!(e.to_string().contains("shared MoE expert"), "{e}");
        }
        read(json!({"shared_expert_intermediate_size": 0, "mlp_only_layers": null})).unwrap();
    }
}
