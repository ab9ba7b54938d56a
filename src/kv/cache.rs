//! A single-sequence KV cache for direct use of [`Decoder::forward`](crate::model::Decoder::forward)
//! (tests, tools): a private [`KvStore`] whose blocks are used in order, so the block table is
//! the identity. The engine does not use it; it shares one pool between all sessions.

use candle_core::Device;

use super::block_table::blocks_for;
use super::store::{KvFormat, KvStore};
use super::BlockId;
use crate::error::Result;

/// Block size of single-sequence caches.
const BLOCK: usize = 16;

pub struct KvCache {
    pub(crate) store: KvStore,
    /// The one table group's table (the store's layers are all alike).
    pub(crate) blocks: Vec<Vec<BlockId>>,
    len: usize,
    max_len: usize,
}

impl KvCache {
    pub fn new(
        num_layers: usize,
        kv_heads: usize,
        head_dim: usize,
        max_len: usize,
        dtype: impl Into<KvFormat>,
        device: &Device,
    ) -> Result<Self> {
        let n = blocks_for(max_len.max(1), BLOCK);
        let store = KvStore::new(num_layers, n, BLOCK, kv_heads, head_dim, dtype, device)?;
        Ok(Self { store, blocks: vec![(0..n as BlockId).collect()], len: 0, max_len })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Forgets positions `len..`.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Marks `n` more positions written (after a forward pass).
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
        assert!(self.len <= self.max_len, "KvCache overflow: {} > {}", self.len, self.max_len);
    }
}
