//! Prompt tuning: `num_virtual_tokens` learned input embeddings that PEFT prepends to the
//! token embeddings of every sequence. Here they occupy positions `0..n` of the session's KV
//! cache: the decoder prepends them when it evaluates position 0, and the scheduler keeps them
//! while the expert set is unchanged.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};

use super::peft::{AdapterConfig, RawTensor};
use crate::error::{EngineError, Result};

/// `prompt_embeddings [n, hidden]`, checked against the config and the model.
pub fn load(
    cfg: &AdapterConfig,
    tensors: &mut HashMap<String, RawTensor>,
    hidden: usize,
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    let key = "prompt_embeddings";
    let t = tensors.remove(key).ok_or_else(|| EngineError::InvalidAdapter(format!("missing tensor {key}")))?;
    if let Some(other) = tensors.keys().next() {
        return Err(EngineError::InvalidAdapter(format!("unexpected tensor {other} in a prompt-tuning adapter")));
    }
    if cfg.num_transformer_submodules != 1 {
        return Err(EngineError::UnsupportedAdapter(format!(
            "prompt tuning with num_transformer_submodules = {} (decoder-only models use 1)",
            cfg.num_transformer_submodules
        )));
    }
    let n = cfg.num_virtual_tokens;
    if n == 0 {
        return Err(EngineError::InvalidAdapter("num_virtual_tokens must be positive".into()));
    }
    if t.shape != [n, hidden] {
        return Err(EngineError::InvalidAdapter(format!(
            "tensor {key} has shape {:?}, expected [{n}, {hidden}] (num_virtual_tokens × the model's hidden size)",
            t.shape
        )));
    }
    t.to_tensor(dtype, device)
}
