//! Building the CUDA decode path for a model: the checks that it fits (device, dtype, shapes,
//! dense weights), each layer's weight addresses, the kernels loaded from the PTX, and the
//! scratch buffers sized for `MAX_ROWS` rows.

use std::collections::{HashMap, HashSet};

use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaSlice};
use candle_core::{DType, Device, Tensor};

use super::{
    dense, env_off, err, ptr, Buffers, CudaDecode, Kernels, LayerPtrs, Timing, GREEDY_PARTS, LORA_MAX, LORA_RANK, MAX_HEAD_DIM,
    MAX_REP, MAX_ROWS, MAX_SPLITS, MODULE, PTX, TABLES,
};
use crate::error::Result;
use crate::kv::KvStore;
use crate::model::decoder::Decoder;

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
            let Some(a) = l.attention() else { return Ok(None) };
            let Some(m) = l.mlp.dense() else { return Ok(None) };
            let (Some(q), Some(k), Some(v), Some(o), Some(gate), Some(up), Some(down)) = (
                dense(&a.q_proj, dt),
                a.k_proj.as_ref().and_then(|l| dense(l, dt)),
                a.v_proj.as_ref().and_then(|l| dense(l, dt)),
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
                kb: opt(a.k_proj.as_ref().and_then(|l| l.bias.as_ref()))?,
                vb: opt(a.v_proj.as_ref().and_then(|l| l.bias.as_ref()))?,
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
        let prefill_kernels = super::prefill::PrefillKernels::load(
            |name| Ok(dev.get_or_load_custom_func(name, MODULE, PTX)?.into_cuda_function()),
            dt,
            hd,
        )?;
        let k = Kernels {
            embed: f("embed")?,
            add_rmsnorm: f("add_rmsnorm")?,
            // head_dim 128 in bf16: the variant compiled for it (the same bits, faster).
            attn_decode: f(if dt == DType::BF16 && hd == 128 { "attn_decode_hd128" } else { "attn_decode" })?,
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
            prefill_kernels,
            prefill_buffers: None,
            timing: std::env::var("EXPERT_RUNTIME_CUDA_TIMING").is_ok_and(|v| v == "1").then(Timing::default),
            stream,
        }))
    }
}
