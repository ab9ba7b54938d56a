//! Recurrent states: what a recurrent layer (a Gated DeltaNet, a short convolution) keeps per
//! sequence instead of positions.
//!
//! A sequence that runs a model with recurrent layers holds one **slot** of this pool, beside
//! its block tables: a fixed-size f32 buffer holding every recurrent layer's state, laid out
//! by the layers ([`StatePool::region`]). The KV manager hands slots out and takes them back
//! with the sequence's tables (`BlockTable::state`), so a session keeps its state between
//! turns as it keeps its blocks, and an idle session evicted for room loses both.
//!
//! A state is only valid at the one position it has consumed: it cannot drop tokens the way a
//! block table can be cut short. Each layer's region therefore records that position, and a
//! pass that starts anywhere else than there (or at 0, which starts from zeros) is refused as
//! an internal error rather than run on a state that belongs to another prefix.
//!
//! Memory: a slot's buffer is allocated on its first use (fallibly) and kept while the slot is
//! reused; [`StatePool::release_unused`] gives the buffers of free slots back.

use std::sync::Mutex;

use super::layers::{KvLayout, LayerCache};
use crate::error::{EngineError, Result};

/// One sequence's states over all recurrent layers.
#[derive(Default)]
struct Slot {
    /// Every recurrent layer's region (empty until first used).
    data: Vec<f32>,
    /// Per model layer: the position its state has consumed up to.
    pos: Vec<usize>,
    /// Per-row snapshots of the regions written by the last pass that asked for them
    /// (speculative verification): `steps[r]` is the slot's data after that pass's row `r`.
    steps: Vec<Vec<f32>>,
}

pub struct StatePool {
    /// Per model layer: `(offset, len)` of its region in a slot, in f32s.
    regions: Vec<Option<(usize, usize)>>,
    /// f32s per slot.
    floats: usize,
    slots: Vec<Mutex<Slot>>,
}

/// An id of a slot of the [`StatePool`].
pub type StateId = u32;

impl StatePool {
    /// A pool of `slots` slots for the recurrent layers of `layout`; a pool without slots
    /// where it has none. The sizes come from a model file: they are checked, never wrapped.
    pub fn new(layout: &KvLayout, slots: usize) -> Result<Self> {
        let mut regions = vec![None; layout.num_layers];
        let mut floats = 0usize;
        for g in &layout.groups {
            let LayerCache::State { bytes } = g.kind else { continue };
            let len = bytes / 4;
            for &layer in &g.layers {
                regions[layer] = Some((floats, len));
                floats = floats.checked_add(len).ok_or_else(|| too_large(layout))?;
            }
        }
        let slots = if floats == 0 { 0 } else { slots };
        slots.checked_mul(floats).and_then(|n| n.checked_mul(4)).ok_or_else(|| too_large(layout))?;
        let slots = (0..slots).map(|_| Mutex::new(Slot::default())).collect();
        Ok(Self { regions, floats, slots })
    }

    /// Slots in all.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Bytes of one slot (every recurrent layer's state of one sequence).
    pub fn bytes_per_slot(&self) -> usize {
        self.floats * 4
    }

    /// `(offset, len)` of `layer`'s state in a slot, in f32s; `None` for a layer that keeps none.
    pub fn region(&self, layer: usize) -> Option<(usize, usize)> {
        self.regions.get(layer).copied().flatten()
    }

    /// Runs `f` on `layer`'s state in `slot` for a pass of `rows` rows from position `pos`: the
    /// state as it stands (it must have consumed exactly `pos` positions) or zeros at `pos == 0`.
    /// Afterwards the state counts as having consumed `pos + rows`. With `steps`, `f` is given
    /// a buffer of `rows` copies of the region to fill with the state after each row.
    pub fn with_layer<R>(
        &self,
        slot: StateId,
        layer: usize,
        (pos, rows): (usize, usize),
        steps: bool,
        f: impl FnOnce(&mut [f32], Option<&mut [f32]>) -> Result<R>,
    ) -> Result<R> {
        let (off, len) = self.region(layer).ok_or_else(|| EngineError::Internal(format!("layer {layer} keeps no state")))?;
        let cell = self.slots.get(slot as usize).ok_or_else(|| EngineError::Internal(format!("no state slot {slot}")))?;
        let mut s = cell.lock().unwrap_or_else(|e| e.into_inner());
        if s.data.is_empty() {
            s.data = try_zeroed(self.floats)?;
            s.pos = vec![0; self.regions.len()];
        }
        if pos == 0 {
            s.data[off..off + len].fill(0.0);
        } else if s.pos[layer] != pos {
            return Err(EngineError::Internal(format!(
                "layer {layer}'s recurrent state is at position {}, but the pass starts at {pos}",
                s.pos[layer]
            )));
        }
        let Slot { data, pos: at, steps: saved } = &mut *s;
        let out = if steps {
            let mut buf = try_zeroed(rows.checked_mul(len).ok_or_else(|| too_many(rows))?)?;
            let out = f(&mut data[off..off + len], Some(&mut buf))?;
            if saved.len() != rows {
                saved.clear();
                saved.resize_with(rows, Vec::new);
            }
            for (r, snap) in saved.iter_mut().enumerate() {
                if snap.is_empty() {
                    *snap = data.clone();
                }
                snap[off..off + len].copy_from_slice(&buf[r * len..(r + 1) * len]);
            }
            out
        } else {
            f(&mut data[off..off + len], None)?
        };
        at[layer] = pos + rows;
        Ok(out)
    }

    /// Sets `slot`'s states to those after row `row` of the last pass that kept per-row states
    /// (its first `row + 1` rows stay consumed); the slot then stands at `pos`.
    pub fn settle(&self, slot: StateId, row: usize, pos: usize) -> Result<()> {
        let cell = self.slots.get(slot as usize).ok_or_else(|| EngineError::Internal(format!("no state slot {slot}")))?;
        let mut s = cell.lock().unwrap_or_else(|e| e.into_inner());
        let Slot { data, pos: at, steps } = &mut *s;
        let snap = steps
            .get(row)
            .filter(|v| v.len() == data.len())
            .ok_or_else(|| EngineError::Internal(format!("no per-row recurrent state for row {row} of the last verification")))?;
        data.copy_from_slice(snap);
        for (layer, p) in at.iter_mut().enumerate() {
            if self.regions[layer].is_some() {
                *p = pos;
            }
        }
        steps.clear();
        Ok(())
    }

    /// Copies `src`'s states (and positions) into `dst` (a snapshot, or its restore).
    pub fn copy(&self, src: StateId, dst: StateId) -> Result<()> {
        if src == dst {
            return Ok(());
        }
        let get = |i: StateId| self.slots.get(i as usize).ok_or_else(|| EngineError::Internal(format!("no state slot {i}")));
        let (a, b) = (get(src)?, get(dst)?);
        let (data, pos) = {
            let s = a.lock().unwrap_or_else(|e| e.into_inner());
            (s.data.clone(), s.pos.clone())
        };
        let mut d = b.lock().unwrap_or_else(|e| e.into_inner());
        d.data = data;
        d.pos = pos;
        d.steps.clear();
        Ok(())
    }

    /// `slot`'s states, every recurrent layer's standing at `pos` (a saved session's). Fails
    /// when a layer's state is elsewhere.
    pub fn export(&self, slot: StateId, pos: usize) -> Result<Vec<f32>> {
        let cell = self.slots.get(slot as usize).ok_or_else(|| EngineError::Internal(format!("no state slot {slot}")))?;
        let s = cell.lock().unwrap_or_else(|e| e.into_inner());
        let stands = |layer: usize| s.pos.get(layer).copied().unwrap_or(0);
        if let Some(layer) = (0..self.regions.len()).find(|&l| self.regions[l].is_some() && stands(l) != pos) {
            return Err(EngineError::Internal(format!(
                "the recurrent state of layer {layer} stands at {} positions, not {pos}",
                stands(layer)
            )));
        }
        Ok(if s.data.is_empty() { vec![0.0; self.floats] } else { s.data.clone() })
    }

    /// Sets `slot`'s states to `data` (made by [`Self::export`]), standing at `pos`.
    pub fn import(&self, slot: StateId, data: &[f32], pos: usize) -> Result<()> {
        if data.len() != self.floats {
            return Err(EngineError::InvalidArgument(format!(
                "a recurrent state of {} values does not fit this model's {}",
                data.len(),
                self.floats
            )));
        }
        let cell = self.slots.get(slot as usize).ok_or_else(|| EngineError::Internal(format!("no state slot {slot}")))?;
        let mut s = cell.lock().unwrap_or_else(|e| e.into_inner());
        let mut buf = Vec::new();
        buf.try_reserve_exact(data.len()).map_err(|_| EngineError::OutOfMemory("a recurrent state".into()))?;
        buf.extend_from_slice(data);
        s.data = buf;
        s.pos = self.regions.iter().map(|r| if r.is_some() { pos } else { 0 }).collect();
        s.steps.clear();
        Ok(())
    }

    /// Gives back the memory of the slots `free` lists (no sequence holds them).
    pub fn release_unused(&self, free: &[StateId]) {
        for &i in free {
            if let Some(cell) = self.slots.get(i as usize) {
                let mut s = cell.lock().unwrap_or_else(|e| e.into_inner());
                *s = Slot::default();
            }
        }
    }

    /// Drops the per-row states a pass kept (after they were settled or are no longer needed).
    pub fn forget_steps(&self, slot: StateId) {
        if let Some(cell) = self.slots.get(slot as usize) {
            cell.lock().unwrap_or_else(|e| e.into_inner()).steps.clear();
        }
    }
}

fn too_large(layout: &KvLayout) -> EngineError {
    EngineError::InvalidModel(format!(
        "the recurrent state of one sequence ({} bytes) is larger than this engine can hold",
        layout.state_bytes_per_sequence()
    ))
}

fn too_many(rows: usize) -> EngineError {
    EngineError::Internal(format!("per-row states for {rows} rows overflow"))
}

/// `n` zeros, or `OUT_OF_MEMORY` where the allocator refuses.
fn try_zeroed(n: usize) -> Result<Vec<f32>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| EngineError::OutOfMemory(format!("cannot allocate a recurrent state of {n} values")))?;
    v.resize(n, 0.0);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(slots: usize) -> StatePool {
        let s = LayerCache::State { bytes: 16 };
        StatePool::new(&KvLayout::from_kinds(&[s, LayerCache::Full, s]), slots).unwrap()
    }

    #[test]
    fn regions_follow_the_recurrent_layers() {
        let p = pool(3);
        assert_eq!((p.len(), p.bytes_per_slot()), (3, 32));
        assert_eq!((p.region(0), p.region(1), p.region(2)), (Some((0, 4)), None, Some((4, 4))));
        let none = StatePool::new(&KvLayout::all_full(2), 8).unwrap();
        assert!(none.is_empty(), "no recurrent layer, no slots");
    }

    #[test]
    fn a_state_continues_only_where_it_stands() {
        let p = pool(1);
        p.with_layer(0, 0, (0, 3), false, |s, _| {
            s.fill(1.0);
            Ok(())
        })
        .unwrap();
        // Continuing at 3 sees the state; anywhere else is refused.
        let seen = p.with_layer(0, 0, (3, 1), false, |s, _| Ok(s.to_vec())).unwrap();
        assert_eq!(seen, vec![1.0; 4]);
        let e = p.with_layer(0, 0, (2, 1), false, |_, _| Ok(())).unwrap_err();
        assert!(e.to_string().contains("at position 4, but the pass starts at 2"), "{e}");
        // Position 0 starts from zeros.
        let fresh = p.with_layer(0, 0, (0, 1), false, |s, _| Ok(s.to_vec())).unwrap();
        assert_eq!(fresh, vec![0.0; 4]);
        assert!(p.with_layer(1, 0, (0, 1), false, |_, _| Ok(())).is_err(), "no such slot");
        assert!(p.with_layer(0, 1, (0, 1), false, |_, _| Ok(())).is_err(), "layer 1 keeps no state");
    }

    #[test]
    fn per_row_states_settle_and_snapshots_copy() {
        let p = pool(2);
        for layer in [0, 2] {
            p.with_layer(0, layer, (0, 3), true, |s, steps| {
                let steps = steps.unwrap();
                for r in 0..3 {
                    steps[r * 4..(r + 1) * 4].fill(r as f32 + layer as f32);
                }
                s.fill(9.0);
                Ok(())
            })
            .unwrap();
        }
        p.copy(0, 1).unwrap();
        p.settle(0, 1, 2).unwrap();
        assert_eq!(p.with_layer(0, 2, (2, 1), false, |s, _| Ok(s.to_vec())).unwrap(), vec![3.0; 4]);
        assert!(p.settle(0, 1, 2).is_err(), "settled once");
        // The copy holds the state after all three rows.
        assert_eq!(p.with_layer(1, 0, (3, 1), false, |s, _| Ok(s.to_vec())).unwrap(), vec![9.0; 4]);
    }

    #[test]
    fn absurd_sizes_are_refused_not_wrapped() {
        let s = LayerCache::State { bytes: usize::MAX / 2 };
        assert!(StatePool::new(&KvLayout::from_kinds(&[s, s, s]), 1).is_err());
        let one = LayerCache::State { bytes: 1 << 40 };
        assert!(StatePool::new(&KvLayout::from_kinds(&[one]), 1 << 30).is_err());
    }
}
