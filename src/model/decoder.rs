//! The decoder-only transformer shared by the Llama, Qwen2 and Qwen3 families.
//!
//! Structs are named after the HF tensors they hold (`q_proj`, `k_norm`, `input_layernorm`),
//! so a tensor name greps to its code. The KV cache is passed in by the caller: the model holds
//! weights only, which lets each session own its cache (and later, a paged pool share one).
//!
//! Numerics follow HF transformers: RMSNorm and softmax accumulate in f32; logits are returned
//! in f32.

use candle_core::{DType, Device, Tensor};

use super::config::ModelConfig;
use super::linear::Linear;
use super::loader::WeightSource;
use crate::error::Result;
use crate::experts::{ExpertSet, Proj, Slot};
use crate::kv::KvCache;

struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    fn load(src: &mut dyn WeightSource, name: &str, size: usize, eps: f64, dtype: DType) -> Result<Self> {
        Ok(Self { weight: src.tensor(&format!("{name}.weight"), &[size], dtype)?, eps: eps as f32 })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(&x.contiguous()?, &self.weight, self.eps)?)
    }
}

struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    /// Qwen3 only: RMSNorm over each head's `head_dim` features, before RoPE.
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

/// Which positions' logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// `[vocab]` for the last position only (generation: skips the lm_head for the rest).
    Last,
    /// `[seq, vocab]` for every position.
    All,
}

pub struct Decoder {
    pub cfg: ModelConfig,
    embed_tokens: Linear,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    /// `None` when the output projection is tied to `embed_tokens`.
    lm_head: Option<Linear>,
    /// RoPE tables `[max_positions, head_dim / 2]` in the activation dtype.
    cos: Tensor,
    sin: Tensor,
    pub dtype: DType,
    pub device: Device,
}

impl Decoder {
    /// Reads every weight from `src`, checking shapes against `cfg`. `max_positions` bounds the
    /// RoPE tables (the runtime's context length).
    pub fn load(cfg: ModelConfig, src: &mut dyn WeightSource, dtype: DType, device: &Device, max_positions: usize) -> Result<Self> {
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let (nh, nkv) = (cfg.num_heads, cfg.num_kv_heads);
        let eps = cfg.rms_norm_eps;
        let embed_tokens = src.linear("model.embed_tokens", cfg.vocab_size, h, false, dtype)?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let p = format!("model.layers.{i}");
            let a = format!("{p}.self_attn");
            let qk_norm = |src: &mut dyn WeightSource, n: &str| -> Result<Option<RmsNorm>> {
                cfg.qk_norm.then(|| RmsNorm::load(src, &format!("{a}.{n}"), hd, eps, dtype)).transpose()
            };
            let self_attn = Attention {
                q_proj: src.linear(&format!("{a}.q_proj"), nh * hd, h, cfg.qkv_bias, dtype)?,
                k_proj: src.linear(&format!("{a}.k_proj"), nkv * hd, h, cfg.qkv_bias, dtype)?,
                v_proj: src.linear(&format!("{a}.v_proj"), nkv * hd, h, cfg.qkv_bias, dtype)?,
                o_proj: src.linear(&format!("{a}.o_proj"), h, nh * hd, false, dtype)?,
                q_norm: qk_norm(src, "q_norm")?,
                k_norm: qk_norm(src, "k_norm")?,
                num_heads: nh,
                num_kv_heads: nkv,
                head_dim: hd,
            };
            let m = format!("{p}.mlp");
            let mlp = Mlp {
                gate_proj: src.linear(&format!("{m}.gate_proj"), cfg.intermediate_size, h, false, dtype)?,
                up_proj: src.linear(&format!("{m}.up_proj"), cfg.intermediate_size, h, false, dtype)?,
                down_proj: src.linear(&format!("{m}.down_proj"), h, cfg.intermediate_size, false, dtype)?,
            };
            layers.push(DecoderLayer {
                input_layernorm: RmsNorm::load(src, &format!("{p}.input_layernorm"), h, eps, dtype)?,
                self_attn,
                post_attention_layernorm: RmsNorm::load(src, &format!("{p}.post_attention_layernorm"), h, eps, dtype)?,
                mlp,
            });
        }
        let norm = RmsNorm::load(src, "model.norm", h, eps, dtype)?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(src.linear("lm_head", cfg.vocab_size, h, false, dtype)?)
        };
        let (cos, sin) = rope_tables(cfg.rope_theta, hd, max_positions, dtype, device)?;
        Ok(Self { cfg, embed_tokens, layers, norm, lm_head, cos, sin, dtype, device: device.clone() })
    }

    /// A new, empty cache shaped for this model.
    pub fn new_cache(&self, max_len: usize) -> KvCache {
        KvCache::new(self.cfg.num_layers, self.cfg.num_kv_heads, self.cfg.head_dim, max_len, self.dtype, &self.device)
    }

    pub fn max_positions(&self) -> usize {
        self.cos.dim(0).unwrap_or(0)
    }

    /// The linear module at `slot` (adapters are validated and built against it).
    pub fn linear(&self, slot: Slot) -> &Linear {
        let l = &self.layers[slot.layer];
        match slot.proj {
            Proj::Q => &l.self_attn.q_proj,
            Proj::K => &l.self_attn.k_proj,
            Proj::V => &l.self_attn.v_proj,
            Proj::O => &l.self_attn.o_proj,
            Proj::Gate => &l.mlp.gate_proj,
            Proj::Up => &l.mlp.up_proj,
            Proj::Down => &l.mlp.down_proj,
        }
    }

    /// Runs `tokens` at positions `cache.len()..`, appending their keys and values to `cache`.
    /// Returns f32 logits (see [`Logits`]).
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache, which: Logits) -> Result<Tensor> {
        self.forward_with(tokens, cache, which, &ExpertSet::none())
    }

    /// [`Self::forward`] under a set of experts. At position 0 the set's prompt-tuning
    /// embeddings are evaluated first (they occupy the cache's first positions); logits are
    /// returned for `tokens` only.
    pub fn forward_with(&self, tokens: &[u32], cache: &mut KvCache, which: Logits, experts: &ExpertSet) -> Result<Tensor> {
        let pos = cache.len();
        let prefix = if pos == 0 { experts.virtual_embeddings()? } else { None };
        let n_virtual = prefix.as_ref().map_or(0, |p| p.dim(0).unwrap_or(0));
        let seq = n_virtual + tokens.len();
        assert!(!tokens.is_empty() && pos + seq <= self.max_positions(), "positions checked by the caller");
        cache.reserve(seq)?;

        // 1. Token embeddings: [seq, hidden], after the virtual tokens of prompt tuning.
        let ids = Tensor::from_slice(tokens, tokens.len(), &self.device)?;
        let mut x = self.embed_tokens.embedding(&ids)?.to_dtype(self.dtype)?;
        if let Some(p) = prefix {
            x = Tensor::cat(&[&p, &x], 0)?;
        }

        // 2. Shared per-pass inputs: RoPE rows for these positions and, when several queries
        //    attend at once, the causal mask over [seq, pos + seq].
        let cos = self.cos.narrow(0, pos, seq)?;
        let sin = self.sin.narrow(0, pos, seq)?;
        let mask = (seq > 1).then(|| causal_mask(seq, pos, &self.device)).transpose()?;

        // 3. Transformer blocks: pre-norm attention and MLP, each with a residual.
        for (i, layer) in self.layers.iter().enumerate() {
            let h = layer.input_layernorm.forward(&x)?;
            let h = layer.self_attn.forward(&h, i, cache, &cos, &sin, mask.as_ref(), self.cfg.rope_interleaved, experts)?;
            x = (x + h)?;
            let h = layer.post_attention_layernorm.forward(&x)?;
            x = (x + layer.mlp.forward(&h, i, experts)?)?;
        }
        cache.commit(seq);

        // 4. Final norm and output projection (last position only when generating).
        let x = match which {
            Logits::Last => x.narrow(0, seq - 1, 1)?,
            Logits::All => x.narrow(0, n_virtual, tokens.len())?,
        };
        let x = self.norm.forward(&x)?;
        let logits = self.lm_head.as_ref().unwrap_or(&self.embed_tokens).forward(&x)?.to_dtype(DType::F32)?;
        Ok(match which {
            Logits::Last => logits.squeeze(0)?,
            Logits::All => logits,
        })
    }
}

impl Attention {
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        x: &Tensor,
        layer: usize,
        cache: &mut KvCache,
        cos: &Tensor,
        sin: &Tensor,
        mask: Option<&Tensor>,
        interleaved: bool,
        experts: &ExpertSet,
    ) -> Result<Tensor> {
        let seq = x.dim(0)?;
        let (nh, nkv, hd) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let rep = nh / nkv;
        let proj = |lin: &Linear, x: &Tensor, p: Proj| experts.linear(lin, x, Slot::new(layer, p));

        // 1. Project to per-head queries, keys and values (adapters applied): [seq, heads, head_dim].
        let q = proj(&self.q_proj, x, Proj::Q)?.reshape((seq, nh, hd))?;
        let k = proj(&self.k_proj, x, Proj::K)?.reshape((seq, nkv, hd))?;
        let v = proj(&self.v_proj, x, Proj::V)?.reshape((seq, nkv, hd))?;

        // 2. Qwen3: per-head RMSNorm of q and k.
        let q = match &self.q_norm { Some(n) => n.forward(&q)?, None => q };
        let k = match &self.k_norm { Some(n) => n.forward(&k)?, None => k };

        // 3. Heads first ([1, heads, seq, head_dim]) and rotate by position.
        let rope = if interleaved { candle_nn::rotary_emb::rope_i } else { candle_nn::rotary_emb::rope };
        let q = rope(&q.transpose(0, 1)?.unsqueeze(0)?.contiguous()?, cos, sin)?.squeeze(0)?;
        let k = rope(&k.transpose(0, 1)?.unsqueeze(0)?.contiguous()?, cos, sin)?.squeeze(0)?;
        let v = v.transpose(0, 1)?;

        // 4. Append to the cache; attend over all cached positions: [kv_heads, total, head_dim].
        let (k, v) = cache.append(layer, &k, &v)?;
        let total = k.dim(1)?;

        // 5–6 fused for a single query on CPU/f32 (the decode step); see `kv::attention`.
        if seq == 1 && mask.is_none() {
            if let Some(out) = crate::kv::attention::decode_attention(&q, &k, &v)? {
                return proj(&self.o_proj, &out, Proj::O);
            }
        }

        // 5. Scores. Query heads sharing a KV head are stacked so K is never copied per head:
        //    q [kv_heads, rep * seq, head_dim] · kᵀ → [kv_heads, rep * seq, total].
        let q = q.reshape((nkv, rep * seq, hd))?;
        let scale = 1.0 / (hd as f64).sqrt();
        let scores = (q.matmul(&k.t()?)? * scale)?.to_dtype(DType::F32)?;
        let scores = match mask {
            Some(m) => scores.reshape((nkv, rep, seq, total))?.broadcast_add(m)?.reshape((nkv, rep * seq, total))?,
            None => scores,
        };

        // 6. Softmax in f32, weighted sum of values, heads back to features.
        let probs = candle_nn::ops::softmax_last_dim(&scores)?.to_dtype(v.dtype())?;
        let out = probs.matmul(&v)?; // [kv_heads, rep * seq, head_dim]
        let out = out.reshape((nh, seq, hd))?.transpose(0, 1)?.reshape((seq, nh * hd))?;
        proj(&self.o_proj, &out, Proj::O)
    }
}

impl Mlp {
    fn forward(&self, x: &Tensor, layer: usize, experts: &ExpertSet) -> Result<Tensor> {
        let proj = |lin: &Linear, x: &Tensor, p: Proj| experts.linear(lin, x, Slot::new(layer, p));
        let gate = candle_nn::ops::silu(&proj(&self.gate_proj, x, Proj::Gate)?)?;
        proj(&self.down_proj, &(gate * proj(&self.up_proj, x, Proj::Up)?)?, Proj::Down)
    }
}

/// `cos`/`sin` of `position * theta^(-2i/head_dim)`, computed in f64 then stored in `dtype`.
fn rope_tables(theta: f64, head_dim: usize, max_positions: usize, dtype: DType, device: &Device) -> Result<(Tensor, Tensor)> {
    let half = head_dim / 2;
    let inv_freq: Vec<f32> = (0..half).map(|i| (1.0 / theta.powf(2.0 * i as f64 / head_dim as f64)) as f32).collect();
    let mut cos = Vec::with_capacity(max_positions * half);
    let mut sin = Vec::with_capacity(max_positions * half);
    for p in 0..max_positions {
        for f in &inv_freq {
            // HF computes the angle in f32 from f32 inverse frequencies; do the same.
            let a = p as f32 * f;
            cos.push(a.cos());
            sin.push(a.sin());
        }
    }
    let cos = Tensor::from_vec(cos, (max_positions, half), device)?.to_dtype(dtype)?;
    let sin = Tensor::from_vec(sin, (max_positions, half), device)?.to_dtype(dtype)?;
    Ok((cos, sin))
}

/// `[seq, pos + seq]`: 0 where query `i` (at position `pos + i`) may see key `j`, else -inf.
fn causal_mask(seq: usize, pos: usize, device: &Device) -> Result<Tensor> {
    let total = pos + seq;
    let m: Vec<f32> = (0..seq)
        .flat_map(|i| (0..total).map(move |j| if j <= pos + i { 0.0 } else { f32::NEG_INFINITY }))
        .collect();
    Ok(Tensor::from_vec(m, (seq, total), device)?)
}
