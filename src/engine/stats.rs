//! Counters the engine thread publishes after every step and every command, read without
//! waiting for it (`Runtime.stats()` is synchronous).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use candle_core::Device;

#[derive(Default)]
pub struct EngineStats {
    pub kv_blocks_total: AtomicU64,
    pub kv_blocks_used: AtomicU64,
    pub kv_blocks_cached: AtomicU64,
    pub kv_blocks_touched: AtomicU64,
    pub kv_block_size: AtomicU64,
    /// What one position takes over every layer that keeps positions (as if all were global).
    pub kv_bytes_per_token: AtomicU64,
    /// What one block takes (its table group's layers).
    pub kv_block_bytes: AtomicU64,
    pub sessions: AtomicU64,
    pub running_requests: AtomicU64,
    pub queued_requests: AtomicU64,
    pub prefix_cache_hit_tokens: AtomicU64,
    pub evicted_blocks: AtomicU64,
    /// Requests that waited for room at least once (in all).
    pub waited_requests: AtomicU64,
    /// Blocks whose memory was given back to the OS after idle periods (in all).
    pub kv_blocks_released: AtomicU64,
    /// Blocks sliding-window layers gave back as their sequences moved past them (in all).
    pub kv_blocks_behind_window: AtomicU64,
    /// Recurrent-state slots (models with recurrent layers), those held, and one's bytes.
    pub kv_state_slots: AtomicU64,
    pub kv_state_slots_used: AtomicU64,
    pub kv_state_bytes_per_sequence: AtomicU64,
    /// The pool lives in GPU memory.
    pub kv_on_device: AtomicBool,
    pub device_memory_free: AtomicU64,
    pub device_memory_total: AtomicU64,
    /// What the prefix cache's disk tier did (zeros without one).
    pub kv_disk: std::sync::Arc<crate::kv::disk::DiskCounters>,
    pub kv_disk_enabled: AtomicBool,
    /// The experts of the requests running and waiting, by name (as of the last change).
    pub experts_in_flight: std::sync::Mutex<ExpertsInFlight>,
    /// KV events for a publisher, once one started them.
    pub kv_events: super::kv_events::KvEventQueue,
}

/// The names of the experts running and waiting requests use (each sorted, once each).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExpertsInFlight {
    pub running: Vec<String>,
    pub waiting: Vec<String>,
}

/// A consistent-enough copy of [`EngineStats`] (each field is read atomically).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct StatsSnapshot {
    pub kv_blocks_total: u64,
    pub kv_blocks_used: u64,
    pub kv_blocks_cached: u64,
    /// Blocks ever used: on CPU the pool's resident part.
    pub kv_blocks_touched: u64,
    pub kv_block_size: u64,
    pub kv_bytes: u64,
    pub kv_bytes_per_token: u64,
    pub sessions: u64,
    pub active_requests: u64,
    pub queued_requests: u64,
    pub prefix_cache_hit_tokens: u64,
    pub evicted_blocks: u64,
    /// Requests that waited for KV room (blocks or a state slot) at least once, since load.
    pub waited_requests: u64,
    /// Blocks whose memory the pool gave back to the OS after idle periods, in all.
    pub kv_blocks_released: u64,
    /// Blocks sliding-window layers gave back as their sequences moved past them, in all.
    pub kv_blocks_behind_window: u64,
    /// Recurrent-state slots in all and held by sessions (0 for a model without recurrent
    /// layers), the bytes held, and one sequence's.
    pub kv_state_slots: u64,
    pub kv_state_slots_used: u64,
    pub kv_state_bytes: u64,
    pub kv_state_bytes_per_sequence: u64,
    /// KV bytes in use that live in GPU memory (0 on CPU).
    pub kv_device_bytes: u64,
    /// The GPU's free and total memory (`None` on CPU) as of the last step or command, read
    /// from the driver at most every 100 ms.
    pub device_memory_free: Option<u64>,
    pub device_memory_total: Option<u64>,
    /// Resident bytes by kind.
    pub memory: MemoryByKind,
    /// The prefix cache's disk tier (`None` without one).
    pub kv_disk: Option<DiskStats>,
    /// The experts running requests use, and those waiting requests will use, by name.
    pub running_experts: Vec<String>,
    pub waiting_experts: Vec<String>,
    /// KV events dropped because their consumer fell behind (since it started them).
    pub kv_events_dropped: u64,
}

/// What the prefix cache's disk tier did since load, in blocks, and the bytes its directory
/// holds (as its writer last counted, other processes' files included).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DiskStats {
    pub written_blocks: u64,
    /// Not written: the writer's queue was full (the engine never waits for the disk).
    pub dropped_blocks: u64,
    /// Writes that failed (a full disk, a read-only directory).
    pub failed_blocks: u64,
    /// Read back into the pool instead of being computed.
    pub read_blocks: u64,
    /// Files skipped: the wrong size, key or checksum.
    pub rejected_blocks: u64,
    /// Files removed to stay within `maxBytes`.
    pub evicted_blocks: u64,
    pub bytes: u64,
}

/// What the runtime holds, by kind, in bytes.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct MemoryByKind {
    /// The model's weights (those read in place from a memory-mapped file included: resident
    /// once read).
    pub weights: u64,
    /// The KV pool's resident part: on CPU the blocks ever used and not given back, on a GPU
    /// the whole pool (allocated at load).
    pub kv: u64,
    /// Recurrent state held by sequences.
    pub state: u64,
    /// The resident experts' weights.
    pub experts: u64,
}

impl EngineStats {
    pub fn snapshot(&self) -> StatsSnapshot {
        let mut s = self.counters();
        let e = self.experts_in_flight.lock().unwrap_or_else(|e| e.into_inner());
        (s.running_experts, s.waiting_experts) = (e.running.clone(), e.waiting.clone());
        s
    }

    /// [`Self::snapshot`] but for the experts in flight.
    fn counters(&self) -> StatsSnapshot {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (used, bs, bpt) = (r(&self.kv_blocks_used), r(&self.kv_block_size), r(&self.kv_bytes_per_token));
        let block_bytes = r(&self.kv_block_bytes);
        let (running, queued) = (r(&self.running_requests), r(&self.queued_requests));
        let on_device = self.kv_on_device.load(Ordering::Relaxed);
        StatsSnapshot {
            kv_blocks_total: r(&self.kv_blocks_total),
            kv_blocks_used: used,
            kv_blocks_cached: r(&self.kv_blocks_cached),
            kv_blocks_touched: r(&self.kv_blocks_touched),
            kv_block_size: bs,
            kv_bytes: used * block_bytes,
            kv_bytes_per_token: bpt,
            sessions: r(&self.sessions),
            active_requests: running + queued,
            queued_requests: queued,
            prefix_cache_hit_tokens: r(&self.prefix_cache_hit_tokens),
            evicted_blocks: r(&self.evicted_blocks),
            waited_requests: r(&self.waited_requests),
            kv_blocks_released: r(&self.kv_blocks_released),
            kv_blocks_behind_window: r(&self.kv_blocks_behind_window),
            kv_state_slots: r(&self.kv_state_slots),
            kv_state_slots_used: r(&self.kv_state_slots_used),
            kv_state_bytes: r(&self.kv_state_slots_used) * r(&self.kv_state_bytes_per_sequence),
            kv_state_bytes_per_sequence: r(&self.kv_state_bytes_per_sequence),
            kv_device_bytes: if on_device { used * block_bytes } else { 0 },
            device_memory_free: on_device.then(|| r(&self.device_memory_free)),
            device_memory_total: on_device.then(|| r(&self.device_memory_total)),
            memory: MemoryByKind {
                // The engine fills in the weights and the experts, which it holds.
                weights: 0,
                kv: if on_device { r(&self.kv_blocks_total) } else { r(&self.kv_blocks_touched) }.saturating_mul(block_bytes),
                state: r(&self.kv_state_slots_used).saturating_mul(r(&self.kv_state_bytes_per_sequence)),
                experts: 0,
            },
            running_experts: Vec::new(),
            waiting_experts: Vec::new(),
            kv_events_dropped: self.kv_events.dropped(),
            kv_disk: self.kv_disk_enabled.load(Ordering::Relaxed).then(|| {
                let d = &self.kv_disk;
                DiskStats {
                    written_blocks: r(&d.written),
                    dropped_blocks: r(&d.dropped),
                    failed_blocks: r(&d.failed),
                    read_blocks: r(&d.read),
                    rejected_blocks: r(&d.rejected),
                    evicted_blocks: r(&d.evicted),
                    bytes: r(&d.bytes),
                }
            }),
        }
    }

    pub fn publish_device_memory(&self, device: &Device) {
        if let Some(m) = super::device_memory(device) {
            self.device_memory_free.store(m.free, Ordering::Relaxed);
            self.device_memory_total.store(m.total, Ordering::Relaxed);
        }
    }
}
