//! The generic path of [`super::paged_attention`]: per pass, the sequences' pool slots (and
//! masks) uploaded once as index tensors ([`GenericPlan`]); per layer, their K/V rows gathered
//! from the pool, widened or dequantized, and attended with candle ops (any device, any dtype):
//! short decode rows batched in padded groups, prompt chunks and long decode rows over key tiles
//! with an online softmax.

use candle_core::{DType, Device, Tensor};

use super::{AttentionPlan, LayerAttention, SeqSpan};
use crate::error::Result;
use crate::kv::store::KvStore;
use crate::kv::BlockId;

/// The generic path's index tensors for one pass, uploaded once and shared by every layer.
/// Decode rows (one query each) run batched: sequences sorted by length are grouped, each
/// group's keys gathered into one padded `[rows, kv_heads, longest, head_dim]` tensor, padding
/// masked out. Prompt chunks, and decode rows too long for a group, run one sequence at a
/// time over key tiles with a causal mask.
pub(super) struct GenericPlan {
    pub(super) decode: Vec<DecodeGroup>,
    /// `(span index, slot of every position, causal mask [len, len] over the chunk's own
    /// positions)` of the multi-row spans.
    pub(super) chunks: Vec<(usize, Tensor, Tensor)>,
    /// Output row `r` is row `perm[r]` of the groups' and chunks' outputs concatenated, when
    /// that order is not already the batch order.
    pub(super) perm: Option<Tensor>,
}

pub(super) struct DecodeGroup {
    /// Batch rows of the group's queries: consecutive from a first row (a view, no gather), or
    /// an index.
    rows: GroupRows,
    /// `[n · longest]` pool slots, row-major; padding points at slot 0 (masked).
    slots: Tensor,
    /// `[n, 1, 1, longest]`: 0 for a sequence's positions, -inf for its padding; `None` when
    /// every sequence of the group has the same length (no padding).
    mask: Option<Tensor>,
    /// The position of each member's query (a sliding window masks behind it).
    positions: Vec<usize>,
    n: usize,
    longest: usize,
}

enum GroupRows {
    From(usize),
    Index(Tensor),
}

/// How the generic path bounds what it gathers per step.
#[derive(Clone, Copy, Debug)]
pub(super) struct Tiling {
    /// Key positions per tile of a prompt chunk's online softmax.
    pub(super) key_tile: usize,
    /// Decode groups hold at most this many (sequence, position) pairs: the gathered K and V
    /// of one layer are `pairs · kv_heads · head_dim` elements each. A decode row that alone
    /// attends more positions runs like a one-row chunk, over key tiles of this size.
    pub(super) decode_positions: usize,
}

pub(super) const TILING: Tiling = Tiling { key_tile: 1024, decode_positions: 1 << 15 };

impl AttentionPlan<'_> {
    pub(super) fn generic(&self, store: &KvStore, device: &Device, tiling: Tiling) -> Result<&GenericPlan> {
        if self.generic.get().is_none() {
            let _ = self.generic.set(self.build_generic(store, device, tiling)?);
        }
        Ok(self.generic.get().expect("just set"))
    }

    fn build_generic(&self, store: &KvStore, device: &Device, tiling: Tiling) -> Result<GenericPlan> {
        let bs = store.block_size;
        let slots_of = |blocks: &[BlockId], total: usize| -> Vec<u32> {
            (0..total).map(|p| crate::kv::store::slot_of(blocks, bs, p) as u32).collect()
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
                positions: group.iter().map(|s| s.pos).collect(),
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

/// The generic path: per sequence, gather its K/V rows from the pool and attend with candle
/// ops (any device, any dtype).
pub(super) fn generic(
    q: &Tensor,
    plan: &AttentionPlan,
    store: &KvStore,
    layer: usize,
    nh: usize,
    how: LayerAttention,
) -> Result<Tensor> {
    generic_tiled(q, plan, store, layer, nh, how, TILING)
}

/// `-inf` where a query at `row_pos` may not see `key` (after it, or behind its window).
fn hidden(row_pos: usize, key: usize, window: Option<usize>) -> bool {
    key > row_pos || window.is_some_and(|w| key + w <= row_pos)
}

/// `[rows, keys]` of 0 and -inf for queries at `positions` (one row each) and keys at
/// `first_key..first_key + keys`.
fn window_mask(positions: &[usize], first_key: usize, keys: usize, w: usize, device: &Device) -> Result<Tensor> {
    let m: Vec<f32> = positions
        .iter()
        .flat_map(|&p| (0..keys).map(move |j| if hidden(p, first_key + j, Some(w)) { f32::NEG_INFINITY } else { 0.0 }))
        .collect();
    Ok(Tensor::from_vec(m, (positions.len(), keys), device)?)
}

pub(super) fn generic_tiled(
    q: &Tensor,
    plan: &AttentionPlan,
    store: &KvStore,
    layer: usize,
    nh: usize,
    how: LayerAttention,
    tiling: Tiling,
) -> Result<Tensor> {
    let shape = store.shape(layer);
    let (nkv, hd) = (shape.kv_heads, shape.head_dim);
    let rep = nh / nkv;
    let scale = how.scale.map_or(1.0 / (hd as f64).sqrt(), f64::from);
    let window = how.window;
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
        // A window that hides some member's early positions: its own mask, built per layer
        // (the plan's masks serve every layer of the pass).
        let scores = match window {
            Some(w) if d.positions.iter().any(|&p| p + 1 > w) => {
                scores.broadcast_add(&window_mask(&d.positions, 0, l, w, q.device())?.reshape((n, 1, 1, l))?)?
            }
            _ => scores,
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
        // mask. With a sliding window, tiles start at the first row's window and a tile's
        // positions behind a later row's window are masked for that row; `m` starts at the
        // lowest finite f32, so a row that sees nothing of a tile keeps `l = 0`, `o = 0`
        // (never `exp(-inf + inf)`). Every row sees itself, so `l > 0` at the end.
        let dev = q.device();
        let mut m = Tensor::full(f32::MIN, (nkv, rows, 1), dev)?;
        let mut l = Tensor::zeros((nkv, rows, 1), DType::F32, dev)?;
        let mut o = Tensor::zeros((nkv, rows, hd), DType::F32, dev)?;
        let tiles = |from: usize, to: usize| (from..to).step_by(key_tile).map(move |a| (a, key_tile.min(to - a)));
        let first = window.map_or(0, |w| (s.pos + 1).saturating_sub(w));
        let row_positions: Vec<usize> = if window.is_some() { (s.pos..total).collect() } else { Vec::new() };
        // The last row's window starts latest: a tile it sees whole, before the chunk's own
        // positions, every row sees whole.
        let last = total - 1;
        for (start, n) in tiles(first, s.pos).chain(tiles(s.pos, total)) {
            let (k, v) = gather(&idx.narrow(0, start, n)?)?;
            let k = k.reshape((n, nkv, hd))?.transpose(0, 1)?.contiguous()?;
            let v = v.reshape((n, nkv, hd))?.transpose(0, 1)?.contiguous()?;
            let mut sc = (qs.matmul(&k.t()?)? * scale)?.to_dtype(DType::F32)?;
            let tile_mask = match window {
                Some(w) if start + w <= last || start + n > s.pos => Some(window_mask(&row_positions, start, n, w, dev)?),
                _ if start >= s.pos => Some(mask.narrow(1, start - s.pos, n)?),
                _ => None,
            };
            if let Some(tile_mask) = tile_mask {
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
