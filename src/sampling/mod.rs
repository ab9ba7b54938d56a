//! Token sampling: turns one step of raw model logits into one token.
//!
//! Design note
//! -----------
//! * Pure Rust over `&[f32]` logits (one row, length = model vocab). No candle
//!   here: the engine copies the last-position logits to the host once per step
//!   and hands the slice to a [`Sampler`] owned by the sequence.
//! * [`SamplingParams`] is the user-facing knob set (serde-friendly, every
//!   field defaults, see [`SamplingParams::default`]); [`SamplingParams::validate`]
//!   is meant to run once at request admission so the hot path never checks.
//! * Pipeline (see `sampler.rs`): NaN → -inf, penalties (`penalties.rs`:
//!   repetition → frequency → presence) → a grammar's mask when the request has one
//!   (`constraint.rs`) → greedy argmax when `temperature == 0`,
//!   otherwise temperature → top-k → top-p → min-p → softmax → one seeded draw.
//! * Reported `logprob`/`top_logprobs` always come from the log-softmax of the
//!   RAW logits (what HF / OpenAI-style references report), never from the
//!   penalised / tempered / truncated distribution the token was drawn from.
//! * Determinism: the RNG is a `StdRng` seeded from `seed` (or OS entropy when
//!   `None`); exactly one `f64` is drawn per non-greedy `sample` call, and all
//!   orderings use a total order (logit desc, id asc), so the same seed and the
//!   same logits sequence reproduce the same tokens.

pub mod constraint;
pub mod format_depth;
pub mod json_schema;
pub mod json_watch;
pub mod loop_guard;
mod math;
mod overrides;
mod penalties;
mod sampler;
pub mod schema_exact;
pub mod tool_grammar;
pub mod unique_items;

pub use constraint::{Constraint, GrammarCompiler, ResponseFormat, TokenVocab};
pub(crate) use math::argmax;
pub use overrides::SamplingOverrides;
pub use penalties::{apply_frequency_presence_penalty, apply_repetition_penalty, DistinctMarker, TokenCounts};
pub use sampler::Sampler;

use serde::{Deserialize, Serialize};

/// Maximum number of `top_logprobs` a request may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Sampling configuration for one sequence.
///
/// Defaults ([`SamplingParams::default`]), chosen to match common
/// llama.cpp-style chat defaults:
///
/// | field                | default | neutral / disabled value |
/// |----------------------|---------|--------------------------|
/// | `temperature`        | `0.8`   | `0` means greedy         |
/// | `top_k`              | `40`    | `0`                      |
/// | `top_p`              | `0.95`  | `1.0`                    |
/// | `min_p`              | `0.05`  | `0.0`                    |
/// | `repetition_penalty` | `1.0`   | `1.0`                    |
/// | `frequency_penalty`  | `0.0`   | `0.0`                    |
/// | `presence_penalty`   | `0.0`   | `0.0`                    |
/// | `seed`               | `None`  | (`None` = OS entropy)    |
/// | `top_logprobs`       | `0`     | `0`                      |
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Softmax temperature. `0` => greedy (argmax of the penalised logits,
    /// ties -> lowest id). Must be finite and `>= 0`.
    pub temperature: f32,
    /// Keep only the `top_k` highest logits (ties -> lower id). `0` => disabled.
    pub top_k: usize,
    /// Nucleus sampling: keep the smallest prefix (by descending probability)
    /// whose mass is `>= top_p`; always at least one token. `1.0` => disabled.
    /// Must lie in `(0, 1]`.
    pub top_p: f32,
    /// Drop tokens whose probability is `< min_p * p_max` (probabilities after
    /// temperature). `0` => disabled. Must lie in `[0, 1]`.
    pub min_p: f32,
    /// HF repetition penalty over `context` (prompt + generated), applied once
    /// per distinct token: `logit > 0 ? logit / p : logit * p`. `1.0` => disabled.
    /// Must be finite and `> 0`.
    pub repetition_penalty: f32,
    /// OpenAI frequency penalty over GENERATED tokens: `logit -= f * count`.
    pub frequency_penalty: f32,
    /// OpenAI presence penalty over GENERATED tokens: `logit -= p * (count > 0)`.
    pub presence_penalty: f32,
    /// RNG seed; `None` => seeded from OS entropy.
    pub seed: Option<u64>,
    /// How many top (raw) logprobs to return per token, `0..=20`.
    pub top_logprobs: usize,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: None,
            top_logprobs: 0,
        }
    }
}

impl SamplingParams {
    /// Pure greedy decoding: temperature 0, every filter and penalty neutral.
    pub fn greedy() -> Self {
        Self { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, ..Self::default() }
    }

    /// `true` when `sample` takes the argmax path (no RNG draw).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Check ranges; the error message names the offending field.
    pub fn validate(&self) -> Result<(), String> {
        let t = self.temperature;
        if !t.is_finite() || t < 0.0 {
            return Err(format!("temperature must be a finite number >= 0 (0 = greedy), got {t}"));
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {p}"));
        }
        let m = self.min_p;
        if !(0.0..=1.0).contains(&m) {
            return Err(format!("min_p must be in [0, 1], got {m}"));
        }
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0) {
            return Err(format!("repetition_penalty must be a finite number > 0 (1 = disabled), got {r}"));
        }
        if !self.frequency_penalty.is_finite() {
            return Err(format!("frequency_penalty must be finite, got {}", self.frequency_penalty));
        }
        if !self.presence_penalty.is_finite() {
            return Err(format!("presence_penalty must be finite, got {}", self.presence_penalty));
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(format!("top_logprobs must be in 0..={MAX_TOP_LOGPROBS}, got {}", self.top_logprobs));
        }
        Ok(())
    }
}

/// Result of one sampling step.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    /// The chosen token id.
    pub token: u32,
    /// Log-probability of `token` under the log-softmax of the RAW logits.
    pub logprob: f32,
    /// `(id, logprob)` of the `params.top_logprobs` most likely tokens under the
    /// RAW log-softmax, sorted by logprob descending, ties by lower id.
    pub top_logprobs: Vec<(u32, f32)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_documented_values_and_valid() {
        let p = SamplingParams::default();
        assert_eq!(p.temperature, 0.8);
        assert_eq!(p.top_k, 40);
        assert_eq!(p.top_p, 0.95);
        assert_eq!(p.min_p, 0.05);
        assert_eq!(p.repetition_penalty, 1.0);
        assert_eq!(p.frequency_penalty, 0.0);
        assert_eq!(p.presence_penalty, 0.0);
        assert_eq!(p.seed, None);
        assert_eq!(p.top_logprobs, 0);
        assert!(p.validate().is_ok());
        assert!(SamplingParams::greedy().validate().is_ok());
        assert!(SamplingParams::greedy().is_greedy());
    }

    fn err_of(f: impl FnOnce(&mut SamplingParams)) -> String {
        let mut p = SamplingParams::default();
        f(&mut p);
        p.validate().expect_err("expected validation error")
    }

    #[test]
    fn validate_rejects_bad_fields_naming_them() {
        assert!(err_of(|p| p.temperature = f32::NAN).contains("temperature"));
        assert!(err_of(|p| p.temperature = -0.1).contains("temperature"));
        assert!(err_of(|p| p.temperature = f32::INFINITY).contains("temperature"));
        assert!(err_of(|p| p.top_p = 0.0).contains("top_p"));
        assert!(err_of(|p| p.top_p = 1.01).contains("top_p"));
        assert!(err_of(|p| p.top_p = f32::NAN).contains("top_p"));
        assert!(err_of(|p| p.min_p = -0.01).contains("min_p"));
        assert!(err_of(|p| p.min_p = 1.5).contains("min_p"));
        assert!(err_of(|p| p.min_p = f32::NAN).contains("min_p"));
        assert!(err_of(|p| p.repetition_penalty = 0.0).contains("repetition_penalty"));
        assert!(err_of(|p| p.repetition_penalty = -1.0).contains("repetition_penalty"));
        assert!(err_of(|p| p.repetition_penalty = f32::NAN).contains("repetition_penalty"));
        assert!(err_of(|p| p.frequency_penalty = f32::NAN).contains("frequency_penalty"));
        assert!(err_of(|p| p.presence_penalty = f32::INFINITY).contains("presence_penalty"));
        assert!(err_of(|p| p.top_logprobs = 21).contains("top_logprobs"));
    }

    #[test]
    fn validate_accepts_boundaries() {
        let ok = |f: &dyn Fn(&mut SamplingParams)| {
            let mut p = SamplingParams::default();
            f(&mut p);
            p.validate()
        };
        assert!(ok(&|p| p.temperature = 0.0).is_ok());
        assert!(ok(&|p| p.top_p = 1.0).is_ok());
        assert!(ok(&|p| p.min_p = 0.0).is_ok());
        assert!(ok(&|p| p.min_p = 1.0).is_ok());
        assert!(ok(&|p| p.top_logprobs = 20).is_ok());
        assert!(ok(&|p| p.frequency_penalty = -2.0).is_ok());
        assert!(ok(&|p| p.repetition_penalty = 0.5).is_ok());
    }

    #[test]
    fn serde_fills_missing_fields_with_defaults() {
        let p: SamplingParams = serde_json::from_str(r#"{"temperature":0.0,"seed":7}"#).unwrap();
        assert_eq!(p.temperature, 0.0);
        assert_eq!(p.seed, Some(7));
        assert_eq!(p.top_k, 40);
        assert_eq!(p.top_p, 0.95);
    }
}
