//! The KV block pool's bookkeeping: which physical blocks are in use, by how many tables,
//! and which free blocks still hold reusable prefix content.
//!
//! A block is in exactly one of three states:
//! - **held**: reference count ≥ 1 (one per block table that lists it);
//! - **cached**: count 0 but registered in the [`PrefixIndex`]; its keys/values are still valid
//!   and a prefix lookup can revive it. Cached blocks are recycled least recently freed first;
//! - **free**: count 0, unregistered.
//!
//! Free blocks are either **touched** (used before, so their memory is resident) or **fresh**
//! (never handed out: on the CPU the store's pages behind them are not committed yet, so the
//! process's RSS grows only as fresh blocks are first used). [`BlockPool::give_back`] turns
//! every cached and touched free block into a **released** one, whose memory the store then
//! returns to the OS (after an idle period): released blocks are handed out like fresh ones.
//!
//! [`BlockPool::alloc`] takes, in order: a touched free block (the most recently freed); the
//! oldest cached block, *when the cache is not paying for itself*; a fresh block; the oldest
//! cached block. The cache pays when at least a quarter of the blocks that entered it were
//! revived by a prefix hit (counted with decay, so the judgement follows the workload). So a
//! workload that shares prefixes (system prompts, conversations replayed through stateless
//! sessions) keeps its prefixes as long as the pool has room, while one that never hits the
//! cache reuses the memory it already touched and stays flat instead of creeping toward the
//! pool's bound. The tensors themselves live in [`KvStore`](super::store::KvStore); this type
//! never touches them.

use std::collections::BTreeMap;

use super::prefix::{BlockKey, KeyHasher, PrefixIndex};
use super::BlockId;

pub struct BlockPool {
    block_size: usize,
    refs: Vec<u32>,
    /// Touched free blocks (popped from the back: the most recently freed first).
    free: Vec<BlockId>,
    /// Blocks `fresh..total` were never handed out.
    fresh: usize,
    /// Free blocks whose memory was given back (handed out like fresh ones).
    released: Vec<BlockId>,
    /// Blocks that entered the cache and blocks revived from it, halved together now and then.
    entered_cache: u64,
    revived: u64,
    /// Cached blocks by the tick at which they were freed (oldest first).
    cached: BTreeMap<u64, BlockId>,
    cached_at: Vec<u64>,
    tick: u64,
    index: PrefixIndex,
}

impl BlockPool {
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Self::with_index(num_blocks, block_size, PrefixIndex::new(num_blocks))
    }

    /// A pool whose prefix index uses `hasher` (tests force collisions with it).
    pub fn with_hasher(num_blocks: usize, block_size: usize, hasher: KeyHasher) -> Self {
        Self::with_index(num_blocks, block_size, PrefixIndex::with_hasher(num_blocks, hasher))
    }

    fn with_index(num_blocks: usize, block_size: usize, index: PrefixIndex) -> Self {
        Self::try_with_index(num_blocks, block_size, index).expect("block pool bookkeeping")
    }

    /// [`Self::new`], or `OUT_OF_MEMORY` where the per-block bookkeeping cannot be reserved.
    pub fn try_new(num_blocks: usize, block_size: usize) -> crate::error::Result<Self> {
        Self::try_with_index(num_blocks, block_size, PrefixIndex::try_with_hasher(num_blocks, super::prefix::sip_hash)?)
    }

    fn try_with_index(num_blocks: usize, block_size: usize, index: PrefixIndex) -> crate::error::Result<Self> {
        assert!(num_blocks > 0 && block_size > 0 && num_blocks <= u32::MAX as usize);
        Ok(Self {
            block_size,
            refs: super::try_filled(num_blocks, 0)?,
            free: Vec::new(),
            fresh: 0,
            released: Vec::new(),
            entered_cache: 0,
            revived: 0,
            cached: BTreeMap::new(),
            cached_at: super::try_filled(num_blocks, 0)?,
            tick: 0,
            index,
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn total(&self) -> usize {
        self.refs.len()
    }

    /// Blocks held by at least one table.
    pub fn used(&self) -> usize {
        self.total() - self.available()
    }

    /// Blocks [`alloc`](Self::alloc) can hand out: free plus cached.
    pub fn available(&self) -> usize {
        self.free.len() + self.released.len() + (self.total() - self.fresh) + self.cached.len()
    }

    /// Blocks handed out and not given back since: the part of the store whose memory is
    /// resident.
    pub fn touched(&self) -> usize {
        self.fresh - self.released.len()
    }

    /// Makes every cached block free (forgetting its prefix) and every free block released;
    /// returns the blocks released now, in ascending order, so their memory can be returned.
    pub fn give_back(&mut self) -> Vec<BlockId> {
        let mut now: Vec<BlockId> = std::mem::take(&mut self.free);
        for (_, b) in std::mem::take(&mut self.cached) {
            self.index.remove(b);
            now.push(b);
        }
        now.sort_unstable();
        self.released.extend_from_slice(&now);
        now
    }

    /// Makes the cache look as if it paid for itself (tests of what it keeps).
    #[cfg(test)]
    pub fn assume_cache_pays(&mut self) {
        self.revived = 1 << 11;
        self.entered_cache = 0;
    }

    /// Whether cached blocks earn their memory: a quarter of those cached were revived.
    fn cache_pays(&self) -> bool {
        self.revived * 4 >= self.entered_cache
    }

    /// Counts with decay: the last few thousand cache events decide.
    fn count(counter: fn(&mut Self) -> &mut u64, pool: &mut Self) {
        *counter(pool) += 1;
        if pool.entered_cache + pool.revived > 1 << 12 {
            pool.entered_cache /= 2;
            pool.revived /= 2;
        }
    }

    /// Cached (reusable, unreferenced) blocks.
    pub fn cached(&self) -> usize {
        self.cached.len()
    }

    pub fn refs(&self, b: BlockId) -> u32 {
        self.refs[b as usize]
    }

    /// A block with reference count 1, or `None` when the pool is exhausted. Recycling a
    /// cached block unregisters it.
    pub fn alloc(&mut self) -> Option<BlockId> {
        let b = if let Some(b) = self.free.pop() {
            b
        } else if (!self.released.is_empty() || self.fresh < self.total()) && (self.cached.is_empty() || self.cache_pays()) {
            self.released.pop().unwrap_or_else(|| {
                self.fresh += 1;
                (self.fresh - 1) as BlockId
            })
        } else {
            let (_, b) = self.cached.pop_first()?;
            self.index.remove(b);
            b
        };
        self.refs[b as usize] = 1;
        Some(b)
    }

    /// One more table lists `b` (a prefix hit). Revives a cached block.
    pub fn retain(&mut self, b: BlockId) {
        if self.refs[b as usize] == 0 {
            let removed = self.cached.remove(&self.cached_at[b as usize]);
            debug_assert_eq!(removed, Some(b), "retained block {b} is neither held nor cached");
            Self::count(|p| &mut p.revived, self);
        }
        self.refs[b as usize] += 1;
    }

    /// A table drops `b`. At zero it becomes cached (registered) or free.
    pub fn release(&mut self, b: BlockId) {
        let r = &mut self.refs[b as usize];
        assert!(*r > 0, "block {b} released more often than retained");
        *r -= 1;
        if *r == 0 {
            if self.index.is_registered(b) {
                self.tick += 1;
                self.cached_at[b as usize] = self.tick;
                self.cached.insert(self.tick, b);
                Self::count(|p| &mut p.entered_cache, self);
            } else {
                self.free.push(b);
            }
        }
    }

    /// Registers a full, held block under `key`; returns its content id.
    pub fn register(&mut self, b: BlockId, key: BlockKey) -> u64 {
        debug_assert!(self.refs(b) > 0);
        self.index.insert(b, key)
    }

    /// Registers held block `b`, a copy of registered block `of`'s contents, as `of` is
    /// (see [`super::prefix::PrefixIndex::insert_copy`]).
    pub fn register_copy(&mut self, b: BlockId, of: BlockId) {
        debug_assert!(self.refs(b) > 0);
        self.index.insert_copy(b, of);
    }

    /// Forgets a held block's key before its contents change.
    pub fn unregister(&mut self, b: BlockId) {
        debug_assert!(self.refs(b) > 0);
        self.index.remove(b);
    }

    pub fn is_registered(&self, b: BlockId) -> bool {
        self.index.is_registered(b)
    }

    /// See [`super::prefix::PrefixIndex::record_events`].
    pub fn record_events(&mut self, on: bool) {
        self.index.record_events(on)
    }

    pub fn take_events(&mut self) -> Vec<super::prefix::IndexEvent> {
        self.index.take_events()
    }

    pub fn cid(&self, b: BlockId) -> Option<u64> {
        self.index.cid(b)
    }

    pub fn key(&self, b: BlockId) -> Option<&BlockKey> {
        self.index.key(b)
    }

    pub fn lookup(&self, key: &BlockKey) -> Option<BlockId> {
        self.index.lookup(key)
    }

    pub fn longest_partial(&self, parent: u64, experts: &[u64], tokens: &[u32]) -> Option<(BlockId, usize)> {
        self.index.longest_partial(parent, experts, tokens)
    }

    /// See [`super::prefix::PrefixIndex::lookup_link`].
    pub fn lookup_link(&self, key: &BlockKey) -> Option<(Option<BlockId>, u64)> {
        self.index.lookup_link(key)
    }

    /// See [`super::prefix::PrefixIndex::links`].
    pub fn links(&self) -> usize {
        self.index.links()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::prefix::ROOT;

    fn key(parent: u64, tokens: &[u32]) -> BlockKey {
        BlockKey { parent, experts: vec![], tokens: tokens.to_vec() }
    }

    #[test]
    fn alloc_until_exhausted_then_free() {
        let mut p = BlockPool::new(3, 4);
        let bs: Vec<_> = (0..3).map(|_| p.alloc().unwrap()).collect();
        assert_eq!(bs, vec![0, 1, 2]);
        assert_eq!((p.used(), p.available()), (3, 0));
        assert!(p.alloc().is_none());
        p.release(1);
        assert_eq!((p.used(), p.available()), (2, 1));
        assert_eq!(p.alloc(), Some(1));
    }

    #[test]
    fn refcounts_keep_shared_blocks_held() {
        let mut p = BlockPool::new(2, 4);
        let b = p.alloc().unwrap();
        p.retain(b);
        assert_eq!(p.refs(b), 2);
        p.release(b);
        assert_eq!((p.refs(b), p.used()), (1, 1));
        p.release(b);
        assert_eq!((p.refs(b), p.used()), (0, 0));
    }

    #[test]
    #[should_panic(expected = "released more often")]
    fn double_release_panics() {
        let mut p = BlockPool::new(1, 4);
        let b = p.alloc().unwrap();
        p.release(b);
        p.release(b);
    }

    #[test]
    fn registered_blocks_are_cached_when_released_and_revived_by_lookup() {
        let mut p = BlockPool::new(2, 2);
        let a = p.alloc().unwrap();
        let cid = p.register(a, key(ROOT, &[1, 2]));
        let b = p.alloc().unwrap();
        p.register(b, key(cid, &[3, 4]));
        p.release(a);
        p.release(b);
        assert_eq!((p.used(), p.cached(), p.available()), (0, 2, 2));
        // The chain is found again and revived.
        let hit = p.lookup(&key(ROOT, &[1, 2])).unwrap();
        assert_eq!(hit, a);
        p.retain(hit);
        assert_eq!(p.lookup(&key(p.cid(hit).unwrap(), &[3, 4])), Some(b));
        assert_eq!((p.used(), p.cached()), (1, 1));
        // Under pressure the cached block is recycled and forgotten.
        let c = p.alloc().unwrap();
        assert_eq!(c, b);
        assert!(!p.is_registered(c));
        assert_eq!(p.lookup(&key(cid, &[3, 4])), None);
    }

    #[test]
    fn a_recycled_block_leaves_a_link_that_keeps_its_chain_and_gives_its_cid_back() {
        let mut p = BlockPool::new(2, 2);
        let a = p.alloc().unwrap();
        let cid = p.register(a, key(ROOT, &[1, 2]));
        let b = p.alloc().unwrap();
        let child = p.register(b, key(cid, &[3, 4]));
        p.release(a);
        // `a` is recycled: its key now finds no block, but the walk still gets its content id
        // and, from it, the child that is still held.
        let c = p.alloc().unwrap();
        assert_eq!(c, a);
        assert_eq!(p.lookup(&key(ROOT, &[1, 2])), None);
        assert_eq!(p.lookup_link(&key(ROOT, &[1, 2])), Some((None, cid)));
        assert_eq!(p.lookup_link(&key(cid, &[3, 4])), Some((Some(b), child)));
        assert_eq!(p.lookup_link(&key(ROOT, &[1, 9])), None);
        assert_eq!(p.links(), 1);
        // The same contents computed again take the old content id, not a new one.
        assert_eq!(p.register(c, key(ROOT, &[1, 2])), cid);
        assert_eq!(p.links(), 0);
        assert_eq!(p.lookup_link(&key(ROOT, &[1, 2])), Some((Some(c), cid)));
        // Other contents get a new id.
        p.unregister(c);
        assert_ne!(p.register(c, key(ROOT, &[5, 6])), cid);
    }

    #[test]
    fn links_are_bounded_oldest_forgotten_first() {
        let mut p = BlockPool::new(1, 1);
        let b = p.alloc().unwrap();
        let cids: Vec<u64> = (0..100)
            .map(|t| {
                let cid = p.register(b, key(ROOT, &[t]));
                p.unregister(b);
                cid
            })
            .collect();
        // A pool of one block keeps 64 links.
        assert_eq!(p.links(), 64);
        assert_eq!(p.lookup_link(&key(ROOT, &[35])), None);
        assert_eq!(p.lookup_link(&key(ROOT, &[36])), Some((None, cids[36])));
        assert_eq!(p.lookup_link(&key(ROOT, &[99])), Some((None, cids[99])));
        // Equal hashes (a constant hasher) are told apart by the keys.
        let mut q = BlockPool::with_hasher(1, 1, |_| 7);
        let b = q.alloc().unwrap();
        let x = q.register(b, key(ROOT, &[1]));
        q.unregister(b);
        let y = q.register(b, key(ROOT, &[2]));
        q.unregister(b);
        assert_eq!((q.lookup_link(&key(ROOT, &[1])), q.lookup_link(&key(ROOT, &[2]))), (Some((None, x)), Some((None, y))));
    }

    #[test]
    fn free_blocks_go_before_cached_ones_and_oldest_cached_first() {
        let mut p = BlockPool::new(3, 1);
        let (a, b, c) = (p.alloc().unwrap(), p.alloc().unwrap(), p.alloc().unwrap());
        p.register(a, key(ROOT, &[1]));
        p.register(b, key(ROOT, &[2]));
        p.release(b); // cached first
        p.release(a); // cached second
        p.release(c); // free
        assert_eq!(p.alloc(), Some(c));
        assert_eq!(p.alloc(), Some(b));
        assert!(p.lookup(&key(ROOT, &[1])).is_some());
        assert_eq!(p.alloc(), Some(a));
        assert!(p.lookup(&key(ROOT, &[1])).is_none());
    }

    #[test]
    fn give_back_releases_cached_and_free_blocks_and_hands_them_out_again() {
        let mut p = BlockPool::new(4, 1);
        let (a, b, c) = (p.alloc().unwrap(), p.alloc().unwrap(), p.alloc().unwrap());
        p.register(a, key(ROOT, &[1]));
        p.release(a); // cached
        p.release(b); // free
        assert_eq!((p.touched(), p.cached(), p.available()), (3, 1, 3));
        assert_eq!(p.give_back(), vec![a, b]);
        // The prefix is forgotten, the held block stays, nothing is lost from the pool.
        assert_eq!(p.lookup(&key(ROOT, &[1])), None);
        assert_eq!((p.touched(), p.cached(), p.used(), p.available()), (1, 0, 1, 3));
        assert!(p.give_back().is_empty());
        // Released blocks go out before the never-used one, then it; then none is left.
        let mut out: Vec<_> = (0..3).map(|_| p.alloc().unwrap()).collect();
        assert_eq!(out.pop(), Some(3));
        out.sort_unstable();
        assert_eq!(out, vec![a, b]);
        assert!(p.alloc().is_none());
        assert_eq!((p.touched(), p.used()), (4, 4));
        p.release(c);
        assert_eq!(p.give_back(), vec![c]);
    }

    #[test]
    fn hash_collisions_are_resolved_by_comparing_contents() {
        let mut p = BlockPool::with_hasher(4, 2, |_| 42);
        let a = p.alloc().unwrap();
        let b = p.alloc().unwrap();
        let c = p.alloc().unwrap();
        p.register(a, key(ROOT, &[1, 2]));
        p.register(b, key(ROOT, &[1, 3]));
        p.register(c, BlockKey { parent: ROOT, experts: vec![7], tokens: vec![1, 2] });
        assert_eq!(p.lookup(&key(ROOT, &[1, 2])), Some(a));
        assert_eq!(p.lookup(&key(ROOT, &[1, 3])), Some(b));
        assert_eq!(p.lookup(&BlockKey { parent: ROOT, experts: vec![7], tokens: vec![1, 2] }), Some(c));
        assert_eq!(p.lookup(&key(ROOT, &[2, 1])), None);
        assert_eq!(p.lookup(&key(5, &[1, 2])), None);
        p.unregister(a);
        assert_eq!(p.lookup(&key(ROOT, &[1, 2])), None);
        assert_eq!(p.lookup(&key(ROOT, &[1, 3])), Some(b));
    }

    #[test]
    fn recycled_parent_makes_old_children_unreachable() {
        let mut p = BlockPool::new(3, 1);
        let a = p.alloc().unwrap();
        let cid_a = p.register(a, key(ROOT, &[1]));
        let b = p.alloc().unwrap();
        p.register(b, key(cid_a, &[2]));
        p.release(a);
        // `a` is recycled for other content (before the fresh block: the cache has not paid
        // yet) and registered again: it gets a new content id, so the old child keyed on
        // `cid_a` is not found from it.
        let a2 = p.alloc().unwrap();
        assert_eq!(a2, a);
        let cid_a2 = p.register(a2, key(ROOT, &[9]));
        assert_ne!(cid_a, cid_a2);
        assert_eq!(p.lookup(&key(cid_a2, &[2])), None);
    }

    #[test]
    fn partial_match_picks_the_longest_shared_prefix_within_the_expert_set() {
        let mut p = BlockPool::new(4, 4);
        let a = p.alloc().unwrap();
        let b = p.alloc().unwrap();
        let c = p.alloc().unwrap();
        p.register(a, key(ROOT, &[1, 2, 3, 4]));
        p.register(b, key(ROOT, &[1, 2, 9, 9]));
        p.register(c, BlockKey { parent: ROOT, experts: vec![3], tokens: vec![1, 2, 3, 4] });
        assert_eq!(p.longest_partial(ROOT, &[], &[1, 2, 3, 7]), Some((a, 3)));
        assert_eq!(p.longest_partial(ROOT, &[], &[1, 2, 9]), Some((b, 3)));
        assert_eq!(p.longest_partial(ROOT, &[3], &[1, 2, 3]), Some((c, 3)));
        assert_eq!(p.longest_partial(ROOT, &[], &[5]), None);
        assert_eq!(p.longest_partial(ROOT, &[4], &[1]), None);
    }

    /// Fills `n` blocks, registers them under distinct keys and releases them to the cache.
    fn cache_unique(p: &mut BlockPool, n: usize, salt: u32) -> Vec<BlockId> {
        let bs: Vec<_> = (0..n).map(|_| p.alloc().unwrap()).collect();
        for (i, &b) in bs.iter().enumerate() {
            p.register(b, key(ROOT, &[salt, i as u32]));
        }
        bs.iter().for_each(|&b| p.release(b));
        bs
    }

    #[test]
    fn a_cache_that_is_never_hit_reuses_touched_blocks_instead_of_fresh_ones() {
        let mut p = BlockPool::new(100, 2);
        // A steady workload of unique prompts: what it frees is cached and never hit.
        for round in 0..50 {
            cache_unique(&mut p, 4, round);
        }
        assert!(p.touched() <= 8, "touched {} blocks for a working set of 4", p.touched());
        assert_eq!(p.available(), 100);
    }

    #[test]
    fn a_cache_that_is_hit_grows_into_fresh_blocks() {
        let mut p = BlockPool::new(100, 2);
        for round in 0..20 {
            let bs = cache_unique(&mut p, 2, round);
            // Every cached block is revived once (a prefix hit) and released again.
            for &b in &bs {
                p.retain(b);
            }
            bs.iter().for_each(|&b| p.release(b));
        }
        // Nothing was recycled: all 40 cached prefixes are still there.
        assert_eq!((p.touched(), p.cached()), (40, 40));
    }
}
