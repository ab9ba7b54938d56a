//! What the hybrid families' `config.json` adds: layers whose mixer keeps a recurrent state.
//!
//! - Qwen3.5 (`qwen3_5_text`, and the text model of `qwen3_5`): `layer_types` of
//!   `linear_attention` (a Gated DeltaNet: `linear_num_key_heads` / `linear_num_value_heads`
//!   heads of `linear_key_head_dim` / `linear_value_head_dim`, a causal depthwise convolution of
//!   `linear_conv_kernel_dim` taps over its q/k/v) and `full_attention` (gated attention); by
//!   default every `full_attention_interval`-th (4) layer is full. RoPE turns the leading
//!   `partial_rotary_factor` (0.25) of each head. Its multimodal RoPE sections (`mrope_section`)
//!   rotate text positions as plain RoPE does: every section gets the same position.
//! - LFM2 (`lfm2`): `layer_types` of `conv` (a gated short convolution of `conv_L_cache` taps)
//!   and `full_attention`, or the older `full_attn_idxs`; the MLP width is `intermediate_size`
//!   (`block_ff_dim`) adjusted as `Lfm2MLP` does when `block_auto_adjust_ff_dim`.
//!
//! Sizes come from a file we do not trust: each is bounded here, and the state one sequence
//! keeps is checked against [`MAX_STATE_BYTES`] before anything is sized by it.

use serde_json::Value;

use super::config::{ModelConfig, MAX_DIM};
use super::plan::{DeltaNetSpec, Recurrent, ShortConvSpec};
use crate::error::{EngineError, Result};
use crate::gguf_meta::{self, Metadata};

/// Most bytes of recurrent state one sequence may keep over all layers (Qwen3.5-0.8B keeps
/// about 20 MB; the largest released hybrids a few hundred).
pub const MAX_STATE_BYTES: usize = 1 << 32;
/// Most taps a causal convolution may declare (released models use 3 and 4).
pub const MAX_CONV_KERNEL: usize = 64;

/// LFM2's names for the modules every decoder has (its convolution layers' `conv.*` keep theirs).
pub(super) const LFM2_NAMES: &[(&str, &str)] = &[
    (".self_attn.out_proj.", ".self_attn.o_proj."),
    (".self_attn.q_layernorm.", ".self_attn.q_norm."),
    (".self_attn.k_layernorm.", ".self_attn.k_norm."),
    (".feed_forward.w1.", ".mlp.gate_proj."),
    (".feed_forward.w3.", ".mlp.up_proj."),
    (".feed_forward.w2.", ".mlp.down_proj."),
    (".operator_norm.", ".input_layernorm."),
    (".ffn_norm.", ".post_attention_layernorm."),
    ("model.embedding_norm.", "model.norm."),
];

/// Per layer, its recurrent mixer (`None`: attention).
#[derive(Clone, Debug, PartialEq)]
pub struct Hybrid {
    pub mixers: Vec<Option<Recurrent>>,
}

fn invalid(from: &str, m: String) -> EngineError {
    EngineError::InvalidModel(format!("{from}: {m}"))
}

/// A positive size at most `max`, from a JSON value.
fn size(from: &str, k: &str, v: Option<&Value>, default: Option<usize>, max: usize) -> Result<usize> {
    let n = match v {
        None => default.ok_or_else(|| invalid(from, format!("{k} is missing")))?,
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| invalid(from, format!("{k} must be a non-negative integer, got {v}")))?,
    };
    if n == 0 || n > max {
        return Err(invalid(from, format!("{k} {n} must be in 1..={max}")));
    }
    Ok(n)
}

/// `kinds[i]` is layer `i`'s type as `layer_types` names it: `recurrent` for the recurrent
/// mixer, `full_attention` for attention; any other type is refused by name.
fn kinds_from_types(from: &str, types: &Value, layers: usize, recurrent: &str) -> Result<Vec<bool>> {
    let list = types.as_array().ok_or_else(|| invalid(from, "layer_types must be a list".into()))?;
    if list.len() != layers {
        return Err(invalid(from, format!("layer_types has {} entries for {layers} layers", list.len())));
    }
    list.iter()
        .map(|t| match t.as_str() {
            Some(s) if s == recurrent => Ok(true),
            Some("full_attention") => Ok(false),
            _ => Err(EngineError::UnsupportedArchitecture(format!(
                "{from}: layer type {t} is not implemented (this family has {recurrent} and full_attention)"
            ))),
        })
        .collect()
}

impl DeltaNetSpec {
    /// Channels of the convolution: queries, keys and values.
    pub fn conv_dim(&self) -> usize {
        2 * self.num_k_heads * self.k_head_dim + self.num_v_heads * self.v_head_dim
    }

    /// f32 values of one sequence's state: the convolution's last `conv_kernel - 1` inputs and a
    /// `k_head_dim × v_head_dim` matrix per value head.
    pub fn state_floats(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim() + self.num_v_heads * self.k_head_dim * self.v_head_dim
    }
}

impl ShortConvSpec {
    /// f32 values of one sequence's state: the convolution's last `l_cache - 1` inputs.
    pub fn state_floats(&self) -> usize {
        (self.l_cache - 1) * self.hidden
    }
}

impl Recurrent {
    pub fn state_floats(&self) -> usize {
        match self {
            Recurrent::GatedDeltaNet(d) => d.state_floats(),
            Recurrent::ShortConv(c) => c.state_floats(),
        }
    }
}

/// Checks the recurrent mixers' sizes (each bounded, their state together within
/// [`MAX_STATE_BYTES`]) and stores them in `cfg`.
fn store(from: &str, cfg: &mut ModelConfig, mixers: Vec<Option<Recurrent>>) -> Result<()> {
    let mut total = 0usize;
    for m in mixers.iter().flatten() {
        total = total.saturating_add(m.state_floats().saturating_mul(4));
    }
    if total > MAX_STATE_BYTES {
        return Err(invalid(from, format!("the recurrent layers keep {total} bytes per sequence (at most {MAX_STATE_BYTES})")));
    }
    if mixers.iter().all(Option::is_some) {
        return Err(EngineError::UnsupportedArchitecture(format!("{from}: a model without attention layers")));
    }
    cfg.hybrid = Some(Hybrid { mixers });
    Ok(())
}

/// Reads a `qwen3_5_text` `config.json` (common fields read) into `cfg`.
pub fn read_qwen35(raw: &Value, cfg: &mut ModelConfig) -> Result<()> {
    const FROM: &str = "config.json (qwen3_5_text)";
    let get = |k: &str| raw.get(k).filter(|v| !v.is_null());
    let n = cfg.num_layers;
    let linear = match get("layer_types") {
        Some(t) => kinds_from_types(FROM, t, n, "linear_attention")?,
        None => {
            let every = size(FROM, "full_attention_interval", get("full_attention_interval"), Some(4), MAX_DIM)?;
            (0..n).map(|i| (i + 1) % every != 0).collect()
        }
    };
    let kernel = size(FROM, "linear_conv_kernel_dim", get("linear_conv_kernel_dim"), Some(4), MAX_CONV_KERNEL)?;
    if kernel < 2 {
        return Err(invalid(FROM, format!("linear_conv_kernel_dim {kernel} must be at least 2")));
    }
    let spec = DeltaNetSpec {
        num_k_heads: size(FROM, "linear_num_key_heads", get("linear_num_key_heads"), Some(16), MAX_DIM)?,
        num_v_heads: size(FROM, "linear_num_value_heads", get("linear_num_value_heads"), Some(32), MAX_DIM)?,
        k_head_dim: size(FROM, "linear_key_head_dim", get("linear_key_head_dim"), Some(128), MAX_DIM)?,
        v_head_dim: size(FROM, "linear_value_head_dim", get("linear_value_head_dim"), Some(128), MAX_DIM)?,
        conv_kernel: kernel,
        tiled_heads: false,
    };
    check_delta_net(FROM, &spec)?;
    // The rotated part of each head: `partial_rotary_factor` at the top level (4.x) or in
    // `rope_parameters` (5.x), 0.25 by default.
    let factor = get("partial_rotary_factor")
        .or_else(|| get("rope_parameters")?.get("partial_rotary_factor"))
        .map(|v| v.as_f64().ok_or_else(|| invalid(FROM, format!("partial_rotary_factor must be a number, got {v}"))))
        .transpose()?
        .unwrap_or(0.25);
    cfg.rotary_dim = Some(rotary_dim(FROM, cfg.head_dim, factor)?);
    cfg.qk_norm = true;
    let mixers = linear.into_iter().map(|l| l.then_some(Recurrent::GatedDeltaNet(spec))).collect();
    store(FROM, cfg, mixers)
}

/// The rotated dimension `head_dim · factor` (HF truncates it), even and within the head.
fn rotary_dim(from: &str, head_dim: usize, factor: f64) -> Result<usize> {
    if !(factor.is_finite() && factor > 0.0 && factor <= 1.0) {
        return Err(invalid(from, format!("partial_rotary_factor must be in (0, 1], got {factor}")));
    }
    let dim = (head_dim as f64 * factor) as usize;
    if dim == 0 || !dim.is_multiple_of(2) {
        return Err(invalid(
            from,
            format!("head_dim {head_dim} × partial_rotary_factor {factor} = {dim} must be even and positive"),
        ));
    }
    Ok(dim)
}

fn check_delta_net(from: &str, d: &DeltaNetSpec) -> Result<()> {
    if !d.num_v_heads.is_multiple_of(d.num_k_heads) {
        return Err(invalid(
            from,
            format!("linear_num_value_heads {} must be a multiple of linear_num_key_heads {}", d.num_v_heads, d.num_k_heads),
        ));
    }
    // Every product the layer is sized by, checked once.
    let ok = (2 * d.num_k_heads).checked_mul(d.k_head_dim).is_some()
        && d.num_v_heads.checked_mul(d.v_head_dim).is_some_and(|n| n <= MAX_DIM)
        && d.num_k_heads.checked_mul(d.k_head_dim).is_some_and(|n| n <= MAX_DIM)
        && d.num_v_heads.checked_mul(d.k_head_dim).and_then(|n| n.checked_mul(d.v_head_dim)).is_some();
    if !ok {
        return Err(invalid(from, format!("linear attention of {d:?} is larger than this engine supports")));
    }
    Ok(())
}

/// Reads an `lfm2` `config.json` (common fields read) into `cfg`.
pub fn read_lfm2(raw: &Value, cfg: &mut ModelConfig) -> Result<()> {
    const FROM: &str = "config.json (lfm2)";
    let get = |k: &str| raw.get(k).filter(|v| !v.is_null());
    let n = cfg.num_layers;
    let conv = match (get("layer_types"), get("full_attn_idxs")) {
        (Some(t), _) => kinds_from_types(FROM, t, n, "conv")?,
        (None, Some(idx)) => {
            let idx = idx.as_array().ok_or_else(|| invalid(FROM, "full_attn_idxs must be a list".into()))?;
            let mut conv = vec![true; n];
            for i in idx {
                let i = i.as_u64().and_then(|i| usize::try_from(i).ok()).filter(|&i| i < n);
                conv[i.ok_or_else(|| invalid(FROM, format!("full_attn_idxs holds an index outside 0..{n}")))?] = false;
            }
            conv
        }
        // HF: every layer attends.
        (None, None) => vec![false; n],
    };
    let l_cache = size(FROM, "conv_L_cache", get("conv_L_cache"), Some(3), MAX_CONV_KERNEL)?;
    if l_cache < 2 {
        return Err(invalid(FROM, format!("conv_L_cache {l_cache} must be at least 2")));
    }
    let bias = get("conv_bias").map(|v| v.as_bool() == Some(true)).unwrap_or(false);
    let spec = ShortConvSpec { l_cache, hidden: cfg.hidden_size, bias };
    cfg.intermediate_size = lfm2_ffn_width(FROM, raw, cfg.intermediate_size)?;
    cfg.qk_norm = true;
    let mixers = conv.into_iter().map(|c| c.then_some(Recurrent::ShortConv(spec))).collect();
    store(FROM, cfg, mixers)
}

/// `Lfm2MLP`'s width: with `block_auto_adjust_ff_dim` (default true) two thirds of the declared
/// width, times `block_ffn_dim_multiplier` (default 1) and rounded up to `block_multiple_of`
/// (default 256) where a multiplier is given.
fn lfm2_ffn_width(from: &str, raw: &Value, declared: usize) -> Result<usize> {
    let get = |k: &str| raw.get(k).filter(|v| !v.is_null());
    let declared = match get("block_ff_dim") {
        Some(v) if raw.get("intermediate_size").is_none() => size(from, "block_ff_dim", Some(v), None, MAX_DIM)?,
        _ => declared,
    };
    if get("block_auto_adjust_ff_dim").map(|v| v.as_bool() == Some(false)).unwrap_or(false) {
        return Ok(declared);
    }
    let mut width = 2 * declared / 3;
    // HF's default multiplier is 1.0; only an explicit null skips the rounding.
    let multiplier = match raw.get("block_ffn_dim_multiplier") {
        Some(Value::Null) => None,
        None => Some(1.0),
        Some(v) => Some(v.as_f64().ok_or_else(|| invalid(from, format!("block_ffn_dim_multiplier must be a number, got {v}")))?),
    };
    if let Some(m) = multiplier {
        if !(m.is_finite() && m > 0.0 && m * width as f64 <= MAX_DIM as f64) {
            return Err(invalid(
                from,
                format!("block_ffn_dim_multiplier {m} must be positive and keep the width within {MAX_DIM}"),
            ));
        }
        let of = size(from, "block_multiple_of", get("block_multiple_of"), Some(256), MAX_DIM)?;
        width = ((m * width as f64) as usize).div_ceil(of) * of;
    }
    if width == 0 || width > MAX_DIM {
        return Err(invalid(from, format!("the MLP width {width} must be in 1..={MAX_DIM}")));
    }
    Ok(width)
}

/// Reads the recurrent layers of a GGUF (`qwen35`, `lfm2`) as llama.cpp writes them.
pub fn read_gguf(md: &Metadata, arch_name: &str, cfg: &mut ModelConfig) -> Result<()> {
    let from = format!("GGUF ({arch_name})");
    let key = |k: &str| format!("{arch_name}.{k}");
    let num = |k: &str| -> Result<Option<usize>> {
        let v = gguf_meta::get_u64(md, &key(k)).map_err(|e| invalid(&from, e.to_string()))?;
        v.map(|n| usize::try_from(n).map_err(|_| invalid(&from, format!("{} = {n} is too large", key(k))))).transpose()
    };
    let req = |k: &str, max: usize| -> Result<usize> {
        let n = num(k)?.ok_or_else(|| invalid(&from, format!("metadata lacks {}", key(k))))?;
        if n == 0 || n > max {
            return Err(invalid(&from, format!("{} = {n} must be in 1..={max}", key(k))));
        }
        Ok(n)
    };
    let n = cfg.num_layers;
    match arch_name {
        "qwen35" => {
            // Which layers are recurrent: `attention.recurrent_layers` where the converter wrote
            // it, else every layer but each `full_attention_interval`-th.
            let listed =
                gguf_meta::get_array(md, &key("attention.recurrent_layers")).map_err(|e| invalid(&from, e.to_string()))?;
            let recurrent: Vec<bool> = match listed {
                Some(list) => {
                    let flags: Vec<bool> = list.iter().filter_map(|v| v.to_bool().ok()).collect();
                    if flags.len() != n || list.len() != n {
                        return Err(invalid(&from, format!("attention.recurrent_layers must hold {n} booleans")));
                    }
                    flags
                }
                None => {
                    let every = req("full_attention_interval", MAX_DIM)?;
                    (0..n).map(|i| (i + 1) % every != 0).collect()
                }
            };
            let inner = req("ssm.inner_size", MAX_DIM)?;
            let spec = DeltaNetSpec {
                num_k_heads: req("ssm.group_count", MAX_DIM)?,
                num_v_heads: req("ssm.time_step_rank", MAX_DIM)?,
                k_head_dim: req("ssm.state_size", MAX_DIM)?,
                v_head_dim: 0,
                conv_kernel: req("ssm.conv_kernel", MAX_CONV_KERNEL)?,
                tiled_heads: true,
            };
            if !inner.is_multiple_of(spec.num_v_heads) || spec.conv_kernel < 2 {
                return Err(invalid(
                    &from,
                    format!("ssm.inner_size {inner} / time_step_rank {} / conv_kernel {}", spec.num_v_heads, spec.conv_kernel),
                ));
            }
            let spec = DeltaNetSpec { v_head_dim: inner / spec.num_v_heads, ..spec };
            check_delta_net(&from, &spec)?;
            let rot = req("rope.dimension_count", cfg.head_dim)?;
            if !rot.is_multiple_of(2) {
                return Err(invalid(&from, format!("rope.dimension_count {rot} must be even")));
            }
            cfg.rotary_dim = (rot < cfg.head_dim).then_some(rot);
            cfg.qk_norm = true;
            let mixers = recurrent.into_iter().map(|r| r.then_some(Recurrent::GatedDeltaNet(spec))).collect();
            store(&from, cfg, mixers)
        }
        "lfm2" => {
            let l_cache = req("shortconv.l_cache", MAX_CONV_KERNEL)?;
            if l_cache < 2 {
                return Err(invalid(&from, format!("shortconv.l_cache {l_cache} must be at least 2")));
            }
            // Attention layers have KV heads; llama.cpp writes head_count_kv per layer, 0 on the
            // convolution layers.
            let kv = gguf_meta::get_int_array(md, &key("attention.head_count_kv")).map_err(|e| invalid(&from, e.to_string()))?;
            let kv =
                kv.ok_or_else(|| invalid(&from, format!("metadata lacks a per-layer {}", key("attention.head_count_kv"))))?;
            if kv.len() != n {
                return Err(invalid(&from, format!("attention.head_count_kv has {} entries for {n} layers", kv.len())));
            }
            if let Some(&h) = kv.iter().find(|&&h| h != 0) {
                cfg.num_kv_heads = usize::try_from(h)
                    .ok()
                    .filter(|&h| h <= MAX_DIM)
                    .ok_or_else(|| invalid(&from, format!("head_count_kv {h}")))?;
            }
            let spec = ShortConvSpec { l_cache, hidden: cfg.hidden_size, bias: false };
            cfg.qk_norm = true;
            let mixers = kv.iter().map(|&h| (h == 0).then_some(Recurrent::ShortConv(spec))).collect();
            store(&from, cfg, mixers)
        }
        other => Err(EngineError::Internal(format!("no hybrid reader for {other}"))),
    }
}
