//! What a Gemma 4 text `config.json` (`gemma4_text`) adds to the common fields, with
//! transformers' defaults where a field is absent (`Gemma4TextConfig`):
//! - layer types (`layer_types`, else every sixth layer full; the last is always full) and the
//!   window (`sliding_window`, default 512);
//! - per-layer heads: the full layers' head dimension is `global_head_dim` (default 512), or what
//!   `per_layer_config` (transformers 5's form of it) gives each layer;
//! - rotary embeddings by layer type (`rope_parameters`): the full layers' `proportional` RoPE
//!   turns `partial_rotary_factor` of each head's frequency pairs, the sliding layers' is plain;
//! - per-layer input embeddings (`hidden_size_per_layer_input`, `vocab_size_per_layer_input`);
//! - KV sharing: the last `num_kv_shared_layers` layers attend with the keys and values of the
//!   last earlier layer of their type, and keep none; `use_double_wide_mlp` doubles their MLP;
//! - `final_logit_softcapping`; `head_dim` (default 256) and tied embeddings (default true).
//!
//! Refused by name until built: `attention_k_eq_v`, the MoE block (`enable_moe_block`) and
//! bidirectional attention.

use serde_json::Value;

use super::config::{ModelConfig, MAX_DIM};
use super::rope::{RopeScaling, Source};
use super::window_config;
use crate::error::{EngineError, Result};
use crate::gguf_meta::{self, Metadata};

/// transformers' defaults.
const DEFAULT_WINDOW: usize = 512;
const DEFAULT_GLOBAL_HEAD_DIM: usize = 512;
const DEFAULT_HEAD_DIM: usize = 256;

/// What Gemma 4 adds to a [`ModelConfig`].
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma4 {
    /// Per layer: its key/value heads and their dimension (the query heads share the dimension).
    pub heads: Vec<(usize, usize)>,
    /// Per layer: the earlier layer whose keys and values it attends with (KV sharing).
    pub kv_shared_from: Vec<Option<usize>>,
    /// `(hidden_size_per_layer_input, vocab_size_per_layer_input)` when per-layer input
    /// embeddings are on.
    pub per_layer_input: Option<(usize, usize)>,
    /// The KV-sharing layers' MLP is twice as wide.
    pub double_wide_mlp: bool,
    /// `attention_k_eq_v`: the full layers have no value projection; their values are the key
    /// projection's output (before the key norm and RoPE), normed as values.
    pub values_from_keys: bool,
}

fn invalid(m: String) -> EngineError {
    EngineError::InvalidModel(format!("config.json (gemma4_text): {m}"))
}

fn unsupported(field: &str, v: &Value, what: &str) -> EngineError {
    let mut shown = v.to_string();
    shown.truncate(80);
    EngineError::UnsupportedArchitecture(format!(
        "config.json (gemma4_text): {field} = {shown} ({what}) is not implemented yet; refusing rather than running without it"
    ))
}

/// A whole number in `1..=max`, or `default` when absent or null.
fn count(raw: &Value, key: &str, default: usize, max: usize) -> Result<usize> {
    match raw.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_u64()
            .filter(|&n| n >= 1 && n <= max as u64)
            .map(|n| n as usize)
            .ok_or_else(|| invalid(format!("{key} must be a whole number in 1..={max}, got {v}"))),
    }
}

/// Reads the Gemma 4 fields of `raw` into `cfg` (whose common fields are read).
pub fn read(raw: &Value, cfg: &mut ModelConfig) -> Result<()> {
    let n = cfg.num_layers;
    let on = |k: &str| raw.get(k).filter(|v| !v.is_null() && **v != Value::Bool(false));
    for (field, what) in
        [("use_bidirectional_attention", "bidirectional attention"), ("attn_logit_softcapping", "attention logit soft-capping")]
    {
        if let Some(v) = on(field) {
            return Err(unsupported(field, v, what));
        }
    }
    match raw.get("hidden_activation").or_else(|| raw.get("hidden_act")).and_then(Value::as_str) {
        None | Some("gelu_pytorch_tanh") => {}
        Some(other) => return Err(EngineError::UnsupportedArchitecture(format!("config.json: hidden_activation '{other}'"))),
    }
    if raw.get("head_dim").is_none_or(Value::is_null) {
        cfg.head_dim = DEFAULT_HEAD_DIM;
    }
    if raw.get("tie_word_embeddings").is_none_or(Value::is_null) {
        cfg.tie_word_embeddings = true;
    }

    // 1. Which layers slide, and the window.
    let mut sliding = match window_config::layer_types(raw, "gemma4_text", n)? {
        Some(types) => types,
        None => (0..n).map(|i| !(i + 1).is_multiple_of(6)).collect(),
    };
    // transformers forces the last layer full.
    if let Some(last) = sliding.last_mut() {
        *last = false;
    }
    let window = window_config::window(raw, "gemma4_text", Some(DEFAULT_WINDOW))?;
    window_config::apply(cfg, sliding.clone(), window);

    // 2. Per-layer heads: the full layers' dimension from `global_head_dim`, or each layer's
    //    from `per_layer_config`.
    let flag = |k: &str| match raw.get(k) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(invalid(format!("{k} must be true or false, got {v}"))),
    };
    let values_from_keys = flag("attention_k_eq_v")?;
    let global = count(raw, "global_head_dim", DEFAULT_GLOBAL_HEAD_DIM, MAX_DIM)?;
    // With `attention_k_eq_v`, the full layers' KV heads are `num_global_key_value_heads`.
    let global_kv = match values_from_keys {
        true => count(raw, "num_global_key_value_heads", cfg.num_kv_heads, MAX_DIM)?,
        false => cfg.num_kv_heads,
    };
    let mut heads: Vec<(usize, usize)> =
        sliding.iter().map(|&s| if s { (cfg.num_kv_heads, cfg.head_dim) } else { (global_kv, global) }).collect();
    if let Some(per_layer) = raw.get("per_layer_config").filter(|v| !v.is_null()) {
        let per_layer =
            per_layer.as_object().ok_or_else(|| invalid(format!("per_layer_config must be an object, got {per_layer}")))?;
        // Its layers are given in full: the others keep the model-wide heads.
        heads.fill((cfg.num_kv_heads, cfg.head_dim));
        for (layer, o) in per_layer {
            let i = layer.parse::<usize>().ok().filter(|&i| i < n).ok_or_else(|| {
                let shown: String = layer.chars().take(20).collect();
                invalid(format!("per_layer_config has a key '{shown}' that is not a layer index below {n}"))
            })?;
            if !o.is_object() {
                return Err(invalid(format!("per_layer_config.{i} must be an object")));
            }
            for (k, v) in o.as_object().into_iter().flatten() {
                match k.as_str() {
                    "head_dim" => heads[i].1 = count(o, k, cfg.head_dim, MAX_DIM)?,
                    "num_key_value_heads" => heads[i].0 = count(o, k, cfg.num_kv_heads, MAX_DIM)?,
                    other => return Err(unsupported(&format!("per_layer_config.{i}.{other}"), v, "a per-layer setting")),
                }
            }
        }
    }
    for (i, &(kv, hd)) in heads.iter().enumerate() {
        if !hd.is_multiple_of(2) || !cfg.num_heads.is_multiple_of(kv) {
            return Err(invalid(format!(
                "layer {i}: head dimension {hd} must be even and {} query heads a multiple of its {kv} KV heads",
                cfg.num_heads
            )));
        }
    }

    // 3. Rotary embeddings by layer type: the full layers' in `rope_theta` / `rope_scaling`, the
    //    sliding layers' in `local_rope`.
    let params = raw.get("rope_parameters").filter(|v| !v.is_null());
    let of = |k: &str, default: Value| -> Result<(f64, Option<RopeScaling>)> {
        let v = params.and_then(|p| p.get(k)).filter(|v| !v.is_null()).cloned().unwrap_or(default);
        let theta = v.get("rope_theta").and_then(Value::as_f64).unwrap_or(1e4);
        if !(theta.is_finite() && theta > 0.0) {
            return Err(invalid(format!("rope_parameters.{k}.rope_theta must be a finite positive number")));
        }
        Ok((theta, RopeScaling::parse(&v, Source::Config, cfg.max_position_embeddings, None)?))
    };
    let full =
        of("full_attention", serde_json::json!({"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}))?;
    let local = of("sliding_attention", serde_json::json!({"rope_type": "default", "rope_theta": 1e4}))?;
    (cfg.rope_theta, cfg.rope_scaling) = full;
    cfg.local_rope = Some(local);

    // 4. Per-layer input embeddings.
    let per_layer_input = match raw.get("hidden_size_per_layer_input") {
        None => Some(256),
        Some(Value::Null) => None,
        Some(v) if v.as_u64() == Some(0) => None,
        Some(_) => Some(count(raw, "hidden_size_per_layer_input", 256, MAX_DIM)?),
    };
    let per_layer_input = match per_layer_input {
        None => None,
        Some(size) => {
            let vocab = count(raw, "vocab_size_per_layer_input", 262_144, super::config::MAX_POSITIONS)?;
            if vocab < cfg.vocab_size {
                return Err(unsupported(
                    "vocab_size_per_layer_input",
                    &Value::from(vocab),
                    "per-layer embeddings for fewer tokens than the vocabulary",
                ));
            }
            Some((size, vocab))
        }
    };

    // 5. KV sharing: the last `num_kv_shared_layers` layers read the last earlier layer of their
    //    type.
    let shared = match raw.get("num_kv_shared_layers") {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_u64()
            .filter(|&s| s < n as u64)
            .map(|s| s as usize)
            .ok_or_else(|| invalid(format!("num_kv_shared_layers must be a whole number below the {n} layers, got {v}")))?,
    };
    let kv_shared_from = shared_from(&sliding, &heads, shared).map_err(invalid)?;
    let double_wide_mlp = raw.get("use_double_wide_mlp").and_then(Value::as_bool).unwrap_or(false);

    cfg.final_logit_softcap = match raw.get("final_logit_softcapping") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_f64()
                .filter(|c| c.is_finite() && *c > 0.0)
                .ok_or_else(|| invalid(format!("final_logit_softcapping must be a finite positive number, got {v}")))?,
        ),
    };
    // 6. The mixture-of-experts block beside the MLP (26B-A4B): every layer routes.
    if flag("enable_moe_block")? {
        let need = |k: &str| -> Result<usize> {
            match raw.get(k) {
                None | Some(Value::Null) => Err(invalid(format!("enable_moe_block needs {k}"))),
                Some(_) => count(raw, k, 1, super::moe_config::MAX_EXPERTS.max(MAX_DIM)),
            }
        };
        let moe = super::moe_config::RoutedFfn {
            num_experts: need("num_experts")?,
            experts_per_token: need("top_k_experts")?,
            intermediate_size: need("moe_intermediate_size")?,
            norm_topk_prob: true,
            routed_layers: vec![true; n],
        };
        cfg.moe = Some(moe.checked("config.json (gemma4_text)")?);
    }
    cfg.gemma4 = Some(Gemma4 { heads, kv_shared_from, per_layer_input, double_wide_mlp, values_from_keys });
    Ok(())
}

/// The text model's config of a multimodal Gemma 4 checkpoint (`model_type` `gemma4` with a
/// `text_config`, as `Gemma4ForConditionalGeneration` writes it), over `Gemma4TextConfig`'s
/// defaults (transformers 5.x) for the fields the common reader requires; `None` for any other
/// config.
pub fn multimodal_text_config(raw: &Value) -> Result<Option<Value>> {
    let defaults = serde_json::json!({
        "vocab_size": 262_144, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 30,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 131_072,
        "rms_norm_eps": 1e-6, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
    });
    super::multimodal::text_config(raw, "gemma4", "gemma4_text", defaults)
}

/// HF's KV sharing: each of the last `shared` layers reads the last earlier layer of its type,
/// whose heads must be its own.
fn shared_from(sliding: &[bool], heads: &[(usize, usize)], shared: usize) -> std::result::Result<Vec<Option<usize>>, String> {
    let n = sliding.len();
    let first_shared = n.saturating_sub(shared);
    let mut from = vec![None; n];
    for i in first_shared..n {
        let j = (0..first_shared)
            .rev()
            .find(|&j| sliding[j] == sliding[i])
            .ok_or_else(|| format!("layer {i} shares the keys and values of an earlier layer of its type, and there is none"))?;
        if heads[j] != heads[i] {
            return Err(format!("layer {i} shares the keys and values of layer {j}, whose heads differ"));
        }
        from[i] = Some(j);
    }
    Ok(from)
}

/// Reads a `gemma4` GGUF's keys (as llama.cpp's converter writes them) into `cfg`, whose common
/// fields are read (`head_dim` from `attention.key_length`, the full layers'): the layer pattern
/// (`attention.sliding_window_pattern`, true = sliding), the window, the sliding layers' heads
/// (`attention.key_length_swa`) and rotary base (`rope.freq_base_swa`), per-layer feed-forward
/// widths (`feed_forward_length`, a list), KV sharing (`attention.shared_kv_layers`), per-layer
/// inputs (`embedding_length_per_layer_input`) and the final soft-cap. The full layers'
/// proportional RoPE is the `rope_freqs` tensor (read by the loader).
pub fn read_gguf(md: &Metadata, cfg: &mut ModelConfig) -> Result<()> {
    let n = cfg.num_layers;
    let bad = |m: String| EngineError::InvalidModel(format!("GGUF gemma4: {m}"));
    let meta = |e: String| EngineError::InvalidModel(format!("GGUF: {e}"));
    let num = |k: &str| gguf_meta::get_u64(md, &format!("gemma4.{k}")).map_err(meta);
    let dim = |k: &str, max: usize| -> Result<usize> {
        match num(k)? {
            Some(d) if d >= 1 && d <= max as u64 => Ok(d as usize),
            other => Err(bad(format!("gemma4.{k} must be a whole number in 1..={max}, got {other:?}"))),
        }
    };
    let global = cfg.head_dim;
    let local = dim("attention.key_length_swa", MAX_DIM)?;
    // The converter writes each head's whole dimension (the full layers' partial turn is in
    // the rope_freqs tensor): anything else is a file at odds with itself.
    for (k, want) in [("rope.dimension_count", global), ("rope.dimension_count_swa", local)] {
        if let Some(d) = num(k)? {
            if d != want as u64 {
                return Err(bad(format!("{k} = {d}, but the heads it turns are {want} wide")));
            }
        }
    }
    // A list of bools, as llama.cpp reads it (another element type is refused there too).
    let pattern = gguf_meta::get_array(md, "gemma4.attention.sliding_window_pattern")
        .map_err(meta)?
        .ok_or_else(|| bad("gemma4.attention.sliding_window_pattern is missing".into()))?;
    let sliding = pattern
        .iter()
        .map(|v| match v {
            candle_core::quantized::gguf_file::Value::Bool(b) => Some(*b),
            _ => None,
        })
        .collect::<Option<Vec<bool>>>()
        .ok_or_else(|| bad("attention.sliding_window_pattern must list bools".into()))?;
    if sliding.len() != n {
        return Err(bad(format!("sliding_window_pattern has {} entries for {n} layers", sliding.len())));
    }
    let window = dim("attention.sliding_window", super::config::MAX_POSITIONS)?;
    window_config::apply(cfg, sliding.clone(), Some(window));
    // KV heads: one count, or one per layer (the 26B-A4B's full layers have fewer).
    let kv_heads = match gguf_meta::get_int_array(md, "gemma4.attention.head_count_kv") {
        // (A single count: the common reader has it.)
        Ok(None) | Err(_) => vec![cfg.num_kv_heads; n],
        Ok(Some(list)) if list.len() == n => list
            .iter()
            .map(|&k| usize::try_from(k).ok().filter(|&k| k >= 1 && cfg.num_heads.is_multiple_of(k)))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| bad(format!("attention.head_count_kv {list:?} must divide the {} heads", cfg.num_heads)))?,
        Ok(Some(list)) => return Err(bad(format!("attention.head_count_kv has {} entries for {n} layers", list.len()))),
    };
    let heads: Vec<(usize, usize)> =
        sliding.iter().zip(&kv_heads).map(|(&s, &kv)| (kv, if s { local } else { global })).collect();
    cfg.head_dim = local;
    cfg.num_kv_heads = sliding.iter().position(|&s| s).map_or(kv_heads[0], |i| kv_heads[i]);

    let base = gguf_meta::get_f64(md, "gemma4.rope.freq_base_swa").map_err(meta)?.unwrap_or(1e4);
    if !(base.is_finite() && base > 0.0) {
        return Err(bad(format!("rope.freq_base_swa must be a finite positive number, got {base}")));
    }
    cfg.local_rope = Some((base, None));

    let shared = match num("attention.shared_kv_layers")? {
        None => 0,
        Some(s) if s < n as u64 => s as usize,
        Some(s) => return Err(bad(format!("attention.shared_kv_layers {s} must be below the {n} layers"))),
    };
    let kv_shared_from = shared_from(&sliding, &heads, shared).map_err(bad)?;
    // Feed-forward widths: one per layer, the KV-sharing layers' twice the others' where the
    // model doubles them.
    // (One width for every layer may be written as a single number.)
    let widths = match gguf_meta::get_int_array(md, "gemma4.feed_forward_length")
        .or_else(|e| num("feed_forward_length").map(|w| w.map(|w| vec![w as i64; n])).map_err(|_| meta(e)))?
    {
        Some(w) if w.len() == n => w,
        Some(w) => return Err(bad(format!("feed_forward_length has {} entries for {n} layers", w.len()))),
        None => vec![cfg.intermediate_size as i64; n],
    };
    let base_width = cfg.intermediate_size as i64;
    let double_wide_mlp = shared > 0 && widths[n - 1] == 2 * base_width;
    for (i, &w) in widths.iter().enumerate() {
        let want = if kv_shared_from[i].is_some() && double_wide_mlp { 2 * base_width } else { base_width };
        if w != want {
            return Err(bad(format!(
                "feed_forward_length[{i}] = {w}; a Gemma 4 layer is {base_width} wide, or twice that on the KV-sharing layers"
            )));
        }
    }
    let per_layer_input = match num("embedding_length_per_layer_input")? {
        None | Some(0) => None,
        Some(p) if p <= MAX_DIM as u64 => Some((p as usize, cfg.vocab_size)),
        Some(p) => return Err(bad(format!("embedding_length_per_layer_input {p} is past {MAX_DIM}"))),
    };
    cfg.final_logit_softcap = super::config::gguf_final_logit_softcap(md, "gemma4")?;
    // The mixture-of-experts block beside each MLP (26B-A4B).
    if num("expert_count")?.is_some_and(|e| e > 0) {
        let moe = super::moe_config::RoutedFfn {
            num_experts: dim("expert_count", super::moe_config::MAX_EXPERTS)?,
            experts_per_token: dim("expert_used_count", super::moe_config::MAX_EXPERTS)?,
            intermediate_size: dim("expert_feed_forward_length", MAX_DIM)?,
            norm_topk_prob: true,
            routed_layers: vec![true; n],
        };
        cfg.moe = Some(moe.checked("GGUF gemma4")?);
    }
    // (`attention_k_eq_v` has no key: a full layer without `attn_v` takes its values from its
    // keys, which the loader reads from the tensors present: [`gguf_values_from_keys`].)
    cfg.gemma4 = Some(Gemma4 { heads, kv_shared_from, per_layer_input, double_wide_mlp, values_from_keys: false });
    Ok(())
}

/// A Gemma 4 GGUF's `attention_k_eq_v`, which llama.cpp's converter writes as full layers
/// without an `attn_v` tensor (`has(name)`: whether the file holds that tensor): all of the full
/// layers that keep their own keys lack it, or none does.
pub fn gguf_values_from_keys(cfg: &mut ModelConfig, has: impl Fn(&str) -> bool) -> Result<()> {
    let Some(g) = cfg.gemma4.as_mut() else { return Ok(()) };
    let full: Vec<usize> = (0..cfg.num_layers)
        .filter(|&i| !cfg.sliding_layers.get(i).copied().unwrap_or(false) && g.kv_shared_from[i].is_none())
        .collect();
    let without = full.iter().filter(|&&i| !has(&format!("blk.{i}.attn_v.weight"))).count();
    match without {
        0 => Ok(()),
        w if w == full.len() => {
            g.values_from_keys = true;
            Ok(())
        }
        _ => Err(EngineError::InvalidModel("GGUF gemma4: some full layers have attn_v and others not".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::Arch;

    fn fixture() -> Value {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/__test__/fixtures/gemma4-tiny/config.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    fn load(v: &Value) -> Result<ModelConfig> {
        ModelConfig::from_hf_json(&v.to_string())
    }

    #[test]
    fn reads_the_fixture_as_written_by_transformers_5() {
        let c = load(&fixture()).unwrap();
        assert_eq!(c.arch, Arch::Gemma4);
        let g = c.gemma4.clone().unwrap();
        assert_eq!(c.sliding_layers, vec![true, true, true, false, true, false]);
        assert_eq!(g.heads, vec![(2, 16), (2, 16), (2, 16), (2, 32), (2, 16), (2, 32)]);
        assert_eq!(g.kv_shared_from, vec![None, None, None, None, Some(2), Some(3)]);
        assert_eq!((g.per_layer_input, g.double_wide_mlp), (Some((8, 403)), true));
        assert_eq!(c.rope_scaling, Some(RopeScaling::Proportional { partial_rotary_factor: 0.25, factor: 1.0 }));
        assert_eq!((c.rope_theta, c.local_rope.clone(), c.final_logit_softcap), (1e6, Some((1e4, None)), Some(30.0)));
        // The published form: `global_head_dim` instead of `per_layer_config`.
        let mut v = fixture();
        v.as_object_mut().unwrap().remove("per_layer_config");
        v["global_head_dim"] = 32.into();
        assert_eq!(load(&v).unwrap().gemma4.unwrap().heads, g.heads);
    }

    #[test]
    fn refuses_what_is_not_built_and_absurd_values() {
        let mut c = fixture();
        c["use_bidirectional_attention"] = Value::from("vision");
        assert_eq!(load(&c).unwrap_err().code(), "UNSUPPORTED_ARCHITECTURE");
        for (k, v) in [
            ("num_kv_shared_layers", serde_json::json!(6)),
            ("num_kv_shared_layers", serde_json::json!(-1)),
            ("hidden_size_per_layer_input", serde_json::json!(1e300)),
            ("global_head_dim", serde_json::json!(0)),
            ("per_layer_config", serde_json::json!({"9": {"head_dim": 32}})),
            ("per_layer_config", serde_json::json!({"3": {"head_dim": 33}})),
            ("per_layer_config", serde_json::json!([1])),
            ("final_logit_softcapping", serde_json::json!(-1)),
            ("attention_k_eq_v", serde_json::json!("yes")),
            ("enable_moe_block", serde_json::json!(true)),
            ("enable_moe_block", serde_json::json!(1)),
        ] {
            let mut c = fixture();
            c[k] = v.clone();
            let e = load(&c).unwrap_err();
            assert!(matches!(e.code(), "INVALID_MODEL" | "UNSUPPORTED_ARCHITECTURE"), "{k} = {v}: {e}");
        }
        // A shared layer whose producer has other heads.
        let mut c = fixture();
        c["per_layer_config"] = serde_json::json!({"3": {"head_dim": 32}});
        assert_eq!(load(&c).unwrap_err().code(), "INVALID_MODEL");
    }
}
