//! The seam between the decoder and run-time adapters.
//!
//! The decoder names its linear modules by [`Slot`] (`layer × projection`) and hands every
//! projection to the [`Adapters`] of the rows being computed; it knows nothing of PEFT. The
//! expert layer (`crate::experts`) implements [`Adapters`] for its `ExpertSet`, so the
//! dependency runs one way: experts → model.
//!
//! A batch whose rows run under different adapter sets is cut into [`Segment`]s;
//! [`linear_segments`] runs the base product once over every row and lets each segment's
//! adapters change only that segment's rows (S-LoRA / Punica style).

use candle_core::Tensor;

use super::linear::Linear;
use crate::error::Result;

/// The linear projections of a decoder layer that adapters may target, in a fixed order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Proj {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
    /// A Gated DeltaNet's projections (Qwen3.5's `linear_attn`): queries, keys and values,
    /// the output gate, the output.
    LinQkv,
    LinZ,
    LinOut,
}

impl Proj {
    pub const ALL: [Proj; 10] =
        [Proj::Q, Proj::K, Proj::V, Proj::O, Proj::Gate, Proj::Up, Proj::Down, Proj::LinQkv, Proj::LinZ, Proj::LinOut];

    /// The HF module name, e.g. `q_proj`.
    pub fn name(self) -> &'static str {
        match self {
            Proj::Q => "q_proj",
            Proj::K => "k_proj",
            Proj::V => "v_proj",
            Proj::O => "o_proj",
            Proj::Gate => "gate_proj",
            Proj::Up => "up_proj",
            Proj::Down => "down_proj",
            Proj::LinQkv => "in_proj_qkv",
            Proj::LinZ => "in_proj_z",
            Proj::LinOut => "out_proj",
        }
    }

    /// `self_attn`, `mlp` or `linear_attn`.
    pub fn block(self) -> &'static str {
        match self {
            Proj::Q | Proj::K | Proj::V | Proj::O => "self_attn",
            Proj::Gate | Proj::Up | Proj::Down => "mlp",
            Proj::LinQkv | Proj::LinZ | Proj::LinOut => "linear_attn",
        }
    }

    pub fn from_name(s: &str) -> Option<Proj> {
        Proj::ALL.into_iter().find(|p| p.name() == s)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Which of a model's projections its checkpoint stores fused (Phi-3: `self_attn.qkv_proj` holds
/// the Q, K and V rows, `mlp.gate_up_proj` the gate's then the up projection's). The decoder
/// reads a fused tensor as its parts, so slots are the same seven everywhere; adapters trained
/// on the fused modules name them by the fused name and are cut into the parts at load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fused {
    pub qkv: bool,
    pub gate_up: bool,
}

impl Fused {
    /// The module name that holds `proj` in the checkpoint: `qkv_proj` / `gate_up_proj` where
    /// fused, else the projection's own.
    pub fn module_name(self, proj: Proj) -> &'static str {
        match proj {
            Proj::Q | Proj::K | Proj::V if self.qkv => "qkv_proj",
            Proj::Gate | Proj::Up if self.gate_up => "gate_up_proj",
            p => p.name(),
        }
    }

    /// The projections module `name` holds, in row order; empty when it names none.
    pub fn parts(self, name: &str) -> &'static [Proj] {
        match name {
            "qkv_proj" if self.qkv => &[Proj::Q, Proj::K, Proj::V],
            "gate_up_proj" if self.gate_up => &[Proj::Gate, Proj::Up],
            _ => match Proj::from_name(name) {
                Some(p) if self.module_name(p) == p.name() => &Proj::ALL[p.index()..=p.index()],
                _ => &[],
            },
        }
    }
}

/// One linear module of the model: `(layer, projection)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Slot {
    pub layer: usize,
    pub proj: Proj,
}

impl Slot {
    pub fn new(layer: usize, proj: Proj) -> Self {
        Self { layer, proj }
    }

    /// Dense index into a per-module table (`layers × Proj::ALL.len()`).
    pub fn index(self) -> usize {
        self.layer * Proj::ALL.len() + self.proj.index()
    }

    /// `model.layers.{i}.self_attn.q_proj`: the HF module path.
    pub fn path(self) -> String {
        format!("model.layers.{}.{}.{}", self.layer, self.proj.block(), self.proj.name())
    }
}

/// What the decoder asks of the adapters a group of rows runs under.
pub trait Adapters: Sync {
    /// Identifies the set: rows with equal keys share one segment (and one KV prefix).
    fn key(&self) -> Vec<u64>;

    /// Virtual tokens prepended at position 0 (prompt tuning).
    fn num_virtual_tokens(&self) -> usize;

    /// Their embeddings, `[n, hidden]`, when there are any.
    fn virtual_embeddings(&self) -> Result<Option<Tensor>>;

    /// Whether the set changes module `slot` at all.
    fn touches(&self, slot: Slot) -> bool;

    /// `lin(x)` with the set's adapters of `slot` applied; `base` is `x Wᵀ` without bias when
    /// the caller already computed it for these rows.
    fn linear(&self, lin: &Linear, x: &Tensor, slot: Slot, base: Option<Tensor>) -> Result<Tensor>;

    /// The set's adapters of `slot` when all of them are plain LoRAs held as tensors: each one's
    /// `A [r, in]`, `B [out, r]` and scale, in order (empty when none touches the slot). `None`
    /// when the set holds anything else there (DoRA, IA³, LoKr, factors read from a file's map):
    /// the CUDA decode path runs low-rank adapters itself and leaves other sets to `linear`.
    fn low_ranks(&self, _slot: Slot) -> Option<Vec<(&Tensor, &Tensor, f64)>> {
        None
    }
}

/// The base model alone.
pub struct NoAdapters;

impl Adapters for NoAdapters {
    fn key(&self) -> Vec<u64> {
        Vec::new()
    }

    fn num_virtual_tokens(&self) -> usize {
        0
    }

    fn virtual_embeddings(&self) -> Result<Option<Tensor>> {
        Ok(None)
    }

    fn touches(&self, _: Slot) -> bool {
        false
    }

    fn linear(&self, lin: &Linear, x: &Tensor, _: Slot, _: Option<Tensor>) -> Result<Tensor> {
        lin.forward(x)
    }

    fn low_ranks(&self, _slot: Slot) -> Option<Vec<(&Tensor, &Tensor, f64)>> {
        Some(Vec::new())
    }
}

/// Consecutive batch rows that run under one adapter set.
#[derive(Clone, Copy)]
pub struct Segment<'a> {
    pub start: usize,
    pub len: usize,
    pub adapters: &'a dyn Adapters,
}

/// `lin(x)` for a batch whose rows use different adapter sets (`segments` cover the rows in
/// order). The base product runs once over every row; each segment's adapters then apply to
/// that segment's rows only, never to the whole batch. Segments whose set leaves `slot` alone
/// take the base output as it is.
pub fn linear_segments(lin: &Linear, x: &Tensor, slot: Slot, segments: &[Segment]) -> Result<Tensor> {
    if let [only] = segments {
        return only.adapters.linear(lin, x, slot, None);
    }
    if !segments.iter().any(|s| s.adapters.touches(slot)) {
        return lin.forward(x);
    }
    let base = lin.forward_no_bias(x)?;
    let mut pieces = Vec::with_capacity(segments.len());
    let mut plain: Option<(usize, usize)> = None; // a run of untouched rows, emitted lazily
    let flush = |plain: &mut Option<(usize, usize)>, pieces: &mut Vec<Tensor>| -> Result<()> {
        if let Some((start, len)) = plain.take() {
            let b = base.narrow(0, start, len)?;
            pieces.push(match &lin.bias {
                Some(bias) => b.broadcast_add(bias)?,
                None => b,
            });
        }
        Ok(())
    };
    for s in segments {
        if !s.adapters.touches(slot) {
            plain = Some(match plain {
                Some((start, len)) => (start, len + s.len),
                None => (s.start, s.len),
            });
            continue;
        }
        flush(&mut plain, &mut pieces)?;
        let xs = x.narrow(0, s.start, s.len)?;
        pieces.push(s.adapters.linear(lin, &xs, slot, Some(base.narrow(0, s.start, s.len)?))?);
    }
    flush(&mut plain, &mut pieces)?;
    Ok(Tensor::cat(&pieces, 0)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fused_modules_name_their_parts_in_row_order() {
        let phi3 = Fused { qkv: true, gate_up: true };
        assert_eq!(phi3.parts("qkv_proj"), &[Proj::Q, Proj::K, Proj::V]);
        assert_eq!(phi3.parts("gate_up_proj"), &[Proj::Gate, Proj::Up]);
        assert_eq!(phi3.parts("o_proj"), &[Proj::O]);
        // A fused model has no separate q_proj; a plain one has no qkv_proj.
        assert!(phi3.parts("q_proj").is_empty() && Fused::default().parts("qkv_proj").is_empty());
        assert_eq!(Fused::default().parts("up_proj"), &[Proj::Up]);
        assert_eq!(
            (phi3.module_name(Proj::K), phi3.module_name(Proj::Up), phi3.module_name(Proj::Down)),
            ("qkv_proj", "gate_up_proj", "down_proj")
        );
    }
}
