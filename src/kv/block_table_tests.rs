use super::*;
use crate::kv::prefix::root;
use crate::kv::prefix::{BlockKey, ROOT};
use candle_core::{DType, Device, Tensor};

const FULL: &[GroupRule] = &[GroupRule::FULL];

fn store(blocks: usize, bs: usize) -> KvStore {
    KvStore::new(1, blocks, bs, 1, 1, DType::F32, &Device::Cpu).unwrap()
}

/// A one-group (full) table listing `blocks` with `len` positions written.
fn table(blocks: Vec<BlockId>, len: usize) -> BlockTable {
    let reserved = blocks.len();
    BlockTable { groups: vec![blocks], live: vec![0], parents: vec![None], len, reserved, state: None }
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
    assert!(a.reserve_blocks(2, FULL, &mut pool));
    a.len = 8;
    fill(&s, a.blocks()[0], bs, 0.0);
    fill(&s, a.blocks()[1], bs, 10.0);
    // Another table shares both blocks (a prefix hit).
    let mut b = table(a.blocks().to_vec(), 8);
    b.blocks().iter().for_each(|&x| pool.retain(x));
    // `b` keeps 6 positions and will write at 6: block 1 is shared, so it is copied.
    assert!(b.truncate_for_write(6, &mut pool, &s).unwrap());
    assert_eq!(b.blocks()[0], a.blocks()[0]);
    assert_ne!(b.blocks()[1], a.blocks()[1]);
    assert_eq!(&block_vals(&s, b.blocks()[1], bs)[..2], &[10.0, 11.0]);
    assert_eq!((pool.refs(a.blocks()[0]), pool.refs(a.blocks()[1]), pool.refs(b.blocks()[1])), (2, 1, 1));
    // Writing into `b`'s copy leaves `a` untouched.
    fill(&s, b.blocks()[1], bs, 50.0);
    assert_eq!(block_vals(&s, a.blocks()[1], bs), vec![10.0, 11.0, 12.0, 13.0]);
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
    assert!(t.reserve_blocks(2, FULL, &mut pool));
    t.len = 4;
    let c0 = pool.register(t.blocks()[0], BlockKey { parent: ROOT, experts: vec![], tokens: vec![1, 2] });
    pool.register(t.blocks()[1], BlockKey { parent: c0, experts: vec![], tokens: vec![3, 4] });
    let before = t.blocks().to_vec();
    assert!(t.truncate_for_write(3, &mut pool, &s).unwrap());
    assert_eq!(t.blocks(), before);
    assert!(pool.is_registered(t.blocks()[0]) && !pool.is_registered(t.blocks()[1]));
    // Truncating at a block boundary releases whole blocks and copies nothing.
    assert!(t.truncate_for_write(2, &mut pool, &s).unwrap());
    assert_eq!((t.num_blocks(), t.len, pool.used()), (1, 2, 1));
}

#[test]
fn reserve_is_all_or_nothing() {
    let mut pool = BlockPool::new(3, 4);
    let mut t = BlockTable::default();
    assert!(!t.reserve_blocks(4, FULL, &mut pool));
    assert_eq!((t.num_blocks(), pool.used()), (0, 0));
    assert!(t.reserve_blocks(3, FULL, &mut pool));
    t.len = 5;
    t.shrink_to_len(&mut pool);
    assert_eq!((t.num_blocks(), pool.used()), (2, 2));
}

#[test]
fn copy_on_write_fails_cleanly_when_the_pool_is_full() {
    let (bs, s) = (2, store(1, 2));
    let mut pool = BlockPool::new(1, bs);
    let mut a = BlockTable::default();
    assert!(a.reserve_blocks(1, FULL, &mut pool));
    a.len = 2;
    let mut b = table(a.blocks().to_vec(), 2);
    pool.retain(b.blocks()[0]);
    assert!(!b.truncate_for_write(1, &mut pool, &s).unwrap());
    assert_eq!((b.len, pool.refs(b.blocks()[0])), (2, 2));
}

#[test]
fn a_window_group_gives_back_the_blocks_behind_its_window_as_it_advances() {
    // Blocks of 4 positions; a window of 6 under passes of at most 4 positions: the window
    // sees at most 3 blocks, a pass's rows reach one block further, one more for alignment.
    let bs = 4;
    let window = GroupRule::window(6, 4, bs);
    assert_eq!(window.span, 4);
    let rules = [GroupRule::FULL, window];
    let mut pool = BlockPool::new(64, bs);
    let mut t = BlockTable::default();
    // A 40-position reservation: the full group takes all 10 blocks, the window group 4.
    assert_eq!(t.blocks_to_reserve(0, 10, &rules, bs), 14);
    assert!(t.reserve_blocks(10, &rules, &mut pool));
    assert_eq!((t.groups[0].len(), t.groups[1].len(), pool.used()), (10, 4, 14));
    assert_eq!(t.writable_until(bs), 16);
    // Four positions at a time: the window group keeps the blocks a query at `len` sees.
    for len in (4..=40).step_by(4) {
        t.advance(len);
        t.roll(&rules, &mut pool);
        let from = window.live_from(len, bs);
        assert_eq!(from, (len + 1).saturating_sub(6) / bs);
        assert!(t.groups[1][..from].iter().all(|&b| b == NO_BLOCK), "behind the window at {len}");
        assert!(t.groups[1][from..].iter().all(|&b| b != NO_BLOCK));
        assert!(t.num_blocks() - 10 <= window.span, "at {len}: {:?}", t.groups[1]);
        assert_eq!(pool.used(), t.num_blocks());
        assert!(t.writable_until(bs) >= (len + 4).min(40), "the next pass fits at {len}");
    }
    // 40 positions: the window group holds what positions 35.. need (blocks 8 and 9).
    assert_eq!((t.num_blocks(), pool.used()), (12, 12));
    // It can continue from where it stands, not from where its window gave blocks back.
    assert!(t.can_continue_at(40, &rules, bs) && t.can_continue_at(38, &rules, bs));
    assert!(!t.can_continue_at(20, &rules, bs) && t.can_continue_at(0, &rules, bs));
    t.clear(&mut pool);
    assert_eq!(pool.used(), 0);
}

#[test]
fn a_window_group_remembers_the_parent_of_its_first_listed_block() {
    let bs = 2;
    let rules = [GroupRule::window(2, 2, bs)];
    let mut pool = BlockPool::new(16, bs);
    let mut t = BlockTable::default();
    assert!(t.reserve_blocks(8, &rules, &mut pool));
    t.advance(2);
    let c0 = pool.register(t.groups[0][0], BlockKey { parent: root(0), experts: vec![], tokens: vec![1, 2] });
    t.advance(4);
    t.roll(&rules, &mut pool);
    // Block 0 went back to the pool; block 1's parent is its content id.
    assert_eq!(t.groups[0][0], NO_BLOCK);
    assert_eq!(t.parent_of(0, 1, &pool), Some(c0));
    // Truncating to the first listed block keeps its parent; below it, forgets it.
    t.truncate_blocks(1, &mut pool);
    assert_eq!((t.live[0], t.parents[0]), (1, Some(c0)));
    t.truncate_blocks(0, &mut pool);
    assert_eq!((t.live[0], t.parents[0], pool.used()), (0, None, 0));
}
