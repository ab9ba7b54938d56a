//! Prompt chunks on the CUDA path (bf16): a pass of many rows as cuBLAS products and a few
//! kernels per layer (`cuda_prefill.cuh`), with no host synchronisation inside it.
//!
//! The generic path runs a prompt chunk as ~36 candle ops per layer, its attention as a gather
//! of the context and several ops per head group; here a layer is: RMSNorm, the q/k/v product,
//! `qkv_rows` (bias, q/k norm, RoPE, every row's key and value into the pool), `attn_prefill`
//! (flash-attention style on the tensor cores, reading keys and values from the paged pool,
//! causal, GQA), the output product, RMSNorm with the residual, gate·up, SiLU·mul and down.
//! Only the rows whose logits the pass returns (each chunk's last) go through the final norm and
//! the head. A pass may mix prompt chunks and decode rows (each a chunk of one row), base rows and
//! rows under plain LoRAs (per row, as on the decode path). Passes are issued directly, not as
//! graphs: their shapes rarely repeat, and a pass's kernels are long enough that launching them
//! costs less than they run. `EXPERT_RUNTIME_CUDA_PREFILL=0` turns this path off.

use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaSlice};
use candle_core::DType;

use super::lora::LoraPtrs;
use super::{err, i32n, ptr, slice_ptr, CudaDecode, Decoder, Logits, SeqChunk, LORA_MAX, LORA_RANK, MAX_ROWS};
use crate::error::Result;
use crate::kv::KvStore;
use crate::model::adapt::{Proj, Slot};

/// What a pass returns: f32 logits of the rows asked for and their greedy reduction.
type Outputs = (Option<candle_core::Tensor>, Option<candle_core::Tensor>);

/// Rows a prefill pass may have at most (the engine's GPU passes take up to 2,048 prompt rows
/// plus the decode rows); larger passes take the generic path.
pub const PREFILL_ROWS: usize = 4096;
/// Query rows per attention block and key positions per tile (the kernels' PTILE).
const TILE: usize = 64;
/// Threads of the q/k/v blocks (the kernels' NWARP warps).
const THREADS: u32 = 128;
/// Attention blocks (tiles × query heads) below which each block splits its keys between two
/// warps per row group (`attn_prefill<HD, 2>`, 256 threads): a short prompt has too few blocks
/// to fill the GPU, and its last tile's chain of key steps sets the time. From there on, four
/// warps a block (`<HD, 1>`), more blocks per multiprocessor. `EXPERT_RUNTIME_CUDA_PREFILL_SPLIT`
/// = 1 or 2 forces one.
const SPLIT_BELOW_BLOCKS: usize = 512;

/// The prefill kernels of this model (bf16, head_dim 16, 32, 64 or 128).
pub(super) struct PrefillKernels {
    qkv_rows: CudaFunction,
    norm_rows: CudaFunction,
    /// The attention with the keys of a block's step taken by 1 and by 2 warps per row group.
    attn: [CudaFunction; 2],
    /// `EXPERT_RUNTIME_CUDA_PREFILL_SPLIT`: always 1 or always 2 (else chosen per pass).
    split: Option<usize>,
}

impl PrefillKernels {
    /// The kernels for `dtype` and `head_dim`, or `None` where there are none.
    pub(super) fn load(f: impl Fn(&str) -> Result<CudaFunction>, dtype: DType, head_dim: usize) -> Result<Option<Self>> {
        if dtype != DType::BF16
            || !matches!(head_dim, 16 | 32 | 64 | 128)
            || std::env::var("EXPERT_RUNTIME_CUDA_PREFILL").is_ok_and(|v| v == "0")
        {
            return Ok(None);
        }
        let split = match std::env::var("EXPERT_RUNTIME_CUDA_PREFILL_SPLIT").as_deref() {
            Ok("1") => Some(1),
            Ok("2") => Some(2),
            _ => None,
        };
        Ok(Some(Self {
            qkv_rows: f("qkv_rows_bf16")?,
            norm_rows: f("norm_rows_bf16")?,
            attn: [f(&format!("attn_prefill_bf16_h{head_dim}_k1"))?, f(&format!("attn_prefill_bf16_h{head_dim}_k2"))?],
            split,
        }))
    }
}

/// Where each per-row input sits in the uploaded buffer (`u32`s), for a capacity of `rows` rows.
#[derive(Clone, Copy)]
struct Layout {
    ids: usize,
    pos: usize,
    slot: usize,
    /// Per row, its expert set's LoRA table address (a `u64` as two `u32`s; 0: none).
    sets: usize,
    /// Per output (chunk), the row whose logits it returns.
    outs: usize,
    /// Per attention tile: first row, rows, position of the first row, block-table offset.
    tiles: usize,
    tables: usize,
}

impl Layout {
    fn new(rows: usize) -> Self {
        let tiles = 5 * rows + MAX_ROWS;
        Self { ids: 0, pos: rows, slot: 2 * rows, sets: 3 * rows, outs: 5 * rows, tiles, tables: tiles + 4 * max_tiles(rows) }
    }
}

/// Attention tiles of a pass of `rows` rows in at most MAX_ROWS chunks, at most.
fn max_tiles(rows: usize) -> usize {
    rows / TILE + MAX_ROWS
}

/// The scratch buffers of prefill passes, for `rows` rows (allocated at the first such pass,
/// grown in steps of 512 rows up to PREFILL_ROWS).
pub(super) struct PrefillBuffers {
    rows: usize,
    layout: Layout,
    input: CudaSlice<u32>,
    x: CudaSlice<u8>,
    hn: CudaSlice<u8>,
    qkv: CudaSlice<u8>,
    attn: CudaSlice<u8>,
    delta: CudaSlice<u8>,
    gate_up: CudaSlice<u8>,
    act: CudaSlice<u8>,
    lora_t: CudaSlice<f32>,
}

impl CudaDecode {
    /// Whether the prefill path runs `chunks` over `store`: bf16, some chunk of more than one
    /// row, every chunk's tokens only (no prompt-tuning rows) and its last row's logits or none,
    /// at most MAX_ROWS chunks and PREFILL_ROWS rows.
    pub fn accepts_prefill(&self, model: &Decoder, chunks: &[SeqChunk], store: &KvStore) -> bool {
        let exact = model.ropes[0].exact_until();
        self.prefill_kernels.is_some()
            && chunks.len() <= MAX_ROWS
            && chunks.iter().any(|c| c.tokens.len() > 1)
            && chunks.iter().map(|c| c.tokens.len()).sum::<usize>() <= PREFILL_ROWS
            && self.fits_store(store)
            && chunks.iter().all(|c| {
                !c.tokens.is_empty()
                    && c.virtual_rows.is_empty()
                    && matches!(c.logits, Logits::Last | Logits::None)
                    && exact.is_none_or(|n| c.seq_len.max(c.pos + c.tokens.len()) <= n)
            })
    }

    /// f32 logits `[outputs, vocab]` of the last row of each chunk that asks for them, in chunk
    /// order, and their greedy reduction, as [`Self::forward`] returns them (both `None` when no
    /// chunk asks), for a pass that [`Self::accepts_prefill`]. `None` when a chunk's expert set
    /// holds adapters this path does not run.
    pub fn prefill(&mut self, chunks: &[SeqChunk], store: &KvStore) -> Result<Option<Outputs>> {
        let rows: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        let Some(sets) = self.set_tables(chunks)? else { return Ok(None) };
        if !self.check_pool(store)? {
            return Ok(None);
        }
        self.prefill_buffers(rows)?;
        let mut p = self.prefill_buffers.take().expect("allocated above");
        let out = self.prefill_pass(&mut p, chunks, store, &sets, rows);
        self.prefill_buffers = Some(p);
        out
    }

    fn prefill_pass(
        &mut self,
        p: &mut PrefillBuffers,
        chunks: &[SeqChunk],
        store: &KvStore,
        sets: &[u64],
        rows: usize,
    ) -> Result<Option<Outputs>> {
        let lay = p.layout;
        // 1. The rows' inputs, one upload.
        let bs = store.block_size;
        let narrow = |v: usize| u32::try_from(v).map_err(|_| err("a size beyond u32"));
        let st = &mut self.staging;
        st.clear();
        st.resize(lay.tables, 0);
        let (mut row, mut tiles, mut outputs) = (0, 0, 0);
        for (c, chunk) in chunks.iter().enumerate() {
            let n = chunk.tokens.len();
            let blocks = &chunk.blocks[0];
            let nblocks = (chunk.pos + n).div_ceil(bs);
            if nblocks > blocks.len() || nblocks > self.max_blocks {
                return Err(err("block table shorter than the positions attended"));
            }
            let toff = narrow(st.len() - lay.tables)?;
            for (i, &id) in chunk.tokens.iter().enumerate() {
                let at = chunk.pos + i;
                st[lay.ids + row + i] = id;
                st[lay.pos + row + i] = narrow(at)?;
                st[lay.slot + row + i] = narrow(blocks[at / bs] as usize * bs + at % bs)?;
                st[lay.sets + 2 * (row + i)] = sets[c] as u32;
                st[lay.sets + 2 * (row + i) + 1] = (sets[c] >> 32) as u32;
            }
            for first in (0..n).step_by(TILE) {
                let t = lay.tiles + 4 * tiles;
                st[t] = narrow(row + first)?;
                st[t + 1] = narrow((n - first).min(TILE))?;
                st[t + 2] = narrow(chunk.pos + first)?;
                st[t + 3] = toff;
                tiles += 1;
            }
            row += n;
            if chunk.logits == Logits::Last {
                st[lay.outs + outputs] = narrow(row - 1)?;
                outputs += 1;
            }
            st.extend_from_slice(&blocks[..nblocks]);
        }
        debug_assert!(tiles <= max_tiles(p.rows));
        self.stream.memcpy_htod(&st[..], &mut p.input.slice_mut(..st.len())).map_err(err)?;
        // 2. The pass.
        self.issue_prefill(p, rows, tiles, outputs, sets.iter().any(|&s| s != 0), store)?;
        if let Some(t) = &self.timing {
            // EXPERT_RUNTIME_CUDA_TIMING reports decode passes: a prefill pass's events are dropped.
            t.events.borrow_mut().clear();
        }
        if outputs == 0 {
            return Ok(Some((None, None)));
        }
        Ok(Some((Some(self.copy_out(&self.b.logits, outputs, self.vocab)?), Some(self.copy_out(&self.b.reduced, outputs, 3)?))))
    }

    /// Makes sure the prefill buffers hold `rows` rows.
    fn prefill_buffers(&mut self, rows: usize) -> Result<()> {
        if self.prefill_buffers.as_ref().is_some_and(|p| p.rows >= rows) {
            return Ok(());
        }
        self.prefill_buffers = None; // the old buffers go before the new ones are taken
        let cap = rows.next_multiple_of(512).clamp(512, PREFILL_ROWS);
        let layout = Layout::new(cap);
        let s = &self.stream;
        let es = self.dtype.size_in_bytes();
        let bytes = |n: usize| -> Result<CudaSlice<u8>> { s.alloc_zeros::<u8>(cap * n * es).map_err(err) };
        let (h, wide, nq, inter) = (self.h, (self.nh + 2 * self.nkv) * self.hd, self.nh * self.hd, self.inter);
        self.prefill_buffers = Some(PrefillBuffers {
            rows: cap,
            layout,
            input: s.alloc_zeros::<u32>(layout.tables + MAX_ROWS * self.max_blocks).map_err(err)?,
            x: bytes(h)?,
            hn: bytes(h)?,
            qkv: bytes(wide)?,
            attn: bytes(nq)?,
            delta: bytes(h)?,
            gate_up: bytes(2 * inter)?,
            act: bytes(inter)?,
            lora_t: s.alloc_zeros::<f32>(cap * LORA_MAX * LORA_RANK).map_err(err)?,
        });
        Ok(())
    }

    /// Every launch of one prefill pass of `rows` rows, `tiles` attention tiles and `outputs`
    /// returned rows, over the uploaded inputs.
    fn issue_prefill(
        &self,
        p: &PrefillBuffers,
        rows: usize,
        tiles: usize,
        outputs: usize,
        lora: bool,
        store: &KvStore,
    ) -> Result<()> {
        let k = self.prefill_kernels.as_ref().expect("accepts_prefill checked");
        let s = self.stream.as_ref();
        let q = |x: &CudaSlice<u8>| slice_ptr(x, s);
        let (x, hn, qkv, attn, delta, gate_up, act) =
            (q(&p.x), q(&p.hn), q(&p.qkv), q(&p.attn), q(&p.delta), q(&p.gate_up), q(&p.act));
        let input = slice_ptr(&p.input, s);
        let at = |off: usize| input + (off * 4) as u64;
        let lay = p.layout;
        let lora: LoraPtrs = lora.then(|| (at(lay.sets), slice_ptr(&p.lora_t, s)));
        let (hid, nq, nk, inter) = (self.h, self.nh * self.hd, self.nkv * self.hd, self.inter);
        let es = self.dtype.size_in_bytes() as u64;
        let wide = nq + 2 * nk;
        let (h, nh, nkv, hd) = (hid as i32, self.nh as i32, self.nkv as i32, self.hd as i32);
        let r = u32::try_from(rows).map_err(|_| err("too many rows"))?;
        let norm_threads = 1024u32.min((hid.div_ceil(32) * 32) as u32);
        let (eps, interleaved) = (self.eps, self.interleaved as i32);
        let (bs, window) = (i32n(store.block_size)?, 0i32);
        let scale = 1f32 / (self.hd as f32).sqrt();
        let (k_at, v_at) = (qkv + nq as u64 * es, qkv + (nq + nk) as u64 * es);
        let wide_i = wide as i32;
        let null = 0u64;
        let split = k.split.unwrap_or(if tiles * self.nh < SPLIT_BELOW_BLOCKS { 2 } else { 1 });

        self.launch("embed", &self.k.embed, (r, 1, 1), norm_threads, &[&self.embed, &at(lay.ids), &x, &h])?;
        for (i, l) in self.layers.iter().enumerate() {
            let add = if i == 0 { null } else { delta };
            self.launch("add_rmsnorm", &self.k.add_rmsnorm, (r, 1, 1), norm_threads, &[&x, &add, &l.ln1, &hn, &h, &eps])?;
            self.qkv_products(i, rows, hn, qkv, lora)?;
            let (kp, vp) = store.layer(i);
            let (kp, vp) = (ptr(kp, s)?, ptr(vp, s)?);
            self.launch(
                "qkv_rows",
                &k.qkv_rows,
                (r, self.nkv as u32, 1),
                THREADS,
                &[
                    &qkv,
                    &k_at,
                    &v_at,
                    &wide_i,
                    &l.qb,
                    &l.kb,
                    &l.vb,
                    &l.qn,
                    &l.kn,
                    &self.cos,
                    &self.sin,
                    &at(lay.pos),
                    &at(lay.slot),
                    &kp,
                    &vp,
                    &nh,
                    &nkv,
                    &hd,
                    &eps,
                    &interleaved,
                ],
            )?;
            self.launch(
                "attn_prefill",
                &k.attn[split - 1],
                (tiles as u32, self.nh as u32, 1),
                32 * 4 * split as u32,
                &[&qkv, &wide_i, &kp, &vp, &at(lay.tiles), &at(lay.tables), &nh, &nkv, &bs, &window, &scale, &attn],
            )?;
            self.mat("gemm_o", attn, nq, l.o, delta, hid, rows, hid, nq)?;
            if let Some(ptrs) = lora {
                self.lora(ptrs, rows, Slot::new(i, Proj::O), attn, nq, nq, delta, hid, hid)?;
            }
            self.launch("add_rmsnorm", &self.k.add_rmsnorm, (r, 1, 1), norm_threads, &[&x, &delta, &l.ln2, &hn, &h, &eps])?;
            self.gate_up_silu(i, rows, hn, gate_up, act, lora)?;
            self.mat("gemm_down", act, inter, l.down, delta, hid, rows, hid, inter)?;
            if let Some(ptrs) = lora {
                self.lora(ptrs, rows, Slot::new(i, Proj::Down), act, inter, inter, delta, hid, hid)?;
            }
        }
        // The returned rows: the final norm (with the last residual add), the head, the reduction.
        if outputs == 0 {
            return Ok(());
        }
        let o = outputs as u32;
        let out_hn = slice_ptr(&self.b.hn, s);
        self.launch(
            "norm_rows",
            &k.norm_rows,
            (o, 1, 1),
            norm_threads,
            &[&x, &delta, &self.norm, &out_hn, &at(lay.outs), &h, &eps],
        )?;
        self.issue_head(out_hn, outputs)
    }
}
