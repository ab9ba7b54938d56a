//! The routed feed-forward block (Qwen3-MoE's `Qwen3MoeSparseMoeBlock`): a router picks, per
//! token, the top `k` of `E` "MoE experts" (SiLU-gated MLPs that are part of the base model, not
//! PEFT experts), runs them, and sums their outputs weighted by the router's probabilities.
//!
//! In one batched pass the rows are grouped per MoE expert: each expert that any row picked runs
//! once, on exactly the rows that picked it (`index_select`), and the weighted outputs are added
//! back to their rows in one `index_add`, in expert order (as transformers adds them). A decode
//! batch of `n` sessions thus runs at most `min(E, n·k)` expert MLPs, each on a few rows.
//!
//! Numerics follow transformers: router logits in the model's dtype, softmax in f32, the top-k
//! probabilities (renormalised to sum to 1 where `norm_topk_prob`) cast back to the model's
//! dtype before they scale each expert's output.
//!
//! The weights come in three layouts: the hub's per-expert tensors
//! (`mlp.experts.{e}.gate_proj`, …), transformers 5's stacked `mlp.experts.gate_up_proj`
//! `[E, 2I, H]` and `mlp.experts.down_proj` `[E, H, I]`, and GGUF's stacked `ffn_gate_exps`,
//! `ffn_up_exps`, `ffn_down_exps` (`[E, I, H]`, `[E, I, H]`, `[E, H, I]`). The router is
//! `mlp.gate` (`ffn_gate_inp`), `[E, H]`, always kept dense: quantizing it could change which
//! experts a token picks.

use candle_core::{DType, Tensor};

use super::layer::gelu_tanh;
use super::linear::Linear;
use super::loader::WeightSource;
use super::plan::{Activation, Moe, Router};
use crate::error::{EngineError, Result};

/// One MoE expert: `down(act(gate(x)) · up(x))`.
struct ExpertMlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

pub(super) struct RoutedFfn {
    /// The router, `[E, H]` in the model's dtype.
    gate: Tensor,
    /// Gemma 4's router: the learned scale of its normed input (times `1/√H`), `[H]`, and each
    /// MoE expert's scale on its weight, `[E]` (f32), with the norm's epsilon.
    scaled_norm: Option<(Tensor, Vec<f32>, f32)>,
    experts: Vec<ExpertMlp>,
    experts_per_token: usize,
    norm_topk_prob: bool,
    activation: Activation,
}

impl RoutedFfn {
    /// Reads the routed block whose MoE experts are at `m.experts` (Qwen3-MoE: `m` is
    /// `model.layers.{i}.mlp`; Gemma 4: `model.layers.{i}`) as `spec` describes it, in whichever
    /// of the three layouts the file holds; its router at `m.gate` (Qwen3-MoE) or `m.router`
    /// (Gemma 4).
    pub(super) fn load(src: &mut dyn WeightSource, m: &str, spec: &Moe, h: usize, eps: f64, dtype: DType) -> Result<Self> {
        let (n, inter) = (spec.num_experts, spec.intermediate_size);
        let (gate, scaled_norm) = match spec.router {
            Router::Linear => (src.tensor(&format!("{m}.gate.weight"), &[n, h], dtype)?, None),
            Router::ScaledNorm => {
                let r = format!("{m}.router");
                let scale = (src.tensor(&format!("{r}.scale"), &[h], DType::F32)? * (h as f64).powf(-0.5))?;
                let per_expert: Vec<f32> = src.tensor(&format!("{r}.per_expert_scale"), &[n], DType::F32)?.to_vec1()?;
                let proj = src.tensor(&format!("{r}.proj.weight"), &[n, h], dtype)?;
                (proj, Some((scale.to_dtype(dtype)?, per_expert, eps as f32)))
            }
        };
        let name = |e: usize, p: &str| format!("{m}.experts.{e}.{p}");
        let experts = if src.contains(&name(0, "gate_proj")) {
            (0..n)
                .map(|e| {
                    Ok(ExpertMlp {
                        gate_proj: src.linear(&name(e, "gate_proj"), inter, h, false, dtype)?,
                        up_proj: src.linear(&name(e, "up_proj"), inter, h, false, dtype)?,
                        down_proj: src.linear(&name(e, "down_proj"), h, inter, false, dtype)?,
                    })
                })
                .collect::<Result<Vec<_>>>()?
        } else {
            let names = |p: &str| (0..n).map(|e| name(e, p)).collect::<Vec<_>>();
            let (gates, ups, downs) = (names("gate_proj"), names("up_proj"), names("down_proj"));
            let (gate_proj, up_proj) = if src.contains(&format!("{m}.experts.gate_up_proj")) {
                // transformers 5: each expert's gate rows, then its up rows.
                let interleaved: Vec<(&str, usize)> =
                    gates.iter().zip(&ups).flat_map(|(g, u)| [(g.as_str(), inter), (u.as_str(), inter)]).collect();
                let both = src.linear_stack(&format!("{m}.experts.gate_up_proj"), [n, 2 * inter, h], &interleaved, dtype)?;
                let (mut gate_proj, mut up_proj) = (Vec::with_capacity(n), Vec::with_capacity(n));
                for (i, l) in both.into_iter().enumerate() {
                    if i % 2 == 0 {
                        gate_proj.push(l)
                    } else {
                        up_proj.push(l)
                    }
                }
                (gate_proj, up_proj)
            } else {
                (
                    src.linear_stack(&format!("{m}.experts.gate_proj"), [n, inter, h], &parts(&gates, inter), dtype)?,
                    src.linear_stack(&format!("{m}.experts.up_proj"), [n, inter, h], &parts(&ups, inter), dtype)?,
                )
            };
            let down_proj = src.linear_stack(&format!("{m}.experts.down_proj"), [n, h, inter], &parts(&downs, h), dtype)?;
            if gate_proj.len() != n || up_proj.len() != n || down_proj.len() != n {
                return Err(EngineError::Internal(format!("{m}: MoE expert stacks of other sizes than {n}")));
            }
            gate_proj
                .into_iter()
                .zip(up_proj)
                .zip(down_proj)
                .map(|((gate_proj, up_proj), down_proj)| ExpertMlp { gate_proj, up_proj, down_proj })
                .collect()
        };
        Ok(Self {
            gate,
            scaled_norm,
            experts,
            experts_per_token: spec.experts_per_token,
            norm_topk_prob: spec.norm_topk_prob,
            activation: spec.activation,
        })
    }

    /// `x` `[rows, H]` through the routed block, routed by `x` itself: `[rows, H]`.
    pub(super) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_routed_by(x, x)
    }

    /// `x` `[rows, H]` through the MoE experts that the router picks for `route` (Gemma 4 routes
    /// by the layer's un-normed input and runs the experts on its normed one): `[rows, H]`.
    pub(super) fn forward_routed_by(&self, x: &Tensor, route: &Tensor) -> Result<Tensor> {
        let (rows, dtype, device) = (x.dim(0)?, x.dtype(), x.device());
        // 1. Router probabilities: logits in the model's dtype, softmax in f32.
        let route = match &self.scaled_norm {
            None => route.contiguous()?,
            Some((scale, _, eps)) => {
                let normed = candle_nn::ops::rms_norm(&route.contiguous()?, &scale.ones_like()?, *eps)?;
                normed.broadcast_mul(scale)?
            }
        };
        let logits = route.matmul(&self.gate.t()?)?;
        let probs = candle_nn::ops::softmax_last_dim(&logits.to_dtype(DType::F32)?)?.to_vec2::<f32>()?;

        // 2. Each row's top k, grouped per MoE expert: (row, weight) in row order.
        let mut picked_by: Vec<Vec<(u32, f32)>> = vec![Vec::new(); self.experts.len()];
        let mut order: Vec<usize> = Vec::with_capacity(self.experts.len());
        for (row, p) in probs.iter().enumerate() {
            let top = top_k(p, self.experts_per_token, &mut order);
            let sum: f32 = top.iter().map(|&e| p[e]).sum();
            for &e in top {
                let w = if self.norm_topk_prob { p[e] / sum } else { p[e] };
                let w = match &self.scaled_norm {
                    Some((_, per_expert, _)) => w * per_expert[e],
                    None => w,
                };
                picked_by[e].push((row as u32, w));
            }
        }

        // 3. Each picked expert once over its rows, its output scaled by the rows' weights; all
        //    added back to their rows in one pass, in expert order.
        let mut rows_of = Vec::new();
        let mut outputs = Vec::new();
        for (expert, picked) in self.experts.iter().zip(&picked_by).filter(|(_, p)| !p.is_empty()) {
            let idx = Tensor::from_vec(picked.iter().map(|p| p.0).collect::<Vec<u32>>(), picked.len(), device)?;
            let w = Tensor::from_vec(picked.iter().map(|p| p.1).collect::<Vec<f32>>(), (picked.len(), 1), device)?;
            let xe = x.index_select(&idx, 0)?;
            let gate = expert.gate_proj.forward(&xe)?;
            let gate = match self.activation {
                Activation::Silu => candle_nn::ops::silu(&gate)?,
                Activation::GeluTanh => gelu_tanh(&gate)?,
            };
            let ye = expert.down_proj.forward(&(gate * expert.up_proj.forward(&xe)?)?)?;
            outputs.push(ye.broadcast_mul(&w.to_dtype(dtype)?)?);
            rows_of.push(idx);
        }
        let out = Tensor::zeros((rows, x.dim(1)?), dtype, device)?;
        if outputs.is_empty() {
            return Ok(out);
        }
        Ok(out.index_add(&Tensor::cat(&rows_of, 0)?, &Tensor::cat(&outputs, 0)?, 0)?)
    }

    /// The MoE experts' weights, for memory accounting: `(bytes, formats)`.
    pub(super) fn linears(&self) -> impl Iterator<Item = &Linear> {
        self.experts.iter().flat_map(|e| [&e.gate_proj, &e.up_proj, &e.down_proj])
    }

    /// The router's weight.
    pub(super) fn router(&self) -> &Tensor {
        &self.gate
    }
}

/// `names` as the parts of a stack, `rows` rows each.
fn parts(names: &[String], rows: usize) -> Vec<(&str, usize)> {
    names.iter().map(|s| (s.as_str(), rows)).collect()
}

/// The indices of the `k` largest of `p`, largest first (ties: the lower index first; NaN
/// counts as the smallest), using `order` as scratch space.
fn top_k<'a>(p: &[f32], k: usize, order: &'a mut Vec<usize>) -> &'a [usize] {
    order.clear();
    order.extend(0..p.len());
    let key = |i: usize| if p[i].is_nan() { f32::NEG_INFINITY } else { p[i] };
    let k = k.min(p.len());
    if k < p.len() {
        order.select_nth_unstable_by(k, |&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
    }
    let top = &mut order[..k];
    top.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
    top
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_takes_the_largest_lower_index_first_on_ties() {
        let mut order = Vec::new();
        assert_eq!(top_k(&[0.1, 0.4, 0.2, 0.3], 2, &mut order), &[1, 3]);
        assert_eq!(top_k(&[0.25, 0.25, 0.25, 0.25], 3, &mut order), &[0, 1, 2]);
        assert_eq!(top_k(&[f32::NAN, 0.5, 0.5], 1, &mut order), &[1]);
        assert_eq!(top_k(&[0.7, 0.3], 5, &mut order), &[0, 1]);
    }
}
