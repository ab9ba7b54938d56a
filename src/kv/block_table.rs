//! A sequence's block tables: logical positions → physical blocks of the shared pool, one
//! table per table group of layers ([`super::layers`]).
//!
//! Position `p` lives in `blocks[p / block_size]` at offset `p % block_size` of each group's
//! table. `len` positions hold valid keys/values; a running request reserves its blocks up
//! front (`reserved` blocks' worth of positions), so it can never run out midway. A full
//! group lists every block of the reservation. A sliding-window group lists only the blocks
//! its window can still see plus room for the next pass ([`GroupRule::span`]): blocks behind
//! the window are given back ([`NO_BLOCK`] takes their place) and blocks ahead are taken as
//! the sequence advances ([`BlockTable::roll`]). A window group's blocks are never shared
//! with another table (a prefix hit copies them), so each one it gives back makes room for
//! the next it takes. Only the KV layer changes which blocks a table lists
//! ([`super::KvManager`]); the scheduler reads them and advances `len` after a forward pass.

use super::block_pool::BlockPool;
use super::store::KvStore;
use super::BlockId;
use crate::error::Result;

/// Stands in a window group's table for a block given back behind the window.
pub const NO_BLOCK: BlockId = BlockId::MAX;

/// How a table group keeps blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupRule {
    /// `None`: every position; `Some(w)`: a query at `p` sees `p + 1 - w ..= p`.
    pub window: Option<usize>,
    /// Blocks a window group lists at most: its window plus the positions of one pass.
    pub span: usize,
}

impl GroupRule {
    /// Every position kept.
    pub const FULL: Self = Self { window: None, span: usize::MAX };

    /// A window of `window` positions under passes of at most `ahead` positions.
    pub fn window(window: usize, ahead: usize, block_size: usize) -> Self {
        let span = blocks_for(window.saturating_sub(1).saturating_add(ahead), block_size).saturating_add(1);
        Self { window: Some(window), span }
    }

    /// The first block the next query (at position `len`) can see.
    pub fn live_from(self, len: usize, block_size: usize) -> usize {
        self.window.map_or(0, |w| (len + 1).saturating_sub(w) / block_size)
    }

    /// The blocks the group lists at `len` positions under a reservation of `reserved`.
    fn listed_until(self, len: usize, reserved: usize, block_size: usize) -> usize {
        reserved.min(self.live_from(len, block_size).saturating_add(self.span))
    }
}

#[derive(Default, Debug)]
pub struct BlockTable {
    /// Per table group, in position order; [`NO_BLOCK`] behind a window.
    groups: Vec<Vec<BlockId>>,
    /// Per group: the first listed block (0 for a full group).
    live: Vec<usize>,
    /// Per group: the content id of the block given back just before `live` (the parent of
    /// the next block's key), where it was registered.
    parents: Vec<Option<u64>>,
    /// Positions written.
    len: usize,
    /// Blocks the running request may fill.
    reserved: usize,
    /// The sequence's slot of recurrent states (models with recurrent layers; see
    /// [`super::states`]), handed out and taken back by the manager with the blocks.
    state: Option<super::states::StateId>,
}

/// Blocks needed for `positions` positions.
pub fn blocks_for(positions: usize, block_size: usize) -> usize {
    positions.div_ceil(block_size)
}

impl BlockTable {
    /// Whether the table lists no block.
    pub fn is_empty(&self) -> bool {
        self.num_blocks() == 0
    }

    /// The first group's blocks, in position order (the only group where the model's layers
    /// are all alike).
    pub fn blocks(&self) -> &[BlockId] {
        self.groups.first().map_or(&[], |g| g.as_slice())
    }

    /// Every group's blocks, in position order ([`NO_BLOCK`] behind a window).
    pub fn groups(&self) -> &[Vec<BlockId>] {
        &self.groups
    }

    /// Blocks the table holds, over all groups.
    pub fn num_blocks(&self) -> usize {
        self.groups.iter().zip(&self.live).map(|(g, &l)| g.len() - l).sum()
    }

    /// Positions written.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The slot of the sequence's recurrent states, where the model has recurrent layers.
    pub fn state(&self) -> Option<super::states::StateId> {
        self.state
    }

    pub(super) fn set_state(&mut self, slot: Option<super::states::StateId>) -> Option<super::states::StateId> {
        std::mem::replace(&mut self.state, slot)
    }

    /// Marks positions up to `len` written (after a forward pass wrote them; the pass itself
    /// checks that they lie inside the table's blocks). Blocks behind a window are given back
    /// by [`Self::roll`].
    pub fn advance(&mut self, len: usize) {
        assert!(len >= self.len, "a table only grows by advancing ({} -> {len})", self.len);
        self.len = len;
    }

    /// Positions the reservation covers.
    pub fn capacity(&self, block_size: usize) -> usize {
        self.reserved * block_size
    }

    /// Positions the listed blocks let the next pass write up to (every group).
    pub fn writable_until(&self, block_size: usize) -> usize {
        self.groups.iter().map(|g| g.len() * block_size).min().unwrap_or(0)
    }

    /// Whether every group still lists the blocks a query at position `keep` would read, so
    /// the table can continue from there.
    pub fn can_continue_at(&self, keep: usize, rules: &[GroupRule], block_size: usize) -> bool {
        let last = blocks_for(keep, block_size);
        keep <= self.len
            && self.live.iter().zip(rules).all(|(&live, r)| {
                let from = r.live_from(keep, block_size);
                from >= live || from >= last
            })
    }

    fn ensure_groups(&mut self, n: usize) {
        if self.groups.len() != n {
            debug_assert!(self.is_empty());
            self.groups = vec![Vec::new(); n];
            self.live = vec![0; n];
            self.parents = vec![None; n];
        }
    }

    /// Starts the table over with `groups` (each from its block `live[g]`) holding `len`
    /// written positions (adopting a prefix).
    pub(super) fn set(&mut self, groups: Vec<Vec<BlockId>>, live: Vec<usize>, parents: Vec<Option<u64>>, len: usize) {
        debug_assert!(self.is_empty());
        self.groups = groups;
        self.live = live;
        self.parents = parents;
        self.len = len;
        self.reserved = self.groups.iter().map(Vec::len).max().unwrap_or(0);
    }

    /// Drops every block.
    pub(super) fn clear(&mut self, pool: &mut BlockPool) {
        self.truncate_blocks(0, pool);
        self.len = 0;
    }

    /// Keeps the first `n` blocks of each group, releasing the rest (`len` is clamped to what
    /// they hold).
    pub(super) fn truncate_blocks(&mut self, n: usize, pool: &mut BlockPool) {
        for ((g, live), parent) in self.groups.iter_mut().zip(&mut self.live).zip(&mut self.parents) {
            for b in g.drain(n.min(g.len())..) {
                if b != NO_BLOCK {
                    pool.release(b);
                }
            }
            if *live > g.len() {
                // Nothing listed: the block given back last no longer comes before `live`.
                *live = g.len();
                *parent = None;
            }
        }
        self.len = self.len.min(n * pool.block_size());
        self.reserved = self.reserved.min(n);
    }

    /// Keeps positions `..len`, releasing blocks past them, and makes the block that the next
    /// position is written to private in every group: a block shared with another table is
    /// copied first (copy-on-write), and a private one whose key was registered is
    /// unregistered, since its tail is about to change. Needs a free block per copy; returns
    /// false (and changes nothing) when the pool has too few.
    pub(super) fn truncate_for_write(&mut self, len: usize, pool: &mut BlockPool, store: &KvStore) -> Result<bool> {
        let bs = pool.block_size();
        let len = len.min(self.len);
        let keep = blocks_for(len, bs);
        let partial = !len.is_multiple_of(bs);
        let tails: Vec<Option<BlockId>> =
            self.groups.iter().map(|g| partial.then(|| g[keep - 1]).filter(|&b| b != NO_BLOCK)).collect();
        if tails.iter().flatten().filter(|&&b| pool.refs(b) > 1).count() > pool.available() {
            return Ok(false);
        }
        for (g, tail) in self.groups.iter_mut().zip(tails) {
            match tail {
                Some(b) if pool.refs(b) > 1 => {
                    let copy = pool.alloc().expect("availability checked");
                    store.copy_block(b, copy, len % bs)?;
                    pool.release(b);
                    g[keep - 1] = copy;
                }
                Some(b) => pool.unregister(b),
                None => {}
            }
        }
        self.truncate_blocks(keep, pool);
        self.len = len;
        Ok(true)
    }

    /// Blocks [`Self::reserve_blocks`] would take for a reservation of `n` blocks once the
    /// table (as it lists blocks now) holds `len` positions.
    pub(super) fn blocks_to_reserve(&self, len: usize, n: usize, rules: &[GroupRule], block_size: usize) -> usize {
        rules
            .iter()
            .enumerate()
            .map(|(g, r)| {
                let listed = self.groups.get(g).map_or(0, Vec::len);
                let behind = self.live.get(g).copied().unwrap_or(0).max(r.live_from(len, block_size));
                r.listed_until(len, n, block_size).saturating_sub(listed.max(behind))
            })
            .sum()
    }

    /// Reserves `n` blocks' worth of positions: full groups grow to `n` blocks, window groups
    /// to what their window and the next pass need. All or nothing: returns false (and
    /// changes nothing) when the pool cannot supply them.
    pub(super) fn reserve_blocks(&mut self, n: usize, rules: &[GroupRule], pool: &mut BlockPool) -> bool {
        self.ensure_groups(rules.len());
        if self.blocks_to_reserve(self.len, n, rules, pool.block_size()) > pool.available() {
            return false;
        }
        self.reserved = n;
        self.roll(rules, pool);
        true
    }

    /// Takes the blocks each group lists at the current length (all available).
    fn fill(&mut self, rules: &[GroupRule], pool: &mut BlockPool) {
        let bs = pool.block_size();
        for (g, r) in self.groups.iter_mut().zip(rules) {
            let until = r.listed_until(self.len, self.reserved, bs);
            while g.len() < until {
                g.push(pool.alloc().expect("availability checked"));
            }
        }
    }

    /// After the table advanced: window groups give back the blocks behind their window
    /// (registered ones stay cached for prefix hits) and take the ones the next pass may
    /// write. Returns how many blocks went back.
    pub(super) fn roll(&mut self, rules: &[GroupRule], pool: &mut BlockPool) -> usize {
        let bs = pool.block_size();
        let mut behind = 0;
        for (t, r) in rules.iter().enumerate() {
            let from = r.live_from(self.len, bs).min(self.groups[t].len());
            for i in self.live[t]..from {
                let b = std::mem::replace(&mut self.groups[t][i], NO_BLOCK);
                self.parents[t] = pool.cid(b);
                pool.release(b);
                behind += 1;
            }
            self.live[t] = self.live[t].max(from);
        }
        let more = self.blocks_to_reserve(self.len, self.reserved, rules, bs);
        assert!(more <= pool.available(), "a window group's blocks are private: each one given back makes room");
        self.fill(rules, pool);
        behind
    }

    /// The content id that block `i` of group `g`'s key names as its parent: the listed block
    /// before it, or the one given back last.
    pub(super) fn parent_of(&self, g: usize, i: usize, pool: &BlockPool) -> Option<u64> {
        match i {
            0 => Some(super::prefix::root(g)),
            _ if i == self.live[g] => self.parents[g],
            _ => pool.cid(self.groups[g][i - 1]),
        }
    }

    /// Releases blocks past what `len` positions need (a finished request's unused reserve).
    pub(super) fn shrink_to_len(&mut self, pool: &mut BlockPool) {
        let keep = blocks_for(self.len, pool.block_size());
        self.truncate_blocks(keep, pool);
    }
}

#[cfg(test)]
#[path = "block_table_tests.rs"]
mod tests;
