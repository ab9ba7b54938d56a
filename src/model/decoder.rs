//! The decoder-only transformer: one forward pass that runs a model's [`LayerPlan`].
//!
//! The plan says what each layer is (see [`super::plan`] for why this is one decoder rather
//! than a model per family); this module builds the layers the plan names from the weights and
//! runs them. It names no family. A plan asking for something this decoder does not run yet
//! is refused at load, by name.
//!
//! Structs are named after the HF tensors they hold (`q_proj`, `k_norm`, `input_layernorm`),
//! so a tensor name greps to its code. The KV cache is passed in by the caller: the model holds
//! weights only; batched passes take each sequence's block table into a shared pool.
//!
//! Numerics follow HF transformers: RMSNorm and softmax accumulate in f32; logits are returned
//! in f32.

use candle_core::{DType, Device, Tensor};

use super::config::ModelConfig;
use super::layer::{DecoderLayer, Pass, RecurrentSpan, RmsNorm};
use super::linear::Linear;
use super::loader::WeightSource;
use super::plan::{LayerPlan, NormWeight};
use super::rope::{Rope, RopeRows, RopeScaling};
use super::table::Table;
use crate::error::{EngineError, Result};
use std::ops::Range;

use super::adapt::{Adapters, Fused, NoAdapters, Proj, Segment, Slot};
use crate::kv::attention::{AttentionPlan, SeqSpan};
use crate::kv::store::slot_runs;
use crate::kv::{BlockId, KvCache, KvFormat, KvLayout, KvStore};

#[cfg(feature = "cuda")]
#[path = "cuda_decode.rs"]
mod cuda_decode;

/// The CUDA decode path of a model: built at the first pass that could use it.
#[cfg(feature = "cuda")]
enum CudaPath {
    Unbuilt,
    Off,
    On(Box<cuda_decode::CudaDecode>),
}

/// What a forward pass returns for a chunk's rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Nothing (a prompt chunk that does not reach the end of the prompt).
    None,
    /// `[vocab]` for the last position only (generation: skips the lm_head for the rest).
    Last,
    /// `[seq, vocab]` for every position.
    All,
    /// No logits: the final hidden state (after the final norm, f32) of every token row
    /// (embeddings; virtual rows excluded).
    Hidden,
}

/// What one batched pass returns: logits and hidden states for the rows the chunks asked for,
/// in chunk order.
pub struct PassOutput {
    pub logits: Option<Tensor>,
    pub hidden: Option<Tensor>,
    /// Per logits row, `[max, greedy id, log Σ exp(x − max)]` (`[rows, 3]`), where the pass
    /// computed it on the device (see `engine::readback`).
    pub greedy: Option<Tensor>,
}

pub struct Decoder {
    pub cfg: ModelConfig,
    /// What each layer runs.
    pub plan: LayerPlan,
    /// The projections the checkpoint stores fused (adapters name them so).
    pub fused: Fused,
    embed_tokens: Linear,
    /// Gemma 4's per-layer input embeddings.
    per_layer_inputs: Option<PerLayerInputs>,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    /// `None` when the output projection is tied to `embed_tokens`.
    lm_head: Option<Linear>,
    /// The rotary embeddings over the runtime's context, as [`LayerPlan::ropes`] lists them.
    ropes: Vec<Rope>,
    pub dtype: DType,
    pub device: Device,
    #[cfg(feature = "cuda")]
    cuda: std::sync::Mutex<CudaPath>,
}

impl Drop for Decoder {
    /// The last reference to a model may go on the JS thread (`dispose` while an expert load
    /// still holds it): bind the device's context there before the weights are freed.
    fn drop(&mut self) {
        let _ = crate::backend::bind_thread(&self.device);
    }
}

impl Decoder {
    /// Reads every weight from `src`, checking shapes against `cfg`. `max_positions` bounds the
    /// RoPE tables (the runtime's context length).
    pub fn load(
        cfg: ModelConfig,
        src: &mut dyn WeightSource,
        dtype: DType,
        device: &Device,
        max_positions: usize,
    ) -> Result<Self> {
        let mut cfg = cfg;
        if cfg.rope_scaling.is_none() && src.contains("rope_freqs") {
            // GGUF's form of Llama 3 scaling: per-frequency divisors.
            let factors: Vec<f32> = src.tensor("rope_freqs.weight", &[cfg.head_dim / 2], DType::F32)?.to_vec1()?;
            if let Some(f) = factors.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
                return Err(EngineError::InvalidModel(format!("rope_freqs holds {f}; factors must be finite and positive")));
            }
            cfg.rope_scaling = Some(RopeScaling::FrequencyFactors { factors });
        }
        let plan = LayerPlan::build(&cfg);
        if let Some(what) = plan.unsupported() {
            return Err(EngineError::UnsupportedArchitecture(format!(
                "{} model: {what} is not implemented yet",
                cfg.arch.name()
            )));
        }
        let h = cfg.hidden_size;
        let eps = cfg.rms_norm_eps;
        let embed_tokens = src.linear("model.embed_tokens", cfg.vocab_size, h, false, dtype)?;
        // Fused projections where the file has them instead of the separate ones (all layers
        // alike: an adapter names the modules once for the whole model).
        // (Read at the first attention layer: a recurrent layer has other projections.)
        let first = plan.layers.iter().position(|l| matches!(l.mixer, super::plan::Mixer::Attention(_))).unwrap_or(0);
        let stores = |fused: &str, separate: &str| {
            let name = |n: &str| format!("model.layers.{first}.{n}");
            !src.contains(&name(separate)) && src.contains(&name(fused))
        };
        let fused =
            Fused { qkv: stores("self_attn.qkv_proj", "self_attn.q_proj"), gate_up: stores("mlp.gate_up_proj", "mlp.gate_proj") };
        // Grown as layers are read (not sized by the declared count: the file must hold them).
        let mut layers = Vec::new();
        let per_layer_size = plan.per_layer_input.map(|p| p.size);
        for (i, spec) in plan.layers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            layers.push(DecoderLayer::load(src, &p, spec, (fused, per_layer_size), h, eps, dtype)?);
        }
        let per_layer_inputs = match plan.per_layer_input {
            None => None,
            Some(p) => {
                let all = p.size.checked_mul(cfg.num_layers).filter(|&n| n <= super::config::MAX_DIM).ok_or_else(|| {
                    EngineError::InvalidModel(format!("per-layer inputs of {} values for {} layers", p.size, cfg.num_layers))
                })?;
                Some(PerLayerInputs {
                    embed_tokens_per_layer: src.lookup_table("model.embed_tokens_per_layer", p.vocab, all, dtype)?,
                    per_layer_model_projection: src.linear("model.per_layer_model_projection", all, h, false, dtype)?,
                    per_layer_projection_norm: RmsNorm::load(
                        src,
                        "model.per_layer_projection_norm",
                        p.size,
                        eps,
                        NormWeight::Plain,
                        dtype,
                    )?,
                    size: p.size,
                })
            }
        };
        #[cfg(feature = "cuda")]
        if device.is_cuda() && plan.fused_decode_gap().is_none() {
            for l in &mut layers {
                cuda_decode::fuse_projections(l, dtype)?;
            }
        }
        let norm = RmsNorm::load(src, "model.norm", h, eps, plan.final_norm, dtype)?;
        let lm_head =
            if cfg.tie_word_embeddings { None } else { Some(src.linear("lm_head", cfg.vocab_size, h, false, dtype)?) };
        let ropes = plan
            .ropes
            .iter()
            .map(|r| {
                Rope::new(r.theta, r.rotary_dim, cfg.max_position_embeddings, r.scaling.clone(), max_positions, dtype, device)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            cfg,
            plan,
            fused,
            embed_tokens,
            per_layer_inputs,
            layers,
            norm,
            lm_head,
            ropes,
            dtype,
            device: device.clone(),
            #[cfg(feature = "cuda")]
            cuda: std::sync::Mutex::new(CudaPath::Unbuilt),
        })
    }

    /// A new, empty single-sequence cache shaped for this model.
    pub fn new_cache(&self, max_len: usize) -> Result<KvCache> {
        self.new_cache_as(max_len, self.dtype)
    }

    /// [`Self::new_cache`] storing keys and values as `kv_dtype`.
    pub fn new_cache_as(&self, max_len: usize, kv_dtype: impl Into<KvFormat>) -> Result<KvCache> {
        let shapes = self.plan.kv_shapes(self.cfg.num_kv_heads, self.cfg.head_dim);
        let kinds = self.plan.kv_kinds();
        KvCache::with_kinds(&kinds, &shapes, self.cfg.num_kv_heads, self.cfg.head_dim, max_len, kv_dtype, &self.device)
    }

    /// An empty pool of `num_blocks` blocks of `block_size` positions, shaped for this model.
    /// Keys and values are stored as `kv_dtype` (widened or dequantized to the activation dtype
    /// when read).
    pub fn new_store(&self, num_blocks: usize, block_size: usize, kv_dtype: impl Into<KvFormat>) -> Result<KvStore> {
        self.new_store_with_states(num_blocks, block_size, kv_dtype, (0, 0))
    }

    /// [`Self::new_store`] with slots of recurrent state (models with recurrent layers): one per
    /// sequence that may hold a state, and `(sequences, snapshots)` for prefix snapshots.
    pub fn new_store_with_states(
        &self,
        num_blocks: usize,
        block_size: usize,
        kv_dtype: impl Into<KvFormat>,
        state_slots: (usize, usize),
    ) -> Result<KvStore> {
        KvStore::new(
            self.cfg.num_layers,
            num_blocks,
            block_size,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            kv_dtype,
            &self.device,
        )?
        .with_cache_layout(self.kv_layout())?
        .with_state_slots(state_slots.0, state_slots.1)
    }

    /// What each layer keeps in the KV cache, grouped by kind (the pool is sized by it).
    pub fn kv_layout(&self) -> KvLayout {
        self.plan.kv_layout(self.cfg.num_kv_heads, self.cfg.head_dim)
    }

    pub fn max_positions(&self) -> usize {
        self.ropes.iter().map(Rope::max_positions).min().unwrap_or(0)
    }

    /// See [`Rope::exact_until`]: with `dynamic` RoPE scaling, cached positions of a sequence
    /// longer than this are valid for that sequence only.
    pub fn rope_exact_until(&self) -> Option<usize> {
        self.ropes.iter().filter_map(Rope::exact_until).min()
    }

    /// Every linear module: the layers' projections (and per-layer input branches and MoE
    /// experts), then the embedding, the per-layer input embeddings and an untied head.
    fn linears(&self) -> impl Iterator<Item = &Linear> {
        let layers = (0..self.layers.len()).flat_map(move |layer| Proj::ALL.map(|proj| self.linear(Slot { layer, proj })));
        let per_layer = self.layers.iter().filter_map(|l| l.per_layer.as_ref());
        let per_layer = per_layer.flat_map(|p| [&p.per_layer_input_gate, &p.per_layer_projection]);
        let routed = self.layers.iter().flat_map(|l| l.routed()).flat_map(|m| m.linears());
        let routed = routed.chain(self.layers.iter().flat_map(|l| l.recurrent_linears()));
        let ple = self
            .per_layer_inputs
            .iter()
            .flat_map(|p| p.embed_tokens_per_layer.linear().into_iter().chain([&p.per_layer_model_projection]));
        layers
            .flatten()
            .chain(per_layer)
            .chain(routed)
            .chain(std::iter::once(&self.embed_tokens))
            .chain(ple)
            .chain(self.lm_head.as_ref())
    }

    /// Bytes of every weight: linear weights and biases (mapped ones count the file bytes they
    /// read) and the norms (`rt.info.weightBytes`).
    pub fn weight_bytes(&self) -> usize {
        let tensor = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        let norm = |n: &RmsNorm| tensor(&n.weight);
        let linears: usize = self.linears().map(|l| l.weight.size_in_bytes() + l.bias.as_ref().map_or(0, tensor)).sum();
        let norms: usize = self
            .layers
            .iter()
            .map(|l| {
                norm(&l.input_layernorm)
                    + norm(&l.post_attention_layernorm)
                    + l.pre_feedforward_layernorm.as_ref().map_or(0, norm)
                    + l.post_feedforward_layernorm.as_ref().map_or(0, norm)
                    + l.attention().map_or(0, |a| a.q_norm.as_ref().map_or(0, norm) + a.k_norm.as_ref().map_or(0, norm))
                    + l.recurrent_bytes()
                    + l.routed().map_or(0, |m| tensor(m.router()))
            })
            .sum();
        // A mapped per-layer input table is no linear: its file bytes count here.
        let table = self.per_layer_inputs.iter().filter(|p| p.embed_tokens_per_layer.linear().is_none());
        let table: usize = table.map(|p| p.embed_tokens_per_layer.size_in_bytes()).sum();
        linears + norms + norm(&self.norm) + table
    }

    /// Bytes of weights read in place from a memory-mapped file (counted in
    /// [`Self::weight_bytes`] too): pages of the file, not memory of the process's own.
    pub fn mapped_bytes(&self) -> usize {
        let linears: usize = self
            .linears()
            .filter(|l| matches!(l.weight, super::linear::Weight::Mapped(_)))
            .map(|l| l.weight.size_in_bytes())
            .sum();
        let table = self.per_layer_inputs.iter().filter(|p| p.embed_tokens_per_layer.linear().is_none());
        linears + table.map(|p| p.embed_tokens_per_layer.size_in_bytes()).sum::<usize>()
    }

    /// What the linear weights run as (`rt.info.quantization`): `none` when all are dense,
    /// otherwise their block formats joined by `+`, most bytes first (`q4_k+q6_k`), with
    /// `dense` among them when some stay dense.
    pub fn quantization(&self) -> String {
        let mut bytes: Vec<(String, usize)> = Vec::new();
        for l in self.linears() {
            let name = l.weight.format().unwrap_or_else(|| "dense".into());
            match bytes.iter_mut().find(|(n, _)| *n == name) {
                Some((_, b)) => *b += l.weight.size_in_bytes(),
                None => bytes.push((name, l.weight.size_in_bytes())),
            }
        }
        if bytes.iter().all(|(n, _)| n == "dense") {
            return "none".into();
        }
        bytes.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        bytes.into_iter().map(|(n, _)| n).collect::<Vec<_>>().join("+")
    }

    /// The linear module at `slot` (adapters are validated and built against it).
    pub fn linear(&self, slot: Slot) -> Option<&Linear> {
        let l = self.layers.get(slot.layer)?;
        if let Some(d) = l.delta_net() {
            return match slot.proj {
                Proj::LinQkv => Some(&d.in_proj_qkv),
                Proj::LinZ => Some(&d.in_proj_z),
                Proj::LinOut => Some(&d.out_proj),
                Proj::Gate => l.mlp.dense().map(|m| &m.gate_proj),
                Proj::Up => l.mlp.dense().map(|m| &m.up_proj),
                Proj::Down => l.mlp.dense().map(|m| &m.down_proj),
                _ => None,
            };
        }
        match slot.proj {
            Proj::Q => l.attention().map(|a| &a.q_proj),
            // A layer attending with an earlier layer's keys and values has neither.
            Proj::K => l.attention()?.k_proj.as_ref(),
            Proj::V => l.attention()?.v_proj.as_ref(),
            Proj::O => l.attention().map(|a| &a.o_proj),
            Proj::LinQkv | Proj::LinZ | Proj::LinOut => None,
            // A routed layer's MoE experts are not adaptable modules.
            Proj::Gate => l.mlp.dense().map(|m| &m.gate_proj),
            Proj::Up => l.mlp.dense().map(|m| &m.up_proj),
            Proj::Down => l.mlp.dense().map(|m| &m.down_proj),
        }
    }

    /// Runs `tokens` at positions `cache.len()..`, appending their keys and values to `cache`.
    /// Returns f32 logits (see [`Logits`]).
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache, which: Logits) -> Result<Tensor> {
        self.forward_with(tokens, cache, which, &NoAdapters)
    }

    /// [`Self::forward`] under a set of adapters. At position 0 the set's prompt-tuning
    /// embeddings are evaluated first (they occupy the cache's first positions); logits are
    /// returned for `tokens` only.
    pub fn forward_with(&self, tokens: &[u32], cache: &mut KvCache, which: Logits, experts: &dyn Adapters) -> Result<Tensor> {
        let pos = cache.len();
        let virtual_rows = if pos == 0 { 0..experts.num_virtual_tokens() } else { 0..0 };
        let rows = virtual_rows.len() + tokens.len();
        assert!(!tokens.is_empty() && pos + rows <= cache.max_len().min(self.max_positions()), "positions checked by the caller");
        let seq_len = pos + rows;
        let state = (!cache.store.states().is_empty()).then_some(0);
        let chunk =
            SeqChunk { tokens, virtual_rows, pos, seq_len, blocks: &cache.blocks, state, steps: false, logits: which, experts };
        let out = self.forward_batch(&[chunk], &cache.store)?;
        cache.advance(rows);
        let logits = out.logits.or(out.hidden).expect("an output was requested");
        Ok(match which {
            Logits::Last => logits.squeeze(0)?,
            _ => logits,
        })
    }

    /// One forward pass over a batch of sequence chunks (decode rows and prompt chunks mixed).
    /// Each chunk's keys and values are written to `store` through its block table, which must
    /// already list blocks for positions `..pos + rows`. Chunks whose expert sets are equal
    /// should be adjacent: each run of equal sets is one adapter segment.
    ///
    /// Returns f32 logits and hidden states for the rows the chunks asked for, in chunk order
    /// (`None` where no chunk asked).
    pub fn forward_batch(&self, chunks: &[SeqChunk], store: &KvStore) -> Result<PassOutput> {
        #[cfg(feature = "cuda")]
        if let Some(out) = self.cuda_decode(chunks, store)? {
            return Ok(out);
        }
        // 0. Row layout: each chunk is `virtual_rows` then `tokens`, at consecutive positions;
        //    per table group of layers, each chunk's rows through that group's block table.
        let tables = store.num_tables();
        let mut spans = Vec::with_capacity(chunks.len());
        let mut rope_rows = Vec::with_capacity(chunks.len());
        let mut row = 0;
        for c in chunks {
            let n = c.rows();
            assert!(n > 0 && c.pos + n <= self.max_positions(), "positions checked by the caller");
            assert_eq!(c.blocks.len(), tables, "a block table per table group");
            spans.push(SeqSpan { row, len: n, pos: c.pos, blocks: c.blocks.first().map_or(&[], |b| b.as_slice()) });
            rope_rows.push(RopeRows { pos: c.pos, n, seq_len: c.seq_len.max(c.pos + n) });
            row += n;
        }
        let rows = row;
        let recurrent: Vec<RecurrentSpan> = spans
            .iter()
            .zip(chunks)
            .map(|(s, c)| RecurrentSpan { row: s.row, len: s.len, pos: s.pos, state: c.state, steps: c.steps })
            .collect();
        let group_spans: Vec<Vec<SeqSpan>> = (0..tables)
            .map(|t| spans.iter().zip(chunks).map(|(s, c)| SeqSpan { blocks: &c.blocks[t], ..*s }).collect())
            .collect();
        // Checks every block table against its positions, once for all layers.
        let windows = store.cache_layout().tables.iter().map(|t| t.window);
        let attention: Vec<AttentionPlan> =
            group_spans.iter().zip(windows).map(|(s, w)| AttentionPlan::with_window(s, store, w)).collect();
        let mut runs = vec![Vec::with_capacity(chunks.len()); tables];
        for (spans, runs) in group_spans.iter().zip(&mut runs) {
            for s in spans {
                slot_runs(s.blocks, store.block_size, s.row, s.pos, s.len, runs);
            }
        }
        let writes = store.plan_writes(runs)?;
        let mut segments: Vec<Segment> = Vec::new();
        for (c, s) in chunks.iter().zip(&spans) {
            match segments.last_mut() {
                Some(last) if last.adapters.key() == c.experts.key() => last.len += s.len,
                _ => segments.push(Segment { start: s.row, len: s.len, adapters: c.experts }),
            }
        }

        // 1. Embeddings: [rows, hidden]; prompt-tuning virtual tokens take their rows first.
        let mut x = if chunks.iter().all(|c| c.virtual_rows.is_empty()) {
            let all_tokens: Vec<u32> = chunks.iter().flat_map(|c| c.tokens.iter().copied()).collect();
            self.embed(&all_tokens)?
        } else {
            let mut parts = Vec::new();
            for c in chunks {
                if !c.virtual_rows.is_empty() {
                    let v = c.experts.virtual_embeddings()?.expect("virtual rows come from prompt tuning");
                    let v = v.narrow(0, c.virtual_rows.start, c.virtual_rows.len())?;
                    let scale = self.plan.virtual_embedding_scale;
                    parts.push(if scale == 1.0 { v } else { (v * scale)? });
                }
                if !c.tokens.is_empty() {
                    parts.push(self.embed(c.tokens)?);
                }
            }
            Tensor::cat(&parts, 0)?
        };

        // 2. RoPE rows of each rotary embedding for every row's position (and, for `dynamic`,
        //    its sequence's length).
        let rotations = self.ropes.iter().map(|r| r.rows(&rope_rows)).collect::<Result<Vec<_>>>()?;

        // 3. The layers as the plan has them: a mixer and a feed-forward block, each with a
        //    residual, normalised before (pre-norm) or before and after (sandwich).
        // Gemma 4: every row's per-layer inputs, from its token and its embedding.
        let per_layer_inputs = match &self.per_layer_inputs {
            None => None,
            Some(p) => {
                if chunks.iter().any(|c| !c.virtual_rows.is_empty()) {
                    return Err(EngineError::UnsupportedAdapter(
                        "prompt tuning on a model with per-layer input embeddings (Gemma 4)".into(),
                    ));
                }
                let all_tokens: Vec<u32> = chunks.iter().flat_map(|c| c.tokens.iter().copied()).collect();
                Some(p.forward(&all_tokens, &x, self.layers.len(), self.cfg.hidden_size)?)
            }
        };
        let pass = Pass {
            attention: &attention,
            writes: &writes,
            segments: &segments,
            rotations: &rotations,
            store,
            per_layer_inputs: per_layer_inputs.as_ref(),
            recurrent: &recurrent,
        };
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(x, i, &pass, &self.plan)?;
        }

        // 4. Final norm and output projection, only for the rows whose logits are wanted;
        //    the final norm alone for the rows whose hidden states are.
        let (mut want, mut hidden) = (Vec::new(), Vec::new());
        for (c, s) in chunks.iter().zip(&spans) {
            let token_rows = (s.row + c.virtual_rows.len()..s.row + s.len).map(|r| r as u32);
            match c.logits {
                Logits::None => {}
                Logits::Last => want.push((s.row + s.len - 1) as u32),
                Logits::All => want.extend(token_rows),
                Logits::Hidden => hidden.extend(token_rows),
            }
        }
        let select = |rows_wanted: Vec<u32>| -> Result<Option<Tensor>> {
            if rows_wanted.is_empty() {
                return Ok(None);
            }
            let n = rows_wanted.len();
            let x = if n == rows { x.clone() } else { x.index_select(&Tensor::from_vec(rows_wanted, n, &self.device)?, 0)? };
            Ok(Some(self.norm.forward(&x)?))
        };
        let hidden = select(hidden)?.map(|h| h.to_dtype(DType::F32)).transpose()?;
        let logits = match select(want)? {
            Some(x) => {
                let logits = self.lm_head.as_ref().unwrap_or(&self.embed_tokens).forward(&x)?;
                // As HF: `cap · tanh(logits / cap)` in the model's dtype.
                let logits = match self.plan.final_logit_softcap {
                    Some(cap) => ((logits / cap)?.tanh()? * cap)?,
                    None => logits,
                };
                // Granite: the logits divided by `logits_scaling`.
                let logits = if self.plan.logit_multiplier == 1.0 { logits } else { (logits * self.plan.logit_multiplier)? };
                Some(logits.to_dtype(DType::F32)?)
            }
            None => None,
        };
        Ok(PassOutput { logits, hidden, greedy: None })
    }

    /// A decode pass on the CUDA path ([`cuda_decode`]), or `None` when it does not apply.
    #[cfg(feature = "cuda")]
    fn cuda_decode(&self, chunks: &[SeqChunk], store: &KvStore) -> Result<Option<PassOutput>> {
        if !self.device.is_cuda() || store.num_tables() != 1 {
            return Ok(None);
        }
        let mut path = self.cuda.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(*path, CudaPath::Unbuilt) && self.plan.fused_decode_gap().is_some() {
            // The fused kernels implement one layer shape; any other plan runs generic.
            *path = CudaPath::Off;
        }
        if matches!(*path, CudaPath::Unbuilt) {
            *path = match cuda_decode::CudaDecode::new(self, store) {
                Ok(Some(d)) => CudaPath::On(Box::new(d)),
                Ok(None) => CudaPath::Off,
                Err(e) => {
                    eprintln!("expert-runtime: the CUDA decode path is off ({e}); decode runs on the generic path");
                    CudaPath::Off
                }
            };
        }
        let CudaPath::On(d) = &mut *path else { return Ok(None) };
        let out = if d.accepts(self, chunks, store) {
            d.forward(chunks, store)?.map(|(logits, greedy)| (Some(logits), Some(greedy)))
        } else if d.accepts_prefill(self, chunks, store) {
            d.prefill(chunks, store)?
        } else {
            return Ok(None);
        };
        Ok(out.map(|(logits, greedy)| PassOutput { logits, hidden: None, greedy }))
    }

    /// The token rows' embeddings, times the plan's embedding scale (in the model's dtype, as
    /// HF scales them; prompt-tuning rows are not scaled, as PEFT passes them in as embeddings).
    fn embed(&self, tokens: &[u32]) -> Result<Tensor> {
        let ids = Tensor::from_slice(tokens, tokens.len(), &self.device)?;
        let x = self.embed_tokens.embedding(&ids)?.to_dtype(self.dtype)?;
        Ok(if self.plan.embedding_scale == 1.0 { x } else { (x * self.plan.embedding_scale)? })
    }
}

/// Gemma 4's per-layer input embeddings: a table of `size` values per layer for each token, and
/// a projection of the token's embedding to as many, normalised per layer.
struct PerLayerInputs {
    embed_tokens_per_layer: Table,
    per_layer_model_projection: Linear,
    per_layer_projection_norm: RmsNorm,
    size: usize,
}

impl PerLayerInputs {
    /// `[rows, layers, size]`: `(norm(projection(x) / √hidden) + table[token] · √size) / √2`, as
    /// HF computes them (the scales in the model's dtype).
    fn forward(&self, tokens: &[u32], x: &Tensor, layers: usize, hidden: usize) -> Result<Tensor> {
        let rows = tokens.len();
        let table = self.embed_tokens_per_layer.rows(tokens, x.device())?.to_dtype(x.dtype())?;
        let table = (table * (self.size as f64).sqrt())?.reshape((rows, layers, self.size))?;
        let projected = (self.per_layer_model_projection.forward(x)? * (hidden as f64).powf(-0.5))?;
        let projected = self.per_layer_projection_norm.forward(&projected.reshape((rows, layers, self.size))?)?;
        Ok(((projected + table)? * 0.5f64.sqrt())?)
    }
}

/// One sequence's part of a batched forward pass.
pub struct SeqChunk<'a> {
    /// Real tokens of this chunk (after its virtual rows).
    pub tokens: &'a [u32],
    /// Prompt-tuning virtual tokens evaluated first (indices into the set's embeddings).
    pub virtual_rows: Range<usize>,
    /// Position of the chunk's first row.
    pub pos: usize,
    /// The sequence's length once the rows it has to evaluate are in (a prompt chunk: the
    /// whole prompt's length). Only `dynamic` RoPE scaling reads it.
    pub seq_len: usize,
    /// The sequence's block table of each table group of layers.
    pub blocks: &'a [Vec<BlockId>],
    /// The sequence's slot of recurrent states (models with recurrent layers).
    pub state: Option<crate::kv::states::StateId>,
    /// Keep the recurrent state after each row (a speculative verification; see
    /// [`crate::kv::states::StatePool::settle`]).
    pub steps: bool,
    pub logits: Logits,
    /// The adapters the chunk's rows run under.
    pub experts: &'a dyn Adapters,
}

impl SeqChunk<'_> {
    pub fn rows(&self) -> usize {
        self.virtual_rows.len() + self.tokens.len()
    }
}
