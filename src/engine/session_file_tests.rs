//! Session files: what is written is what is read, and a file that is not exactly that (cut,
//! padded, a flipped bit, another format, sizes that overflow) is refused with the reason.

use super::*;

fn sample(state: bool) -> SessionFile {
    let block_bytes = 24;
    let positions = 7;
    let header = SessionHeader {
        model: "sha256:abc".into(),
        kv_format: "f32".into(),
        block_size: 4,
        block_bytes,
        positions,
        tokens: 6,
        pending: Some(42),
        virtual_tokens: 1,
        state_values: if state { 3 } else { 0 },
        experts: vec![("sql".into(), "sha256:def".into())],
        session: serde_json::json!({"history": [{"role": "user", "content": "hi"}]}),
    };
    let blocks = (0..2u8).map(|b| (0..block_bytes as u8).map(|i| i ^ (b * 31)).collect()).collect();
    SessionFile {
        header,
        tokens: vec![1, 2, 3, 4, 5, 0xFFFF_FFFE],
        cache: TableImage { len: positions, blocks, state: state.then(|| vec![0.5, -1.0, f32::MIN_POSITIVE]) },
    }
}

/// A fresh directory, removed when dropped.
struct Dir(std::path::PathBuf);

impl Dir {
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(self.0.join("ro"), std::fs::Permissions::from_mode(0o755));
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir() -> Dir {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("er-session-file-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Dir(d)
}

#[test]
fn what_is_written_is_read_back() {
    for state in [false, true] {
        let f = sample(state);
        let bytes = encode(&f).unwrap();
        assert_eq!(&bytes[..8], MAGIC);
        assert_eq!(decode(&bytes).unwrap(), f);
        let d = dir();
        let path = d.path().join("chat.session");
        write_atomic(&path, &bytes).unwrap();
        assert_eq!(read(&path).unwrap(), f);
        // Saving again replaces the file whole, and leaves no temporary file behind.
        write_atomic(&path, &encode(&sample(!state)).unwrap()).unwrap();
        assert_eq!(read(&path).unwrap(), sample(!state));
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }
}

#[test]
fn cut_padded_or_flipped_files_are_refused() {
    let bytes = encode(&sample(true)).unwrap();
    let refused = |b: &[u8]| {
        let d = dir();
        let path = d.path().join("s");
        std::fs::write(&path, b).unwrap();
        let e = read(&path).unwrap_err();
        assert!(matches!(e, EngineError::InvalidArgument(_)), "{e}");
        assert!(decode(b).is_err());
        e.to_string()
    };
    for cut in [0, 7, 16, 20, bytes.len() / 2, bytes.len() - 1] {
        refused(&bytes[..cut]);
    }
    let mut padded = bytes.clone();
    padded.push(0);
    assert!(refused(&padded).contains("truncated or altered"));
    // Every byte of the body and the checksum is covered: flip one bit at a time.
    let header_len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    for at in (16 + header_len..bytes.len()).step_by(7) {
        let mut b = bytes.clone();
        b[at] ^= 0x10;
        assert!(refused(&b).contains("damaged"), "byte {at}");
    }
    let mut other = bytes.clone();
    other[..8].copy_from_slice(b"GGUF\0\0\0\0");
    assert!(refused(&other).contains("not a session file"));
    let mut newer = bytes.clone();
    newer[8..12].copy_from_slice(&2u32.to_le_bytes());
    assert!(refused(&newer).contains("version 2"));
}

#[test]
fn headers_that_describe_impossible_sizes_are_refused_before_reading_the_body() {
    let with = |edit: &dyn Fn(&mut SessionHeader)| {
        let mut h = sample(false).header;
        edit(&mut h);
        let json = serde_json::to_vec(&h).unwrap();
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(json.len() as u32).to_le_bytes());
        b.extend_from_slice(&json);
        decode(&b).unwrap_err().to_string()
    };
    assert!(with(&|h| {
        h.tokens = MAX_TOKENS + 1;
        h.positions = h.tokens + 1
    })
    .contains("larger than"));
    assert!(with(&|h| h.block_bytes = usize::MAX / 2).contains("larger than"));
    assert!(with(&|h| h.state_values = usize::MAX).contains("larger than"));
    assert!(with(&|h| h.block_size = 0).contains("block size is 0"));
    assert!(with(&|h| h.positions = 100).contains("positions"));
    assert!(with(&|h| {
        h.virtual_tokens = usize::MAX;
        h.positions = 0
    })
    .contains("overflow"));
    assert!(with(&|h| h.block_bytes = 0).contains("0 bytes"));
    // A header that claims more bytes than the limit.
    let mut b = MAGIC.to_vec();
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(decode(&b).unwrap_err().to_string().contains("limit"));
    // Fields this version does not know are not skipped.
    let mut v = serde_json::to_value(sample(false).header).unwrap();
    v["compression"] = serde_json::json!("zstd");
    assert!(serde_json::from_value::<SessionHeader>(v).is_err());
}

#[test]
fn only_regular_files_are_read_and_failed_writes_leave_nothing() {
    let d = dir();
    assert!(read(d.path()).unwrap_err().to_string().contains("not a regular file"));
    assert!(read(&d.path().join("missing")).unwrap_err().to_string().contains("no such file"));
    #[cfg(unix)]
    {
        let fifo = d.path().join("fifo");
        if std::process::Command::new("mkfifo").arg(&fifo).status().is_ok_and(|s| s.success()) {
            assert!(read(&fifo).unwrap_err().to_string().contains("not a regular file"));
        }
    }
    let bytes = encode(&sample(false)).unwrap();
    assert!(write_atomic(&d.path().join("no/such/dir/s"), &bytes).is_err());
    assert!(write_atomic(d.path(), &bytes).unwrap_err().to_string().contains("directory"));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let ro = d.path().join("ro");
        std::fs::create_dir(&ro).unwrap();
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
        // Root may write anyway; then the save simply succeeds.
        if std::fs::write(ro.join("probe"), b"x").is_err() {
            assert!(write_atomic(&ro.join("s"), &bytes).is_err());
            assert_eq!(std::fs::read_dir(&ro).unwrap().count(), 0);
        }
    }
}

#[test]
fn a_save_removes_the_temporary_files_killed_saves_left_and_nothing_else() {
    let d = dir();
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    let make = |name: &str, old: bool| {
        let p = d.path().join(name);
        let f = std::fs::File::create(&p).unwrap();
        if old {
            f.set_modified(hour_ago).unwrap();
        }
        p
    };
    // No process has an id this large (Linux caps them at 2^22).
    let dead = make(".s.session.999999999.tmp", true);
    let fresh = make(".s.session.999999998.tmp", false);
    let live = make(".s.session.1.tmp", true);
    let other = make(".other.session.999999999.tmp", true);
    let odd = make(".s.session.x1.tmp", true);
    std::fs::create_dir(d.path().join(".s.session.999999997.tmp")).unwrap();
    write_atomic(&d.path().join("s.session"), &encode(&sample(false)).unwrap()).unwrap();
    assert!(!dead.exists(), "a dead process's old temporary file is removed");
    #[cfg(target_os = "linux")]
    assert!(live.exists(), "process 1 is alive");
    for p in [&fresh, &other, &odd] {
        assert!(p.exists(), "{} stays", p.display());
    }
    assert!(d.path().join(".s.session.999999997.tmp").is_dir());
    assert!(read(&d.path().join("s.session")).is_ok());
}

#[test]
fn the_fuzzing_seed_is_a_valid_file() {
    // fuzz/corpus/session_file/seed-valid (written by hand to this format): kept valid so the
    // fuzzer starts from a file that gets past every check.
    let seed = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/corpus/session_file/seed-valid")).unwrap();
    let f = decode(&seed).unwrap();
    assert_eq!((f.header.positions, f.cache.blocks.len(), f.tokens.len()), (6, 2, 6));
}
