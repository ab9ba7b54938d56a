//! `Session`: one conversation and its KV cache on the engine thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use super::error::{disposed, to_py};
use super::input;
use super::stream::{complete_async, AsyncTokenStream, Shared, TokenStream};
use super::types::{call_dict, Completion};
use crate::engine::{Engine, ExpertChoice, SessionHandle};

#[pyclass(module = "expert_runtime", frozen)]
pub struct Session {
    engine: Arc<Engine>,
    handle: SessionHandle,
    disposed: AtomicBool,
    /// The latest request's stream: a dropped one is drained before the next call.
    last: Mutex<Option<Arc<Shared>>>,
}

impl Session {
    pub fn new(engine: Arc<Engine>, handle: SessionHandle) -> Self {
        Self { engine, handle, disposed: AtomicBool::new(false), last: Mutex::new(None) }
    }

    fn check(&self) -> PyResult<()> {
        if self.disposed.load(Ordering::Acquire) {
            return Err(disposed("session"));
        }
        if self.engine.is_disposed() {
            return Err(disposed("runtime"));
        }
        Ok(())
    }

    /// Waits until a request whose consumer left has been stopped and its summary, history
    /// and token stream cut to what was delivered.
    fn settle(&self, py: Python<'_>) {
        let last = self.last.lock().unwrap().clone();
        if let Some(s) = last.filter(|s| s.left()) {
            s.drain_blocking(py);
        }
    }

    fn start(&self, py: Python<'_>, input: &Bound<'_, PyAny>, options: Option<&Bound<'_, PyDict>>) -> PyResult<Arc<Shared>> {
        self.check()?;
        let input = input::input(input)?;
        let options = input::generate_options(options)?;
        self.settle(py);
        let g = self.engine.generate(&self.handle, input, options).map_err(to_py)?;
        let shared = Shared::new(g);
        *self.last.lock().unwrap() = Some(shared.clone());
        Ok(shared)
    }

    fn dispose(&self) {
        if !self.disposed.swap(true, Ordering::AcqRel) {
            self.engine.drop_session(self.handle.id);
        }
    }
}

#[pymethods]
impl Session {
    /// Starts one answer and returns its chunks as an iterator. A str or a list of messages
    /// goes through the chat template and into `history`; `{"text"}` / `{"tokens"}` continue
    /// the session's token stream raw. `SESSION_BUSY` while another request of this session
    /// runs.
    #[pyo3(signature = (input, **options))]
    fn generate(slf: &Bound<'_, Self>, input: &Bound<'_, PyAny>, options: Option<&Bound<'_, PyDict>>) -> PyResult<TokenStream> {
        let shared = slf.get().start(slf.py(), input, options)?;
        Ok(TokenStream::new(shared, slf.clone().unbind()))
    }

    /// Runs one answer to its end and returns the summary.
    #[pyo3(signature = (input, **options))]
    fn complete(&self, py: Python<'_>, input: &Bound<'_, PyAny>, options: Option<&Bound<'_, PyDict>>) -> PyResult<Completion> {
        self.start(py, input, options)?.complete_blocking(py)
    }

    /// `generate` for asyncio: `async for chunk in session.agenerate(...)`.
    #[pyo3(signature = (input, **options))]
    fn agenerate(
        slf: &Bound<'_, Self>,
        input: &Bound<'_, PyAny>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<AsyncTokenStream> {
        let shared = slf.get().start(slf.py(), input, options)?;
        Ok(AsyncTokenStream::new(shared, slf.clone().unbind()))
    }

    /// `complete` for asyncio: `await session.acomplete(...)`. Cancelling the task cancels the
    /// request.
    #[pyo3(signature = (input, **options))]
    fn acomplete<'py>(
        slf: &Bound<'py, Self>,
        input: &Bound<'py, PyAny>,
        options: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let shared = slf.get().start(py, input, options)?;
        // The awaitable keeps the session alive (`rt.create_session().acomplete(...)`).
        let session = slf.clone().unbind();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let r = complete_async(shared).await;
            drop(session);
            r
        })
    }

    /// The conversation so far: `[{"role", "content"}, …]`; an assistant turn that called
    /// tools has `tool_calls`, a tool answer `tool_call_id`, a thinking model's turn `reasoning`.
    #[getter]
    fn history<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.settle(py);
        let messages = self.handle.shared.history.lock().unwrap().clone();
        let out = PyList::empty(py);
        for m in messages {
            let d = PyDict::new(py);
            d.set_item("role", &m.role)?;
            d.set_item("content", &m.content)?;
            if !m.tool_calls.is_empty() {
                let calls = PyList::empty(py);
                for c in &m.tool_calls {
                    calls.append(call_dict(py, &c.id, &c.name, &c.arguments)?)?;
                }
                d.set_item("tool_calls", calls)?;
            }
            if let Some(id) = &m.tool_call_id {
                d.set_item("tool_call_id", id)?;
            }
            if let Some(r) = &m.reasoning {
                d.set_item("reasoning", r)?;
            }
            out.append(d)?;
        }
        Ok(out)
    }

    #[getter]
    fn busy(&self) -> bool {
        self.handle.shared.busy.load(Ordering::Acquire)
    }

    /// The session's default experts: a list of names, or `"auto"`.
    #[getter]
    fn experts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match &*self.handle.shared.experts.lock().unwrap() {
            ExpertChoice::Named(names) => Ok(PyList::new(py, names)?.into_any()),
            ExpertChoice::Auto => Ok(pyo3::types::PyString::new(py, "auto").into_any()),
        }
    }

    /// Replaces the default experts (a list of names, or `"auto"`); `SESSION_BUSY` while
    /// generating, `EXPERT_NOT_FOUND` for a name not loaded.
    fn set_experts(&self, py: Python<'_>, experts: &Bound<'_, PyAny>) -> PyResult<()> {
        self.check()?;
        let choice = input::expert_choice(experts)?;
        self.settle(py);
        self.engine.set_session_experts(&self.handle, choice).map_err(to_py)
    }

    /// Replaces the conversation with `messages` (a list of message dicts, as `history`
    /// returns) without generating.
    fn set_history(&self, py: Python<'_>, messages: &Bound<'_, PyAny>) -> PyResult<()> {
        self.check()?;
        self.settle(py);
        let messages = super::args::seq(messages, "messages")?.iter().map(input::message).collect::<PyResult<Vec<_>>>()?;
        self.engine.set_history(&self.handle, messages).map_err(to_py)
    }

    /// Forgets the conversation (the system prompt stays).
    /// Writes the session (history, cache, recurrent state) to `path`, atomically, with the GIL
    /// released; `Runtime.restore_session(path)` brings it back.
    fn save(&self, py: Python<'_>, path: &Bound<'_, PyAny>) -> PyResult<()> {
        self.check()?;
        let p = super::runtime::path(path, "path")?;
        self.settle(py);
        super::runtime::wait(py, self.engine.save_session(&self.handle, &p), "the session writer")
    }

    fn reset(&self, py: Python<'_>) -> PyResult<()> {
        self.check()?;
        self.settle(py);
        self.engine.reset_session(&self.handle).map_err(to_py)
    }

    /// Frees the session's KV cache; a running request is cancelled.
    fn close(&self) {
        self.dispose();
    }

    #[getter]
    fn closed(&self) -> bool {
        self.disposed.load(Ordering::Acquire) || self.engine.is_disposed()
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, PyTuple>) -> bool {
        self.dispose();
        false
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.dispose();
    }
}
