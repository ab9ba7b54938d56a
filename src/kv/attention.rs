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
//!   sequence. Decode rows and chunks of prompts mix freely in one call.
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
//!   (`attention_x86`), and the softmax's exponentials as 8 lanes of [`simd::exp`] (products
//!   and sums only, no library call). Every form sums in the same order, so a row gets the
//!   same bits on every path and in every tile.

use std::cell::{OnceCell, RefCell};

use candle_core::{CpuStorage, DType, Device, Storage, Tensor};
use rayon::prelude::*;

use super::quant::{dequant_row, Quant};
use super::store::{KvFormat, KvStore};
use super::BlockId;
use crate::backend::cpu_kernels;
use crate::error::Result;
use crate::simd::{self, Level};

/// Below this many multiply-adds in a call, run inline.
const PAR_MIN_MACS: usize = 1 << 16;

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Keys or values of up to [`GATHER`] positions, widened to f32 rows side by side.
    #[cfg(target_arch = "x86_64")]
    static GATHERED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Positions gathered at a time for the AVX2 micro-kernels of a prompt tile (32 KiB of f32
/// rows at a head size of 128: they stay in L1 while every row of the tile reads them, and a
/// narrower pool is widened once for all of them).
#[cfg(target_arch = "x86_64")]
const GATHER: usize = 64;

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

/// The generic path's index tensors for one pass, uploaded once and shared by every layer.
/// Decode rows (one query each) run batched: sequences sorted by length are grouped, each
/// group's keys gathered into one padded `[rows, kv_heads, longest, head_dim]` tensor, padding
/// masked out. Prompt chunks, and decode rows too long for a group, run one sequence at a
/// time over key tiles with a causal mask.
struct GenericPlan {
    decode: Vec<DecodeGroup>,
    /// `(span index, slot of every position, causal mask [len, len] over the chunk's own
    /// positions)` of the multi-row spans.
    chunks: Vec<(usize, Tensor, Tensor)>,
    /// Output row `r` is row `perm[r]` of the groups' and chunks' outputs concatenated, when
    /// that order is not already the batch order.
    perm: Option<Tensor>,
}

struct DecodeGroup {
    /// Batch rows of the group's queries: consecutive from a first row (a view, no gather), or
    /// an index.
    rows: GroupRows,
    /// `[n · longest]` pool slots, row-major; padding points at slot 0 (masked).
    slots: Tensor,
    /// `[n, 1, 1, longest]`: 0 for a sequence's positions, -inf for its padding; `None` when
    /// every sequence of the group has the same length (no padding).
    mask: Option<Tensor>,
    n: usize,
    longest: usize,
}

enum GroupRows {
    From(usize),
    Index(Tensor),
}

/// How the generic path bounds what it gathers per step.
#[derive(Clone, Copy, Debug)]
struct Tiling {
    /// Key positions per tile of a prompt chunk's online softmax.
    key_tile: usize,
    /// Decode groups hold at most this many (sequence, position) pairs: the gathered K and V
    /// of one layer are `pairs · kv_heads · head_dim` elements each. A decode row that alone
    /// attends more positions runs like a one-row chunk, over key tiles of this size.
    decode_positions: usize,
}

const TILING: Tiling = Tiling { key_tile: 1024, decode_positions: 1 << 15 };

impl<'a> AttentionPlan<'a> {
    /// Checks once that every block table covers the positions its rows attend.
    pub fn new(spans: &'a [SeqSpan<'a>], store: &KvStore) -> Self {
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
            assert!(
                last <= s.blocks.len() * bs && s.blocks[..last.div_ceil(bs)].iter().all(|&b| (b as usize) < store.num_blocks),
                "block table shorter than the positions attended"
            );
        }
        Self { spans, row_span, attended, generic: OnceCell::new() }
    }

    fn generic(&self, store: &KvStore, device: &Device, tiling: Tiling) -> Result<&GenericPlan> {
        if self.generic.get().is_none() {
            let _ = self.generic.set(self.build_generic(store, device, tiling)?);
        }
        Ok(self.generic.get().expect("just set"))
    }

    fn build_generic(&self, store: &KvStore, device: &Device, tiling: Tiling) -> Result<GenericPlan> {
        let bs = store.block_size;
        let slots_of = |blocks: &[BlockId], total: usize| -> Vec<u32> {
            (0..total).map(|p| super::store::slot_of(blocks, bs, p) as u32).collect()
        };
        // Output order: decode groups, then chunks.
        let mut order: Vec<usize> = Vec::with_capacity(self.row_span.len());
        // Decode rows that fit a group are batched; longer ones join the chunks (tiled).
        let grouped = |s: &SeqSpan| s.len == 1 && s.pos < tiling.decode_positions;
        let mut decode_spans: Vec<&SeqSpan> = self.spans.iter().filter(|s| grouped(s)).collect();
        decode_spans.sort_by_key(|s| s.pos);
        let mut decode = Vec::new();
        let mut i = 0;
        while i < decode_spans.len() {
            // Sorted by length: the group's longest is its last member.
            let mut j = i + 1;
            while j < decode_spans.len() && (j + 1 - i) * (decode_spans[j].pos + 1) <= tiling.decode_positions {
                j += 1;
            }
            let group = &decode_spans[i..j];
            let longest = group.last().expect("non-empty").pos + 1;
            // A mask only where some member is shorter than the longest (padding to hide).
            let padded = group.iter().any(|s| s.pos + 1 != longest);
            let mut slots = Vec::with_capacity(group.len() * longest);
            let mut mask = Vec::with_capacity(if padded { group.len() * longest } else { 0 });
            for s in group {
                let total = s.pos + 1;
                slots.extend(slots_of(s.blocks, total));
                slots.extend(std::iter::repeat_n(0u32, longest - total));
                if padded {
                    mask.extend((0..longest).map(|p| if p < total { 0f32 } else { f32::NEG_INFINITY }));
                }
                order.push(s.row);
            }
            let rows: Vec<u32> = group.iter().map(|s| s.row as u32).collect();
            let consecutive = rows.windows(2).all(|w| w[1] == w[0] + 1);
            decode.push(DecodeGroup {
                rows: if consecutive {
                    GroupRows::From(rows[0] as usize)
                } else {
                    GroupRows::Index(Tensor::from_vec(rows, group.len(), device)?)
                },
                slots: Tensor::from_vec(slots, group.len() * longest, device)?,
                mask: padded.then(|| Tensor::from_vec(mask, (group.len(), 1, 1, longest), device)).transpose()?,
                n: group.len(),
                longest,
            });
            i = j;
        }
        let mut chunks = Vec::new();
        for (si, s) in self.spans.iter().enumerate().filter(|(_, s)| !grouped(s)) {
            let total = s.pos + s.len;
            let slots = Tensor::from_vec(slots_of(s.blocks, total), total, device)?;
            chunks.push((si, slots, causal_mask(s.len, 0, device)?));
            order.extend(s.row..s.row + s.len);
        }
        // perm[r] = where batch row r sits in `order`.
        let mut perm = vec![0u32; order.len()];
        for (at, &row) in order.iter().enumerate() {
            perm[row] = at as u32;
        }
        let identity = perm.iter().enumerate().all(|(r, &p)| p as usize == r);
        let perm = if identity { None } else { Some(Tensor::from_vec(perm, order.len(), device)?) };
        Ok(GenericPlan { decode, chunks, perm })
    }
}

/// `q`: `[rows, num_heads · head_dim]`, the keys/values of every row already written to
/// `store`. Returns `[rows, num_heads · head_dim]`.
pub fn paged_attention(q: &Tensor, plan: &AttentionPlan, store: &KvStore, layer: usize, num_heads: usize) -> Result<Tensor> {
    if let Some(out) = cpu_f32(q, plan, store, layer, num_heads)? {
        return Ok(out);
    }
    generic(q, plan, store, layer, num_heads)
}

/// The fused CPU kernel, or `None` when it does not apply (device or dtype): f32 queries over
/// an f32, f16, bf16 or block-quantized pool (rows are widened or dequantized as they are read).
fn cpu_f32(q: &Tensor, plan: &AttentionPlan, store: &KvStore, layer: usize, nh: usize) -> Result<Option<Tensor>> {
    cpu_f32_blocks(q, plan, store, layer, nh, KEY_BLOCK)
}

/// [`cpu_f32`] with key blocks of `block` positions.
fn cpu_f32_blocks(
    q: &Tensor,
    plan: &AttentionPlan,
    store: &KvStore,
    layer: usize,
    nh: usize,
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
    let hd = store.head_dim;
    let dense = |g: usize| store.head_rows(g, hd);
    let out = match (&*ks, &*vs, store.format) {
        (Storage::Cpu(CpuStorage::F32(kd)), Storage::Cpu(CpuStorage::F32(vd)), KvFormat::Dense(_)) => {
            let (k, v) = (&kd[k0..k1], &vd[v0..v1]);
            fused(qd, plan, store, nh, block, |g| Dense { k, v, at: dense(g) })
        }
        (Storage::Cpu(CpuStorage::F16(kd)), Storage::Cpu(CpuStorage::F16(vd)), KvFormat::Dense(_)) => {
            let (k, v) = (&kd[k0..k1], &vd[v0..v1]);
            fused(qd, plan, store, nh, block, |g| Dense { k, v, at: dense(g) })
        }
        (Storage::Cpu(CpuStorage::BF16(kd)), Storage::Cpu(CpuStorage::BF16(vd)), KvFormat::Dense(_)) => {
            let (k, v) = (&kd[k0..k1], &vd[v0..v1]);
            fused(qd, plan, store, nh, block, |g| Dense { k, v, at: dense(g) })
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
            fused(qd, plan, store, nh, block, |g| Quantized {
                quant,
                k,
                v,
                kd,
                vd,
                q: store.head_rows(g, qhd),
                d: store.head_rows(g, nb),
                hd,
            })
        }
        _ => return Ok(None),
    };
    drop((qs, ks, vs));
    Ok(Some(Tensor::from_vec(out, q.dims2()?, &Device::Cpu)?))
}

/// Query rows of one sequence attended together: each K/V row read (and widened or
/// dequantized) once serves all of them.
const TILE: usize = 16;

/// Key positions per block of the fused kernel's scores: a tile's scratch is at most
/// `TILE · rep · KEY_BLOCK` floats (2 MB for Qwen3-0.6B's 2 query heads per KV head), whatever
/// the context. Rows that see more take an online softmax over blocks.
const KEY_BLOCK: usize = 1 << 14;

/// The fused kernel over one layer's pool, whose KV head `g` is read through `head(g)`. Work
/// items are (tile of up to [`TILE`] consecutive rows of one sequence, KV head).
fn fused<S: KvRows>(
    qd: &[f32],
    plan: &AttentionPlan,
    store: &KvStore,
    nh: usize,
    block: usize,
    head: impl Fn(usize) -> S + Sync,
) -> Vec<f32> {
    let (nkv, hd, bs) = (store.kv_heads, store.head_dim, store.block_size);
    let rep = nh / nkv;
    let width = nh * hd;
    let rows = qd.len() / width;
    let macs = plan.attended * nh * hd;
    let simd = simd::level();
    let scale = 1.0 / (hd as f32).sqrt();
    // (span, first row of the tile within the span, rows).
    let tiles: Vec<(usize, usize, usize)> = plan
        .spans
        .iter()
        .enumerate()
        .flat_map(|(si, s)| (0..s.len).step_by(TILE).map(move |r| (si, r, TILE.min(s.len - r))))
        .collect();
    let item = |i: usize| -> Vec<f32> {
        let ((si, r0, n), g) = (tiles[i / nkv], i % nkv);
        let s = &plan.spans[si];
        let mut q = Vec::with_capacity(n * rep * hd);
        for r in 0..n {
            q.extend_from_slice(&qd[(s.row + r0 + r) * width + g * rep * hd..][..rep * hd]);
        }
        let mut o = vec![0f32; n * rep * hd];
        let view = KvView { rows: head(g), blocks: s.blocks, bs, hd };
        SCORES.with(|sc| {
            let mut sc = sc.borrow_mut();
            let need = n * rep * (s.pos + r0 + n).min(block);
            if sc.len() < need {
                sc.resize(need, 0.0);
            }
            attend(&q, &view, s.pos + r0, n, rep, scale, block, &mut sc[..need], &mut o, simd);
        });
        o
    };
    let parts: Vec<Vec<f32>> = if macs >= PAR_MIN_MACS && tiles.len() * nkv > 1 {
        (0..tiles.len() * nkv).into_par_iter().map(item).collect()
    } else {
        (0..tiles.len() * nkv).map(item).collect()
    };
    let mut out = vec![0f32; rows * width];
    for (i, part) in parts.iter().enumerate() {
        let ((si, r0, _), g) = (tiles[i / nkv], i % nkv);
        for (r, o) in part.chunks_exact(rep * hd).enumerate() {
            out[(plan.spans[si].row + r0 + r) * width + g * rep * hd..][..rep * hd].copy_from_slice(o);
        }
    }
    out
}

/// An element of the KV pool the fused kernel reads: f32 as is; half precision widened to f32
/// (exactly) into a per-thread row buffer first.
trait KvElem: Copy + Send + Sync {
    /// `f(row as f32)`.
    fn with_f32<R>(row: &[Self], f: impl FnOnce(&[f32]) -> R) -> R;

    /// `row` as f32 into `dst` (same length).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the gathering kernels are x86's
    fn widen_into(row: &[Self], dst: &mut [f32]);

    /// `row` where the in-place kernels can read it (f32, f16).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn in_place(row: &[Self]) -> RowPtr {
        let _ = row;
        RowPtr::None
    }
}

/// A pool row the in-place kernels read as it is ([`KvElem::in_place`]).
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
enum RowPtr {
    F32(*const f32),
    F16(*const half::f16),
    None,
}

thread_local! {
    static WIDE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

impl KvElem for f32 {
    #[inline(always)]
    fn with_f32<R>(row: &[f32], f: impl FnOnce(&[f32]) -> R) -> R {
        f(row)
    }

    #[inline(always)]
    fn widen_into(row: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(row)
    }

    #[inline(always)]
    fn in_place(row: &[f32]) -> RowPtr {
        RowPtr::F32(row.as_ptr())
    }
}

macro_rules! half_elem {
    ($t:ty, $widen:ident $(, $ptr:ident)?) => {
        impl KvElem for $t {
            #[inline(always)]
            fn with_f32<R>(row: &[$t], f: impl FnOnce(&[f32]) -> R) -> R {
                WIDE.with(|w| {
                    let mut w = w.borrow_mut();
                    w.resize(row.len(), 0.0);
                    $widen(row, &mut w);
                    f(&w)
                })
            }

            #[inline(always)]
            fn widen_into(row: &[$t], dst: &mut [f32]) {
                $widen(row, dst)
            }
            $(
                #[inline(always)]
                fn in_place(row: &[$t]) -> RowPtr {
                    RowPtr::$ptr(row.as_ptr())
                }
            )?
        }
    };
}
half_elem!(half::f16, widen, F16);
half_elem!(half::bf16, widen_bf16);

/// f16 widened exactly, 8 at a time with F16C where the CPU has it (`half`'s slice
/// conversion, which checks the CPU on every call, took twice as long per row as reading an
/// f32 row from memory).
#[inline(always)]
fn widen(row: &[half::f16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::attention_x86::has_f16c() {
        // SAFETY: F16C (and the AVX it implies) was detected; the lengths are checked inside.
        return unsafe { super::attention_x86::widen_f16(row, dst) };
    }
    use half::slice::HalfFloatSliceExt;
    row.convert_to_f32_slice(dst)
}

/// bf16 widened exactly (its bits are an f32's upper half); the loop vectorises.
#[inline(always)]
fn widen_bf16(row: &[half::bf16], dst: &mut [f32]) {
    for (o, v) in dst.iter_mut().zip(row) {
        *o = f32::from_bits((v.to_bits() as u32) << 16);
    }
}

/// Where the fused kernel reads one KV head's rows from.
trait KvRows: Sync {
    /// `f(row)` of K (`value == false`) or V at pool slot `slot`, as f32.
    fn with_row<R>(&self, value: bool, slot: usize, f: impl FnOnce(&[f32]) -> R) -> R;

    /// The same row written into `dst` (the head size long): no staging buffer between.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn row_into(&self, value: bool, slot: usize, dst: &mut [f32]);

    /// The same row where the in-place kernels can read it, if they can.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn row_ptr(&self, value: bool, slot: usize) -> RowPtr {
        let _ = (value, slot);
        RowPtr::None
    }
}

/// `(stride, offset, len)`: a slot's row is `data[slot · stride + offset ..][..len]`.
type RowAt = (usize, usize, usize);

#[inline(always)]
fn row_of<T>(data: &[T], (stride, offset, len): RowAt, slot: usize) -> &[T] {
    &data[slot * stride + offset..][..len]
}

/// A float pool.
struct Dense<'a, T> {
    k: &'a [T],
    v: &'a [T],
    at: RowAt,
}

impl<T: KvElem> KvRows for Dense<'_, T> {
    #[inline(always)]
    fn with_row<R>(&self, value: bool, slot: usize, f: impl FnOnce(&[f32]) -> R) -> R {
        T::with_f32(row_of(if value { self.v } else { self.k }, self.at, slot), f)
    }

    #[inline(always)]
    fn row_into(&self, value: bool, slot: usize, dst: &mut [f32]) {
        T::widen_into(row_of(if value { self.v } else { self.k }, self.at, slot), dst)
    }

    #[inline(always)]
    fn row_ptr(&self, value: bool, slot: usize) -> RowPtr {
        T::in_place(row_of(if value { self.v } else { self.k }, self.at, slot))
    }
}

/// A block-quantized pool: packed values and their scales, dequantized per row as read.
struct Quantized<'a> {
    quant: Quant,
    k: &'a [u8],
    v: &'a [u8],
    kd: &'a [half::f16],
    vd: &'a [half::f16],
    q: RowAt,
    d: RowAt,
    hd: usize,
}

impl KvRows for Quantized<'_> {
    #[inline(always)]
    fn with_row<R>(&self, value: bool, slot: usize, f: impl FnOnce(&[f32]) -> R) -> R {
        let (q, d) = if value { (self.v, self.vd) } else { (self.k, self.kd) };
        WIDE.with(|w| {
            let mut w = w.borrow_mut();
            w.resize(self.hd, 0.0);
            dequant_row(self.quant, row_of(q, self.q, slot), row_of(d, self.d, slot), &mut w);
            f(&w)
        })
    }

    #[inline(always)]
    fn row_into(&self, value: bool, slot: usize, dst: &mut [f32]) {
        let (q, d) = if value { (self.v, self.vd) } else { (self.k, self.kd) };
        dequant_row(self.quant, row_of(q, self.q, slot), row_of(d, self.d, slot), dst)
    }
}

/// The generic path: per sequence, gather its K/V rows from the pool and attend with candle
/// ops (any device, any dtype).
fn generic(q: &Tensor, plan: &AttentionPlan, store: &KvStore, layer: usize, nh: usize) -> Result<Tensor> {
    generic_tiled(q, plan, store, layer, nh, TILING)
}

fn generic_tiled(q: &Tensor, plan: &AttentionPlan, store: &KvStore, layer: usize, nh: usize, tiling: Tiling) -> Result<Tensor> {
    let (nkv, hd) = (store.kv_heads, store.head_dim);
    let rep = nh / nkv;
    let scale = 1.0 / (hd as f64).sqrt();
    let g = plan.generic(store, q.device(), tiling)?;
    // The pool may hold a narrower dtype than the activations: rows are widened (or
    // dequantized) once gathered.
    let dt = q.dtype();
    let gather = |idx: &Tensor| store.gather(layer, idx, dt);
    let mut outs = Vec::with_capacity(g.decode.len() + g.chunks.len());
    for d in &g.decode {
        let (n, l) = (d.n, d.longest);
        // [n, kv_heads, longest, head_dim]
        let (k, v) = gather(&d.slots)?;
        let k = k.reshape((n, l, nkv, hd))?.transpose(1, 2)?.contiguous()?;
        let v = v.reshape((n, l, nkv, hd))?.transpose(1, 2)?.contiguous()?;
        // Query head h belongs to KV head h / rep: [n, kv_heads, rep, head_dim].
        let qs = match &d.rows {
            GroupRows::From(first) => q.narrow(0, *first, n)?,
            GroupRows::Index(rows) => q.index_select(rows, 0)?,
        };
        let qs = qs.reshape((n, nkv, rep, hd))?;
        let scores = (qs.matmul(&k.t()?)? * scale)?.to_dtype(DType::F32)?;
        let scores = match &d.mask {
            Some(mask) => scores.broadcast_add(mask)?,
            None => scores,
        };
        let probs = candle_nn::ops::softmax_last_dim(&scores)?.to_dtype(v.dtype())?;
        outs.push(probs.matmul(&v)?.reshape((n, nh * hd))?);
    }
    for (si, idx, mask) in &g.chunks {
        let s = &plan.spans[*si];
        let total = s.pos + s.len;
        let rows = rep * s.len;
        // A long decode row has few query rows: larger tiles, fewer steps.
        let key_tile = if s.len == 1 { tiling.decode_positions } else { tiling.key_tile };
        // Query heads sharing a KV head are stacked: [kv_heads, rep · len, head_dim].
        let qs = q.narrow(0, s.row, s.len)?.reshape((s.len, nh, hd))?.transpose(0, 1)?.contiguous()?;
        let qs = qs.reshape((nkv, rows, hd))?;
        // Online softmax over tiles of at most `key_tile` positions (flash-attention style):
        // a running max `m`, sum `l` and unnormalised output `o` per query row, all f32, so a
        // prompt chunk never holds more than [rows, key_tile] scores nor gathers more than a
        // tile of keys and values, whatever the context. Tiles before the chunk's first
        // position are seen by every row (no mask); the chunk's own positions take the causal
        // mask. Every row sees position 0 in the first tile, so `m` is finite after it.
        let dev = q.device();
        let mut m = Tensor::full(f32::NEG_INFINITY, (nkv, rows, 1), dev)?;
        let mut l = Tensor::zeros((nkv, rows, 1), DType::F32, dev)?;
        let mut o = Tensor::zeros((nkv, rows, hd), DType::F32, dev)?;
        let tiles = |from: usize, to: usize| (from..to).step_by(key_tile).map(move |a| (a, key_tile.min(to - a)));
        for (start, n) in tiles(0, s.pos).chain(tiles(s.pos, total)) {
            let (k, v) = gather(&idx.narrow(0, start, n)?)?;
            let k = k.reshape((n, nkv, hd))?.transpose(0, 1)?.contiguous()?;
            let v = v.reshape((n, nkv, hd))?.transpose(0, 1)?.contiguous()?;
            let mut sc = (qs.matmul(&k.t()?)? * scale)?.to_dtype(DType::F32)?;
            if start >= s.pos {
                let tile_mask = mask.narrow(1, start - s.pos, n)?;
                sc = sc.reshape((nkv, rep, s.len, n))?.broadcast_add(&tile_mask)?.reshape((nkv, rows, n))?;
            }
            let m_new = m.maximum(&sc.max_keepdim(2)?)?;
            let p = sc.broadcast_sub(&m_new)?.exp()?;
            let alpha = (&m - &m_new)?.exp()?;
            l = ((&l * &alpha)? + p.sum_keepdim(2)?)?;
            o = (o.broadcast_mul(&alpha)? + p.to_dtype(v.dtype())?.matmul(&v)?.to_dtype(DType::F32)?)?;
            m = m_new;
        }
        let o = o.broadcast_div(&l)?.to_dtype(dt)?;
        outs.push(o.reshape((nh, s.len, hd))?.transpose(0, 1)?.reshape((s.len, nh * hd))?);
    }
    let out = if outs.len() == 1 { outs.pop().expect("one") } else { Tensor::cat(&outs, 0)? };
    Ok(match &g.perm {
        Some(p) => out.index_select(p, 0)?,
        None => out,
    })
}

/// `[seq, pos + seq]`: 0 where query `i` (at position `pos + i`) may see key `j`, else -inf.
pub fn causal_mask(seq: usize, pos: usize, device: &Device) -> Result<Tensor> {
    let total = pos + seq;
    let m: Vec<f32> =
        (0..seq).flat_map(|i| (0..total).map(move |j| if j <= pos + i { 0.0 } else { f32::NEG_INFINITY })).collect();
    Ok(Tensor::from_vec(m, (seq, total), device)?)
}

/// One KV head of one sequence: position `j`'s rows are read from `rows` at pool slot
/// `slot(j)`, through the sequence's block table.
struct KvView<'a, S> {
    rows: S,
    blocks: &'a [BlockId],
    bs: usize,
    hd: usize,
}

impl<S> KvView<'_, S> {
    /// Calls `f(j, slot)` for positions `from..to` with their pool slots.
    #[inline(always)]
    fn for_rows(&self, from: usize, to: usize, mut f: impl FnMut(usize, usize)) {
        for (bi, &b) in self.blocks.iter().enumerate().skip(from / self.bs) {
            let first = bi * self.bs;
            if first >= to {
                break;
            }
            let base = b as usize * self.bs;
            for o in from.saturating_sub(first)..self.bs.min(to - first) {
                f(first + o, base + o);
            }
        }
    }
}

/// A tile of `n` query rows of one sequence (the first at position `p0`) and one KV head:
/// `q`, `out` `[n, rep, hd]`; `sc` `[n · rep, min(p0 + n, block)]` scratch. Row `r` attends
/// positions `0 ..= p0 + r`; each (row, head) is summed in the same order whatever the tile.
/// Up to `block` positions the softmax is one pass; past it, an online softmax over key
/// blocks of `block` positions keeps the scratch bounded whatever the context.
// The innermost kernel, called per tile and head: plain arguments rather than a struct built
// per call.
#[allow(clippy::too_many_arguments)]
fn attend<S: KvRows>(
    q: &[f32],
    kv: &KvView<S>,
    p0: usize,
    n: usize,
    rep: usize,
    scale: f32,
    block: usize,
    sc: &mut [f32],
    out: &mut [f32],
    simd: Level,
) {
    match simd {
        // SAFETY: `Avx2Fma` is only constructed after detecting both features.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2Fma => unsafe { attend_avx2(q, kv, p0, n, rep, scale, block, sc, out) },
        Level::Portable => attend_body(q, kv, p0, n, rep, scale, block, sc, out, Level::Portable),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_avx2<S: KvRows>(
    q: &[f32],
    kv: &KvView<S>,
    p0: usize,
    n: usize,
    rep: usize,
    scale: f32,
    block: usize,
    sc: &mut [f32],
    out: &mut [f32],
) {
    attend_body(q, kv, p0, n, rep, scale, block, sc, out, Level::Avx2Fma)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_body<S: KvRows>(
    q: &[f32],
    kv: &KvView<S>,
    p0: usize,
    n: usize,
    rep: usize,
    scale: f32,
    block: usize,
    sc: &mut [f32],
    out: &mut [f32],
    simd: Level,
) {
    let len = p0 + n;
    if len > block {
        return attend_blocked(q, kv, p0, n, rep, scale, block, sc, out, simd);
    }
    // 1. Scores: position j is seen by the rows at positions ≥ j.
    scores(q, kv, p0, n, rep, scale, (0, len), len, sc, simd);
    // 2. Softmax per (row, query head) over what that row sees.
    for (qi, s) in sc.chunks_mut(len).take(n * rep).enumerate() {
        let s = &mut s[..p0 + qi / rep + 1];
        let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum = simd::exp_sub_sum_at(simd, s, m);
        let inv = 1.0 / sum;
        s.iter_mut().for_each(|x| *x *= inv);
    }
    // 3. Weighted sum of values.
    out.fill(0.0);
    weigh_values(kv, p0, n, rep, (0, len), len, sc, out, simd);
}

/// Scores `q·k · scale` of positions `from..to` for the rows that see them, into `sc` rows of
/// `stride` (column `j - from`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn scores<S: KvRows>(
    q: &[f32],
    kv: &KvView<S>,
    p0: usize,
    n: usize,
    rep: usize,
    scale: f32,
    (from, to): (usize, usize),
    stride: usize,
    sc: &mut [f32],
    simd: Level,
) {
    let hd = kv.hd;
    #[cfg(target_arch = "x86_64")]
    if simd == Level::Avx2Fma && hd.is_multiple_of(8) {
        let q_row = |qi: usize| &q[qi * hd..(qi + 1) * hd];
        let done = in_place(kv, false, p0, n, rep, (from, to), |qi, j0, rows, seen| {
            let o = &mut sc[qi * stride + j0 - from..][..seen];
            // SAFETY: `in_place` runs only with F16C, `Avx2Fma` means AVX2 and FMA; `hd` is a
            // multiple of 8 and every row pointer is a pool row of `hd` values.
            unsafe {
                match rows {
                    InPlace::F32(r) => super::attention_x86::scores_in_place(q_row(qi), &r, scale, o),
                    InPlace::F16(r) => super::attention_x86::scores_in_place(q_row(qi), &r, scale, o),
                }
            }
        });
        if done {
            return;
        }
        return gathered(kv, false, p0, n, rep, (from, to), |qi, j0, keys, seen| {
            // SAFETY: `Avx2Fma` is only constructed after detecting AVX2 and FMA; `hd` is a
            // multiple of 8 and `keys` holds `seen` rows of `hd`.
            unsafe {
                super::attention_x86::scores(&q[qi * hd..(qi + 1) * hd], keys, scale, &mut sc[qi * stride + j0 - from..][..seen])
            }
        });
    }
    // `dot_at` / `axpy_at` (not `dot` / `axpy`): these closures do not inherit
    // `attend_avx2`'s target features, so inlined code here would be SSE only.
    kv.for_rows(from, to, |j, slot| {
        kv.rows.with_row(false, slot, |kr| {
            for qi in j.saturating_sub(p0) * rep..n * rep {
                sc[qi * stride + j - from] = simd::dot_at(simd, &q[qi * hd..(qi + 1) * hd], kr) * scale;
            }
        })
    });
}

/// Rows of a block read in place by the kernels.
#[cfg(target_arch = "x86_64")]
enum InPlace<'a> {
    F32(simd::x86::F32Rows<'a>),
    F16(simd::x86::F16Rows<'a>),
}

/// Positions [`in_place`] runs every query head of a KV head over before the next: the
/// second head finds the block's rows (4 KiB of f32 at a head size of 128) in L1.
#[cfg(target_arch = "x86_64")]
const IN_PLACE_BLOCK: usize = 8;

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// Where positions `from..to` of the head being read sit in the pool.
    static IN_PLACE: RefCell<(Vec<*const f32>, Vec<*const half::f16>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// [`gathered`] without the gathering, for one decode row (`n == 1`): its query heads read
/// the pool's f32 or f16 rows where they are, [`IN_PLACE_BLOCK`] positions for every head in
/// turn. A head's rows are consecutive in the (head-major) pool, so the hardware prefetchers
/// stream them; with one row there is no tile to keep in L1, and an f16 pool is read at half
/// the bytes instead of widened into a copy.
/// Returns false, having run nothing, for other tiles, other pools (bf16, quantized) and
/// CPUs without F16C.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn in_place<S: KvRows>(
    kv: &KvView<S>,
    value: bool,
    p0: usize,
    n: usize,
    rep: usize,
    (from, to): (usize, usize),
    mut f: impl FnMut(usize, usize, InPlace<'_>, usize),
) -> bool {
    if n != 1 || from >= to || !super::attention_x86::has_f16c() {
        return false;
    }
    IN_PLACE.with(|c| {
        let (f32s, f16s) = &mut *c.borrow_mut();
        f32s.clear();
        f16s.clear();
        let mut other = false;
        kv.for_rows(from, to, |_, slot| match kv.rows.row_ptr(value, slot) {
            RowPtr::F32(p) => f32s.push(p),
            RowPtr::F16(p) => f16s.push(p),
            RowPtr::None => other = true,
        });
        let len = to - from;
        if other || (f32s.len() != len && f16s.len() != len) {
            return false;
        }
        for j0 in (from..to).step_by(IN_PLACE_BLOCK) {
            let j1 = (j0 + IN_PLACE_BLOCK).min(to);
            for qi in j0.saturating_sub(p0) * rep..rep {
                let seen = (p0 + qi / rep + 1).min(j1) - j0;
                let at = j0 - from..j0 - from + seen;
                let rows = if f32s.is_empty() {
                    InPlace::F16(simd::x86::F16Rows(&f16s[at]))
                } else {
                    InPlace::F32(simd::x86::F32Rows(&f32s[at]))
                };
                f(qi, j0, rows, seen);
            }
        }
        true
    })
}

/// Runs `f(qi, j0, rows, seen)` per block of up to [`GATHER`] positions `j0..` of `from..to`,
/// gathered as f32 rows (keys, or values when `value`), for each query row `qi` that sees
/// the block's first position; `seen` is how many of the block's positions it sees.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn gathered<S: KvRows>(
    kv: &KvView<S>,
    value: bool,
    p0: usize,
    n: usize,
    rep: usize,
    (from, to): (usize, usize),
    mut f: impl FnMut(usize, usize, &[f32], usize),
) {
    let hd = kv.hd;
    GATHERED.with(|g| {
        let mut g = g.borrow_mut();
        if g.len() < GATHER * hd {
            g.resize(GATHER * hd, 0.0);
        }
        for j0 in (from..to).step_by(GATHER) {
            let j1 = (j0 + GATHER).min(to);
            let rows = &mut g[..(j1 - j0) * hd];
            kv.for_rows(j0, j1, |j, slot| kv.rows.row_into(value, slot, &mut rows[(j - j0) * hd..][..hd]));
            for qi in j0.saturating_sub(p0) * rep..n * rep {
                let seen = (p0 + qi / rep + 1).min(j1) - j0;
                f(qi, j0, rows, seen);
            }
        }
    });
}

/// `out += p · v` over positions `from..to` for the rows that see them, `p` read from `sc` as
/// [`scores`] wrote it.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn weigh_values<S: KvRows>(
    kv: &KvView<S>,
    p0: usize,
    n: usize,
    rep: usize,
    (from, to): (usize, usize),
    stride: usize,
    sc: &[f32],
    out: &mut [f32],
    simd: Level,
) {
    let hd = kv.hd;
    #[cfg(target_arch = "x86_64")]
    if simd == Level::Avx2Fma && hd.is_multiple_of(8) {
        let done = in_place(kv, true, p0, n, rep, (from, to), |qi, j0, rows, seen| {
            let (p, o) = (&sc[qi * stride + j0 - from..][..seen], &mut out[qi * hd..(qi + 1) * hd]);
            // SAFETY: as in `scores`.
            unsafe {
                match rows {
                    InPlace::F32(r) => super::attention_x86::weigh_in_place(p, &r, o),
                    InPlace::F16(r) => super::attention_x86::weigh_in_place(p, &r, o),
                }
            }
        });
        if done {
            return;
        }
        return gathered(kv, true, p0, n, rep, (from, to), |qi, j0, values, seen| {
            let p = &sc[qi * stride + j0 - from..][..seen];
            // SAFETY: as in `scores`.
            unsafe { super::attention_x86::weigh(p, values, &mut out[qi * hd..(qi + 1) * hd]) }
        });
    }
    kv.for_rows(from, to, |j, slot| {
        kv.rows.with_row(true, slot, |vr| {
            for qi in j.saturating_sub(p0) * rep..n * rep {
                simd::axpy_at(simd, sc[qi * stride + j - from], vr, &mut out[qi * hd..(qi + 1) * hd]);
            }
        })
    });
}

/// [`attend_body`] past one key block: per block of `block` positions, the scores of the
/// rows that see it (`sc` rows of stride `block`), then a running max `m`, sum `l` and
/// unnormalised output per (row, query head), rescaled when the max grows; `out` is divided
/// by `l` at the end. Same order per (row, head) whatever the tile.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_blocked<S: KvRows>(
    q: &[f32],
    kv: &KvView<S>,
    p0: usize,
    n: usize,
    rep: usize,
    scale: f32,
    block: usize,
    sc: &mut [f32],
    out: &mut [f32],
    simd: Level,
) {
    let (hd, len) = (kv.hd, p0 + n);
    // Allocated per call: this path runs only past `block` positions, where the work per call
    // dwarfs it.
    let mut m = vec![f32::NEG_INFINITY; n * rep];
    let mut l = vec![0f32; n * rep];
    out.fill(0.0);
    for b0 in (0..len).step_by(block) {
        let b1 = (b0 + block).min(len);
        // Rows at positions < b0 see nothing of this block.
        let first = b0.saturating_sub(p0) * rep;
        // 1. Scores of the block.
        scores(q, kv, p0, n, rep, scale, (b0, b1), block, sc, simd);
        // 2. Fold the block into each row's running max and sum; rescale what it has summed.
        for qi in first..n * rep {
            let seen = (p0 + qi / rep + 1).min(b1) - b0;
            let s = &mut sc[qi * block..qi * block + seen];
            let m_new = s.iter().copied().fold(m[qi], f32::max);
            let sum = simd::exp_sub_sum_at(simd, s, m_new);
            let alpha = simd::exp(m[qi] - m_new);
            if alpha != 1.0 {
                out[qi * hd..(qi + 1) * hd].iter_mut().for_each(|o| *o *= alpha);
            }
            l[qi] = l[qi] * alpha + sum;
            m[qi] = m_new;
        }
        // 3. Unnormalised weighted sum of the block's values.
        weigh_values(kv, p0, n, rep, (b0, b1), block, sc, out, simd);
    }
    for qi in 0..n * rep {
        let inv = 1.0 / l[qi];
        out[qi * hd..(qi + 1) * hd].iter_mut().for_each(|o| *o *= inv);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::store::{slot_runs, SlotRun};

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap()
    }

    /// Plain attention over contiguous K/V for one sequence: `[len, nh * hd]`.
    fn reference(q: &Tensor, k: &Tensor, v: &Tensor, pos: usize, nh: usize, nkv: usize, hd: usize) -> Tensor {
        let n = q.dim(0).unwrap();
        let total = k.dim(0).unwrap();
        let rep = nh / nkv;
        let mut rows = Vec::new();
        for i in 0..n {
            let mut heads = Vec::new();
            for h in 0..nh {
                let g = h / rep;
                let qh = q.narrow(0, i, 1).unwrap().narrow(1, h * hd, hd).unwrap();
                let see = pos + i + 1;
                let kh = k.narrow(0, 0, see).unwrap().narrow(1, g * hd, hd).unwrap();
                let vh = v.narrow(0, 0, see).unwrap().narrow(1, g * hd, hd).unwrap();
                let s = (qh.matmul(&kh.t().unwrap()).unwrap() * (1.0 / (hd as f64).sqrt())).unwrap();
                let p = candle_nn::ops::softmax_last_dim(&s).unwrap();
                heads.push(p.matmul(&vh).unwrap());
            }
            rows.push(Tensor::cat(&heads, 1).unwrap());
        }
        let _ = total;
        Tensor::cat(&rows, 0).unwrap()
    }

    #[test]
    fn paged_kernel_and_generic_path_match_plain_attention() {
        let dev = Device::Cpu;
        for (nh, nkv, hd, bs) in [(8, 2, 16, 4), (4, 4, 64, 16), (8, 1, 128, 16)] {
            let store = KvStore::new(1, 12, bs, nkv, hd, DType::F32, &dev).unwrap();
            // Two sequences with scattered, non-contiguous blocks: a 5-row prompt chunk at
            // position 3 and a decode row at position 20.
            let tables: [Vec<BlockId>; 2] = [vec![7, 2], vec![0, 9, 4, 11, 1, 3]];
            let (pos, lens) = ([3usize, 20], [5usize, 1]);
            let mut kv_full = Vec::new();
            let mut runs = Vec::new();
            for (s, t) in tables.iter().enumerate() {
                let total = pos[s] + lens[s];
                let k = Tensor::randn(0f32, 1.0, (total, nkv * hd), &dev).unwrap();
                let v = Tensor::randn(0f32, 1.0, (total, nkv * hd), &dev).unwrap();
                let mut r = Vec::new();
                slot_runs(t, bs, 0, 0, total, &mut r);
                store.write(0, &r, &k, &v).unwrap();
                kv_full.push((k, v));
                runs.push(r);
            }
            let q = Tensor::randn(0f32, 1.0, (6, nh * hd), &dev).unwrap();
            let spans =
                [SeqSpan { row: 0, len: 5, pos: 3, blocks: &tables[0] }, SeqSpan { row: 5, len: 1, pos: 20, blocks: &tables[1] }];
            let want = Tensor::cat(
                &[
                    reference(&q.narrow(0, 0, 5).unwrap(), &kv_full[0].0, &kv_full[0].1, 3, nh, nkv, hd),
                    reference(&q.narrow(0, 5, 1).unwrap(), &kv_full[1].0, &kv_full[1].1, 20, nh, nkv, hd),
                ],
                0,
            )
            .unwrap();
            let plan = AttentionPlan::new(&spans, &store);
            let fused = cpu_f32(&q, &plan, &store, 0, nh).unwrap().expect("kernel applies");
            let gen = generic(&q, &plan, &store, 0, nh).unwrap();
            assert!(max_diff(&fused, &want) < 1e-5, "fused nh={nh} nkv={nkv} hd={hd}: {}", max_diff(&fused, &want));
            assert!(max_diff(&gen, &want) < 1e-5, "generic nh={nh} nkv={nkv} hd={hd}: {}", max_diff(&gen, &want));
            // Key tiles smaller than the chunk and not aligned with its first position: the
            // online softmax over several tiles equals the one-pass softmax.
            for tile in [1, 2, 3, 5] {
                let tiled = generic_tiled(&q, &plan, &store, 0, nh, Tiling { key_tile: tile, ..TILING }).unwrap();
                assert!(max_diff(&tiled, &want) < 1e-5, "key tile {tile}: {}", max_diff(&tiled, &want));
            }
            // The portable path sums in the same order as the SIMD one.
            let (k, v) = store.layer(0);
            let (kd, vd): (Vec<f32>, Vec<f32>) =
                (k.flatten_all().unwrap().to_vec1().unwrap(), v.flatten_all().unwrap().to_vec1().unwrap());
            let qv: Vec<f32> = q.narrow(0, 5, 1).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let view = KvView { rows: Dense { k: &kd, v: &vd, at: (nkv * hd, 0, hd) }, blocks: &tables[1], bs, hd };
            let rep = nh / nkv;
            let mut a = vec![0f32; rep * hd];
            let mut sc = vec![0f32; rep * 21];
            attend(&qv[..rep * hd], &view, 20, 1, rep, 0.25, KEY_BLOCK, &mut sc, &mut a, Level::Portable);
            for level in crate::simd::levels() {
                let mut b = vec![0f32; rep * hd];
                attend(&qv[..rep * hd], &view, 20, 1, rep, 0.25, KEY_BLOCK, &mut sc, &mut b, level);
                assert_eq!(a, b, "{level:?}");
            }
            let _: &Vec<SlotRun> = &runs[0];
        }
    }

    /// The online softmax over key blocks equals the one-pass softmax, for blocks that split
    /// a tile's own positions or not, on dense and quantized pools; every SIMD level sums the
    /// blocked path in the same order.
    #[test]
    fn fused_kernel_key_blocks_match_one_pass() {
        let (nh, nkv, hd, bs) = (6, 2, 32, 4);
        let dev = Device::Cpu;
        for format in [KvFormat::Dense(DType::F32), KvFormat::Quant(Quant::Q8_0)] {
            let store = KvStore::new(1, 32, bs, nkv, hd, format, &dev).unwrap();
            let (tables, _) = scattered(&store, &[53, 20]);
            // A 37-row chunk (three tiles) at position 16 and a decode row at position 19.
            let spans = [
                SeqSpan { row: 0, len: 37, pos: 16, blocks: &tables[0] },
                SeqSpan { row: 37, len: 1, pos: 19, blocks: &tables[1] },
            ];
            let q = Tensor::randn(0f32, 1.0, (38, nh * hd), &dev).unwrap();
            let plan = AttentionPlan::new(&spans, &store);
            let want = cpu_f32(&q, &plan, &store, 0, nh).unwrap().expect("kernel applies");
            for block in [1, 5, 16, 20, 41, 52] {
                let got = cpu_f32_blocks(&q, &plan, &store, 0, nh, block).unwrap().expect("kernel applies");
                assert!(max_diff(&got, &want) < 1e-5, "{format:?} block {block}: {}", max_diff(&got, &want));
            }
        }
        let store = KvStore::new(1, 32, bs, nkv, hd, DType::F32, &dev).unwrap();
        let (tables, _) = scattered(&store, &[53]);
        let (k, v) = store.layer(0);
        let (kd, vd): (Vec<f32>, Vec<f32>) =
            (k.flatten_all().unwrap().to_vec1().unwrap(), v.flatten_all().unwrap().to_vec1().unwrap());
        let view = KvView { rows: Dense { k: &kd, v: &vd, at: (nkv * hd, hd, hd) }, blocks: &tables[0], bs, hd };
        let (p0, n, rep) = (41, 12, nh / nkv);
        let q: Vec<f32> = Tensor::randn(0f32, 1.0, n * rep * hd, &dev).unwrap().to_vec1().unwrap();
        for block in [5, 16] {
            let mut sc = vec![0f32; n * rep * block];
            let mut a = vec![0f32; n * rep * hd];
            attend(&q, &view, p0, n, rep, 0.2, block, &mut sc, &mut a, Level::Portable);
            for level in crate::simd::levels() {
                let mut b = vec![0f32; n * rep * hd];
                attend(&q, &view, p0, n, rep, 0.2, block, &mut sc, &mut b, level);
                assert_eq!(a, b, "block {block} {level:?}");
            }
        }
    }

    /// A row's attention has the same bits whether it runs in a prompt tile or alone (as a
    /// decode step does), on dense and quantized pools, for head sizes the AVX2 micro-kernels
    /// take (multiples of 8, past one gathered block of positions) and one they do not; and
    /// every SIMD level gives the portable bits for a whole tile.
    #[test]
    fn a_row_attends_the_same_alone_or_in_a_tile() {
        let dev = Device::Cpu;
        let (nh, nkv, bs, total, p0) = (4, 2, 16, 150, 110);
        let n = total - p0;
        for (hd, format) in [
            (128, KvFormat::Dense(DType::F32)),
            (64, KvFormat::Dense(DType::F16)),
            (32, KvFormat::Quant(Quant::Q8_0)),
            (12, KvFormat::Dense(DType::F32)),
        ] {
            let store = KvStore::new(1, 16, bs, nkv, hd, format, &dev).unwrap();
            let (tables, _) = scattered(&store, &[total]);
            let q = Tensor::randn(0f32, 1.0, (n, nh * hd), &dev).unwrap();
            let tile = [SeqSpan { row: 0, len: n, pos: p0, blocks: &tables[0] }];
            let alone: Vec<SeqSpan> = (0..n).map(|r| SeqSpan { row: r, len: 1, pos: p0 + r, blocks: &tables[0] }).collect();
            let a = cpu_f32(&q, &AttentionPlan::new(&tile, &store), &store, 0, nh).unwrap().expect("kernel applies");
            let b = cpu_f32(&q, &AttentionPlan::new(&alone, &store), &store, 0, nh).unwrap().expect("kernel applies");
            let (a, b): (Vec<f32>, Vec<f32>) =
                (a.flatten_all().unwrap().to_vec1().unwrap(), b.flatten_all().unwrap().to_vec1().unwrap());
            assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "hd {hd} {format:?}");
        }
        let (hd, rep, n) = (128, nh / nkv, 16);
        let store = KvStore::new(1, 16, bs, nkv, hd, DType::F32, &dev).unwrap();
        let (tables, _) = scattered(&store, &[total]);
        let (k, v) = store.layer(0);
        let (kd, vd): (Vec<f32>, Vec<f32>) =
            (k.flatten_all().unwrap().to_vec1().unwrap(), v.flatten_all().unwrap().to_vec1().unwrap());
        let view = KvView { rows: Dense { k: &kd, v: &vd, at: (nkv * hd, hd, hd) }, blocks: &tables[0], bs, hd };
        let q: Vec<f32> = Tensor::randn(0f32, 1.0, n * rep * hd, &dev).unwrap().to_vec1().unwrap();
        let p0 = total - n;
        let mut sc = vec![0f32; n * rep * total];
        let mut a = vec![0f32; n * rep * hd];
        attend(&q, &view, p0, n, rep, 0.1, KEY_BLOCK, &mut sc, &mut a, Level::Portable);
        for level in crate::simd::levels() {
            let mut b = vec![0f32; n * rep * hd];
            attend(&q, &view, p0, n, rep, 0.1, KEY_BLOCK, &mut sc, &mut b, level);
            assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{level:?}");
        }
    }

    /// Writes random K/V for sequences of `totals` positions, each through its own scattered
    /// blocks; returns the tables and the contiguous K/V.
    fn scattered(store: &KvStore, totals: &[usize]) -> (Vec<Vec<BlockId>>, Vec<(Tensor, Tensor)>) {
        let (bs, width) = (store.block_size, store.kv_heads * store.head_dim);
        let mut free: Vec<BlockId> = (0..store.num_blocks as BlockId).rev().collect();
        // Interleave the sequences' blocks so no table is contiguous.
        free.sort_by_key(|b| (b % 3, *b));
        let (mut tables, mut kv) = (Vec::new(), Vec::new());
        for &total in totals {
            let t: Vec<BlockId> = (0..total.div_ceil(bs)).map(|_| free.pop().expect("pool large enough")).collect();
            let k = Tensor::randn(0f32, 1.0, (total, width), &Device::Cpu).unwrap();
            let v = Tensor::randn(0f32, 1.0, (total, width), &Device::Cpu).unwrap();
            let mut r = Vec::new();
            slot_runs(&t, bs, 0, 0, total, &mut r);
            store.write(0, &r, &k, &v).unwrap();
            tables.push(t);
            kv.push((k, v));
        }
        (tables, kv)
    }

    /// Decode rows of different lengths, out of length order, after a prompt chunk: the generic
    /// path batches them (padding masked) and puts every row back in place.
    #[test]
    fn generic_path_batches_decode_rows_of_different_lengths() {
        let (nh, nkv, hd, bs) = (8, 2, 16, 4);
        let totals = [9usize, 41, 4, 18, 1, 30];
        let store = KvStore::new(1, 64, bs, nkv, hd, DType::F32, &Device::Cpu).unwrap();
        let (tables, kv) = scattered(&store, &totals);
        // Rows: seq 0 is a 3-row chunk ending at position 8; the others decode one row each.
        let mut spans = vec![SeqSpan { row: 0, len: 3, pos: 6, blocks: &tables[0] }];
        for (i, &t) in totals.iter().enumerate().skip(1) {
            spans.push(SeqSpan { row: 2 + i, len: 1, pos: t - 1, blocks: &tables[i] });
        }
        let q = Tensor::randn(0f32, 1.0, (8, nh * hd), &Device::Cpu).unwrap();
        let plan = AttentionPlan::new(&spans, &store);
        let got = generic(&q, &plan, &store, 0, nh).unwrap();
        let fused = cpu_f32(&q, &plan, &store, 0, nh).unwrap().expect("f32 on CPU");
        for s in &spans {
            let i = spans.iter().position(|x| x.row == s.row).unwrap();
            let want = reference(&q.narrow(0, s.row, s.len).unwrap(), &kv[i].0, &kv[i].1, s.pos, nh, nkv, hd);
            let row = got.narrow(0, s.row, s.len).unwrap();
            assert!(max_diff(&row, &want) < 1e-5, "sequence {i}: {}", max_diff(&row, &want));
        }
        assert!(max_diff(&got, &fused) < 1e-5);
        assert!(plan.generic(&store, &Device::Cpu, TILING).unwrap().perm.is_some(), "rows are not in group order");
    }

    /// Long sequences split into several decode groups (each within `TILING.decode_positions`);
    /// the fused kernel's key blocks on the longest.
    #[test]
    fn generic_path_splits_long_decode_batches_into_groups() {
        let (nh, nkv, hd, bs) = (2, 1, 4, 16);
        let totals = [20_000usize, 9_000, 15_000];
        let store = KvStore::new(1, 45_000 / bs, bs, nkv, hd, DType::F32, &Device::Cpu).unwrap();
        let (tables, kv) = scattered(&store, &totals);
        let spans: Vec<SeqSpan> =
            totals.iter().enumerate().map(|(i, &t)| SeqSpan { row: i, len: 1, pos: t - 1, blocks: &tables[i] }).collect();
        let q = Tensor::randn(0f32, 1.0, (3, nh * hd), &Device::Cpu).unwrap();
        let plan = AttentionPlan::new(&spans, &store);
        assert_eq!(plan.generic(&store, &Device::Cpu, TILING).unwrap().decode.len(), 2);
        let got = generic(&q, &plan, &store, 0, nh).unwrap();
        // The fused kernel too: 20,000 positions take its online softmax over key blocks.
        assert!(totals[0] > KEY_BLOCK);
        let fused = cpu_f32(&q, &plan, &store, 0, nh).unwrap().expect("f32 on CPU");
        for (i, s) in spans.iter().enumerate() {
            let want = reference(&q.narrow(0, i, 1).unwrap(), &kv[i].0, &kv[i].1, s.pos, nh, nkv, hd);
            let d = max_diff(&got.narrow(0, i, 1).unwrap(), &want);
            assert!(d < 1e-5, "sequence {i}: {d}");
            let d = max_diff(&fused.narrow(0, i, 1).unwrap(), &want);
            assert!(d < 1e-5, "fused, sequence {i}: {d}");
        }
    }

    /// A decode row longer than a group's bound runs like a one-row chunk over key tiles; the
    /// shorter rows beside it stay grouped. Every row equals plain attention.
    #[test]
    fn generic_path_tiles_decode_rows_longer_than_a_group() {
        let (nh, nkv, hd, bs) = (4, 2, 8, 4);
        let totals = [50usize, 7, 23, 3, 12];
        let store = KvStore::new(1, 32, bs, nkv, hd, DType::F32, &Device::Cpu).unwrap();
        let (tables, kv) = scattered(&store, &totals);
        let spans: Vec<SeqSpan> =
            totals.iter().enumerate().map(|(i, &t)| SeqSpan { row: i, len: 1, pos: t - 1, blocks: &tables[i] }).collect();
        let q = Tensor::randn(0f32, 1.0, (5, nh * hd), &Device::Cpu).unwrap();
        for decode_positions in [16, 8, 5] {
            let tiling = Tiling { key_tile: 3, decode_positions };
            let plan = AttentionPlan::new(&spans, &store);
            let got = generic_tiled(&q, &plan, &store, 0, nh, tiling).unwrap();
            let g = plan.generic(&store, &Device::Cpu, tiling).unwrap();
            let tiled = totals.iter().filter(|&&t| t > decode_positions).count();
            assert_eq!(g.chunks.len(), tiled, "rows past {decode_positions} positions are tiled");
            assert!(!g.decode.is_empty(), "the short rows stay grouped");
            for (i, s) in spans.iter().enumerate() {
                let want = reference(&q.narrow(0, i, 1).unwrap(), &kv[i].0, &kv[i].1, s.pos, nh, nkv, hd);
                let d = max_diff(&got.narrow(0, i, 1).unwrap(), &want);
                assert!(d < 1e-5, "decode_positions {decode_positions}, sequence {i}: {d}");
            }
        }
    }

    /// Half-precision and block-quantized pools: the fused kernel (rows widened or
    /// dequantized as read) equals the generic path (rows converted once gathered), each
    /// stays within its bound of the f32 pool, and the finer formats are nearer.
    #[test]
    fn narrow_pools_in_the_fused_kernel() {
        let (nh, nkv, hd, bs) = (8, 2, 64, 4);
        let totals = [9usize, 30];
        let f32_store = KvStore::new(1, 16, bs, nkv, hd, DType::F32, &Device::Cpu).unwrap();
        let (tables, kv) = scattered(&f32_store, &totals);
        let spans =
            [SeqSpan { row: 0, len: 3, pos: 6, blocks: &tables[0] }, SeqSpan { row: 3, len: 1, pos: 29, blocks: &tables[1] }];
        let q = Tensor::randn(0f32, 1.0, (4, nh * hd), &Device::Cpu).unwrap();
        let plan = AttentionPlan::new(&spans, &f32_store);
        let exact = cpu_f32(&q, &plan, &f32_store, 0, nh).unwrap().expect("f32 pool");
        let formats = [
            (KvFormat::Dense(DType::F16), 0.01),
            (KvFormat::Dense(DType::BF16), 0.05),
            (KvFormat::Quant(Quant::Q8_0), 0.05),
            (KvFormat::Quant(Quant::Q4_0), 0.5),
        ];
        let mut errs = Vec::new();
        for (format, bound) in formats {
            let store = KvStore::new(1, 16, bs, nkv, hd, format, &Device::Cpu).unwrap();
            assert_eq!(store.bytes_per_token(), 2 * format.row_bytes(nkv * hd));
            for (t, (k, v)) in tables.iter().zip(&kv) {
                let mut r = Vec::new();
                slot_runs(t, bs, 0, 0, k.dim(0).unwrap(), &mut r);
                store.write(0, &r, k, v).unwrap();
            }
            let plan = AttentionPlan::new(&spans, &store);
            let fused = cpu_f32(&q, &plan, &store, 0, nh).unwrap().expect("the kernel reads every pool format");
            let gen = generic(&q, &plan, &store, 0, nh).unwrap();
            assert!(max_diff(&fused, &gen) < 1e-5, "{format:?}: {}", max_diff(&fused, &gen));
            let d = max_diff(&fused, &exact);
            assert!(d > 0.0 && d < bound, "{format:?} against f32: {d}");
            errs.push(d);
        }
        assert!(errs[0] < errs[2] && errs[2] < errs[3], "f16 < q8_0 < q4_0: {errs:?}");
    }

    /// The f16 and bf16 widening the kernel reads through gives every value exactly (NaN as a
    /// NaN), in rows of any length.
    #[test]
    fn widening_is_exact_for_every_half() {
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let f16s: Vec<half::f16> = all.iter().map(|&b| half::f16::from_bits(b)).collect();
        let bf16s: Vec<half::bf16> = all.iter().map(|&b| half::bf16::from_bits(b)).collect();
        for len in [all.len(), 13, 8, 1] {
            let mut got = vec![0f32; len];
            widen(&f16s[..len], &mut got);
            for (v, g) in f16s.iter().zip(&got) {
                assert!(v.to_f32().to_bits() == g.to_bits() || (v.is_nan() && g.is_nan()), "f16 {:#06x}", v.to_bits());
            }
            widen_bf16(&bf16s[..len], &mut got);
            for (v, g) in bf16s.iter().zip(&got) {
                assert!(v.to_f32().to_bits() == g.to_bits() || (v.is_nan() && g.is_nan()), "bf16 {:#06x}", v.to_bits());
            }
        }
    }

    #[test]
    fn other_dtypes_take_the_generic_path() {
        let dev = Device::Cpu;
        let store = KvStore::new(1, 2, 4, 1, 8, DType::F16, &dev).unwrap();
        let q = Tensor::zeros((1, 16), DType::F16, &dev).unwrap();
        let blocks = [1u32];
        let spans = [SeqSpan { row: 0, len: 1, pos: 0, blocks: &blocks }];
        let plan = AttentionPlan::new(&spans, &store);
        assert!(cpu_f32(&q, &plan, &store, 0, 2).unwrap().is_none());
        let out = paged_attention(&q, &plan, &store, 0, 2).unwrap();
        assert_eq!(out.dims(), &[1, 16]);
    }
}
