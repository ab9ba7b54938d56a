//! A decoder layer as the plan describes it: its norms, its attention (the tensors named as HF
//! names them: `q_proj`, `k_norm`, …), its MLP, and for Gemma 4 its per-layer input and scalar;
//! read from the weights once, run per batched pass ([`super::decoder::Decoder::forward_batch`]).

use candle_core::{DType, Tensor};

use super::adapt::{linear_segments, Fused, Proj, Segment, Slot};
use super::delta_net::GatedDeltaNet;
use super::linear::Linear;
use super::loader::WeightSource;
use super::moe::RoutedFfn;
use super::plan::{Activation, AttentionSpec, FeedForward, LayerPlan, LayerSpec, Mixer, NormWeight, Recurrent};
use super::short_conv::ShortConv;
use crate::error::{EngineError, Result};
use crate::kv::attention::{paged_attention, AttentionPlan, LayerAttention};
use crate::kv::store::KvWrites;
use crate::kv::KvStore;

pub(super) struct RmsNorm {
    pub(super) weight: Tensor,
    pub(super) eps: f32,
}

impl RmsNorm {
    /// A norm whose weight is applied as `w` or, where the plan says so, as `1 + w` (the sum
    /// taken once here and kept in f32, the norm then computed in f32; a GGUF file stores the
    /// sum).
    pub(super) fn load(
        src: &mut dyn WeightSource,
        name: &str,
        size: usize,
        eps: f64,
        how: NormWeight,
        dtype: DType,
    ) -> Result<Self> {
        let name = format!("{name}.weight");
        let weight = match how {
            // As HF: `w` held in the model's dtype, `1 + w` and the product in f32, one rounding
            // of the output (`1 + w` rounded to bf16 moved Qwen3.5's logprobs by up to 0.8).
            NormWeight::OnePlus if !src.norms_hold_one_plus() => {
                (src.tensor(&name, &[size], dtype)?.to_dtype(DType::F32)? + 1.0)?
            }
            NormWeight::Plain | NormWeight::OnePlus => src.tensor(&name, &[size], dtype)?,
        };
        Ok(Self { weight, eps: eps as f32 })
    }

    /// A norm of the same size without a weight (`x̂` alone: Gemma 4's value norm).
    fn unit_like(&self) -> Result<Self> {
        Ok(Self { weight: self.weight.ones_like()?, eps: self.eps })
    }

    pub(super) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // An f32 weight (`1 + w`) over a half-precision row: the norm in f32.
        if self.weight.dtype() != x.dtype() {
            let y = candle_nn::ops::rms_norm(&x.to_dtype(DType::F32)?.contiguous()?, &self.weight, self.eps)?;
            return Ok(y.to_dtype(x.dtype())?);
        }
        Ok(candle_nn::ops::rms_norm(&x.contiguous()?, &self.weight, self.eps)?)
    }
}

pub(super) struct Attention {
    pub(super) q_proj: Linear,
    /// `None` in a layer that attends with an earlier layer's keys and values (`kv_from`).
    pub(super) k_proj: Option<Linear>,
    pub(super) v_proj: Option<Linear>,
    pub(super) o_proj: Linear,
    /// Where the plan says so: RMSNorm over each head's `head_dim` features, before RoPE.
    pub(super) q_norm: Option<RmsNorm>,
    pub(super) k_norm: Option<RmsNorm>,
    /// Where the plan says so: RMSNorm of each value head, without a weight.
    pub(super) v_norm: Option<RmsNorm>,
    /// The earlier layer whose keys and values it attends with (KV sharing).
    pub(super) kv_from: Option<usize>,
    /// No `v_proj`: the values are `k_proj`'s output, before the key norm and RoPE.
    pub(super) values_from_keys: bool,
    pub(super) num_heads: usize,
    pub(super) num_kv_heads: usize,
    pub(super) head_dim: usize,
    /// The rotary embedding it rotates by (an index into [`Decoder::ropes`]); `None`: no RoPE.
    pub(super) rope: Option<usize>,
    /// Its scale and sliding window, as the plan has them.
    pub(super) how: LayerAttention,
    /// `q_proj` also yields a gate per head: the output times `sigmoid(gate)` (Qwen3.5).
    pub(super) output_gate: bool,
}

/// The block after attention: a gated MLP, or a routed block of MoE experts.
pub(super) enum Ffn {
    Dense(Box<Mlp>),
    Routed(RoutedFfn),
}

impl Ffn {
    pub(super) fn dense(&self) -> Option<&Mlp> {
        match self {
            Ffn::Dense(m) => Some(m),
            Ffn::Routed(_) => None,
        }
    }

    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(super) fn dense_mut(&mut self) -> Option<&mut Mlp> {
        match self {
            Ffn::Dense(m) => Some(m),
            Ffn::Routed(_) => None,
        }
    }

    pub(super) fn routed(&self) -> Option<&RoutedFfn> {
        match self {
            Ffn::Routed(m) => Some(m),
            Ffn::Dense(_) => None,
        }
    }

    fn forward(&self, x: &Tensor, layer: usize, segments: &[Segment]) -> Result<Tensor> {
        match self {
            Ffn::Dense(m) => m.forward(x, layer, segments),
            Ffn::Routed(m) => m.forward(x),
        }
    }
}

pub(super) struct Mlp {
    pub(super) gate_proj: Linear,
    pub(super) up_proj: Linear,
    pub(super) down_proj: Linear,
    pub(super) activation: Activation,
}

/// A pre-norm layer normalises the input of each block (`input_layernorm` before attention,
/// `post_attention_layernorm` before the MLP, as HF names them). A sandwich layer also
/// normalises each block's output before its residual add: `input_layernorm` →
/// attention → `post_attention_layernorm`, then `pre_feedforward_layernorm` → MLP →
/// `post_feedforward_layernorm`.
pub(super) struct DecoderLayer {
    pub(super) input_layernorm: RmsNorm,
    /// Attention, or a recurrent mixer.
    pub(super) mixer: LayerMixer,
    pub(super) post_attention_layernorm: RmsNorm,
    /// Sandwich layers only.
    pub(super) pre_feedforward_layernorm: Option<RmsNorm>,
    pub(super) post_feedforward_layernorm: Option<RmsNorm>,
    pub(super) mlp: Ffn,
    /// Gemma 4's mixture-of-experts layers: the routed FFN beside the MLP.
    pub(super) beside: Option<MoeBeside>,
    /// Gemma 4: the projection of the layer's per-layer input added after the MLP.
    pub(super) per_layer: Option<PerLayer>,
    /// Gemma 4: multiplies the layer's output (`[1]`).
    pub(super) layer_scalar: Option<Tensor>,
}

/// What a layer mixes positions with.
pub(super) enum LayerMixer {
    Attention(Box<Attention>),
    DeltaNet(Box<GatedDeltaNet>),
    ShortConv(Box<ShortConv>),
}

/// One sequence's rows of a pass, as a recurrent layer runs them: `len` rows from batch row
/// `row`, at positions from `pos`, continuing the state in slot `state`; with `steps`, the
/// state after each row is kept (a speculative verification).
#[derive(Clone, Copy, Debug)]
pub(super) struct RecurrentSpan {
    pub(super) row: usize,
    pub(super) len: usize,
    pub(super) pos: usize,
    pub(super) state: Option<crate::kv::states::StateId>,
    pub(super) steps: bool,
}

/// Gemma 4's routed FFN beside the MLP: `post_feedforward_layernorm_1(mlp(…))` plus
/// `post_feedforward_layernorm_2(experts(pre_feedforward_layernorm_2(x)))`, routed by `x`.
pub(super) struct MoeBeside {
    pub(super) routed: RoutedFfn,
    pub(super) post_feedforward_layernorm_1: RmsNorm,
    pub(super) post_feedforward_layernorm_2: RmsNorm,
    pub(super) pre_feedforward_layernorm_2: RmsNorm,
}

/// `h + post_per_layer_input_norm(per_layer_projection(gelu_tanh(per_layer_input_gate(h)) · p))`
/// for the layer's slice `p` of the per-layer inputs.
pub(super) struct PerLayer {
    pub(super) per_layer_input_gate: Linear,
    pub(super) per_layer_projection: Linear,
    pub(super) post_per_layer_input_norm: RmsNorm,
}

impl DecoderLayer {
    /// Its attention, where its mixer is attention.
    pub(super) fn attention(&self) -> Option<&Attention> {
        match &self.mixer {
            LayerMixer::Attention(a) => Some(a),
            _ => None,
        }
    }

    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(super) fn attention_mut(&mut self) -> Option<&mut Attention> {
        match &mut self.mixer {
            LayerMixer::Attention(a) => Some(a),
            _ => None,
        }
    }

    /// Its Gated DeltaNet, where its mixer is one.
    pub(super) fn delta_net(&self) -> Option<&GatedDeltaNet> {
        match &self.mixer {
            LayerMixer::DeltaNet(d) => Some(d),
            _ => None,
        }
    }

    /// A recurrent mixer's linear modules that no adapter slot names.
    pub(super) fn recurrent_linears(&self) -> Vec<&Linear> {
        match &self.mixer {
            LayerMixer::Attention(_) => Vec::new(),
            LayerMixer::DeltaNet(d) => vec![&d.in_proj_b, &d.in_proj_a],
            LayerMixer::ShortConv(c) => vec![&c.in_proj, &c.out_proj],
        }
    }

    /// Bytes of a recurrent mixer's other weights (convolution, decays, norm; f32).
    pub(super) fn recurrent_bytes(&self) -> usize {
        match &self.mixer {
            LayerMixer::Attention(_) => 0,
            LayerMixer::DeltaNet(d) => d.small_weights() * 4,
            LayerMixer::ShortConv(c) => c.small_weights() * 4,
        }
    }

    /// Its routed FFN, in place of the MLP (Qwen3-MoE) or beside it (Gemma 4).
    pub(super) fn routed(&self) -> Option<&RoutedFfn> {
        self.mlp.routed().or(self.beside.as_ref().map(|b| &b.routed))
    }

    /// Reads layer `p` (`model.layers.{i}`) as `spec` describes it, checking every shape; its
    /// projections fused where the file has them so (`fused`).
    pub(super) fn load(
        src: &mut dyn WeightSource,
        p: &str,
        spec: &LayerSpec,
        (fused, per_layer_size): (Fused, Option<usize>),
        h: usize,
        eps: f64,
        dtype: DType,
    ) -> Result<Self> {
        let norm_weight = spec.norms.weight;
        let mixer = match &spec.mixer {
            Mixer::Attention(a) => {
                LayerMixer::Attention(Box::new(Attention::load(src, p, a, norm_weight, fused, (h, eps), dtype)?))
            }
            Mixer::Recurrent(Recurrent::GatedDeltaNet(d)) => {
                LayerMixer::DeltaNet(Box::new(GatedDeltaNet::load(src, p, *d, h, eps, dtype)?))
            }
            Mixer::Recurrent(Recurrent::ShortConv(c)) => LayerMixer::ShortConv(Box::new(ShortConv::load(src, p, *c, dtype)?)),
        };
        let m = format!("{p}.mlp");
        let norm = |src: &mut dyn WeightSource, n: &str| RmsNorm::load(src, &format!("{p}.{n}"), h, eps, norm_weight, dtype);
        let (mlp, beside) = match &spec.ffn {
            FeedForward::GatedMlp { intermediate_size, activation } => {
                (Ffn::Dense(Box::new(Mlp::load(src, &m, (*intermediate_size, *activation), fused, h, dtype)?)), None)
            }
            FeedForward::Moe(spec) => (Ffn::Routed(RoutedFfn::load(src, &m, spec, h, eps, dtype)?), None),
            FeedForward::MlpAndMoe { intermediate_size, activation, moe } => {
                if !spec.norms.sandwich {
                    return Err(EngineError::Internal("an MLP beside a routed FFN in a layer without sandwich norms".into()));
                }
                let mlp = Ffn::Dense(Box::new(Mlp::load(src, &m, (*intermediate_size, *activation), fused, h, dtype)?));
                let beside = MoeBeside {
                    routed: RoutedFfn::load(src, p, moe, h, eps, dtype)?,
                    post_feedforward_layernorm_1: norm(src, "post_feedforward_layernorm_1")?,
                    post_feedforward_layernorm_2: norm(src, "post_feedforward_layernorm_2")?,
                    pre_feedforward_layernorm_2: norm(src, "pre_feedforward_layernorm_2")?,
                };
                (mlp, Some(beside))
            }
        };
        let sandwich = |src: &mut dyn WeightSource, n: &str| spec.norms.sandwich.then(|| norm(src, n)).transpose();
        let per_layer = match (spec.per_layer_input, per_layer_size) {
            (false, _) => None,
            (true, Some(size)) => Some(PerLayer {
                per_layer_input_gate: src.linear(&format!("{p}.per_layer_input_gate"), size, h, false, dtype)?,
                per_layer_projection: src.linear(&format!("{p}.per_layer_projection"), h, size, false, dtype)?,
                post_per_layer_input_norm: norm(src, "post_per_layer_input_norm")?,
            }),
            (true, None) => return Err(EngineError::Internal("a per-layer input without its size".into())),
        };
        let layer_scalar = spec.layer_scalar.then(|| src.tensor(&format!("{p}.layer_scalar"), &[1], dtype)).transpose()?;
        Ok(DecoderLayer {
            input_layernorm: norm(src, "input_layernorm")?,
            mixer,
            post_attention_layernorm: norm(src, "post_attention_layernorm")?,
            pre_feedforward_layernorm: sandwich(src, "pre_feedforward_layernorm")?,
            post_feedforward_layernorm: sandwich(src, "post_feedforward_layernorm")?,
            mlp,
            beside,
            per_layer,
            layer_scalar,
        })
    }
}

impl Attention {
    /// Reads `{p}.self_attn.*` as `a` describes it; its projections fused where the file has
    /// them so (`fused`).
    fn load(
        src: &mut dyn WeightSource,
        p: &str,
        a: &AttentionSpec,
        norm_weight: NormWeight,
        fused: Fused,
        (h, eps): (usize, f64),
        dtype: DType,
    ) -> Result<Self> {
        let (nh, nkv, hd) = (a.num_heads, a.num_kv_heads, a.head_dim);
        let at = format!("{p}.self_attn");
        // With an output gate, each head's queries are followed by its gate's rows.
        let q_rows = nh * hd * if a.output_gate { 2 } else { 1 };
        let qk_norm = |src: &mut dyn WeightSource, n: &str| -> Result<Option<RmsNorm>> {
            a.qk_norm.then(|| RmsNorm::load(src, &format!("{at}.{n}"), hd, eps, norm_weight, dtype)).transpose()
        };
        let shared = a.kv_from.is_some();
        let [q_proj, k_proj, v_proj] = if shared {
            // Its keys and values are an earlier layer's: the checkpoint has no k or v.
            let q = src.linear(&format!("{at}.q_proj"), q_rows, h, a.qkv_bias, dtype)?;
            [Some(q), None, None]
        } else if fused.qkv {
            let names = ["q_proj", "k_proj", "v_proj"].map(|n| format!("{at}.{n}"));
            let parts = [(names[0].as_str(), q_rows), (names[1].as_str(), nkv * hd), (names[2].as_str(), nkv * hd)];
            let qkv = src.linear_parts(&format!("{at}.qkv_proj"), &parts, h, a.qkv_bias, dtype)?;
            <[Linear; 3]>::try_from(qkv).map_err(|_| EngineError::Internal("qkv_proj: three parts".into()))?.map(Some)
        } else {
            let [q, k] = [("q_proj", q_rows), ("k_proj", nkv * hd)]
                .map(|(n, rows)| src.linear(&format!("{at}.{n}"), rows, h, a.qkv_bias, dtype));
            // (Values from the keys: the checkpoint has no v_proj.)
            let v =
                (!a.values_from_keys).then(|| src.linear(&format!("{at}.v_proj"), nkv * hd, h, a.qkv_bias, dtype)).transpose()?;
            [Some(q?), Some(k?), v]
        };
        let q_proj = q_proj.ok_or_else(|| EngineError::Internal("a query projection".into()))?;
        let q_norm = qk_norm(src, "q_norm")?;
        let v_norm = match (&q_norm, a.v_norm && !shared) {
            (_, false) => None,
            (Some(q), true) => Some(q.unit_like()?),
            (None, true) => return Err(EngineError::Internal("a value norm without a query norm".into())),
        };
        Ok(Attention {
            q_proj,
            k_proj,
            v_proj,
            o_proj: src.linear(&format!("{at}.o_proj"), h, nh * hd, false, dtype)?,
            q_norm,
            k_norm: if shared { None } else { qk_norm(src, "k_norm")? },
            v_norm,
            kv_from: a.kv_from,
            values_from_keys: a.values_from_keys,
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: hd,
            rope: a.rope,
            how: LayerAttention {
                // The kernels' own `1/√head_dim` (in f32) where the plan has the standard scale.
                scale: (a.scale != 1.0 / (hd as f64).sqrt()).then_some(a.scale as f32),
                window: a.window,
            },
            output_gate: a.output_gate,
        })
    }
}

/// What every layer of one batched pass shares.
pub(super) struct Pass<'a> {
    /// Per table group of layers.
    pub(super) attention: &'a [AttentionPlan<'a>],
    pub(super) writes: &'a KvWrites,
    pub(super) segments: &'a [Segment<'a>],
    /// `(cos, sin)` rows of each rotary embedding.
    pub(super) rotations: &'a [(Tensor, Tensor)],
    pub(super) store: &'a KvStore,
    /// Gemma 4: every row's per-layer inputs, `[rows, layers, size]`.
    pub(super) per_layer_inputs: Option<&'a Tensor>,
    /// Each sequence's rows, for the recurrent layers.
    pub(super) recurrent: &'a [RecurrentSpan],
}

impl Attention {
    pub(super) fn forward(&self, x: &Tensor, layer: usize, pass: &Pass, plan: &LayerPlan) -> Result<Tensor> {
        let rows = x.dim(0)?;
        let (nh, nkv, hd) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let proj = |lin: &Linear, x: &Tensor, p: Proj| linear_segments(lin, x, Slot::new(layer, p), pass.segments);

        // 1. Project to per-head queries (adapters applied): [rows, heads, head_dim]; where the
        //    plan has it, per-head RMSNorm.
        let q = proj(&self.q_proj, x, Proj::Q)?;
        let (q, gate) = if self.output_gate {
            let qg = q.reshape((rows, nh, 2 * hd))?;
            (qg.narrow(2, 0, hd)?.contiguous()?, Some(qg.narrow(2, hd, hd)?.contiguous()?.reshape((rows, nh * hd))?))
        } else {
            (q.reshape((rows, nh, hd))?, None)
        };
        let q = match &self.q_norm {
            Some(n) => n.forward(&q)?,
            None => q,
        };

        // Rotation by each row's position (where the layer has RoPE).
        let rot = |t: &Tensor| -> Result<Tensor> {
            let Some(r) = self.rope else { return Ok(t.clone()) };
            let (cos, sin) = &pass.rotations[r];
            let rotary_dim = plan.ropes[r].rotary_dim;
            if rotary_dim < hd {
                // Partial rotary: the leading `rotary_dim` features of each head turn, the rest
                // pass through.
                let turned = rotate(&t.narrow(2, 0, rotary_dim)?, cos, sin, plan.ropes[r].interleaved)?;
                return Ok(Tensor::cat(&[turned, t.narrow(2, rotary_dim, hd - rotary_dim)?], 2)?);
            }
            rotate(t, cos, sin, plan.ropes[r].interleaved)
        };
        let q = rot(&q)?.reshape((rows, nh * hd))?;

        // 2. Keys and values, written into the pool through the block tables; a layer sharing an
        //    earlier layer's reads those (written earlier in this pass) and writes none.
        let kv_layer = match (self.kv_from, &self.k_proj, &self.v_proj) {
            (Some(from), _, _) => from,
            (None, Some(k_proj), v_proj) if v_proj.is_some() || self.values_from_keys => {
                let raw_k = proj(k_proj, x, Proj::K)?;
                let v = match v_proj {
                    Some(v_proj) => proj(v_proj, x, Proj::V)?,
                    None => raw_k.clone(),
                };
                let k = raw_k.reshape((rows, nkv, hd))?;
                let k = match &self.k_norm {
                    Some(n) => n.forward(&k)?,
                    None => k,
                };
                let k = rot(&k)?.reshape((rows, nkv * hd))?;
                let v = match &self.v_norm {
                    Some(n) => n.forward(&v.reshape((rows, nkv, hd))?)?.reshape((rows, nkv * hd))?,
                    None => v,
                };
                pass.store.write_planned(layer, pass.writes, &k, &v)?;
                layer
            }
            _ => return Err(EngineError::Internal(format!("layer {layer} has neither keys and values nor a layer to share"))),
        };

        // 3. Attend through the block tables (the backend seam), then the output projection.
        let plan = &pass.attention[pass.store.table_of(kv_layer)];
        let out = paged_attention(&q, plan, pass.store, kv_layer, nh, self.how)?;
        let out = match gate {
            Some(g) => (out * candle_nn::ops::sigmoid(&g)?)?,
            None => out,
        };
        proj(&self.o_proj, &out, Proj::O)
    }
}

impl DecoderLayer {
    pub(super) fn forward(&self, x: Tensor, layer: usize, pass: &Pass, plan: &LayerPlan) -> Result<Tensor> {
        // The residual add, with Granite's multiplier on the block's output.
        let add = |x: Tensor, h: Tensor| -> Result<Tensor> {
            let m = plan.residual_multiplier;
            Ok(if m == 1.0 { (x + h)? } else { (x + (h * m)?)? })
        };
        let normed = self.input_layernorm.forward(&x)?;
        let h = match &self.mixer {
            LayerMixer::Attention(a) => a.forward(&normed, layer, pass, plan)?,
            LayerMixer::DeltaNet(d) => d.forward(&normed, layer, pass)?,
            LayerMixer::ShortConv(c) => c.forward(&normed, layer, pass)?,
        };
        let x = match (&self.pre_feedforward_layernorm, &self.post_feedforward_layernorm) {
            (Some(pre_ffn), Some(post_ffn)) => {
                let x = add(x, self.post_attention_layernorm.forward(&h)?)?;
                let h = self.mlp.forward(&pre_ffn.forward(&x)?, layer, pass.segments)?;
                let h = match &self.beside {
                    None => h,
                    Some(b) => {
                        let experts = b.routed.forward_routed_by(&b.pre_feedforward_layernorm_2.forward(&x)?, &x)?;
                        (b.post_feedforward_layernorm_1.forward(&h)? + b.post_feedforward_layernorm_2.forward(&experts)?)?
                    }
                };
                add(x, post_ffn.forward(&h)?)?
            }
            _ => {
                let x = add(x, h)?;
                let h = self.mlp.forward(&self.post_attention_layernorm.forward(&x)?, layer, pass.segments)?;
                add(x, h)?
            }
        };
        // Gemma 4: the layer's per-layer input, then its scalar on the whole stream.
        let x = match (&self.per_layer, pass.per_layer_inputs) {
            (Some(pl), Some(inputs)) => {
                let mine = inputs.narrow(1, layer, 1)?.squeeze(1)?;
                let h = gelu_tanh(&pl.per_layer_input_gate.forward(&x)?)?;
                let h = pl.per_layer_projection.forward(&(h * mine)?)?;
                (x + pl.post_per_layer_input_norm.forward(&h)?)?
            }
            (Some(_), None) => return Err(EngineError::Internal("a per-layer input branch without its inputs".into())),
            _ => x,
        };
        Ok(match &self.layer_scalar {
            Some(s) => x.broadcast_mul(s)?,
            None => x,
        })
    }
}

impl Mlp {
    /// Reads the gated MLP at `m` (`model.layers.{i}.mlp`): `gate_proj`, `up_proj` (or their
    /// fused `gate_up_proj`), `down_proj`.
    fn load(
        src: &mut dyn WeightSource,
        m: &str,
        (inter, activation): (usize, Activation),
        fused: Fused,
        h: usize,
        dtype: DType,
    ) -> Result<Self> {
        let (gate_proj, up_proj) = if fused.gate_up {
            let (gate, up) = (format!("{m}.gate_proj"), format!("{m}.up_proj"));
            let parts = [(gate.as_str(), inter), (up.as_str(), inter)];
            let mut gate_up = src.linear_parts(&format!("{m}.gate_up_proj"), &parts, h, false, dtype)?.into_iter();
            match (gate_up.next(), gate_up.next()) {
                (Some(gate), Some(up)) => (gate, up),
                _ => return Err(EngineError::Internal("gate_up_proj: two parts".into())),
            }
        } else {
            (
                src.linear(&format!("{m}.gate_proj"), inter, h, false, dtype)?,
                src.linear(&format!("{m}.up_proj"), inter, h, false, dtype)?,
            )
        };
        let down_proj = src.linear(&format!("{m}.down_proj"), h, inter, false, dtype)?;
        Ok(Mlp { gate_proj, up_proj, down_proj, activation })
    }

    pub(super) fn forward(&self, x: &Tensor, layer: usize, segments: &[Segment]) -> Result<Tensor> {
        let proj = |lin: &Linear, x: &Tensor, p: Proj| linear_segments(lin, x, Slot::new(layer, p), segments);
        let gate = proj(&self.gate_proj, x, Proj::Gate)?;
        let gate = match self.activation {
            Activation::Silu => candle_nn::ops::silu(&gate)?,
            // The tanh approximation (HF's `gelu_pytorch_tanh`).
            Activation::GeluTanh => gelu_tanh(&gate)?,
        };
        proj(&self.down_proj, &(gate * proj(&self.up_proj, x, Proj::Up)?)?, Proj::Down)
    }
}

/// `t` (`[rows, heads, dim]`) rotated by each row's `cos` / `sin` (`[rows, dim / 2]`): the
/// half-split kernel reads rows × heads as they are; the interleaved one wants heads first (and
/// rows first again after).
pub(super) fn rotate(t: &Tensor, cos: &Tensor, sin: &Tensor, interleaved: bool) -> Result<Tensor> {
    if interleaved {
        let t = candle_nn::rotary_emb::rope_i(&t.transpose(0, 1)?.unsqueeze(0)?.contiguous()?, cos, sin)?;
        Ok(t.squeeze(0)?.transpose(0, 1)?.contiguous()?)
    } else {
        Ok(candle_nn::rotary_emb::rope_thd(&t.contiguous()?.unsqueeze(0)?, cos, sin)?.squeeze(0)?)
    }
}

/// GELU-tanh: on the CPU in f32 through [`crate::simd::gelu_tanh_at`] (vectorised, the same bits
/// on every level), elsewhere candle's.
pub(crate) fn gelu_tanh(x: &Tensor) -> Result<Tensor> {
    if !x.device().is_cpu() || x.dtype() != DType::F32 {
        return Ok(x.gelu()?);
    }
    let mut v = x.flatten_all()?.to_vec1::<f32>()?;
    crate::simd::gelu_tanh_at(crate::simd::level(), &mut v);
    Ok(Tensor::from_vec(v, x.shape(), x.device())?)
}
