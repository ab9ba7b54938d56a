//! Rotary position embeddings and the ways of stretching them past the context a model was
//! trained for, computed as HF transformers' `ROPE_INIT_FUNCTIONS` compute them: one function
//! per type, in f32 where HF works in f32, so that logits match HF's to the last digits.
//!
//! - `linear`: every frequency divided by `factor` (position interpolation).
//! - `dynamic` (NTK-aware): the base grows with the sequence's length once it passes the
//!   original length. As in HF, the frequencies of a pass are those of the length the sequence
//!   has when the pass runs (a prompt's rows all use the prompt's length; each decoded token
//!   uses its own position + 1), and rows already in the cache keep the rotation they were
//!   written with. So the cache of a sequence longer than the original length is specific to
//!   that sequence: the scheduler neither shares nor reuses it (see [`Rope::exact_until`]).
//! - `yarn`: a per-frequency blend of interpolation and extrapolation (`beta_fast`,
//!   `beta_slow`), and cos/sin scaled by an attention factor (`0.1·ln(factor) + 1` unless given,
//!   or from `mscale` / `mscale_all_dim`).
//! - `llama3`: low frequencies divided by `factor`, high ones kept, a smooth ramp between.
//! - frequency factors: GGUF stores Llama 3 scaling as a `rope_freqs` tensor of per-frequency
//!   divisors (llama.cpp's converter computes them from the `llama3` parameters).
//! - `longrope` (Phi-3.5, Phi-4-mini): per-frequency divisors, `short_factor` while the sequence
//!   is within the original length and `long_factor` once it is longer, and cos/sin scaled by an
//!   attention factor (`√(1 + ln factor / ln original)` unless given). As with `dynamic`, the
//!   choice follows the sequence's length when a pass runs, so a cache past the original length
//!   is specific to its sequence ([`Rope::exact_until`]).

use candle_core::{DType, Device, Tensor};
use serde_json::{Map, Value};

use super::config::MAX_POSITIONS;
use crate::error::{EngineError, Result};

/// How the rotary frequencies are stretched. Parameters are resolved (defaults filled in as HF
/// fills them) when the config or option is read.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    Linear {
        factor: f64,
    },
    /// The original length is the model's `max_position_embeddings` (HF's convention).
    Dynamic {
        factor: f64,
    },
    Yarn {
        factor: f64,
        original_max_position_embeddings: usize,
        /// Scales cos and sin (so attention logits by its square).
        attention_factor: f64,
        beta_fast: f64,
        beta_slow: f64,
        truncate: bool,
    },
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
    /// Per-frequency divisors (a GGUF `rope_freqs` tensor), `head_dim / 2` of them.
    FrequencyFactors {
        factors: Vec<f32>,
    },
    /// Gemma 4's full layers: the first `⌊partial_rotary_factor · dim / 2⌋` frequency pairs
    /// turn at the head's usual frequencies (over the whole head dimension), the others not at
    /// all; every frequency divided by `factor`.
    Proportional {
        partial_rotary_factor: f64,
        factor: f64,
    },
    /// Per-frequency divisors for sequences within the original length and for longer ones,
    /// `rotary_dim / 2` of each (checked against the rotary dimension when the model is read).
    LongRope {
        short_factor: Vec<f32>,
        long_factor: Vec<f32>,
        original_max_position_embeddings: usize,
        /// Scales cos and sin.
        attention_factor: f64,
    },
}

/// Where a scaling description comes from: the messages name it, and a bad value is
/// `INVALID_MODEL` in a file but `INVALID_ARGUMENT` in an option.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Config,
    Option,
}

/// Most per-frequency factors a LongRoPE list may hold (half the largest head a config may declare).
const MAX_FACTORS: usize = super::config::MAX_DIM / 2;

const TYPES: &str = "linear, dynamic, yarn, llama3, longrope";

impl RopeScaling {
    pub fn type_name(&self) -> &'static str {
        match self {
            RopeScaling::Linear { .. } => "linear",
            RopeScaling::Dynamic { .. } => "dynamic",
            RopeScaling::Yarn { .. } => "yarn",
            RopeScaling::Llama3 { .. } => "llama3",
            RopeScaling::FrequencyFactors { .. } => "frequency_factors",
            RopeScaling::LongRope { .. } => "longrope",
            RopeScaling::Proportional { .. } => "proportional",
        }
    }

    /// Reads an HF `rope_scaling` (transformers 4.x) or `rope_parameters` (5.x) object, or the
    /// `ropeScaling` load option (camelCase or snake_case keys; unknown keys refused).
    /// `max_position_embeddings` and a top-level `original_max_position_embeddings` fill in
    /// what HF fills in. `Ok(None)` for the default (no scaling).
    pub fn parse(
        v: &Value,
        source: Source,
        max_position_embeddings: usize,
        top_level_original: Option<usize>,
    ) -> Result<Option<Self>> {
        let what = match source {
            Source::Config => "config.json rope scaling",
            Source::Option => "ropeScaling",
        };
        let bad = |m: String| match source {
            Source::Config => EngineError::InvalidModel(format!("{what}: {m}")),
            Source::Option => EngineError::InvalidArgument(format!("{what}: {m}")),
        };
        if v.is_null() {
            return Ok(None);
        }
        let obj = v.as_object().ok_or_else(|| bad("must be an object".into()))?;
        let p = Params { obj, source };
        if source == Source::Option {
            p.refuse_unknown().map_err(bad)?;
        }
        let ty = p.str(&["rope_type", "type"]).map_err(bad)?.unwrap_or("default");
        let factor = |required: bool| -> Result<Option<f64>> {
            match p.num(&["factor"]).map_err(bad)? {
                // HF validates `factor >= 1` for every scaling type.
                Some(f) if !(f.is_finite() && (1.0..=1e6).contains(&f)) => {
                    Err(bad(format!("factor must be a number from 1 to 1e6, got {f}")))
                }
                None if required => Err(bad(format!("'{ty}' needs a factor"))),
                f => Ok(f),
            }
        };
        let original = |default: usize| -> Result<usize> {
            let n = match p.num(&["original_max_position_embeddings", "originalMaxPositionEmbeddings"]).map_err(bad)? {
                Some(n) => n,
                None => return Ok(top_level_original.unwrap_or(default)),
            };
            if n.fract() != 0.0 || !(1.0..=MAX_POSITIONS as f64).contains(&n) {
                return Err(bad(format!("originalMaxPositionEmbeddings must be an integer from 1 to {MAX_POSITIONS}, got {n}")));
            }
            Ok(n as usize)
        };
        let finite = |keys: &[&str], default: f64, positive: bool| -> Result<f64> {
            let x = p.num(keys).map_err(bad)?.unwrap_or(default);
            if !x.is_finite() || (positive && x <= 0.0) || x.abs() > 1e6 {
                return Err(bad(format!(
                    "{} must be a finite{} number, got {x}",
                    keys[0],
                    if positive { " positive" } else { "" }
                )));
            }
            Ok(x)
        };
        Ok(Some(match ty {
            "default" | "none" => return Ok(None),
            "linear" => RopeScaling::Linear { factor: factor(true)?.expect("required") },
            "dynamic" => RopeScaling::Dynamic { factor: factor(true)?.expect("required") },
            "yarn" => {
                let original_max_position_embeddings = original(max_position_embeddings)?;
                // DeepSeek-style configs leave the factor out: the ratio of the two lengths.
                let factor = match factor(false)? {
                    Some(f) => f,
                    None => (max_position_embeddings as f64 / original_max_position_embeddings as f64).max(1.0),
                };
                let mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
                let given = p.num(&["attention_factor", "attentionFactor"]).map_err(bad)?;
                let m = p.num(&["mscale"]).map_err(bad)?.filter(|&x| x != 0.0);
                let m_all = p.num(&["mscale_all_dim", "mscaleAllDim"]).map_err(bad)?.filter(|&x| x != 0.0);
                let attention_factor = match (given, m, m_all) {
                    (Some(a), _, _) => a,
                    (None, Some(m), Some(m_all)) => mscale(factor, m) / mscale(factor, m_all),
                    _ => mscale(factor, 1.0),
                };
                if !(attention_factor.is_finite() && attention_factor > 0.0 && attention_factor < 1e3) {
                    return Err(bad(format!("attentionFactor must be a finite positive number, got {attention_factor}")));
                }
                // HF reads `beta_fast or 32`: a 0 means the default too.
                let beta = |keys: &[&str], default: f64| -> Result<f64> {
                    let b = finite(keys, default, false)?;
                    Ok(if b == 0.0 { default } else { b })
                };
                let (beta_fast, beta_slow) = (beta(&["beta_fast", "betaFast"], 32.0)?, beta(&["beta_slow", "betaSlow"], 1.0)?);
                if beta_fast <= 0.0 || beta_slow <= 0.0 {
                    return Err(bad(format!("betaFast and betaSlow must be positive, got {beta_fast} and {beta_slow}")));
                }
                let truncate = p.bool(&["truncate"]).map_err(bad)?.unwrap_or(true);
                RopeScaling::Yarn { factor, original_max_position_embeddings, attention_factor, beta_fast, beta_slow, truncate }
            }
            "llama3" => {
                let low_freq_factor = finite(&["low_freq_factor", "lowFreqFactor"], 1.0, true)?;
                let high_freq_factor = finite(&["high_freq_factor", "highFreqFactor"], 4.0, true)?;
                if high_freq_factor <= low_freq_factor {
                    return Err(bad(format!(
                        "highFreqFactor ({high_freq_factor}) must be larger than lowFreqFactor ({low_freq_factor})"
                    )));
                }
                RopeScaling::Llama3 {
                    factor: factor(true)?.expect("required"),
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position_embeddings: original(max_position_embeddings)?,
                }
            }
            "proportional" if source == Source::Option => {
                return Err(bad(
                    "'proportional' is a model's own RoPE (Gemma 4's full layers); it comes from config.json, not an option"
                        .into(),
                ))
            }
            "proportional" => {
                let partial_rotary_factor = match p.num(&["partial_rotary_factor"]).map_err(bad)? {
                    None => 1.0,
                    Some(f) if f.is_finite() && f > 0.0 && f <= 1.0 => f,
                    Some(f) => return Err(bad(format!("partial_rotary_factor must be in (0, 1], got {f}"))),
                };
                let factor = match p.num(&["factor"]).map_err(bad)? {
                    None => 1.0,
                    Some(f) if f.is_finite() && f > 0.0 && f <= 1e6 => f,
                    Some(f) => return Err(bad(format!("factor must be a finite positive number up to 1e6, got {f}"))),
                };
                RopeScaling::Proportional { partial_rotary_factor, factor }
            }
            "longrope" if source == Source::Option => {
                return Err(bad(
                    "'longrope' needs the model's own per-frequency factors; it comes from config.json, not an option".into(),
                ))
            }
            "longrope" => {
                // HF prefers a top-level `original_max_position_embeddings` (Phi-3's) to the
                // object's, and takes the factor as the ratio of the two lengths when absent.
                let original_max_position_embeddings = match top_level_original {
                    Some(n) if (1..=MAX_POSITIONS).contains(&n) => n,
                    Some(n) => {
                        return Err(bad(format!("original_max_position_embeddings must be from 1 to {MAX_POSITIONS}, got {n}")))
                    }
                    None => original(max_position_embeddings)?,
                };
                let factor = match p.num(&["factor"]).map_err(bad)? {
                    Some(f) if !(f.is_finite() && f > 0.0 && f <= 1e6) => {
                        return Err(bad(format!("factor must be a finite positive number up to 1e6, got {f}")))
                    }
                    Some(f) => f,
                    None => max_position_embeddings as f64 / original_max_position_embeddings as f64,
                };
                let attention_factor = match p.num(&["attention_factor"]).map_err(bad)? {
                    Some(a) => a,
                    None if factor <= 1.0 => 1.0,
                    None => (1.0 + factor.ln() / (original_max_position_embeddings as f64).ln()).sqrt(),
                };
                if !(attention_factor.is_finite() && attention_factor > 0.0 && attention_factor < 1e3) {
                    return Err(bad(format!("attention_factor must be a finite positive number, got {attention_factor}")));
                }
                RopeScaling::LongRope {
                    short_factor: p.factors("short_factor").map_err(bad)?,
                    long_factor: p.factors("long_factor").map_err(bad)?,
                    original_max_position_embeddings,
                    attention_factor,
                }
            }
            other => {
                return Err(EngineError::UnsupportedArchitecture(format!(
                    "{what}: RoPE scaling type '{other}' is not supported (supported: {TYPES})"
                )))
            }
        }))
    }

    /// The positions the model handles without scaling (its training context).
    pub fn original_length(&self, max_position_embeddings: usize) -> usize {
        match self {
            RopeScaling::Yarn { original_max_position_embeddings: o, .. }
            | RopeScaling::Llama3 { original_max_position_embeddings: o, .. }
            | RopeScaling::LongRope { original_max_position_embeddings: o, .. } => *o,
            _ => max_position_embeddings,
        }
    }

    /// The positions the scaled model is meant to handle.
    pub fn scaled_length(&self, max_position_embeddings: usize) -> usize {
        let stretch = |n: usize, f: f64| ((n as f64 * f) as usize).min(MAX_POSITIONS);
        match self {
            RopeScaling::Linear { factor } | RopeScaling::Dynamic { factor } => stretch(max_position_embeddings, *factor),
            RopeScaling::Yarn { factor, original_max_position_embeddings: o, .. }
            | RopeScaling::Llama3 { factor, original_max_position_embeddings: o, .. } => {
                stretch(*o, *factor).max(max_position_embeddings)
            }
            // The file declares the length it was converted for; so do LongRoPE and proportional
            // configs.
            RopeScaling::FrequencyFactors { .. } | RopeScaling::LongRope { .. } | RopeScaling::Proportional { .. } => {
                max_position_embeddings
            }
        }
    }

    /// What the model runs with, as `info` shows it: camelCase keys for JS, snake_case for
    /// Python.
    pub fn to_json(&self, camel_case: bool) -> Value {
        let mut m = Map::new();
        m.insert("type".into(), self.type_name().into());
        let mut put = |k: &str, v: Value| {
            let key = if camel_case { k.to_string() } else { snake_case(k) };
            m.insert(key, v);
        };
        match self {
            RopeScaling::Linear { factor } | RopeScaling::Dynamic { factor } => put("factor", (*factor).into()),
            RopeScaling::Yarn { factor, original_max_position_embeddings, attention_factor, beta_fast, beta_slow, truncate } => {
                put("factor", (*factor).into());
                put("originalMaxPositionEmbeddings", (*original_max_position_embeddings).into());
                put("attentionFactor", (*attention_factor).into());
                put("betaFast", (*beta_fast).into());
                put("betaSlow", (*beta_slow).into());
                put("truncate", (*truncate).into());
            }
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                put("factor", (*factor).into());
                put("lowFreqFactor", (*low_freq_factor).into());
                put("highFreqFactor", (*high_freq_factor).into());
                put("originalMaxPositionEmbeddings", (*original_max_position_embeddings).into());
            }
            RopeScaling::FrequencyFactors { factors } => put("factors", floats(factors)),
            RopeScaling::Proportional { partial_rotary_factor, factor } => {
                put("partialRotaryFactor", (*partial_rotary_factor).into());
                put("factor", (*factor).into());
            }
            RopeScaling::LongRope { short_factor, long_factor, original_max_position_embeddings, attention_factor } => {
                put("originalMaxPositionEmbeddings", (*original_max_position_embeddings).into());
                put("attentionFactor", (*attention_factor).into());
                put("shortFactor", floats(short_factor));
                put("longFactor", floats(long_factor));
            }
        }
        Value::Object(m)
    }
}

fn floats(v: &[f32]) -> Value {
    v.iter().map(|&f| Value::from(f as f64)).collect::<Vec<_>>().into()
}

fn snake_case(camel: &str) -> String {
    let mut out = String::with_capacity(camel.len() + 4);
    for c in camel.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Typed reads of a scaling object's keys (each key may have several spellings).
struct Params<'a> {
    obj: &'a Map<String, Value>,
    source: Source,
}

const OPTION_KEYS: &[&str] = &[
    "type",
    "rope_type",
    "ropeType",
    "factor",
    "original_max_position_embeddings",
    "originalMaxPositionEmbeddings",
    "attention_factor",
    "attentionFactor",
    "beta_fast",
    "betaFast",
    "beta_slow",
    "betaSlow",
    "mscale",
    "mscale_all_dim",
    "mscaleAllDim",
    "truncate",
    "low_freq_factor",
    "lowFreqFactor",
    "high_freq_factor",
    "highFreqFactor",
];

impl Params<'_> {
    fn get(&self, keys: &[&str]) -> Option<&Value> {
        let extra: &[&str] = if keys == ["rope_type", "type"] && self.source == Source::Option { &["ropeType"] } else { &[] };
        keys.iter().chain(extra).find_map(|k| self.obj.get(*k)).filter(|v| !v.is_null())
    }

    fn refuse_unknown(&self) -> std::result::Result<(), String> {
        match self.obj.keys().find(|k| !OPTION_KEYS.contains(&k.as_str())) {
            Some(k) => Err(format!("unknown key '{k}'")),
            None => Ok(()),
        }
    }

    fn num(&self, keys: &[&str]) -> std::result::Result<Option<f64>, String> {
        match self.get(keys) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| format!("{} must be a number", keys[0])),
        }
    }

    /// A list of per-frequency factors: finite, positive, at most 1e6, at most
    /// [`MAX_FACTORS`] of them.
    fn factors(&self, key: &str) -> std::result::Result<Vec<f32>, String> {
        let list = self.get(&[key]).ok_or_else(|| format!("'longrope' needs {key}"))?;
        let list = list.as_array().ok_or_else(|| format!("{key} must be a list of numbers"))?;
        if list.len() > MAX_FACTORS {
            return Err(format!("{key} has {} entries (at most {MAX_FACTORS})", list.len()));
        }
        list.iter()
            .map(|x| match x.as_f64() {
                Some(f) if f.is_finite() && f > 0.0 && f <= 1e6 => Ok(f as f32),
                _ => Err(format!("{key} must hold finite positive numbers up to 1e6, got {x}")),
            })
            .collect()
    }

    fn str(&self, keys: &[&str]) -> std::result::Result<Option<&str>, String> {
        match self.get(keys) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| format!("{} must be a string", keys[0])),
        }
    }

    fn bool(&self, keys: &[&str]) -> std::result::Result<Option<bool>, String> {
        match self.get(keys) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| format!("{} must be a boolean", keys[0])),
        }
    }
}

/// The inverse frequencies `theta^(-2i/dim)`, as HF computes them: the exponent and the power
/// in f32.
fn default_inv_freq(theta: f32, dim: usize) -> Vec<f32> {
    (0..dim / 2).map(|i| 1.0 / theta.powf((2 * i) as f32 / dim as f32)).collect()
}

/// The inverse frequencies and the cos/sin scale of `scaling`; `seq_len` is the sequence's
/// length for `dynamic` (ignored by the others). Mirrors HF's `_compute_*_parameters`.
fn inv_freq(scaling: Option<&RopeScaling>, theta: f64, dim: usize, max_pos: usize, seq_len: usize) -> (Vec<f32>, f32) {
    let base = default_inv_freq(theta as f32, dim);
    let Some(s) = scaling else { return (base, 1.0) };
    match s {
        RopeScaling::Linear { factor } => (base.iter().map(|f| f / *factor as f32).collect(), 1.0),
        RopeScaling::Dynamic { factor } => {
            let factor = *factor as f32;
            let len = seq_len.max(max_pos) as f32;
            let scaled = (factor * len / max_pos as f32 - (factor - 1.0)).powf(dim as f32 / (dim - 2).max(1) as f32);
            (default_inv_freq(theta as f32 * scaled, dim), 1.0)
        }
        RopeScaling::Yarn { factor, original_max_position_embeddings, attention_factor, beta_fast, beta_slow, truncate } => {
            // The dimension at which a frequency turns `rotations` times over the original length.
            let correction = |rotations: f64| {
                dim as f64 * (*original_max_position_embeddings as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln()
                    / (2.0 * theta.ln())
            };
            let (mut low, mut high) = (correction(*beta_fast), correction(*beta_slow));
            if *truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, mut high) = (low.max(0.0), high.min(dim as f64 - 1.0));
            if low == high {
                high += 0.001;
            }
            let (low, high) = (low as f32, high as f32);
            let factor = *factor as f32;
            let inv = (0..dim / 2)
                .map(|i| {
                    let pos_freq = (theta as f32).powf((2 * i) as f32 / dim as f32);
                    let (extrapolation, interpolation) = (1.0 / pos_freq, 1.0 / (factor * pos_freq));
                    let extrapolation_weight = 1.0 - ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                    interpolation * (1.0 - extrapolation_weight) + extrapolation * extrapolation_weight
                })
                .collect();
            (inv, *attention_factor as f32)
        }
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
            // In f32 like HF, so that a frequency on a band's edge falls on the same side.
            let old = *original_max_position_embeddings as f32;
            let (lo, hi) = (*low_freq_factor as f32, *high_freq_factor as f32);
            let (low_wavelen, high_wavelen) = (old / lo, old / hi);
            let f = *factor as f32;
            let inv = base
                .iter()
                .map(|&freq| {
                    let wavelen = 2.0 * std::f32::consts::PI / freq;
                    if wavelen < high_wavelen {
                        freq
                    } else if wavelen > low_wavelen {
                        freq / f
                    } else {
                        let smooth = (old / wavelen - lo) / (hi - lo);
                        (1.0 - smooth) * freq / f + smooth * freq
                    }
                })
                .collect();
            (inv, 1.0)
        }
        RopeScaling::FrequencyFactors { factors } => (base.iter().zip(factors).map(|(f, d)| f / d).collect(), 1.0),
        RopeScaling::Proportional { partial_rotary_factor, factor } => {
            // HF: `int(partial_rotary_factor * head_dim // 2)` pairs turn.
            let turning = ((partial_rotary_factor * dim as f64) / 2.0).floor() as usize;
            let f = *factor as f32;
            (base.iter().enumerate().map(|(i, &b)| if i < turning { b / f } else { 0.0 }).collect(), 1.0)
        }
        RopeScaling::LongRope { short_factor, long_factor, original_max_position_embeddings, attention_factor } => {
            let ext = if seq_len > *original_max_position_embeddings { long_factor } else { short_factor };
            (longrope_inv_freq(theta as f32, dim, ext), *attention_factor as f32)
        }
    }
}

/// `1 / (ext_i · theta^(2i/dim))`, in f32 as HF computes LongRoPE's frequencies.
fn longrope_inv_freq(theta: f32, dim: usize, ext: &[f32]) -> Vec<f32> {
    ext.iter().take(dim / 2).enumerate().map(|(i, e)| 1.0 / (e * theta.powf((2 * i) as f32 / dim as f32))).collect()
}

/// The rotary embedding of a loaded model: a cos/sin table over the runtime's context for the
/// frequencies that do not depend on the sequence, and per-pass rows for `dynamic`.
pub struct Rope {
    theta: f64,
    head_dim: usize,
    max_position_embeddings: usize,
    scaling: Option<RopeScaling>,
    /// `[max_positions, head_dim / 2]` in the activation dtype.
    cos: Tensor,
    sin: Tensor,
    /// The table's frequencies and scale (dynamic rows at or under the original length use them).
    inv_freq: Vec<f32>,
    scale: f32,
    /// LongRoPE: the table of sequences longer than the original length (long factors).
    long: Option<(Tensor, Tensor)>,
    dtype: DType,
    device: Device,
}

/// One sequence's rows in a pass: `n` positions from `pos`; `seq_len` is the length the
/// sequence has once this pass's rows are in (all of a prompt's rows share the prompt's length).
#[derive(Clone, Copy, Debug)]
pub struct RopeRows {
    pub pos: usize,
    pub n: usize,
    pub seq_len: usize,
}

impl Rope {
    /// Builds the tables for positions `..max_positions`. `scaling` must come from
    /// [`RopeScaling::parse`] or the GGUF reader (factors already checked against `head_dim`).
    pub fn new(
        theta: f64,
        head_dim: usize,
        max_position_embeddings: usize,
        scaling: Option<RopeScaling>,
        max_positions: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let half = head_dim / 2;
        if let Some(RopeScaling::LongRope { short_factor, long_factor, .. }) = &scaling {
            if short_factor.len() != half || long_factor.len() != half {
                return Err(EngineError::InvalidModel(format!(
                    "longrope: short_factor and long_factor need {half} entries each (rotary dimension {head_dim}), \
                     have {} and {}",
                    short_factor.len(),
                    long_factor.len()
                )));
            }
        }
        let long_rope = matches!(scaling, Some(RopeScaling::LongRope { .. }));
        // Two f32 tables plus their copies in `dtype` (twice for LongRoPE): refuse what the
        // machine cannot hold rather than abort in the allocator.
        let n = max_positions.checked_mul(half).ok_or_else(|| EngineError::OutOfMemory("RoPE table size overflows".into()))?;
        let bytes = (n as u64).saturating_mul(if long_rope { 32 } else { 16 });
        if crate::files::total_memory().is_some_and(|m| bytes > m / 2) {
            return Err(EngineError::OutOfMemory(format!(
                "RoPE tables for {max_positions} positions need {bytes} bytes, more than half of this machine's memory; \
                 load with a smaller contextLength"
            )));
        }
        let (inv_freq, scale) = inv_freq(scaling.as_ref(), theta, head_dim, max_position_embeddings, 0);
        let table = |inv_freq: &[f32], scale: f32| -> Result<(Tensor, Tensor)> {
            let (mut cos, mut sin) = (Vec::new(), Vec::new());
            let oom = |_| EngineError::OutOfMemory(format!("RoPE tables for {max_positions} positions"));
            cos.try_reserve_exact(n).map_err(oom)?;
            sin.try_reserve_exact(n).map_err(oom)?;
            for p in 0..max_positions {
                push_row(p, inv_freq, scale, &mut cos, &mut sin);
            }
            let cos = Tensor::from_vec(cos, (max_positions, half), device)?.to_dtype(dtype)?;
            let sin = Tensor::from_vec(sin, (max_positions, half), device)?.to_dtype(dtype)?;
            Ok((cos, sin))
        };
        let (cos, sin) = table(&inv_freq, scale)?;
        let long = match &scaling {
            Some(s @ RopeScaling::LongRope { original_max_position_embeddings: o, .. }) => {
                let (inv, scale) = self::inv_freq(Some(s), theta, head_dim, max_position_embeddings, o.saturating_add(1));
                Some(table(&inv, scale)?)
            }
            _ => None,
        };
        Ok(Self {
            theta,
            head_dim,
            max_position_embeddings,
            scaling,
            cos,
            sin,
            inv_freq,
            scale,
            long,
            dtype,
            device: device.clone(),
        })
    }

    pub fn max_positions(&self) -> usize {
        self.cos.dim(0).unwrap_or(0)
    }

    /// The cos and sin tables, `[max_positions, head_dim / 2]` in the activation dtype.
    #[cfg(feature = "cuda")]
    pub fn tables(&self) -> (&Tensor, &Tensor) {
        (&self.cos, &self.sin)
    }

    pub fn scaling(&self) -> Option<&RopeScaling> {
        self.scaling.as_ref()
    }

    /// `Some(n)` when the rotation of a position depends on the length of its sequence past
    /// `n` positions (`dynamic`, `longrope`): a cached position is then only valid for a
    /// sequence that never grew past `n`.
    pub fn exact_until(&self) -> Option<usize> {
        match &self.scaling {
            Some(RopeScaling::Dynamic { .. }) => Some(self.max_position_embeddings),
            Some(RopeScaling::LongRope { original_max_position_embeddings, .. }) => Some(*original_max_position_embeddings),
            _ => None,
        }
    }

    /// cos and sin `[rows, head_dim / 2]` for each sequence's rows, in order.
    pub fn rows(&self, seqs: &[RopeRows]) -> Result<(Tensor, Tensor)> {
        let grown = self.exact_until().filter(|&n| seqs.iter().any(|s| s.seq_len > n));
        if let (Some(n), Some((long_cos, long_sin))) = (grown, &self.long) {
            // LongRoPE: each sequence's rows from the table of its length.
            let (mut cos, mut sin) = (Vec::with_capacity(seqs.len()), Vec::with_capacity(seqs.len()));
            for s in seqs {
                let positions: Vec<u32> = (s.pos..s.pos + s.n).map(|p| p as u32).collect();
                let ids = Tensor::from_vec(positions, s.n, &self.device)?;
                let (c, si) = if s.seq_len > n { (long_cos, long_sin) } else { (&self.cos, &self.sin) };
                cos.push(c.index_select(&ids, 0)?);
                sin.push(si.index_select(&ids, 0)?);
            }
            return Ok((Tensor::cat(&cos, 0)?, Tensor::cat(&sin, 0)?));
        }
        if grown.is_none() {
            let positions: Vec<u32> = seqs.iter().flat_map(|s| (s.pos..s.pos + s.n).map(|p| p as u32)).collect();
            let ids = Tensor::from_vec(positions, seqs.iter().map(|s| s.n).sum::<usize>(), &self.device)?;
            return Ok((self.cos.index_select(&ids, 0)?, self.sin.index_select(&ids, 0)?));
        }
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for s in seqs {
            let grown;
            let (inv, scale) = if s.seq_len > self.max_position_embeddings {
                grown = inv_freq(self.scaling.as_ref(), self.theta, self.head_dim, self.max_position_embeddings, s.seq_len);
                (&grown.0, grown.1)
            } else {
                (&self.inv_freq, self.scale)
            };
            for p in s.pos..s.pos + s.n {
                push_row(p, inv, scale, &mut cos, &mut sin);
            }
        }
        let rows = cos.len() / (self.head_dim / 2);
        let cos = Tensor::from_vec(cos, (rows, self.head_dim / 2), &self.device)?.to_dtype(self.dtype)?;
        let sin = Tensor::from_vec(sin, (rows, self.head_dim / 2), &self.device)?.to_dtype(self.dtype)?;
        Ok((cos, sin))
    }
}

/// cos and sin of `position · inv_freq`, angle in f32 as HF computes it, scaled by `scale`.
fn push_row(p: usize, inv_freq: &[f32], scale: f32, cos: &mut Vec<f32>, sin: &mut Vec<f32>) {
    for f in inv_freq {
        let a = p as f32 * f;
        cos.push(a.cos() * scale);
        sin.push(a.sin() * scale);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn opt(v: Value) -> Result<Option<RopeScaling>> {
        RopeScaling::parse(&v, Source::Option, 512, None)
    }

    #[test]
    fn parses_each_type_with_hf_defaults() {
        let y = RopeScaling::parse(&json!({"rope_type": "yarn", "factor": 4.0}), Source::Config, 2048, None).unwrap().unwrap();
        let RopeScaling::Yarn { original_max_position_embeddings, attention_factor, beta_fast, beta_slow, truncate, .. } = y
        else {
            panic!("{y:?}")
        };
        assert_eq!((original_max_position_embeddings, beta_fast, beta_slow, truncate), (2048, 32.0, 1.0, true));
        assert!((attention_factor - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-12);
        let l = opt(json!({"type": "llama3", "factor": 8, "originalMaxPositionEmbeddings": 8192})).unwrap().unwrap();
        assert_eq!(l.original_length(131072), 8192);
        assert_eq!(l.scaled_length(131072), 131072);
        assert_eq!(opt(json!({"type": "default"})).unwrap(), None);
        assert_eq!(opt(Value::Null).unwrap(), None);
        assert_eq!(l.to_json(false)["original_max_position_embeddings"], 8192);
        assert_eq!(l.to_json(true)["originalMaxPositionEmbeddings"], 8192);
        let d = opt(json!({"type": "dynamic", "factor": 2})).unwrap().unwrap();
        assert_eq!((d.original_length(512), d.scaled_length(512)), (512, 1024));
    }

    #[test]
    fn refuses_bad_values_with_the_right_code() {
        for v in [
            json!({"type": "yarn", "factor": f64::MAX}),
            json!({"type": "linear"}),
            json!({"type": "linear", "factor": 0.5}),
            json!({"type": "linear", "factor": "2"}),
            json!({"type": "yarn", "factor": 2, "betaFast": -1}),
            json!({"type": "yarn", "factor": 2, "originalMaxPositionEmbeddings": 1e12}),
            json!({"type": "yarn", "factor": 2, "originalMaxPositionEmbeddings": 10.5}),
            json!({"type": "llama3", "factor": 8, "lowFreqFactor": 4, "highFreqFactor": 4}),
            json!({"type": "yarn", "factor": 2, "colour": "blue"}),
            json!([1, 2]),
        ] {
            let e = opt(v.clone()).expect_err(&v.to_string());
            assert_eq!(e.code(), "INVALID_ARGUMENT", "{v}: {e}");
        }
        let e = opt(json!({"type": "mrope", "factor": 2})).unwrap_err();
        assert_eq!(e.code(), "UNSUPPORTED_ARCHITECTURE");
        assert!(e.to_string().contains("mrope"), "{e}");
        // LongRoPE's factors belong to the model: not an option.
        let e = opt(json!({"type": "longrope", "factor": 2})).unwrap_err();
        assert_eq!(e.code(), "INVALID_ARGUMENT");
        assert!(e.to_string().contains("longrope"), "{e}");
        let e = RopeScaling::parse(&json!({"type": "linear", "factor": -3}), Source::Config, 64, None).unwrap_err();
        assert_eq!(e.code(), "INVALID_MODEL");
    }

    /// LongRoPE: short factors while a sequence is within the original length, long ones past
    /// it, each row by its own sequence's length; cos and sin scaled by the attention factor.
    #[test]
    fn longrope_picks_the_factors_by_the_sequence_length() {
        let v = json!({"rope_type": "longrope", "short_factor": [1.0, 1.5], "long_factor": [2.0, 8.0]});
        let s = RopeScaling::parse(&v, Source::Config, 64, Some(16)).unwrap().unwrap();
        let a = (1.0 + 4f64.ln() / 16f64.ln()).sqrt();
        let RopeScaling::LongRope { attention_factor, original_max_position_embeddings, .. } = &s else { panic!("{s:?}") };
        assert_eq!((*original_max_position_embeddings, s.original_length(64), s.scaled_length(64)), (16, 16, 64));
        assert!((attention_factor - a).abs() < 1e-12);
        let rope = Rope::new(1e4, 4, 64, Some(s), 64, DType::F32, &Device::Cpu).unwrap();
        assert_eq!(rope.exact_until(), Some(16));
        let rows = |seqs: &[RopeRows]| rope.rows(seqs).unwrap().0.to_vec2::<f32>().unwrap();
        let at = |p: usize, inv: [f32; 2]| inv.map(|f| (p as f32 * f).cos() * a as f32);
        let short = [1.0, 1.0 / (1.5 * 100f32)];
        let long = [1.0 / 2.0, 1.0 / (8.0 * 100f32)];
        // Position 10 of a 12-long sequence, then of a 20-long one, in one pass.
        let got = rows(&[RopeRows { pos: 10, n: 1, seq_len: 12 }, RopeRows { pos: 10, n: 1, seq_len: 20 }]);
        for (g, want) in got.iter().zip([at(10, short), at(10, long)]) {
            assert!(g.iter().zip(want).all(|(x, y)| (x - y).abs() < 1e-6), "{g:?} vs {want:?}");
        }
        // Factors of the wrong length for the rotary dimension are refused.
        let v = json!({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [2.0]});
        let s = RopeScaling::parse(&v, Source::Config, 64, Some(16)).unwrap();
        assert_eq!(Rope::new(1e4, 4, 64, s, 64, DType::F32, &Device::Cpu).err().unwrap().code(), "INVALID_MODEL");
    }

    #[test]
    fn dynamic_equals_default_until_the_original_length() {
        let s = RopeScaling::Dynamic { factor: 4.0 };
        let (d, _) = inv_freq(None, 1e4, 32, 64, 0);
        assert_eq!(inv_freq(Some(&s), 1e4, 32, 64, 10).0, d);
        assert_eq!(inv_freq(Some(&s), 1e4, 32, 64, 64).0, d);
        let (g, _) = inv_freq(Some(&s), 1e4, 32, 64, 200);
        assert!(g.iter().zip(&d).skip(1).all(|(a, b)| a < b), "a grown base lowers every frequency but the first");
    }
}
