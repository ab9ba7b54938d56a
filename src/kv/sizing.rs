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
    /// Bytes the pool may take (with `max_tokens`, the smaller bound wins).
    pub max_bytes: Option<u64>,
    /// Idle this long (ms), the pool forgets its cached prefixes and gives the memory of the
    /// blocks no session holds back to the OS; 0 never does (default
    /// [`DEFAULT_IDLE_RELEASE_MS`]).
    pub idle_release_ms: Option<u64>,
    /// Share full blocks between sequences with the same prefix (default true).
    pub prefix_cache: Option<bool>,
    /// What the pool stores keys and values as: `f32` | `f16` | `bf16` | `q8_0` | `q4_0`
    /// (default: the model's dtype).
    pub dtype: Option<String>,
    /// Sequences that may hold a recurrent state at once, for models with recurrent layers
    /// (default: [`DEFAULT_STATE_SLOTS`], fewer where the budget holds fewer).
    pub max_sequences: Option<usize>,
    /// A disk tier for the prefix cache (`kvCache.disk`, see [`super::disk`]).
    pub disk: Option<super::disk::DiskOptions>,
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

/// Sequences that may hold a recurrent state at once (models with recurrent layers), unless
/// the budget holds fewer.
pub const DEFAULT_STATE_SLOTS: usize = 32;
/// Most state slots a pool may have.
pub const MAX_STATE_SLOTS: usize = 4096;

/// Slots of recurrent state for a model whose sequences keep `state_bytes` each (0: none):
/// `(sequences, snapshots)`, a quarter as many snapshots of shared prefixes as sequences (at
/// least one), and the memory left for the blocks: `memory` less what the slots take. The
/// sequences' slots take at most half the budget by default; with `max_bytes`, all come out of
/// it.
pub fn state_slots(
    opts: &KvCacheOptions,
    state_bytes: usize,
    memory: KvMemory,
) -> Result<((usize, usize), KvMemory, Option<u64>)> {
    if state_bytes == 0 {
        return Ok(((0, 0), memory, opts.max_bytes));
    }
    let slots = match opts.max_sequences {
        Some(n) if n == 0 || n > MAX_STATE_SLOTS => {
            return Err(EngineError::InvalidArgument(format!("kvCache.maxSequences must be in 1..={MAX_STATE_SLOTS} (got {n})")))
        }
        Some(n) => n,
        None => DEFAULT_STATE_SLOTS.min((memory.budget / 2 / state_bytes).max(1)),
    };
    let snapshots = (slots / 4).max(1);
    let bytes = ((slots + snapshots) as u64).saturating_mul(state_bytes as u64);
    if bytes > memory.total {
        return Err(EngineError::InvalidArgument(format!(
            "the recurrent states of {slots} sequences take {bytes} bytes ({state_bytes} each), more than this device's {}",
            memory.total
        )));
    }
    let max_bytes = match opts.max_bytes {
        Some(b) if b <= bytes => {
            return Err(EngineError::InvalidArgument(format!(
                "kvCache.maxBytes {b} must hold the recurrent states of {slots} sequences ({bytes} bytes) and a block"
            )))
        }
        Some(b) => Some(b - bytes),
        None => None,
    };
    let left = KvMemory {
        budget: memory.budget.saturating_sub(bytes as usize),
        total: memory.total - bytes,
        limit: memory.limit.saturating_sub(bytes),
    };
    Ok(((slots, snapshots), left, max_bytes))
}

/// How long the engine waits idle before the pool gives unused memory back (ms).
pub const DEFAULT_IDLE_RELEASE_MS: u64 = 30_000;

/// The idle period after which the pool gives unused memory back; `None`: never.
pub fn idle_release(opts: &KvCacheOptions) -> Option<std::time::Duration> {
    match opts.idle_release_ms.unwrap_or(DEFAULT_IDLE_RELEASE_MS) {
        0 => None,
        ms => Some(std::time::Duration::from_millis(ms)),
    }
}

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
    let by_bytes = match opts.max_bytes {
        Some(b) if b < bs.saturating_mul(bytes_per_token) as u64 => {
            return Err(EngineError::InvalidArgument(format!(
                "kvCache.maxBytes must hold at least one block ({} bytes for {bs} positions; got {b})",
                bs * bytes_per_token
            )))
        }
        Some(b) => Some(usize::try_from(b / bytes_per_token.max(1) as u64).unwrap_or(usize::MAX)),
        None => None,
    };
    let tokens = match (opts.max_tokens, by_bytes) {
        (Some(n), _) if n < bs => {
            return Err(EngineError::InvalidArgument(format!(
                "kvCache.maxTokens must be at least one block ({bs} positions; got {n})"
            )))
        }
        (Some(n), b) => n.min(b.unwrap_or(usize::MAX)),
        (None, Some(b)) => b,
        (None, None) => default_tokens(memory.budget, bytes_per_token, context_length).max(bs),
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
        let opts = |block_size, max_tokens| KvCacheOptions { block_size, max_tokens, ..Default::default() };
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

    #[test]
    fn a_byte_bound_sizes_the_pool_and_the_smaller_bound_wins() {
        let bytes = |max_tokens, max_bytes| KvCacheOptions { max_tokens, max_bytes, ..Default::default() };
        let mem = KvMemory { budget: 1 << 30, total: u64::MAX, limit: u64::MAX };
        // 1 MiB at 1 KiB per token: 1024 positions, 64 blocks of 16.
        assert_eq!(pool_shape(&bytes(None, Some(1 << 20)), 1024, 4096, mem).unwrap(), (64, 16));
        assert_eq!(pool_shape(&bytes(Some(320), Some(1 << 20)), 1024, 4096, mem).unwrap(), (20, 16));
        assert_eq!(pool_shape(&bytes(Some(4096), Some(1 << 20)), 1024, 4096, mem).unwrap(), (64, 16));
        // Less than one block, or u64::MAX (more than the device): refused.
        let e = pool_shape(&bytes(None, Some(1000)), 1024, 4096, mem).unwrap_err();
        assert!(e.to_string().contains("kvCache.maxBytes"), "{e}");
        let small = KvMemory { budget: 1 << 20, total: 1 << 30, limit: 1 << 30 };
        assert!(matches!(pool_shape(&bytes(None, Some(u64::MAX)), 1024, 4096, small), Err(EngineError::InvalidArgument(_))));
    }

    #[test]
    fn idle_release_defaults_on_and_zero_turns_it_off() {
        let o = |ms| KvCacheOptions { idle_release_ms: ms, ..Default::default() };
        assert_eq!(idle_release(&o(None)), Some(std::time::Duration::from_millis(DEFAULT_IDLE_RELEASE_MS)));
        assert_eq!(idle_release(&o(Some(0))), None);
        assert_eq!(idle_release(&o(Some(250))), Some(std::time::Duration::from_millis(250)));
    }
}
