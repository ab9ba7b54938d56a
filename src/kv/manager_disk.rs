//! The KV manager's side of the disk tier ([`super::super::disk`]): which blocks are offered to
//! it, and reading a prompt's missing blocks back into the pool.

use std::collections::HashMap;

use super::KvManager;
use crate::error::{EngineError, Result};
use crate::kv::block_table::{BlockTable, NO_BLOCK};
use crate::kv::disk::{DiskKey, DiskTier};
use crate::kv::prefix::{root, BlockKey};
use crate::kv::BlockId;

/// Expert sets named for the disk tier at most (a set is named at each admission under it).
const MAX_NAMED_SETS: usize = 4096;

/// Disk keys remembered by content id at most (48 bytes each with the map's overhead aside);
/// past it the memo starts over, and the next offer walks its chain from the first block.
const MAX_REMEMBERED_KEYS: usize = 1 << 16;

/// The disk tier and the expert sets it may key.
pub(crate) struct DiskSide {
    pub(crate) tier: DiskTier,
    /// The disk key of each expert set (load ids) whose adapters have fingerprints; the empty
    /// set is always zeros.
    sets: HashMap<Vec<u64>, DiskKey>,
    /// The disk key of registered blocks, by content id: a block's disk key names its whole
    /// chain, so the next block's key follows from it without hashing the chain again. A
    /// content id names contents (see [`crate::kv::prefix`]), and a set's disk key never
    /// changes, so an entry never goes stale.
    chain: HashMap<u64, DiskKey>,
}

impl DiskSide {
    fn remember(&mut self, cid: u64, key: DiskKey) {
        if self.chain.len() >= MAX_REMEMBERED_KEYS {
            self.chain.clear();
        }
        self.chain.insert(cid, key);
    }
}

impl KvManager {
    /// Keeps full blocks in `tier` too. Refused for models whose blocks have no image (a
    /// sliding window, several table groups) or that keep recurrent states (a block alone
    /// cannot restore them).
    pub fn set_disk(&mut self, tier: DiskTier) -> Result<()> {
        self.check_imageable()?;
        if self.has_states() {
            return Err(EngineError::InvalidArgument(
                "kvCache.disk is not supported yet for models with recurrent layers (their state is not in the blocks)".into(),
            ));
        }
        if !self.prefix_cache {
            return Err(EngineError::InvalidArgument("kvCache.disk needs the prefix cache (kvCache.prefixCache: false)".into()));
        }
        self.disk = Some(DiskSide { tier, sets: HashMap::new(), chain: HashMap::new() });
        Ok(())
    }

    /// The disk tier, when there is one.
    pub fn disk(&self) -> Option<&DiskTier> {
        self.disk.as_ref().map(|d| &d.tier)
    }

    /// Says that blocks computed under the expert set `set` (load ids) are keyed on disk by
    /// `key` (a hash of the adapters' fingerprints). Sets never named stay in RAM only.
    pub fn name_expert_set(&mut self, set: &[u64], key: DiskKey) {
        let Some(d) = &mut self.disk else { return };
        if set.is_empty() || d.sets.contains_key(set) {
            return;
        }
        if d.sets.len() >= MAX_NAMED_SETS {
            d.sets.clear();
        }
        d.sets.insert(set.to_vec(), key);
    }

    fn disk_set(&self, set: &[u64]) -> Option<DiskKey> {
        let d = self.disk.as_ref()?;
        if set.is_empty() {
            return Some([0; 32]);
        }
        d.sets.get(set).copied()
    }

    /// Offers the full blocks of `table` before block `end` that the disk may not hold (those
    /// registered at or after block `first_new`) to the writer. Keys chain from the first
    /// block: the walk starts from the remembered key of the block before `first_new` (a
    /// decoding sequence's previous offer), else from the first block.
    pub(super) fn offer_to_disk(
        &mut self,
        table: &BlockTable,
        first_new: usize,
        end: usize,
        experts: &[u64],
        key: &dyn Fn(usize) -> u32,
    ) {
        let Some(set) = self.disk_set(experts) else { return };
        let bs = self.pool.block_size();
        let blocks = &table.groups()[0];
        let end = end.min(blocks.len());
        let Some(d) = &mut self.disk else { return };
        let remembered = first_new
            .checked_sub(1)
            .and_then(|b| blocks.get(b))
            .filter(|&&block| block != NO_BLOCK)
            .and_then(|&block| self.pool.cid(block))
            .and_then(|cid| d.chain.get(&cid));
        let (mut parent, start) = match remembered {
            Some(k) => (*k, first_new),
            None => (d.tier.root(0, &set), 0),
        };
        let mut tokens = Vec::with_capacity(bs);
        for (b, &block) in blocks.iter().enumerate().take(end).skip(start) {
            tokens.clear();
            tokens.extend((b * bs..(b + 1) * bs).map(key));
            parent = DiskTier::chain(&parent, &tokens);
            let Some(cid) = (block != NO_BLOCK).then(|| self.pool.cid(block)).flatten() else { continue };
            d.remember(cid, parent);
            if b >= first_new {
                let store = &self.store;
                d.tier.offer(parent, || store.block_image(block));
            }
        }
    }

    /// Reads the full blocks of `keys` (under `experts`) that the prefix index misses from
    /// the disk tier into the pool, registered, so that [`Self::match_prefix`] then finds them;
    /// stops at the first block the disk does not hold. Takes at most the blocks the pool has
    /// available. Returns how many blocks were read.
    pub fn revive_from_disk(&mut self, keys: &[u32], experts: &[u64]) -> Result<usize> {
        let Some(set) = self.disk_set(experts) else { return Ok(0) };
        let bs = self.pool.block_size();
        let Some(d) = &mut self.disk else { return Ok(0) };
        let mut disk_key = d.tier.root(0, &set);
        let mut parent = root(0);
        // The chain's RAM blocks, and from the first disk read on every block of it, are held
        // so that allocating for later blocks cannot recycle them; released at the end.
        let (mut found, mut held): (Vec<BlockId>, Vec<BlockId>) = (Vec::new(), Vec::new());
        let mut revived = 0;
        let mut result = Ok(());
        for tokens in keys.chunks_exact(bs) {
            disk_key = DiskTier::chain(&disk_key, tokens);
            let key = BlockKey { parent, experts: experts.to_vec(), tokens: tokens.to_vec() };
            if let Some(b) = self.pool.lookup(&key) {
                parent = self.pool.cid(b).expect("a block found by lookup is registered");
                d.remember(parent, disk_key);
                found.push(b);
                continue;
            }
            let Some(image) = d.tier.read(&disk_key) else { break };
            for b in found.drain(..) {
                self.pool.retain(b);
                held.push(b);
            }
            let Some(b) = self.pool.alloc() else { break };
            if let Err(e) = self.store.set_block_image(b, &image) {
                self.pool.release(b);
                result = Err(e);
                break;
            }
            parent = self.pool.register(b, key);
            d.remember(parent, disk_key);
            held.push(b);
            revived += 1;
        }
        // Back to the cache (registered, unreferenced unless a table lists them) for the match.
        for b in held {
            self.pool.release(b);
        }
        result.map(|()| revived)
    }
}

#[cfg(test)]
#[path = "manager_disk_tests.rs"]
mod tests;
