//! KV events for prefix-aware routers (issue 53; vLLM's `BlockStored` / `BlockRemoved`): what
//! the prefix index registers and forgets, handed from the engine thread to whoever publishes
//! them (the server's ZeroMQ publisher), never waiting for it.
//!
//! The engine thread turns recording on once a consumer asked ([`KvEventQueue::start`]), then
//! after every step moves the index's events into this queue with `try_lock` (a consumer
//! draining it at that moment only delays them to the next step). The queue holds at most
//! [`CAPACITY`] events: past that, new ones are dropped and counted, so a consumer that stops
//! draining costs bounded memory and never stalls generation. Block hashes are the index's
//! content ids (unique per runtime, chained by parent); `lora_id` names the expert set.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::kv::prefix::IndexEvent;

/// Events the queue holds at most.
pub const CAPACITY: usize = 1 << 16;

#[derive(Default)]
pub struct KvEventQueue {
    on: AtomicBool,
    events: Mutex<VecDeque<IndexEvent>>,
    dropped: AtomicU64,
}

impl KvEventQueue {
    /// Asks the engine to record events from its next step on.
    pub fn start(&self) {
        self.on.store(true, Ordering::Release);
    }

    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// Engine thread: appends `pending` (emptied) unless a consumer holds the queue now (then
    /// they wait for the next call); beyond [`CAPACITY`] events are dropped and counted.
    pub fn offer(&self, pending: &mut Vec<IndexEvent>) {
        if pending.is_empty() {
            return;
        }
        let Ok(mut q) = self.events.try_lock() else {
            if pending.len() > CAPACITY {
                let over = pending.len() - CAPACITY;
                pending.drain(..over);
                self.dropped.fetch_add(over as u64, Ordering::Relaxed);
            }
            return;
        };
        let room = CAPACITY.saturating_sub(q.len());
        let take = pending.len().min(room);
        q.extend(pending.drain(..take));
        if !pending.is_empty() {
            self.dropped.fetch_add(pending.len() as u64, Ordering::Relaxed);
            pending.clear();
        }
    }

    /// Consumer: up to `max` events, oldest first.
    pub fn take(&self, max: usize) -> Vec<IndexEvent> {
        let mut q = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let n = q.len().min(max);
        q.drain(..n).collect()
    }

    /// Events dropped because the queue was full, since the start.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The `lora_id` of an expert set (load ids): none for the base model, the id of a single
/// expert, a hash of several (below 2^53, so that JavaScript keeps it exact).
pub fn lora_id(experts: &[u64]) -> Option<u64> {
    match experts {
        [] => None,
        [one] => Some(*one),
        many => {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for id in many {
                for b in id.to_le_bytes() {
                    h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
                }
            }
            Some(h & ((1 << 53) - 1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn removed(n: u64) -> Vec<IndexEvent> {
        (0..n).map(|cid| IndexEvent::Removed { cid }).collect()
    }

    #[test]
    fn a_full_queue_drops_and_counts_and_a_held_one_defers() {
        let q = KvEventQueue::default();
        let mut pending = removed(CAPACITY as u64 + 10);
        q.offer(&mut pending);
        assert!(pending.is_empty());
        assert_eq!(q.dropped(), 10);
        assert_eq!(q.take(5), removed(5));
        // A consumer holding the queue: the engine keeps its events for the next step.
        let guard = q.events.lock().unwrap();
        let mut pending = removed(3);
        q.offer(&mut pending);
        assert_eq!(pending.len(), 3);
        drop(guard);
        assert_eq!(q.take(usize::MAX).len(), CAPACITY - 5);
        q.offer(&mut pending);
        assert_eq!(q.take(usize::MAX), removed(3));
    }

    #[test]
    fn lora_ids_are_stable_and_exact_in_javascript() {
        assert_eq!(lora_id(&[]), None);
        assert_eq!(lora_id(&[7]), Some(7));
        let a = lora_id(&[7, 9]).unwrap();
        assert_eq!(Some(a), lora_id(&[7, 9]));
        assert_ne!(Some(a), lora_id(&[9, 7]));
        assert!(a < 1 << 53);
    }
}
