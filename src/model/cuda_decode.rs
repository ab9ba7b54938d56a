//! The decode step on a CUDA device as a handful of kernels and cuBLAS products per layer, over
//! buffers allocated once, replayed as a CUDA graph.
//!
//! The generic path issues about 36 candle ops per layer, each with its own allocation and
//! launch: a batch-1 decode step of a 28-layer model costs 7–14 ms of host work for well under
//! a millisecond of device work. Here a step is: one upload of the rows' inputs (token ids,
//! positions, KV slots, block tables: one `u32` buffer), then per layer an RMSNorm, the q/k/v
//! product, one attention kernel (bias, q-k norm, RoPE and the pool writes of the new position,
//! then split-context paged attention and its merge), the output projection, RMSNorm with the
//! residual add, gate·up·SiLU and down; then the final norm, the head, and the greedy reduction of each row that
//! `engine::readback` would otherwise run as a dozen candle ops. Every size is an argument and every
//! per-row input sits in the uploaded buffer, so the sequence of launches for a given row count
//! and context bucket is captured once as a CUDA graph and replayed for each later step.
//!
//! It serves passes whose chunks are all single decode rows (the last row's logits) of the base
//! model or of expert sets made of plain LoRAs (each row its own set: the low-rank products run
//! per row, in the Punica / BGMV manner, from a table of the set's A and B addresses built once
//! per set), with dense f32 or bf16 weights and a dense pool of the same dtype; everything else
//! (DoRA, IA³, LoKr, prompt chunks) takes the generic path. Kernels: `cuda_decode.cu`, compiled to PTX
//! at build time. Each kernel is launched with programmatic dependent launch: it may start while
//! the previous one finishes, and waits for it before reading its output.
//! `EXPERT_RUNTIME_CUDA_DECODE=0` turns the path off, `EXPERT_RUNTIME_CUDA_GRAPHS=0` keeps it but
//! launches eagerly, `EXPERT_RUNTIME_CUDA_PDL=0` launches without programmatic dependencies, and
//! `EXPERT_RUNTIME_CUDA_TIMING=1` launches eagerly with a pair of CUDA events around each kernel
//! and prints the device time per kind of kernel (stderr, every 64 passes).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use candle_core::cuda_backend::cudarc::cublas::CudaBlas;
use candle_core::cuda_backend::cudarc::driver::{CudaEvent, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr};
use candle_core::{CudaDevice, CudaStorage, DType, Storage, Tensor};

use super::{Decoder, Logits, SeqChunk};
use crate::error::{EngineError, Result};
use crate::kv::{KvFormat, KvStore};
use crate::model::linear::{Linear, Weight};

#[path = "cuda_decode/issue.rs"]
mod issue;
#[path = "cuda_decode/launch.rs"]
mod launch;
#[path = "cuda_decode/lora.rs"]
mod lora;
#[path = "cuda_decode/prefill.rs"]
mod prefill;
#[path = "cuda_decode/setup.rs"]
mod setup;

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/cuda_decode.ptx"));
const MODULE: &str = "expert_runtime_cuda_decode";
/// Rows a pass may have on this path; larger decode batches take the generic path.
pub const MAX_ROWS: usize = 64;
/// Attention splits along the context at most (the workspace holds this many per head; the
/// kernel's MAX_SPLITS).
const MAX_SPLITS: usize = 64;
/// Positions of an attention split at least and (up to MAX_SPLITS splits) at most, and the
/// blocks the splits aim for: at one row a short context is split finely so that its heads
/// spread over many blocks; many rows fill the device with fewer, longer splits.
const MIN_SPLIT: usize = 32;
const MAX_SPLIT: usize = 128;
const ATTN_BLOCKS: usize = 256;
/// Query heads per KV head at most, and head_dim at most (the attention kernel's arrays).
const MAX_REP: usize = 8;
const MAX_HEAD_DIM: usize = 256;
const ATTN_THREADS: u32 = 128;
/// Rows up to which the products run on the GEMV kernels rather than cuBLAS.
const GEMV_ROWS: usize = 4;
/// CUDA graphs kept at most (one per launch shape; the cache starts over beyond).
const MAX_GRAPHS: usize = 128;
/// Blocks per row of the greedy reduction (at most).
const GREEDY_PARTS: usize = 32;
/// Offsets of the per-row inputs in the uploaded buffer (`u32`s), then the block tables.
const IDS: usize = 0;
const POS: usize = MAX_ROWS;
const SLOT: usize = 2 * MAX_ROWS;
const LENS: usize = 3 * MAX_ROWS;
const TOFF: usize = 4 * MAX_ROWS;
/// Per row, the address of its expert set's LoRA table (a `u64` as two `u32`s; 0: none).
const SETS: usize = 5 * MAX_ROWS;
const TABLES: usize = 7 * MAX_ROWS;
/// LoRA adapters per row and module, and their rank, at most (the kernels' table and workspace).
const LORA_MAX: usize = 4;
const LORA_RANK: usize = 64;
/// Bytes of one table entry: A and B addresses, rank, scale (`LoraEntry` in the kernels).
const LORA_ENTRY: usize = 24;
/// Expert sets whose tables are kept (the cache starts over beyond).
const LORA_SETS: usize = 256;

fn err(msg: impl std::fmt::Display) -> EngineError {
    EngineError::Internal(format!("CUDA decode: {msg}"))
}

/// The device address of a contiguous CUDA tensor's first element.
fn ptr(t: &Tensor, stream: &CudaStream) -> Result<u64> {
    let (st, layout) = t.storage_and_layout();
    let Storage::Cuda(cs) = &*st else { return Err(err("tensor not on the GPU")) };
    if !layout.is_contiguous() {
        return Err(err("tensor not contiguous"));
    }
    let base = match t.dtype() {
        DType::F32 => cs.as_cuda_slice::<f32>()?.device_ptr(stream).0,
        DType::BF16 => cs.as_cuda_slice::<half::bf16>()?.device_ptr(stream).0,
        other => return Err(err(format!("dtype {other:?}"))),
    };
    Ok(base + (layout.start_offset() * t.dtype().size_in_bytes()) as u64)
}

fn i32n(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| err("a size beyond i32"))
}

fn slice_ptr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    s.device_ptr(stream).0
}

/// The dense weight of `l` in `dtype`, or why this path cannot run it.
fn dense(l: &Linear, dtype: DType) -> Option<&Tensor> {
    match &l.weight {
        Weight::Dense(w) if w.dtype() == dtype && w.is_contiguous() => Some(w),
        _ => None,
    }
}

struct LayerPtrs {
    ln1: u64,
    q: u64,
    k: u64,
    v: u64,
    qb: u64,
    kb: u64,
    vb: u64,
    qn: u64,
    kn: u64,
    o: u64,
    ln2: u64,
    gate: u64,
    up: u64,
    down: u64,
    /// q, k, v (gate, up) are adjacent views of one tensor ([`fuse_projections`]): one product.
    qkv_fused: bool,
    gate_up_fused: bool,
}

struct Kernels {
    embed: CudaFunction,
    add_rmsnorm: CudaFunction,
    attn_decode: CudaFunction,
    silu_mul: CudaFunction,
    widen: CudaFunction,
    greedy_reduce: CudaFunction,
    spin: CudaFunction,
    gemv: CudaFunction,
    gemv_gate_up: CudaFunction,
    lora_shrink: CudaFunction,
    lora_expand: CudaFunction,
}

/// The scratch buffers of a step, sized for [`MAX_ROWS`] rows.
struct Buffers {
    input: CudaSlice<u32>,
    x: CudaSlice<u8>,
    hn: CudaSlice<u8>,
    /// The q, k, v projections of a row side by side: `[rows, (nh + 2·nkv)·hd]`.
    qkv: CudaSlice<u8>,
    attn: CudaSlice<u8>,
    delta: CudaSlice<u8>,
    /// gate and up side by side, `[rows, 2·inter]`, then silu(gate)·up, `[rows, inter]`.
    gate_up: CudaSlice<u8>,
    act: CudaSlice<u8>,
    logits_t: CudaSlice<u8>,
    logits: CudaSlice<f32>,
    /// Per row: max, greedy id, log-sum-exp.
    reduced: CudaSlice<f32>,
    ws_ml: CudaSlice<f32>,
    ws_acc: CudaSlice<f32>,
    /// Per (row, KV head): the attention splits finished (the last one merges, and zeroes it).
    attn_done: CudaSlice<u32>,
    /// The greedy reduction's partials per (row, part), and parts finished per row.
    greedy_part: CudaSlice<f32>,
    greedy_done: CudaSlice<u32>,
    /// The LoRA products `A x` per (row, adapter, rank index).
    lora_t: CudaSlice<f32>,
}

/// A step's launch shape: rows, the attention split (positions per split, splits), and whether
/// some row runs LoRAs.
type Shape = (usize, usize, usize, bool);

pub struct CudaDecode {
    dev: CudaDevice,
    stream: Arc<CudaStream>,
    blas: Arc<CudaBlas>,
    k: Kernels,
    dtype: DType,
    layers: Vec<LayerPtrs>,
    embed: u64,
    norm: u64,
    head: u64,
    cos: u64,
    sin: u64,
    h: usize,
    nh: usize,
    nkv: usize,
    hd: usize,
    inter: usize,
    vocab: usize,
    eps: f32,
    interleaved: bool,
    max_blocks: usize,
    b: Buffers,
    staging: Vec<u32>,
    /// The pool the graphs write to (its layer-0 K address): graphs are dropped if it changes.
    pool: u64,
    /// Whether every layer's K and V pool starts on a 16-byte boundary (else the generic path runs).
    pool_aligned: bool,
    graphs: HashMap<Shape, CudaGraph>,
    /// Shapes run eagerly once (cuBLAS picks its kernels outside a capture), captured next time.
    seen: HashSet<Shape>,
    use_graphs: bool,
    /// Whether products of up to GEMV_ROWS rows take the GEMV kernel (`EXPERT_RUNTIME_CUDA_GEMV=0`: cuBLAS).
    use_gemv: bool,
    /// Whether kernels are launched with programmatic dependent launch (`EXPERT_RUNTIME_CUDA_PDL=0`: not).
    use_pdl: bool,
    timing: Option<Timing>,
    /// Per expert set (its key): its LoRA table on the device, or `None` when this path cannot
    /// run the set.
    lora_sets: HashMap<Vec<u64>, Option<CudaSlice<u8>>>,
    /// The prefill path's kernels (bf16, head_dim 16 to 128; else prompt chunks run generic),
    /// and its buffers once a prefill pass has run.
    prefill_kernels: Option<prefill::PrefillKernels>,
    prefill_buffers: Option<prefill::PrefillBuffers>,
}

/// Device time per kind of kernel (`EXPERT_RUNTIME_CUDA_TIMING=1`).
#[derive(Default)]
struct Timing {
    /// This pass's launches: kind, start and end events.
    events: RefCell<Vec<(&'static str, CudaEvent, CudaEvent)>>,
    /// Milliseconds per kind, passes and rows since the last report.
    totals: BTreeMap<&'static str, f64>,
    passes: u32,
    rows: usize,
}

impl Timing {
    /// Waits for the pass, adds its kernels' times, and reports every 64 passes.
    fn pass_done(&mut self, rows: usize) -> Result<()> {
        for (kind, start, end) in self.events.get_mut().drain(..).filter(|(kind, ..)| *kind != "spin") {
            *self.totals.entry(kind).or_default() += start.elapsed_ms(&end).map_err(err)? as f64;
        }
        self.passes += 1;
        self.rows += rows;
        if self.passes == 64 {
            let n = self.passes as f64;
            let total: f64 = self.totals.values().sum();
            let parts: Vec<String> = self.totals.iter().map(|(k, v)| format!("{k} {:.1}", 1000.0 * v / n)).collect();
            eprintln!(
                "expert-runtime CUDA decode timing: {:.1} rows/pass, device µs per pass: total {:.1}: {}",
                self.rows as f64 / n,
                1000.0 * total / n,
                parts.join(", ")
            );
            *self = Self::default();
        }
        Ok(())
    }
}

fn env_off(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "0")
}

impl CudaDecode {
    /// Whether this path runs `chunks` over `store`.
    pub fn accepts(&self, model: &Decoder, chunks: &[SeqChunk], store: &KvStore) -> bool {
        let exact = model.ropes[0].exact_until();
        !chunks.is_empty()
            && chunks.len() <= MAX_ROWS
            && self.fits_store(store)
            && chunks.iter().all(|c| {
                c.tokens.len() == 1
                    && c.virtual_rows.is_empty()
                    && c.logits == Logits::Last
                    && exact.is_none_or(|n| c.seq_len.max(c.pos + 1) <= n)
            })
    }

    /// Whether the kernels can read and write `store`'s pool: dense in the model dtype, laid out
    /// position-major, with this model's KV heads and head_dim.
    fn fits_store(&self, store: &KvStore) -> bool {
        store.format == KvFormat::Dense(self.dtype)
            && !store.head_major()
            && store.kv_heads == self.nkv
            && store.head_dim == self.hd
    }

    /// f32 logits `[rows, vocab]` of a pass that [`Self::accepts`], and per row `[max, greedy id,
    /// log Σ exp(x − max)]` (`[rows, 3]`, see `engine::readback`).
    /// `None` when a row's expert set holds adapters this path does not run.
    pub fn forward(&mut self, chunks: &[SeqChunk], store: &KvStore) -> Result<Option<(Tensor, Tensor)>> {
        let rows = chunks.len();
        let bs = store.block_size;
        // 0. Each row's LoRA table (built once per expert set).
        let Some(sets) = self.set_tables(chunks)? else { return Ok(None) };
        let lora = sets.iter().any(|&p| p != 0);
        // 1. The rows' inputs, one upload.
        let st = &mut self.staging;
        st.clear();
        st.resize(TABLES, 0);
        let mut longest = 0;
        for (r, c) in chunks.iter().enumerate() {
            let len = c.pos + 1;
            let nblocks = len.div_ceil(bs);
            let blocks = &c.blocks[0];
            if nblocks > blocks.len() || nblocks > self.max_blocks {
                return Err(err("block table shorter than the positions attended"));
            }
            let slot = blocks[c.pos / bs] as usize * bs + c.pos % bs;
            let narrow = |v: usize| u32::try_from(v).map_err(|_| err("a size beyond u32"));
            st[IDS + r] = c.tokens[0];
            st[POS + r] = narrow(c.pos)?;
            st[SLOT + r] = narrow(slot)?;
            st[LENS + r] = narrow(len)?;
            st[TOFF + r] = narrow(st.len() - TABLES)?;
            st[SETS + 2 * r] = sets[r] as u32;
            st[SETS + 2 * r + 1] = (sets[r] >> 32) as u32;
            st.extend_from_slice(&blocks[..nblocks]);
            longest = longest.max(len);
        }
        self.stream.memcpy_htod(&st[..], &mut self.b.input.slice_mut(..st.len())).map_err(err)?;

        // 2. The context bucket: a power of two of positions, in splits that give the attention
        //    about ATTN_BLOCKS blocks, each of MIN_SPLIT to MAX_SPLIT positions, at most
        //    MAX_SPLITS splits (the choice measured best on an H200 by benches/cuda/kernels.cu).
        let bucket = longest.next_power_of_two().max(MIN_SPLIT);
        let want = ATTN_BLOCKS.div_ceil(rows * self.nkv);
        let split = (bucket / want).clamp(MIN_SPLIT, MAX_SPLIT).max(bucket / MAX_SPLITS);
        let shape = (rows, split, bucket.div_ceil(split), lora);
        if !self.check_pool(store)? {
            return Ok(None);
        }
        if self.graphs.len() >= MAX_GRAPHS {
            self.graphs.clear();
        }

        // 3. The pass: a replay, a capture, or launches.
        if self.timing.is_some() {
            // The device waits ~20 ms while the pass and its events are queued behind it.
            let cycles = 40_000_000i64;
            self.launch("spin", &self.k.spin, (1, 1, 1), 32, &[&cycles])?;
            self.issue(shape, store)?;
            if let Some(t) = &mut self.timing {
                t.pass_done(rows)?;
            }
        } else if let Some(g) = self.graphs.get(&shape) {
            g.launch().map_err(err)?;
        } else if self.use_graphs && self.seen.contains(&shape) {
            self.capture(shape, store)?;
        } else {
            self.issue(shape, store)?;
            self.seen.insert(shape);
        }

        // 4. The logits and their reduction, copied out of the static buffers.
        Ok(Some((self.copy_out(&self.b.logits, rows, self.vocab)?, self.copy_out(&self.b.reduced, rows, 3)?)))
    }

    /// The address of the LoRA table of `c`'s expert set (built once per set; 0: the base model),
    /// or `None` when the set holds adapters this path does not run.
    fn set_table(&mut self, c: &SeqChunk) -> Result<Option<u64>> {
        let key = c.experts.key();
        if key.is_empty() {
            return Ok(Some(0));
        }
        if !self.lora_sets.contains_key(&key) {
            let table = self.lora_table(c.experts)?;
            self.lora_sets.insert(key.clone(), table);
        }
        Ok(self.lora_sets[&key].as_ref().map(|t| slice_ptr(t, &self.stream)))
    }

    /// The addresses of the LoRA tables of `chunks`' expert sets ([`Self::set_table`], 0: the
    /// base model), or `None` when a set holds adapters this path does not run. The cache of
    /// tables starts over beyond LORA_SETS before any address of the pass is taken, so none
    /// of them is freed while the pass uses it.
    fn set_tables(&mut self, chunks: &[SeqChunk]) -> Result<Option<Vec<u64>>> {
        let new: HashSet<Vec<u64>> =
            chunks.iter().map(|c| c.experts.key()).filter(|k| !k.is_empty() && !self.lora_sets.contains_key(k)).collect();
        if self.lora_sets.len() + new.len() > LORA_SETS {
            self.lora_sets.clear();
        }
        let mut sets = Vec::with_capacity(chunks.len());
        for c in chunks {
            match self.set_table(c)? {
                Some(p) => sets.push(p),
                None => return Ok(None),
            }
        }
        Ok(Some(sets))
    }

    /// Whether this path can run over `store`'s pool: every layer's keys and values start on a
    /// 16-byte boundary (the attention kernels read them 16 bytes at a time). A new pool drops
    /// the graphs, which hold the old one's addresses.
    fn check_pool(&mut self, store: &KvStore) -> Result<bool> {
        let pool = ptr(store.layer(0).0, &self.stream)?;
        if pool != self.pool {
            self.graphs.clear();
            self.seen.clear();
            self.pool = pool;
            let mut aligned = true;
            for i in 0..self.layers.len() {
                let (k, v) = store.layer(i);
                aligned &= ptr(k, &self.stream)? % 16 == 0 && ptr(v, &self.stream)? % 16 == 0;
            }
            self.pool_aligned = aligned;
        }
        Ok(self.pool_aligned)
    }

    /// The first `rows` rows of `src` (`[MAX_ROWS, cols]`) as a new tensor.
    fn copy_out(&self, src: &CudaSlice<f32>, rows: usize, cols: usize) -> Result<Tensor> {
        let n = rows * cols;
        // SAFETY: every element is written by the copy below before the tensor is read.
        let mut out = unsafe { self.stream.alloc::<f32>(n) }.map_err(err)?;
        self.stream.memcpy_dtod(&src.slice(..n), &mut out).map_err(err)?;
        let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(out, self.dev.clone()));
        Ok(Tensor::from_storage(storage, (rows, cols), candle_core::op::BackpropOp::none(), false))
    }
}

/// On a GPU, makes the q, k, v weights of a layer (and its gate and up weights) views of one
/// tensor each, so the decode path multiplies each group in one product. Nothing is kept twice:
/// the modules' weights are the views (contiguous row ranges), the originals are dropped.
/// Layers whose weights are not dense in `dtype` stay as they are.
pub(super) fn fuse_projections(l: &mut super::DecoderLayer, dtype: DType) -> Result<()> {
    // (A recurrent layer is never on this path: `fused_decode_gap` names it.)
    let Some(a) = l.attention_mut() else { return Ok(()) };
    // (A layer sharing an earlier layer's keys and values has no k or v: never on this path.)
    if let (Some(k), Some(v)) = (&mut a.k_proj, &mut a.v_proj) {
        fuse(&mut [&mut a.q_proj, k, v], dtype)?;
    }
    match l.mlp.dense_mut() {
        Some(m) => fuse(&mut [&mut m.gate_proj, &mut m.up_proj], dtype),
        // (A routed layer is never on this path either.)
        None => Ok(()),
    }
}

fn fuse(group: &mut [&mut Linear], dtype: DType) -> Result<()> {
    let Some(ws) = group.iter().map(|l| dense(l, dtype).cloned()).collect::<Option<Vec<Tensor>>>() else {
        return Ok(());
    };
    let all = Tensor::cat(&ws, 0)?;
    drop(ws);
    let mut at = 0;
    for l in group.iter_mut() {
        l.weight = Weight::Dense(all.narrow(0, at, l.out_features)?);
        at += l.out_features;
    }
    Ok(())
}

// SAFETY: the graphs and buffers are used by one thread at a time (the decoder keeps this
// behind a mutex); CUDA graph objects may be used from any thread when calls are serialized.
unsafe impl Send for CudaDecode {}
