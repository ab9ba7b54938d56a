//! What a load would take, and the context that fits a memory budget, from the model's
//! headers alone (`Runtime.estimate`, `inspect --fit`, `contextLength: 'auto'`).
//!
//! The parts, each by the rule the load itself applies:
//! - **weights**: each tensor in the form the loader gives it ([`crate::model::footprint`]);
//! - **KV**: bytes per position of the pool in each `kvCache.dtype` (every layer that keeps
//!   positions, as the pool is sized), times the context;
//! - **state**: the recurrent layers' slots the pool reserves ([`crate::kv::sizing::state_slots`]);
//! - **tables and scratch**: the RoPE cos/sin tables over the context, and the activations of
//!   one prefill chunk (an approximation: a few hidden-sized rows per token, the MLP's
//!   intermediate rows, one row of logits);
//! - **tokenizer**: the vocabulary, merges and the engine's per-token tables, at
//!   [`TOKENIZER_BYTES_PER_ENTRY`] per vocabulary entry (measured: ~700 on SmolLM2's 49k
//!   vocabulary, ~600 on Qwen3's 152k, as resident memory after a load less the weights).
//!
//! `memoryLimit` bounds them all. Its default is what the device has free now (the machine's
//! available memory on CPU, the GPU's free memory), less a margin: a tenth, and 256 MiB on CPU
//! for the rest of the process.

use std::path::Path;

use candle_core::Device;

use super::load::{self, LoadOptions};
use crate::error::Result;
use crate::kv::sizing::{self, KvMemory};
use crate::kv::store::KvFormat;
use crate::model::footprint::{weight_footprint, WeightFootprint};
use crate::model::loader::{self, ModelFormat, WeightPolicy};
use crate::model::plan::LayerPlan;
use crate::model::ModelConfig;

/// The `kvCache.dtype` names, in the order an estimate lists them.
pub const KV_DTYPES: [&str; 5] = ["f32", "f16", "bf16", "q8_0", "q4_0"];

/// The smallest context `contextLength: 'auto'` accepts (or the model's own, when shorter):
/// below it a chat hardly fits, and the load is refused as out of memory.
pub const MIN_AUTO_CONTEXT: usize = 512;

/// Resident bytes per vocabulary entry of the tokenizer and the engine's token tables (see
/// the module note): an approximation, measured rather than derived.
pub const TOKENIZER_BYTES_PER_ENTRY: u64 = 640;

/// What a load with given options would take.
#[derive(Clone, Debug)]
pub struct Estimate {
    pub weights: WeightFootprint,
    /// The pool's format, and its bytes per position in each format ([`KV_DTYPES`]).
    pub kv_dtype: &'static str,
    pub kv_bytes_per_token: Vec<(&'static str, u64)>,
    pub kv_block_size: usize,
    /// Recurrent state (0 for a model without recurrent layers): one sequence's, the slots
    /// the pool reserves (sequences and prefix snapshots), and their bytes.
    pub state_bytes_per_sequence: u64,
    pub state_slots: usize,
    pub state_bytes: u64,
    /// RoPE tables over the model's context.
    pub rope_bytes: u64,
    /// Activations of one prefill chunk.
    pub scratch_bytes: u64,
    /// The tokenizer and the token tables.
    pub tokenizer_bytes: u64,
    /// The budget, and whether it is the default (free memory less the margin).
    pub memory_limit: u64,
    pub memory_limit_is_default: bool,
    /// The longest context the model supports (with its RoPE scaling).
    pub model_context_length: usize,
    /// The longest context whose KV fits the budget next to everything else (at most the
    /// model's, a multiple of the block size; 0 when not one block fits).
    pub fit_context_length: usize,
    /// The context the load would use: `contextLength` given, `auto`'s pick, or the model's.
    pub context_length: usize,
    /// KV of one sequence at `context_length`.
    pub kv_bytes: u64,
    /// weights + state + tables + scratch + tokenizer + KV at `context_length`.
    pub total_bytes: u64,
    /// Why a load with these options would not fit the budget (`OUT_OF_MEMORY`), if it would not.
    pub does_not_fit: Option<String>,
}

/// The budget: `memoryLimit`, or what the device has free less the margin.
pub fn memory_limit(opts: &LoadOptions, device: &Device) -> (u64, bool) {
    if let Some(b) = opts.memory_limit {
        return (b, false);
    }
    let free = match super::device::device_memory(device) {
        Some(m) => m.free.saturating_sub(m.free / 10),
        None => {
            let free = crate::files::available_memory().unwrap_or(8 << 30);
            free.saturating_sub(free / 10).saturating_sub(256 << 20)
        }
    };
    (free, true)
}

/// Activations of one prefill chunk of `step_tokens` positions, in f32.
fn scratch_bytes(cfg: &ModelConfig, step_tokens: usize) -> u64 {
    let row = 4 * cfg.hidden_size + 3 * cfg.intermediate_size + (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim;
    (step_tokens as u64).saturating_mul(row as u64).saturating_add(2 * cfg.vocab_size as u64).saturating_mul(4)
}

/// The estimate for a model already opened (`cfg` with the load's RoPE scaling applied). A
/// load that would not fit the budget is described (`does_not_fit`), not refused: the load
/// refuses it.
pub fn plan(
    cfg: &ModelConfig,
    format: &ModelFormat,
    opts: &LoadOptions,
    device: &Device,
    policy: WeightPolicy,
) -> Result<Estimate> {
    let dtype = load::select_dtype(opts.dtype.as_deref(), device)?;
    let weights = weight_footprint(format, policy, dtype, device.is_cpu())?;
    let layer_plan = LayerPlan::build(cfg);
    let layout = layer_plan.kv_layout(cfg.num_kv_heads, cfg.head_dim);
    let kv_format = sizing::kv_dtype(opts.kv_cache.dtype.as_deref(), dtype)?;
    let per_token = |f: KvFormat| layout.pool_bytes_per_token(cfg.num_kv_heads, cfg.head_dim, f) as u64;
    let kv_bytes_per_token: Vec<(&'static str, u64)> =
        KV_DTYPES.iter().map(|&name| Ok((name, per_token(sizing::kv_dtype(Some(name), dtype)?)))).collect::<Result<_>>()?;
    let bpt = per_token(kv_format).max(1);
    let block_size = opts.kv_cache.block_size.unwrap_or(sizing::DEFAULT_BLOCK_SIZE).max(1);

    let model_context_length = load::context_length(&LoadOptions { context_length: None, ..opts.clone() }, cfg, &mut Vec::new())?;
    let rope_bytes = layer_plan.ropes.iter().fold(0u64, |n, r| {
        let half = (r.rotary_dim / 2) as u64;
        n.saturating_add((model_context_length as u64).saturating_mul(half).saturating_mul(2 * dtype.size_in_bytes() as u64))
    });
    let step = if device.is_cpu() { super::scheduler::DEFAULT_STEP_TOKENS } else { super::scheduler::DEVICE_STEP_TOKENS };
    let scratch_bytes = scratch_bytes(cfg, step);
    let tokenizer_bytes = (cfg.vocab_size as u64).saturating_mul(TOKENIZER_BYTES_PER_ENTRY);
    let (memory_limit, memory_limit_is_default) = memory_limit(opts, device);

    // What the budget leaves for the pool: the states first, as the pool reserves them.
    let fixed = [rope_bytes, scratch_bytes, tokenizer_bytes].iter().fold(weights.bytes, |n, &b| n.saturating_add(b));
    let room = memory_limit.saturating_sub(fixed);
    let state_per_sequence = layout.state_bytes_per_sequence();
    let room_memory = KvMemory { budget: usize::try_from(room).unwrap_or(usize::MAX), total: room, limit: room };
    let ((slots, snapshots), left, _) = match sizing::state_slots(&opts.kv_cache, state_per_sequence, room_memory) {
        Ok(r) => r,
        // Not even the states fit: nothing is left for positions.
        Err(_) => ((0, 0), KvMemory { budget: 0, total: 0, limit: 0 }, None),
    };
    let state_slots = slots + snapshots;
    let state_bytes = (state_slots as u64).saturating_mul(state_per_sequence as u64);
    let fit = (left.budget as u64 / bpt).min(model_context_length as u64) as usize;
    let fit_context_length = fit / block_size * block_size;

    let mut does_not_fit = None;
    let context_length = if opts.context_auto {
        let floor = MIN_AUTO_CONTEXT.min(model_context_length);
        if fit_context_length < floor {
            does_not_fit = Some(format!(
                "contextLength 'auto': {fit_context_length} positions fit in memoryLimit {memory_limit} bytes \
                 (weights {}, state {state_bytes}, tables, scratch and tokenizer {}, KV {bpt} bytes per position), fewer than {floor}",
                weights.bytes,
                fixed.saturating_sub(weights.bytes)
            ));
        }
        fit_context_length
    } else {
        load::context_length(opts, cfg, &mut Vec::new())?
    };
    let kv_bytes = (context_length as u64).saturating_mul(bpt);
    let total_bytes = fixed.saturating_add(state_bytes).saturating_add(kv_bytes);
    let least = fixed.saturating_add(state_bytes).saturating_add(bpt.saturating_mul(block_size as u64));
    if does_not_fit.is_none() && opts.memory_limit.is_some() && least > memory_limit {
        does_not_fit = Some(format!(
            "memoryLimit {memory_limit} bytes does not hold this model: weights {} bytes, state {state_bytes}, \
             tables, scratch and tokenizer {}, and one block of KV ({} bytes)",
            weights.bytes,
            fixed.saturating_sub(weights.bytes),
            bpt.saturating_mul(block_size as u64)
        ));
    }
    Ok(Estimate {
        weights,
        kv_dtype: kv_format.name(),
        kv_bytes_per_token,
        kv_block_size: block_size,
        state_bytes_per_sequence: state_per_sequence as u64,
        state_slots,
        state_bytes,
        rope_bytes,
        scratch_bytes,
        tokenizer_bytes,
        memory_limit,
        memory_limit_is_default,
        model_context_length,
        fit_context_length,
        context_length,
        kv_bytes,
        total_bytes,
        does_not_fit,
    })
}

/// What loading `path` with `opts` would take, read from its headers: no weight is loaded.
pub fn estimate(path: &Path, opts: &LoadOptions) -> Result<Estimate> {
    load::check_options(opts)?;
    let device = super::device::select_device(opts.device.as_deref())?;
    let policy = load::weight_policy(opts)?;
    let mut files = loader::open(path, &device, &|_, _| {}, policy)?;
    load::apply_rope_option(opts, &mut files.config)?;
    plan(&files.config, &files.format, opts, &device, policy)
}

#[cfg(test)]
#[path = "fit_tests.rs"]
mod tests;
