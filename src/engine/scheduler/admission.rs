//! Admission: queued requests and embedding texts get their KV blocks in arrival order,
//! reusing the session's own cache or the prefix index (whichever covers more of the prompt),
//! and room is made by evicting idle sessions, least recently used first.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;

use super::Scheduler;
use crate::engine::sequence::Sequence;
use crate::error::{panic_message, EngineError, Result};
use crate::kv::manager::virtual_key;

impl Scheduler {
    /// Admits queued requests in arrival order while their blocks can be found.
    pub(super) fn admit_waiting(&mut self) {
        while let Some(mut seq) = self.waiting.pop_front() {
            match catch_unwind(AssertUnwindSafe(|| self.admit(&mut seq))) {
                Ok(Ok(true)) => self.running.push(seq),
                Ok(Ok(false)) => {
                    if self.running.is_empty() {
                        // Nothing will free blocks: cannot happen when accounting is right.
                        self.fail(seq, EngineError::KvCacheExhausted("no KV blocks could be found for this request".into()));
                        continue;
                    }
                    self.waiting.push_front(seq);
                    // It and every request behind it wait for this round.
                    let mut newly = 0u64;
                    for s in self.waiting.iter_mut().filter(|s| !s.waited) {
                        s.waited = true;
                        newly += 1;
                    }
                    self.stats.waited_requests.fetch_add(newly, Ordering::Relaxed);
                    return;
                }
                Ok(Err(e)) => self.fail(seq, e),
                Err(p) => self.fail(seq, EngineError::Internal(format!("admission panicked: {}", panic_message(&*p)))),
            }
        }
    }

    /// Gives `seq` its blocks: reuses the session's own cache or the prefix index (whichever
    /// covers more of the prompt), then reserves every block the request can need. `Ok(false)`
    /// when the pool has no room yet (nothing changed that matters: the session keeps a valid
    /// prefix of its cache).
    fn admit(&mut self, seq: &mut Sequence) -> Result<bool> {
        let id = seq.session;
        let set_key = seq.experts.key();
        let n_v = seq.n_virtual;
        let keys: Vec<u32> = (0..n_v).map(virtual_key).chain(seq.prompt.iter().copied()).collect();
        let cap = self.context_length.min(self.kv.total_positions());
        let need_blocks = self.kv.blocks_for((keys.len() + seq.max_tokens - 1).min(cap));
        // At least the last prompt token is evaluated, so there are logits to sample from.
        let reusable = &keys[..keys.len() - 1];

        // 1. What the session's own cache and the prefix index each cover.
        let st = self.sessions.get(&id).ok_or_else(|| EngineError::Disposed("session was disposed".into()))?;
        let own = if st.set_key == set_key && st.n_virtual == n_v {
            // The table may hold positions past the stream (tokens produced but never delivered
            // are dropped from the stream by `Command::Undeliver`): only the stream's own are
            // reusable.
            reusable.iter().take(st.table.len().min(st.target())).enumerate().take_while(|&(p, &k)| st.key_at(p) == k).count()
        } else {
            0
        };
        if self.kv.disk().is_some() && !set_key.is_empty() {
            if let Some(k) = seq.experts.disk_key() {
                self.kv.name_expert_set(&set_key, k);
            }
        }
        if own < reusable.len() && self.kv.disk().is_some() {
            // Blocks the RAM index misses may be on disk (written by this process or an
            // earlier one): read them into the pool first. A block that cannot be written
            // into the pool is simply computed.
            let _ = self.kv.revive_from_disk(reusable, &set_key);
        }
        let mut hit = self.kv.match_prefix(reusable, &set_key);
        // `dynamic` RoPE: a sequence longer than the original length rotates every position
        // by its own length, so nothing cached fits it (and what it writes fits nothing else).
        let shareable = match self.model.rope_exact_until() {
            Some(n) if keys.len() > n => 0,
            Some(n) => n,
            None => usize::MAX,
        };
        let own = own.min(st.shareable).min(shareable);
        let matched = hit.matched;
        // A window group that gave back the blocks a query at `own` sees cannot continue there.
        let own = if self.kv.can_continue(&st.table, own) { own } else { 0 };
        // A recurrent state continues only from where it stands: all of the table or nothing.
        let own = if self.kv.has_states() && own != st.table.len() { 0 } else { own };
        if hit.tokens > shareable {
            hit = crate::kv::manager::PrefixHit::default();
        }

        // 2. Take the better one and make room for the rest.
        let st = self.sessions.get_mut(&id).expect("checked above");
        if own >= hit.tokens {
            let new = self.kv.prepare_resume(&mut st.table, own, need_blocks);
            let state = self.kv.has_states() && st.table.state().is_none();
            if !self.make_room(new, id, state) {
                return Ok(false);
            }
            let st = self.sessions.get_mut(&id).expect("not evicted");
            assert!(self.kv.resume(&mut st.table, own, need_blocks)?, "room was made");
        } else {
            // Pin the match before anything is evicted, then drop the session's own blocks.
            let hit = self.kv.pin(hit);
            self.kv.free(&mut st.table);
            if !self.make_room(self.kv.blocks_to_adopt(&hit, need_blocks), id, self.kv.has_states()) {
                self.kv.unpin(hit);
                return Ok(false);
            }
            let shared = hit.tokens();
            let st = self.sessions.get_mut(&id).expect("not evicted");
            assert!(self.kv.adopt(&mut st.table, hit, need_blocks)?, "room was made");
            self.stats.prefix_cache_hit_tokens.fetch_add(shared as u64, Ordering::Relaxed);
        }

        // 3. The session now runs this turn.
        self.tick += 1;
        let st = self.sessions.get_mut(&id).expect("not evicted");
        st.tokens = std::mem::take(&mut seq.prompt);
        st.pending = None;
        st.set_key = set_key;
        st.n_virtual = n_v;
        st.running = true;
        st.shareable = shareable;
        st.snapshot_at = (matched > st.table.len()).then_some(matched);
        st.last_used = self.tick;
        seq.usage.cached_tokens = st.table.len().saturating_sub(n_v);
        seq.limit = self.context_length.min(st.table.capacity(self.kv.block_size()));
        seq.admitted = true;
        Ok(true)
    }

    /// Frees blocks until `n` can be allocated (and a recurrent-state slot, with `state`):
    /// cached blocks are recycled by the pool itself; beyond them, idle sessions other than
    /// `except` lose their blocks and state, least recently used first. False when even that is
    /// not enough.
    pub(super) fn make_room(&mut self, n: usize, except: u64, state: bool) -> bool {
        while self.kv.available() < n || state && self.kv.free_states() == 0 {
            let victim = self
                .sessions
                .iter()
                .filter(|(&id, s)| id != except && !s.running && (!s.table.is_empty() || s.table.state().is_some()))
                .min_by_key(|(&id, s)| (s.last_used, id))
                .map(|(&id, _)| id);
            let Some(v) = victim else { return false };
            let s = self.sessions.get_mut(&v).expect("just found");
            let held = s.table.num_blocks() as u64;
            self.kv.free(&mut s.table);
            self.stats.evicted_blocks.fetch_add(held, Ordering::Relaxed);
        }
        true
    }

    /// Admits queued embedding texts in arrival order while their blocks can be found.
    pub(super) fn admit_embeds(&mut self) {
        while let Some(mut job) = self.embeds.waiting.pop_front() {
            let need = self.kv.blocks_for(job.target());
            let new = self.kv.prepare_resume(&mut job.table, 0, need);
            let state = self.kv.has_states() && job.table.state().is_none();
            let admitted = self.make_room(new, 0, state) && self.kv.resume(&mut job.table, 0, need).unwrap_or(false);
            if admitted {
                self.embeds.running.push(job);
                continue;
            }
            let request = job.request;
            self.embeds.waiting.push_front(job);
            if self.running.is_empty() && self.embeds.running.is_empty() {
                // Nothing will free blocks: cannot happen when accounting is right.
                let e = EngineError::KvCacheExhausted("no KV blocks could be found for this text".into());
                for mut j in self.embeds.fail(request, e) {
                    self.kv.free(&mut j.table);
                }
                continue;
            }
            return;
        }
    }
}
