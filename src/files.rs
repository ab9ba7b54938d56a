//! Reading the files a user points us at, safely: only regular files (a named pipe would block
//! the open, a link to `/dev/zero` would be read until memory runs out), text files only up to
//! a size cap, and the machine's memory, which bounds what a file may make us allocate.

use std::io::Read;
use std::path::Path;

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
}
