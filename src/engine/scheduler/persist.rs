//! Saving and restoring a session's cache on the engine thread (see `engine::persist`).

use std::sync::Arc;

use super::{Scheduler, SessionState};
use crate::engine::request::{SessionShared, SessionSnapshot};
use crate::error::{EngineError, Result};

impl Scheduler {
    /// The snapshot of an idle session: its stream and the blocks and state its cache holds.
    pub(super) fn save_session(&mut self, id: u64) -> Result<SessionSnapshot> {
        let s = self.sessions.get(&id).ok_or_else(|| EngineError::Disposed("the session".into()))?;
        if s.running {
            return Err(EngineError::SessionBusy("the session is generating; save it when the request ends".into()));
        }
        let cache = self.kv.export_table(&s.table)?;
        let store = self.kv.store();
        Ok(SessionSnapshot {
            tokens: s.tokens.clone(),
            pending: s.pending,
            cache,
            kv_format: store.format.name().to_string(),
            block_size: store.block_size,
            block_bytes: store.bytes_per_block(),
            experts: s.set_key.clone(),
            n_virtual: s.n_virtual,
        })
    }

    /// Session `id` from a snapshot: its cache written into new blocks (idle sessions are
    /// evicted for room, as for a request), registered for prefix sharing.
    pub(super) fn restore_session(&mut self, id: u64, shared: Arc<SessionShared>, snap: SessionSnapshot) -> Result<()> {
        let store = self.kv.store();
        if snap.kv_format != store.format.name() || snap.block_size != store.block_size {
            return Err(EngineError::InvalidArgument(format!(
                "the session was saved from a {} KV cache of {}-position blocks; this runtime's is {} of {} \
                 (load it with the same kvCache options)",
                snap.kv_format,
                snap.block_size,
                store.format.name(),
                store.block_size
            )));
        }
        if snap.tokens.len() + snap.n_virtual + 1 > self.context_length || snap.cache.len > snap.tokens.len() + snap.n_virtual {
            return Err(EngineError::ContextOverflow(format!(
                "the saved session holds {} tokens; this runtime's context is {}",
                snap.tokens.len(),
                self.context_length
            )));
        }
        let need = self.kv.blocks_for(snap.cache.len);
        let table = match self.kv.import_table(&snap.cache)? {
            Some(t) => t,
            None => {
                if !self.make_room(need, id, self.kv.has_states()) {
                    return Err(EngineError::KvCacheExhausted(format!(
                        "no room for the saved session's {need} blocks: every block is held by running requests"
                    )));
                }
                self.kv
                    .import_table(&snap.cache)?
                    .ok_or_else(|| EngineError::KvCacheExhausted("no room for the saved session".into()))?
            }
        };
        let shareable = match self.model.rope_exact_until() {
            Some(n) if snap.tokens.len() > n => 0,
            Some(n) => n,
            None => usize::MAX,
        };
        let st = SessionState {
            shared,
            tokens: snap.tokens,
            pending: snap.pending,
            table,
            set_key: snap.experts,
            n_virtual: snap.n_virtual,
            last_used: self.tick,
            running: false,
            shareable,
            snapshot_at: None,
        };
        self.kv.cache_full_blocks(&st.table, 0, st.shareable, &st.set_key, |p| st.key_at(p));
        self.sessions.insert(id, st);
        Ok(())
    }
}
