//! `estimateModel`: what a load would take (`crate::engine::fit`), from the model's headers,
//! on a libuv worker thread. Wrapped by `Runtime.estimate` (lib/estimate.ts).

use std::path::PathBuf;

use napi::bindgen_prelude::*;
use napi_derive::napi;

use super::error::to_napi;
use super::runtime::load_options;
use super::types::NativeLoadOptions;
use crate::engine::fit::{estimate, Estimate};
use crate::engine::load::LoadOptions;
use crate::error::{panic_message, EngineError};

#[napi(object)]
pub struct JsFormatBytes {
    pub format: String,
    pub bytes: f64,
}

#[napi(object)]
pub struct JsEstimate {
    pub weight_bytes: f64,
    pub weight_mapped_bytes: f64,
    pub weight_formats: Vec<JsFormatBytes>,
    pub kv_dtype: String,
    /// Bytes per position in each `kvCache.dtype`.
    pub kv_bytes_per_token: Vec<JsFormatBytes>,
    pub kv_block_size: u32,
    pub state_bytes_per_sequence: f64,
    pub state_slots: u32,
    pub state_bytes: f64,
    pub rope_bytes: f64,
    pub scratch_bytes: f64,
    pub tokenizer_bytes: f64,
    pub memory_limit: f64,
    pub memory_limit_is_default: bool,
    pub model_context_length: u32,
    pub fit_context_length: u32,
    pub context_length: u32,
    pub kv_bytes: f64,
    pub total_bytes: f64,
    pub does_not_fit: Option<String>,
}

fn js(e: Estimate) -> JsEstimate {
    let bytes = |(format, bytes): (String, u64)| JsFormatBytes { format, bytes: bytes as f64 };
    let u32_of = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    JsEstimate {
        weight_bytes: e.weights.bytes as f64,
        weight_mapped_bytes: e.weights.mapped_bytes as f64,
        weight_formats: e.weights.formats.into_iter().map(bytes).collect(),
        kv_dtype: e.kv_dtype.into(),
        kv_bytes_per_token: e.kv_bytes_per_token.into_iter().map(|(f, b)| bytes((f.into(), b))).collect(),
        kv_block_size: u32_of(e.kv_block_size),
        state_bytes_per_sequence: e.state_bytes_per_sequence as f64,
        state_slots: u32_of(e.state_slots),
        state_bytes: e.state_bytes as f64,
        rope_bytes: e.rope_bytes as f64,
        scratch_bytes: e.scratch_bytes as f64,
        tokenizer_bytes: e.tokenizer_bytes as f64,
        memory_limit: e.memory_limit as f64,
        memory_limit_is_default: e.memory_limit_is_default,
        model_context_length: u32_of(e.model_context_length),
        fit_context_length: u32_of(e.fit_context_length),
        context_length: u32_of(e.context_length),
        kv_bytes: e.kv_bytes as f64,
        total_bytes: e.total_bytes as f64,
        does_not_fit: e.does_not_fit,
    }
}

pub struct EstimateTask {
    path: String,
    opts: LoadOptions,
}

impl Task for EstimateTask {
    type Output = Estimate;
    type JsValue = JsEstimate;

    fn compute(&mut self) -> Result<Estimate> {
        let path = PathBuf::from(&self.path);
        // A defect that panics must reject the promise, not abort the process.
        std::panic::catch_unwind(|| estimate(&path, &self.opts))
            .map_err(|p| EngineError::Internal(format!("estimate panicked: {}", panic_message(&*p))))
            .and_then(|r| r)
            .map_err(to_napi)
    }

    fn resolve(&mut self, _env: Env, output: Estimate) -> Result<JsEstimate> {
        Ok(js(output))
    }
}

/// What loading the model at `path` with `options` would take, from its headers: no weight is
/// read.
#[napi(ts_return_type = "Promise<JsEstimate>")]
pub fn estimate_model(path: String, options: Option<NativeLoadOptions>) -> Result<AsyncTask<EstimateTask>> {
    Ok(AsyncTask::new(EstimateTask { path, opts: load_options(options)? }))
}
