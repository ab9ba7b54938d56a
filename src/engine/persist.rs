//! Sessions saved to a file and restored from one (issue 52, part 1).
//!
//! Design note
//! -----------
//! * Saving: the engine thread hands out the session's snapshot (`Command::SaveSession`: its
//!   stream, the images of the blocks its cache holds, its recurrent state), then a thread of
//!   its own encodes it with the session's history and writes the file atomically
//!   (`session_file`). Generation goes on meanwhile.
//! * Restoring: a thread of its own reads and checks the file (format, checksum, limits), checks
//!   it was made by this model ([`Engine::model_fingerprint`]), then the engine thread writes
//!   the blocks into a new session (`Command::RestoreSession`), evicting idle sessions for room
//!   as a request would. The session's next turn continues from the cache: nothing is
//!   evaluated again.
//! * The model fingerprint is a SHA-256 over the model's files (the GGUF, or a directory's
//!   config and weights) and the load options that change what the cache holds (device kind,
//!   compute dtype, quantization, RoPE scaling), computed once per runtime on first use.
//! * Experts: the file lists the experts the cache was computed under, by name and fingerprint
//!   (a SHA-256 over the adapter's files and scale, [`crate::experts::fingerprint`]), and the
//!   virtual positions prompt tuning put first. A restore needs each loaded under its name with
//!   the same fingerprint, and makes them the session's default set, so its next turn continues
//!   the cache.
//! * Not yet: models with sliding-window layers are refused (`kv::image`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use super::catch_panic;
use super::request::{Command, SessionShared, SessionSnapshot};
use super::session_file::{self, SessionFile, SessionHeader};
use super::{ContextShift, Engine, ExpertChoice, SessionHandle};
use crate::error::{EngineError, Result};
use crate::tokenizer::ChatMessage;

/// The session's own data a file keeps beside its cache.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SessionData {
    history: Vec<ChatMessage>,
    system: Option<String>,
}

/// The files whose bytes make a model at `path`: the file itself, or a directory's
/// `config.json` and weight files, in name order.
fn model_files(path: &Path) -> Result<Vec<PathBuf>> {
    crate::files::content_files(path, |name| name == "config.json" || name.ends_with(".safetensors") || name.ends_with(".gguf"))
        .map_err(|e| EngineError::Internal(format!("cannot list the model directory {}: {e}", path.display())))
}

/// A fingerprint of the model at `path` and of the load options that shape its cache (see
/// the module note): reads the model's files.
pub(super) fn fingerprint(i: &super::ModelInfo, path: &Path) -> std::result::Result<String, String> {
    let mut h = Sha256::new();
    let options = format!(
        "{}|{}|{}|{}|{:?}|{}|{}|{}",
        i.architecture, i.device, i.dtype, i.quantization, i.rope_scaling, i.vocab_size, i.num_layers, i.hidden_size
    );
    h.update(options.as_bytes());
    let files = model_files(path).map_err(|e| e.to_string())?;
    crate::files::hash_files(&mut h, &files).map_err(|(f, e)| format!("{}: {e}", f.display()))?;
    Ok(format!("sha256:{:x}", h.finalize()))
}

/// [`fingerprint`], remembered in `dir` (a disk tier's directory) under the model files' names,
/// sizes, inodes and modification and change times: a later load of the same, untouched files
/// does not read them again (a 600 MB GGUF takes 0.7 s to hash on 2 cores). A file replaced or
/// rewritten changes its inode or change time, which no caller can set back. A remembered
/// value that is not a fingerprint is ignored and computed again.
pub(super) fn fingerprint_remembered(i: &super::ModelInfo, path: &Path, dir: &Path) -> std::result::Result<String, String> {
    let mut h = Sha256::new();
    h.update(b"model files v1");
    for f in model_files(path).map_err(|e| e.to_string())? {
        let abs = std::fs::canonicalize(&f).map_err(|e| format!("{}: {e}", f.display()))?;
        let m = std::fs::metadata(&abs).map_err(|e| format!("{}: {e}", f.display()))?;
        h.update(abs.to_string_lossy().as_bytes());
        h.update(m.len().to_le_bytes());
        let nanos = |t: std::io::Result<std::time::SystemTime>| {
            t.ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos())
        };
        h.update(nanos(m.modified()).to_le_bytes());
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            h.update(m.ino().to_le_bytes());
            h.update(m.dev().to_le_bytes());
            h.update(m.ctime().to_le_bytes());
            h.update(m.ctime_nsec().to_le_bytes());
        }
    }
    let i_key = format!("{}|{}|{}|{}|{:?}", i.architecture, i.device, i.dtype, i.quantization, i.rope_scaling);
    h.update(i_key.as_bytes());
    let name = format!(".fingerprint-{:x}", h.finalize());
    let file = dir.join(&name);
    let valid = |s: &str| s.len() == 71 && s.starts_with("sha256:") && s[7..].bytes().all(|b| b.is_ascii_hexdigit());
    if let Ok(text) = std::fs::read_to_string(&file) {
        if valid(text.trim()) {
            return Ok(text.trim().to_string());
        }
    }
    let fp = fingerprint(i, path)?;
    // Best effort: a directory that cannot take it only costs the next load the hashing.
    let tmp = dir.join(format!("{name}.tmp{}", std::process::id()));
    if std::fs::write(&tmp, &fp).is_ok() && std::fs::rename(&tmp, &file).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    Ok(fp)
}

impl Engine {
    /// [`fingerprint`], computed once per runtime (at load when the prefix cache has a disk
    /// tier, on first use otherwise).
    pub fn model_fingerprint(&self) -> Result<String> {
        self.fingerprint
            .get_or_init(|| fingerprint(&self.info, &self.model_path))
            .clone()
            .map_err(|e| EngineError::Internal(format!("cannot fingerprint the model: {e}")))
    }

    /// Saves `session` (idle) to `path`; resolves when the file is in place.
    pub fn save_session(self: &Arc<Self>, session: &SessionHandle, path: &Path) -> tokio::sync::oneshot::Receiver<Result<()>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if session.shared.busy.load(Ordering::Acquire) {
            let _ = tx.send(Err(EngineError::SessionBusy("the session is generating; save it when the request ends".into())));
            return rx;
        }
        let (engine, session, path) = (self.clone(), session.clone(), path.to_path_buf());
        let spawned = crate::stack::untrusted_thread("expert-runtime-save").spawn(move || {
            let _ = tx.send(catch_panic(|| engine.save_blocking(&session, &path)));
        });
        if let Err(e) = spawned {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let _ = tx.send(Err(EngineError::Internal(format!("cannot start the session writer: {e}"))));
            return rx;
        }
        rx
    }

    fn save_blocking(&self, session: &SessionHandle, path: &Path) -> Result<()> {
        let model = self.model_fingerprint()?;
        let (stx, srx) = std::sync::mpsc::channel();
        self.send(Command::SaveSession {
            id: session.id,
            reply: Box::new(move |r| {
                let _ = stx.send(r);
            }),
        })?;
        let snap = srx.recv().map_err(|_| EngineError::Disposed("runtime".into()))??;
        let experts = self.saved_experts(&snap.experts)?;
        let history = session.shared.history.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let data = SessionData { history, system: session.shared.system.clone() };
        let header = SessionHeader {
            model,
            kv_format: snap.kv_format,
            block_size: snap.block_size,
            block_bytes: snap.block_bytes,
            positions: snap.cache.len,
            tokens: snap.tokens.len(),
            pending: snap.pending,
            virtual_tokens: snap.n_virtual,
            state_values: snap.cache.state.as_ref().map_or(0, Vec::len),
            experts,
            session: serde_json::to_value(data).map_err(|e| EngineError::Internal(format!("session data: {e}")))?,
        };
        let bytes = session_file::encode(&SessionFile { header, tokens: snap.tokens, cache: snap.cache })?;
        session_file::write_atomic(path, &bytes)
    }

    /// A new session from the file at `path` (see the module note).
    pub fn restore_session(
        self: &Arc<Self>,
        path: &Path,
        context_shift: ContextShift,
    ) -> tokio::sync::oneshot::Receiver<Result<SessionHandle>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (engine, path) = (self.clone(), path.to_path_buf());
        let spawned = crate::stack::untrusted_thread("expert-runtime-restore").spawn(move || {
            let _ = tx.send(catch_panic(|| engine.restore_blocking(&path, context_shift)));
        });
        if let Err(e) = spawned {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let _ = tx.send(Err(EngineError::Internal(format!("cannot start the session reader: {e}"))));
            return rx;
        }
        rx
    }

    fn restore_blocking(&self, path: &Path, context_shift: ContextShift) -> Result<SessionHandle> {
        let file = session_file::read(path)?;
        let h = &file.header;
        let model = self.model_fingerprint()?;
        if h.model != model {
            return Err(EngineError::InvalidArgument(format!(
                "the session file {} was saved by another model (or the same model loaded with other dtype, \
                 quantization or RoPE options): {} here, {} in the file",
                path.display(),
                model,
                h.model
            )));
        }
        let (experts, names) = self.restored_experts(&h.experts, h.virtual_tokens)?;
        let vocab = self.info.vocab_size as u32;
        if let Some(t) = file.tokens.iter().chain(&h.pending).find(|&&t| t >= vocab) {
            return Err(EngineError::InvalidArgument(format!(
                "the session file holds token {t}, outside this model's vocabulary of {vocab}"
            )));
        }
        let data: SessionData = serde_json::from_value(h.session.clone())
            .map_err(|e| EngineError::InvalidArgument(format!("the session file's session data is not valid: {e}")))?;
        if data.history.len() > super::prepare::MAX_MESSAGES {
            return Err(EngineError::InvalidArgument(format!(
                "the session file holds {} messages; at most {} are taken",
                data.history.len(),
                super::prepare::MAX_MESSAGES
            )));
        }
        let id = self.next_session.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::new(SessionShared {
            busy: AtomicBool::new(false),
            history: Mutex::new(data.history),
            system: data.system,
            experts: Mutex::new(ExpertChoice::Named(names)),
            context_shift,
        });
        let snapshot = SessionSnapshot {
            tokens: file.tokens,
            pending: h.pending,
            kv_format: h.kv_format.clone(),
            block_size: h.block_size,
            block_bytes: h.block_bytes,
            cache: file.cache,
            experts,
            n_virtual: h.virtual_tokens,
        };
        let (rtx, rrx) = std::sync::mpsc::channel();
        self.send(Command::RestoreSession {
            id,
            shared: shared.clone(),
            snapshot: Box::new(snapshot),
            reply: Box::new(move |r| {
                let _ = rtx.send(r);
            }),
        })?;
        rrx.recv().map_err(|_| EngineError::Disposed("runtime".into()))??;
        Ok(SessionHandle { id, shared })
    }

    /// `[name, fingerprint]` of each expert (load ids, in order) a saved cache was computed
    /// under; fails where one is no longer loaded. Reads adapter files the first time.
    fn saved_experts(&self, ids: &[u64]) -> Result<Vec<(String, String)>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let loaded = self.experts()?.list();
        ids.iter()
            .map(|id| {
                let e = loaded.iter().find(|e| e.id == *id).ok_or_else(|| {
                    EngineError::InvalidArgument(
                        "this session's cache was computed under an expert that has since been unloaded; \
                         it cannot be saved (a new turn under loaded experts can)"
                            .into(),
                    )
                })?;
                Ok((e.name.clone(), hex(&e.fingerprint()?)))
            })
            .collect()
    }

    /// The load ids and names of the loaded experts a saved cache's `[name, fingerprint]`
    /// list names, in order: each must be loaded under its name with the same files and
    /// scale. Their virtual positions must be the file's.
    fn restored_experts(&self, saved: &[(String, String)], virtual_tokens: usize) -> Result<(Vec<u64>, Vec<String>)> {
        let names: Vec<String> = saved.iter().map(|(n, _)| n.clone()).collect();
        let set = self.experts()?.resolve(&names).map_err(|e| match e {
            EngineError::ExpertNotFound(m) => {
                EngineError::ExpertNotFound(format!("the saved session's cache was computed under experts {names:?}: {m}"))
            }
            e => e,
        })?;
        for ((name, want), e) in saved.iter().zip(set.experts()) {
            let have = hex(&e.fingerprint()?);
            if &have != want {
                return Err(EngineError::InvalidArgument(format!(
                    "the expert '{name}' loaded here is another adapter (other files or scale) than the one the saved \
                     session's cache was computed under: {have} here, {want} in the file"
                )));
            }
        }
        if set.num_virtual_tokens() != virtual_tokens {
            return Err(EngineError::InvalidArgument(format!(
                "the saved session starts with {virtual_tokens} virtual tokens; its experts here give {}",
                set.num_virtual_tokens()
            )));
        }
        Ok((set.key(), names))
    }
}

fn hex(bytes: &[u8; 32]) -> String {
    let mut s = String::from("sha256:");
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}
