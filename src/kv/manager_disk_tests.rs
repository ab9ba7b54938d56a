//! The manager with a disk tier, without a model: a later manager (a restarted runtime) reads a
//! prompt's blocks back bit for bit and matches them; blocks under an expert set go to disk
//! only once the set is named, and never match another set.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use crate::kv::block_table::BlockTable;
use crate::kv::disk::{DiskCounters, DiskOptions, DiskTier};
use crate::kv::store::{slot_runs, KvFormat, KvStore};
use crate::kv::KvManager;

const BS: usize = 4;

fn scratch() -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!("er-kv-mdisk-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// A manager over 2 layers of 2 heads, 32 wide, with a disk tier in `dir`.
fn manager(dir: &Path, format: KvFormat, blocks: usize) -> (KvManager, Arc<DiskCounters>) {
    let store = KvStore::new(2, blocks, BS, 2, 32, format, &Device::Cpu).unwrap();
    let bytes = store.bytes_per_block();
    let mut m = KvManager::new(store, true);
    let c = Arc::new(DiskCounters::default());
    let ns = DiskTier::namespace("sha256:test-model", format.name());
    let opts = DiskOptions { dir: dir.to_path_buf(), max_bytes: 1 << 30 };
    m.set_disk(DiskTier::open(&opts, ns, bytes, c.clone()).unwrap()).unwrap();
    (m, c)
}

/// A table holding `keys` (values derived from each key and position), its full blocks
/// registered under `experts`.
fn filled(m: &mut KvManager, keys: &[u32], experts: &[u64]) -> BlockTable {
    let mut t = BlockTable::default();
    extend(m, &mut t, keys, experts);
    t
}

/// Writes `t`'s positions from its length to `keys.len()` and registers the blocks they fill,
/// as a prefill (many positions) or a decode step (one) does.
fn extend(m: &mut KvManager, t: &mut BlockTable, keys: &[u32], experts: &[u64]) {
    let from = t.len();
    assert!(m.resume(t, from, m.blocks_for(keys.len())).unwrap());
    let mut runs = Vec::new();
    slot_runs(t.blocks(), BS, 0, from, keys.len() - from, &mut runs);
    for layer in 0..2 {
        let v: Vec<f32> = (from..keys.len())
            .flat_map(|p| (0..64).map(move |i| ((keys[p] as usize * 7 + p * 3 + i + layer) % 97) as f32 / 10.0 - 4.0))
            .collect();
        let x = Tensor::from_vec(v, (keys.len() - from, 64), &Device::Cpu).unwrap();
        m.store().write(layer, &runs, &x, &(x.clone() * 0.5).unwrap()).unwrap();
    }
    t.advance(keys.len());
    m.cache_full_blocks(t, from, usize::MAX, experts, |p| keys[p]);
}

fn images(m: &KvManager, blocks: &[u32]) -> Vec<Vec<u8>> {
    blocks.iter().map(|&b| m.store().block_image(b).unwrap()).collect()
}

#[test]
fn a_restarted_manager_reads_a_prompts_blocks_back_bit_for_bit() {
    use crate::kv::quant::Quant;
    for format in [KvFormat::Dense(DType::F32), KvFormat::Dense(DType::F16), KvFormat::Quant(Quant::Q8_0)] {
        let dir = scratch();
        let keys: Vec<u32> = (0..18).map(|i| 100 + i * 3).collect();
        let (mut a, ca) = manager(&dir, format, 16);
        let t = filled(&mut a, &keys, &[]);
        let want = images(&a, &t.blocks()[..4]);
        drop(a);
        assert_eq!(ca.written.load(Ordering::Relaxed), 4, "{}: the 4 full blocks", format.name());

        let (mut b, cb) = manager(&dir, format, 16);
        // Another prompt first, so the revived blocks sit elsewhere.
        let _other = filled(&mut b, &[1, 2, 3, 4, 5], &[]);
        assert_eq!(b.match_prefix(&keys, &[]).tokens, 0);
        assert_eq!(b.revive_from_disk(&keys, &[]).unwrap(), 4);
        let hit = b.match_prefix(&keys, &[]);
        assert_eq!(hit.tokens, 16, "{}", format.name());
        assert_eq!(images(&b, &hit.groups[0].blocks), want, "{}: revived blocks differ", format.name());
        assert_eq!(cb.read.load(Ordering::Relaxed), 4);
        // Revived blocks are cached, not held; a second revival finds them in RAM.
        assert_eq!(b.used_blocks(), 2);
        assert_eq!(b.revive_from_disk(&keys, &[]).unwrap(), 0);
        // A prompt that diverges in block 2 takes blocks 0 and 1 only.
        let mut other = keys.clone();
        other[9] += 1;
        let (mut c, _) = manager(&dir, format, 16);
        assert_eq!(c.revive_from_disk(&other, &[]).unwrap(), 2);
        assert_eq!(c.match_prefix(&other, &[]).tokens, 8, "the 2 blocks before the change");
        drop((b, c));
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[test]
fn blocks_filled_one_decode_step_at_a_time_reach_the_disk_under_their_chain() {
    // Each offer continues the chain from the key remembered for the block before; a wrong
    // parent would put the later blocks where a restarted manager does not look.
    let f = KvFormat::Dense(DType::F32);
    let dir = scratch();
    let keys: Vec<u32> = (0..27).map(|i| 40 + i * 11 % 23).collect();
    let (mut a, ca) = manager(&dir, f, 16);
    a.name_expert_set(&[3], [3; 32]);
    let mut t = BlockTable::default();
    extend(&mut a, &mut t, &keys[..6], &[3]);
    for n in 7..=keys.len() {
        extend(&mut a, &mut t, &keys[..n], &[3]);
    }
    let want = images(&a, &t.blocks()[..6]);
    drop(a);
    assert_eq!(ca.written.load(Ordering::Relaxed), 6);
    let (mut b, _) = manager(&dir, f, 16);
    b.name_expert_set(&[4], [3; 32]);
    assert_eq!(b.revive_from_disk(&keys, &[4]).unwrap(), 6);
    let hit = b.match_prefix(&keys, &[4]);
    assert_eq!(hit.tokens, 24);
    assert_eq!(images(&b, &hit.groups[0].blocks), want);
    // A revived chain is remembered too: a table continuing it offers its next blocks under
    // their keys.
    let mut longer = keys.clone();
    longer.extend([5, 6, 7, 8, 9]);
    let mut u = BlockTable::default();
    let hit = b.pin(hit);
    assert!(b.adopt(&mut u, hit, b.blocks_for(longer.len())).unwrap());
    assert_eq!(u.len(), 24);
    extend(&mut b, &mut u, &longer, &[4]);
    drop(b);
    let (mut c, _) = manager(&dir, f, 16);
    c.name_expert_set(&[5], [3; 32]);
    assert_eq!(c.revive_from_disk(&longer, &[5]).unwrap(), 8);
    drop(c);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn expert_sets_reach_the_disk_only_when_named_and_never_mix() {
    let f = KvFormat::Dense(DType::F32);
    let dir = scratch();
    let keys: Vec<u32> = (0..9).collect();
    let (mut a, ca) = manager(&dir, f, 16);
    let _t = filled(&mut a, &keys, &[7]);
    assert_eq!(ca.written.load(Ordering::Relaxed), 0, "an unnamed set stays in RAM");
    a.name_expert_set(&[8], [8; 32]);
    let _u = filled(&mut a, &keys, &[8]);
    drop(a);
    assert_eq!(ca.written.load(Ordering::Relaxed), 2);
    let (mut b, _) = manager(&dir, f, 16);
    assert_eq!(b.revive_from_disk(&keys, &[]).unwrap(), 0, "no experts: another chain");
    b.name_expert_set(&[9], [9; 32]);
    assert_eq!(b.revive_from_disk(&keys, &[9]).unwrap(), 0, "another set: another chain");
    // The same adapters loaded again get a new load id but the same fingerprint key.
    b.name_expert_set(&[12], [8; 32]);
    assert_eq!(b.revive_from_disk(&keys, &[12]).unwrap(), 2);
    assert_eq!(b.match_prefix(&keys, &[12]).tokens, 8);
    assert_eq!(b.match_prefix(&keys, &[]).tokens, 0);
    drop(b);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_full_pool_revives_what_fits_and_keeps_the_chain_it_found() {
    let f = KvFormat::Dense(DType::F32);
    let dir = scratch();
    let keys: Vec<u32> = (0..24).map(|i| i * 5).collect();
    let (mut a, _) = manager(&dir, f, 16);
    let _t = filled(&mut a, &keys, &[]);
    drop(a);
    // A pool of 8 blocks, 5 held by another table: 3 can be revived of the 6.
    let (mut b, _) = manager(&dir, f, 8);
    let _held = filled(&mut b, &(1000..1020).collect::<Vec<_>>(), &[]);
    assert_eq!(b.available(), 3);
    assert_eq!(b.revive_from_disk(&keys, &[]).unwrap(), 3);
    assert_eq!(b.match_prefix(&keys, &[]).tokens, 12);
    drop(b);
    let _ = std::fs::remove_dir_all(dir);
}
