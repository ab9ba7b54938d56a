//! A single-sequence KV cache for direct use of [`Decoder::forward`](crate::model::Decoder::forward)
//! (tests, tools): a private [`KvStore`] whose blocks are used in order, so the block table is
//! the identity. The engine does not use it; it shares one pool between all sessions.

use candle_core::Device;

use super::block_table::blocks_for;
use super::layers::{HeadShape, KvLayout, LayerCache};
use super::store::{KvFormat, KvStore};
use super::BlockId;
use crate::error::Result;

/// Block size of single-sequence caches.
const BLOCK: usize = 16;

pub struct KvCache {
    pub(crate) store: KvStore,
    /// Each table group's table (one unless layers differ in their heads), all the identity.
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
        Self::shaped(&vec![None; num_layers], kv_heads, head_dim, max_len, dtype, device)
    }

    /// [`Self::new`] for layers with heads of their own (`shapes[i]`; `None`: `kv_heads` of
    /// `head_dim`): a table group per shape, each with its own identity table.
    pub fn shaped(
        shapes: &[Option<HeadShape>],
        kv_heads: usize,
        head_dim: usize,
        max_len: usize,
        dtype: impl Into<KvFormat>,
        device: &Device,
    ) -> Result<Self> {
        Self::with_kinds(&vec![LayerCache::Full; shapes.len()], shapes, kv_heads, head_dim, max_len, dtype, device)
    }

    /// [`Self::shaped`] for layers that keep what `kinds` says: a recurrent layer its state (one
    /// slot, the cache's sequence's), any other every position.
    pub fn with_kinds(
        kinds: &[LayerCache],
        shapes: &[Option<HeadShape>],
        kv_heads: usize,
        head_dim: usize,
        max_len: usize,
        dtype: impl Into<KvFormat>,
        device: &Device,
    ) -> Result<Self> {
        let n = blocks_for(max_len.max(1), BLOCK);
        let kinds: Vec<LayerCache> =
            kinds.iter().map(|k| if matches!(k, LayerCache::State { .. }) { *k } else { LayerCache::Full }).collect();
        let layout = KvLayout::from_shaped(&kinds, shapes);
        let tables = layout.tables.len().max(1);
        let store = KvStore::new(shapes.len(), n, BLOCK, kv_heads, head_dim, dtype, device)?
            .with_cache_layout(layout)?
            .with_state_slots(1, 0)?;
        Ok(Self { store, blocks: vec![(0..n as BlockId).collect(); tables], len: 0, max_len })
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

    /// Forgets positions `len..`. A model with recurrent layers can only start over (`0`): its
    /// state cannot give positions back, and a pass from anywhere else fails.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Marks `n` more positions written (after a forward pass).
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
        assert!(self.len <= self.max_len, "KvCache overflow: {} > {}", self.len, self.max_len);
    }
}
