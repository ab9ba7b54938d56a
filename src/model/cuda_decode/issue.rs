//! One pass of the CUDA decode path: every launch of a step of a given shape (embedding, the
//! layers, the final norm, the head and the greedy reduction), issued directly or captured
//! once as a CUDA graph that later steps of the same shape replay.

use candle_core::cuda_backend::cudarc::driver::{self, CudaSlice};
use candle_core::DType;

use super::lora::LoraPtrs;
use super::{err, i32n, ptr, slice_ptr, CudaDecode, Shape, ATTN_THREADS, GREEDY_PARTS, IDS, LENS, POS, SETS, SLOT, TABLES, TOFF};
use crate::error::Result;
use crate::kv::KvStore;
use crate::model::adapt::{Proj, Slot};

impl CudaDecode {
    /// Captures the pass of `shape` as a graph and replays it; if the capture fails (a driver or
    /// library that cannot be captured), graphs are turned off and the pass is issued directly.
    pub(super) fn capture(&mut self, shape: Shape, store: &KvStore) -> Result<()> {
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

    /// Every launch of one pass of `shape` over the uploaded inputs.
    pub(super) fn issue(&self, (rows, split, splits, lora): Shape, store: &KvStore) -> Result<()> {
        let s = self.stream.as_ref();
        let b = &self.b;
        let lora: LoraPtrs = lora.then(|| (slice_ptr(&b.input, s) + (SETS * 4) as u64, slice_ptr(&b.lora_t, s)));
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
        let (k_at, v_at) = (qkv + nq as u64 * es, qkv + (nq + nk) as u64 * es);
        let (wide_i, inter_i) = (wide as i32, inter as i32);

        self.launch("embed", &self.k.embed, (r, 1, 1), norm_threads, &[&self.embed, &at(IDS), &x, &h])?;
        for (i, l) in self.layers.iter().enumerate() {
            let add = if i == 0 { null } else { delta };
            self.launch("add_rmsnorm", &self.k.add_rmsnorm, (r, 1, 1), norm_threads, &[&x, &add, &l.ln1, &hn, &h, &eps])?;
            self.qkv_products(i, rows, hn, qkv, lora)?;
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
            if let Some(ptrs) = lora {
                self.lora(ptrs, rows, Slot::new(i, Proj::O), attn, nq, nq, delta, hid, hid)?;
            }
            self.launch("add_rmsnorm", &self.k.add_rmsnorm, (r, 1, 1), norm_threads, &[&x, &delta, &l.ln2, &hn, &h, &eps])?;
            if lora.is_none() && self.gemv_fits(rows, hid, hid, &[hn, l.gate, l.up]) {
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
                self.gate_up_silu(i, rows, hn, gate_up, act, lora)?;
            }
            self.mat("gemm_down", act, inter, l.down, delta, hid, rows, hid, inter)?;
            if let Some(ptrs) = lora {
                self.lora(ptrs, rows, Slot::new(i, Proj::Down), act, inter, inter, delta, hid, hid)?;
            }
        }
        self.launch("add_rmsnorm", &self.k.add_rmsnorm, (r, 1, 1), norm_threads, &[&x, &delta, &self.norm, &hn, &h, &eps])?;
        self.issue_head(hn, rows)
    }

    /// Layer `i`'s q, k and v products of `rows` rows of `hn` into `qkv` (`[rows, (nh + 2·nkv)·hd]`,
    /// one product where the weights are adjacent), then the LoRA deltas of the rows under LoRAs.
    pub(super) fn qkv_products(&self, i: usize, rows: usize, hn: u64, qkv: u64, lora: LoraPtrs) -> Result<()> {
        let l = &self.layers[i];
        let (hid, nq, nk) = (self.h, self.nh * self.hd, self.nkv * self.hd);
        let es = self.dtype.size_in_bytes() as u64;
        let wide = nq + 2 * nk;
        let (k_at, v_at) = (qkv + nq as u64 * es, qkv + (nq + nk) as u64 * es);
        if l.qkv_fused {
            self.mat("gemm_qkv", hn, hid, l.q, qkv, wide, rows, wide, hid)?;
        } else {
            self.mat("gemm_qkv", hn, hid, l.q, qkv, wide, rows, nq, hid)?;
            self.mat("gemm_qkv", hn, hid, l.k, k_at, wide, rows, nk, hid)?;
            self.mat("gemm_qkv", hn, hid, l.v, v_at, wide, rows, nk, hid)?;
        }
        if let Some(ptrs) = lora {
            self.lora(ptrs, rows, Slot::new(i, Proj::Q), hn, hid, hid, qkv, wide, nq)?;
            self.lora(ptrs, rows, Slot::new(i, Proj::K), hn, hid, hid, k_at, wide, nk)?;
            self.lora(ptrs, rows, Slot::new(i, Proj::V), hn, hid, hid, v_at, wide, nk)?;
        }
        Ok(())
    }

    /// Layer `i`'s gate and up products of `rows` rows of `hn` into `gate_up` (`[rows, 2·inter]`)
    /// with the LoRA deltas, then SiLU·mul into `act` (`[rows, inter]`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gate_up_silu(&self, i: usize, rows: usize, hn: u64, gate_up: u64, act: u64, lora: LoraPtrs) -> Result<()> {
        let l = &self.layers[i];
        let (hid, inter) = (self.h, self.inter);
        let up_at = gate_up + (inter * self.dtype.size_in_bytes()) as u64;
        if l.gate_up_fused {
            self.mat("gemm_gate_up", hn, hid, l.gate, gate_up, 2 * inter, rows, 2 * inter, hid)?;
        } else {
            self.mat("gemm_gate_up", hn, hid, l.gate, gate_up, 2 * inter, rows, inter, hid)?;
            self.mat("gemm_gate_up", hn, hid, l.up, up_at, 2 * inter, rows, inter, hid)?;
        }
        if let Some(ptrs) = lora {
            self.lora(ptrs, rows, Slot::new(i, Proj::Gate), hn, hid, hid, gate_up, 2 * inter, inter)?;
            self.lora(ptrs, rows, Slot::new(i, Proj::Up), hn, hid, hid, up_at, 2 * inter, inter)?;
        }
        let n = rows * inter;
        let grid = ((n as u32).div_ceil(256)).min(4096);
        let (inter_i, n_i) = (i32n(inter)?, i32n(n)?);
        let two_inter = 2 * inter_i;
        self.launch("silu_mul", &self.k.silu_mul, (grid, 1, 1), 256, &[&gate_up, &up_at, &two_inter, &act, &inter_i, &n_i])
    }

    /// The head over `rows` final-normed rows at `hn` (`[rows, hidden]`): f32 logits into
    /// `b.logits` and each row's greedy reduction into `b.reduced`.
    pub(super) fn issue_head(&self, hn: u64, rows: usize) -> Result<()> {
        let s = self.stream.as_ref();
        let b = &self.b;
        let hid = self.h;
        let r = rows as u32;
        let elementwise = |n: usize| (((n as u32).div_ceil(256)).min(4096), 256u32);
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
