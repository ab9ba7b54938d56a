//! JSON-shaped values across the boundary through Python's own `json` module: schemas and
//! tool parameters in, info/stats/routing dicts out. `json.dumps` refuses cycles and NaN, and
//! serde_json's nesting limit applies on our side.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde::Serialize;

use super::args::type_name;
use super::error::{invalid, to_py};
use crate::error::EngineError;
use crate::sampling::constraint::MAX_FORMAT_BYTES;

/// `value` as Python objects (dicts, lists, numbers, strings, `None`).
pub fn to_python<'py>(py: Python<'py>, value: &impl Serialize) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(value).map_err(|e| to_py(EngineError::Internal(format!("serializing: {e}"))))?;
    py.import("json")?.call_method1("loads", (text,))
}

/// JSON text of a Python value (at most [`MAX_FORMAT_BYTES`]).
pub fn to_json_text(v: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    let py = v.py();
    let kwargs = PyDict::new(py);
    kwargs.set_item("allow_nan", false)?;
    let text: String = py
        .import("json")?
        .call_method("dumps", (v,), Some(&kwargs))
        .map_err(|e| invalid(format!("{what} cannot be written as JSON ({}): {}", type_name(v), e.value(py))))?
        .extract()?;
    if text.len() > MAX_FORMAT_BYTES {
        return Err(invalid(format!("{what} is {} bytes of JSON; at most {MAX_FORMAT_BYTES} are accepted", text.len())));
    }
    Ok(text)
}

/// A Python value as a JSON value.
pub fn to_json(v: &Bound<'_, PyAny>, what: &str) -> PyResult<serde_json::Value> {
    serde_json::from_str(&to_json_text(v, what)?).map_err(|e| invalid(format!("{what} is not valid JSON: {e}")))
}
