//! The manager with a sliding-window table group beside a full one: blocks behind the window
//! go back to the pool as a sequence advances, a prefix hit copies the window's blocks, and
//! a session continues from its own table only where its window still lists them.

use super::*;
use crate::kv::layers::{KvLayout, LayerCache};
use candle_core::{DType, Device, Tensor};

const BS: usize = 4;
const WINDOW: usize = 6;

/// Layer 0 keeps a window of 6 positions (table group 0), layer 1 every position (group 1);
/// passes write at most 4 positions.
fn manager(blocks: usize) -> KvManager {
    let layout = KvLayout::from_kinds(&[LayerCache::Window { window: WINDOW }, LayerCache::Full]);
    let store = KvStore::new(2, blocks, BS, 1, 1, DType::F32, &Device::Cpu).unwrap().with_cache_layout(layout).unwrap();
    let mut m = KvManager::new(store, true);
    m.set_pass_limit(4);
    m
}

/// Writes each position's key at positions `from..to` of both layers, 4 at a time, the way
/// the scheduler's passes do (advance, register, roll).
fn write(m: &mut KvManager, t: &mut BlockTable, keys: &[u32], to: usize) {
    while t.len() < to {
        let (from, n) = (t.len(), (to - t.len()).min(4));
        assert!(t.writable_until(BS) >= from + n, "the pass fits the listed blocks");
        for layer in 0..2 {
            let mut runs = Vec::new();
            let blocks = &t.groups()[m.store().table_of(layer)];
            crate::kv::store::slot_runs(blocks, BS, 0, from, n, &mut runs);
            let vals: Vec<f32> = (from..from + n).map(|p| keys[p] as f32).collect();
            let x = Tensor::from_vec(vals, (n, 1), &Device::Cpu).unwrap();
            m.store().write(layer, &runs, &x, &x).unwrap();
        }
        t.advance(from + n);
        m.cache_full_blocks(t, from, usize::MAX, &[], |p| keys[p]);
        m.roll(t);
    }
}

/// A new table reserved for `reserve` positions that writes `keys` (all of them) and ends
/// its request (the reserve past its length goes back).
fn finished(m: &mut KvManager, keys: &[u32], reserve: usize) -> BlockTable {
    let mut t = BlockTable::default();
    let need = m.blocks_for(reserve);
    m.prepare_resume(&mut t, 0, need);
    assert!(m.resume(&mut t, 0, need).unwrap());
    write(m, &mut t, keys, keys.len());
    m.shrink(&mut t);
    t
}

/// What `layer` holds at `positions` through `t`.
fn read(m: &KvManager, t: &BlockTable, layer: usize, positions: std::ops::Range<usize>) -> Vec<f32> {
    let k: Vec<Vec<f32>> = m.store().layer(layer).0.to_vec2().unwrap();
    let blocks = &t.groups()[m.store().table_of(layer)];
    positions.map(|p| k[crate::kv::store::slot_of(blocks, BS, p)][0]).collect()
}

#[test]
fn blocks_behind_the_window_go_back_to_the_pool() {
    let mut m = manager(64);
    let keys: Vec<u32> = (1..=40).collect();
    let mut a = BlockTable::default();
    let need = m.blocks_for(40);
    assert_eq!(m.prepare_resume(&mut a, 0, need), 10 + 4, "the window group lists its span only");
    assert!(m.resume(&mut a, 0, need).unwrap());
    write(&mut m, &mut a, &keys, 40);
    // The full group holds all 10 blocks; the window group what a query at 40 sees and no
    // more than its span.
    let window_blocks = a.num_blocks() - 10;
    assert!((2..=4).contains(&window_blocks), "{window_blocks}");
    assert_eq!(m.used_blocks(), a.num_blocks());
    assert_eq!(read(&m, &a, 0, 35..40), vec![36.0, 37.0, 38.0, 39.0, 40.0]);
    assert_eq!(read(&m, &a, 1, 0..40), keys.iter().map(|&k| k as f32).collect::<Vec<_>>());
    // The request ends: what is past its length goes back too.
    m.shrink(&mut a);
    assert_eq!(a.num_blocks(), 10 + 2);
    m.free(&mut a);
    assert_eq!(m.used_blocks(), 0);
}

#[test]
fn a_prefix_hit_copies_the_blocks_the_window_sees_and_shares_the_full_ones() {
    let mut m = manager(64);
    // Blocks behind a window are cached like any other; while the cache does not pay for
    // itself the pool recycles them first (the sequence itself then reuses them), leaving
    // links (see the next test). Here it pays, so the blocks behind the window stay cached.
    m.assume_cache_pays();
    let keys: Vec<u32> = (1..=30).collect();
    let mut a = finished(&mut m, &keys, 31);
    // A second prompt with the same 30 tokens and one more: both groups hold the 7 full
    // blocks (the window group's blocks behind its window are cached, so its chain is whole).
    let mut keys_b = keys.clone();
    keys_b.push(99);
    let hit = m.match_prefix(&keys_b[..30], &[]);
    assert_eq!((hit.tokens, hit.groups.len()), (28, 2));
    let used = m.used_blocks();
    let hit = m.pin(hit);
    let need_b = m.blocks_for(33);
    let cost = m.blocks_to_adopt(&hit, need_b);
    let mut b = BlockTable::default();
    assert!(m.adopt(&mut b, hit, need_b).unwrap());
    assert_eq!(m.used_blocks() - used, cost, "the cost said is the cost paid");
    // Full group: the 7 whole blocks are shared, the 8th is the table's own.
    assert_eq!(&b.groups()[1][..7], &a.groups()[1][..7]);
    assert_ne!(b.groups()[1][7], a.groups()[1][7]);
    // Window group: nothing behind the window of a query at 28, private copies of the rest.
    let from = (28 + 1 - WINDOW) / BS;
    assert_eq!(from, 5);
    assert!(b.groups()[0][..from].iter().all(|&x| x == NO_BLOCK));
    assert!(b.groups()[0][from..].iter().all(|x| !a.groups()[0].contains(x)));
    assert_eq!(read(&m, &b, 0, 23..28), vec![24.0, 25.0, 26.0, 27.0, 28.0]);
    assert_eq!(read(&m, &b, 1, 0..28), read(&m, &a, 1, 0..28));
    // B continues past the hit: its own writes, and its window moves on.
    write(&mut m, &mut b, &keys_b, 31);
    assert_eq!(read(&m, &b, 0, 26..31), vec![27.0, 28.0, 29.0, 30.0, 99.0]);
    m.free(&mut a);
    m.free(&mut b);
    assert_eq!(m.used_blocks(), 0);
}

#[test]
fn a_hit_reaches_past_window_blocks_that_are_gone_to_the_ones_the_window_sees() {
    let mut m = manager(64);
    let keys: Vec<u32> = (1..=28).collect();
    let mut a = finished(&mut m, &keys, 28);
    // A holds the full group's 7 blocks and the window group's blocks 5 and 6 (what a query
    // at 28 sees); the window group's blocks 0–4 went back to the pool, and giving the cache
    // back now forgets them: only links to them remain.
    assert_eq!(a.groups()[0].iter().filter(|&&b| b != NO_BLOCK).count(), 2);
    m.give_back().unwrap();
    assert_eq!(m.cached_blocks(), 0);
    assert_eq!(m.pool.links(), 5);
    let mut keys_b = keys.clone();
    keys_b.push(99);
    let hit = m.match_prefix(&keys_b[..28], &[]);
    assert_eq!(hit.tokens, 28, "the chain walks through the links");
    assert_eq!(hit.groups[0].blocks[..5], [NO_BLOCK; 5]);
    let hit = m.pin(hit);
    let need = m.blocks_for(30);
    let mut b = BlockTable::default();
    assert!(m.adopt(&mut b, hit, need).unwrap());
    assert_eq!(read(&m, &b, 0, 23..28), vec![24.0, 25.0, 26.0, 27.0, 28.0]);
    assert_eq!(read(&m, &b, 1, 0..28), read(&m, &a, 1, 0..28));
    write(&mut m, &mut b, &keys_b, 29);
    assert_eq!(read(&m, &b, 0, 24..29), vec![25.0, 26.0, 27.0, 28.0, 99.0]);
    // B's blocks chain from A's: a third prompt that goes on as B did finds B's last block.
    write(&mut m, &mut b, &[keys_b.clone(), vec![98, 97, 96]].concat(), 32);
    let keys_c: Vec<u32> = [keys_b.clone(), vec![98, 97, 96, 1]].concat();
    assert_eq!(m.match_prefix(&keys_c[..32], &[]).tokens, 32);
    // Once A and B are gone too, nothing is left to serve a hit: a full group needs its blocks.
    m.free(&mut a);
    m.free(&mut b);
    m.give_back().unwrap();
    assert_eq!(m.match_prefix(&keys_c[..32], &[]), PrefixHit::default());
    // The prefix computed again takes its old content ids back from the links.
    let links = m.pool.links();
    let mut d = finished(&mut m, &keys, 28);
    assert!(m.pool.links() < links);
    assert_eq!(m.match_prefix(&keys_b[..28], &[]).tokens, 28);
    m.free(&mut d);
}

#[test]
fn a_session_continues_from_its_own_table_only_inside_its_window() {
    let mut m = manager(64);
    let keys: Vec<u32> = (1..=24).collect();
    let mut a = finished(&mut m, &keys, 24);
    // Its next turn continues at 24 (or a little before: the window still lists it)...
    assert!(m.can_continue(&a, 24) && m.can_continue(&a, 22));
    // ... but not from 8: the blocks a query at 8 sees went back to the pool.
    assert!(!m.can_continue(&a, 8));
    let need = m.blocks_for(30);
    let cost = m.prepare_resume(&mut a, 22, need);
    let used = m.used_blocks();
    assert!(m.resume(&mut a, 22, need).unwrap());
    assert_eq!(m.used_blocks() - used, cost);
    assert_eq!(read(&m, &a, 0, 17..22), vec![18.0, 19.0, 20.0, 21.0, 22.0]);
    m.free(&mut a);
    assert_eq!(m.used_blocks(), 0);
}

#[test]
fn many_sequences_fit_a_pool_that_all_global_layers_would_not() {
    // 6 sequences of 40 positions: all-global layers would need 6 × 2 × 10 = 120 blocks; with
    // the window group they hold 6 × (10 + at most 4).
    let mut m = manager(6 * 14);
    let keys: Vec<u32> = (1..=40).collect();
    let mut tables: Vec<BlockTable> = (0..6).map(|_| BlockTable::default()).collect();
    for (i, t) in tables.iter_mut().enumerate() {
        let keys: Vec<u32> = keys.iter().map(|k| k + 100 * i as u32).collect();
        let need = m.blocks_for(40);
        m.prepare_resume(t, 0, need);
        assert!(m.resume(t, 0, need).unwrap(), "sequence {i} is admitted");
        write(&mut m, t, &keys, 40);
    }
    assert!(m.used_blocks() <= 6 * 14);
    for t in &mut tables {
        m.free(t);
    }
}
