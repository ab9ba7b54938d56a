//! The disk tier without a model: files come back only under their own key and intact, a
//! full queue drops instead of waiting, the directory stays within its budget (least recently
//! used first, under the lock), and a manager started later revives a prompt's blocks.

use std::sync::atomic::Ordering;

use super::*;

const IMAGE: usize = 100;

fn scratch(name: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!("er-kv-disk-{name}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
    let _ = fs::remove_dir_all(&d);
    d
}

fn open(dir: &Path, max_bytes: u64) -> (DiskTier, Arc<DiskCounters>) {
    let c = Arc::new(DiskCounters::default());
    let ns = DiskTier::namespace("sha256:model", "f32/16");
    (DiskTier::open(&DiskOptions { dir: dir.to_path_buf(), max_bytes }, ns, IMAGE, c.clone()).unwrap(), c)
}

fn image(seed: u8) -> Vec<u8> {
    (0..IMAGE).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn key(n: u32) -> DiskKey {
    DiskTier::chain(&[7; 32], &[n, n + 1])
}

/// Drops the tier (its writer finishes the queue) and opens it again.
fn reopen(t: DiskTier, dir: &Path, max_bytes: u64) -> (DiskTier, Arc<DiskCounters>) {
    drop(t);
    open(dir, max_bytes)
}

#[test]
fn a_written_block_comes_back_in_a_later_tier_and_only_under_its_key() {
    let dir = scratch("roundtrip");
    let (mut t, c) = open(&dir, 1 << 20);
    t.offer(key(1), || Ok(image(1)));
    t.offer(key(1), || panic!("a known key is not imaged again"));
    let (mut t, _) = reopen(t, &dir, 1 << 20);
    assert_eq!(c.written.load(Ordering::Relaxed), 1);
    assert_eq!(t.read(&key(1)), Some(image(1)));
    assert_eq!(t.read(&key(2)), None);
    // Another model, another layout, another group or expert set: another chain.
    let root = t.root(0, &[0; 32]);
    let other_dir = scratch("ns");
    for (model, layout) in [("sha256:other", "f32/16"), ("sha256:model", "q8_0/16")] {
        let ns = DiskTier::namespace(model, layout);
        let u =
            DiskTier::open(&DiskOptions { dir: other_dir.clone(), max_bytes: 1 << 20 }, ns, IMAGE, Default::default()).unwrap();
        assert_ne!(u.root(0, &[0; 32]), root);
    }
    assert_ne!(t.root(1, &[0; 32]), root);
    assert_ne!(t.root(0, &[1; 32]), root);
    let _ = fs::remove_dir_all(other_dir);
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn torn_flipped_foreign_and_odd_files_are_skipped_and_removed() {
    let dir = scratch("faults");
    let (mut t, _) = open(&dir, 1 << 20);
    for n in 1..=4 {
        t.offer(key(n), || Ok(image(n as u8)));
    }
    let (mut t, c) = reopen(t, &dir, 1 << 20);
    // Torn: cut short.
    let p = block_path(&dir, &key(1));
    let bytes = fs::read(&p).unwrap();
    fs::write(&p, &bytes[..bytes.len() - 1]).unwrap();
    // A bit flipped in the image.
    let p2 = block_path(&dir, &key(2));
    let mut b2 = fs::read(&p2).unwrap();
    b2[HEADER + 5] ^= 1;
    fs::write(&p2, b2).unwrap();
    // Foreign: another key's (valid) file under this key's name.
    fs::copy(block_path(&dir, &key(4)), block_path(&dir, &key(3))).unwrap();
    for n in 1..=3 {
        assert_eq!(t.read(&key(n)), None, "block {n}");
        assert!(!block_path(&dir, &key(n)).exists(), "block {n} was removed");
    }
    assert_eq!(c.rejected.load(Ordering::Relaxed), 3);
    assert_eq!(t.read(&key(4)), Some(image(4)));
    // A directory, a huge sparse file and a FIFO under a block's name: refused, nothing hangs.
    let p = block_path(&dir, &key(5));
    fs::create_dir_all(&p).unwrap();
    assert_eq!(t.read(&key(5)), None);
    let p = block_path(&dir, &key(6));
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    File::create(&p).unwrap().set_len(1 << 40).unwrap();
    assert_eq!(t.read(&key(6)), None);
    #[cfg(unix)]
    {
        let p = block_path(&dir, &key(7));
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert_eq!(t.read(&key(7)), None);
    }
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn the_directory_stays_within_its_budget_least_recently_used_first() {
    let dir = scratch("evict");
    let len = file_len(IMAGE) as u64;
    let max = len * 10;
    let (mut t, _) = open(&dir, max);
    for n in 0..8 {
        t.offer(key(n), || Ok(image(n as u8)));
    }
    let (mut t, _) = reopen(t, &dir, max);
    // Old files get old times; block 0 is then read (used), so it is kept.
    for n in 0..8 {
        let f = File::options().write(true).open(block_path(&dir, &key(n))).unwrap();
        f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1000 + n as u64)).unwrap();
    }
    assert_eq!(t.read(&key(0)), Some(image(0)));
    for n in 8..12 {
        t.offer(key(n), || Ok(image(n as u8)));
    }
    let (_t, c) = reopen(t, &dir, max);
    let kept: Vec<u32> = (0..12).filter(|&n| block_path(&dir, &key(n)).exists()).collect();
    // 11 files exceed 10: evicted down to 9 (90%), the oldest (1, 2) first.
    assert_eq!(kept, vec![0, 3, 4, 5, 6, 7, 8, 9, 10, 11], "after the 11th write");
    assert!(c.bytes.load(Ordering::Relaxed) <= max);
    assert!(!dir.join(LOCK_NAME).exists(), "the lock is released");
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn a_live_lock_defers_eviction_and_a_dead_owners_lock_is_taken_over() {
    let dir = scratch("lock");
    fs::create_dir_all(&dir).unwrap();
    // Held by this (live) process: not taken.
    fs::write(dir.join(LOCK_NAME), format!("{}\n{}", std::process::id(), host())).unwrap();
    assert!(EvictLock::take(&dir).is_none());
    // Held by a process of this host that is gone: taken over, and released on drop.
    fs::write(dir.join(LOCK_NAME), format!("{}\n{}", i32::MAX - 1, host())).unwrap();
    let lock = EvictLock::take(&dir).expect("an abandoned lock is taken over");
    drop(lock);
    assert!(!dir.join(LOCK_NAME).exists());
    // Another host's lock, fresh: left alone.
    fs::write(dir.join(LOCK_NAME), "1\nsome-other-host").unwrap();
    assert!(EvictLock::take(&dir).is_none());
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn a_full_queue_drops_blocks_without_imaging_them_and_bad_options_are_refused() {
    let dir = scratch("queue");
    let (mut t, c) = open(&dir, 1 << 30);
    // The writer cannot take more than `capacity` at once: pretend it is that far behind.
    t.queued.store(t.capacity, Ordering::Release);
    t.offer(key(1), || panic!("a dropped block is not imaged"));
    assert_eq!(c.dropped.load(Ordering::Relaxed), 1);
    t.queued.store(0, Ordering::Release);
    // A wrong-sized image is a failure, not a file.
    t.offer(key(2), || Ok(vec![0; 3]));
    assert_eq!(c.failed.load(Ordering::Relaxed), 1);
    drop(t);
    assert!(!block_path(&dir, &key(2)).exists());
    let ns = [0; 32];
    let small = DiskOptions { dir: dir.clone(), max_bytes: 10 };
    let e = DiskTier::open(&small, ns, IMAGE, Default::default()).err().unwrap();
    assert!(e.to_string().contains("smaller than one block"), "{e}");
    let file = dir.join("a-file");
    fs::write(&file, b"x").unwrap();
    let e = DiskTier::open(&DiskOptions { dir: file.clone(), max_bytes: 1 << 20 }, ns, IMAGE, Default::default()).err().unwrap();
    assert!(matches!(e, EngineError::Io(_) | EngineError::InvalidArgument(_)), "{e}");
    let _ = fs::remove_dir_all(dir);
}

#[cfg(unix)]
#[test]
fn a_read_only_directory_counts_failed_writes_and_serves_what_it_holds() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("readonly");
    let (mut t, _) = open(&dir, 1 << 20);
    t.offer(key(1), || Ok(image(1)));
    drop(t);
    let (mut t, c) = open(&dir, 1 << 20);
    let ro = |mode| {
        for d in [dir.clone(), block_path(&dir, &key(1)).parent().unwrap().to_path_buf()] {
            fs::set_permissions(&d, fs::Permissions::from_mode(mode)).unwrap();
        }
    };
    ro(0o555);
    // Root may write anyway: then the write simply succeeds; either way nothing breaks.
    let root = File::create(dir.join("probe")).is_ok();
    t.offer(key(2), || Ok(image(2)));
    assert_eq!(t.read(&key(1)), Some(image(1)));
    drop(t);
    ro(0o755);
    if !root {
        assert_eq!(c.failed.load(Ordering::Relaxed), 1);
        assert!(!block_path(&dir, &key(2)).exists());
    }
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn a_damaged_file_is_replaced_when_its_block_is_offered_again() {
    let dir = scratch("replace");
    let (mut t, _) = open(&dir, 1 << 20);
    t.offer(key(1), || Ok(image(1)));
    drop(t);
    let p = block_path(&dir, &key(1));
    let mut bytes = fs::read(&p).unwrap();
    bytes[HEADER] ^= 4;
    fs::write(&p, bytes).unwrap();
    let (mut t, c) = open(&dir, 1 << 20);
    t.offer(key(1), || Ok(image(1)));
    drop(t);
    assert_eq!(c.written.load(Ordering::Relaxed), 1);
    let (mut t, _) = open(&dir, 1 << 20);
    assert_eq!(t.read(&key(1)), Some(image(1)));
    drop(t);
    let _ = fs::remove_dir_all(dir);
}
