//! What the engine thread does while it has no work: wait for the next command, and after
//! [`SchedulerConfig::idle_release`](super::SchedulerConfig) of waiting give the memory of the
//! KV blocks no session holds back to the OS (`KvManager::give_back`): a server's pool grows
//! with its load and shrinks again when the load is gone.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};

use super::Scheduler;
use crate::engine::request::Command;

impl Scheduler {
    /// The next command, waiting as long as it takes; `None` once every sender is gone.
    pub(super) fn recv_idle(&mut self, rx: &Receiver<Command>) -> Option<Command> {
        let releasable = self.kv.cached_blocks() > 0 || self.kv.touched_blocks() > self.kv.used_blocks();
        if let (Some(after), true) = (self.idle_release, releasable) {
            match rx.recv_timeout(after) {
                Ok(c) => return Some(c),
                Err(RecvTimeoutError::Disconnected) => return None,
                Err(RecvTimeoutError::Timeout) => self.give_back(),
            }
        }
        rx.recv().ok()
    }

    fn give_back(&mut self) {
        match self.kv.give_back() {
            Ok(n) => {
                self.stats.kv_blocks_released.fetch_add(n as u64, Ordering::Relaxed);
                // What the allocator holds beyond the pool (freed activations, buffers).
                crate::memory::return_freed_memory();
            }
            // The pool's bookkeeping is done; a store that could not release keeps its memory.
            Err(e) => eprintln!("expert-runtime: giving idle KV memory back failed: {e}"),
        }
        self.publish();
    }
}
