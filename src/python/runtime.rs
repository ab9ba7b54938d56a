//! `Runtime`: a loaded model behind the engine thread. Blocking calls release the GIL.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

use super::args::{self, dict, seq, string, Kwargs};
use super::error::{disposed, invalid, to_py};
use super::expert::Expert;
use super::input;
use super::json::{to_json, to_python};
use super::session::Session;
use super::stream::block_on_interruptible;
use crate::engine::{ContextShift, EmbedOptions, Engine, ExpertChoice, KvCacheOptions, LoadOptions, Pooling};
use crate::error::{EngineError, Result as EngineResult};
use crate::experts::router::RouterSettings;
use crate::experts::ExpertLoadOptions;

const LOAD_OPTIONS: &[&str] = &[
    "device",
    "dtype",
    "context_length",
    "rope_scaling",
    "threads",
    "kv_cache",
    "quantize",
    "mmap",
    "memory_limit",
    "on_progress",
];

#[pyclass(module = "expert_runtime", frozen)]
pub struct Runtime {
    engine: Mutex<Option<Arc<Engine>>>,
}

/// A path: `str` or `os.PathLike` (bytes paths are refused).
pub(super) fn path(v: &Bound<'_, PyAny>, what: &str) -> PyResult<PathBuf> {
    let p =
        v.py().import("os")?.call_method1("fspath", (v,)).map_err(|_| invalid(format!("{what} must be a str or os.PathLike")))?;
    Ok(PathBuf::from(string(&p, what)?))
}

/// Waits for a reply from the engine with the GIL released; Ctrl-C raises `KeyboardInterrupt`
/// (the work finishes and is dropped).
pub(super) fn wait<T: Send>(py: Python<'_>, rx: tokio::sync::oneshot::Receiver<EngineResult<T>>, what: &str) -> PyResult<T> {
    match block_on_interruptible(py, rx)? {
        Ok(v) => v.map_err(to_py),
        Err(_) => Err(to_py(EngineError::Internal(format!("{what} exited")))),
    }
}

fn load_options(k: &Kwargs<'_>) -> PyResult<LoadOptions> {
    let kv = match k.any("kv_cache")? {
        Some(v) => {
            let d = dict(&v, "kv_cache")?;
            let keys =
                ["block_size", "max_tokens", "max_bytes", "idle_release_ms", "prefix_cache", "dtype", "max_sequences", "disk"];
            let kv = Kwargs::new(Some(&d), &keys, "kv_cache")?;
            // `disk`: {'dir': str, 'max_bytes': int}, the prefix cache's disk tier.
            let disk = match kv.any("disk")? {
                Some(v) => {
                    let d = dict(&v, "kv_cache['disk']")?;
                    let o = Kwargs::new(Some(&d), &["dir", "max_bytes"], "kv_cache['disk']")?;
                    let dir = o.string("dir")?.filter(|s| !s.is_empty());
                    let (Some(dir), Some(max_bytes)) = (dir, o.u64("max_bytes")?) else {
                        return Err(invalid("kv_cache['disk'] needs 'dir' (a non-empty string) and 'max_bytes'"));
                    };
                    Some(crate::kv::disk::DiskOptions { dir: dir.into(), max_bytes })
                }
                None => None,
            };
            KvCacheOptions {
                block_size: kv.u32("block_size")?.map(|n| n as usize),
                max_tokens: kv.u64("max_tokens")?.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
                max_bytes: kv.u64("max_bytes")?,
                idle_release_ms: kv.u64("idle_release_ms")?,
                prefix_cache: kv.bool("prefix_cache")?,
                dtype: kv.string("dtype")?,
                max_sequences: kv.u32("max_sequences")?.map(|n| n as usize),
                disk,
            }
        }
        None => KvCacheOptions::default(),
    };
    // `context_length`: a number of positions, or "auto" (the longest that fits memory_limit).
    let auto = match k.any("context_length")? {
        Some(v) if v.is_instance_of::<PyString>() => match string(&v, "context_length")?.as_str() {
            "auto" => true,
            other => return Err(invalid(format!("context_length must be an integer or 'auto', got '{other}'"))),
        },
        _ => false,
    };
    Ok(LoadOptions {
        device: k.string("device")?,
        dtype: k.string("dtype")?,
        context_length: if auto { None } else { k.u32("context_length")?.map(|n| n as usize) },
        context_auto: auto,
        memory_limit: k.u64("memory_limit")?,
        rope_scaling: k.any("rope_scaling")?.map(|v| super::json::to_json(&v, "rope_scaling")).transpose()?,
        threads: k.u32("threads")?.map(|n| n as usize),
        dequantize: false,
        quantize: k.string("quantize")?,
        mmap: k.bool("mmap")?,
        kv_cache: kv,
    })
}

/// `on_progress(loaded_bytes, total_bytes)`, called on the loading thread; an exception in it
/// is reported as unraisable and loading goes on.
fn progress(callback: Option<Py<PyAny>>) -> Box<dyn Fn(u64, u64) + Send> {
    match callback {
        Some(f) => Box::new(move |loaded, total| {
            Python::attach(|py| {
                if let Err(e) = f.call1(py, (loaded, total)) {
                    e.write_unraisable(py, Some(f.bind(py)));
                }
            })
        }),
        None => Box::new(|_, _| {}),
    }
}

impl Runtime {
    fn engine(&self) -> PyResult<Arc<Engine>> {
        self.engine.lock().unwrap().clone().filter(|e| !e.is_disposed()).ok_or_else(|| disposed("runtime"))
    }

    /// This runtime's model, to draft for another runtime's requests (`speculative={"type":
    /// "draft", "model": rt}`); `DISPOSED` once disposed.
    pub(super) fn draft_model(&self) -> PyResult<crate::engine::DraftModel> {
        self.engine()?.draft_model().map_err(to_py)
    }

    fn start(
        path_arg: &Bound<'_, PyAny>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<tokio::sync::oneshot::Receiver<EngineResult<Arc<Engine>>>> {
        let p = path(path_arg, "path")?;
        let k = Kwargs::new(options, LOAD_OPTIONS, "Runtime.load")?;
        let opts = load_options(&k)?;
        let callback = match k.any("on_progress")? {
            Some(f) if f.is_callable() => Some(f.unbind()),
            Some(_) => return Err(invalid("on_progress must be callable")),
            None => None,
        };
        Ok(Engine::spawn(&p, opts, progress(callback)))
    }
}

#[pymethods]
impl Runtime {
    /// Loads a model (an HF directory or a `.gguf` file). Options: `device` ('auto' | 'cpu' |
    /// 'cuda' | 'cuda:N'), `dtype`, `context_length`, `threads`, `kv_cache` (`{"max_tokens",
    /// "block_size", "prefix_cache"}`), `on_progress(loaded_bytes, total_bytes)`.
    #[staticmethod]
    #[pyo3(signature = (path, **options))]
    fn load(py: Python<'_>, path: &Bound<'_, PyAny>, options: Option<&Bound<'_, PyDict>>) -> PyResult<Runtime> {
        let rx = Self::start(path, options)?;
        let engine = wait(py, rx, "the engine thread")?;
        Ok(Runtime { engine: Mutex::new(Some(engine)) })
    }

    /// `load` for asyncio.
    #[staticmethod]
    #[pyo3(signature = (path, **options))]
    fn aload<'py>(
        py: Python<'py>,
        path: &Bound<'py, PyAny>,
        options: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let rx = Self::start(path, options)?;
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let engine = rx.await.map_err(|_| to_py(EngineError::Internal("the engine thread exited during load".into())))?;
            Ok(Runtime { engine: Mutex::new(Some(engine.map_err(to_py)?)) })
        })
    }

    /// `{"architecture", "dtype", "device", "device_name", "vocab_size", "context_length", …}`.
    #[getter]
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, &self.engine()?.info)
    }

    /// Token ids of `text`. Special-token spellings are plain text unless
    /// `parse_special_tokens`.
    #[pyo3(signature = (text, add_special_tokens = None, parse_special_tokens = None))]
    fn tokenize(
        &self,
        py: Python<'_>,
        text: &Bound<'_, PyAny>,
        add_special_tokens: Option<&Bound<'_, PyAny>>,
        parse_special_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<u32>> {
        let text = string(text, "text")?;
        let add = add_special_tokens.map(|v| args::boolean(v, "add_special_tokens")).transpose()?.unwrap_or(true);
        let parse = parse_special_tokens.map(|v| args::boolean(v, "parse_special_tokens")).transpose()?.unwrap_or(false);
        let tok = self.engine()?.tokenizer().map_err(to_py)?;
        py.detach(|| tok.encode_text(&text, add, parse)).map_err(|m| to_py(EngineError::InvalidModel(m)))
    }

    fn detokenize(&self, py: Python<'_>, ids: &Bound<'_, PyAny>) -> PyResult<String> {
        let e = self.engine()?;
        let ids: Vec<u32> = seq(ids, "ids")?.iter().map(|x| args::int::<u32>(x, "each token id")).collect::<PyResult<_>>()?;
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= e.info.vocab_size) {
            return Err(invalid(format!("token id {bad} is out of range")));
        }
        let tok = e.tokenizer().map_err(to_py)?;
        py.detach(|| tok.decode(&ids, false)).map_err(|m| to_py(EngineError::Internal(m)))
    }

    /// A conversation with its own KV cache. `experts`: default expert names, or `"auto"`
    /// (the router picks per request). `context_shift`: `"none"` (a chat turn that does not
    /// fit fails with CONTEXT_OVERFLOW) or `"drop-oldest"` (the oldest turns are dropped).
    #[pyo3(signature = (system = None, experts = None, context_shift = None))]
    fn create_session(
        &self,
        system: Option<&Bound<'_, PyAny>>,
        experts: Option<&Bound<'_, PyAny>>,
        context_shift: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Session> {
        let e = self.engine()?;
        let system = system.filter(|s| !s.is_none()).map(|s| string(s, "system")).transpose()?;
        let choice = match experts.filter(|x| !x.is_none()) {
            Some(x) => input::expert_choice(x)?,
            None => ExpertChoice::default(),
        };
        let shift = match context_shift.filter(|x| !x.is_none()) {
            Some(x) => ContextShift::parse(&string(x, "context_shift")?).map_err(to_py)?,
            None => ContextShift::None,
        };
        let handle = e.create_session_with(system, choice, shift).map_err(to_py)?;
        Ok(Session::new(e, handle))
    }

    /// A session from a file `Session.save` wrote with this model: its history is back and its
    /// next turn continues from the saved cache without evaluating the conversation again.
    #[pyo3(signature = (path, context_shift=None))]
    fn restore_session(
        &self,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        context_shift: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Session> {
        let e = self.engine()?;
        let p = self::path(path, "path")?;
        let shift = match context_shift.filter(|x| !x.is_none()) {
            Some(x) => ContextShift::parse(&string(x, "context_shift")?).map_err(to_py)?,
            None => ContextShift::None,
        };
        let handle = wait(py, e.restore_session(&p, shift), "the session reader")?;
        Ok(Session::new(e, handle))
    }

    /// Reads, validates and makes resident a PEFT adapter directory, without pausing
    /// generation. Options: `name`, `scale`, `mmap`.
    #[pyo3(signature = (path, **options))]
    fn load_expert(&self, py: Python<'_>, path: &Bound<'_, PyAny>, options: Option<&Bound<'_, PyDict>>) -> PyResult<Expert> {
        let e = self.engine()?;
        let p = self::path(path, "path")?;
        let k = Kwargs::new(options, &["name", "scale", "mmap"], "load_expert")?;
        let opts = ExpertLoadOptions {
            name: k.string("name")?,
            default_name: None,
            scale: k.f64("scale")?.unwrap_or(1.0),
            mmap: k.bool("mmap")?.unwrap_or(true),
        };
        let expert = wait(py, e.load_expert(&p, opts), "the adapter loader")?;
        Ok(Expert::new(e, &expert))
    }

    /// The loaded experts, in load order.
    fn experts(&self) -> PyResult<Vec<Expert>> {
        let e = self.engine()?;
        Ok(e.experts().map_err(to_py)?.list().iter().map(|x| Expert::new(e.clone(), x)).collect())
    }

    /// One vector per text (a list of floats, `hidden_size` long): the final hidden state
    /// pooled over the text's tokens. Options: `pooling` ('mean' | 'last'), `normalize`
    /// (default True), `experts`.
    #[pyo3(signature = (texts, **options))]
    fn embed(&self, py: Python<'_>, texts: &Bound<'_, PyAny>, options: Option<&Bound<'_, PyDict>>) -> PyResult<Vec<Vec<f32>>> {
        let e = self.engine()?;
        if texts.is_instance_of::<PyString>() {
            return Err(invalid("texts must be a list of strings (wrap a single text in a list)"));
        }
        let texts = args::strings(texts, "texts")?;
        let k = Kwargs::new(options, &["pooling", "normalize", "experts"], "embed")?;
        let pooling = match k.string("pooling")?.as_deref() {
            None | Some("mean") => Pooling::Mean,
            Some("last") => Pooling::Last,
            Some(p) => return Err(invalid(format!("unknown pooling {:?} (mean, last)", p.chars().take(40).collect::<String>()))),
        };
        let opts = EmbedOptions {
            pooling,
            normalize: k.bool("normalize")?.unwrap_or(true),
            experts: k.strings("experts")?.unwrap_or_default(),
        };
        wait(py, e.embed(texts, opts), "the runtime")
    }

    /// The router's decision for `input` (without running it), as a dict.
    #[pyo3(signature = (input, history_turns = None))]
    fn route<'py>(
        &self,
        py: Python<'py>,
        input: &Bound<'py, PyAny>,
        history_turns: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let e = self.engine()?;
        let input = input::input(input)?;
        let turns = history_turns.filter(|h| !h.is_none()).map(|h| args::int::<u32>(h, "history_turns")).transpose()?;
        let d = wait(py, e.route(input, turns.map(|n| n as usize)), "the runtime")?;
        to_python(py, &d)
    }

    /// Changes router settings: `threshold`, `max_experts`, `generic_patterns`, `weights`
    /// (`{"keywords", "similarity"}`), `history_turns`, `generic_min_keyword_hits`; the rest
    /// keep their values.
    #[pyo3(signature = (**settings))]
    fn set_router(&self, settings: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
        let e = self.engine()?;
        let known = ["threshold", "max_experts", "generic_patterns", "weights", "history_turns", "generic_min_keyword_hits"];
        Kwargs::new(settings, &known, "set_router")?;
        let mut cur = serde_json::to_value(e.router_settings()).map_err(|x| to_py(EngineError::Internal(x.to_string())))?;
        if let Some(s) = settings {
            let given = to_json(s.as_any(), "router settings")?;
            merge(&mut cur, given);
        }
        let next: RouterSettings = serde_json::from_value(cur).map_err(|x| invalid(format!("router settings: {x}")))?;
        e.set_router(next).map_err(to_py)
    }

    /// The router's settings, as a dict.
    #[getter]
    fn router<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, &self.engine()?.router_settings())
    }

    /// KV pool and scheduler counters, as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, &self.engine()?.stats())
    }

    /// Cancels running requests, stops the engine thread and frees the model; later calls
    /// raise `DISPOSED`.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let engine = self.engine.lock().unwrap().take();
        if let Some(e) = engine {
            let rx = e.shutdown();
            let rt = pyo3_async_runtimes::tokio::get_runtime();
            let _ = py.detach(|| rt.block_on(rx));
        }
        Ok(())
    }

    #[getter]
    fn closed(&self) -> bool {
        self.engine.lock().unwrap().as_ref().is_none_or(|e| e.is_disposed())
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }
}

/// Overlays `given` on `cur`, object by object (`weights` may be given in part).
fn merge(cur: &mut serde_json::Value, given: serde_json::Value) {
    match (cur, given) {
        (serde_json::Value::Object(c), serde_json::Value::Object(g)) => {
            for (k, v) in g {
                match c.get_mut(&k) {
                    Some(slot) if slot.is_object() && v.is_object() => merge(slot, v),
                    _ => {
                        c.insert(k, v);
                    }
                }
            }
        }
        (c, g) => *c = g,
    }
}
