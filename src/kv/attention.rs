//! Attention over the paged KV pool: every query row of a batch attends to the keys and values
//! of its own sequence, read through that sequence's block table.
//!
//! Design:
//! - **[`paged_attention`] is the one seam where attention is backend-specific.** The decoder
//!   hands it the batch's queries, an [`AttentionPlan`] built once per pass from one [`SeqSpan`]
//!   per sequence (its rows, first position and block table) and the pool; it returns the
//!   attention output for every row. On CPU with f32 queries a fused kernel runs over f32,
//!   f16, bf16 or block-quantized (q8_0, q4_0) pools; anything else takes the generic path
//!   (gather the sequence's rows from the pool, widen or dequantize them, then candle's matmul
//!   → softmax → matmul; short decode rows batched, prompt chunks and long decode rows over
//!   key tiles with an online softmax, so no step gathers more than a bounded number of
//!   positions). A CUDA paged-attention kernel replaces the generic path here, behind the
//!   same signature.
//! - Causality comes from positions: the query at position `p` sees positions `0..=p` of its
//!   sequence, or with a layer's sliding window of `w` ([`LayerAttention`]) `p + 1 - w ..= p`.
//!   A tile never reads a position before its first row's window, so blocks behind every
//!   window may be given back to the pool. Decode rows and chunks of prompts mix freely in one
//!   call. Both paths take windows and other score scales.
//! - The fused kernel works per (tile of up to 16 query rows of a sequence, KV head): the rows
//!   of a tile and the `num_heads / num_kv_heads` query heads of a group share every K/V row
//!   load (and its widening or dequantization). Scores `q·k / sqrt(head_dim)`, softmax with
//!   max-subtraction and `Σ p·v` are all f32, each (row, head) summed in the same order
//!   whatever its tile. Items run in parallel (rayon, current pool) when the batch is large
//!   enough to repay the fork/join. Scores live in a thread-local scratch buffer that only
//!   grows, to at most `16 · heads per group · 16,384` floats: rows that see more positions
//!   take an online softmax over key blocks of that size, so a prefill's extra memory is
//!   bounded by the tile and the block, whatever the context, never `heads × seq × seq`.
//! - The kernel is plain Rust with eight independent accumulators, compiled twice: once with
//!   AVX2+FMA enabled (chosen at run time) and once portable; on AVX2 the scores and the
//!   weighted sums run as micro-kernels over blocks of 64 positions gathered as f32 rows
//!   (`attention_x86`), and the softmax's exponentials as 8 lanes of [`crate::simd::exp`]
//!   (products and sums only, no library call). Every form sums in the same order, so a row
//!   gets the same bits on every path and in every tile.

use std::cell::OnceCell;

use candle_core::{CpuStorage, DType, Device, Storage, Tensor};

use super::store::{KvFormat, KvStore};
use super::BlockId;
use crate::backend::cpu_kernels;
use crate::error::{EngineError, Result};

mod fused;
mod generic;
mod rows;

use fused::{fused, KEY_BLOCK};
pub use generic::causal_mask;
use generic::{generic, GenericPlan};
use rows::{Dense, Quantized};

/// One sequence's rows in a batch.
#[derive(Clone, Copy, Debug)]
pub struct SeqSpan<'a> {
    /// First batch row.
    pub row: usize,
    /// Rows (queries) of this sequence.
    pub len: usize,
    /// Position of the first row.
    pub pos: usize,
    /// Block table covering positions `0 .. pos + len`.
    pub blocks: &'a [BlockId],
}

/// What every layer's attention shares within one forward pass, worked out once per pass:
/// which sequence and position each row belongs to, and (for the generic path, on first use)
/// each sequence's slot indices as a tensor on the pool's device.
pub struct AttentionPlan<'a> {
    spans: &'a [SeqSpan<'a>],
    /// Row → (span, query position).
    row_span: Vec<(usize, usize)>,
    /// Σ over rows of the positions each row attends to.
    attended: usize,
    generic: OnceCell<GenericPlan>,
}

impl<'a> AttentionPlan<'a> {
    /// Checks once that every block table covers the positions its rows attend.
    pub fn new(spans: &'a [SeqSpan<'a>], store: &KvStore) -> Self {
        Self::with_window(spans, store, None)
    }

    /// [`Self::new`] for layers with a sliding window of `window` positions: a table needs
    /// to list only the blocks the rows' windows see.
    pub fn with_window(spans: &'a [SeqSpan<'a>], store: &KvStore, window: Option<usize>) -> Self {
        let rows = spans.iter().map(|s| s.row + s.len).max().unwrap_or(0);
        let mut row_span = vec![(0usize, 0usize); rows];
        let mut attended = 0usize;
        for (i, s) in spans.iter().enumerate() {
            for r in 0..s.len {
                row_span[s.row + r] = (i, s.pos + r);
                attended += s.pos + r + 1;
            }
            let last = s.pos + s.len;
            let bs = store.block_size;
            let first = window.map_or(0, |w| (s.pos + 1).saturating_sub(w)) / bs;
            assert!(
                last <= s.blocks.len() * bs
                    && s.blocks[first..last.div_ceil(bs)].iter().all(|&b| (b as usize) < store.num_blocks),
                "block table shorter than the positions attended"
            );
        }
        Self { spans, row_span, attended, generic: OnceCell::new() }
    }
}

/// What differs between the attention layers of a model: the scale of the scores and the
/// sliding window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LayerAttention {
    /// Multiplies `q·k`; `None`: `1/√head_dim`.
    pub scale: Option<f32>,
    /// A row at position `p` sees positions `p + 1 - window ..= p` (HF: `kv > q - window`);
    /// `None`: `0 ..= p`. At least 1.
    pub window: Option<usize>,
}

impl LayerAttention {
    /// Causal attention over every position at `1/√head_dim`.
    pub const FULL: Self = Self { scale: None, window: None };

    fn scale(self, head_dim: usize) -> f32 {
        self.scale.unwrap_or(1.0 / (head_dim as f32).sqrt())
    }
}

/// `q`: `[rows, num_heads · head_dim]`, the keys/values of every row already written to
/// `store`. Returns `[rows, num_heads · head_dim]`.
pub fn paged_attention(
    q: &Tensor,
    plan: &AttentionPlan,
    store: &KvStore,
    layer: usize,
    num_heads: usize,
    how: LayerAttention,
) -> Result<Tensor> {
    if how.window == Some(0) {
        return Err(EngineError::InvalidArgument("a sliding window of 0 positions".into()));
    }
    if let Some(out) = cpu_f32(q, plan, store, layer, num_heads, how)? {
        return Ok(out);
    }
    generic(q, plan, store, layer, num_heads, how)
}

/// The fused CPU kernel, or `None` when it does not apply (device or dtype): f32 queries over
/// an f32, f16, bf16 or block-quantized pool (rows are widened or dequantized as they are read).
fn cpu_f32(
    q: &Tensor,
    plan: &AttentionPlan,
    store: &KvStore,
    layer: usize,
    nh: usize,
    how: LayerAttention,
) -> Result<Option<Tensor>> {
    cpu_f32_blocks(q, plan, store, layer, nh, how, KEY_BLOCK)
}

/// [`cpu_f32`] with key blocks of `block` positions.
fn cpu_f32_blocks(
    q: &Tensor,
    plan: &AttentionPlan,
    store: &KvStore,
    layer: usize,
    nh: usize,
    how: LayerAttention,
    block: usize,
) -> Result<Option<Tensor>> {
    if !cpu_kernels(q.device()) || q.dtype() != DType::F32 {
        return Ok(None);
    }
    let (k, v) = store.layer(layer);
    let q = q.contiguous()?;
    let (qs, ql) = q.storage_and_layout();
    let (ks, kl) = k.storage_and_layout();
    let (vs, vl) = v.storage_and_layout();
    let (Storage::Cpu(CpuStorage::F32(qd)), Some((q0, q1))) = (&*qs, ql.contiguous_offsets()) else {
        return Ok(None);
    };
    let (Some((k0, k1)), Some((v0, v1))) = (kl.contiguous_offsets(), vl.contiguous_offsets()) else {
        return Ok(None);
    };
    let qd = &qd[q0..q1];
    let shape = store.shape(layer);
    let hd = shape.head_dim;
    let dense = |g: usize| store.head_rows(layer, g, hd);
    let out = match (&*ks, &*vs, store.format) {
        (Storage::Cpu(CpuStorage::F32(kd)), Storage::Cpu(CpuStorage::F32(vd)), KvFormat::Dense(_)) => {
            let (k, v) = (&kd[k0..k1], &vd[v0..v1]);
            fused(qd, plan, (store.block_size, shape), nh, how, block, |g| Dense { k, v, at: dense(g) })
        }
        (Storage::Cpu(CpuStorage::F16(kd)), Storage::Cpu(CpuStorage::F16(vd)), KvFormat::Dense(_)) => {
            let (k, v) = (&kd[k0..k1], &vd[v0..v1]);
            fused(qd, plan, (store.block_size, shape), nh, how, block, |g| Dense { k, v, at: dense(g) })
        }
        (Storage::Cpu(CpuStorage::BF16(kd)), Storage::Cpu(CpuStorage::BF16(vd)), KvFormat::Dense(_)) => {
            let (k, v) = (&kd[k0..k1], &vd[v0..v1]);
            fused(qd, plan, (store.block_size, shape), nh, how, block, |g| Dense { k, v, at: dense(g) })
        }
        (Storage::Cpu(CpuStorage::U8(kd)), Storage::Cpu(CpuStorage::U8(vd)), KvFormat::Quant(quant)) => {
            let Some((kscale, vscale)) = store.scales(layer) else { return Ok(None) };
            let (kss, ksl) = kscale.storage_and_layout();
            let (vss, vsl) = vscale.storage_and_layout();
            let (Storage::Cpu(CpuStorage::F16(ksd)), Storage::Cpu(CpuStorage::F16(vsd)), Some((a0, a1)), Some((b0, b1))) =
                (&*kss, &*vss, ksl.contiguous_offsets(), vsl.contiguous_offsets())
            else {
                return Ok(None);
            };
            let (k, v, kd, vd) = (&kd[k0..k1], &vd[v0..v1], &ksd[a0..a1], &vsd[b0..b1]);
            let (qhd, nb) = (quant.packed_cols(hd), hd / super::quant::BLOCK);
            fused(qd, plan, (store.block_size, shape), nh, how, block, |g| Quantized {
                quant,
                k,
                v,
                kd,
                vd,
                q: store.head_rows(layer, g, qhd),
                d: store.head_rows(layer, g, nb),
                hd,
            })
        }
        _ => return Ok(None),
    };
    drop((qs, ks, vs));
    Ok(Some(Tensor::from_vec(out, q.dims2()?, &Device::Cpu)?))
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod window_tests;
