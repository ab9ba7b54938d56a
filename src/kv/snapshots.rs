//! Recurrent-state snapshots for prefix sharing (vLLM's and SGLang's prefix caching for
//! Mamba-style layers, in small).
//!
//! Blocks of a shared prefix hold its attention layers' keys and values, but a recurrent
//! layer's state at the end of that prefix is in no block. So when a sequence's prompt pass ends
//! at a block boundary whose block is registered in the prefix index, the manager copies the
//! sequence's states into a snapshot slot of the state pool, keyed by that block's content id
//! (which names the whole chain of blocks before it, the expert set included). A later prompt
//! that matches the chain through that block adopts the blocks and starts from a copy of the
//! snapshot; one that matches further than any snapshot is cut back to the last snapshot.
//!
//! The snapshots live in a fixed number of slots (their memory is counted with the pool's);
//! when all are taken the least recently used is replaced. A content id is never reused, so a
//! snapshot whose block left the index simply never matches again and ages out.

use std::collections::HashMap;

use super::states::StateId;

pub struct Snapshots {
    /// Content id of the block a snapshot ends with → its slot and last use.
    by_cid: HashMap<u64, (StateId, u64)>,
    free: Vec<StateId>,
    tick: u64,
}

impl Snapshots {
    /// Snapshots in the slots `slots` of the state pool.
    pub fn new(slots: impl DoubleEndedIterator<Item = StateId>) -> Self {
        Self { by_cid: HashMap::new(), free: slots.rev().collect(), tick: 0 }
    }

    /// Slots for snapshots in all.
    pub fn capacity(&self) -> usize {
        self.by_cid.len() + self.free.len()
    }

    /// Snapshots held.
    pub fn len(&self) -> usize {
        self.by_cid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_cid.is_empty()
    }

    /// The snapshot ending with the block of content id `cid`, marked used.
    pub fn get(&mut self, cid: u64) -> Option<StateId> {
        self.tick += 1;
        let tick = self.tick;
        self.by_cid.get_mut(&cid).map(|(slot, used)| {
            *used = tick;
            *slot
        })
    }

    /// Whether a snapshot ends with the block of content id `cid`.
    pub fn contains(&self, cid: u64) -> bool {
        self.by_cid.contains_key(&cid)
    }

    /// A slot to hold a new snapshot ending with block `cid` (`None`: there is one already, or
    /// there are no slots): a free one, else the least recently used snapshot's.
    pub fn slot_for(&mut self, cid: u64) -> Option<StateId> {
        if self.by_cid.contains_key(&cid) {
            self.get(cid);
            return None;
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                let (&old, _) = self.by_cid.iter().min_by_key(|(_, (_, used))| *used)?;
                self.by_cid.remove(&old).map(|(s, _)| s)?
            }
        };
        self.tick += 1;
        self.by_cid.insert(cid, (slot, self.tick));
        Some(slot)
    }

    /// Forgets every snapshot (the prefix index forgot its blocks); returns their slots.
    pub fn clear(&mut self) -> Vec<StateId> {
        let slots: Vec<StateId> = self.by_cid.drain().map(|(_, (s, _))| s).collect();
        self.free.extend(&slots);
        slots
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_least_recently_used_first() {
        let mut s = Snapshots::new(10..12);
        assert_eq!((s.capacity(), s.len()), (2, 0));
        assert_eq!(s.slot_for(100), Some(10));
        assert_eq!(s.slot_for(100), None, "already held");
        assert_eq!(s.slot_for(200), Some(11));
        assert_eq!(s.get(100), Some(10));
        // Full: 200 was used least recently.
        assert_eq!(s.slot_for(300), Some(11));
        assert!(!s.contains(200) && s.contains(300));
        let mut freed = s.clear();
        freed.sort();
        assert_eq!((freed, s.len(), s.capacity()), (vec![10, 11], 0, 2));
        assert_eq!(Snapshots::new(0..0).slot_for(1), None, "no slots");
    }
}
