//! A sequence's block table: logical positions → physical blocks of the shared pool.
//!
//! Position `p` lives in `blocks[p / block_size]` at offset `p % block_size`. `len` positions
//! hold valid keys/values; the table may list more blocks than `len` needs (a running request
//! reserves its blocks up front, so it can never run out midway). Only the KV layer changes
//! which blocks a table lists ([`super::KvManager`]); the scheduler reads them and advances
//! `len` after a forward pass.

use super::block_pool::BlockPool;
use super::store::KvStore;
use super::BlockId;
use crate::error::Result;

#[derive(Default, Debug)]
pub struct BlockTable {
    blocks: Vec<BlockId>,
    /// Positions written.
    len: usize,
}

/// Blocks needed for `positions` positions.
pub fn blocks_for(positions: usize, block_size: usize) -> usize {
    positions.div_ceil(block_size)
}

impl BlockTable {
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// The physical blocks, in position order.
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Positions written.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Marks positions up to `len` written (after a forward pass wrote them; the pass itself
    /// checks that they lie inside the table's blocks).
    pub fn advance(&mut self, len: usize) {
        assert!(len >= self.len, "a table only grows by advancing ({} -> {len})", self.len);
        self.len = len;
    }

    /// Starts the table over with `blocks` holding `len` written positions (adopting a prefix).
    pub(super) fn set(&mut self, blocks: Vec<BlockId>, len: usize) {
        debug_assert!(self.blocks.is_empty());
        self.blocks = blocks;
        self.len = len;
    }

    /// Positions the listed blocks can hold.
    pub fn capacity(&self, block_size: usize) -> usize {
        self.blocks.len() * block_size
    }

    /// Drops every block.
    pub(super) fn clear(&mut self, pool: &mut BlockPool) {
        self.truncate_blocks(0, pool);
        self.len = 0;
    }

    /// Keeps the first `n` blocks, releasing the rest (`len` is clamped to what they hold).
    pub(super) fn truncate_blocks(&mut self, n: usize, pool: &mut BlockPool) {
        for b in self.blocks.drain(n.min(self.blocks.len())..) {
            pool.release(b);
        }
        self.len = self.len.min(n * pool.block_size());
    }

    /// Keeps positions `..len`, releasing blocks past them, and makes the block that the next
    /// position is written to private: a block shared with another table is copied first
    /// (copy-on-write), and a private one whose key was registered is unregistered, since its
    /// tail is about to change. Needs one free block for the copy; returns false (and changes
    /// nothing) when the pool has none.
    pub(super) fn truncate_for_write(&mut self, len: usize, pool: &mut BlockPool, store: &KvStore) -> Result<bool> {
        let bs = pool.block_size();
        let len = len.min(self.len);
        let keep = blocks_for(len, bs);
        let tail = (!len.is_multiple_of(bs)).then(|| self.blocks[keep - 1]);
        if let Some(b) = tail.filter(|&b| pool.refs(b) > 1) {
            let Some(copy) = pool.alloc() else { return Ok(false) };
            store.copy_block(b, copy, len % bs)?;
            pool.release(b);
            self.blocks[keep - 1] = copy;
        } else if let Some(b) = tail {
            pool.unregister(b);
        }
        self.truncate_blocks(keep, pool);
        self.len = len;
        Ok(true)
    }

    /// Grows the table to `n` blocks from the pool. All or nothing: returns false (and changes
    /// nothing) when the pool cannot supply them.
    pub(super) fn reserve_blocks(&mut self, n: usize, pool: &mut BlockPool) -> bool {
        let more = n.saturating_sub(self.blocks.len());
        if more > pool.available() {
            return false;
        }
        for _ in 0..more {
            self.blocks.push(pool.alloc().expect("availability checked"));
        }
        true
    }

    /// Releases blocks past what `len` positions need (a finished request's unused reserve).
    pub(super) fn shrink_to_len(&mut self, pool: &mut BlockPool) {
        let keep = blocks_for(self.len, pool.block_size());
        self.truncate_blocks(keep, pool);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::prefix::{BlockKey, ROOT};
    use candle_core::{DType, Device, Tensor};

    fn store(blocks: usize, bs: usize) -> KvStore {
        KvStore::new(1, blocks, bs, 1, 1, DType::F32, &Device::Cpu).unwrap()
    }

    fn fill(s: &KvStore, b: BlockId, bs: usize, base: f32) {
        let rows: Vec<f32> = (0..bs).map(|i| base + i as f32).collect();
        let t = Tensor::from_vec(rows, (bs, 1), &Device::Cpu).unwrap();
        s.write(0, &[crate::kv::store::SlotRun { row: 0, slot: b as usize * bs, len: bs }], &t, &t).unwrap();
    }

    fn block_vals(s: &KvStore, b: BlockId, bs: usize) -> Vec<f32> {
        s.layer(0).0.narrow(0, b as usize * bs, bs).unwrap().flatten_all().unwrap().to_vec1().unwrap()
    }

    #[test]
    fn copy_on_write_of_a_shared_partial_block() {
        let (bs, s) = (4, store(4, 4));
        let mut pool = BlockPool::new(4, bs);
        let mut a = BlockTable::default();
        assert!(a.reserve_blocks(2, &mut pool));
        a.len = 8;
        fill(&s, a.blocks[0], bs, 0.0);
        fill(&s, a.blocks[1], bs, 10.0);
        // Another table shares both blocks (a prefix hit).
        let mut b = BlockTable { blocks: a.blocks.clone(), len: 8 };
        b.blocks.iter().for_each(|&x| pool.retain(x));
        // `b` keeps 6 positions and will write at 6: block 1 is shared, so it is copied.
        assert!(b.truncate_for_write(6, &mut pool, &s).unwrap());
        assert_eq!(b.blocks[0], a.blocks[0]);
        assert_ne!(b.blocks[1], a.blocks[1]);
        assert_eq!(&block_vals(&s, b.blocks[1], bs)[..2], &[10.0, 11.0]);
        assert_eq!((pool.refs(a.blocks[0]), pool.refs(a.blocks[1]), pool.refs(b.blocks[1])), (2, 1, 1));
        // Writing into `b`'s copy leaves `a` untouched.
        fill(&s, b.blocks[1], bs, 50.0);
        assert_eq!(block_vals(&s, a.blocks[1], bs), vec![10.0, 11.0, 12.0, 13.0]);
        // Cleanup returns every block.
        a.clear(&mut pool);
        b.clear(&mut pool);
        assert_eq!(pool.used(), 0);
    }

    #[test]
    fn a_private_registered_tail_is_unregistered_not_copied() {
        let (bs, s) = (2, store(2, 2));
        let mut pool = BlockPool::new(2, bs);
        let mut t = BlockTable::default();
        assert!(t.reserve_blocks(2, &mut pool));
        t.len = 4;
        let c0 = pool.register(t.blocks[0], BlockKey { parent: ROOT, experts: vec![], tokens: vec![1, 2] });
        pool.register(t.blocks[1], BlockKey { parent: c0, experts: vec![], tokens: vec![3, 4] });
        let before = t.blocks.clone();
        assert!(t.truncate_for_write(3, &mut pool, &s).unwrap());
        assert_eq!(t.blocks, before);
        assert!(pool.is_registered(t.blocks[0]) && !pool.is_registered(t.blocks[1]));
        // Truncating at a block boundary releases whole blocks and copies nothing.
        assert!(t.truncate_for_write(2, &mut pool, &s).unwrap());
        assert_eq!((t.blocks.len(), t.len, pool.used()), (1, 2, 1));
    }

    #[test]
    fn reserve_is_all_or_nothing() {
        let mut pool = BlockPool::new(3, 4);
        let mut t = BlockTable::default();
        assert!(!t.reserve_blocks(4, &mut pool));
        assert_eq!((t.blocks.len(), pool.used()), (0, 0));
        assert!(t.reserve_blocks(3, &mut pool));
        t.len = 5;
        t.shrink_to_len(&mut pool);
        assert_eq!((t.blocks.len(), pool.used()), (2, 2));
    }

    #[test]
    fn copy_on_write_fails_cleanly_when_the_pool_is_full() {
        let (bs, s) = (2, store(1, 2));
        let mut pool = BlockPool::new(1, bs);
        let mut a = BlockTable::default();
        assert!(a.reserve_blocks(1, &mut pool));
        a.len = 2;
        let mut b = BlockTable { blocks: a.blocks.clone(), len: 2 };
        pool.retain(b.blocks[0]);
        assert!(!b.truncate_for_write(1, &mut pool, &s).unwrap());
        assert_eq!((b.len, pool.refs(b.blocks[0])), (2, 2));
    }
}
