//! The KV cache manager: the one API the scheduler uses to give sequences their blocks.
//!
//! It owns the shared [`BlockPool`] (reference counts, cached blocks, the prefix index) and the
//! [`KvStore`] (the tensors), and it is the only code that builds [`BlockKey`]s, pins and
//! unpins blocks or copies a block for copy-on-write. The scheduler decides *who* gets memory
//! (admission order, which idle session to evict, batching); this module decides *how*.
//!
//! A sequence's life, in calls:
//! 1. [`KvManager::match_prefix`]: what the prefix index already holds of the prompt (whole
//!    blocks, then the longest partial match within the next block).
//! 2. Either [`KvManager::prepare_resume`] + [`KvManager::resume`] (keep the sequence's own
//!    table, which covers more), or [`KvManager::pin`] + [`KvManager::adopt`] (take the
//!    match; `unpin` if no room can be made). Between the two calls the scheduler evicts idle
//!    sequences until [`KvManager::available`] covers what the first call said is needed.
//! 3. After each forward pass: [`BlockTable::advance`] and [`KvManager::cache_full_blocks`]
//!    (registers the blocks the pass filled, so later prompts can share them).
//! 4. [`KvManager::shrink`] when a request ends (its unused reserve), [`KvManager::free`] when
//!    the sequence is dropped or evicted.
//!
//! Keys: a block's key is `(parent content id, expert-set key, its position keys)`. Position
//! keys are token ids, with prompt-tuning virtual positions given ids from the top of the
//! `u32` range ([`virtual_key`]), so blocks computed under different adapters or virtual
//! prompts never mix.

use super::block_pool::BlockPool;
use super::block_table::{blocks_for, BlockTable};
use super::prefix::{BlockKey, ROOT};
use super::store::KvStore;
use super::BlockId;
use crate::error::Result;

/// The position key standing for virtual (prompt-tuning) position `i`.
pub fn virtual_key(i: usize) -> u32 {
    u32::MAX - i as u32
}

/// What the prefix index holds of a prompt: whole blocks, then a partial block.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PrefixHit {
    /// Full blocks matching the prompt's first `blocks.len() · block_size` positions.
    pub blocks: Vec<BlockId>,
    /// A registered block sharing its first `n` positions with the prompt after `blocks`.
    pub partial: Option<(BlockId, usize)>,
    /// Positions covered: whole blocks plus the partial match.
    pub tokens: usize,
}

/// A [`PrefixHit`] whose blocks are pinned (eviction cannot recycle them). Consume it with
/// [`KvManager::adopt`] or [`KvManager::unpin`].
#[derive(Debug)]
#[must_use = "a pinned hit holds blocks until adopted or unpinned"]
pub struct PinnedHit(PrefixHit);

impl PrefixHit {
    /// Every block the hit references: the full ones, then the partial match's source.
    fn referenced_blocks(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.blocks.iter().copied().chain(self.partial.map(|(b, _)| b))
    }
}

impl PinnedHit {
    pub fn tokens(&self) -> usize {
        self.0.tokens
    }
}

pub struct KvManager {
    pool: BlockPool,
    store: KvStore,
    /// Look up and register shared prefix blocks.
    prefix_cache: bool,
}

impl KvManager {
    /// A manager over `store`, whose blocks it hands out. `prefix_cache: false` never looks up
    /// or registers blocks (every prompt is computed from scratch).
    pub fn new(store: KvStore, prefix_cache: bool) -> Self {
        Self::try_new(store, prefix_cache).expect("KV pool bookkeeping")
    }

    /// [`Self::new`], or `OUT_OF_MEMORY` where the per-block bookkeeping cannot be reserved.
    pub fn try_new(store: KvStore, prefix_cache: bool) -> crate::error::Result<Self> {
        let pool = BlockPool::try_new(store.num_blocks, store.block_size)?;
        Ok(Self { pool, store, prefix_cache })
    }

    /// A manager whose prefix index uses `hasher` (tests force collisions with it).
    #[cfg(test)]
    pub fn with_hasher(store: KvStore, hasher: super::prefix::KeyHasher) -> Self {
        let pool = BlockPool::with_hasher(store.num_blocks, store.block_size, hasher);
        Self { pool, store, prefix_cache: true }
    }

    pub fn store(&self) -> &KvStore {
        &self.store
    }

    /// The model's layers grouped by what they keep. This manager is the full-attention
    /// group's (one block table per sequence over the shared pool); the store refuses a layout
    /// with other groups until their managers exist.
    pub fn layout(&self) -> &super::KvLayout {
        self.store.cache_layout()
    }

    pub fn block_size(&self) -> usize {
        self.pool.block_size()
    }

    pub fn total_blocks(&self) -> usize {
        self.pool.total()
    }

    /// Positions the whole pool holds.
    pub fn total_positions(&self) -> usize {
        self.pool.total() * self.pool.block_size()
    }

    /// Blocks held by at least one table.
    pub fn used_blocks(&self) -> usize {
        self.pool.used()
    }

    /// Unreferenced blocks whose contents the prefix index can still revive.
    pub fn cached_blocks(&self) -> usize {
        self.pool.cached()
    }

    /// Blocks ever handed out (their memory is resident; the rest of the pool is not yet).
    pub fn touched_blocks(&self) -> usize {
        self.pool.touched()
    }

    /// Blocks that can be handed out now (free plus cached).
    pub fn available(&self) -> usize {
        self.pool.available()
    }

    /// Forgets every cached prefix and returns the memory of every block no table lists to the
    /// OS (CPU pools; called when the engine has been idle a while). Returns how many blocks
    /// were released.
    pub fn give_back(&mut self) -> Result<usize> {
        let blocks = self.pool.give_back();
        self.store.release_memory(&blocks)?;
        Ok(blocks.len())
    }

    /// Blocks a table needs for `positions` positions.
    pub fn blocks_for(&self, positions: usize) -> usize {
        blocks_for(positions, self.pool.block_size())
    }

    /// The longest cached prefix of `keys` under `experts`, at most `keys.len()` positions:
    /// full blocks looked up one by one (each keyed on the one before), then the registered
    /// block sharing the longest start with the rest. Changes nothing.
    pub fn match_prefix(&self, keys: &[u32], experts: &[u64]) -> PrefixHit {
        let bs = self.pool.block_size();
        let mut hit = PrefixHit::default();
        if !self.prefix_cache {
            return hit;
        }
        let mut parent = ROOT;
        for tokens in keys.chunks_exact(bs) {
            let key = BlockKey { parent, experts: experts.to_vec(), tokens: tokens.to_vec() };
            let Some(b) = self.pool.lookup(&key) else { break };
            parent = self.pool.cid(b).expect("a block found by lookup is registered");
            hit.blocks.push(b);
        }
        let m = hit.blocks.len() * bs;
        if m < keys.len() {
            let next = &keys[m..(m + bs).min(keys.len())];
            hit.partial = self.pool.longest_partial(parent, experts, next);
        }
        hit.tokens = m + hit.partial.map_or(0, |(_, n)| n);
        hit
    }

    /// Pins the hit's blocks so that evicting other tables cannot recycle them.
    pub fn pin(&mut self, hit: PrefixHit) -> PinnedHit {
        hit.referenced_blocks().for_each(|b| self.pool.retain(b));
        PinnedHit(hit)
    }

    /// Drops the pins of a hit that will not be adopted.
    pub fn unpin(&mut self, hit: PinnedHit) {
        hit.0.referenced_blocks().for_each(|b| self.pool.release(b));
    }

    /// Blocks [`Self::adopt`] allocates for a table of `need_blocks` blocks (its whole reserve).
    pub fn blocks_to_adopt(&self, hit: &PinnedHit, need_blocks: usize) -> usize {
        need_blocks.saturating_sub(hit.0.blocks.len())
    }

    /// Makes `table` (emptied first) start with the hit: its full blocks are shared, the
    /// partial block's matching positions are copied into a block of the table's own
    /// (copy-on-write), then the table is grown to `need_blocks`. False (the hit unpinned,
    /// the table empty) when the pool cannot supply the blocks.
    pub fn adopt(&mut self, table: &mut BlockTable, hit: PinnedHit, need_blocks: usize) -> Result<bool> {
        self.free(table);
        if self.pool.available() < self.blocks_to_adopt(&hit, need_blocks) {
            self.unpin(hit);
            return Ok(false);
        }
        let PinnedHit(PrefixHit { blocks, partial, tokens }) = hit;
        let mut blocks = blocks;
        if let Some((src, n)) = partial {
            let b = self.pool.alloc().expect("availability checked");
            self.store.copy_block(src, b, n)?;
            self.pool.release(src);
            blocks.push(b);
        }
        table.set(blocks, tokens);
        assert!(table.reserve_blocks(need_blocks, &mut self.pool), "availability checked");
        Ok(true)
    }

    /// Readies `table` to continue from its first `keep` positions: releases blocks past them
    /// and returns how many blocks [`Self::resume`] will allocate (the rest of `need_blocks`,
    /// plus one if the last kept block is shared and must be copied before it is written).
    pub fn prepare_resume(&mut self, table: &mut BlockTable, keep: usize, need_blocks: usize) -> usize {
        table.truncate_blocks(self.blocks_for(keep), &mut self.pool);
        self.resume_cost(table, keep, need_blocks)
    }

    /// Blocks that continuing `table` from `keep` positions with `need_blocks` in all
    /// allocates: the missing ones, plus a copy of the last kept block when it is partial and
    /// shared (it is about to be written).
    fn resume_cost(&self, table: &BlockTable, keep: usize, need_blocks: usize) -> usize {
        let kept = self.blocks_for(keep.min(table.len()));
        let cow = !keep.is_multiple_of(self.pool.block_size()) && kept > 0 && self.pool.refs(table.blocks()[kept - 1]) > 1;
        need_blocks.saturating_sub(kept) + cow as usize
    }

    /// Continues `table` from its first `keep` positions (copy-on-write of a shared last
    /// block) and grows it to `need_blocks`. False (nothing allocated) when the pool cannot
    /// supply what [`Self::prepare_resume`] said.
    pub fn resume(&mut self, table: &mut BlockTable, keep: usize, need_blocks: usize) -> Result<bool> {
        if self.pool.available() < self.resume_cost(table, keep, need_blocks) {
            return Ok(false);
        }
        let ok = table.truncate_for_write(keep, &mut self.pool, &self.store)?;
        assert!(ok && table.reserve_blocks(need_blocks, &mut self.pool), "availability checked");
        Ok(true)
    }

    /// Registers the blocks of `table` that became full since position `from` (now that the
    /// table holds `table.len()` positions), under `experts`; `key(p)` is position `p`'s key.
    /// Only blocks wholly before position `until` are registered (the rest are valid for this
    /// table only). A block whose predecessor is not registered is skipped (its prefix cannot
    /// be named).
    pub fn cache_full_blocks(
        &mut self,
        table: &BlockTable,
        from: usize,
        until: usize,
        experts: &[u64],
        key: impl Fn(usize) -> u32,
    ) {
        if !self.prefix_cache {
            return;
        }
        let bs = self.pool.block_size();
        let blocks = table.blocks();
        for b in from / bs..table.len().min(until) / bs {
            let block = blocks[b];
            if self.pool.is_registered(block) {
                continue;
            }
            let parent = if b == 0 { Some(ROOT) } else { self.pool.cid(blocks[b - 1]) };
            if let Some(parent) = parent {
                let tokens = (b * bs..(b + 1) * bs).map(&key).collect();
                self.pool.register(block, BlockKey { parent, experts: experts.to_vec(), tokens });
            }
        }
    }

    /// Releases the blocks past what `table`'s positions need (a finished request's reserve).
    pub fn shrink(&mut self, table: &mut BlockTable) {
        table.shrink_to_len(&mut self.pool);
    }

    /// Releases every block of `table`; registered ones stay cached for later prefix hits.
    pub fn free(&mut self, table: &mut BlockTable) {
        table.clear(&mut self.pool);
    }
}

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
