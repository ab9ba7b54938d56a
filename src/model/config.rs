//! Model configuration, read from an HF `config.json` (transformers 4.x and 5.x forms) or from
//! GGUF metadata, normalised into one [`ModelConfig`]. What the layers are made of is decided
//! from it in one place, the layer plan ([`super::plan::LayerPlan::build`]).
//!
//! What the readers take from each family:
//! - Llama: plain attention; GGUF files store Q/K rows permuted for interleaved RoPE.
//! - Qwen2: bias on the Q/K/V projections.
//! - Qwen3: per-head RMSNorm on Q and K before RoPE, explicit `head_dim`.

use serde::Deserialize;
use serde_json::Value;

use super::rope::{RopeScaling, Source};
use crate::error::{EngineError, Result};
use crate::gguf_meta::{self, Metadata};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Gemma3,
    Gemma4,
    /// Qwen3.5: Gated DeltaNet layers and gated attention (hybrid_config.rs).
    Qwen35,
    /// LFM2: short convolutions and attention (hybrid_config.rs).
    Lfm2,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
            Arch::Gemma4 => "gemma4",
            Arch::Qwen35 => "qwen3_5_text",
            Arch::Lfm2 => "lfm2",
        }
    }

    fn from_name(name: &str) -> Result<Self> {
        match name {
            // Mistral and Ministral are Llama's network with a sliding window (window_config.rs).
            "llama" | "mistral" | "ministral" => Ok(Arch::Llama),
            // Llama's network with some layers without RoPE (smollm3_config.rs).
            "smollm3" => Ok(Arch::Llama),
            // Llama's network with four multipliers (granite_config.rs).
            "granite" => Ok(Arch::Llama),
            // Llama's network with fused projections, partial rotary and LongRoPE (phi3_config.rs).
            "phi3" => Ok(Arch::Llama),
            "qwen2" => Ok(Arch::Qwen2),
            "qwen3" => Ok(Arch::Qwen3),
            // Qwen3's network with a routed feed-forward block (moe_config.rs); `qwen3moe` in GGUF.
            "qwen3_moe" | "qwen3moe" => Ok(Arch::Qwen3),
            "gemma3_text" | "gemma3" => Ok(Arch::Gemma3),
            // (`gemma4` is also the multimodal checkpoint's `model_type`: its text model is read
            // from `text_config`.)
            "gemma4_text" | "gemma4" => Ok(Arch::Gemma4),
            // (`qwen3_5` is the multimodal checkpoint: its text model is read from `text_config`;
            // `qwen35` in GGUF.)
            "qwen3_5_text" | "qwen3_5" | "qwen35" => Ok(Arch::Qwen35),
            "lfm2" => Ok(Arch::Lfm2),
            other => Err(EngineError::UnsupportedArchitecture(format!(
                "'{other}' (supported: llama, mistral, ministral, smollm3, granite, phi3, qwen2, qwen3, qwen3_moe, gemma3_text, gemma3, gemma4_text, qwen3_5_text, qwen3_5, lfm2)"
            ))),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// The leading features of each head that RoPE turns, where not all (`partial_rotary_factor`).
    pub rotary_dim: Option<usize>,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    /// GGUF llama files permute Q/K rows so that RoPE rotates adjacent pairs.
    pub rope_interleaved: bool,
    /// How the rotary frequencies are stretched past the training context (`None`: they are not).
    pub rope_scaling: Option<RopeScaling>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub qkv_bias: bool,
    pub qk_norm: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// The dtype the checkpoint declares (`torch_dtype` / `dtype`), if any.
    pub declared_dtype: Option<String>,
    /// Per layer, whether it attends within [`Self::sliding_window`] only (empty: no layer does).
    pub sliding_layers: Vec<bool>,
    pub sliding_window: Option<usize>,
    /// The rotary base and scaling of the sliding layers, where they differ from the others'.
    pub local_rope: Option<(f64, Option<RopeScaling>)>,
    /// Scores are scaled by `query_pre_attn_scalar^-½` instead of `head_dim^-½`.
    pub query_pre_attn_scalar: Option<f64>,
    /// `cap · tanh(logits / cap)` on the final logits.
    pub final_logit_softcap: Option<f64>,
    /// Per layer, whether it runs without RoPE (empty: every layer rotates).
    pub no_rope_layers: Vec<bool>,
    /// The text model of a multimodal checkpoint (Gemma 3's `gemma3` with a `text_config`):
    /// its tensors are nested under the language model's name (see the loader).
    pub text_of_multimodal: bool,
    /// Granite's embedding, residual, attention and logit multipliers.
    pub multipliers: Option<super::granite_config::Multipliers>,
    /// Gemma 4's per-layer heads, KV sharing and per-layer input embeddings.
    pub gemma4: Option<super::gemma4_config::Gemma4>,
    /// Qwen3-MoE's routed feed-forward blocks ("MoE experts").
    pub moe: Option<super::moe_config::RoutedFfn>,
    /// Qwen3.5's and LFM2's recurrent layers.
    pub hybrid: Option<super::hybrid_config::Hybrid>,
    /// The family as the checkpoint names it (`config.json`'s `model_type`, a GGUF's
    /// `general.architecture`): `mistral`, `smollm3` or `granite` where [`Self::arch`] is the
    /// network they share (`llama`).
    pub family: String,
}

/// Most layers a config may declare (the largest open models have ~130).
pub const MAX_LAYERS: usize = 1 << 12;
/// Largest hidden, intermediate, head size or head count a config may declare.
pub const MAX_DIM: usize = 1 << 20;
/// Most positions (and vocabulary entries) a config may declare: positions are `u32` in the
/// engine, and 16 M is far past any released model's context.
pub const MAX_POSITIONS: usize = 1 << 24;

/// The subset of HF `config.json` we read. Both the 4.x (`rope_theta`, `rope_scaling`,
/// `torch_dtype`) and the 5.x (`rope_parameters`, `dtype`) spellings are accepted.
#[derive(Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    architectures: Option<Vec<String>>,
    vocab_size: usize,
    hidden_size: usize,
    /// (LFM2 may spell it `block_ff_dim`.)
    intermediate_size: Option<usize>,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    /// LFM2's name for it.
    norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
    rope_parameters: Option<Value>,
    max_position_embeddings: usize,
    /// Phi-3 style: the pretraining length outside the scaling object (HF prefers it).
    original_max_position_embeddings: Option<usize>,
    #[serde(default)]
    tie_word_embeddings: bool,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<Value>,
    torch_dtype: Option<String>,
    dtype: Option<String>,
}

/// `eos_token_id` is a number or a list of numbers (or null). Values that are not token ids
/// (negative, fractional, beyond 32 bits) are skipped, never wrapped onto a real token.
pub fn token_id_list(v: Option<&Value>) -> Vec<u32> {
    let id = |x: &Value| x.as_u64().and_then(|n| u32::try_from(n).ok());
    match v {
        Some(Value::Array(a)) => a.iter().filter_map(id).collect(),
        Some(x) => id(x).into_iter().collect(),
        None => vec![],
    }
}

/// `{arch}.rope.scaling.*` as llama.cpp writes it, in HF's terms. llama.cpp's `attn_factor`
/// multiplies YaRN's own `0.1·ln(factor) + 1`, where HF's `attention_factor` replaces it.
/// (Llama 3 scaling reaches GGUF as a `rope_freqs` tensor instead; the loader reads it.)
fn gguf_rope_scaling(md: &Metadata, arch: &str, context_length: usize) -> Result<Option<RopeScaling>> {
    let key = |k: &str| format!("{arch}.rope.scaling.{k}");
    let Some(ty) = gguf_meta::get_str(md, &key("type")).ok().flatten() else { return Ok(None) };
    let float = |k: &str| gguf_meta::get_f64(md, &key(k)).ok().flatten();
    let mut v = serde_json::json!({ "rope_type": ty });
    let mut put = |k: &str, x: Option<f64>| {
        if let Some(x) = x {
            v[k] = x.into();
        }
    };
    put("factor", float("factor"));
    put(
        "original_max_position_embeddings",
        gguf_meta::get_u64(md, &key("original_context_length")).ok().flatten().map(|n| n as f64),
    );
    put("beta_fast", float("yarn_beta_fast"));
    put("beta_slow", float("yarn_beta_slow"));
    let scaling = RopeScaling::parse(&v, Source::Config, context_length, None)?;
    Ok(match (scaling, float("attn_factor")) {
        (
            Some(RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                attention_factor,
                beta_fast,
                beta_slow,
                truncate,
            }),
            Some(a),
        ) if a.is_finite() && a > 0.0 => {
            let attention_factor = attention_factor * a;
            Some(RopeScaling::Yarn { factor, original_max_position_embeddings, attention_factor, beta_fast, beta_slow, truncate })
        }
        (s, _) => s,
    })
}

/// `{arch}.final_logit_softcapping` as llama.cpp reads it (the Gemma families): absent or 0 is
/// no soft-cap; anything else must be a cap it could apply.
pub(super) fn gguf_final_logit_softcap(md: &Metadata, arch: &str) -> Result<Option<f64>> {
    let key = format!("{arch}.final_logit_softcapping");
    match gguf_meta::get_f64(md, &key).map_err(|e| EngineError::InvalidModel(format!("GGUF: {e}")))? {
        None | Some(0.0) => Ok(None),
        Some(c) if c.is_finite() && c > 0.0 => Ok(Some(c)),
        Some(c) => Err(EngineError::InvalidModel(format!("GGUF: {key} must be a finite positive number, got {c}"))),
    }
}

impl ModelConfig {
    /// Parses HF `config.json` text.
    pub fn from_hf_json(text: &str) -> Result<Self> {
        let raw: Value =
            serde_json::from_str(text).map_err(|e| EngineError::invalid_model("config.json is not valid JSON", e))?;
        let multimodal = [
            ("gemma3", super::gemma3_config::multimodal_text_config(&raw)?),
            ("gemma4", super::gemma4_config::multimodal_text_config(&raw)?),
            ("qwen3_5", super::multimodal::text_config(&raw, "qwen3_5", "qwen3_5_text", serde_json::json!({}))?),
        ];
        for (family, text_config) in multimodal {
            if let Some(text_config) = text_config {
                let mut cfg = Self::from_hf_value(&text_config)?;
                cfg.text_of_multimodal = true;
                cfg.family = family.into();
                return Ok(cfg);
            }
        }
        Self::from_hf_value(&raw)
    }

    /// Reads a parsed text model `config.json`.
    fn from_hf_value(raw: &Value) -> Result<Self> {
        let hf = HfConfig::deserialize(raw).map_err(|e| EngineError::invalid_model("config.json", e))?;
        let model_type = hf
            .model_type
            .clone()
            .or_else(|| {
                let a = hf.architectures.as_ref()?.first()?.to_lowercase();
                // (`Qwen3MoeForCausalLM` before `qwen3`, which it starts with.)
                if a.starts_with("qwen3moe") {
                    return Some("qwen3_moe".into());
                }
                ["qwen3", "qwen2", "llama", "mistral", "ministral", "smollm3", "granite", "phi3"]
                    .into_iter()
                    .find(|p| a.starts_with(p))
                    .map(String::from)
            })
            .ok_or_else(|| EngineError::InvalidModel("config.json has no model_type".into()))?;
        let arch = Arch::from_name(&model_type)?;
        if hf.mlp_bias == Some(true) {
            // The MLP projections would silently run without their biases.
            return Err(EngineError::UnsupportedArchitecture("config.json: mlp_bias = true is not supported".into()));
        }

        // transformers 5.x moves the theta and the scaling into `rope_parameters`.
        // (Gemma 3 keys them by layer type: read with its other fields below.)
        let mut rope_scaling = None;
        // Phi3Config always has an original length (4096 by default), which HF prefers.
        let original = match model_type.as_str() {
            "phi3" => Some(super::phi3_config::original_length(hf.original_max_position_embeddings)),
            _ => hf.original_max_position_embeddings,
        };
        for v in
            [&hf.rope_scaling, &hf.rope_parameters].into_iter().flatten().filter(|_| !matches!(arch, Arch::Gemma3 | Arch::Gemma4))
        {
            let s = RopeScaling::parse(v, Source::Config, hf.max_position_embeddings, original)?;
            rope_scaling = rope_scaling.or(s);
        }
        let rope_theta = hf.rope_theta.or_else(|| hf.rope_parameters.as_ref()?.get("rope_theta")?.as_f64()).unwrap_or(10_000.0);

        let num_kv_heads = hf.num_key_value_heads.unwrap_or(hf.num_attention_heads);
        let head_dim = hf.head_dim.unwrap_or(hf.hidden_size / hf.num_attention_heads.max(1));
        let cfg = ModelConfig {
            arch,
            vocab_size: hf.vocab_size,
            hidden_size: hf.hidden_size,
            intermediate_size: match (hf.intermediate_size, raw.get("block_ff_dim").and_then(Value::as_u64)) {
                (Some(n), _) => n,
                (None, Some(n)) => usize::try_from(n).unwrap_or(usize::MAX),
                (None, None) => return Err(EngineError::InvalidModel("config.json lacks intermediate_size".into())),
            },
            num_layers: hf.num_hidden_layers,
            num_heads: hf.num_attention_heads,
            num_kv_heads,
            head_dim,
            rotary_dim: None,
            rms_norm_eps: hf
                .rms_norm_eps
                .or(hf.norm_eps)
                .ok_or_else(|| EngineError::InvalidModel("config.json lacks rms_norm_eps".into()))?,
            rope_theta,
            rope_interleaved: false,
            rope_scaling,
            max_position_embeddings: hf.max_position_embeddings,
            tie_word_embeddings: hf.tie_word_embeddings,
            qkv_bias: match arch {
                Arch::Qwen2 => true,
                _ => hf.attention_bias.unwrap_or(false),
            },
            qk_norm: matches!(arch, Arch::Qwen3 | Arch::Gemma4),
            bos_token_id: hf.bos_token_id,
            eos_token_ids: token_id_list(hf.eos_token_id.as_ref()),
            declared_dtype: hf.dtype.or(hf.torch_dtype),
            sliding_layers: Vec::new(),
            sliding_window: None,
            local_rope: None,
            query_pre_attn_scalar: None,
            final_logit_softcap: None,
            no_rope_layers: Vec::new(),
            text_of_multimodal: false,
            multipliers: None,
            gemma4: None,
            moe: None,
            hybrid: None,
            family: String::new(),
        };
        let mut cfg = cfg;
        cfg.family = model_type.chars().take(64).collect();
        cfg.check_layer_count()?;
        if arch == Arch::Gemma3 {
            super::gemma3_config::read(raw, &mut cfg, hf.original_max_position_embeddings)?;
        }
        if arch == Arch::Gemma4 {
            super::gemma4_config::read(raw, &mut cfg)?;
        }
        if matches!(model_type.as_str(), "mistral" | "ministral") {
            super::window_config::read_mistral(raw, &model_type, &mut cfg)?;
        }
        if model_type == "smollm3" {
            super::smollm3_config::read(raw, &mut cfg)?;
        }
        if model_type == "granite" {
            super::granite_config::read(raw, &mut cfg)?;
        }
        if model_type == "phi3" {
            super::phi3_config::read(raw, &mut cfg)?;
        }
        if model_type == "qwen3_moe" {
            super::moe_config::read(raw, &mut cfg)?;
        }
        match arch {
            Arch::Qwen35 => super::hybrid_config::read_qwen35(raw, &mut cfg)?,
            Arch::Lfm2 => super::hybrid_config::read_lfm2(raw, &mut cfg)?,
            _ => {}
        }
        cfg.validate()?;
        super::unimplemented::check_hf(raw, arch, &model_type)?;
        Ok(cfg)
    }

    /// Reads `{arch}.*` GGUF metadata the way llama.cpp writes it.
    pub fn from_gguf(md: &Metadata) -> Result<Self> {
        // A value of the wrong type reads as absent here (`.ok().flatten()`).
        let s = |k: &str| gguf_meta::get_str(md, k).ok().flatten().map(str::to_owned);
        let arch_name =
            s("general.architecture").ok_or_else(|| EngineError::InvalidModel("GGUF has no general.architecture".into()))?;
        let arch = Arch::from_name(&arch_name)?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let num = |k: &str| gguf_meta::get_u64(md, &key(k)).ok().flatten();
        let req = |k: &str| -> Result<usize> {
            num(k).map(|n| n as usize).ok_or_else(|| EngineError::InvalidModel(format!("GGUF metadata lacks {}", key(k))))
        };
        let float = |k: &str| gguf_meta::get_f64(md, &key(k)).ok().flatten();
        // llama.cpp writes some per-layer sizes as lists (Gemma 4's feed-forward widths): the
        // first layer's stands for the model here, and the family reader reads the list.
        let first = |k: &str| -> Option<usize> {
            let list = gguf_meta::get_int_array(md, &key(k)).ok().flatten()?;
            list.first().and_then(|&x| usize::try_from(x).ok())
        };
        let req = |k: &str| -> Result<usize> { req(k).or_else(|e| first(k).ok_or(e)) };

        let hidden_size = req("embedding_length")?;
        let num_heads = req("attention.head_count")?;
        let vocab_size = match num("vocab_size") {
            Some(n) => n as usize,
            None => gguf_meta::get_array(md, "tokenizer.ggml.tokens")
                .ok()
                .flatten()
                .map(|v| v.len())
                .ok_or_else(|| EngineError::InvalidModel("GGUF has neither vocab_size nor tokens".into()))?,
        };
        let tok_id = |k: &str| gguf_meta::get_u32(md, k).ok().flatten();
        let cfg = ModelConfig {
            arch,
            vocab_size,
            hidden_size,
            intermediate_size: req("feed_forward_length")?,
            num_layers: req("block_count")?,
            num_heads,
            num_kv_heads: num("attention.head_count_kv").map(|n| n as usize).unwrap_or(num_heads),
            head_dim: num("attention.key_length").map(|n| n as usize).unwrap_or(hidden_size / num_heads.max(1)),
            rotary_dim: None,
            rms_norm_eps: float("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
            rope_theta: float("rope.freq_base").unwrap_or(10_000.0),
            // llama.cpp's Llama-network files permute Q/K rows; its phi3 ones rotate halves (NEOX).
            rope_interleaved: arch == Arch::Llama && arch_name != "phi3",
            // Read below (it needs the context length).
            rope_scaling: None,
            max_position_embeddings: num("context_length").map(|n| n as usize).unwrap_or(4096),
            // Decided by the loader from the presence of `output.weight`.
            tie_word_embeddings: false,
            qkv_bias: arch == Arch::Qwen2,
            qk_norm: matches!(arch, Arch::Qwen3 | Arch::Gemma3 | Arch::Gemma4),
            bos_token_id: tok_id("tokenizer.ggml.bos_token_id"),
            eos_token_ids: ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"]
                .iter()
                .filter_map(|k| tok_id(k))
                .collect(),
            declared_dtype: None,
            sliding_layers: Vec::new(),
            sliding_window: None,
            local_rope: None,
            query_pre_attn_scalar: None,
            final_logit_softcap: None,
            no_rope_layers: Vec::new(),
            text_of_multimodal: false,
            multipliers: None,
            gemma4: None,
            moe: None,
            hybrid: None,
            family: String::new(),
        };
        let mut cfg = cfg;
        cfg.family = arch_name.chars().take(64).collect();
        cfg.check_layer_count()?;
        cfg.rope_scaling = gguf_rope_scaling(md, &arch_name, cfg.max_position_embeddings)?;
        if arch == Arch::Gemma3 {
            super::gemma3_config::read_gguf(md, &arch_name, &mut cfg)?;
        }
        if arch_name == "smollm3" {
            cfg.no_rope_layers = super::smollm3_config::gguf_no_rope_layers(cfg.num_layers);
        }
        if arch_name == "granite" {
            super::granite_config::read_gguf(md, &mut cfg)?;
        }
        if arch_name == "phi3" {
            super::phi3_config::read_gguf(md, &mut cfg)?;
        }
        if arch == Arch::Gemma4 {
            super::gemma4_config::read_gguf(md, &mut cfg)?;
        }
        if arch_name == "qwen3moe" {
            super::moe_config::read_gguf(md, &arch_name, &mut cfg)?;
        }
        if matches!(arch, Arch::Qwen35 | Arch::Lfm2) {
            super::hybrid_config::read_gguf(md, &arch_name, &mut cfg)?;
        }
        cfg.validate()?;
        super::unimplemented::check_gguf(md, &arch_name, arch, cfg.rotary_dim.unwrap_or(cfg.head_dim))?;
        Ok(cfg)
    }

    /// The head dimension of the full-attention layers (Gemma 4's are wider than the others').
    pub fn head_dim_full(&self) -> usize {
        let full = |g: &super::gemma4_config::Gemma4| {
            g.heads.iter().zip(&self.sliding_layers).find(|(_, sliding)| !**sliding).map(|(h, _)| h.1)
        };
        self.gemma4.as_ref().and_then(full).unwrap_or(self.head_dim)
    }

    /// The layer count, checked before the family readers size their per-layer lists by it.
    fn check_layer_count(&self) -> Result<()> {
        if self.num_layers == 0 || self.num_layers > MAX_LAYERS {
            return Err(EngineError::InvalidModel(format!("{} layers (must be 1..={MAX_LAYERS})", self.num_layers)));
        }
        Ok(())
    }

    /// Invariants the decoder relies on, checked once here.
    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(EngineError::InvalidModel(m));
        if self.num_heads == 0 || self.num_kv_heads == 0 || self.head_dim == 0 || self.num_layers == 0 {
            return bad("heads, kv heads, head_dim and layers must all be positive".into());
        }
        // Grouped-query attention maps `num_heads / num_kv_heads` query heads onto each KV head.
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_heads, self.num_kv_heads
            ));
        }
        // RoPE rotates pairs of dimensions.
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!("head_dim {} must be even", self.head_dim));
        }
        let rotary_dim = self.rotary_dim.unwrap_or(self.head_dim);
        if let Some(RopeScaling::LongRope { short_factor, long_factor, .. }) = &self.rope_scaling {
            if short_factor.len() != rotary_dim / 2 || long_factor.len() != rotary_dim / 2 {
                return bad(format!(
                    "longrope: short_factor and long_factor need {} entries each (one per rotated pair), have {} and {}",
                    rotary_dim / 2,
                    short_factor.len(),
                    long_factor.len()
                ));
            }
        }
        if self.vocab_size == 0 || self.hidden_size == 0 || self.intermediate_size == 0 {
            return bad("vocab_size, hidden_size and intermediate_size must be positive".into());
        }
        // Sizes come from a file we do not trust: bound them before anything is sized by them
        // (the loader then checks every tensor against them, so a file must also hold them).
        let limits = [
            ("num_hidden_layers", self.num_layers, MAX_LAYERS),
            ("num_attention_heads", self.num_heads, MAX_DIM),
            ("head_dim", self.head_dim, MAX_DIM),
            ("hidden_size", self.hidden_size, MAX_DIM),
            ("intermediate_size", self.intermediate_size, MAX_DIM),
            ("vocab_size", self.vocab_size, MAX_POSITIONS),
            ("max_position_embeddings", self.max_position_embeddings, MAX_POSITIONS),
        ];
        for (name, v, max) in limits {
            if v > max {
                return bad(format!("{name} {v} is larger than this engine supports ({max})"));
            }
        }
        if self.max_position_embeddings == 0 {
            return bad("max_position_embeddings (context_length) must be positive".into());
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return bad(format!("rope_theta must be a finite positive number, got {}", self.rope_theta));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            return bad(format!("rms_norm_eps must be a finite number >= 0, got {}", self.rms_norm_eps));
        }
        Ok(())
    }
}

/// A small `config.json` of `model_type` with `layers` layers, `extra`'s fields set on top: the
/// family readers' tests start from it.
#[cfg(test)]
pub(crate) fn test_config(model_type: &str, layers: usize, extra: Value) -> Value {
    let mut c = serde_json::json!({
        "model_type": model_type, "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": layers, "num_attention_heads": 2, "num_key_value_heads": 1,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 64
    });
    for (k, v) in extra.as_object().expect("extra fields are an object") {
        c[k] = v.clone();
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> serde_json::Value {
        serde_json::json!({
            "model_type": "qwen3", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 6,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 64, "eos_token_id": [3, 4], "bos_token_id": null
        })
    }

    #[test]
    fn untrusted_sizes_and_values_are_refused() {
        let bad: [(&str, serde_json::Value); 8] = [
            ("num_hidden_layers", 1_000_000_000u64.into()),
            ("max_position_embeddings", 1_000_000_000u64.into()),
            ("max_position_embeddings", (1u64 << 63).into()),
            ("max_position_embeddings", 0.into()),
            ("hidden_size", (1u64 << 40).into()),
            ("rope_theta", 0.0.into()),
            ("rope_theta", (-1.0).into()),
            ("rms_norm_eps", (-1e-6).into()),
        ];
        for (k, v) in bad {
            let mut c = base();
            c[k] = v.clone();
            let e = ModelConfig::from_hf_json(&c.to_string()).unwrap_err();
            assert!(matches!(e, EngineError::InvalidModel(_)), "{k} = {v}: {e:?}");
        }
        let mut c = base();
        c["max_position_embeddings"] = MAX_POSITIONS.into();
        assert!(ModelConfig::from_hf_json(&c.to_string()).is_ok());
    }

    #[test]
    fn eos_ids_beyond_32_bits_are_skipped_and_mlp_bias_is_refused() {
        let mut c = base();
        c["eos_token_id"] = serde_json::json!([3, (1u64 << 32) + 5, -1, 2.5, "x"]);
        assert_eq!(ModelConfig::from_hf_json(&c.to_string()).unwrap().eos_token_ids, vec![3]);
        let mut c = base();
        c["mlp_bias"] = true.into();
        let e = ModelConfig::from_hf_json(&c.to_string()).unwrap_err();
        assert!(matches!(e, EngineError::UnsupportedArchitecture(_)), "{e:?}");
    }

    #[test]
    fn reads_both_config_forms() {
        let mut v4 = base();
        v4["rope_theta"] = 1e6.into();
        v4["rope_scaling"] = serde_json::Value::Null;
        v4["torch_dtype"] = "bfloat16".into();
        let c = ModelConfig::from_hf_json(&v4.to_string()).unwrap();
        assert_eq!((c.rope_theta, c.head_dim, c.eos_token_ids.clone()), (1e6, 6, vec![3, 4]));
        assert_eq!(c.declared_dtype.as_deref(), Some("bfloat16"));
        assert!(c.qk_norm && c.bos_token_id.is_none());

        let mut v5 = base();
        v5["rope_parameters"] = serde_json::json!({"rope_theta": 5e5, "rope_type": "default"});
        v5["dtype"] = "float32".into();
        v5["eos_token_id"] = 7.into();
        let c = ModelConfig::from_hf_json(&v5.to_string()).unwrap();
        assert_eq!((c.rope_theta, c.eos_token_ids.clone()), (5e5, vec![7]));
    }

    #[test]
    fn reads_rope_scaling_in_both_forms() {
        let mut v4 = base();
        v4["rope_scaling"] = serde_json::json!({"type": "linear", "factor": 2.0});
        let c = ModelConfig::from_hf_json(&v4.to_string()).unwrap();
        assert_eq!(c.rope_scaling, Some(RopeScaling::Linear { factor: 2.0 }));
        let mut v5 = base();
        v5["rope_parameters"] =
            serde_json::json!({"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16});
        let c = ModelConfig::from_hf_json(&v5.to_string()).unwrap();
        assert_eq!((c.rope_theta, c.rope_scaling.as_ref().map(|s| s.original_length(64))), (1e6, Some(16)));
    }

    #[test]
    fn rejects_unknown_rope_scaling_and_arch() {
        let mut v = base();
        v["rope_scaling"] = serde_json::json!({"rope_type": "mrope", "mrope_section": [16, 24, 24]});
        let e = ModelConfig::from_hf_json(&v.to_string()).unwrap_err();
        assert_eq!(e.code(), "UNSUPPORTED_ARCHITECTURE");
        assert!(e.to_string().contains("'mrope'"), "{e}");
        let mut v = base();
        v["model_type"] = "gpt2".into();
        assert_eq!(ModelConfig::from_hf_json(&v.to_string()).unwrap_err().code(), "UNSUPPORTED_ARCHITECTURE");
        let mut v = base();
        v["num_key_value_heads"] = 3.into();
        assert_eq!(ModelConfig::from_hf_json(&v.to_string()).unwrap_err().code(), "INVALID_MODEL");
        assert_eq!(ModelConfig::from_hf_json("{").unwrap_err().code(), "INVALID_MODEL");
    }
}
