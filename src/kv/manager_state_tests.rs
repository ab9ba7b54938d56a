//! The manager's recurrent-state slots without a model: a slot per table, freed with it,
//! exhaustion reported (never a crash), and prefix hits cut back to state snapshots.

use super::*;
use crate::kv::layers::{KvLayout, LayerCache};
use candle_core::{DType, Device};

const BS: usize = 4;

/// Layer 0 keeps a state of 4 f32s, layer 1 every position; `seqs` sequence slots, `snaps`
/// snapshot slots.
fn manager(blocks: usize, seqs: usize, snaps: usize) -> KvManager {
    let layout = KvLayout::from_kinds(&[LayerCache::State { bytes: 16 }, LayerCache::Full]);
    let store = KvStore::new(2, blocks, BS, 1, 1, DType::F32, &Device::Cpu)
        .unwrap()
        .with_cache_layout(layout)
        .unwrap()
        .with_state_slots(seqs, snaps)
        .unwrap();
    KvManager::new(store, true)
}

/// The state's layer as a pass would leave it: `value` in every entry, at `to` positions.
fn run(m: &KvManager, t: &BlockTable, from: usize, to: usize, value: f32) {
    m.store()
        .states()
        .with_layer(t.state().unwrap(), 0, (from, to - from), false, |s, _| {
            s.fill(value);
            Ok(())
        })
        .unwrap();
}

fn state(m: &KvManager, t: &BlockTable, at: usize) -> Vec<f32> {
    m.store().states().with_layer(t.state().unwrap(), 0, (at, 0), false, |s, _| Ok(s.to_vec())).unwrap()
}

#[test]
fn each_table_holds_a_slot_until_freed() {
    let mut m = manager(8, 2, 0);
    assert_eq!((m.has_states(), m.total_states(), m.free_states(), m.draft_cap()), (true, 2, 2, (64 << 20) / 16 - 1));
    let (mut a, mut b, mut c) = (BlockTable::default(), BlockTable::default(), BlockTable::default());
    for t in [&mut a, &mut b] {
        m.prepare_resume(t, 0, 1);
        assert!(m.resume(t, 0, 1).unwrap());
    }
    assert_ne!(a.state(), b.state());
    assert_eq!((m.free_states(), m.state_bytes_used()), (0, 32));
    // No slot left: a third table waits (its blocks would fit), nothing is allocated.
    m.prepare_resume(&mut c, 0, 1);
    assert!(m.lacks_state(&c) && !m.resume(&mut c, 0, 1).unwrap());
    assert_eq!((c.state(), c.num_blocks()), (None, 0));
    m.free(&mut a);
    assert!(m.resume(&mut c, 0, 1).unwrap());
    assert_eq!(m.free_states(), 0);
    // A table continues only where its state stands, or from the start.
    run(&m, &b, 0, 3, 1.0);
    b.advance(3);
    assert!(m.resume(&mut b, 3, 2).unwrap());
    assert!(m.resume(&mut b, 1, 2).is_err(), "a state cannot give positions back");
}

#[test]
fn prefix_hits_end_at_a_snapshot_and_start_from_it() {
    let mut m = manager(16, 2, 1);
    let keys: Vec<u32> = (1..=12).collect();
    let (mut a, mut b) = (BlockTable::default(), BlockTable::default());
    m.prepare_resume(&mut a, 0, 3);
    assert!(m.resume(&mut a, 0, 3).unwrap());
    // A pass over 8 positions: blocks 0 and 1 registered, no snapshot yet.
    run(&m, &a, 0, 8, 7.0);
    a.advance(8);
    m.cache_full_blocks(&a, 0, usize::MAX, &[], |p| keys[p]);
    let hit = m.match_prefix(&keys[..11], &[]);
    assert_eq!((hit.tokens, hit.matched), (0, 8), "blocks match, but no state is kept there");
    m.snapshot(&a).unwrap();
    assert_eq!(m.snapshots(), 1);
    // The state moves on; the snapshot keeps the state at 8.
    run(&m, &a, 8, 10, 9.0);
    let hit = m.match_prefix(&keys[..11], &[]);
    assert_eq!((hit.tokens, hit.matched), (8, 8));
    let hit = m.pin(hit);
    assert!(m.adopt(&mut b, hit, 3).unwrap());
    assert_eq!((b.len(), state(&m, &b, 8)), (8, vec![7.0; 4]));
    // Another expert set shares nothing.
    assert_eq!(m.match_prefix(&keys[..11], &[5]).matched, 0);
}
