//! Counters the engine thread publishes after every step and every command, read without
//! waiting for it (`Runtime.stats()` is synchronous).

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default)]
pub struct EngineStats {
    pub kv_blocks_total: AtomicU64,
    pub kv_blocks_used: AtomicU64,
    pub kv_blocks_cached: AtomicU64,
    pub kv_block_size: AtomicU64,
    pub kv_bytes_per_token: AtomicU64,
    pub sessions: AtomicU64,
    pub running_requests: AtomicU64,
    pub queued_requests: AtomicU64,
    pub prefix_cache_hit_tokens: AtomicU64,
    pub evicted_blocks: AtomicU64,
}

/// A consistent-enough copy of [`EngineStats`] (each field is read atomically).
#[derive(Clone, Debug, Default)]
pub struct StatsSnapshot {
    pub kv_blocks_total: u64,
    pub kv_blocks_used: u64,
    pub kv_blocks_cached: u64,
    pub kv_block_size: u64,
    pub kv_bytes: u64,
    pub kv_bytes_per_token: u64,
    pub sessions: u64,
    pub active_requests: u64,
    pub queued_requests: u64,
    pub prefix_cache_hit_tokens: u64,
    pub evicted_blocks: u64,
}

impl EngineStats {
    pub fn snapshot(&self) -> StatsSnapshot {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (used, bs, bpt) = (r(&self.kv_blocks_used), r(&self.kv_block_size), r(&self.kv_bytes_per_token));
        let (running, queued) = (r(&self.running_requests), r(&self.queued_requests));
        StatsSnapshot {
            kv_blocks_total: r(&self.kv_blocks_total),
            kv_blocks_used: used,
            kv_blocks_cached: r(&self.kv_blocks_cached),
            kv_block_size: bs,
            kv_bytes: used * bs * bpt,
            kv_bytes_per_token: bpt,
            sessions: r(&self.sessions),
            active_requests: running + queued,
            queued_requests: queued,
            prefix_cache_hit_tokens: r(&self.prefix_cache_hit_tokens),
            evicted_blocks: r(&self.evicted_blocks),
        }
    }
}
