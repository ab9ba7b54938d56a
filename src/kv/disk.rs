//! The disk tier of the prefix cache: full blocks kept in files, found again by a runtime
//! started later on the same model (issue 52, part 2).
//!
//! Design note
//! -----------
//! * Keys. The prefix index's content ids live as long as the process, so the disk tier keys a
//!   block by a chained SHA-256 instead: a group's chain starts at
//!   `H("root", namespace, expert set)` and each full block's key is `H("block", parent key,
//!   its position keys)`. The namespace hashes the model's fingerprint (its files and the load
//!   options that shape the cache) with the pool's layout (format, block size, bytes per
//!   block), so a block is only ever found by the model and pool that computed it. The expert
//!   set is a hash of the adapters' fingerprints (none: zeros); sets without one are not kept.
//! * Files: `dir/ab/<64 hex>.kvb`, one block each: a magic, the key, the image's length, the
//!   image ([`super::image`], the pool's own dtype) and a SHA-256 over all of it. A file is
//!   written to a temp name, synced and renamed, so readers see a whole file or none. A read
//!   checks the size before reading, then the magic, the key and the checksum: a torn, foreign
//!   or swapped file is skipped (and removed), never used.
//! * When: a block is offered as soon as it is full and registered (write-through), so what a
//!   session computed survives a quit or a crash, not only an eviction. The engine thread takes
//!   the block's image (a copy) and hands it to a writer thread through a bounded queue; when
//!   the queue is full the block is dropped and counted. Nothing on the engine thread waits
//!   for the disk.
//! * Reads happen on the engine thread at admission, on a prompt's first block the RAM index
//!   misses (`KvManager::revive_from_disk`): the file is read into a fresh block, registered,
//!   and the prompt then matches it as any cached block.
//! * Room: the writer keeps the directory within `maxBytes`, removing the least recently used
//!   files (a read touches a file's mtime) down to 90% of it. Eviction runs under an
//!   exclusive lock file (`.evict.lock`, pid and host inside; one whose process is gone or
//!   untouched for a minute is taken over), the download cache's discipline, so two
//!   processes sharing the directory never evict at once; writes need no lock (renames are
//!   atomic and two writers of one key write the same bytes). Each writer counts the
//!   directory again every 64 writes, so what other processes wrote is seen.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use crate::error::{EngineError, Result};

/// A block's key on disk (see the module note).
pub type DiskKey = [u8; 32];

const MAGIC: &[u8; 8] = b"ERKVBLK1";
/// Magic, key and image length before the image; the checksum after it.
const HEADER: usize = 8 + 32 + 8;
const TRAILER: usize = 32;
/// Bytes of block images the writer's queue may hold.
const QUEUE_BYTES: usize = 64 << 20;
/// Keys this process wrote, queued or read are remembered (not offered again) up to this many.
const MAX_KNOWN: usize = 1 << 20;
/// Writes between two counts of the directory's bytes (other processes may share it).
const RESCAN_EVERY: usize = 64;
/// Files a scan of the directory looks at, at most.
const MAX_SCAN: usize = 4 << 20;
/// A lock untouched this long has lost its owner.
const LOCK_STALE: Duration = Duration::from_secs(60);
/// Temp files older than this were left by a writer that died.
const TEMP_STALE: Duration = Duration::from_secs(600);
const LOCK_NAME: &str = ".evict.lock";

/// `kvCache.disk`: where blocks go and how many bytes of files they may take.
#[derive(Clone, Debug)]
pub struct DiskOptions {
    pub dir: PathBuf,
    pub max_bytes: u64,
}

/// What the tier did, since load.
#[derive(Debug, Default)]
pub struct DiskCounters {
    /// Blocks written to files.
    pub written: AtomicU64,
    /// Blocks not written because the writer's queue was full.
    pub dropped: AtomicU64,
    /// Blocks whose write failed (a full disk, a read-only directory).
    pub failed: AtomicU64,
    /// Blocks read back into the pool.
    pub read: AtomicU64,
    /// Files skipped on read: the wrong size, key or checksum, or unreadable.
    pub rejected: AtomicU64,
    /// Files removed to stay within `maxBytes`.
    pub evicted: AtomicU64,
    /// Bytes of block files in the directory, as the writer last counted.
    pub bytes: AtomicU64,
}

struct Job {
    key: DiskKey,
    image: Vec<u8>,
}

/// The tier, owned by the KV manager (engine thread); its writer thread owns the writes.
pub struct DiskTier {
    dir: PathBuf,
    namespace: DiskKey,
    image_bytes: usize,
    tx: Option<SyncSender<Job>>,
    queued: Arc<AtomicUsize>,
    capacity: usize,
    writer: Option<JoinHandle<()>>,
    known: HashSet<DiskKey>,
    counters: Arc<DiskCounters>,
}

fn file_len(image_bytes: usize) -> usize {
    HEADER + image_bytes + TRAILER
}

fn hex(key: &DiskKey) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where `key`'s file lives under `dir`.
fn block_path(dir: &Path, key: &DiskKey) -> PathBuf {
    let h = hex(key);
    dir.join(&h[..2]).join(format!("{h}.kvb"))
}

fn io(what: &str, dir: &Path, e: std::io::Error) -> EngineError {
    EngineError::Io(format!("kvCache.disk: cannot {what} {}: {e}", dir.display()))
}

impl DiskTier {
    /// Opens (creating it) the tier in `opts.dir` for blocks of `image_bytes` bytes under
    /// `namespace`, and starts its writer. Refuses a `maxBytes` that cannot hold one block.
    pub fn open(opts: &DiskOptions, namespace: DiskKey, image_bytes: usize, counters: Arc<DiskCounters>) -> Result<Self> {
        let len = file_len(image_bytes) as u64;
        if opts.max_bytes < len {
            return Err(EngineError::InvalidArgument(format!(
                "kvCache.disk.maxBytes ({}) is smaller than one block's file ({len} bytes)",
                opts.max_bytes
            )));
        }
        fs::create_dir_all(&opts.dir).map_err(|e| io("create", &opts.dir, e))?;
        if !fs::metadata(&opts.dir).map_err(|e| io("read", &opts.dir, e))?.is_dir() {
            return Err(EngineError::InvalidArgument(format!("kvCache.disk.dir {} is not a directory", opts.dir.display())));
        }
        let capacity = (QUEUE_BYTES / image_bytes.max(1)).max(4);
        let (tx, rx) = sync_channel(capacity);
        let queued = Arc::new(AtomicUsize::new(0));
        let writer = Writer { dir: opts.dir.clone(), max_bytes: opts.max_bytes, file_len: len, counters: counters.clone() };
        let q = queued.clone();
        let writer = std::thread::Builder::new()
            .name("expert-runtime-kv-disk".into())
            .spawn(move || writer.run(rx, &q))
            .map_err(|e| EngineError::Internal(format!("cannot start the KV disk writer: {e}")))?;
        Ok(Self {
            dir: opts.dir.clone(),
            namespace,
            image_bytes,
            tx: Some(tx),
            queued,
            capacity,
            writer: Some(writer),
            known: HashSet::new(),
            counters,
        })
    }

    /// The namespace for a model fingerprint and a pool layout (see the module note).
    pub fn namespace(model_fingerprint: &str, layout: &str) -> DiskKey {
        let mut h = Sha256::new();
        h.update(b"expert-runtime kv disk v1\0");
        h.update(model_fingerprint.as_bytes());
        h.update(b"\0");
        h.update(layout.as_bytes());
        h.finalize().into()
    }

    /// The key before table group `group`'s first block, under the expert set `experts`.
    pub fn root(&self, group: usize, experts: &DiskKey) -> DiskKey {
        let mut h = Sha256::new();
        h.update(b"root");
        h.update(self.namespace);
        h.update((group as u64).to_le_bytes());
        h.update(experts);
        h.finalize().into()
    }

    /// The key of the block holding `tokens` after the block keyed `parent`.
    pub fn chain(parent: &DiskKey, tokens: &[u32]) -> DiskKey {
        let mut h = Sha256::new();
        h.update(b"block");
        h.update(parent);
        for t in tokens {
            h.update(t.to_le_bytes());
        }
        h.finalize().into()
    }

    /// Whether `key` was written, queued or read by this process already.
    pub fn knows(&self, key: &DiskKey) -> bool {
        self.known.contains(key)
    }

    fn remember(&mut self, key: DiskKey) {
        if self.known.len() >= MAX_KNOWN {
            self.known.clear();
        }
        self.known.insert(key);
    }

    /// Hands block `key` to the writer; `image` is taken only when the queue has room (a
    /// full queue drops the block, counted). Never waits.
    pub fn offer(&mut self, key: DiskKey, image: impl FnOnce() -> Result<Vec<u8>>) {
        if self.knows(&key) {
            return;
        }
        let Some(tx) = &self.tx else { return };
        if self.queued.load(Ordering::Acquire) >= self.capacity {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let image = match image() {
            Ok(i) if i.len() == self.image_bytes => i,
            _ => {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        self.queued.fetch_add(1, Ordering::AcqRel);
        match tx.try_send(Job { key, image }) {
            Ok(()) => self.remember(key),
            Err(_) => {
                self.queued.fetch_sub(1, Ordering::AcqRel);
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The image stored under `key`, or `None` (no file, or one that fails a check: counted
    /// and removed).
    pub fn read(&mut self, key: &DiskKey) -> Option<Vec<u8>> {
        let path = block_path(&self.dir, key);
        match read_block(&path, key, self.image_bytes) {
            Ok(Some(image)) => {
                self.counters.read.fetch_add(1, Ordering::Relaxed);
                self.remember(*key);
                Some(image)
            }
            Ok(None) => None,
            Err(()) => {
                self.counters.rejected.fetch_add(1, Ordering::Relaxed);
                let _ = fs::remove_file(&path);
                None
            }
        }
    }
}

impl Drop for DiskTier {
    /// Lets the writer finish what is queued (bounded by the queue), then joins it.
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// Reads and checks `path`: `Ok(None)` when there is no such file, `Err` when there is one
/// that must not be used.
fn read_block(path: &Path, key: &DiskKey, image_bytes: usize) -> std::result::Result<Option<Vec<u8>>, ()> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(_) => return Err(()),
    };
    let len = file_len(image_bytes);
    if !meta.is_file() || meta.len() != len as u64 {
        return Err(());
    }
    let mut file = open_regular(path).map_err(|_| ())?;
    let mut buf = vec![0u8; len];
    file.read_exact(&mut buf).map_err(|_| ())?;
    let (body, sum) = buf.split_at(len - TRAILER);
    let ok = &body[..8] == MAGIC
        && &body[8..40] == key
        && body[40..48] == (image_bytes as u64).to_le_bytes()
        && Sha256::digest(body).as_slice() == sum;
    if !ok {
        return Err(());
    }
    // Recently used: eviction takes the oldest first.
    let _ = file.set_modified(SystemTime::now());
    buf.truncate(len - TRAILER);
    buf.drain(..HEADER);
    Ok(Some(buf))
}

/// Opens `path` for reading without following a link or waiting on a FIFO, and only if it is
/// a regular file.
fn open_regular(path: &Path) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    let f = o.open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(f)
}

/// The writer thread's side.
struct Writer {
    dir: PathBuf,
    max_bytes: u64,
    file_len: u64,
    counters: Arc<DiskCounters>,
}

impl Writer {
    fn run(self, rx: Receiver<Job>, queued: &AtomicUsize) {
        let mut total = self.scan().map_or(0, |s| s.total);
        self.counters.bytes.store(total, Ordering::Relaxed);
        for (n, job) in rx.into_iter().enumerate() {
            // Other processes sharing the directory write too: count it again now and then.
            if n > 0 && n % RESCAN_EVERY == 0 {
                total = self.scan().map_or(total, |s| s.total);
            }
            let written = write_block(&self.dir, &job.key, &job.image);
            if let Ok(true) = written {
                total += self.file_len;
            }
            if total > self.max_bytes {
                total = self.evict().unwrap_or(total);
            }
            // Counted once the job is wholly done (its eviction included).
            self.counters.bytes.store(total, Ordering::Relaxed);
            match written {
                Ok(true) => self.counters.written.fetch_add(1, Ordering::Relaxed),
                Ok(false) => 0,
                Err(_) => self.counters.failed.fetch_add(1, Ordering::Relaxed),
            };
            queued.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The block files (oldest first) and their bytes; removes temp files left by a writer
    /// that died.
    fn scan(&self) -> std::io::Result<Scan> {
        let mut files = Vec::new();
        let mut total = 0u64;
        for sub in fs::read_dir(&self.dir)?.flatten() {
            let name = sub.file_name();
            let name = name.to_string_lossy();
            if name.len() != 2 || !name.bytes().all(|b| b.is_ascii_hexdigit()) || !sub.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            for f in fs::read_dir(sub.path())?.flatten() {
                if files.len() >= MAX_SCAN {
                    break;
                }
                let Ok(meta) = f.metadata() else { continue };
                let name = f.file_name();
                let name = name.to_string_lossy();
                let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                if name.contains(".tmp") {
                    if modified.elapsed().is_ok_and(|age| age > TEMP_STALE) {
                        let _ = fs::remove_file(f.path());
                    }
                    continue;
                }
                if meta.is_file() && name.ends_with(".kvb") {
                    total += meta.len();
                    files.push((modified, meta.len(), f.path()));
                }
            }
        }
        files.sort();
        Ok(Scan { files, total })
    }

    /// Removes the least recently used files down to 90% of `max_bytes`, under the lock;
    /// returns the bytes left (`None`: another process holds the lock, or the scan failed).
    fn evict(&self) -> Option<u64> {
        let _lock = EvictLock::take(&self.dir)?;
        let scan = self.scan().ok()?;
        let low = self.max_bytes / 10 * 9;
        let mut total = scan.total;
        for (_, len, path) in scan.files {
            if total <= low {
                break;
            }
            if fs::remove_file(&path).is_ok() {
                total -= len;
                self.counters.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
        Some(total)
    }
}

struct Scan {
    files: Vec<(SystemTime, u64, PathBuf)>,
    total: u64,
}

/// Writes `key`'s file: `Ok(false)` when an intact one is there already (then only touched,
/// by the check that reads it); a damaged one is replaced.
fn write_block(dir: &Path, key: &DiskKey, image: &[u8]) -> std::io::Result<bool> {
    let path = block_path(dir, key);
    if fs::symlink_metadata(&path).is_ok() {
        if let Ok(Some(_)) = read_block(&path, key, image.len()) {
            return Ok(false);
        }
        let _ = fs::remove_file(&path);
    }
    fs::create_dir_all(path.parent().expect("a block path has a parent"))?;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let tmp = path.with_extension(format!("tmp{}.{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    let result = (|| {
        let mut body = Vec::with_capacity(file_len(image.len()));
        body.extend_from_slice(MAGIC);
        body.extend_from_slice(key);
        body.extend_from_slice(&(image.len() as u64).to_le_bytes());
        body.extend_from_slice(image);
        let sum = Sha256::digest(&body);
        body.extend_from_slice(&sum);
        let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(&body)?;
        f.sync_all()?;
        fs::rename(&tmp, &path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map(|()| true)
}

/// The directory's eviction lock, held while alive.
struct EvictLock(PathBuf);

impl EvictLock {
    /// Takes the lock, taking over one whose owner is gone; `None` while another holds it.
    fn take(dir: &Path) -> Option<Self> {
        let path = dir.join(LOCK_NAME);
        for _ in 0..2 {
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(mut f) => {
                    let _ = write!(f, "{}\n{}", std::process::id(), host());
                    return Some(Self(path));
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    if !abandoned(&path) {
                        return None;
                    }
                    let _ = fs::remove_file(&path);
                }
                Err(_) => return None,
            }
        }
        None
    }
}

impl Drop for EvictLock {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// Whether the lock at `path` lost its owner: untouched for [`LOCK_STALE`], or held by a
/// process of this host that no longer runs.
fn abandoned(path: &Path) -> bool {
    let Ok(meta) = fs::metadata(path) else { return true };
    if meta.modified().ok().and_then(|m| m.elapsed().ok()).is_some_and(|age| age > LOCK_STALE) {
        return true;
    }
    let mut text = String::new();
    if File::open(path).and_then(|f| f.take(256).read_to_string(&mut text)).is_err() {
        return false;
    }
    let mut lines = text.lines();
    let (Some(pid), Some(owner_host)) = (lines.next().and_then(|p| p.parse::<i32>().ok()), lines.next()) else {
        return false;
    };
    owner_host == host() && pid > 0 && !alive(pid)
}

#[cfg(unix)]
fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH) }
}

#[cfg(not(unix))]
fn alive(_pid: i32) -> bool {
    true
}

fn host() -> String {
    #[cfg(unix)]
    {
        let mut buf = [0u8; 256];
        // SAFETY: the buffer is valid for its length; the name is NUL-terminated on success.
        if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0 {
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            return String::from_utf8_lossy(&buf[..end]).into_owned();
        }
    }
    String::new()
}

#[cfg(test)]
#[path = "disk_tests.rs"]
mod tests;
