//! The file a saved session lives in: its format, written atomically, read with limits.
//!
//! Design note
//! -----------
//! * Layout, little-endian: the 8-byte [`MAGIC`], a `u32` [`VERSION`], a `u32` header length
//!   and the header (JSON: what the session was made with and how the rest is sized), then
//!   the token stream (`u32` each), the cache blocks (each `block_bytes`, see
//!   `kv::image`), the recurrent state (`f32` each, when the model has one), and last a CRC-32
//!   of everything before it.
//! * The size of every part follows from the header, with checked arithmetic, and the file
//!   must be exactly that long: a truncated or padded file is refused before its body is
//!   read, a flipped bit by the checksum. The header is at most [`MAX_HEADER_BYTES`], the
//!   stream at most [`MAX_TOKENS`] tokens, a block at most [`MAX_BLOCK_BYTES`].
//! * [`write_atomic`] writes a temporary file beside the target, syncs it, renames it over the
//!   target and syncs the directory: a crash leaves the old file or the new one, never a mix.
//!   A process killed mid-save leaves its temporary file (`.<name>.<pid>.tmp`): the next save
//!   to the same name removes those of processes that are gone.
//! * Whether a file fits the runtime that reads it (same model, pool format, experts) is the
//!   caller's check: this module only guarantees that what it returns is what was written.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::kv::image::TableImage;

/// The first bytes of a session file.
pub const MAGIC: &[u8; 8] = b"EXRTSESS";
/// The format version this build writes and reads.
pub const VERSION: u32 = 1;
/// Largest header.
pub const MAX_HEADER_BYTES: usize = 64 << 20;
/// Longest token stream.
pub const MAX_TOKENS: usize = 1 << 24;
/// Largest cache block image.
pub const MAX_BLOCK_BYTES: usize = 1 << 30;
/// Longest recurrent state, in values.
pub const MAX_STATE_VALUES: usize = 1 << 30;
/// Directory entries a save looks through for temporary files left by killed saves.
const MAX_TEMP_SCAN: usize = 10_000;
/// A temporary file younger than this is never taken for a dead save's (a process of another
/// PID namespace may be writing it; a save takes seconds).
const TEMP_MIN_AGE: std::time::Duration = std::time::Duration::from_secs(600);

/// What a session was made with, and how the file's body is sized.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionHeader {
    /// The model's fingerprint (see the caller).
    pub model: String,
    /// The pool's format (`f32`, `q8_0`, ...) and block size.
    pub kv_format: String,
    pub block_size: usize,
    /// Bytes of one block's image.
    pub block_bytes: usize,
    /// Positions the cache holds (virtual tokens, then the stream; at most all of them).
    pub positions: usize,
    /// Tokens of the stream (cached, in order).
    pub tokens: usize,
    /// The last sampled token, not evaluated yet.
    pub pending: Option<u32>,
    /// Prompt-tuning virtual tokens at the start of the cache.
    pub virtual_tokens: usize,
    /// Values of the recurrent state (0 without one).
    pub state_values: usize,
    /// The experts the cache was computed under: `[name, fingerprint]`.
    pub experts: Vec<(String, String)>,
    /// The session's own data (history, system prompt, options), as the binding wrote it.
    pub session: serde_json::Value,
}

/// A session file's contents.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionFile {
    pub header: SessionHeader,
    pub tokens: Vec<u32>,
    pub cache: TableImage,
}

fn invalid(m: impl Into<String>) -> EngineError {
    EngineError::InvalidArgument(m.into())
}

/// Blocks of `block_size` positions that `positions` fill.
fn block_count(h: &SessionHeader) -> Result<usize> {
    if h.block_size == 0 {
        return Err(invalid("the session file's block size is 0"));
    }
    Ok(h.positions.div_ceil(h.block_size))
}

/// The body's length in bytes (tokens, blocks, state), checked.
fn body_len(h: &SessionHeader) -> Result<usize> {
    let too_big = || invalid("the session file's header describes a body larger than this engine reads");
    if h.tokens > MAX_TOKENS || h.block_bytes > MAX_BLOCK_BYTES || h.state_values > MAX_STATE_VALUES {
        return Err(too_big());
    }
    let blocks = block_count(h)?.checked_mul(h.block_bytes).ok_or_else(too_big)?;
    h.tokens
        .checked_mul(4)
        .and_then(|t| t.checked_add(blocks))
        .and_then(|n| n.checked_add(h.state_values.checked_mul(4)?))
        .ok_or_else(too_big)
}

/// The file's bytes for `f` (checked for consistency first).
pub fn encode(f: &SessionFile) -> Result<Vec<u8>> {
    let h = &f.header;
    let consistent = f.tokens.len() == h.tokens
        && f.cache.len == h.positions
        && f.cache.blocks.len() == block_count(h)?
        && f.cache.blocks.iter().all(|b| b.len() == h.block_bytes)
        && f.cache.state.as_ref().map_or(0, Vec::len) == h.state_values;
    if !consistent {
        return Err(EngineError::Internal("a session image disagrees with its own header".into()));
    }
    let header = serde_json::to_vec(h).map_err(|e| EngineError::Internal(format!("session header: {e}")))?;
    if header.len() > MAX_HEADER_BYTES {
        return Err(invalid(format!("the session's header is {} bytes; at most {MAX_HEADER_BYTES} are written", header.len())));
    }
    let mut out = Vec::new();
    let total = 16 + header.len() + body_len(h)? + 4;
    out.try_reserve_exact(total).map_err(|_| EngineError::OutOfMemory(format!("a session file of {total} bytes")))?;
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    f.tokens.iter().for_each(|t| out.extend_from_slice(&t.to_le_bytes()));
    f.cache.blocks.iter().for_each(|b| out.extend_from_slice(b));
    f.cache.state.iter().flatten().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// Reads the session file at `path` (a regular file of exactly the size its header gives).
pub fn read(path: &Path) -> Result<SessionFile> {
    let name = || path.display().to_string();
    let len =
        crate::files::regular_file_len(path).map_err(|e| invalid(format!("cannot read the session file {}: {e}", name())))?;
    let mut file = std::fs::File::open(path).map_err(|e| invalid(format!("cannot open the session file {}: {e}", name())))?;
    let mut head = [0u8; 16];
    file.read_exact(&mut head).map_err(|_| invalid(format!("{} is not a session file (too short)", name())))?;
    let header_len = check_prefix(&head, &name())?;
    let mut header = Vec::new();
    (&mut file).take(header_len as u64).read_to_end(&mut header).map_err(|e| invalid(format!("{}: {e}", name())))?;
    if header.len() != header_len {
        return Err(invalid(format!("the session file {} is truncated", name())));
    }
    let h = parse_header(&header, &name())?;
    let expected = 16u64 + header_len as u64 + body_len(&h)? as u64 + 4;
    if len != expected {
        return Err(invalid(format!(
            "the session file {} is {len} bytes; its header describes {expected} (truncated or altered)",
            name()
        )));
    }
    let mut rest = Vec::new();
    let n = (expected - 16 - header_len as u64) as usize;
    rest.try_reserve_exact(n).map_err(|_| EngineError::OutOfMemory(format!("a session file of {len} bytes")))?;
    (&mut file).take(n as u64).read_to_end(&mut rest).map_err(|e| invalid(format!("{}: {e}", name())))?;
    if rest.len() != n {
        return Err(invalid(format!("the session file {} changed while it was read", name())));
    }
    let mut crc = crc32fast::Hasher::new();
    crc.update(&head);
    crc.update(&header);
    crc.update(&rest[..n - 4]);
    let stored = u32::from_le_bytes([rest[n - 4], rest[n - 3], rest[n - 2], rest[n - 1]]);
    if crc.finalize() != stored {
        return Err(invalid(format!("the session file {} is damaged (its checksum does not match)", name())));
    }
    Ok(split_body(h, &rest[..n - 4]))
}

/// The file's bytes in memory (the same checks as [`read`]).
pub fn decode(bytes: &[u8]) -> Result<SessionFile> {
    let name = "the session data";
    let head: &[u8; 16] =
        bytes.get(..16).and_then(|h| h.try_into().ok()).ok_or_else(|| invalid("not a session file (too short)"))?;
    let header_len = check_prefix(head, name)?;
    let header = bytes.get(16..16 + header_len).ok_or_else(|| invalid("the session data is truncated"))?;
    let h = parse_header(header, name)?;
    let expected = 16 + header_len + body_len(&h)? + 4;
    if bytes.len() != expected {
        return Err(invalid(format!("the session data is {} bytes; its header describes {expected}", bytes.len())));
    }
    let stored = u32::from_le_bytes(bytes[expected - 4..].try_into().expect("4 bytes"));
    if crc32fast::hash(&bytes[..expected - 4]) != stored {
        return Err(invalid("the session data is damaged (its checksum does not match)"));
    }
    Ok(split_body(h, &bytes[16 + header_len..expected - 4]))
}

/// The header length the first 16 bytes give, after checking the magic and the version.
fn check_prefix(head: &[u8; 16], name: &str) -> Result<usize> {
    if &head[..8] != MAGIC {
        return Err(invalid(format!("{name} is not a session file")));
    }
    let version = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
    if version != VERSION {
        return Err(invalid(format!("{name} is a session file of format version {version}; this build reads version {VERSION}")));
    }
    let n = u32::from_le_bytes([head[12], head[13], head[14], head[15]]) as usize;
    if n > MAX_HEADER_BYTES {
        return Err(invalid(format!("{name}: a header of {n} bytes is larger than the {MAX_HEADER_BYTES}-byte limit")));
    }
    Ok(n)
}

fn parse_header(bytes: &[u8], name: &str) -> Result<SessionHeader> {
    let h: SessionHeader = serde_json::from_slice(bytes).map_err(|e| invalid(format!("{name}: the header is not valid: {e}")))?;
    if h.positions > h.virtual_tokens.checked_add(h.tokens).ok_or_else(|| invalid("header sizes overflow"))? {
        return Err(invalid(format!(
            "{name}: the header gives {} cached positions for {} virtual and {} stream tokens",
            h.positions, h.virtual_tokens, h.tokens
        )));
    }
    if h.block_bytes == 0 && h.positions > 0 {
        return Err(invalid(format!("{name}: the header gives blocks of 0 bytes")));
    }
    Ok(h)
}

/// Splits a body the header's sizes were checked against.
fn split_body(h: SessionHeader, body: &[u8]) -> SessionFile {
    let (tokens, rest) = body.split_at(h.tokens * 4);
    let tokens = tokens.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let (blocks, state) = rest.split_at(rest.len() - h.state_values * 4);
    let blocks = if h.block_bytes == 0 { Vec::new() } else { blocks.chunks_exact(h.block_bytes).map(<[u8]>::to_vec).collect() };
    let state =
        (h.state_values > 0).then(|| state.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect());
    let cache = TableImage { len: h.positions, blocks, state };
    SessionFile { header: h, tokens, cache }
}

/// Writes `bytes` to `path` atomically (see the module note). The directory must exist.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    // A path that cannot be a file is the caller's argument; the rest (a full disk, a
    // read-only or unwritable directory) is the file system's.
    let fail = |what: &str, e: std::io::Error| {
        let m = format!("cannot save the session to {}: {what}: {e}", path.display());
        match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidFilename => invalid(m),
            _ => EngineError::Io(m),
        }
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = path.file_name().ok_or_else(|| invalid(format!("{} names no file", path.display())))?;
    if path.is_dir() {
        return Err(invalid(format!("cannot save the session to {}: it is a directory", path.display())));
    }
    let tmp = dir.join(format!(".{}.{}.tmp", file_name.to_string_lossy(), std::process::id()));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp).map_err(|e| fail("create", e))?;
        f.write_all(bytes).map_err(|e| fail("write", e))?;
        f.sync_all().map_err(|e| fail("sync", e))?;
        std::fs::rename(&tmp, path).map_err(|e| fail("rename", e))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return written;
    }
    // The rename itself is durable once the directory is synced (where directories open).
    if let Ok(d) = std::fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    remove_left_temps(&dir, &file_name.to_string_lossy());
    Ok(())
}

/// Removes the temporary files that saves to `file_name` in `dir` left when their process was
/// killed: `.<file_name>.<pid>.tmp`, older than [`TEMP_MIN_AGE`], of a process that is gone
/// (where `/proc` says; elsewhere, older than a day). Best effort: what cannot be listed or
/// removed stays.
fn remove_left_temps(dir: &Path, file_name: &str) {
    let (prefix, me) = (format!(".{file_name}."), std::process::id());
    let proc_fs = Path::new("/proc/self").exists();
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten().take(MAX_TEMP_SCAN) {
        let name = e.file_name();
        let pid = name.to_str().and_then(|n| n.strip_prefix(&prefix)?.strip_suffix(".tmp")?.parse::<u32>().ok());
        let Some(pid) = pid.filter(|&p| p != me) else { continue };
        let Ok(meta) = e.metadata() else { continue };
        let age = meta.modified().ok().and_then(|t| t.elapsed().ok()).unwrap_or_default();
        let gone = if proc_fs { !Path::new(&format!("/proc/{pid}")).exists() } else { age > TEMP_MIN_AGE * 144 };
        if meta.is_file() && age > TEMP_MIN_AGE && gone {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

#[cfg(test)]
#[path = "session_file_tests.rs"]
mod tests;
