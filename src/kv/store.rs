//! The KV pool's memory: per block slot (a layer of each table group, see
//! [`super::layers`]; a layer per tensor where the model's layers are all alike), one K and
//! one V tensor of `num_blocks · block_size` token slots, each slot `kv_heads` rows of
//! `head_dim` values (in a quantized pool: their packed `u8` values, plus f16 scales in a
//! second tensor). Block `b` owns slots `b · block_size ..`. A position's slot comes from its
//! sequence's block table for the layer's group.
//!
//! Two layouts, chosen by device:
//! - **Head-major on CPU**: `[kv_heads · slots, head_dim]`, row `head · slots + slot`. A
//!   decode step's attention reads each KV head's positions one after another; here they are
//!   consecutive in memory, so the hardware prefetchers stream them (position-major, a head's
//!   rows were a slot apart, each in its own 4 KiB page, and read at half the bandwidth).
//!   Writes copy each run head by head ([`super::store_cpu`]).
//! - **Position-major elsewhere**: `[slots, kv_heads · head_dim]`, what the CUDA decode kernels
//!   and the generic path's gathers read; rows are written with `slice_set` (one call per run of
//!   consecutive slots) or one scatter per pass.
//!
//! [`KvStore::head_rows`] says where a head's rows are; [`KvStore::gather`] reads any layout
//! back position-major. On CPU the buffers are zero-initialised with `calloc`-backed vectors:
//! memory is committed by the OS only as blocks are first written, so a large bound costs
//! nothing until it is used.

use candle_core::{DType, Device, Tensor};

use super::layers::{HeadShape, KvLayout};
use super::quant::Quant;
use super::states::StatePool;
use super::{store_cpu, BlockId};
use crate::error::{EngineError, Result};

/// `n` zeroed values from `calloc`: the OS commits pages only as they are written. Unlike
/// `vec![0; n]` (what `Tensor::zeros` uses), a refused allocation (an address-space limit, an
/// overcommit policy) is an `OUT_OF_MEMORY` error, not an abort of the host process.
fn try_zeroed<T: candle_core::WithDType>(n: usize) -> Result<Vec<T>> {
    let layout =
        std::alloc::Layout::array::<T>(n).map_err(|e| EngineError::OutOfMemory(format!("KV pool of {n} values: {e}")))?;
    if layout.size() == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: the layout has a non-zero size; an all-zero bit pattern is a valid value of
    // every type a KV pool holds (0.0 in f32, f16, bf16; 0 in u8), so the `n` values are
    // initialised; the vector owns the allocation with the same layout it frees with
    // (`Layout::array::<T>(n)`).
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout) as *mut T;
        if ptr.is_null() {
            return Err(EngineError::OutOfMemory(format!(
                "cannot reserve {} MiB for the KV pool (lower kvCache.maxTokens)",
                layout.size() >> 20
            )));
        }
        Ok(Vec::from_raw_parts(ptr, n, n))
    }
}

/// A zeroed `[rows, cols]` tensor; on CPU allocated fallibly and committed lazily.
fn zeros(rows: usize, cols: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    let n = rows.checked_mul(cols).ok_or_else(|| EngineError::OutOfMemory("KV pool size overflows".into()))?;
    let t = match (device, dtype) {
        (Device::Cpu, DType::F32) => Tensor::from_vec(try_zeroed::<f32>(n)?, (rows, cols), device)?,
        (Device::Cpu, DType::F16) => Tensor::from_vec(try_zeroed::<half::f16>(n)?, (rows, cols), device)?,
        (Device::Cpu, DType::BF16) => Tensor::from_vec(try_zeroed::<half::bf16>(n)?, (rows, cols), device)?,
        (Device::Cpu, DType::U8) => Tensor::from_vec(try_zeroed::<u8>(n)?, (rows, cols), device)?,
        _ => Tensor::zeros((rows, cols), dtype, device)?,
    };
    Ok(t)
}

/// How the pool stores keys and values: a float dtype, or block-quantized (see
/// [`super::quant`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvFormat {
    Dense(DType),
    Quant(Quant),
}

impl From<DType> for KvFormat {
    fn from(d: DType) -> Self {
        KvFormat::Dense(d)
    }
}

impl KvFormat {
    /// The `kvCache.dtype` name.
    pub fn name(self) -> &'static str {
        match self {
            KvFormat::Dense(DType::F32) => "f32",
            KvFormat::Dense(DType::F16) => "f16",
            KvFormat::Dense(DType::BF16) => "bf16",
            KvFormat::Dense(_) => "other",
            KvFormat::Quant(q) => q.name(),
        }
    }

    /// Bytes of one row of `cols` values.
    pub fn row_bytes(self, cols: usize) -> usize {
        match self {
            KvFormat::Dense(d) => cols * d.size_in_bytes(),
            KvFormat::Quant(q) => q.row_bytes(cols),
        }
    }
}

pub struct KvStore {
    /// Per block slot: the values (`head_dim` of them per head and slot in a dense pool; packed
    /// `u8` in a quantized one) ...
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    /// ... and, quantized, the `f16` scales (`head_dim / 32` per head and slot; else empty).
    ks: Vec<Tensor>,
    vs: Vec<Tensor>,
    /// The heads of each tensor (the pool's own shape unless the layout gives layers theirs).
    shapes: Vec<HeadShape>,
    /// `[kv_heads · slots, width]` (CPU) rather than `[slots, kv_heads · width]`.
    head_major: bool,
    pub num_blocks: usize,
    pub block_size: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub format: KvFormat,
    /// What each layer keeps (see [`super::layers`]): every layer full attention unless the
    /// model says otherwise ([`Self::with_cache_layout`]).
    cache_layout: KvLayout,
    /// The recurrent layers' states, a slot per sequence ([`super::states`]); no slots when no
    /// layer keeps one.
    states: StatePool,
    /// Of the state slots, how many are for sequences (the rest hold prefix snapshots).
    state_sequences: usize,
    device: Device,
}

/// A run of consecutive rows of a batch written to consecutive slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotRun {
    pub row: usize,
    pub slot: usize,
    pub len: usize,
}

/// How one pass writes its rows' keys and values into every layer, per table group: a copy
/// per run of consecutive slots, or, where each copy is a kernel launch (the device-generic
/// path) and a batch has many runs (a decode step of many sequences), one scatter per tensor
/// through a `[rows, width]` slot index built once for the pass.
pub struct KvWrites {
    tables: Vec<TableWrites>,
}

struct TableWrites {
    runs: Vec<SlotRun>,
    scatter: Option<Tensor>,
}

/// Fewer runs than this are copied run by run.
const SCATTER_MIN_RUNS: usize = 4;

impl KvStore {
    /// Plans the writes of a pass whose rows go to `runs[t]` in table group `t`'s layers.
    pub fn plan_writes(&self, runs: Vec<Vec<SlotRun>>) -> Result<KvWrites> {
        let tables = runs
            .into_iter()
            .enumerate()
            .map(|(t, runs)| {
                let scatter = runs.len() >= SCATTER_MIN_RUNS && !self.head_major && matches!(self.format, KvFormat::Dense(_));
                let shape = self.cache_layout.tables.get(t).and_then(|t| t.shape).unwrap_or(self.shapes_default());
                self.writes(runs, scatter, shape.kv_heads * shape.head_dim)
            })
            .collect::<Result<_>>()?;
        Ok(KvWrites { tables })
    }

    fn writes(&self, runs: Vec<SlotRun>, scatter: bool, width: usize) -> Result<TableWrites> {
        let scatter = if scatter {
            let rows = runs.iter().map(|r| r.row + r.len).max().unwrap_or(0);
            let mut idx = vec![0u32; rows * width];
            for r in &runs {
                for i in 0..r.len {
                    idx[(r.row + i) * width..][..width].fill((r.slot + i) as u32);
                }
            }
            Some(Tensor::from_vec(idx, (rows, width), &self.device)?)
        } else {
            None
        };
        Ok(TableWrites { runs, scatter })
    }

    /// Writes a pass's `k` and `v` (`[rows, kv_heads · head_dim]`) into `layer` as planned.
    pub fn write_planned(&self, layer: usize, w: &KvWrites, k: &Tensor, v: &Tensor) -> Result<()> {
        let (table, slot) = self.slot(layer);
        let w = &w.tables[table];
        match &w.scatter {
            Some(idx) => {
                let dt = self.k[slot].dtype();
                self.k[slot].scatter_set(idx, &k.to_dtype(dt)?.contiguous()?, 0)?;
                self.v[slot].scatter_set(idx, &v.to_dtype(dt)?.contiguous()?, 0)?;
                Ok(())
            }
            None => self.write_slot(slot, &w.runs, k, v),
        }
    }

    /// `(table group, tensor slot)` of a layer that keeps positions.
    fn slot(&self, layer: usize) -> (usize, usize) {
        self.cache_layout.slot_of_layer(layer).expect("a layer that keeps positions in the pool")
    }

    /// The pool's own head shape (layers the layout gives no shape of their own have it).
    fn shapes_default(&self) -> HeadShape {
        HeadShape { kv_heads: self.kv_heads, head_dim: self.head_dim }
    }

    /// The heads `layer` keeps.
    pub fn shape(&self, layer: usize) -> HeadShape {
        self.shapes[self.slot(layer).1]
    }

    /// The table group whose block tables `layer` reads and writes through.
    pub fn table_of(&self, layer: usize) -> usize {
        self.slot(layer).0
    }

    /// Block tables each sequence has (one per table group).
    pub fn num_tables(&self) -> usize {
        self.cache_layout.tables.len()
    }

    // Seven independent dimensions of the pool, each named at the call site.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        num_layers: usize,
        num_blocks: usize,
        block_size: usize,
        kv_heads: usize,
        head_dim: usize,
        format: impl Into<KvFormat>,
        device: &Device,
    ) -> Result<Self> {
        Self::with_layout(num_layers, num_blocks, block_size, kv_heads, head_dim, format, device, device.is_cpu())
    }

    /// [`Self::new`] with the layout chosen: head-major (CPU only) or position-major (see the
    /// module notes).
    #[allow(clippy::too_many_arguments)]
    pub fn with_layout(
        num_layers: usize,
        num_blocks: usize,
        block_size: usize,
        kv_heads: usize,
        head_dim: usize,
        format: impl Into<KvFormat>,
        device: &Device,
        head_major: bool,
    ) -> Result<Self> {
        let format = format.into();
        if head_major && !device.is_cpu() {
            return Err(EngineError::InvalidArgument("a head-major KV pool is CPU only".into()));
        }
        let mut store = Self {
            k: Vec::new(),
            v: Vec::new(),
            ks: Vec::new(),
            vs: Vec::new(),
            head_major,
            num_blocks,
            block_size,
            kv_heads,
            head_dim,
            format,
            shapes: Vec::new(),
            cache_layout: KvLayout::all_full(num_layers),
            states: StatePool::new(&KvLayout::all_full(num_layers), 0)?,
            state_sequences: 0,
            device: device.clone(),
        };
        store.allocate(&vec![None; num_layers])?;
        Ok(store)
    }

    /// Allocates a K and a V tensor of every block slot, with the heads `shapes` gives each
    /// (`None`: the pool's own), replacing any before.
    fn allocate(&mut self, shapes: &[Option<HeadShape>]) -> Result<()> {
        let (format, head_major, device) = (self.format, self.head_major, &self.device);
        let shapes: Vec<HeadShape> = shapes.iter().map(|s| s.unwrap_or(self.shapes_default())).collect();
        let size_overflow = || EngineError::OutOfMemory("KV pool size overflows".into());
        let slots = self.num_blocks.checked_mul(self.block_size).ok_or_else(size_overflow)?;
        let (mut k, mut v, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for &HeadShape { kv_heads, head_dim } in &shapes {
            // `[kv_heads · slots, width]` or `[slots, kv_heads · width]` for `width` per head.
            let pool = |width: usize, dtype: DType| -> Result<Tensor> {
                if head_major {
                    zeros(kv_heads.checked_mul(slots).ok_or_else(size_overflow)?, width, dtype, device)
                } else {
                    zeros(slots, kv_heads.checked_mul(width).ok_or_else(size_overflow)?, dtype, device)
                }
            };
            match format {
                KvFormat::Dense(dtype) => {
                    k.push(pool(head_dim, dtype)?);
                    v.push(pool(head_dim, dtype)?);
                }
                KvFormat::Quant(q) => {
                    // Whole blocks per head: a head's packed values and scales are its own.
                    q.check_head_dim(head_dim)?;
                    k.push(pool(q.packed_cols(head_dim), DType::U8)?);
                    v.push(pool(q.packed_cols(head_dim), DType::U8)?);
                    ks.push(pool(head_dim / super::quant::BLOCK, DType::F16)?);
                    vs.push(pool(head_dim / super::quant::BLOCK, DType::F16)?);
                }
            }
        }
        (self.k, self.v, self.ks, self.vs, self.shapes) = (k, v, ks, vs, shapes);
        Ok(())
    }

    /// The pool for a model whose layers keep what `layout` says. A layout whose layer count
    /// differs from the pool's is a bug in the caller (`INTERNAL`); one with a kind of layer the
    /// pool does not manage yet is `UNSUPPORTED_ARCHITECTURE`, naming it.
    /// Each block then holds [`KvLayout::slots_per_block`] layers.
    pub fn with_cache_layout(mut self, layout: KvLayout) -> Result<Self> {
        if layout.num_layers != self.cache_layout.num_layers {
            return Err(EngineError::Internal(format!(
                "a KV layout of {} layers for a pool of {}",
                layout.num_layers, self.cache_layout.num_layers
            )));
        }
        if let Some(what) = layout.unsupported() {
            return Err(EngineError::UnsupportedArchitecture(format!("{what} is not implemented yet")));
        }
        let shapes = layout.tensor_shapes().to_vec();
        self.states = StatePool::new(&layout, self.states.len())?;
        self.cache_layout = layout;
        let resolved: Vec<HeadShape> = shapes.iter().map(|s| s.unwrap_or(self.shapes_default())).collect();
        if resolved != self.shapes {
            self.allocate(&shapes)?;
        }
        Ok(self)
    }

    /// What each layer keeps, grouped by kind.
    pub fn cache_layout(&self) -> &KvLayout {
        &self.cache_layout
    }

    /// The pool with `sequences` recurrent-state slots for sequences and `snapshots` for
    /// prefix snapshots (none where no layer keeps a state).
    pub fn with_state_slots(mut self, sequences: usize, snapshots: usize) -> Result<Self> {
        let total =
            sequences.checked_add(snapshots).ok_or_else(|| EngineError::InvalidArgument("state slots overflow".into()))?;
        self.states = StatePool::new(&self.cache_layout, total)?;
        self.state_sequences = if self.states.is_empty() { 0 } else { sequences };
        Ok(self)
    }

    /// State slots for sequences (the rest hold prefix snapshots).
    pub fn state_sequences(&self) -> usize {
        self.state_sequences
    }

    /// The recurrent layers' states.
    pub fn states(&self) -> &StatePool {
        &self.states
    }

    /// Token slots per layer (`num_blocks · block_size`, checked at construction).
    pub(super) fn slots(&self) -> usize {
        self.num_blocks * self.block_size
    }

    /// Whether the pool is head-major (`[kv_heads · slots, width]`, on CPU) rather than
    /// position-major (`[slots, kv_heads · width]`).
    pub fn head_major(&self) -> bool {
        self.head_major
    }

    /// Where KV head `head`'s rows of `width` values per slot sit in `layer`'s flat buffer
    /// (values, packed values or scales): `(stride, offset, width)`, slot `s`'s row being
    /// `data[s · stride + offset ..][..width]`.
    pub fn head_rows(&self, layer: usize, head: usize, width: usize) -> (usize, usize, usize) {
        if self.head_major {
            (width, head * self.slots() * width, width)
        } else {
            (self.shape(layer).kv_heads * width, head * width, width)
        }
    }

    /// K and V of `layer` at pool slots `idx` (`u32`), position-major `[idx.len(), kv_heads ·
    /// head_dim]` in `dtype` (widened or dequantized), whatever the layout.
    pub fn gather(&self, layer: usize, idx: &Tensor, dtype: DType) -> Result<(Tensor, Tensor)> {
        let heads = self.shape(layer).kv_heads;
        let rows = |t: &Tensor| -> Result<Tensor> {
            if !self.head_major {
                return Ok(t.index_select(idx, 0)?);
            }
            let (n, width) = (idx.dim(0)?, t.dim(1)?);
            let per_head = t.reshape((heads, self.slots(), width))?;
            let picked = per_head.index_select(idx, 1)?.transpose(0, 1)?.contiguous()?;
            Ok(picked.reshape((n, heads * width))?)
        };
        let layer = self.slot(layer).1;
        let (k, v) = (&self.k[layer], &self.v[layer]);
        Ok(match (self.format, self.ks.get(layer), self.vs.get(layer)) {
            (KvFormat::Quant(quant), Some(ks), Some(vs)) => {
                (quant.dequantize(&rows(k)?, &rows(ks)?, dtype)?, quant.dequantize(&rows(v)?, &rows(vs)?, dtype)?)
            }
            _ => (rows(k)?.to_dtype(dtype)?, rows(v)?.to_dtype(dtype)?),
        })
    }

    /// Bytes of K and V for one position of one block (every block tensor).
    pub fn bytes_per_token(&self) -> usize {
        self.shapes.iter().map(|s| bytes_per_token(1, s.kv_heads, s.head_dim, self.format)).sum()
    }

    pub fn bytes_per_block(&self) -> usize {
        self.bytes_per_token() * self.block_size
    }

    /// K and V of `layer`: values in a dense pool, packed quantized values in a quantized one
    /// (see [`Self::scales`]), laid out as [`Self::head_major`] says.
    pub fn layer(&self, layer: usize) -> (&Tensor, &Tensor) {
        let layer = self.slot(layer).1;
        (&self.k[layer], &self.v[layer])
    }

    /// The scales of K and V of `layer` in a quantized pool.
    pub fn scales(&self, layer: usize) -> Option<(&Tensor, &Tensor)> {
        let layer = self.slot(layer).1;
        Some((self.ks.get(layer)?, self.vs.get(layer)?))
    }

    /// Writes rows of `k`, `v` (`[rows, kv_heads · head_dim]`, contiguous) into `layer`,
    /// narrowed to the pool's dtype or quantized.
    pub fn write(&self, layer: usize, runs: &[SlotRun], k: &Tensor, v: &Tensor) -> Result<()> {
        self.write_slot(self.slot(layer).1, runs, k, v)
    }

    /// [`Self::write`] into block slot `layer`'s tensors.
    fn write_slot(&self, layer: usize, runs: &[SlotRun], k: &Tensor, v: &Tensor) -> Result<()> {
        if self.head_major {
            return self.write_head_major(layer, runs, k, v);
        }
        match self.format {
            KvFormat::Dense(dt) => {
                let (k, v) = (&k.to_dtype(dt)?, &v.to_dtype(dt)?);
                for r in runs {
                    self.k[layer].slice_set(&k.narrow(0, r.row, r.len)?, 0, r.slot)?;
                    self.v[layer].slice_set(&v.narrow(0, r.row, r.len)?, 0, r.slot)?;
                }
            }
            KvFormat::Quant(quant) => {
                let ((kq, kd), (vq, vd)) = (quant.quantize(k)?, quant.quantize(v)?);
                for r in runs {
                    self.k[layer].slice_set(&kq.narrow(0, r.row, r.len)?, 0, r.slot)?;
                    self.v[layer].slice_set(&vq.narrow(0, r.row, r.len)?, 0, r.slot)?;
                    self.ks[layer].slice_set(&kd.narrow(0, r.row, r.len)?, 0, r.slot)?;
                    self.vs[layer].slice_set(&vd.narrow(0, r.row, r.len)?, 0, r.slot)?;
                }
            }
        }
        Ok(())
    }

    /// [`Self::write`] into a head-major pool: each tensor's runs copied head by head.
    fn write_head_major(&self, layer: usize, runs: &[SlotRun], k: &Tensor, v: &Tensor) -> Result<()> {
        let heads = self.shapes[layer].kv_heads;
        let put = |dst: &Tensor, src: &Tensor| -> Result<()> {
            let op = store_cpu::WriteRuns { runs, heads, width: dst.dim(1)?, slots: self.slots() };
            Ok(dst.inplace_op2(&src.contiguous()?, &op)?)
        };
        match self.format {
            KvFormat::Dense(dt) => {
                put(&self.k[layer], &k.to_dtype(dt)?)?;
                put(&self.v[layer], &v.to_dtype(dt)?)?;
            }
            KvFormat::Quant(quant) => {
                let ((kq, kd), (vq, vd)) = (quant.quantize(k)?, quant.quantize(v)?);
                put(&self.k[layer], &kq)?;
                put(&self.v[layer], &vq)?;
                put(&self.ks[layer], &kd)?;
                put(&self.vs[layer], &vd)?;
            }
        }
        Ok(())
    }

    /// Every tensor of the pool (K, V and their scales) with the heads it holds.
    pub(super) fn tensors_with_heads(&self) -> impl Iterator<Item = (&Tensor, usize)> {
        let heads = self.shapes.iter().map(|s| s.kv_heads);
        [&self.k, &self.v, &self.ks, &self.vs].into_iter().flat_map(move |ts| ts.iter().zip(heads.clone()))
    }

    /// Returns the memory of `blocks` (ascending; none of them listed by a table) to the OS, on
    /// a CPU pool: the next write commits it again. A GPU pool keeps its memory.
    pub fn release_memory(&self, blocks: &[BlockId]) -> Result<()> {
        if !self.head_major || blocks.is_empty() {
            return Ok(());
        }
        let bs = self.block_size;
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for &b in blocks {
            let (start, end) = (b as usize * bs, (b as usize + 1) * bs);
            match ranges.last_mut() {
                Some(last) if last.1 == start => last.1 = end,
                _ => ranges.push((start, end)),
            }
        }
        let slots = self.slots();
        for (t, heads) in self.tensors_with_heads() {
            t.inplace_op1(&store_cpu::ReleaseSlots { ranges: &ranges, heads, slots })?;
        }
        Ok(())
    }

    /// Copies the first `n` positions of block `src` into block `dst`, every layer
    /// (copy-on-write of a shared, partly used block).
    pub fn copy_block(&self, src: BlockId, dst: BlockId, n: usize) -> Result<()> {
        let (s, d) = (src as usize * self.block_size, dst as usize * self.block_size);
        if self.head_major {
            let slots = self.slots();
            for (t, heads) in self.tensors_with_heads() {
                t.inplace_op1(&store_cpu::CopySlots { src: s, dst: d, n, heads, width: t.dim(1)?, slots })?;
            }
            return Ok(());
        }
        for t in self.k.iter().chain(&self.v).chain(&self.ks).chain(&self.vs) {
            // Through a small buffer: `slice_set` needs distinct storages, and `Tensor::copy`
            // of a view would clone the whole pool.
            let tmp = Tensor::zeros((n, t.dim(1)?), t.dtype(), t.device())?;
            tmp.slice_set(&t.narrow(0, s, n)?, 0, 0)?;
            t.slice_set(&tmp, 0, d)?;
        }
        Ok(())
    }
}

pub fn bytes_per_token(num_layers: usize, kv_heads: usize, head_dim: usize, format: impl Into<KvFormat>) -> usize {
    num_layers * 2 * format.into().row_bytes(kv_heads * head_dim)
}

/// Slot of position `pos` in a sequence with block table `blocks`. A position whose block a
/// sliding window gave back ([`super::block_table::NO_BLOCK`]) maps to slot 0: it is never
/// read unmasked.
#[inline]
pub fn slot_of(blocks: &[BlockId], block_size: usize, pos: usize) -> usize {
    match blocks[pos / block_size] {
        super::block_table::NO_BLOCK => 0,
        b => b as usize * block_size + pos % block_size,
    }
}

/// The runs that write positions `pos .. pos + n` of a sequence whose rows start at batch
/// row `row`.
pub fn slot_runs(blocks: &[BlockId], block_size: usize, row: usize, pos: usize, n: usize, out: &mut Vec<SlotRun>) {
    let mut done = 0;
    while done < n {
        let p = pos + done;
        let len = (block_size - p % block_size).min(n - done);
        out.push(SlotRun { row: row + done, slot: slot_of(blocks, block_size, p), len });
        done += len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_split_at_block_boundaries() {
        let mut out = Vec::new();
        slot_runs(&[5, 2, 9], 4, 10, 3, 6, &mut out);
        assert_eq!(
            out,
            vec![
                SlotRun { row: 10, slot: 23, len: 1 },
                SlotRun { row: 11, slot: 8, len: 4 },
                SlotRun { row: 15, slot: 36, len: 1 },
            ]
        );
    }

    #[test]
    fn scattered_writes_equal_run_copies() {
        let runs = vec![
            SlotRun { row: 0, slot: 9, len: 2 },
            SlotRun { row: 2, slot: 0, len: 1 },
            SlotRun { row: 3, slot: 5, len: 3 },
            SlotRun { row: 6, slot: 13, len: 1 },
        ];
        let k = Tensor::randn(0f32, 1.0, (7, 6), &Device::Cpu).unwrap();
        let v = Tensor::randn(0f32, 1.0, (7, 6), &Device::Cpu).unwrap();
        let stores: Vec<KvStore> =
            (0..2).map(|_| KvStore::with_layout(2, 4, 4, 2, 3, DType::F32, &Device::Cpu, false).unwrap()).collect();
        for (s, scatter) in stores.iter().zip([false, true]) {
            let w = KvWrites { tables: vec![s.writes(runs.clone(), scatter, s.kv_heads * s.head_dim).unwrap()] };
            assert_eq!(w.tables[0].scatter.is_some(), scatter);
            s.write_planned(1, &w, &k, &v).unwrap();
        }
        for t in 0..2 {
            let pick = |s: &KvStore| -> Vec<Vec<f32>> {
                let (a, b) = s.layer(1);
                [a, b][t].to_vec2().unwrap()
            };
            assert_eq!(pick(&stores[0]), pick(&stores[1]));
        }
        let got: Vec<f32> = stores[1].layer(1).0.narrow(0, 5, 1).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let want: Vec<f32> = k.narrow(0, 3, 1).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(got, want);
    }

    /// Released blocks read back as zeros where they cover whole pages (their memory went back
    /// to the OS); the blocks around them keep every value.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn released_blocks_give_their_pages_back() {
        let (heads, hd, bs, blocks) = (2, 64, 16, 64);
        let s = KvStore::new(1, blocks, bs, heads, hd, DType::F32, &Device::Cpu).unwrap();
        let rows = blocks * bs;
        let ones = Tensor::ones((rows, heads * hd), DType::F32, &Device::Cpu).unwrap();
        s.write(0, &[SlotRun { row: 0, slot: 0, len: rows }], &ones, &ones).unwrap();
        s.release_memory(&(8..56).collect::<Vec<_>>()).unwrap();
        let (k, v) = s.gather(0, &Tensor::arange(0u32, rows as u32, &Device::Cpu).unwrap(), DType::F32).unwrap();
        for t in [k, v] {
            let sums: Vec<f32> = t.sum(1).unwrap().to_vec1().unwrap();
            for (slot, sum) in sums.iter().enumerate() {
                let block = slot / bs;
                if !(8..56).contains(&block) {
                    assert_eq!(*sum, (heads * hd) as f32, "slot {slot} of a kept block changed");
                } else if (9..55).contains(&block) {
                    assert_eq!(*sum, 0.0, "slot {slot} of a released block still holds its values");
                }
            }
        }
    }

    /// Head-major and position-major pools hold the same rows: written by runs, copied
    /// block to block, gathered back position-major, for float and quantized formats.
    #[test]
    fn both_layouts_hold_the_same_rows() {
        let (heads, hd, bs) = (3, 64, 4);
        let runs =
            [SlotRun { row: 0, slot: 9, len: 3 }, SlotRun { row: 3, slot: 0, len: 2 }, SlotRun { row: 5, slot: 21, len: 1 }];
        let k = crate::kv::seeded(6, heads * hd, 1);
        let v = crate::kv::seeded(6, heads * hd, 2);
        let idx = Tensor::new(&[9u32, 10, 11, 0, 1, 21, 17, 18, 3], &Device::Cpu).unwrap();
        for format in
            [KvFormat::Dense(DType::F32), KvFormat::Dense(DType::F16), KvFormat::Quant(Quant::Q8_0), KvFormat::Quant(Quant::Q4_0)]
        {
            type Rows = Vec<Vec<f32>>;
            let got: Vec<(Rows, Rows)> = [true, false]
                .iter()
                .map(|&head_major| {
                    let s = KvStore::with_layout(2, 6, bs, heads, hd, format, &Device::Cpu, head_major).unwrap();
                    assert_eq!(s.head_major(), head_major);
                    s.write(1, &runs, &k, &v).unwrap();
                    // Slots 8..10 (block 2) to block 4 (slots 16..).
                    s.copy_block(2, 4, 3).unwrap();
                    let (gk, gv) = s.gather(1, &idx, DType::F32).unwrap();
                    (gk.to_vec2().unwrap(), gv.to_vec2().unwrap())
                })
                .collect();
            assert_eq!(got[0], got[1], "{format:?}");
            // Slot 9 is batch row 0; slot 18 its copy (slot 10, row 1).
            let (gk, _) = &got[0];
            let (want0, want1): (Vec<f32>, Vec<f32>) =
                (k.get(0).unwrap().to_vec1().unwrap(), k.get(1).unwrap().to_vec1().unwrap());
            // Half a quantization step of the format at |x| ≤ ~4.
            let tol = if format == KvFormat::Quant(Quant::Q4_0) { 0.3 } else { 0.02 };
            let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol);
            assert!(close(&gk[0], &want0) && close(&gk[7], &want1), "{format:?}");
        }
    }

    /// Layers of two head shapes in one pool (Gemma 4's sliding and global layers): each keeps
    /// its own rows, in either layout, and a block copy moves both.
    #[test]
    fn layers_of_two_head_shapes_keep_their_own_rows() {
        use crate::kv::layers::LayerCache;
        let wide = HeadShape { kv_heads: 1, head_dim: 128 };
        let layout = KvLayout::from_shaped(&[LayerCache::Full, LayerCache::Full], &[None, Some(wide)]);
        let runs = [SlotRun { row: 0, slot: 5, len: 2 }];
        let idx = Tensor::new(&[5u32, 6, 9, 10], &Device::Cpu).unwrap();
        for head_major in [true, false] {
            let s = KvStore::with_layout(2, 4, 4, 3, 32, DType::F32, &Device::Cpu, head_major)
                .unwrap()
                .with_cache_layout(layout.clone())
                .unwrap();
            assert_eq!((s.shape(0), s.shape(1)), (HeadShape { kv_heads: 3, head_dim: 32 }, wide));
            assert_eq!(s.bytes_per_token(), 2 * 4 * (96 + 128));
            let (k0, k1) = (crate::kv::seeded(2, 96, 1), crate::kv::seeded(2, 128, 2));
            s.write(0, &runs, &k0, &k0).unwrap();
            s.write(1, &runs, &k1, &k1).unwrap();
            // Block 1 (slots 4..8) to block 2 (slots 8..): slots 5, 6 land at 9, 10.
            s.copy_block(1, 2, 4).unwrap();
            for (layer, want) in [(0, &k0), (1, &k1)] {
                let (gk, gv) = s.gather(layer, &idx, DType::F32).unwrap();
                let want = Tensor::cat(&[want, want], 0).unwrap().to_vec2::<f32>().unwrap();
                assert_eq!(gk.to_vec2::<f32>().unwrap(), want, "layer {layer}, head-major {head_major}");
                assert_eq!(gv.to_vec2::<f32>().unwrap(), want);
            }
        }
    }

    #[test]
    fn a_head_major_pool_keeps_a_heads_rows_together() {
        let s = KvStore::new(1, 2, 2, 2, 2, DType::F32, &Device::Cpu).unwrap();
        assert!(s.head_major());
        let k = Tensor::new(&[[1f32, 2., 3., 4.], [5., 6., 7., 8.]], &Device::Cpu).unwrap();
        s.write(0, &[SlotRun { row: 0, slot: 1, len: 2 }], &k, &k).unwrap();
        let got: Vec<Vec<f32>> = s.layer(0).0.to_vec2().unwrap();
        // Head 0's four slots, then head 1's.
        assert_eq!(
            got,
            vec![vec![0., 0.], vec![1., 2.], vec![5., 6.], vec![0., 0.], vec![0., 0.], vec![3., 4.], vec![7., 8.], vec![0., 0.]]
        );
        assert_eq!(s.head_rows(0, 1, 2), (2, 8, 2));
        assert!(
            KvStore::with_layout(1, 2, 2, 2, 2, DType::F32, &Device::Cpu, false).is_ok_and(|p| p.head_rows(0, 1, 2) == (4, 2, 2))
        );
    }

    #[test]
    fn out_of_bounds_writes_are_errors() {
        let s = KvStore::new(1, 2, 2, 2, 2, DType::F32, &Device::Cpu).unwrap();
        let k = Tensor::zeros((2, 4), DType::F32, &Device::Cpu).unwrap();
        assert!(s.write(0, &[SlotRun { row: 0, slot: 3, len: 2 }], &k, &k).is_err());
        assert!(s.write(0, &[SlotRun { row: 1, slot: 0, len: 2 }], &k, &k).is_err());
        assert!(s.copy_block(1, 2, 2).is_err());
    }

    #[test]
    fn write_and_copy_block() {
        let s = KvStore::new(2, 3, 2, 1, 2, DType::F32, &Device::Cpu).unwrap();
        let k = Tensor::new(&[[1f32, 2.], [3., 4.]], &Device::Cpu).unwrap();
        let v = (&k * 10.).unwrap();
        s.write(1, &[SlotRun { row: 0, slot: 2, len: 2 }], &k, &v).unwrap();
        s.copy_block(1, 2, 1).unwrap();
        let got: Vec<Vec<f32>> = s.layer(1).0.to_vec2().unwrap();
        assert_eq!(got, vec![vec![0., 0.], vec![0., 0.], vec![1., 2.], vec![3., 4.], vec![1., 2.], vec![0., 0.]]);
        let got: Vec<Vec<f32>> = s.layer(1).1.narrow(0, 4, 1).unwrap().to_vec2().unwrap();
        assert_eq!(got, vec![vec![10., 20.]]);
    }
}
