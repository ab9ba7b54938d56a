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

use candle_core::cuda_backend::cudarc::cublas::{self, CudaBlas};
use candle_core::cuda_backend::cudarc::driver::{self, CudaEvent, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr};
use candle_core::{CudaDevice, CudaStorage, DType, Device, Storage, Tensor};

use super::{Decoder, Logits, SeqChunk};
use crate::error::{EngineError, Result};
use crate::kv::{KvFormat, KvStore};
use crate::model::adapt::{Proj, Slot};
use crate::model::linear::{Linear, Weight};

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
    /// The path for `model`, or `None` when its weights, shapes or device do not fit it.
    pub fn new(model: &Decoder, store: &KvStore) -> Result<Option<Self>> {
        let Device::Cuda(dev) = &model.device else { return Ok(None) };
        let dt = model.dtype;
        let cfg = &model.cfg;
        let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        if env_off("EXPERT_RUNTIME_CUDA_DECODE")
            || !matches!(dt, DType::F32 | DType::BF16)
            || nkv == 0
            || nh % nkv != 0
            || nh / nkv > MAX_REP
            || hd % (16 / dt.size_in_bytes()) != 0
            || hd > MAX_HEAD_DIM
        {
            return Ok(None);
        }
        let stream = dev.cuda_stream();
        let s = stream.as_ref();
        let opt = |t: Option<&Tensor>| -> Result<u64> { t.map_or(Ok(0), |t| ptr(t, s)) };
        let mut layers = Vec::with_capacity(model.layers.len());
        for l in &model.layers {
            let a = &l.self_attn;
            let m = &l.mlp;
            let (Some(q), Some(k), Some(v), Some(o), Some(gate), Some(up), Some(down)) = (
                dense(&a.q_proj, dt),
                dense(&a.k_proj, dt),
                dense(&a.v_proj, dt),
                dense(&a.o_proj, dt),
                dense(&m.gate_proj, dt),
                dense(&m.up_proj, dt),
                dense(&m.down_proj, dt),
            ) else {
                return Ok(None);
            };
            if a.o_proj.bias.is_some() || [&m.gate_proj, &m.up_proj, &m.down_proj].iter().any(|l| l.bias.is_some()) {
                return Ok(None);
            }
            let (pq, pk, pv, pg, pu) = (ptr(q, s)?, ptr(k, s)?, ptr(v, s)?, ptr(gate, s)?, ptr(up, s)?);
            let row_bytes = (cfg.hidden_size * dt.size_in_bytes()) as u64;
            let (nq, nk) = ((nh * hd) as u64, (nkv * hd) as u64);
            layers.push(LayerPtrs {
                qkv_fused: pk == pq + nq * row_bytes && pv == pk + nk * row_bytes,
                gate_up_fused: pu == pg + cfg.intermediate_size as u64 * row_bytes,
                ln1: ptr(&l.input_layernorm.weight, s)?,
                q: pq,
                k: pk,
                v: pv,
                qb: opt(a.q_proj.bias.as_ref())?,
                kb: opt(a.k_proj.bias.as_ref())?,
                vb: opt(a.v_proj.bias.as_ref())?,
                qn: opt(a.q_norm.as_ref().map(|n| &n.weight))?,
                kn: opt(a.k_norm.as_ref().map(|n| &n.weight))?,
                o: ptr(o, s)?,
                ln2: ptr(&l.post_attention_layernorm.weight, s)?,
                gate: pg,
                up: pu,
                down: ptr(down, s)?,
            });
        }
        let Some(embed) = dense(&model.embed_tokens, dt) else { return Ok(None) };
        let head = match &model.lm_head {
            Some(l) => match dense(l, dt) {
                Some(w) if l.bias.is_none() => w,
                _ => return Ok(None),
            },
            None => embed,
        };
        let (cos, sin) = model.ropes[0].tables();
        if cos.dtype() != dt {
            return Ok(None);
        }
        let suffix = if dt == DType::F32 { "f32" } else { "bf16" };
        let f = |name: &str| -> Result<CudaFunction> {
            Ok(dev.get_or_load_custom_func(&format!("{name}_{suffix}"), MODULE, PTX)?.into_cuda_function())
        };
        let k = Kernels {
            embed: f("embed")?,
            add_rmsnorm: f("add_rmsnorm")?,
            attn_decode: f("attn_decode")?,
            silu_mul: f("silu_mul")?,
            widen: f("widen")?,
            greedy_reduce: dev.get_or_load_custom_func("greedy_reduce", MODULE, PTX)?.into_cuda_function(),
            spin: dev.get_or_load_custom_func("spin", MODULE, PTX)?.into_cuda_function(),
            gemv: f("gemv")?,
            gemv_gate_up: f("gemv_gate_up")?,
            lora_shrink: f("lora_shrink")?,
            lora_expand: f("lora_expand")?,
        };
        let (h, inter, vocab) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
        let max_blocks = model.max_positions().div_ceil(store.block_size.max(1)).max(1);
        let es = dt.size_in_bytes();
        let bytes = |n: usize| -> Result<CudaSlice<u8>> { stream.alloc_zeros::<u8>(MAX_ROWS * n * es).map_err(err) };
        let b = Buffers {
            input: stream.alloc_zeros::<u32>(TABLES + MAX_ROWS * max_blocks).map_err(err)?,
            x: bytes(h)?,
            hn: bytes(h)?,
            qkv: bytes((nh + 2 * nkv) * hd)?,
            attn: bytes(nh * hd)?,
            delta: bytes(h)?,
            gate_up: bytes(2 * inter)?,
            act: bytes(inter)?,
            logits_t: if dt == DType::F32 { stream.alloc_zeros::<u8>(1).map_err(err)? } else { bytes(vocab)? },
            logits: stream.alloc_zeros::<f32>(MAX_ROWS * vocab).map_err(err)?,
            reduced: stream.alloc_zeros::<f32>(MAX_ROWS * 3).map_err(err)?,
            ws_ml: stream.alloc_zeros::<f32>(MAX_ROWS * nh * MAX_SPLITS * 2).map_err(err)?,
            ws_acc: stream.alloc_zeros::<f32>(MAX_ROWS * nh * MAX_SPLITS * hd).map_err(err)?,
            attn_done: stream.alloc_zeros::<u32>(MAX_ROWS * nkv).map_err(err)?,
            greedy_part: stream.alloc_zeros::<f32>(MAX_ROWS * GREEDY_PARTS * 3).map_err(err)?,
            greedy_done: stream.alloc_zeros::<u32>(MAX_ROWS).map_err(err)?,
            lora_t: stream.alloc_zeros::<f32>(MAX_ROWS * LORA_MAX * LORA_RANK).map_err(err)?,
        };
        Ok(Some(Self {
            dev: dev.clone(),
            blas: dev.cublas_handle(),
            k,
            dtype: dt,
            layers,
            embed: ptr(embed, s)?,
            norm: ptr(&model.norm.weight, s)?,
            head: ptr(head, s)?,
            cos: ptr(cos, s)?,
            sin: ptr(sin, s)?,
            h,
            nh,
            nkv,
            hd,
            inter,
            vocab,
            eps: cfg.rms_norm_eps as f32,
            interleaved: cfg.rope_interleaved,
            max_blocks,
            b,
            staging: Vec::new(),
            pool: 0,
            pool_aligned: false,
            graphs: HashMap::new(),
            seen: HashSet::new(),
            use_graphs: !env_off("EXPERT_RUNTIME_CUDA_GRAPHS"),
            use_gemv: !env_off("EXPERT_RUNTIME_CUDA_GEMV"),
            use_pdl: !env_off("EXPERT_RUNTIME_CUDA_PDL"),
            lora_sets: HashMap::new(),
            timing: std::env::var("EXPERT_RUNTIME_CUDA_TIMING").is_ok_and(|v| v == "1").then(Timing::default),
            stream,
        }))
    }

    /// Whether this path runs `chunks` over `store`.
    pub fn accepts(&self, model: &Decoder, chunks: &[SeqChunk], store: &KvStore) -> bool {
        let exact = model.ropes[0].exact_until();
        !chunks.is_empty()
            && chunks.len() <= MAX_ROWS
            && store.format == KvFormat::Dense(self.dtype)
            && !store.head_major()
            && store.kv_heads == self.nkv
            && store.head_dim == self.hd
            && chunks.iter().all(|c| {
                c.tokens.len() == 1
                    && c.virtual_rows.is_empty()
                    && c.logits == Logits::Last
                    && exact.is_none_or(|n| c.seq_len.max(c.pos + 1) <= n)
            })
    }

    /// f32 logits `[rows, vocab]` of a pass that [`Self::accepts`], and per row `[max, greedy id,
    /// log Σ exp(x − max)]` (`[rows, 3]`, see `engine::readback`).
    /// `None` when a row's expert set holds adapters this path does not run.
    pub fn forward(&mut self, chunks: &[SeqChunk], store: &KvStore) -> Result<Option<(Tensor, Tensor)>> {
        let rows = chunks.len();
        let bs = store.block_size;
        // 0. Each row's LoRA table (built once per expert set).
        let mut sets = [0u64; MAX_ROWS];
        for (r, c) in chunks.iter().enumerate() {
            let key = c.experts.key();
            if key.is_empty() {
                continue;
            }
            if !self.lora_sets.contains_key(&key) {
                if self.lora_sets.len() >= LORA_SETS {
                    self.lora_sets.clear();
                }
                let table = self.lora_table(c.experts)?;
                self.lora_sets.insert(key.clone(), table);
            }
            match &self.lora_sets[&key] {
                Some(t) => sets[r] = slice_ptr(t, &self.stream),
                None => return Ok(None),
            }
        }
        let lora = sets.iter().any(|&p| p != 0);
        // 1. The rows' inputs, one upload.
        let st = &mut self.staging;
        st.clear();
        st.resize(TABLES, 0);
        let mut longest = 0;
        for (r, c) in chunks.iter().enumerate() {
            let len = c.pos + 1;
            let nblocks = len.div_ceil(bs);
            if nblocks > c.blocks.len() || nblocks > self.max_blocks {
                return Err(err("block table shorter than the positions attended"));
            }
            let slot = c.blocks[c.pos / bs] as usize * bs + c.pos % bs;
            let narrow = |v: usize| u32::try_from(v).map_err(|_| err("a size beyond u32"));
            st[IDS + r] = c.tokens[0];
            st[POS + r] = narrow(c.pos)?;
            st[SLOT + r] = narrow(slot)?;
            st[LENS + r] = narrow(len)?;
            st[TOFF + r] = narrow(st.len() - TABLES)?;
            st[SETS + 2 * r] = sets[r] as u32;
            st[SETS + 2 * r + 1] = (sets[r] >> 32) as u32;
            st.extend_from_slice(&c.blocks[..nblocks]);
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
        let pool = ptr(store.layer(0).0, &self.stream)?;
        if pool != self.pool {
            self.graphs.clear();
            self.seen.clear();
            self.pool = pool;
            // The attention kernel reads keys 16 bytes at a time.
            let mut aligned = true;
            for i in 0..self.layers.len() {
                let (k, v) = store.layer(i);
                aligned &= ptr(k, &self.stream)? % 16 == 0 && ptr(v, &self.stream)? % 16 == 0;
            }
            self.pool_aligned = aligned;
        }
        if !self.pool_aligned {
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

    /// The LoRA table of an expert set (see `LoraEntry` in the kernels), or `None` when some module
    /// of the set holds other adapters, more than LORA_MAX of them, a rank beyond LORA_RANK, or
    /// factors that are not contiguous tensors of the model dtype on this device.
    fn lora_table(&self, experts: &dyn super::Adapters) -> Result<Option<CudaSlice<u8>>> {
        let s = self.stream.as_ref();
        let (hid, nq, nk, inter) = (self.h, self.nh * self.hd, self.nkv * self.hd, self.inter);
        let mut table = vec![0u8; self.layers.len() * Proj::ALL.len() * LORA_MAX * LORA_ENTRY];
        for layer in 0..self.layers.len() {
            for proj in Proj::ALL {
                let slot = Slot::new(layer, proj);
                let Some(list) = experts.low_ranks(slot) else { return Ok(None) };
                if list.len() > LORA_MAX {
                    return Ok(None);
                }
                let (inp, out) = match proj {
                    Proj::Q => (hid, nq),
                    Proj::K | Proj::V => (hid, nk),
                    Proj::O => (nq, hid),
                    Proj::Gate | Proj::Up => (hid, inter),
                    Proj::Down => (inter, hid),
                };
                for (e, (a, b, scale)) in list.into_iter().enumerate() {
                    let Ok((rank, a_in)) = a.dims2() else { return Ok(None) };
                    let fits = rank > 0
                        && rank <= LORA_RANK
                        && a_in == inp
                        && b.dims2().ok() == Some((out, rank))
                        && a.dtype() == self.dtype
                        && b.dtype() == self.dtype
                        && a.is_contiguous()
                        && b.is_contiguous()
                        && a.device().same_device(&Device::Cuda(self.dev.clone()))
                        && b.device().same_device(&Device::Cuda(self.dev.clone()));
                    if !fits {
                        return Ok(None);
                    }
                    let at = (slot.index() * LORA_MAX + e) * LORA_ENTRY;
                    let entry = &mut table[at..at + LORA_ENTRY];
                    entry[0..8].copy_from_slice(&ptr(a, s)?.to_le_bytes());
                    entry[8..16].copy_from_slice(&ptr(b, s)?.to_le_bytes());
                    entry[16..20].copy_from_slice(&(rank as i32).to_le_bytes());
                    entry[20..24].copy_from_slice(&(scale as f32).to_le_bytes());
                }
            }
        }
        Ok(Some(self.stream.clone_htod(&table).map_err(err)?))
    }

    /// The LoRA deltas of module `slot` for the rows that run LoRAs: `y` (rows `ldy` apart,
    /// `out` columns) += each adapter's `s · B (A x)`, `x` rows `ldx` apart with `inp` columns.
    #[allow(clippy::too_many_arguments)]
    fn lora(&self, rows: usize, slot: Slot, x: u64, ldx: usize, inp: usize, y: u64, ldy: usize, out: usize) -> Result<()> {
        let s = self.stream.as_ref();
        let sets = slice_ptr(&self.b.input, s) + (SETS * 4) as u64;
        let t = slice_ptr(&self.b.lora_t, s);
        let (slot_i, ldx, inp, ldy, out_i) = (i32n(slot.index())?, i32n(ldx)?, i32n(inp)?, i32n(ldy)?, i32n(out)?);
        let r = rows as u32;
        self.launch(
            "lora_shrink",
            &self.k.lora_shrink,
            (r, LORA_MAX as u32, (LORA_RANK / 8) as u32),
            256,
            &[&sets, &slot_i, &x, &ldx, &inp, &t],
        )?;
        let blocks = u32::try_from(out.div_ceil(256)).map_err(|_| err("too many outputs"))?;
        self.launch("lora_expand", &self.k.lora_expand, (r, blocks, 1), 256, &[&sets, &slot_i, &t, &y, &ldy, &out_i])
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

    /// Captures the pass of `shape` as a graph and replays it; if the capture fails (a driver or
    /// library that cannot be captured), graphs are turned off and the pass is issued directly.
    fn capture(&mut self, shape: Shape, store: &KvStore) -> Result<()> {
        let mode = driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        self.stream.begin_capture(mode).map_err(err)?;
        let issued = self.issue(shape, store);
        let graph = self.stream.end_capture(driver::sys::CUgraphInstantiate_flags(0));
        match (issued, graph) {
            (Ok(()), Ok(Some(g))) => {
                g.launch().map_err(err)?;
                self.graphs.insert(shape, g);
                Ok(())
            }
            (issued, graph) => {
                eprintln!(
                    "expert-runtime: CUDA graph capture failed ({}); decode steps launch their kernels directly",
                    issued.err().map(|e| e.to_string()).or(graph.err().map(|e| e.to_string())).unwrap_or_default()
                );
                self.use_graphs = false;
                self.issue(shape, store)
            }
        }
    }

    /// Runs `f` (launches of one kind), between two timing events when timing is on.
    fn timed(&self, kind: &'static str, f: impl FnOnce() -> Result<()>) -> Result<()> {
        let Some(t) = &self.timing else { return f() };
        let flags = Some(driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.stream.record_event(flags).map_err(err)?;
        f()?;
        let end = self.stream.record_event(flags).map_err(err)?;
        t.events.borrow_mut().push((kind, start, end));
        Ok(())
    }

    fn launch(&self, kind: &'static str, f: &CudaFunction, grid: (u32, u32, u32), block: u32, args: &[&dyn Arg]) -> Result<()> {
        self.launch_with(kind, f, grid, block, 0, args)
    }

    /// [`Self::launch`] with `smem` bytes of dynamic shared memory.
    fn launch_with(
        &self,
        kind: &'static str,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[&dyn Arg],
    ) -> Result<()> {
        self.timed(kind, || {
            // With programmatic dependent launch the kernel may start while the previous one
            // finishes; it waits for it (`pdl_wait` in cuda_decode.cu) before reading its output.
            // Without the attribute, this is a plain launch.
            use driver::sys;
            let mut params: Vec<*mut std::ffi::c_void> = args.iter().map(|a| a.param()).collect();
            // SAFETY: a plain C struct and union, all-zero valid; the fields used are set below.
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let cfg = sys::CUlaunchConfig {
                gridDimX: grid.0,
                gridDimY: grid.1,
                gridDimZ: grid.2,
                blockDimX: block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: smem,
                hStream: self.stream.cu_stream(),
                attrs: &mut attr,
                numAttrs: u32::from(self.use_pdl),
            };
            self.stream.context().bind_to_thread().map_err(err)?;
            // SAFETY: every kernel of the module is launched with the argument list of its
            // signature in cuda_decode.cu (pointers to buffers sized for MAX_ROWS rows, sizes that
            // match them), checked on the host before the launch. `params` points at the argument
            // values and `cfg` at `attr`, which outlive the call (the driver copies them).
            unsafe { sys::cuLaunchKernelEx(&cfg, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) }
                .result()
                .map_err(err)
        })
    }

    /// Whether a product of `rows` rows over `inp` inputs, `x` rows `ldx` apart, runs on the GEMV
    /// kernels: few rows, and 16-byte aligned operands.
    fn gemv_fits(&self, rows: usize, inp: usize, ldx: usize, ptrs: &[u64]) -> bool {
        let v = 16 / self.dtype.size_in_bytes();
        self.use_gemv
            && rows <= GEMV_ROWS
            && inp.is_multiple_of(v)
            && ldx.is_multiple_of(v)
            && ptrs.iter().all(|p| p.is_multiple_of(16))
    }

    /// How the GEMV kernels split a product over `inp` inputs and `out` outputs: warps per output
    /// (one while a lane has at most four 16-byte loads of a weight row, else four), and blocks of
    /// 8 warps. Measured on an H200 (`benches/cuda/kernels.cu`): k = 1024 runs best on one warp,
    /// k = 2048 and 3072 on four (1.2–1.4× faster at one row, 1.9–2.2× at four).
    fn gemv_split(&self, inp: usize, out: usize) -> Result<(i32, u32)> {
        let loads = inp.div_ceil(32 * (16 / self.dtype.size_in_bytes()));
        let parts = if loads <= 4 { 1 } else { 4 };
        let blocks = u32::try_from(out.div_ceil(8 / parts)).map_err(|_| err("too many output rows"))?;
        Ok((parts as i32, blocks))
    }

    /// `y[rows, out] = x[rows, inp] · w[out, inp]ᵀ` in the model dtype, f32 accumulation; rows of
    /// `x` are `ldx` elements apart, rows of `y` `ldy`. Up to GEMV_ROWS rows with aligned
    /// operands run on the GEMV kernel, the rest on cuBLAS.
    #[allow(clippy::too_many_arguments)]
    fn mat(
        &self,
        kind: &'static str,
        x: u64,
        ldx: usize,
        w: u64,
        y: u64,
        ldy: usize,
        rows: usize,
        out: usize,
        inp: usize,
    ) -> Result<()> {
        if self.gemv_fits(rows, inp, ldx, &[x, w]) {
            let (ldx, ldy, rows_i, out_i, inp_i) = (i32n(ldx)?, i32n(ldy)?, i32n(rows)?, i32n(out)?, i32n(inp)?);
            let (parts, blocks) = self.gemv_split(inp, out)?;
            return self.launch(
                kind,
                &self.k.gemv,
                (blocks, 1, 1),
                256,
                &[&x, &ldx, &w, &y, &ldy, &rows_i, &out_i, &inp_i, &parts],
            );
        }
        self.timed(kind, || self.gemm_now(x, ldx, w, y, rows, out, inp, ldy))
    }

    #[allow(clippy::too_many_arguments)]
    fn gemm_now(&self, x: u64, ldx: usize, w: u64, y: u64, rows: usize, out: usize, inp: usize, ldy: usize) -> Result<()> {
        use cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
        let dt = if self.dtype == DType::F32 { cudaDataType::CUDA_R_32F } else { cudaDataType::CUDA_R_16BF };
        let (alpha, beta) = (1f32, 0f32);
        let i = i32n;
        // Column-major: yᵀ[out, rows] = w[inp, out]ᵀ · xᵀ[inp, rows].
        // SAFETY: the pointers address buffers of at least rows·inp, out·inp and rows·out
        // elements of the stated types on this handle's device.
        unsafe {
            cublas::result::gemm_ex(
                *self.blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                i(out)?,
                i(rows)?,
                i(inp)?,
                &alpha as *const f32 as *const _,
                w as *const _,
                dt,
                i(inp)?,
                x as *const _,
                dt,
                i(ldx)?,
                &beta as *const f32 as *const _,
                y as *mut _,
                dt,
                i(ldy)?,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(err)
    }

    /// Every launch of one pass of `shape` over the uploaded inputs.
    fn issue(&self, (rows, split, splits, lora): Shape, store: &KvStore) -> Result<()> {
        let s = self.stream.as_ref();
        let b = &self.b;
        let p = |x: &CudaSlice<u8>| slice_ptr(x, s);
        let (x, hn, qkv, attn, delta, gate_up, act) =
            (p(&b.x), p(&b.hn), p(&b.qkv), p(&b.attn), p(&b.delta), p(&b.gate_up), p(&b.act));
        let attn_done = slice_ptr(&b.attn_done, s);
        let input = slice_ptr(&b.input, s);
        let at = |off: usize| input + (off * 4) as u64;
        let (ws_ml, ws_acc) = (slice_ptr(&b.ws_ml, s), slice_ptr(&b.ws_acc, s));
        let (hid, nq, nk, inter) = (self.h, self.nh * self.hd, self.nkv * self.hd, self.inter);
        let es = self.dtype.size_in_bytes() as u64;
        let wide = nq + 2 * nk;
        let (h, nh, nkv, hd) = (hid as i32, self.nh as i32, self.nkv as i32, self.hd as i32);
        let r = rows as u32;
        let norm_threads = 1024u32.min((hid.div_ceil(32) * 32) as u32);
        let null = 0u64;
        let (eps, interleaved) = (self.eps, self.interleaved as i32);
        let (bs, split_i) = (store.block_size as i32, split as i32);
        let scale = 1f32 / (self.hd as f32).sqrt();
        // The attention kernel's tile of keys and values (ATILE positions, rows padded by 16 bytes).
        let tile_bytes = (2 * (64 / es) * (self.hd as u64 + 16 / es) * es) as u32;
        let elementwise = |n: usize| (((n as u32).div_ceil(256)).min(4096), 256u32);
        let (k_at, v_at) = (qkv + nq as u64 * es, qkv + (nq + nk) as u64 * es);
        let (up_at, wide_i, inter_i) = (gate_up + inter as u64 * es, wide as i32, inter as i32);

        self.launch("embed", &self.k.embed, (r, 1, 1), norm_threads, &[&self.embed, &at(IDS), &x, &h])?;
        for (i, l) in self.layers.iter().enumerate() {
            let add = if i == 0 { null } else { delta };
            self.launch("add_rmsnorm", &self.k.add_rmsnorm, (r, 1, 1), norm_threads, &[&x, &add, &l.ln1, &hn, &h, &eps])?;
            if l.qkv_fused {
                self.mat("gemm_qkv", hn, hid, l.q, qkv, wide, rows, wide, hid)?;
            } else {
                self.mat("gemm_qkv", hn, hid, l.q, qkv, wide, rows, nq, hid)?;
                self.mat("gemm_qkv", hn, hid, l.k, k_at, wide, rows, nk, hid)?;
                self.mat("gemm_qkv", hn, hid, l.v, v_at, wide, rows, nk, hid)?;
            }
            if lora {
                self.lora(rows, Slot::new(i, Proj::Q), hn, hid, hid, qkv, wide, nq)?;
                self.lora(rows, Slot::new(i, Proj::K), hn, hid, hid, k_at, wide, nk)?;
                self.lora(rows, Slot::new(i, Proj::V), hn, hid, hid, v_at, wide, nk)?;
            }
            let (kp, vp) = store.layer(i);
            let (kp, vp) = (ptr(kp, s)?, ptr(vp, s)?);
            self.launch_with(
                "attention",
                &self.k.attn_decode,
                (r, self.nkv as u32, splits as u32),
                ATTN_THREADS,
                tile_bytes,
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
                    &at(POS),
                    &at(SLOT),
                    &kp,
                    &vp,
                    &at(TABLES),
                    &at(TOFF),
                    &at(LENS),
                    &ws_ml,
                    &ws_acc,
                    &attn_done,
                    &attn,
                    &nh,
                    &nkv,
                    &hd,
                    &bs,
                    &split_i,
                    &scale,
                    &eps,
                    &interleaved,
                ],
            )?;
            self.mat("gemm_o", attn, nq, l.o, delta, hid, rows, hid, nq)?;
            if lora {
                self.lora(rows, Slot::new(i, Proj::O), attn, nq, nq, delta, hid, hid)?;
            }
            self.launch("add_rmsnorm", &self.k.add_rmsnorm, (r, 1, 1), norm_threads, &[&x, &delta, &l.ln2, &hn, &h, &eps])?;
            if !lora && self.gemv_fits(rows, hid, hid, &[hn, l.gate, l.up]) {
                // gate, up and SiLU·mul in one kernel.
                let (parts, blocks) = self.gemv_split(hid, inter)?;
                self.launch(
                    "gemv_gate_up",
                    &self.k.gemv_gate_up,
                    (blocks, 1, 1),
                    256,
                    &[&hn, &h, &l.gate, &l.up, &act, &(rows as i32), &inter_i, &h, &parts],
                )?;
            } else {
                if l.gate_up_fused {
                    self.mat("gemm_gate_up", hn, hid, l.gate, gate_up, 2 * inter, rows, 2 * inter, hid)?;
                } else {
                    self.mat("gemm_gate_up", hn, hid, l.gate, gate_up, 2 * inter, rows, inter, hid)?;
                    self.mat("gemm_gate_up", hn, hid, l.up, up_at, 2 * inter, rows, inter, hid)?;
                }
                if lora {
                    self.lora(rows, Slot::new(i, Proj::Gate), hn, hid, hid, gate_up, 2 * inter, inter)?;
                    self.lora(rows, Slot::new(i, Proj::Up), hn, hid, hid, up_at, 2 * inter, inter)?;
                }
                let n = rows * inter;
                let (grid, threads) = elementwise(n);
                let two_inter = 2 * inter_i;
                self.launch(
                    "silu_mul",
                    &self.k.silu_mul,
                    (grid, 1, 1),
                    threads,
                    &[&gate_up, &up_at, &two_inter, &act, &inter_i, &(n as i32)],
                )?;
            }
            self.mat("gemm_down", act, inter, l.down, delta, hid, rows, hid, inter)?;
            if lora {
                self.lora(rows, Slot::new(i, Proj::Down), act, inter, inter, delta, hid, hid)?;
            }
        }
        self.launch("add_rmsnorm", &self.k.add_rmsnorm, (r, 1, 1), norm_threads, &[&x, &delta, &self.norm, &hn, &h, &eps])?;
        let logits = slice_ptr(&b.logits, s);
        let vocab = self.vocab;
        if self.dtype == DType::F32 {
            self.mat("gemm_head", hn, hid, self.head, logits, vocab, rows, vocab, hid)?;
        } else {
            let lt = slice_ptr(&b.logits_t, s);
            self.mat("gemm_head", hn, hid, self.head, lt, vocab, rows, vocab, hid)?;
            let n = rows * vocab;
            let (grid, threads) = elementwise(n);
            self.launch("widen", &self.k.widen, (grid, 1, 1), threads, &[&lt, &logits, &(n as i32)])?;
        }
        let (reduced, part, done) = (slice_ptr(&b.reduced, s), slice_ptr(&b.greedy_part, s), slice_ptr(&b.greedy_done, s));
        let parts = vocab.div_ceil(4096).clamp(1, GREEDY_PARTS) as u32;
        self.launch(
            "greedy_reduce",
            &self.k.greedy_reduce,
            (r, parts, 1),
            256,
            &[&logits, &part, &done, &reduced, &(vocab as i32)],
        )?;
        Ok(())
    }
}

/// On a GPU, makes the q, k, v weights of a layer (and its gate and up weights) views of one
/// tensor each, so the decode path multiplies each group in one product. Nothing is kept twice:
/// the modules' weights are the views (contiguous row ranges), the originals are dropped.
/// Layers whose weights are not dense in `dtype` stay as they are.
pub(super) fn fuse_projections(l: &mut super::DecoderLayer, dtype: DType) -> Result<()> {
    let a = &mut l.self_attn;
    fuse(&mut [&mut a.q_proj, &mut a.k_proj, &mut a.v_proj], dtype)?;
    let m = &mut l.mlp;
    fuse(&mut [&mut m.gate_proj, &mut m.up_proj], dtype)
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

/// A kernel argument of one of the types the kernels take.
trait Arg {
    /// The value's address, as `cuLaunchKernelEx` takes each argument.
    fn param(&self) -> *mut std::ffi::c_void;
}

macro_rules! arg {
    ($($t:ty),*) => {$(
        impl Arg for $t {
            fn param(&self) -> *mut std::ffi::c_void {
                self as *const $t as *mut std::ffi::c_void
            }
        }
    )*};
}
arg!(u64, i32, i64, f32);

// SAFETY: the graphs and buffers are used by one thread at a time (the decoder keeps this
// behind a mutex); CUDA graph objects may be used from any thread when calls are serialized.
unsafe impl Send for CudaDecode {}
