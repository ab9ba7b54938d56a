//! Reading the files a user points us at, safely: only regular files (a named pipe would block
//! the open, a link to `/dev/zero` would be read until memory runs out), text files only up to
//! a size cap, and the machine's memory, which bounds what a file may make us allocate.

use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Largest JSON / template / tokenizer file read into memory (tokenizer.json files of large
/// vocabularies are ~10–20 MB).
pub const MAX_TEXT_FILE_BYTES: u64 = 256 << 20;

/// Why a file could not be read; callers wrap it in their own error kind, naming the file.
#[derive(Debug)]
pub enum ReadError {
    NotFound,
    /// A directory, pipe, socket or device.
    NotRegular,
    TooLarge(u64),
    Io(std::io::Error),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::NotFound => write!(f, "no such file"),
            ReadError::NotRegular => write!(f, "not a regular file"),
            ReadError::TooLarge(n) => write!(f, "{n} bytes is larger than the {MAX_TEXT_FILE_BYTES}-byte limit"),
            ReadError::Io(e) => write!(f, "{e}"),
        }
    }
}

/// Checks that `path` is a regular file (links followed) and returns its size. Never opens it.
pub fn regular_file_len(path: &Path) -> Result<u64, ReadError> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(m.len()),
        Ok(_) => Err(ReadError::NotRegular),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(ReadError::NotFound),
        Err(e) => Err(ReadError::Io(e)),
    }
}

/// A UTF-8 text file, read only when it is a regular file of at most
/// [`MAX_TEXT_FILE_BYTES`]; the read itself stops at the cap too (the file may grow).
pub fn read_text(path: &Path) -> Result<String, ReadError> {
    let len = regular_file_len(path)?;
    if len > MAX_TEXT_FILE_BYTES {
        return Err(ReadError::TooLarge(len));
    }
    let f = std::fs::File::open(path).map_err(ReadError::Io)?;
    let mut text = String::new();
    f.take(MAX_TEXT_FILE_BYTES + 1).read_to_string(&mut text).map_err(ReadError::Io)?;
    if text.len() as u64 > MAX_TEXT_FILE_BYTES {
        return Err(ReadError::TooLarge(text.len() as u64));
    }
    Ok(text)
}

/// The files whose bytes make up what `path` names: `path` itself when it is not a directory,
/// else the directory's regular files whose names `keep` accepts, in name order.
pub fn content_files(path: &Path, keep: impl Fn(&str) -> bool) -> std::io::Result<Vec<PathBuf>> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && keep(p.file_name().and_then(|n| n.to_str()).unwrap_or("")))
        .collect();
    files.sort();
    Ok(files)
}

/// Feeds each file's name and then its bytes, read 1 MiB at a time, to `h`, in the order
/// given. Only regular files are opened (a named pipe would block the read); the error names
/// the file that failed.
pub fn hash_files(h: &mut Sha256, files: &[PathBuf]) -> Result<(), (PathBuf, ReadError)> {
    let mut buf = vec![0u8; 1 << 20];
    for f in files {
        let fail = |e: ReadError| (f.clone(), e);
        regular_file_len(f).map_err(fail)?;
        h.update(f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default().as_bytes());
        let mut file = std::fs::File::open(f).map_err(|e| fail(ReadError::Io(e)))?;
        loop {
            let n = file.read(&mut buf).map_err(|e| fail(ReadError::Io(e)))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
    }
    Ok(())
}

/// The machine's physical memory in bytes (Linux `/proc/meminfo`; `None` elsewhere).
pub fn total_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// The machine's available memory (`MemAvailable`: free, plus caches it can reclaim), where
/// the system says.
pub fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_are_read() {
        let dir = std::env::temp_dir().join(format!("er-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("a.json");
        std::fs::write(&f, "{}").unwrap();
        assert_eq!(read_text(&f).unwrap(), "{}");
        assert!(matches!(read_text(&dir), Err(ReadError::NotRegular)));
        assert!(matches!(read_text(&dir.join("missing")), Err(ReadError::NotFound)));
        #[cfg(unix)]
        {
            assert!(matches!(read_text(Path::new("/dev/zero")), Err(ReadError::NotRegular)));
            let link = dir.join("zero.json");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
            assert!(matches!(read_text(&link), Err(ReadError::NotRegular)));
            let fifo = dir.join("pipe.json");
            let _ = std::fs::remove_file(&fifo);
            let ok = std::process::Command::new("mkfifo").arg(&fifo).status().map(|s| s.success()).unwrap_or(false);
            if ok {
                // Must return at once rather than block in open().
                assert!(matches!(read_text(&fifo), Err(ReadError::NotRegular)));
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(total_memory().is_none_or(|m| m > 0));
    }

    #[test]
    fn content_files_are_hashed_by_name_then_bytes_in_order() {
        let dir = std::env::temp_dir().join(format!("er-hash-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub.json")).unwrap();
        std::fs::write(dir.join("b.json"), b"bee").unwrap();
        std::fs::write(dir.join("a.json"), vec![7u8; (1 << 20) + 3]).unwrap();
        std::fs::write(dir.join("skip.txt"), b"x").unwrap();
        let files = content_files(&dir, |n| n.ends_with(".json")).unwrap();
        assert_eq!(files, vec![dir.join("a.json"), dir.join("b.json")]); // the directory is left out
        let mut h = Sha256::new();
        hash_files(&mut h, &files).unwrap();
        let mut want = Sha256::new();
        want.update(b"a.json");
        want.update(vec![7u8; (1 << 20) + 3]);
        want.update(b"b.json");
        want.update(b"bee");
        assert_eq!(h.finalize(), want.finalize());
        assert_eq!(content_files(&dir.join("b.json"), |_| false).unwrap(), vec![dir.join("b.json")]);
        assert!(content_files(&dir.join("missing"), |_| true).is_ok_and(|f| f.len() == 1));
        let missing = [dir.join("missing")];
        assert!(matches!(hash_files(&mut Sha256::new(), &missing), Err((p, ReadError::NotFound)) if p == missing[0]));
        #[cfg(unix)]
        {
            let fifo = dir.join("pipe.bin");
            let ok = std::process::Command::new("mkfifo").arg(&fifo).status().map(|s| s.success()).unwrap_or(false);
            if ok {
                // Refused before the open, which would block until a writer came.
                assert!(matches!(hash_files(&mut Sha256::new(), &[fifo]), Err((_, ReadError::NotRegular))));
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
