//! `Expert`: a loaded adapter's description and its `unload`. Holds a copy of the metadata and
//! the load id, never the weights.

use std::sync::Arc;

use pyo3::prelude::*;

use super::json::to_python;
use crate::engine::Engine;
use crate::experts;

#[pyclass(module = "expert_runtime", frozen)]
pub struct Expert {
    engine: Arc<Engine>,
    /// Unique per load (a name unloaded and loaded again gets a new id).
    #[pyo3(get)]
    id: u64,
    #[pyo3(get)]
    name: String,
    /// `lora` | `dora` | `ia3` | `lokr` | `prompt` …
    #[pyo3(get)]
    kind: &'static str,
    #[pyo3(get)]
    rank: Option<usize>,
    #[pyo3(get)]
    target_modules: Vec<String>,
    /// Memory held by its weights, those read in place from the file included.
    #[pyo3(get)]
    bytes: usize,
    /// Of `bytes`, the matrices read in place from the memory-mapped file (not copied).
    #[pyo3(get)]
    mapped_bytes: usize,
    /// Vision-tower tensors of an adapter trained on a multimodal model, not loaded.
    #[pyo3(get)]
    skipped_vision_tensors: usize,
    #[pyo3(get)]
    num_virtual_tokens: usize,
    manifest: Option<serde_json::Value>,
}

impl Expert {
    pub fn new(engine: Arc<Engine>, e: &experts::Expert) -> Self {
        Self {
            engine,
            id: e.id,
            name: e.name.clone(),
            kind: e.kind.as_str(),
            rank: e.rank,
            target_modules: e.target_modules.clone(),
            bytes: e.bytes,
            mapped_bytes: e.mapped_bytes,
            skipped_vision_tensors: e.skipped_vision_tensors,
            num_virtual_tokens: e.num_virtual_tokens(),
            manifest: e.manifest.as_ref().map(|m| m.raw.clone()),
        }
    }
}

#[pymethods]
impl Expert {
    /// `manifest.json` as a dict, or `None`.
    #[getter]
    fn manifest<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.manifest.as_ref().map(|m| to_python(py, m)).transpose()
    }

    /// Whether this load is still in the runtime.
    #[getter]
    fn loaded(&self) -> bool {
        self.engine.experts().is_ok_and(|r| r.get(&self.name).is_some_and(|e| e.id == self.id))
    }

    /// Removes the expert; requests already running keep it until they end. `False` when it
    /// was already unloaded.
    fn unload(&self) -> bool {
        self.engine.unload_expert(&self.name, self.id)
    }

    fn __repr__(&self) -> String {
        format!("Expert(name={:?}, kind={:?}, rank={})", self.name, self.kind, self.rank.map_or("None".into(), |r| r.to_string()))
    }
}
