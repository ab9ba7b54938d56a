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
//!
//! Table groups (see [`super::layers`]): each group of layers has its own table per sequence
//! and its own chain of keys (starting at [`root`]`(group)`). A prefix hit is the longest
//! prefix every group holds; a sliding-window group needs only the blocks its window sees at
//! the hit's end, and copies them (its blocks are never shared, see [`super::block_table`]).
//! After each pass, [`KvManager::roll`] gives back the blocks that fell behind a window.

use super::block_pool::BlockPool;
use super::block_table::{blocks_for, BlockTable, GroupRule, NO_BLOCK};
use super::prefix::{root, BlockKey};
use super::snapshots::Snapshots;
use super::states::StateId;
use super::store::KvStore;
use super::BlockId;
use crate::error::Result;

/// Positions one pass writes for a sequence at most, unless the scheduler says otherwise
/// ([`KvManager::set_pass_limit`]).
const DEFAULT_PASS_POSITIONS: usize = 256;

/// Bytes of per-row recurrent states one speculative verification may keep (Qwen3.5-0.8B's
/// 19 MB a row allows 2 drafts).
pub const STEP_STATES_BYTES: usize = 64 << 20;

/// The position key standing for virtual (prompt-tuning) position `i`.
pub fn virtual_key(i: usize) -> u32 {
    u32::MAX - i as u32
}

/// What the prefix index holds of a prompt, per table group.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PrefixHit {
    /// Per table group (none when nothing matched).
    pub groups: Vec<GroupHit>,
    /// Positions covered in every group.
    pub tokens: usize,
    /// With recurrent layers: positions of whole blocks the index matched, of which `tokens`
    /// end at a state snapshot (a pass ending here could leave one for the next prompt).
    pub matched: usize,
}

/// What one table group's chain holds of a prompt: whole blocks, then a partial block.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct GroupHit {
    /// Full blocks matching the prompt's first `blocks.len() · block_size` positions;
    /// [`NO_BLOCK`] where only a link to a forgotten block remains (see [`super::prefix`]),
    /// which a window group need not read.
    pub blocks: Vec<BlockId>,
    /// The content id of each of `blocks`.
    pub cids: Vec<u64>,
    /// A registered block sharing its first `n` positions with the prompt after `blocks`.
    pub partial: Option<(BlockId, usize)>,
}

impl GroupHit {
    /// Whether the group holds every block a query at position `tokens` reads under `rule`.
    fn serves(&self, tokens: usize, rule: GroupRule, bs: usize) -> bool {
        (rule.live_from(tokens, bs)..blocks_for(tokens, bs)).all(|i| match self.blocks.get(i) {
            Some(&b) => b != NO_BLOCK,
            None => i == self.blocks.len() && self.partial.is_some_and(|(_, n)| i * bs + n >= tokens),
        })
    }

    /// Keeps the first `n` whole blocks, without the partial one.
    fn truncate(&mut self, n: usize) {
        self.blocks.truncate(n);
        self.cids.truncate(n);
        self.partial = None;
    }
}

/// A [`PrefixHit`] whose blocks are pinned (eviction cannot recycle them). Consume it with
/// [`KvManager::adopt`] or [`KvManager::unpin`].
#[derive(Debug)]
#[must_use = "a pinned hit holds blocks until adopted or unpinned"]
pub struct PinnedHit(PrefixHit);

impl PrefixHit {
    /// Every block the hit references: per group, the full ones, then the partial match's
    /// source.
    fn referenced_blocks(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.groups.iter().flat_map(|g| g.blocks.iter().copied().filter(|&b| b != NO_BLOCK).chain(g.partial.map(|(b, _)| b)))
    }
}

impl PinnedHit {
    pub fn tokens(&self) -> usize {
        self.0.tokens
    }

    /// See [`PrefixHit::matched`].
    pub fn matched(&self) -> usize {
        self.0.matched
    }
}

pub struct KvManager {
    pool: BlockPool,
    store: KvStore,
    /// Look up and register shared prefix blocks.
    prefix_cache: bool,
    /// How each table group keeps blocks.
    rules: Vec<GroupRule>,
    /// Blocks window groups gave back, in all.
    behind_window: u64,
    /// Slots of the state pool no table holds (models with recurrent layers).
    free_states: Vec<StateId>,
    /// States at the ends of registered blocks, for prefix hits ([`super::snapshots`]).
    snapshots: Snapshots,
    /// The prefix cache's disk tier, when `kvCache.disk` asks for one.
    disk: Option<disk::DiskSide>,
}

/// Each table group's rule, for passes of at most `pass` positions.
fn rules(store: &KvStore, pass: usize) -> Vec<GroupRule> {
    let pass = pass.max(1);
    store
        .cache_layout()
        .tables
        .iter()
        .map(|t| t.window.map_or(GroupRule::FULL, |w| GroupRule::window(w, pass, store.block_size)))
        .collect()
}

/// The state pool's slots: free ones for sequences, the rest for snapshots.
fn state_slots(store: &KvStore) -> (Vec<StateId>, Snapshots) {
    let (seqs, all) = (store.state_sequences() as StateId, store.states().len() as StateId);
    ((0..seqs).rev().collect(), Snapshots::new(seqs..all))
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
        let rules = rules(&store, DEFAULT_PASS_POSITIONS);
        let (free_states, snapshots) = state_slots(&store);
        Ok(Self { pool, store, prefix_cache, rules, behind_window: 0, free_states, snapshots, disk: None })
    }

    /// Passes write at most `positions` positions of a sequence (a window group keeps room
    /// for that many past its window). Set before any table is filled.
    pub fn set_pass_limit(&mut self, positions: usize) {
        self.rules = rules(&self.store, positions);
    }

    /// A manager whose prefix index uses `hasher` (tests force collisions with it).
    #[cfg(test)]
    pub fn with_hasher(store: KvStore, hasher: super::prefix::KeyHasher) -> Self {
        let pool = BlockPool::with_hasher(store.num_blocks, store.block_size, hasher);
        let rules = rules(&store, DEFAULT_PASS_POSITIONS);
        let (free_states, snapshots) = state_slots(&store);
        Self { pool, store, prefix_cache: true, rules, behind_window: 0, free_states, snapshots, disk: None }
    }

    /// See [`BlockPool::assume_cache_pays`].
    #[cfg(test)]
    pub fn assume_cache_pays(&mut self) {
        self.pool.assume_cache_pays();
    }

    /// How each table group keeps blocks.
    pub(super) fn rules(&self) -> &[GroupRule] {
        &self.rules
    }

    pub fn store(&self) -> &KvStore {
        &self.store
    }

    /// The model's layers grouped by what they keep (the store refuses recurrent layers until
    /// their manager exists).
    pub fn layout(&self) -> &super::KvLayout {
        self.store.cache_layout()
    }

    pub fn block_size(&self) -> usize {
        self.pool.block_size()
    }

    pub fn total_blocks(&self) -> usize {
        self.pool.total()
    }

    /// Positions the whole pool holds for sequences whose every layer keeps them all (a
    /// block per table group per `block_size` positions): what one sequence can count on.
    pub fn total_positions(&self) -> usize {
        self.pool.total() / self.rules.len().max(1) * self.pool.block_size()
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

    /// Whether the model keeps a recurrent state per sequence (besides its blocks).
    pub fn has_states(&self) -> bool {
        !self.store.states().is_empty()
    }

    /// State slots that can be handed out now.
    pub fn free_states(&self) -> usize {
        self.free_states.len()
    }

    /// State slots in all.
    pub fn total_states(&self) -> usize {
        self.store.states().len()
    }

    /// Bytes of recurrent state held by sequences.
    pub fn state_bytes_used(&self) -> usize {
        (self.total_states() - self.free_states.len()) * self.store.states().bytes_per_slot()
    }

    /// Drafts a speculative step may verify: a verification keeps the recurrent states after
    /// each of its rows (see [`super::states`]), at most [`STEP_STATES_BYTES`] of them.
    pub fn draft_cap(&self) -> usize {
        match self.store.states().bytes_per_slot() {
            0 => usize::MAX,
            b => (STEP_STATES_BYTES / b).saturating_sub(1),
        }
    }

    /// Whether `table` needs a state slot that the pool cannot give now.
    pub fn lacks_state(&self, table: &BlockTable) -> bool {
        self.has_states() && table.state().is_none() && self.free_states.is_empty()
    }

    /// Gives `table` a state slot if the model has recurrent layers and it holds none. False
    /// when none is free.
    fn take_state(&mut self, table: &mut BlockTable) -> bool {
        if !self.has_states() || table.state().is_some() {
            return true;
        }
        match self.free_states.pop() {
            Some(s) => {
                table.set_state(Some(s));
                true
            }
            None => false,
        }
    }

    /// Forgets every cached prefix and returns the memory of every block no table lists to the
    /// OS (CPU pools; called when the engine has been idle a while). Returns how many blocks
    /// were released.
    pub fn give_back(&mut self) -> Result<usize> {
        let blocks = self.pool.give_back();
        self.store.release_memory(&blocks)?;
        self.store.states().release_unused(&self.free_states);
        let snapshots = self.snapshots.clear();
        self.store.states().release_unused(&snapshots);
        Ok(blocks.len())
    }

    /// Blocks a table needs for `positions` positions.
    pub fn blocks_for(&self, positions: usize) -> usize {
        blocks_for(positions, self.pool.block_size())
    }

    /// The longest cached prefix of `keys` under `experts`, at most `keys.len()` positions:
    /// full blocks looked up one by one (each keyed on the one before), then the registered
    /// block sharing the longest start with the rest. Changes nothing.
    /// In each table group; the hit is what every group holds.
    pub fn match_prefix(&self, keys: &[u32], experts: &[u64]) -> PrefixHit {
        if !self.prefix_cache {
            return PrefixHit::default();
        }
        let bs = self.pool.block_size();
        let mut groups = Vec::with_capacity(self.rules.len());
        for g in 0..self.rules.len() {
            let mut group = GroupHit::default();
            let mut parent = root(g);
            for tokens in keys.chunks_exact(bs) {
                let key = BlockKey { parent, experts: experts.to_vec(), tokens: tokens.to_vec() };
                let Some((b, cid)) = self.pool.lookup_link(&key) else { break };
                parent = cid;
                group.blocks.push(b.unwrap_or(NO_BLOCK));
                group.cids.push(cid);
            }
            let m = group.blocks.len() * bs;
            if m < keys.len() {
                let next = &keys[m..(m + bs).min(keys.len())];
                group.partial = self.pool.longest_partial(parent, experts, next);
            }
            groups.push(group);
        }
        // The longest hit every group serves: what the shortest chain covers, or, where a
        // group lacks a block it would read there, the last block boundary where none does.
        let longest = |g: &GroupHit| g.blocks.len() * bs + g.partial.map_or(0, |(_, n)| n);
        let mut tokens = groups.iter().map(longest).min().unwrap_or(0);
        if !groups.iter().zip(&self.rules).all(|(g, &r)| g.serves(tokens, r, bs)) {
            tokens = (0..tokens.div_ceil(bs))
                .rev()
                .map(|k| k * bs)
                .find(|&t| groups.iter().zip(&self.rules).all(|(g, &r)| g.serves(t, r, bs)))
                .unwrap_or(0);
            groups.iter_mut().for_each(|g| g.truncate(tokens / bs));
        }
        if tokens == 0 {
            return PrefixHit::default();
        }
        let hit = PrefixHit { groups, tokens, matched: 0 };
        if self.has_states() {
            return self.cut_to_snapshot(hit);
        }
        hit
    }

    /// A hit for a model with recurrent layers: their states at its end are in no block, so it
    /// ends where a snapshot does (the last whole block that ends one), or is empty.
    fn cut_to_snapshot(&self, mut hit: PrefixHit) -> PrefixHit {
        let whole = hit.groups.iter().map(|g| g.blocks.len()).min().unwrap_or(0).min(hit.tokens / self.pool.block_size());
        let bs = self.pool.block_size();
        let ends_snapshot = |k: usize| {
            self.snapshots.contains(hit.groups[0].cids[k - 1])
                && hit.groups.iter().zip(&self.rules).all(|(g, &r)| g.serves(k * bs, r, bs))
        };
        let matched = whole * bs;
        let Some(k) = (1..=whole).rev().find(|&k| ends_snapshot(k)) else { return PrefixHit { matched, ..Default::default() } };
        hit.groups.iter_mut().for_each(|g| g.truncate(k));
        hit.tokens = k * bs;
        hit.matched = matched;
        hit
    }

    /// After a pass: where `table`'s sequence stands at the end of a registered block, keeps a
    /// copy of its recurrent states for later prompts that share the prefix (see
    /// [`super::snapshots`]).
    pub fn snapshot(&mut self, table: &BlockTable) -> Result<()> {
        let (Some(state), bs, len) = (table.state(), self.pool.block_size(), table.len()) else { return Ok(()) };
        if !self.prefix_cache || len == 0 || !len.is_multiple_of(bs) {
            return Ok(());
        }
        let Some(cid) = self.canonical_cid(table.groups().first().map_or(&[][..], |g| &g[..len / bs])) else {
            return Ok(());
        };
        match self.snapshots.slot_for(cid) {
            Some(slot) => self.store.states().copy(state, slot),
            None => Ok(()),
        }
    }

    /// The content id a prefix lookup reaches for the contents of `blocks` (a table's first
    /// blocks of group 0): the same contents may be registered more than once (two sequences
    /// computed them apart), and lookups follow the chain registered first. `None` where a block
    /// is not registered.
    fn canonical_cid(&self, blocks: &[BlockId]) -> Option<u64> {
        let mut parent = root(0);
        for &b in blocks {
            let own = (b != NO_BLOCK).then(|| self.pool.key(b)).flatten()?;
            let key = BlockKey { parent, experts: own.experts.clone(), tokens: own.tokens.clone() };
            parent = self.pool.cid(self.pool.lookup(&key)?)?;
        }
        (!blocks.is_empty()).then_some(parent)
    }

    /// Records what the prefix index registers and forgets ([`Self::take_events`]), for
    /// subscribers of KV events; `false` stops.
    pub fn record_events(&mut self, on: bool) {
        self.pool.record_events(on)
    }

    /// The prefix index's events since the last call (see [`Self::record_events`]).
    pub fn take_events(&mut self) -> Vec<super::prefix::IndexEvent> {
        self.pool.take_events()
    }

    /// Prefix snapshots held.
    pub fn snapshots(&self) -> usize {
        self.snapshots.len()
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
        let (bs, tokens) = (self.pool.block_size(), hit.0.tokens);
        let fresh = BlockTable::default().blocks_to_reserve(tokens, need_blocks, &self.rules, bs);
        // Full groups share the hit's whole blocks; everything else is allocated (copied).
        let shared = self.rules.iter().filter(|r| r.window.is_none()).count() * (tokens / bs);
        fresh.saturating_sub(shared)
    }

    /// Makes `table` (emptied first) start with the hit: full groups share its whole blocks
    /// and copy the partial block's matching positions into a block of their own
    /// (copy-on-write); window groups copy the blocks their window sees. Then the table is
    /// grown to `need_blocks`. False (the hit unpinned, the table empty) when the pool cannot
    /// supply the blocks.
    pub fn adopt(&mut self, table: &mut BlockTable, hit: PinnedHit, need_blocks: usize) -> Result<bool> {
        self.free(table);
        if self.pool.available() < self.blocks_to_adopt(&hit, need_blocks) || self.lacks_state(table) {
            self.unpin(hit);
            return Ok(false);
        }
        assert!(self.take_state(table), "availability checked");
        let bs = self.pool.block_size();
        let tokens = hit.0.tokens;
        let (whole, last) = (tokens / bs, blocks_for(tokens, bs));
        let (mut lists, mut live, mut parents, mut unpinned) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (g, (group, rule)) in hit.0.groups.iter().zip(&self.rules).enumerate() {
            let from = rule.live_from(tokens, bs);
            let mut list = vec![NO_BLOCK; from];
            for i in from..last {
                let src = group.blocks.get(i).copied().or(group.partial.map(|(b, _)| b)).expect("the hit covers it");
                if rule.window.is_none() && i < whole {
                    list.push(src);
                    continue;
                }
                let b = self.pool.alloc().expect("availability checked");
                self.store.copy_block(src, b, if i < whole { bs } else { tokens % bs })?;
                if i < whole {
                    // The blocks this table registers after it name it as their parent.
                    self.pool.register_copy(b, src);
                }
                list.push(b);
            }
            // The pins not handed to the table.
            let shared = if rule.window.is_none() { whole } else { 0 };
            unpinned.extend(
                group.blocks.iter().enumerate().filter(|&(i, &b)| b != NO_BLOCK && (i >= shared || i < from)).map(|(_, &b)| b),
            );
            unpinned.extend(group.partial.map(|(b, _)| b));
            parents.push(Some(if from == 0 { root(g) } else { group.cids[from - 1] }));
            lists.push(list);
            live.push(from);
        }
        for b in unpinned {
            self.pool.release(b);
        }
        table.set(lists, live, parents, tokens);
        assert!(table.reserve_blocks(need_blocks, &self.rules, &mut self.pool), "availability checked");
        if let Some(state) = table.state() {
            // The recurrent states at the hit's end (`cut_to_snapshot` made it end at one).
            let last = table.groups()[0][tokens / bs - 1];
            let snap = self.pool.cid(last).and_then(|c| self.snapshots.get(c));
            let snap =
                snap.ok_or_else(|| crate::error::EngineError::Internal("a prefix hit without its state snapshot".into()))?;
            self.store.states().copy(snap, state)?;
        }
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
        let bs = self.pool.block_size();
        let keep = keep.min(table.len());
        let kept = self.blocks_for(keep);
        let cow = if keep.is_multiple_of(bs) {
            0
        } else {
            let shared = |g: &Vec<BlockId>| g.get(kept - 1).is_some_and(|&b| b != NO_BLOCK && self.pool.refs(b) > 1);
            table.groups().iter().filter(|g| shared(g)).count()
        };
        table.blocks_to_reserve(keep, need_blocks, &self.rules, bs) + cow
    }

    /// Whether `table` can continue from its first `keep` positions: every window group still
    /// lists the blocks a query at `keep` sees.
    pub fn can_continue(&self, table: &BlockTable, keep: usize) -> bool {
        table.can_continue_at(keep, &self.rules, self.pool.block_size())
    }

    /// After `table` advanced: its window groups give back the blocks behind their windows
    /// and take those the next pass may write.
    pub fn roll(&mut self, table: &mut BlockTable) {
        if !table.is_empty() {
            self.behind_window += table.roll(&self.rules, &mut self.pool) as u64;
        }
    }

    /// Blocks window groups gave back as their sequences moved past them, in all.
    pub fn blocks_behind_window(&self) -> u64 {
        self.behind_window
    }

    /// Continues `table` from its first `keep` positions (copy-on-write of a shared last
    /// block) and grows it to `need_blocks`. False (nothing allocated) when the pool cannot
    /// supply what [`Self::prepare_resume`] said.
    pub fn resume(&mut self, table: &mut BlockTable, keep: usize, need_blocks: usize) -> Result<bool> {
        if self.pool.available() < self.resume_cost(table, keep, need_blocks) || self.lacks_state(table) {
            return Ok(false);
        }
        if self.has_states() && keep != 0 && keep != table.len() {
            // A recurrent state cannot give positions back (see `super::states`).
            return Err(crate::error::EngineError::Internal(format!(
                "a sequence with recurrent state at {} positions cannot continue from {keep}",
                table.len()
            )));
        }
        assert!(self.take_state(table), "availability checked");
        let ok = table.truncate_for_write(keep, &mut self.pool, &self.store)?;
        assert!(ok && table.reserve_blocks(need_blocks, &self.rules, &mut self.pool), "availability checked");
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
        let (first, end) = (from / bs, table.len().min(until) / bs);
        // The first block of group 0 registered now: the disk tier takes it and those after.
        let mut first_new = None;
        for (g, blocks) in table.groups().iter().enumerate() {
            for (b, &block) in blocks.iter().enumerate().take(end).skip(first) {
                if block == NO_BLOCK || self.pool.is_registered(block) {
                    continue;
                }
                if let Some(parent) = table.parent_of(g, b, &self.pool) {
                    let tokens = (b * bs..(b + 1) * bs).map(&key).collect();
                    self.pool.register(block, BlockKey { parent, experts: experts.to_vec(), tokens });
                    if g == 0 {
                        first_new = first_new.or(Some(b));
                    }
                }
            }
        }
        if let (Some(first_new), true) = (first_new, self.disk.is_some()) {
            self.offer_to_disk(table, first_new, end, experts, &key);
        }
    }

    /// Releases the blocks past what `table`'s positions need (a finished request's reserve).
    pub fn shrink(&mut self, table: &mut BlockTable) {
        table.shrink_to_len(&mut self.pool);
    }

    /// Releases every block of `table`; registered ones stay cached for later prefix hits.
    pub fn free(&mut self, table: &mut BlockTable) {
        table.clear(&mut self.pool);
        if let Some(s) = table.set_state(None) {
            self.store.states().forget_steps(s);
            self.free_states.push(s);
        }
    }
}

#[path = "manager_disk.rs"]
mod disk;
#[cfg(test)]
#[path = "manager_state_tests.rs"]
mod state_tests;
#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
#[cfg(test)]
#[path = "manager_window_tests.rs"]
mod window_tests;
