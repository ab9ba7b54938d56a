//! `NativeExpert`: a loaded adapter's description and its `unload`. It holds a copy of the
//! metadata and the load id, never the weights, so a JS object kept alive does not keep an
//! unloaded expert's memory.

use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi_derive::napi;

use crate::engine::Engine;
use crate::experts::Expert;

#[napi]
pub struct NativeExpert {
    engine: Arc<Engine>,
    id: u64,
    name: String,
    kind: &'static str,
    rank: Option<u32>,
    target_modules: Vec<String>,
    bytes: f64,
    mapped_bytes: f64,
    skipped_vision_tensors: u32,
    manifest: Option<String>,
    num_virtual_tokens: u32,
}

impl NativeExpert {
    pub fn new(engine: Arc<Engine>, e: &Expert) -> Self {
        Self {
            engine,
            id: e.id,
            name: e.name.clone(),
            kind: e.kind.as_str(),
            rank: e.rank.map(|r| r as u32),
            target_modules: e.target_modules.clone(),
            bytes: e.bytes as f64,
            mapped_bytes: e.mapped_bytes as f64,
            skipped_vision_tensors: u32::try_from(e.skipped_vision_tensors).unwrap_or(u32::MAX),
            manifest: e.manifest.as_ref().map(|m| m.raw.to_string()),
            num_virtual_tokens: e.num_virtual_tokens() as u32,
        }
    }
}

#[napi]
impl NativeExpert {
    /// Unique per load (a name unloaded and loaded again gets a new id).
    #[napi(getter)]
    pub fn id(&self) -> f64 {
        self.id as f64
    }

    #[napi(getter)]
    pub fn name(&self) -> String {
        self.name.clone()
    }

    #[napi(getter)]
    pub fn kind(&self) -> String {
        self.kind.into()
    }

    #[napi(getter)]
    pub fn rank(&self) -> Option<u32> {
        self.rank
    }

    #[napi(getter)]
    pub fn target_modules(&self) -> Vec<String> {
        self.target_modules.clone()
    }

    #[napi(getter)]
    pub fn bytes(&self) -> f64 {
        self.bytes
    }

    #[napi(getter)]
    pub fn mapped_bytes(&self) -> f64 {
        self.mapped_bytes
    }

    /// Tensors of a multimodal model's vision tower or projector in the adapter file, not
    /// loaded: images are not an input of the runtime, so they cannot change an output.
    #[napi(getter)]
    pub fn skipped_vision_tensors(&self) -> u32 {
        self.skipped_vision_tensors
    }

    /// `manifest.json` as JSON text (parsed in the TS layer), or null.
    #[napi(getter)]
    pub fn manifest(&self) -> Option<String> {
        self.manifest.clone()
    }

    #[napi(getter)]
    pub fn num_virtual_tokens(&self) -> u32 {
        self.num_virtual_tokens
    }

    /// Whether this load is still in the registry.
    #[napi(getter)]
    pub fn loaded(&self) -> bool {
        self.engine.experts().is_ok_and(|r| r.get(&self.name).is_some_and(|e| e.id == self.id))
    }

    /// Removes the expert from the runtime; requests already running keep it until they end.
    /// Resolves `false` when it was already unloaded.
    #[napi]
    pub async fn unload(&self) -> Result<bool> {
        Ok(self.engine.unload_expert(&self.name, self.id))
    }
}
