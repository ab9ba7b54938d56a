//! One request's events as a Python iterator (`TokenStream`) or async iterator
//! (`AsyncTokenStream`). Both read the engine's channel through [`Shared`], which records what
//! reached the consumer ([`Delivery`]) so that a consumer who leaves early gets a summary, and
//! a session history, holding exactly the chunks it saw.
//!
//! Leaving: `close()` / `aclose()`, a `with` block's end, Ctrl-C while waiting, or dropping the
//! stream (a `for` loop over a temporary that `break`s) cancels the request; the engine stops it
//! within one step. A dropped stream is drained in the background, and the session's next call
//! waits for that drain, so the session is reusable at once.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::PyStopAsyncIteration;
use pyo3::prelude::*;
use tokio::sync::mpsc::UnboundedReceiver;

use super::error::to_py;
use super::session::Session;
use super::types::{Completion, TokenChunk};
use crate::engine::{self, Delivery, Event, Generation};
use crate::error::EngineError;

/// How often a blocked `next()` wakes to let Python handle signals (Ctrl-C).
const SIGNAL_POLL: Duration = Duration::from_millis(50);

struct Reader {
    events: UnboundedReceiver<Event>,
    delivery: Delivery,
}

pub struct Shared {
    reader: tokio::sync::Mutex<Reader>,
    /// The engine's cancel flag for the request.
    cancel: Arc<AtomicBool>,
    /// The consumer left: chunks still arriving are dropped and the summary is cut.
    left: AtomicBool,
    delivered: AtomicUsize,
    finished: AtomicBool,
    summary: Mutex<Option<engine::Completion>>,
}

pub enum Next {
    Chunk(engine::TokenChunk),
    End,
    Error(EngineError),
}

fn runtime() -> &'static tokio::runtime::Runtime {
    pyo3_async_runtimes::tokio::get_runtime()
}

/// Runs `fut` to completion with the GIL released, waking every [`SIGNAL_POLL`] (and checking
/// before the first wait, as a busy stream never times out) to let Python handle signals: a
/// pending one (Ctrl-C) is raised and `fut` is dropped.
pub fn block_on_interruptible<F>(py: Python<'_>, fut: F) -> PyResult<F::Output>
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    let mut fut = std::pin::pin!(fut);
    loop {
        py.check_signals()?;
        // The timer is made inside `block_on`: it needs the runtime's context.
        if let Ok(v) = py.detach(|| runtime().block_on(async { tokio::time::timeout(SIGNAL_POLL, fut.as_mut()).await })) {
            return Ok(v);
        }
    }
}

impl Shared {
    pub fn new(g: Generation) -> Arc<Self> {
        Arc::new(Self {
            reader: tokio::sync::Mutex::new(Reader { events: g.events, delivery: g.delivery }),
            cancel: g.cancel,
            left: AtomicBool::new(false),
            delivered: AtomicUsize::new(0),
            finished: AtomicBool::new(false),
            summary: Mutex::new(None),
        })
    }

    /// The next event the consumer should see. Cancel-safe: dropping the future loses nothing.
    pub async fn next(&self) -> Next {
        let mut r = self.reader.lock().await;
        loop {
            if self.finished() {
                return Next::End;
            }
            match r.events.recv().await {
                Some(Event::Token(c)) => {
                    // Once cancelled, chunks the engine made before it saw the flag are dropped.
                    if self.left.load(Ordering::Acquire) {
                        continue;
                    }
                    r.delivery.passed(&c);
                    self.delivered.fetch_add(1, Ordering::AcqRel);
                    return Next::Chunk(c);
                }
                Some(Event::Done(mut c)) => {
                    if self.left.load(Ordering::Acquire) {
                        r.delivery.left_after(self.delivered.load(Ordering::Acquire));
                    }
                    r.delivery.settle(&mut c);
                    *self.summary.lock().unwrap() = Some(*c);
                    self.end(&mut r);
                    return Next::End;
                }
                Some(Event::Error(e)) => {
                    self.end(&mut r);
                    return Next::Error(e);
                }
                None => {
                    self.end(&mut r);
                    return Next::End;
                }
            }
        }
    }

    /// Set only under the reader's lock, so a reader holding it sees a consistent state.
    fn end(&self, r: &mut Reader) {
        r.events.close();
        self.finished.store(true, Ordering::Release);
    }

    /// Stops the request after the current step; the consumer sees nothing more.
    pub fn cancel(&self) {
        self.left.store(true, Ordering::Release);
        self.cancel.store(true, Ordering::Release);
    }

    pub fn left(&self) -> bool {
        self.left.load(Ordering::Acquire)
    }

    pub fn finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    /// Cancels and reads to the end: when it returns the engine has released the session.
    pub async fn drain(&self) {
        self.cancel();
        while let Next::Chunk(_) = self.next().await {}
    }

    /// [`Self::drain`] from a Python thread, with the GIL released.
    pub fn drain_blocking(&self, py: Python<'_>) {
        if !self.finished() {
            py.detach(|| runtime().block_on(self.drain()));
        }
    }

    /// Cancels without waiting; the request is drained in the background.
    pub fn abandon(self: &Arc<Self>) {
        if !self.finished() {
            self.cancel();
            let s = self.clone();
            runtime().spawn(async move { s.drain().await });
        }
    }

    /// The next chunk, waiting with the GIL released. A signal (Ctrl-C) while waiting cancels
    /// the request, waits until the engine has stopped it, and raises.
    pub fn next_blocking(&self, py: Python<'_>) -> PyResult<Option<engine::TokenChunk>> {
        match block_on_interruptible(py, self.next()) {
            Ok(Next::Chunk(c)) => Ok(Some(c)),
            Ok(Next::End) => Ok(None),
            Ok(Next::Error(e)) => Err(to_py(e)),
            Err(e) => {
                self.drain_blocking(py);
                Err(e)
            }
        }
    }

    /// Reads to the end (sync) and returns the summary.
    pub fn complete_blocking(&self, py: Python<'_>) -> PyResult<Completion> {
        while self.next_blocking(py)?.is_some() {}
        self.completion()
    }

    fn completion(&self) -> PyResult<Completion> {
        self.summary
            .lock()
            .unwrap()
            .clone()
            .map(Into::into)
            .ok_or_else(|| to_py(EngineError::Internal("the stream ended without a summary".into())))
    }

    fn result(&self) -> Option<Completion> {
        self.summary.lock().unwrap().clone().map(Into::into)
    }
}

/// Cancels its request when dropped before the request finished (an `acomplete` whose task
/// was cancelled).
pub struct AbandonGuard(pub Arc<Shared>);

impl Drop for AbandonGuard {
    fn drop(&mut self) {
        self.0.abandon();
    }
}

/// Reads a request to its end on the async runtime and returns the summary.
pub async fn complete_async(shared: Arc<Shared>) -> PyResult<Completion> {
    let _guard = AbandonGuard(shared.clone());
    loop {
        match shared.next().await {
            Next::Chunk(_) => {}
            Next::End => return shared.completion(),
            Next::Error(e) => return Err(to_py(e)),
        }
    }
}

/// The chunks of one request: `for chunk in session.generate(...)`. `result` holds the summary
/// once the stream has ended.
#[pyclass(module = "expert_runtime", frozen)]
pub struct TokenStream {
    shared: Arc<Shared>,
    // Keeps the session alive while its request runs (`rt.create_session().generate(...)`).
    _session: Py<Session>,
}

impl TokenStream {
    pub fn new(shared: Arc<Shared>, session: Py<Session>) -> Self {
        Self { shared, _session: session }
    }
}

#[pymethods]
impl TokenStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<TokenChunk>> {
        Ok(self.shared.next_blocking(py)?.map(Into::into))
    }

    /// Stops the request after the current step; iteration then ends.
    fn cancel(&self) {
        self.shared.cancel();
    }

    /// Cancels (if still running) and waits until the engine has stopped the request.
    fn close(&self, py: Python<'_>) {
        self.shared.drain_blocking(py);
    }

    /// Reads the rest of the stream and returns the summary.
    fn complete(&self, py: Python<'_>) -> PyResult<Completion> {
        self.shared.complete_blocking(py)
    }

    /// The summary once the stream has ended (`None` before, or after an error).
    #[getter]
    fn result(&self) -> Option<Completion> {
        self.shared.result()
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.shared.drain_blocking(py);
        false
    }
}

impl Drop for TokenStream {
    fn drop(&mut self) {
        self.shared.abandon();
    }
}

/// The chunks of one request for asyncio: `async for chunk in session.agenerate(...)`.
#[pyclass(module = "expert_runtime", frozen)]
pub struct AsyncTokenStream {
    shared: Arc<Shared>,
    _session: Py<Session>,
}

impl AsyncTokenStream {
    pub fn new(shared: Arc<Shared>, session: Py<Session>) -> Self {
        Self { shared, _session: session }
    }
}

#[pymethods]
impl AsyncTokenStream {
    fn __aiter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __anext__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let shared = self.shared.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            match shared.next().await {
                Next::Chunk(c) => Ok(TokenChunk::from(c)),
                Next::End => Err(PyStopAsyncIteration::new_err(())),
                Next::Error(e) => Err(to_py(e)),
            }
        })
    }

    fn cancel(&self) {
        self.shared.cancel();
    }

    /// Cancels (if still running); the awaitable resolves once the engine has stopped it.
    fn aclose<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let shared = self.shared.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            shared.drain().await;
            Ok(())
        })
    }

    /// Reads the rest of the stream; resolves to the summary.
    fn complete<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        pyo3_async_runtimes::tokio::future_into_py(py, complete_async(self.shared.clone()))
    }

    #[getter]
    fn result(&self) -> Option<Completion> {
        self.shared.result()
    }

    fn __aenter__(slf: Py<Self>, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        pyo3_async_runtimes::tokio::future_into_py(py, async move { Ok(slf) })
    }

    #[pyo3(signature = (*_args))]
    fn __aexit__<'py>(&self, py: Python<'py>, _args: &Bound<'py, pyo3::types::PyTuple>) -> PyResult<Bound<'py, PyAny>> {
        let shared = self.shared.clone();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            shared.drain().await;
            Ok(false)
        })
    }
}

impl Drop for AsyncTokenStream {
    fn drop(&mut self) {
        self.shared.abandon();
    }
}
