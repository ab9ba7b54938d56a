//! Experts: PEFT adapters applied at run time, never merged into the base weights.
//!
//! An [`Expert`] holds, for every linear module it targets (`layer × projection`, a [`Slot`]),
//! one [`ModuleAdapter`], plus virtual-token embeddings for prompt tuning. A request runs
//! under an [`ExpertSet`] (the experts it pinned when it started, in application order) and
//! the decoder routes each projection through the set's [`Adapters::linear`] (the seam in
//! `crate::model::adapt`; the decoder never names this module):
//!
//! ```text
//! x_in  = x ⊙ Π ia3_in            (IA³ on feed-forward modules scales the layer input)
//! y     = (W x_in + b) ⊙ Π ia3_out (IA³ elsewhere scales the layer output, bias included)
//!       + Σ dora  ((m / ‖W + sBA‖ − 1) ⊙ W x_in + (m / ‖W + sBA‖) ⊙ s B A x)
//!       + Σ lora  s B A x          (rsLoRA: s = α / √r, else α / r)
//!       + Σ lokr  s (w1 ⊗ w2) x    (applied as w1 · X · w2ᵀ, the Kronecker product never built)
//! ```
//!
//! Additive deltas commute, and so do the IA³ products; order only matters for prompt tuning,
//! whose virtual tokens are prepended in the set's order (manifest `load_order`, then the
//! order the request listed). Each formula reduces to PEFT's for a single adapter.
//!
//! Module map: `peft` (adapter_config.json + safetensors, target selection), `manifest`,
//! `lora`/`dora`/`ia3`/`lokr`/`prompt` (one file per kind), `load` (building an expert against
//! a base model), `registry` (names → resident experts).

pub mod dora;
pub mod ia3;
pub mod load;
pub mod lokr;
pub mod lora;
pub mod manifest;
pub mod peft;
pub mod prompt;
pub mod registry;
pub mod router;
mod st_header;

use std::sync::Arc;

use candle_core::{Device, Tensor};

use crate::error::Result;
use crate::model::adapt::Adapters;
use crate::model::linear::Linear;

pub use crate::model::adapt::{Proj, Slot};
pub use load::{load_expert, ExpertLoadOptions};
pub use manifest::Manifest;
pub use registry::Registry;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertKind {
    Lora,
    Dora,
    Ia3,
    Lokr,
    Prompt,
}

impl ExpertKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lora => "lora",
            Self::Dora => "dora",
            Self::Ia3 => "ia3",
            Self::Lokr => "lokr",
            Self::Prompt => "prompt",
        }
    }
}

/// What one expert does to one linear module.
pub enum ModuleAdapter {
    Lora(lora::LowRank),
    Dora(dora::Dora),
    Ia3(ia3::Ia3),
    Lokr(lokr::Lokr),
}

impl ModuleAdapter {
    /// Every tensor the adapter holds (not the matrices read in place from a file's map).
    pub fn tensors_mut(&mut self) -> Vec<&mut Tensor> {
        match self {
            Self::Lora(l) => [l.a.tensor_mut(), l.b.tensor_mut()].into_iter().flatten().collect(),
            Self::Dora(d) => {
                let mut v: Vec<&mut Tensor> = [d.lr.a.tensor_mut(), d.lr.b.tensor_mut()].into_iter().flatten().collect();
                v.extend([&mut d.g, &mut d.g_minus_1]);
                v
            }
            Self::Ia3(a) => vec![&mut a.scale],
            Self::Lokr(k) => {
                let mut v = vec![&mut k.w1, &mut k.w2];
                v.extend(k.out_perm.as_mut());
                v
            }
        }
    }
}

/// A resident adapter. Immutable once loaded; shared by the registry and every request that
/// pinned it, so `unload` frees its memory when the last running request ends.
pub struct Expert {
    /// Unique per load: a session's cache records the ids it was computed under, so a name
    /// reloaded with other weights never reuses stale keys/values.
    pub id: u64,
    pub name: String,
    pub kind: ExpertKind,
    /// LoRA/DoRA/LoKr rank (the largest, when `rank_pattern` varies it).
    pub rank: Option<usize>,
    /// Module names it targets (`q_proj`, …), sorted and deduplicated.
    pub target_modules: Vec<String>,
    /// Memory held by its weights, those read in place from the file's map included.
    pub bytes: usize,
    /// Of `bytes`, the matrices read in place from the memory-mapped file (page cache, shared
    /// between the runtimes that map it; never copied).
    pub mapped_bytes: usize,
    /// Tensors of a multimodal model's vision tower or projector in the adapter file: images
    /// are not an input here, so they cannot change an output and are not loaded.
    pub skipped_vision_tensors: usize,
    pub manifest: Option<Manifest>,
    /// The manifest's `routing.examples`, embedded with the base model (mean-pooled, unit
    /// length), in the manifest's order.
    pub examples: Vec<Vec<f32>>,
    /// Where it was loaded from and the scale it is applied with: what [`Self::fingerprint`]
    /// hashes.
    pub source: Option<(std::path::PathBuf, f64)>,
    /// [`Self::fingerprint`], once computed: at load where the runtime keeps a disk tier of
    /// its prefix cache (it keys the blocks computed under the adapter there), else when a
    /// session computed under it is first saved.
    fingerprint: std::sync::OnceLock<std::result::Result<[u8; 32], String>>,
    /// Indexed by [`Slot::index`].
    modules: Vec<Option<ModuleAdapter>>,
    /// Prompt tuning: `[num_virtual_tokens, hidden]` in the model dtype.
    prompt: Option<Tensor>,
    /// Where the tensors live: the last reference may go on any thread (see `Drop`).
    device: Device,
}

impl Drop for Expert {
    /// Binds the device's context to the dropping thread before the tensors are freed (an
    /// unload from the JS thread, a request finishing on the engine thread).
    fn drop(&mut self) {
        let _ = crate::backend::bind_thread(&self.device);
    }
}

impl Expert {
    /// A SHA-256 over the adapter's files and its scale ([`fingerprint`]): the same adapter
    /// loaded again, under any name and in any process, has the same one. Reads the files the
    /// first time (call it off the engine thread).
    pub fn fingerprint(&self) -> Result<[u8; 32]> {
        self.fingerprint
            .get_or_init(|| match &self.source {
                Some((path, scale)) => fingerprint(path, *scale).map_err(|e| e.to_string()),
                None => Err(format!("the expert '{}' was not loaded from files", self.name)),
            })
            .clone()
            .map_err(crate::error::EngineError::InvalidArgument)
    }

    /// [`Self::fingerprint`] if it was computed already.
    pub fn known_fingerprint(&self) -> Option<[u8; 32]> {
        self.fingerprint.get().and_then(|r| r.as_ref().ok().copied())
    }

    pub fn load_order(&self) -> i64 {
        self.manifest.as_ref().map_or(0, |m| m.load_order)
    }

    fn module(&self, slot: Slot) -> Option<&ModuleAdapter> {
        self.modules.get(slot.index()).and_then(|m| m.as_ref())
    }

    pub fn num_virtual_tokens(&self) -> usize {
        self.prompt.as_ref().map_or(0, |p| p.dim(0).unwrap_or(0))
    }
}

/// The experts one request runs under, in application order. Cheap to clone; holding one pins
/// its experts in memory.
#[derive(Clone, Default)]
pub struct ExpertSet {
    experts: Arc<Vec<Arc<Expert>>>,
}

impl ExpertSet {
    pub fn none() -> Self {
        Self::default()
    }

    /// Orders `experts` by manifest `load_order`, then by their order in the list (stable).
    pub fn new(mut experts: Vec<Arc<Expert>>) -> Self {
        experts.sort_by_key(|e| e.load_order());
        Self { experts: Arc::new(experts) }
    }

    pub fn is_empty(&self) -> bool {
        self.experts.is_empty()
    }

    pub fn experts(&self) -> &[Arc<Expert>] {
        &self.experts
    }

    /// The load ids, in order: what a KV cache computed under this set is keyed by.
    pub fn key(&self) -> Vec<u64> {
        self.experts.iter().map(|e| e.id).collect()
    }

    /// What the prefix cache's disk tier keys blocks computed under this set by: a hash of the
    /// adapters' fingerprints in order (stable across loads and processes); `None` when one
    /// has none computed yet. Never reads a file.
    pub fn disk_key(&self) -> Option<[u8; 32]> {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(b"expert set");
        for e in self.experts.iter() {
            h.update(e.known_fingerprint()?);
        }
        Some(h.finalize().into())
    }

    /// Virtual tokens prepended at position 0 (prompt tuning), summed over the set.
    pub fn num_virtual_tokens(&self) -> usize {
        self.experts.iter().map(|e| e.num_virtual_tokens()).sum()
    }
}

impl Adapters for ExpertSet {
    fn key(&self) -> Vec<u64> {
        ExpertSet::key(self)
    }

    fn num_virtual_tokens(&self) -> usize {
        ExpertSet::num_virtual_tokens(self)
    }

    /// The prompt-tuning embeddings of the set, concatenated in order: `[n, hidden]`.
    fn virtual_embeddings(&self) -> Result<Option<Tensor>> {
        let parts: Vec<&Tensor> = self.experts.iter().filter_map(|e| e.prompt.as_ref()).collect();
        Ok(match parts.len() {
            0 => None,
            1 => Some(parts[0].clone()),
            _ => Some(Tensor::cat(&parts, 0)?),
        })
    }

    /// Whether any expert of the set adapts `slot`.
    fn touches(&self, slot: Slot) -> bool {
        self.experts.iter().any(|e| e.module(slot).is_some())
    }

    /// `lin(x)` with every active adapter of `slot` applied (see the module docs), reusing
    /// `base = x Wᵀ` (bias-free) when the caller already computed it for these rows. IA³ on
    /// the input changes the base product, so it is recomputed then.
    fn linear(&self, lin: &Linear, x: &Tensor, slot: Slot, base: Option<Tensor>) -> Result<Tensor> {
        let with_bias = |y: Tensor| -> Result<Tensor> {
            Ok(match &lin.bias {
                Some(b) => y.broadcast_add(b)?,
                None => y,
            })
        };
        let mut scale_in: Option<Tensor> = None;
        let mut scale_out: Option<Tensor> = None;
        let mut doras = Vec::new();
        let mut low_ranks = Vec::new();
        let mut lokrs = Vec::new();
        for e in self.experts.iter() {
            match e.module(slot) {
                None => {}
                Some(ModuleAdapter::Ia3(a)) => {
                    let s = if a.on_input { &mut scale_in } else { &mut scale_out };
                    *s = Some(match s.take() {
                        None => a.scale.clone(),
                        Some(prev) => (prev * &a.scale)?,
                    });
                }
                Some(ModuleAdapter::Dora(d)) => doras.push(d),
                Some(ModuleAdapter::Lora(l)) => low_ranks.push(l),
                Some(ModuleAdapter::Lokr(k)) => lokrs.push(k),
            }
        }
        let base = if scale_in.is_some() { None } else { base };

        // 1. The base layer, its input and output rescaled by IA³.
        let x_in = match &scale_in {
            Some(s) => x.broadcast_mul(s)?,
            None => x.clone(),
        };
        let base = match base {
            Some(b) => b,
            None => lin.forward_no_bias(&x_in)?,
        };
        let mut y = if doras.is_empty() {
            with_bias(base)?
        } else {
            // DoRA rescales the bias-free base output; the bias is added back after.
            let mut y = base.clone();
            for d in &doras {
                y = (y + d.delta(x, &base)?)?;
            }
            with_bias(y)?
        };
        if let Some(s) = &scale_out {
            y = y.broadcast_mul(s)?;
        }

        // 2. Additive deltas on the original input.
        if !low_ranks.is_empty() {
            y = lora::add_deltas(y, x, &low_ranks)?;
        }
        for k in &lokrs {
            y = (y + k.delta(x)?)?;
        }
        Ok(y)
    }

    fn low_ranks(&self, slot: Slot) -> Option<Vec<(&Tensor, &Tensor, f64)>> {
        let mut out = Vec::new();
        for e in self.experts.iter() {
            match e.module(slot) {
                None => {}
                Some(ModuleAdapter::Lora(l)) => match (&l.a, &l.b) {
                    (lora::Factor::Tensor(a), lora::Factor::Tensor(b)) => out.push((a, b, l.scale)),
                    _ => return None,
                },
                Some(_) => return None,
            }
        }
        Some(out)
    }
}

/// A SHA-256 over the files of the adapter at `path` that shape its outputs (its
/// `adapter_config.json` and weight files, in name order; a file path is hashed alone) and
/// the `scale` it is applied with. Reads the files.
pub fn fingerprint(path: &std::path::Path, scale: f64) -> Result<[u8; 32]> {
    use sha2::{Digest, Sha256};
    let files =
        crate::files::content_files(path, |n| n == "adapter_config.json" || n.ends_with(".safetensors") || n.ends_with(".bin"))
            .map_err(|e| crate::error::EngineError::Io(format!("cannot list {}: {e}", path.display())))?;
    let mut h = Sha256::new();
    h.update(scale.to_bits().to_le_bytes());
    crate::files::hash_files(&mut h, &files)
        .map_err(|(f, e)| crate::error::EngineError::Io(format!("cannot read {}: {e}", f.display())))?;
    Ok(h.finalize().into())
}
