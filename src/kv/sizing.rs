//! How large the shared KV pool is: the `kvCache` options, checked, and the default size.

use super::quant::Quant;
use super::store::KvFormat;
use crate::error::{EngineError, Result};

/// Bounds of the shared KV pool.
#[derive(Clone, Debug, Default)]
pub struct KvCacheOptions {
    /// Positions per block (default [`DEFAULT_BLOCK_SIZE`]).
    pub block_size: Option<usize>,
    /// Positions the pool holds over all sessions (default: see [`default_tokens`]).
    pub max_tokens: Option<usize>,
    /// Share full blocks between sequences with the same prefix (default true).
    pub prefix_cache: Option<bool>,
    /// What the pool stores keys and values as: `f32` | `f16` | `bf16` | `q8_0` | `q4_0`
    /// (default: the model's dtype).
    pub dtype: Option<String>,
}

/// The pool's format from the `kvCache.dtype` option; `model` when not given.
pub fn kv_dtype(name: Option<&str>, model: candle_core::DType) -> Result<KvFormat> {
    use candle_core::DType;
    Ok(match name {
        None => KvFormat::Dense(model),
        Some("f32") => KvFormat::Dense(DType::F32),
        Some("f16") => KvFormat::Dense(DType::F16),
        Some("bf16") => KvFormat::Dense(DType::BF16),
        Some("q8_0") => KvFormat::Quant(Quant::Q8_0),
        Some("q4_0") => KvFormat::Quant(Quant::Q4_0),
        Some(other) => {
            return Err(EngineError::InvalidArgument(format!("unknown kvCache.dtype '{other}' (f32, f16, bf16, q8_0, q4_0)")))
        }
    })
}

pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// The default pool size in positions: what `budget_bytes` holds at `bytes_per_token`, at
/// most 64 full contexts.
pub fn default_tokens(budget_bytes: usize, bytes_per_token: usize, context_length: usize) -> usize {
    (budget_bytes / bytes_per_token.max(1)).min(64usize.saturating_mul(context_length))
}

/// What the device offers the pool, in bytes.
#[derive(Clone, Copy, Debug)]
pub struct KvMemory {
    /// The default pool's size when `max_tokens` is unset.
    pub budget: usize,
    /// What the device can hold at all (a GPU's or the machine's total memory).
    pub total: u64,
    /// What a pool may take now (a GPU's free memory; the machine's total on CPU, where the
    /// pool is committed only as it is written).
    pub limit: u64,
}

/// `(blocks, block size)` of the pool. A pool larger than the device is refused as an invalid
/// argument (it could never be allocated); one that fits the device but not its free memory
/// now is `OUT_OF_MEMORY`.
pub fn pool_shape(
    opts: &KvCacheOptions,
    bytes_per_token: usize,
    context_length: usize,
    memory: KvMemory,
) -> Result<(usize, usize)> {
    let bs = opts.block_size.unwrap_or(DEFAULT_BLOCK_SIZE);
    if bs == 0 || bs > 1024 {
        return Err(EngineError::InvalidArgument(format!("kvCache.blockSize must be between 1 and 1024 (got {bs})")));
    }
    let tokens = match opts.max_tokens {
        Some(n) if n < bs => {
            return Err(EngineError::InvalidArgument(format!(
                "kvCache.maxTokens must be at least one block ({bs} positions; got {n})"
            )))
        }
        Some(n) => n,
        None => default_tokens(memory.budget, bytes_per_token, context_length).max(bs),
    };
    let bytes = (tokens as u64).saturating_mul(bytes_per_token as u64);
    if bytes > memory.total {
        return Err(EngineError::InvalidArgument(format!(
            "kvCache.maxTokens {tokens} needs {bytes} bytes of KV cache, more than this device's {}",
            memory.total
        )));
    }
    if bytes > memory.limit {
        return Err(EngineError::OutOfMemory(format!(
            "kvCache.maxTokens {tokens} needs {bytes} bytes of KV cache; the device has {} free",
            memory.limit
        )));
    }
    // Block ids are u32.
    let blocks = (tokens / bs).min(u32::MAX as usize);
    Ok((blocks, bs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked_and_the_default_follows_the_budget() {
        let opts = |block_size, max_tokens| KvCacheOptions { block_size, max_tokens, prefix_cache: None, dtype: None };
        let mem = |budget, limit| KvMemory { budget, total: limit, limit };
        assert_eq!(pool_shape(&opts(None, Some(100)), 8, 64, mem(0, u64::MAX)).unwrap(), (6, 16));
        assert!(pool_shape(&opts(Some(0), None), 8, 64, mem(0, u64::MAX)).is_err());
        assert!(pool_shape(&opts(Some(2048), None), 8, 64, mem(0, u64::MAX)).is_err());
        assert!(pool_shape(&opts(Some(32), Some(16)), 8, 64, mem(0, u64::MAX)).is_err());
        // 1 MiB at 1 KiB per token: 1024 positions, capped at 64 contexts of 8.
        assert_eq!(pool_shape(&opts(Some(4), None), 1024, 1 << 20, mem(1 << 20, u64::MAX)).unwrap(), (256, 4));
        assert_eq!(pool_shape(&opts(Some(4), None), 1024, 8, mem(1 << 20, u64::MAX)).unwrap(), (128, 4));
        // A budget too small for one block still gives one block.
        assert_eq!(pool_shape(&opts(None, None), 1 << 20, 64, mem(10, u64::MAX)).unwrap(), (1, 16));
        // More than the device holds is refused before anything is allocated.
        let e = pool_shape(&opts(None, Some(1_000_000_000_000)), 1024, 64, mem(0, 1 << 34)).unwrap_err();
        assert!(matches!(e, EngineError::InvalidArgument(_)), "{e:?}");
        assert!(pool_shape(&opts(None, Some(1 << 24)), 1024, 64, mem(0, 1 << 34)).is_ok());
        // Within the device but beyond what is free now (a GPU holding other work): out of memory.
        let busy = KvMemory { budget: 0, total: 1 << 34, limit: 1 << 30 };
        let e = pool_shape(&opts(None, Some(1 << 24)), 1024, 64, busy).unwrap_err();
        assert!(matches!(e, EngineError::OutOfMemory(_)), "{e:?}");
    }
}
