//! Sampling settings as requests and models state them: every field optional.
//!
//! A request's [`SamplingOverrides`] is resolved over the model's (read from
//! `generation_config.json`) and then over the library defaults into one [`SamplingParams`],
//! which is validated once. Adding an option means adding it here and to [`SamplingParams`]
//! (and to the binding's option object); nothing in between copies fields.

use super::SamplingParams;

/// Sampling settings that may be unset (`None`: fall back to the next layer of defaults).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SamplingOverrides {
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub seed: Option<u64>,
    pub top_logprobs: Option<usize>,
}

impl SamplingOverrides {
    /// `self`, then `model`, then [`SamplingParams::default`], field by field; validated.
    pub fn resolve(&self, model: &SamplingOverrides) -> Result<SamplingParams, String> {
        let lib = SamplingParams::default();
        let p = SamplingParams {
            temperature: self.temperature.or(model.temperature).unwrap_or(lib.temperature),
            top_k: self.top_k.or(model.top_k).unwrap_or(lib.top_k),
            top_p: self.top_p.or(model.top_p).unwrap_or(lib.top_p),
            min_p: self.min_p.or(model.min_p).unwrap_or(lib.min_p),
            repetition_penalty: self.repetition_penalty.or(model.repetition_penalty).unwrap_or(lib.repetition_penalty),
            frequency_penalty: self.frequency_penalty.or(model.frequency_penalty).unwrap_or(lib.frequency_penalty),
            presence_penalty: self.presence_penalty.or(model.presence_penalty).unwrap_or(lib.presence_penalty),
            seed: self.seed.or(model.seed),
            top_logprobs: self.top_logprobs.or(model.top_logprobs).unwrap_or(lib.top_logprobs),
        };
        p.validate()?;
        Ok(p)
    }

    /// The sampling part of an HF `generation_config.json`. `do_sample: false` means greedy;
    /// the OpenAI penalties, seed and logprobs are request-only.
    pub fn from_generation_config(v: &serde_json::Value) -> Self {
        let f = |k: &str| v.get(k).and_then(|x| x.as_f64()).map(|x| x as f32);
        let sample = v.get("do_sample").and_then(|x| x.as_bool()).unwrap_or(true);
        Self {
            temperature: if sample { f("temperature") } else { Some(0.0) },
            top_k: v.get("top_k").and_then(|x| x.as_u64()).map(|x| usize::try_from(x).unwrap_or(usize::MAX)),
            top_p: f("top_p"),
            min_p: f("min_p"),
            repetition_penalty: f("repetition_penalty"),
            ..Self::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_over_model_over_library_defaults() {
        let model = SamplingOverrides::from_generation_config(&serde_json::json!({
            "do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.9, "repetition_penalty": 1.1
        }));
        let request = SamplingOverrides { temperature: Some(0.0), min_p: Some(0.2), seed: Some(7), ..Default::default() };
        let p = request.resolve(&model).unwrap();
        let lib = SamplingParams::default();
        assert_eq!((p.temperature, p.top_k, p.top_p, p.min_p), (0.0, 20, 0.9, 0.2));
        assert_eq!((p.repetition_penalty, p.frequency_penalty, p.seed), (1.1, lib.frequency_penalty, Some(7)));
        assert_eq!(SamplingOverrides::default().resolve(&SamplingOverrides::default()).unwrap(), lib);
    }

    #[test]
    fn do_sample_false_is_greedy_and_ranges_are_checked_once() {
        let model = SamplingOverrides::from_generation_config(&serde_json::json!({ "do_sample": false, "temperature": 0.7 }));
        assert_eq!(model.temperature, Some(0.0));
        let bad = SamplingOverrides { top_p: Some(f32::NAN), ..Default::default() };
        assert!(bad.resolve(&model).unwrap_err().contains("top_p"));
        let bad = SamplingOverrides { top_logprobs: Some(21), ..Default::default() };
        assert!(bad.resolve(&model).is_err());
    }
}
