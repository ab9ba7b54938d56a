//! Engine errors become `ExpertRuntimeError`, whose `code` is the stable code Node's
//! `ExpertRuntimeError.code` carries (`INVALID_ARGUMENT`, `SESSION_BUSY`, …).

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

use crate::error::EngineError;

create_exception!(
    expert_runtime,
    ExpertRuntimeError,
    PyException,
    "An error from the engine. `code` is stable: INVALID_ARGUMENT, SESSION_BUSY, DISPOSED, …"
);

pub fn error(code: &str, message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::attach(|py| {
        let err = ExpertRuntimeError::new_err(format!("{code}: {message}"));
        let v = err.value(py);
        // An exception instance always takes attributes; the message stays in `args`.
        let _ = v.setattr("code", code);
        let _ = v.setattr("detail", message);
        err
    })
}

pub fn to_py(e: EngineError) -> PyErr {
    error(e.code(), e.message())
}

pub fn invalid(message: impl Into<String>) -> PyErr {
    error("INVALID_ARGUMENT", message)
}

pub fn disposed(what: &str) -> PyErr {
    to_py(EngineError::Disposed(format!("the {what} was disposed")))
}
