//! `inspectModel`: the description of a model or an adapter (`crate::inspect`), read on a
//! libuv worker thread (a large GGUF's tokenizer takes a moment to build). Wrapped by
//! lib/inspect.ts.

use std::path::PathBuf;

use napi::bindgen_prelude::*;
use napi_derive::napi;

use super::error::to_napi;
use crate::error::{panic_message, EngineError};
use crate::inspect::{inspect, AdapterInspection, Inspection, ModelInspection};
use crate::model::inspect::WeightsSummary;

#[napi(object)]
pub struct JsTensorFormat {
    pub format: String,
    pub tensors: u32,
    pub parameters: f64,
    pub bytes: f64,
}

#[napi(object)]
pub struct JsWeightsSummary {
    pub container: String,
    pub files: u32,
    pub file_bytes: f64,
    pub tensors: u32,
    pub parameters: f64,
    pub formats: Vec<JsTensorFormat>,
}

#[napi(object)]
pub struct JsSpecialToken {
    pub id: u32,
    pub text: Option<String>,
}

#[napi(object)]
pub struct JsTokenizerInspection {
    pub source: String,
    pub model: String,
    pub pre: Option<String>,
    pub vocab_size: u32,
    pub bos: Option<JsSpecialToken>,
    pub eos: Vec<JsSpecialToken>,
    pub adds_bos: bool,
    pub chat_template: Option<String>,
}

#[napi(object)]
pub struct JsModelInspection {
    pub architecture: String,
    /// The family as the checkpoint names it (`model_type`, or a GGUF's architecture).
    pub family: String,
    /// The layer plan, one line per run of identical layers, then the rotary embeddings and
    /// the model-wide settings (see `LayerPlan::summary`).
    pub plan: Vec<String>,
    pub vocab_size: u32,
    pub hidden_size: u32,
    pub intermediate_size: u32,
    pub num_layers: u32,
    pub num_heads: u32,
    pub num_kv_heads: u32,
    pub head_dim: u32,
    pub context_length: u32,
    pub rope_theta: f64,
    /// JSON text of the model's RoPE scaling; `None` when it has none.
    pub rope_scaling: Option<String>,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    pub declared_dtype: Option<String>,
    pub bos_token_id: Option<u32>,
    pub eos_tokens: Vec<JsSpecialToken>,
    pub weights: JsWeightsSummary,
    pub tokenizer: Option<JsTokenizerInspection>,
    pub warnings: Vec<String>,
}

#[napi(object)]
pub struct JsAdapterInspection {
    pub kind: String,
    pub rank: Option<u32>,
    pub alpha: Option<f64>,
    pub target_modules: Vec<String>,
    pub target_modules_regex: bool,
    pub num_virtual_tokens: Option<u32>,
    pub base_model: Option<String>,
    pub base_model_class: Option<String>,
    pub name: Option<String>,
    pub description: Option<String>,
    pub weights: JsWeightsSummary,
}

/// Exactly one of `model` / `adapter` is set.
#[napi(object)]
pub struct JsInspection {
    pub model: Option<JsModelInspection>,
    pub adapter: Option<JsAdapterInspection>,
}

/// Counts from a file are bounded by its size, far below 2^53; u32 fields were bounded by
/// the config checks.
fn weights(w: WeightsSummary) -> JsWeightsSummary {
    JsWeightsSummary {
        container: w.container.into(),
        files: w.files as u32,
        file_bytes: w.file_bytes as f64,
        tensors: w.tensors as u32,
        parameters: w.parameters as f64,
        formats: w
            .formats
            .into_iter()
            .map(|f| JsTensorFormat {
                format: f.format,
                tensors: f.tensors as u32,
                parameters: f.parameters as f64,
                bytes: f.bytes as f64,
            })
            .collect(),
    }
}

fn model(m: ModelInspection) -> JsModelInspection {
    let c = m.config;
    JsModelInspection {
        architecture: c.arch.name().into(),
        family: c.family.clone(),
        plan: {
            let mut plan = crate::model::plan::LayerPlan::build(&c).summary();
            if c.text_of_multimodal {
                plan.insert(0, "the text model of a multimodal checkpoint (its vision tower is not read)".into());
            }
            plan
        },
        vocab_size: c.vocab_size as u32,
        hidden_size: c.hidden_size as u32,
        intermediate_size: c.intermediate_size as u32,
        num_layers: c.num_layers as u32,
        num_heads: c.num_heads as u32,
        num_kv_heads: c.num_kv_heads as u32,
        head_dim: c.head_dim as u32,
        context_length: c.max_position_embeddings as u32,
        rope_theta: c.rope_theta,
        rope_scaling: c.rope_scaling.as_ref().map(|r| r.to_json(true).to_string()),
        rms_norm_eps: c.rms_norm_eps,
        tie_word_embeddings: c.tie_word_embeddings,
        declared_dtype: c.declared_dtype,
        bos_token_id: c.bos_token_id,
        eos_tokens: m.eos_tokens.into_iter().map(|(id, text)| JsSpecialToken { id, text }).collect(),
        weights: weights(m.weights),
        tokenizer: m.tokenizer.map(|t| JsTokenizerInspection {
            source: t.source.into(),
            model: t.model,
            pre: t.pre,
            vocab_size: t.vocab_size as u32,
            bos: t.bos_token_id.map(|id| JsSpecialToken { id, text: t.bos_token.clone() }),
            eos: t.eos_tokens.into_iter().map(|(id, text)| JsSpecialToken { id, text }).collect(),
            adds_bos: t.adds_bos,
            chat_template: t.chat_template,
        }),
        warnings: m.warnings,
    }
}

fn adapter(a: AdapterInspection) -> JsAdapterInspection {
    JsAdapterInspection {
        kind: a.kind.into(),
        rank: a.rank.map(|r| u32::try_from(r).unwrap_or(u32::MAX)),
        alpha: a.alpha,
        target_modules: a.target_modules,
        target_modules_regex: a.target_modules_regex,
        num_virtual_tokens: a.num_virtual_tokens.map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
        base_model: a.base_model,
        base_model_class: a.base_model_class,
        name: a.name,
        description: a.description,
        weights: weights(a.weights),
    }
}

pub struct InspectTask {
    path: String,
}

impl Task for InspectTask {
    type Output = Inspection;
    type JsValue = JsInspection;

    fn compute(&mut self) -> Result<Inspection> {
        let path = PathBuf::from(&self.path);
        // A defect that panics must reject the promise, not abort the process.
        std::panic::catch_unwind(|| inspect(&path))
            .map_err(|p| EngineError::Internal(format!("inspect panicked: {}", panic_message(&*p))))
            .and_then(|r| r)
            .map_err(to_napi)
    }

    fn resolve(&mut self, _env: Env, output: Inspection) -> Result<JsInspection> {
        Ok(match output {
            Inspection::Model(m) => JsInspection { model: Some(model(*m)), adapter: None },
            Inspection::Adapter(a) => JsInspection { model: None, adapter: Some(adapter(*a)) },
        })
    }
}

/// Describes the model (HF directory or GGUF file) or PEFT adapter directory at `path` from
/// its files, without loading weights.
#[napi(ts_return_type = "Promise<JsInspection>")]
pub fn inspect_model(path: String) -> AsyncTask<InspectTask> {
    AsyncTask::new(InspectTask { path })
}
