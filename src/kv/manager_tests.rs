//! The manager API without a model: admission, copy-on-write, eviction order and expert-set
//! isolation, with the store holding position-tagged values so copies can be checked.

use super::*;
use crate::kv::quant::Quant;
use crate::kv::store::KvFormat;
use candle_core::{DType, Device, Tensor};

const BS: usize = 4;

fn manager(blocks: usize) -> KvManager {
    manager_in(blocks, KvFormat::Dense(DType::F32))
}

/// A manager over one layer of one KV head, 32 wide when the pool is block-quantized (whole
/// blocks per head).
fn manager_in(blocks: usize, format: KvFormat) -> KvManager {
    let hd = if matches!(format, KvFormat::Quant(_)) { 32 } else { 1 };
    KvManager::new(KvStore::new(1, blocks, BS, 1, hd, format, &Device::Cpu).unwrap(), true)
}

/// Writes `value(p)` at positions `from..to` of `table` (as a forward pass would; every value
/// of a row is the position's key), advances it and registers what filled up.
fn write(m: &mut KvManager, t: &mut BlockTable, keys: &[u32], experts: &[u64], to: usize) {
    let from = t.len();
    let width = m.store().kv_heads * m.store().head_dim;
    let mut runs = Vec::new();
    super::super::store::slot_runs(t.blocks(), BS, 0, from, to - from, &mut runs);
    let vals: Vec<f32> = (from..to).flat_map(|p| std::iter::repeat_n(keys[p] as f32, width)).collect();
    let x = Tensor::from_vec(vals, (to - from, width), &Device::Cpu).unwrap();
    m.store().write(0, &runs, &x, &x).unwrap();
    t.advance(to);
    m.cache_full_blocks(t, from, usize::MAX, experts, |p| keys[p]);
}

/// The values `table` holds at its positions (dequantized and rounded to the integer keys
/// written, for a narrow pool).
fn read(m: &KvManager, t: &BlockTable) -> Vec<f32> {
    let store = m.store();
    let k = store.layer(0).0;
    let k = match (store.format, store.scales(0)) {
        (KvFormat::Quant(q), Some((ks, _))) => q.dequantize(k, ks, DType::F32).unwrap(),
        _ => k.to_dtype(DType::F32).unwrap(),
    };
    let k: Vec<Vec<f32>> = k.to_vec2().unwrap();
    (0..t.len()).map(|p| k[t.blocks()[p / BS] as usize * BS + p % BS][0].round()).collect()
}

/// Admits `keys` for `new` more positions into `t` the way the scheduler does: the better of
/// the table's own prefix and the index, all-or-nothing. Returns the reused positions.
fn admit(m: &mut KvManager, t: &mut BlockTable, own: usize, keys: &[u32], experts: &[u64], new: usize) -> Option<usize> {
    let need = m.blocks_for(keys.len() + new);
    let hit = m.match_prefix(&keys[..keys.len() - 1], experts);
    if own >= hit.tokens {
        m.prepare_resume(t, own, need);
        m.resume(t, own, need).unwrap().then_some(own)
    } else {
        let hit = m.pin(hit);
        let n = hit.tokens();
        m.adopt(t, hit, need).unwrap().then_some(n)
    }
}

/// Every pool format: copy-on-write copies the values and, in a quantized pool, their scales.
const FORMATS: [KvFormat; 4] =
    [KvFormat::Dense(DType::F32), KvFormat::Dense(DType::F16), KvFormat::Quant(Quant::Q8_0), KvFormat::Quant(Quant::Q4_0)];

#[test]
fn a_second_prompt_shares_full_blocks_and_copies_the_partial_one() {
    for format in FORMATS {
        shares_full_blocks_and_copies_the_partial_one(format);
    }
}

fn shares_full_blocks_and_copies_the_partial_one(format: KvFormat) {
    let mut m = manager_in(8, format);
    let keys_a: Vec<u32> = (1..=10).collect();
    let mut a = BlockTable::default();
    assert_eq!(admit(&mut m, &mut a, 0, &keys_a, &[], 2), Some(0));
    write(&mut m, &mut a, &keys_a, &[], 10);
    assert_eq!(m.cached_blocks(), 0);
    // Shares a's two full blocks; a's third block is not full, so it is not registered and
    // cannot be matched.
    let keys_b: Vec<u32> = vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 77, 78];
    let mut b = BlockTable::default();
    assert_eq!(admit(&mut m, &mut b, 0, &keys_b, &[], 1), Some(8));
    assert_eq!(&b.blocks()[..2], &a.blocks()[..2]);
    assert_eq!(b.len(), 8);
    assert_eq!(read(&m, &b), (1..=8).map(|v| v as f32).collect::<Vec<_>>());
    // A third prompt diverging inside a registered block copies its shared start.
    let keys_c: Vec<u32> = vec![1, 2, 3, 4, 5, 6, 99, 98, 97];
    let mut c = BlockTable::default();
    assert_eq!(admit(&mut m, &mut c, 0, &keys_c, &[], 1), Some(6));
    assert_eq!(c.blocks()[0], a.blocks()[0]);
    assert_ne!(c.blocks()[1], a.blocks()[1], "the partial block is a private copy");
    assert_eq!(read(&m, &c), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    write(&mut m, &mut c, &keys_c, &[], 9);
    // Writing into the copy left the original intact.
    assert_eq!(read(&m, &a), (1..=10).map(|v| v as f32).collect::<Vec<_>>());
    for t in [&mut a, &mut b, &mut c] {
        m.free(t);
    }
    assert_eq!(m.used_blocks(), 0);
}

#[test]
fn resuming_a_shared_partial_block_copies_it_first() {
    for format in FORMATS {
        resuming_copies_first(format);
    }
}

fn resuming_copies_first(format: KvFormat) {
    let mut m = manager_in(6, format);
    let keys: Vec<u32> = (1..=8).collect();
    let mut a = BlockTable::default();
    assert!(admit(&mut m, &mut a, 0, &keys, &[], 1).is_some());
    write(&mut m, &mut a, &keys, &[], 8);
    // `b` adopts both full blocks of `a`, then continues from position 6: block 1 is shared
    // with `a`, so it is copied before `b` writes into it.
    let mut b = BlockTable::default();
    let keys_b: Vec<u32> = (1..=9).collect();
    assert_eq!(admit(&mut m, &mut b, 0, &keys_b, &[], 0), Some(8));
    let need = m.blocks_for(8);
    assert_eq!(m.prepare_resume(&mut b, 6, need), 1, "one block for the copy");
    assert!(m.resume(&mut b, 6, need).unwrap());
    assert_eq!(b.blocks()[0], a.blocks()[0]);
    assert_ne!(b.blocks()[1], a.blocks()[1]);
    assert_eq!(read(&m, &b), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let keys_b2 = [1, 2, 3, 4, 5, 6, 70, 71];
    write(&mut m, &mut b, &keys_b2, &[], 8);
    assert_eq!(read(&m, &a), keys.iter().map(|&v| v as f32).collect::<Vec<_>>());
    assert_eq!(read(&m, &b), keys_b2.iter().map(|&v| v as f32).collect::<Vec<_>>());
}

#[test]
fn admission_is_all_or_nothing_and_unpins_on_failure() {
    let mut m = manager(3);
    let keys: Vec<u32> = (1..=8).collect();
    let mut a = BlockTable::default();
    assert!(admit(&mut m, &mut a, 0, &keys, &[], 1).is_some());
    write(&mut m, &mut a, &keys, &[], 8);
    assert_eq!((m.used_blocks(), m.available()), (3, 0));
    // `b` matches `a`'s two full blocks but needs four blocks in all: refused, and the pins
    // are dropped so `a`'s blocks are held by `a` alone.
    let mut b = BlockTable::default();
    let keys_b: Vec<u32> = (1..=9).collect();
    assert_eq!(admit(&mut m, &mut b, 0, &keys_b, &[], 6), None);
    assert!(b.is_empty());
    assert_eq!(m.used_blocks(), 3);
    m.free(&mut a);
    assert_eq!((m.used_blocks(), m.cached_blocks()), (0, 2), "full blocks stay cached");
    // With `a` gone there is room, and the cached blocks are revived by the hit.
    assert_eq!(admit(&mut m, &mut b, 0, &keys_b, &[], 1), Some(8));
    assert_eq!(read(&m, &b), (1..=8).map(|v| v as f32).collect::<Vec<_>>());
    // A prompt larger than the pool is refused without touching anything.
    let mut c = BlockTable::default();
    let big: Vec<u32> = (100..120).collect();
    assert_eq!(admit(&mut m, &mut c, 0, &big, &[], 1), None);
    assert_eq!(m.used_blocks(), 3);
}

#[test]
fn cached_blocks_are_recycled_least_recently_freed_first_and_before_fresh_ones_until_the_cache_pays() {
    let mut m = manager(4);
    let (ka, kb): (Vec<u32>, Vec<u32>) = ((1..=4).collect(), (11..=14).collect());
    let (mut a, mut b) = (BlockTable::default(), BlockTable::default());
    for (t, k) in [(&mut a, &ka), (&mut b, &kb)] {
        assert!(admit(&mut m, t, 0, k, &[], 0).is_some());
        write(&mut m, t, k, &[], 4);
    }
    m.free(&mut a); // cached first
    m.free(&mut b); // cached second
    assert_eq!((m.cached_blocks(), m.available(), m.touched_blocks()), (2, 4, 2));
    // Nothing was hit yet: the cache does not pay, so a new block recycles `a`'s (freed
    // first) rather than touching a fresh one.
    let mut c = BlockTable::default();
    assert!(admit(&mut m, &mut c, 0, &[21, 22], &[], 0).is_some());
    assert_eq!((m.cached_blocks(), m.touched_blocks()), (1, 2));
    assert_eq!(m.match_prefix(&ka, &[]).tokens, 0);
    m.free(&mut c);
    // `b`'s prefix is hit (and released again): now the cache pays, and fresh blocks are
    // touched before any cached prefix is given up.
    let mut e = BlockTable::default();
    let kb_more: Vec<u32> = (11..=15).collect();
    assert_eq!(admit(&mut m, &mut e, 0, &kb_more, &[], 0), Some(4));
    m.free(&mut e);
    // Three blocks: the touched free one first, then the two fresh ones; `b` survives.
    let mut d = BlockTable::default();
    let kd: Vec<u32> = (31..=39).collect();
    assert!(admit(&mut m, &mut d, 0, &kd, &[], 0).is_some());
    assert_eq!(m.touched_blocks(), 4);
    assert_eq!(m.match_prefix(&kb_more, &[]).tokens, 4);
}

#[test]
fn blocks_never_mix_across_expert_sets() {
    let mut m = manager(8);
    let keys: Vec<u32> = (1..=8).collect();
    let mut a = BlockTable::default();
    assert!(admit(&mut m, &mut a, 0, &keys, &[7], 1).is_some());
    write(&mut m, &mut a, &keys, &[7], 8);
    assert_eq!(m.match_prefix(&keys, &[7]).tokens, 8);
    assert_eq!(m.match_prefix(&keys, &[]), PrefixHit::default());
    assert_eq!(m.match_prefix(&keys, &[7, 9]), PrefixHit::default());
    assert_eq!(m.match_prefix(&keys[..6], &[8]).tokens, 0, "no partial match across sets either");
    // The same tokens under another set are computed and registered separately.
    let mut b = BlockTable::default();
    assert_eq!(admit(&mut m, &mut b, 0, &keys, &[], 1), Some(0));
    write(&mut m, &mut b, &keys, &[], 8);
    assert!(b.blocks().iter().all(|x| !a.blocks().contains(x)));
    assert_eq!(m.match_prefix(&keys, &[]).groups[0].blocks, b.blocks()[..2].to_vec());
}

#[test]
fn virtual_positions_key_apart_from_tokens() {
    let mut m = manager(4);
    let with_virtual: Vec<u32> = vec![virtual_key(0), virtual_key(1), 5, 6];
    let mut a = BlockTable::default();
    assert!(admit(&mut m, &mut a, 0, &with_virtual, &[3], 0).is_some());
    write(&mut m, &mut a, &with_virtual, &[3], 4);
    assert_eq!(m.match_prefix(&with_virtual, &[3]).tokens, 4);
    assert_eq!(m.match_prefix(&[0, 1, 5, 6], &[3]).tokens, 0);
}

#[test]
fn hash_collisions_never_share_blocks() {
    let mut m = KvManager::with_hasher(KvStore::new(1, 4, BS, 1, 1, DType::F32, &Device::Cpu).unwrap(), |_| 42);
    let (ka, kb): (Vec<u32>, Vec<u32>) = ((1..=4).collect(), vec![1, 2, 3, 9]);
    let mut a = BlockTable::default();
    assert!(admit(&mut m, &mut a, 0, &ka, &[], 0).is_some());
    write(&mut m, &mut a, &ka, &[], 4);
    assert_eq!(m.match_prefix(&ka, &[]).tokens, 4);
    let hit = m.match_prefix(&kb, &[]);
    assert!(hit.groups[0].blocks.is_empty());
    assert_eq!(hit.groups[0].partial.map(|(_, n)| n), Some(3));
}

#[test]
fn without_the_prefix_cache_nothing_is_shared() {
    let mut m = KvManager::new(KvStore::new(1, 4, BS, 1, 1, DType::F32, &Device::Cpu).unwrap(), false);
    let keys: Vec<u32> = (1..=4).collect();
    let mut a = BlockTable::default();
    assert!(admit(&mut m, &mut a, 0, &keys, &[], 0).is_some());
    write(&mut m, &mut a, &keys, &[], 4);
    m.free(&mut a);
    assert_eq!((m.cached_blocks(), m.match_prefix(&keys, &[]).tokens), (0, 0));
}

#[test]
fn recorded_events_chain_stored_blocks_and_name_the_recycled_ones() {
    use crate::kv::prefix::IndexEvent::{Removed, Stored};
    let mut m = manager(4);
    m.record_events(true);
    let keys: Vec<u32> = (1..=9).collect();
    let mut a = BlockTable::default();
    assert_eq!(admit(&mut m, &mut a, 0, &keys, &[5], 1), Some(0));
    write(&mut m, &mut a, &keys, &[5], 9);
    let stored = m.take_events();
    let (first, second) = match &stored[..] {
        [Stored { cid: x, parent: None, experts: e0, tokens: t0 }, Stored { cid: y, parent: Some(p), experts: e1, tokens: t1 }] =>
        {
            assert_eq!((p, e0, e1), (x, &vec![5], &vec![5]));
            assert_eq!((t0.as_slice(), t1.as_slice()), (&[1, 2, 3, 4][..], &[5, 6, 7, 8][..]));
            (*x, *y)
        }
        other => panic!("{other:?}"),
    };
    assert!(m.take_events().is_empty(), "taken once");
    // Freed, the blocks stay cached (no event); a prompt needing the whole pool recycles them.
    m.free(&mut a);
    assert!(m.take_events().is_empty());
    m.assume_cache_pays();
    let other: Vec<u32> = (100..115).collect();
    let mut b = BlockTable::default();
    assert_eq!(admit(&mut m, &mut b, 0, &other, &[], 1), Some(0));
    let mut removed: Vec<u64> =
        m.take_events().into_iter().map(|e| if let Removed { cid } = e { cid } else { panic!("{e:?}") }).collect();
    removed.sort_unstable();
    assert_eq!(removed, vec![first, second]);
    m.record_events(false);
    write(&mut m, &mut b, &other, &[], 15);
    assert!(m.take_events().is_empty(), "off: nothing is recorded");
}
