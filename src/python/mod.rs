//! The Python binding layer: the only place with `#[pyo3]` (feature `python`, built by maturin
//! from pyproject.toml). Like `src/napi/` it converts Python values to engine types and engine
//! errors to one exception class, and never does engine work while holding the GIL.
mod args;
mod error;
mod expert;
mod input;
mod json;
mod runtime;
mod session;
mod stream;
mod types;

use pyo3::prelude::*;

/// Sync calls wait on the engine with the GIL released; async calls are awaitables on this
/// runtime. Its one worker only moves events from the engine's channels to Python.
fn init_async_runtime() {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(1).thread_name("expert-runtime-py").enable_all();
    pyo3_async_runtimes::tokio::init(builder);
}

#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    init_async_runtime();
    m.add("ExpertRuntimeError", m.py().get_type::<error::ExpertRuntimeError>())?;
    m.add_class::<runtime::Runtime>()?;
    m.add_class::<session::Session>()?;
    m.add_class::<expert::Expert>()?;
    m.add_class::<stream::TokenStream>()?;
    m.add_class::<stream::AsyncTokenStream>()?;
    m.add_class::<types::TokenChunk>()?;
    m.add_class::<types::Completion>()?;
    m.add_class::<types::Usage>()?;
    m.add_class::<types::Timings>()?;
    m.add_class::<types::ToolCall>()?;
    m.add_class::<types::FunctionCall>()?;
    m.add_class::<types::ToolCallDelta>()?;
    m.add_class::<types::FunctionDelta>()?;
    Ok(())
}
