//! The layer plan: what each layer of a model runs, resolved once from its configuration.
//!
//! A family is a description. [`LayerPlan::build`] holds the one `match` on the architecture
//! that turns a [`ModelConfig`] into a plan; the decoder, the KV cache and the CUDA decode path
//! read the plan and never name a family. Each layer names its mixer (attention, full or
//! sliding, with or without RoPE, or a recurrent mixer), its feed-forward block (a gated MLP
//! with its activation, or a mixture of experts) and its norms (pre-norm, or pre and post
//! "sandwich" norms; weights used as `w` or as `1 + w`). Model-wide settings (embedding scale,
//! residual and logit multipliers, final logit soft-capping) and the rotary embeddings the
//! layers share (one per distinct base, rotary dimension and scaling) live beside them.
//!
//! Why one decoder over a plan, rather than a model file per family as candle's `gemma3.rs`
//! (its own structs, forward pass and rotating KV cache per family) or a graph builder per
//! architecture as llama.cpp (`llm_build_*`, each assembling shared ops in its own code over
//! per-layer hyper-parameter arrays): everything else this engine does sits on the decoder's
//! one forward pass — the paged pool with prefix sharing, continuous batching of mixed prompt
//! and decode rows, adapters on every projection, the CUDA decode path, the HF parity tests.
//! A file per family would redo each of those per family or leave some families without them.
//! The families differ in a handful of per-layer choices, so they are data here, checked once at
//! load; a layer kind that does not fit the vocabulary gets one new mixer module, not a new
//! model. What a consumer does not implement yet it refuses by name ([`LayerPlan::unsupported`]
//! and its callers), never runs wrongly.

use std::fmt;

use super::config::{Arch, ModelConfig};
use super::rope::RopeScaling;
use crate::kv::layers::{HeadShape, KvLayout, LayerCache};

/// What every layer of a model runs, and the settings the whole model shares.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerPlan {
    pub layers: Vec<LayerSpec>,
    /// The rotary embeddings the layers use ([`AttentionSpec::rope`] indexes this).
    pub ropes: Vec<RopeSpec>,
    /// Multiplies the token embeddings (Gemma: √hidden; Granite: its embedding multiplier; 1
    /// elsewhere).
    pub embedding_scale: f64,
    /// Multiplies a prompt-tuning expert's virtual token embeddings: Granite scales every input
    /// embedding, Gemma only the token table's.
    pub virtual_embedding_scale: f64,
    /// Multiplies each block's output before it is added to the residual stream.
    pub residual_multiplier: f64,
    /// Multiplies the final logits.
    pub logit_multiplier: f64,
    /// `cap · tanh(logits / cap)` on the final logits.
    pub final_logit_softcap: Option<f64>,
    /// How the final norm (before the output projection) applies its weight.
    pub final_norm: NormWeight,
    /// Per-layer input embeddings (Gemma 4): each layer adds a projection of its slice of them.
    pub per_layer_input: Option<PerLayerInput>,
}

/// Gemma 4's per-layer input embeddings: per token, `size` values for each layer, from a table of
/// `vocab` rows and a projection of the token's embedding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerLayerInput {
    pub size: usize,
    pub vocab: usize,
}

/// One layer: its mixer, its feed-forward block, its norms.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerSpec {
    pub mixer: Mixer,
    pub ffn: FeedForward,
    pub norms: Norms,
    /// After the feed-forward block, adds the projection of the layer's per-layer input.
    pub per_layer_input: bool,
    /// Multiplies the layer's output by its `layer_scalar` weight.
    pub layer_scalar: bool,
}

/// What mixes information across positions.
#[derive(Clone, Debug, PartialEq)]
pub enum Mixer {
    Attention(AttentionSpec),
    Recurrent(Recurrent),
}

/// Recurrent mixers: a fixed-size state per sequence instead of positions (see
/// [`super::delta_net`] and [`super::short_conv`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Recurrent {
    /// Gated DeltaNet linear attention (Qwen3.5's `linear_attention` layers).
    GatedDeltaNet(DeltaNetSpec),
    /// A gated short convolution (LFM2's `conv` layers).
    ShortConv(ShortConvSpec),
}

/// A Gated DeltaNet: per token, a causal depthwise convolution (SiLU) over the projected
/// queries, keys and values; L2-normed queries and keys; per value head a `k_head_dim ×
/// v_head_dim` state decayed by `exp(g)` and corrected toward each value by the delta rule
/// with rate `β`; the output RMS-normed and gated by `silu(z)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetSpec {
    pub num_k_heads: usize,
    pub num_v_heads: usize,
    pub k_head_dim: usize,
    pub v_head_dim: usize,
    /// Taps of the causal convolution.
    pub conv_kernel: usize,
    /// Value head `j` reads key head `j mod num_k_heads` (llama.cpp's order, its value heads
    /// permuted by the converter) rather than `j / (num_v_heads / num_k_heads)` (HF's).
    pub tiled_heads: bool,
}

/// A gated short convolution: `out_proj(C · conv(B · x))` with `B`, `C`, `x` from `in_proj`
/// and a causal depthwise convolution of `l_cache` taps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShortConvSpec {
    pub l_cache: usize,
    pub hidden: usize,
    /// Biases on the projections and the convolution.
    pub bias: bool,
}

/// A self-attention layer.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionSpec {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Attends to the last `window` positions only (sliding-window attention); `None`: all.
    pub window: Option<usize>,
    /// The rotary embedding (an index into [`LayerPlan::ropes`]); `None`: no RoPE.
    pub rope: Option<usize>,
    /// Bias on the query, key and value projections.
    pub qkv_bias: bool,
    /// Per-head RMSNorm of queries and keys before RoPE.
    pub qk_norm: bool,
    /// Per-head RMSNorm of values, without a weight.
    pub v_norm: bool,
    /// Attends with the keys and values of this earlier layer, and keeps none of its own (KV
    /// sharing).
    pub kv_from: Option<usize>,
    /// No value projection: the values are the key projection's output, before the key norm and
    /// RoPE (Gemma 4's `attention_k_eq_v` full layers).
    pub values_from_keys: bool,
    /// The query projection also yields a gate per head (`[q, gate]` per head): the output is
    /// multiplied by `sigmoid(gate)` before `o_proj` (Qwen3.5's gated attention).
    pub output_gate: bool,
    /// Multiplies `q·k` before the softmax.
    pub scale: f64,
    /// `cap · tanh(s / cap)` on the attention scores.
    pub logit_softcap: Option<f64>,
}

/// The block after the mixer.
#[derive(Clone, Debug, PartialEq)]
pub enum FeedForward {
    /// `down(act(gate(x)) · up(x))`.
    GatedMlp {
        intermediate_size: usize,
        activation: Activation,
    },
    Moe(Moe),
    /// A gated MLP and a routed FFN side by side on the same input, each output normed, summed
    /// (Gemma 4's mixture-of-experts layers).
    MlpAndMoe {
        intermediate_size: usize,
        activation: Activation,
        moe: Moe,
    },
}

/// A routed feed-forward block: per token, a router (a linear map to one logit per MoE expert,
/// softmax) picks `experts_per_token` of `num_experts` gated MLPs, and their outputs are summed
/// weighted by the picked probabilities (renormalised to sum to 1 where `norm_topk_prob`). These
/// are "MoE experts": parts of the base model, unrelated to the PEFT experts attached at run time.
#[derive(Clone, Debug, PartialEq)]
pub struct Moe {
    pub num_experts: usize,
    pub experts_per_token: usize,
    /// Each MoE expert's MLP width.
    pub intermediate_size: usize,
    pub norm_topk_prob: bool,
    pub activation: Activation,
    pub router: Router,
}

/// How a routed FFN's router scores the MoE experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Router {
    /// A linear map of the block's input, softmax (Qwen3-MoE's `mlp.gate`).
    Linear,
    /// A linear map of the input RMS-normed without a weight, times a learned vector and
    /// `1/√hidden`, softmax; the picked probabilities renormalised, then each times its MoE
    /// expert's learned scale (Gemma 4's `router`).
    ScaledNorm,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu,
    /// GELU with the tanh approximation (`gelu_pytorch_tanh`).
    GeluTanh,
}

/// Where a layer normalises, and how a norm's weight is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Norms {
    /// Also a norm after the mixer and after the feed-forward block, before each residual add.
    pub sandwich: bool,
    pub weight: NormWeight,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormWeight {
    /// `x̂ · w`.
    Plain,
    /// `x̂ · (1 + w)` (Gemma).
    OnePlus,
}

/// One rotary embedding.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeSpec {
    pub theta: f64,
    /// The leading dimensions of each head it rotates (the head dimension unless partial).
    pub rotary_dim: usize,
    pub head_dim: usize,
    pub scaling: Option<RopeScaling>,
    /// Rotates adjacent pairs (GGUF Llama's permuted Q/K rows) rather than the two halves.
    pub interleaved: bool,
}

impl LayerPlan {
    /// The plan of a configuration: the one place that knows what a family's layers are.
    pub fn build(cfg: &ModelConfig) -> Self {
        let rope = RopeSpec {
            theta: cfg.rope_theta,
            rotary_dim: cfg.rotary_dim.unwrap_or(cfg.head_dim),
            head_dim: cfg.head_dim,
            scaling: cfg.rope_scaling.clone(),
            interleaved: cfg.rope_interleaved,
        };
        let attention = AttentionSpec {
            num_heads: cfg.num_heads,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            window: None,
            rope: Some(0),
            qkv_bias: cfg.qkv_bias,
            qk_norm: cfg.qk_norm,
            v_norm: false,
            kv_from: None,
            values_from_keys: false,
            output_gate: false,
            scale: 1.0 / (cfg.head_dim as f64).sqrt(),
            logit_softcap: None,
        };
        let plain = LayerSpec {
            mixer: Mixer::Attention(attention.clone()),
            ffn: FeedForward::GatedMlp { intermediate_size: cfg.intermediate_size, activation: Activation::Silu },
            norms: Norms { sandwich: false, weight: NormWeight::Plain },
            per_layer_input: false,
            layer_scalar: false,
        };
        let mut plan = LayerPlan {
            layers: vec![plain; cfg.num_layers],
            ropes: vec![rope.clone()],
            embedding_scale: 1.0,
            virtual_embedding_scale: 1.0,
            residual_multiplier: 1.0,
            logit_multiplier: 1.0,
            final_logit_softcap: None,
            final_norm: NormWeight::Plain,
            per_layer_input: None,
        };
        match cfg.arch {
            // Pre-norm attention and a SiLU-gated MLP; Qwen2 adds Q/K/V biases and Qwen3
            // per-head Q/K norms (read into the config), Llama from GGUF rotates interleaved.
            // Mistral, Ministral and Phi-3 (read as Llama) slide where the config says; Phi-3's
            // rotary dimension may be partial (in the shared rotary embedding).
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 => {
                for (i, layer) in plan.layers.iter_mut().enumerate() {
                    if let Mixer::Attention(a) = &mut layer.mixer {
                        let sliding = cfg.sliding_layers.get(i).copied().unwrap_or(false);
                        a.window = if sliding { cfg.sliding_window } else { None };
                        // SmolLM3's layers without RoPE.
                        if cfg.no_rope_layers.get(i).copied().unwrap_or(false) {
                            a.rope = None;
                        }
                        // Granite's score scale.
                        if let Some(m) = &cfg.multipliers {
                            a.scale = m.attention;
                        }
                    }
                }
                if let Some(m) = &cfg.multipliers {
                    plan.embedding_scale = m.embedding;
                    plan.virtual_embedding_scale = m.embedding;
                    plan.residual_multiplier = m.residual;
                    plan.logit_multiplier = 1.0 / m.logits_scaling;
                }
                // Qwen3-MoE's routed layers.
                if let Some(moe) = &cfg.moe {
                    for (layer, _) in plan.layers.iter_mut().zip(&moe.routed_layers).filter(|(_, routed)| **routed) {
                        layer.ffn = FeedForward::Moe(Moe {
                            num_experts: moe.num_experts,
                            experts_per_token: moe.experts_per_token,
                            intermediate_size: moe.intermediate_size,
                            norm_topk_prob: moe.norm_topk_prob,
                            activation: Activation::Silu,
                            router: Router::Linear,
                        });
                    }
                }
            }
            // Sliding and full layers with their own rotary bases, q/k norms, scores scaled by
            // `query_pre_attn_scalar`, sandwich norms applied as `1 + w`, a GELU-tanh MLP, the
            // embeddings scaled by √hidden and optionally soft-capped logits.
            Arch::Gemma3 => {
                if let Some((theta, scaling)) = cfg.local_rope.clone() {
                    plan.ropes.push(RopeSpec { theta, scaling, ..rope });
                }
                let scale = cfg.query_pre_attn_scalar.map_or(attention.scale, |s| 1.0 / s.sqrt());
                for (i, layer) in plan.layers.iter_mut().enumerate() {
                    let sliding = cfg.sliding_layers.get(i).copied().unwrap_or(false);
                    layer.mixer = Mixer::Attention(AttentionSpec {
                        window: if sliding { cfg.sliding_window } else { None },
                        rope: Some(if sliding && cfg.local_rope.is_some() { 1 } else { 0 }),
                        qk_norm: true,
                        scale,
                        ..attention.clone()
                    });
                    layer.ffn =
                        FeedForward::GatedMlp { intermediate_size: cfg.intermediate_size, activation: Activation::GeluTanh };
                    layer.norms = Norms { sandwich: true, weight: NormWeight::OnePlus };
                }
                plan.embedding_scale = (cfg.hidden_size as f64).sqrt();
                plan.final_logit_softcap = cfg.final_logit_softcap;
                plan.final_norm = NormWeight::OnePlus;
            }
            // Gemma 3's sandwich layers with per-layer heads (wider on the full layers), values
            // normalised too, unscaled scores, each layer's output scaled by its `layer_scalar`,
            // per-layer input embeddings, and the last layers attending with an earlier layer's
            // keys and values (their MLP twice as wide where the config says). Rope 0 turns the
            // full layers (proportional), rope 1 the sliding ones.
            Arch::Gemma4 => {
                let g = cfg.gemma4.as_ref().expect("read with the config");
                let full_dim = cfg.head_dim_full();
                let local_dim = g.heads.iter().zip(&cfg.sliding_layers).find(|(_, s)| **s).map_or(cfg.head_dim, |(h, _)| h.1);
                let (local_theta, local_scaling) = cfg.local_rope.clone().unwrap_or((rope.theta, None));
                plan.ropes = vec![
                    RopeSpec { rotary_dim: full_dim, head_dim: full_dim, ..rope.clone() },
                    RopeSpec {
                        theta: local_theta,
                        rotary_dim: local_dim,
                        head_dim: local_dim,
                        scaling: local_scaling,
                        interleaved: false,
                    },
                ];
                for (i, layer) in plan.layers.iter_mut().enumerate() {
                    let sliding = cfg.sliding_layers.get(i).copied().unwrap_or(false);
                    let (num_kv_heads, head_dim) = g.heads[i];
                    let kv_from = g.kv_shared_from[i];
                    layer.mixer = Mixer::Attention(AttentionSpec {
                        num_kv_heads,
                        head_dim,
                        window: if sliding { cfg.sliding_window } else { None },
                        rope: Some(if sliding { 1 } else { 0 }),
                        qk_norm: true,
                        v_norm: true,
                        kv_from,
                        values_from_keys: g.values_from_keys && !sliding,
                        scale: 1.0,
                        ..attention.clone()
                    });
                    let wide = if kv_from.is_some() && g.double_wide_mlp { 2 } else { 1 };
                    let (intermediate_size, activation) = (cfg.intermediate_size * wide, Activation::GeluTanh);
                    layer.ffn = match &cfg.moe {
                        None => FeedForward::GatedMlp { intermediate_size, activation },
                        Some(m) => FeedForward::MlpAndMoe {
                            intermediate_size,
                            activation,
                            moe: Moe {
                                num_experts: m.num_experts,
                                experts_per_token: m.experts_per_token,
                                intermediate_size: m.intermediate_size,
                                norm_topk_prob: true,
                                activation,
                                router: Router::ScaledNorm,
                            },
                        },
                    };
                    layer.norms = Norms { sandwich: true, weight: NormWeight::Plain };
                    layer.per_layer_input = g.per_layer_input.is_some();
                    layer.layer_scalar = true;
                }
                plan.embedding_scale = (cfg.hidden_size as f64).sqrt();
                plan.virtual_embedding_scale = plan.embedding_scale;
                plan.final_logit_softcap = cfg.final_logit_softcap;
                plan.per_layer_input = g.per_layer_input.map(|(size, vocab)| PerLayerInput { size, vocab });
            }
            // Hybrids: recurrent mixers where the config says, attention elsewhere with q/k
            // norms. Qwen3.5's attention is gated, its norms are `1 + w` and it rotates part of
            // each head (the shared rotary embedding); LFM2's is plain.
            Arch::Qwen35 | Arch::Lfm2 => {
                let h = cfg.hybrid.as_ref().expect("read with the config");
                let qwen = cfg.arch == Arch::Qwen35;
                for (layer, mixer) in plan.layers.iter_mut().zip(&h.mixers) {
                    layer.mixer = match mixer {
                        Some(r) => Mixer::Recurrent(*r),
                        None => Mixer::Attention(AttentionSpec { qk_norm: true, output_gate: qwen, ..attention.clone() }),
                    };
                    if qwen {
                        layer.norms.weight = NormWeight::OnePlus;
                    }
                }
                if qwen {
                    plan.final_norm = NormWeight::OnePlus;
                }
            }
        }
        plan
    }

    /// What each layer keeps in the KV cache.
    pub fn kv_kinds(&self) -> Vec<LayerCache> {
        self.layers
            .iter()
            .map(|l| match &l.mixer {
                Mixer::Attention(a) if a.kv_from.is_some() => LayerCache::Shared,
                Mixer::Attention(a) => match a.window {
                    None => LayerCache::Full,
                    Some(window) => LayerCache::Window { window },
                },
                Mixer::Recurrent(r) => LayerCache::State { bytes: r.state_floats() * 4 },
            })
            .collect()
    }

    /// The heads each layer keeps in the KV cache, where they differ from `kv_heads` of
    /// `head_dim` (the model's: `None`).
    pub fn kv_shapes(&self, kv_heads: usize, head_dim: usize) -> Vec<Option<HeadShape>> {
        self.layers
            .iter()
            .map(|l| match &l.mixer {
                Mixer::Attention(a) => {
                    let shape = HeadShape { kv_heads: a.num_kv_heads, head_dim: a.head_dim };
                    (shape != HeadShape { kv_heads, head_dim }).then_some(shape)
                }
                Mixer::Recurrent(_) => None,
            })
            .collect()
    }

    /// The pool's layout for this plan, the model's heads being `kv_heads` of `head_dim`.
    pub fn kv_layout(&self, kv_heads: usize, head_dim: usize) -> KvLayout {
        KvLayout::from_shaped(&self.kv_kinds(), &self.kv_shapes(kv_heads, head_dim))
    }

    /// The first thing in the plan that the generic decoder does not run yet, named; `None`
    /// when it runs all of it. A model whose plan names something is refused at load
    /// (`UNSUPPORTED_ARCHITECTURE`), never run without it.
    pub fn unsupported(&self) -> Option<String> {
        for (i, l) in self.layers.iter().enumerate() {
            match &l.mixer {
                Mixer::Attention(a) => {
                    if a.logit_softcap.is_some() {
                        return Some(format!("layer {i}: {}", l.mixer));
                    }
                }
                Mixer::Recurrent(_) => {}
            }
        }
        None
    }

    /// The first thing in the plan outside what the fused CUDA decode path's kernels implement
    /// (pre-norm full attention with one whole-head RoPE at the standard scale, a SiLU-gated MLP,
    /// plain norm weights, no model-wide multipliers, one head shape); `None` when it covers the
    /// plan. A plan it does not cover decodes on the generic CUDA path. Written apart from
    /// [`Self::unsupported`] on purpose: as the generic decoder learns more, this stays what the
    /// kernels do.
    pub fn fused_decode_gap(&self) -> Option<String> {
        if self.embedding_scale != 1.0
            || self.virtual_embedding_scale != 1.0
            || self.residual_multiplier != 1.0
            || self.logit_multiplier != 1.0
        {
            return Some("model-wide multipliers".into());
        }
        if self.final_logit_softcap.is_some() {
            return Some("final logit soft-capping".into());
        }
        if self.final_norm != NormWeight::Plain {
            return Some("a final norm applied as 1 + w".into());
        }
        if self.per_layer_input.is_some() {
            return Some("per-layer input embeddings".into());
        }
        if self.ropes.len() != 1 || self.ropes[0].rotary_dim != self.ropes[0].head_dim {
            return Some("more than one rotary embedding, or a partial one".into());
        }
        let other_shape = self.first_other_head_shape();
        for (i, l) in self.layers.iter().enumerate() {
            let a = match &l.mixer {
                Mixer::Attention(a) => a,
                Mixer::Recurrent(_) => return Some(format!("layer {i}: {}", l.mixer)),
            };
            let plain = Norms { sandwich: false, weight: NormWeight::Plain };
            let silu = matches!(l.ffn, FeedForward::GatedMlp { activation: Activation::Silu, .. });
            let standard = a.window.is_none()
                && a.rope == Some(0)
                && a.logit_softcap.is_none()
                && !a.v_norm
                && a.kv_from.is_none()
                && !a.values_from_keys
                && !a.output_gate
                && a.scale == 1.0 / (a.head_dim as f64).sqrt();
            if l.norms != plain || !silu || !standard || l.layer_scalar || l.per_layer_input {
                return Some(format!("layer {i}: {l}"));
            }
            if other_shape == Some(i) {
                return Some(format!("layer {i}: per-layer head shapes"));
            }
        }
        None
    }

    /// The first attention layer whose heads (count, KV count, dimension) differ from the first
    /// attention layer's; `None` when all share one shape (what one KV pool and the fused
    /// kernels assume).
    fn first_other_head_shape(&self) -> Option<usize> {
        let mut first = None;
        self.layers.iter().position(|l| {
            let a = match &l.mixer {
                Mixer::Attention(a) => a,
                Mixer::Recurrent(_) => return false,
            };
            let shape = (a.num_heads, a.num_kv_heads, a.head_dim);
            *first.get_or_insert(shape) != shape
        })
    }

    /// One line per run of identical consecutive layers, then one per rotary embedding and the
    /// model-wide settings that differ from the plain transformer's (`inspect` prints these).
    pub fn summary(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut start = 0;
        for i in 1..=self.layers.len() {
            if i == self.layers.len() || self.layers[i] != self.layers[start] {
                let span = if i - start == 1 { format!("layer {start}") } else { format!("layers {start}–{}", i - 1) };
                out.push(format!("{span}: {}", self.layers[start]));
                start = i;
            }
        }
        for (i, r) in self.ropes.iter().enumerate() {
            out.push(format!("rope {i}: {r}"));
        }
        let mut model = Vec::new();
        if self.embedding_scale != 1.0 {
            model.push(format!("embedding scale {}", self.embedding_scale));
        }
        if self.residual_multiplier != 1.0 {
            model.push(format!("residual multiplier {}", self.residual_multiplier));
        }
        if self.logit_multiplier != 1.0 {
            model.push(format!("logit multiplier {}", self.logit_multiplier));
        }
        if let Some(cap) = self.final_logit_softcap {
            model.push(format!("final logit soft-cap {cap}"));
        }
        if let Some(p) = self.per_layer_input {
            model.push(format!("per-layer input embeddings ({} per layer, {} rows)", p.size, p.vocab));
        }
        if self.final_norm == NormWeight::OnePlus {
            model.push("final norm (1 + w)".into());
        }
        let state: usize = self
            .layers
            .iter()
            .filter_map(|l| match &l.mixer {
                Mixer::Recurrent(r) => Some(r.state_floats().saturating_mul(4)),
                Mixer::Attention(_) => None,
            })
            .fold(0, usize::saturating_add);
        if state > 0 {
            model.push(format!("recurrent state {state} bytes per sequence (f32)"));
        }
        if !model.is_empty() {
            out.push(format!("model: {}", model.join(", ")));
        }
        out
    }
}

impl fmt::Display for LayerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} · {} · {}", self.mixer, self.ffn, self.norms)?;
        if self.per_layer_input {
            write!(f, " · per-layer input")?;
        }
        if self.layer_scalar {
            write!(f, " · layer scalar")?;
        }
        Ok(())
    }
}

impl fmt::Display for Mixer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = match self {
            Mixer::Attention(a) => a,
            Mixer::Recurrent(Recurrent::GatedDeltaNet(d)) => {
                return write!(
                    f,
                    "Gated DeltaNet ({} key heads of {}, {} value heads of {}{}, conv {})",
                    d.num_k_heads,
                    d.k_head_dim,
                    d.num_v_heads,
                    d.v_head_dim,
                    if d.tiled_heads { " tiled" } else { "" },
                    d.conv_kernel
                )
            }
            Mixer::Recurrent(Recurrent::ShortConv(c)) => {
                return write!(f, "short conv ({} taps{})", c.l_cache, if c.bias { ", biases" } else { "" })
            }
        };
        match a.window {
            None => write!(f, "full attention")?,
            Some(w) => write!(f, "sliding-window attention ({w})")?,
        }
        write!(f, " ({} heads, {} kv, head dim {}", a.num_heads, a.num_kv_heads, a.head_dim)?;
        match a.rope {
            Some(r) => write!(f, ", rope {r}")?,
            None => write!(f, ", no RoPE")?,
        }
        if a.qkv_bias {
            write!(f, ", qkv bias")?;
        }
        if a.qk_norm {
            write!(f, ", q/k norm")?;
        }
        if a.v_norm {
            write!(f, ", v norm")?;
        }
        if let Some(j) = a.kv_from {
            write!(f, ", keys and values of layer {j}")?;
        }
        if a.values_from_keys {
            write!(f, ", values = keys")?;
        }
        if a.output_gate {
            write!(f, ", output gate")?;
        }
        if a.scale != 1.0 / (a.head_dim as f64).sqrt() {
            write!(f, ", scale {}", a.scale)?;
        }
        if let Some(cap) = a.logit_softcap {
            write!(f, ", soft-cap {cap}")?;
        }
        write!(f, ")")
    }
}

impl fmt::Display for FeedForward {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FeedForward::GatedMlp { intermediate_size, activation } => {
                write!(f, "gated MLP ({}, {intermediate_size})", act_name(*activation))
            }
            FeedForward::Moe(m) => write!(f, "{m}"),
            FeedForward::MlpAndMoe { intermediate_size, activation, moe } => {
                write!(f, "gated MLP ({}, {intermediate_size}) beside {moe}", act_name(*activation))
            }
        }
    }
}

impl fmt::Display for Moe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (n, k, act, width) = (self.num_experts, self.experts_per_token, act_name(self.activation), self.intermediate_size);
        write!(f, "routed FFN ({n} MoE experts, top {k}, {act} MLPs of {width}")?;
        if self.router == Router::ScaledNorm {
            write!(f, ", scaled-norm router")?;
        }
        if self.norm_topk_prob {
            write!(f, ", top-k weights renormalised")?;
        }
        write!(f, ")")
    }
}

fn act_name(a: Activation) -> &'static str {
    match a {
        Activation::Silu => "SiLU",
        Activation::GeluTanh => "GELU-tanh",
    }
}

impl fmt::Display for Norms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = match self.weight {
            NormWeight::Plain => "w",
            NormWeight::OnePlus => "1 + w",
        };
        write!(f, "{} ({w})", if self.sandwich { "sandwich norms" } else { "pre-norm" })
    }
}

impl fmt::Display for RopeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "theta {}, rotary dim {} of {}", self.theta, self.rotary_dim, self.head_dim)?;
        write!(f, ", {}", if self.interleaved { "interleaved pairs" } else { "half-split" })?;
        match &self.scaling {
            Some(s) => write!(f, ", {} scaling", s.type_name()),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
