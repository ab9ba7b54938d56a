//! Qwen3.5's Gated DeltaNet layer (`linear_attn`): the projections (adapters applied), then per
//! sequence of the batch its convolution and delta rule continuing from the sequence's state
//! in the state pool ([`crate::kv::states`]), the gated RMSNorm and the output projection.
//!
//! Tensors as HF names them: `in_proj_qkv` (queries, keys, values: the convolution's
//! channels), `in_proj_z` (the output gate), `in_proj_b` (β = sigmoid), `in_proj_a` (with
//! `dt_bias` and `A_log`: g = −exp(A_log) · softplus(a + dt_bias)), `conv1d`, `norm`,
//! `out_proj`. The recurrence runs on the host in f32 ([`super::delta_rule`]), as HF runs it in
//! f32 whatever the model's dtype; a prompt chunk uses the chunked form, a decode row the
//! recurrent one, and a speculative verification (which needs the state after every row) the
//! recurrent one with per-row snapshots.

use candle_core::{DType, Tensor};
use rayon::prelude::*;

use super::adapt::{linear_segments, Proj, Slot};
use super::delta_rule::{self, HeadInputs};
use super::layer::Pass;
use super::linear::Linear;
use super::loader::WeightSource;
use super::plan::DeltaNetSpec;
use crate::error::{EngineError, Result};

pub(super) struct GatedDeltaNet {
    pub(super) in_proj_qkv: Linear,
    pub(super) in_proj_z: Linear,
    pub(super) in_proj_b: Linear,
    pub(super) in_proj_a: Linear,
    /// `[conv_dim · kernel]`: channel `c`'s taps, oldest input first.
    conv1d: Vec<f32>,
    /// `−exp(A_log)` per value head.
    a_neg: Vec<f32>,
    dt_bias: Vec<f32>,
    /// The gated RMSNorm's weight (`[v_head_dim]`, applied as `w`).
    norm: Vec<f32>,
    eps: f32,
    pub(super) out_proj: Linear,
    spec: DeltaNetSpec,
    /// Rounds to the model's dtype where HF holds a value in it.
    round: fn(f32) -> f32,
}

/// Reads a small vector as the model's dtype holds it, widened to f32.
pub(super) fn vector(src: &mut dyn WeightSource, name: &str, shape: &[usize], dtype: DType) -> Result<Vec<f32>> {
    Ok(src.tensor(name, shape, dtype)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?)
}

impl GatedDeltaNet {
    /// Reads `{p}.linear_attn.*` (`p` = `model.layers.{i}`).
    pub(super) fn load(
        src: &mut dyn WeightSource,
        p: &str,
        spec: DeltaNetSpec,
        h: usize,
        eps: f64,
        dtype: DType,
    ) -> Result<Self> {
        let at = format!("{p}.linear_attn");
        let (nv, dv, kernel, cd) = (spec.num_v_heads, spec.v_head_dim, spec.conv_kernel, spec.conv_dim());
        let lin = |src: &mut dyn WeightSource, n: &str, out: usize, inp: usize| {
            src.linear(&format!("{at}.{n}"), out, inp, false, dtype)
        };
        // The decay's rate: `A_log` (HF), or `A = −exp(A_log)` as llama.cpp stores it.
        let a_neg: Vec<f32> = if src.decay_as_a() {
            vector(src, &format!("{at}.A"), &[nv], dtype)?
        } else {
            vector(src, &format!("{at}.A_log"), &[nv], dtype)?.iter().map(|a| -a.exp()).collect()
        };
        if let Some(a) = a_neg.iter().find(|a| !(a.is_finite() && **a <= 0.0)) {
            return Err(EngineError::InvalidModel(format!("{at}: a decay rate −exp(A_log) of {a}")));
        }
        Ok(Self {
            in_proj_qkv: lin(src, "in_proj_qkv", cd, h)?,
            in_proj_z: lin(src, "in_proj_z", nv * dv, h)?,
            in_proj_b: lin(src, "in_proj_b", nv, h)?,
            in_proj_a: lin(src, "in_proj_a", nv, h)?,
            conv1d: vector(src, &format!("{at}.conv1d.weight"), &[cd, 1, kernel], dtype)?,
            a_neg,
            dt_bias: vector(src, &format!("{at}.dt_bias"), &[nv], dtype)?,
            norm: vector(src, &format!("{at}.norm.weight"), &[dv], dtype)?,
            eps: eps as f32,
            out_proj: lin(src, "out_proj", h, nv * dv)?,
            spec,
            round: delta_rule::rounder(dtype),
        })
    }

    /// f32 values of its weights other than the projections.
    pub(super) fn small_weights(&self) -> usize {
        self.conv1d.len() + self.a_neg.len() + self.dt_bias.len() + self.norm.len()
    }

    /// The layer's output for every row of the pass (`x`: its input, normed).
    pub(super) fn forward(&self, x: &Tensor, layer: usize, pass: &Pass) -> Result<Tensor> {
        let rows = x.dim(0)?;
        let s = self.spec;
        let (nv, dv) = (s.num_v_heads, s.v_head_dim);
        let host = |t: Tensor| -> Result<Vec<f32>> { Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?) };
        let proj = |lin: &Linear, p: Proj| linear_segments(lin, x, Slot::new(layer, p), pass.segments);
        let qkv = host(proj(&self.in_proj_qkv, Proj::LinQkv)?)?;
        let z = host(proj(&self.in_proj_z, Proj::LinZ)?)?;
        let b = host(self.in_proj_b.forward(x)?)?;
        let a = host(self.in_proj_a.forward(x)?)?;

        // 1. Per sequence: convolution, delta rule, from and into its state.
        let mut core = vec![0f32; rows * nv * dv];
        for span in pass.recurrent {
            let slot = span.state.ok_or_else(|| EngineError::Internal("a recurrent layer's rows without a state slot".into()))?;
            let r = span.row..span.row + span.len;
            let cd = s.conv_dim();
            let inputs =
                Inputs { qkv: &qkv[r.start * cd..r.end * cd], b: &b[r.start * nv..r.end * nv], a: &a[r.start * nv..r.end * nv] };
            let out = &mut core[r.start * nv * dv..r.end * nv * dv];
            pass.store.states().with_layer(slot, layer, (span.pos, span.len), span.steps, |state, steps| {
                self.sequence(&inputs, state, out, steps);
                Ok(())
            })?;
        }

        // 2. The gated RMSNorm per value head: rms_norm(o) · w · silu(z) (each product in the
        //    model's dtype, as HF's).
        let r = self.round;
        for (o, z) in core.chunks_exact_mut(dv).zip(z.chunks_exact(dv)) {
            o.iter_mut().for_each(|v| *v = r(*v));
            let ms = o.iter().map(|v| v * v).sum::<f32>() / dv as f32;
            let inv = 1.0 / (ms + self.eps).sqrt();
            for ((o, &w), &g) in o.iter_mut().zip(&self.norm).zip(z) {
                *o = r(r(w * r(*o * inv)) * (g / (1.0 + (-g).exp())));
            }
        }
        let y = Tensor::from_vec(core, (rows, nv * dv), x.device())?.to_dtype(x.dtype())?;
        linear_segments(&self.out_proj, &y, Slot::new(layer, Proj::LinOut), pass.segments)
    }

    /// One sequence's rows: `state` is its region (the convolution's carried inputs, then each
    /// value head's matrix); `out` receives `[rows][nv][dv]`. With `steps` (`rows` copies of
    /// the region), the state after each row is written there.
    fn sequence(&self, x: &Inputs, state: &mut [f32], out: &mut [f32], steps: Option<&mut [f32]>) {
        let s = self.spec;
        let (nk, nv, dk, dv, kernel, cd) =
            (s.num_k_heads, s.num_v_heads, s.k_head_dim, s.v_head_dim, s.conv_kernel, s.conv_dim());
        let n = x.b.len() / nv;
        let region = state.len();
        let (conv_state, mats) = state.split_at_mut((kernel - 1) * cd);
        let mut steps = steps;

        // 1. The causal convolution (SiLU) over queries, keys and values.
        let mut mixed = vec![0f32; n * cd];
        let record = steps.as_deref_mut().map(|buf| (buf, region));
        delta_rule::causal_conv_recorded(x.qkv, (n, cd, kernel), &self.conv1d, None, conv_state, &mut mixed, record);
        let r = self.round;
        mixed.iter_mut().for_each(|v| {
            let c = r(*v);
            *v = r(c / (1.0 + (-c).exp()));
        });

        // 2. Per head: queries and keys L2-normed (queries also by 1/√dk), β, g.
        let (kd, scale) = (nk * dk, 1.0 / (dk as f32).sqrt());
        let ratio = nv / nk;
        let head = |h: usize| -> Head {
            let kh = if s.tiled_heads { h % nk } else { h / ratio };
            let (mut q, mut k, mut v) = (Vec::with_capacity(n * dk), Vec::with_capacity(n * dk), Vec::with_capacity(n * dv));
            let (mut g, mut beta) = (Vec::with_capacity(n), Vec::with_capacity(n));
            for t in 0..n {
                let row = &mixed[t * cd..(t + 1) * cd];
                let at = q.len();
                q.extend_from_slice(&row[kh * dk..(kh + 1) * dk]);
                delta_rule::l2norm(&mut q[at..]);
                q[at..].iter_mut().for_each(|x| *x *= scale);
                let at = k.len();
                k.extend_from_slice(&row[kd + kh * dk..kd + (kh + 1) * dk]);
                delta_rule::l2norm(&mut k[at..]);
                v.extend_from_slice(&row[2 * kd + h * dv..2 * kd + (h + 1) * dv]);
                beta.push(r(1.0 / (1.0 + (-x.b[t * nv + h]).exp())));
                g.push(self.a_neg[h] * softplus(x.a[t * nv + h] + self.dt_bias[h]));
            }
            Head { q, k, v, g, beta }
        };

        // 3. The delta rule per value head, heads in parallel (or in order, keeping each row's
        //    state for a verification).
        let per_head = dk * dv;
        match steps {
            None => {
                let outs: Vec<Vec<f32>> = mats
                    .par_chunks_mut(per_head)
                    .enumerate()
                    .map(|(h, s)| {
                        let head = head(h);
                        let inputs = head.inputs(dk, dv);
                        let mut o = vec![0f32; n * dv];
                        if n == 1 {
                            delta_rule::recurrent(&inputs, s, &mut o, None);
                        } else {
                            delta_rule::chunked(&inputs, s, &mut o);
                        }
                        o
                    })
                    .collect();
                for (h, o) in outs.iter().enumerate() {
                    for t in 0..n {
                        out[(t * nv + h) * dv..(t * nv + h + 1) * dv].copy_from_slice(&o[t * dv..(t + 1) * dv]);
                    }
                }
            }
            Some(buf) => {
                let conv_len = (kernel - 1) * cd;
                for (h, s) in mats.chunks_exact_mut(per_head).enumerate() {
                    let head = head(h);
                    let inputs = head.inputs(dk, dv);
                    let mut o = vec![0f32; n * dv];
                    let at = conv_len + h * per_head;
                    delta_rule::recurrent(
                        &inputs,
                        s,
                        &mut o,
                        Some(&mut |r, st: &[f32]| buf[r * region + at..r * region + at + per_head].copy_from_slice(st)),
                    );
                    for t in 0..n {
                        out[(t * nv + h) * dv..(t * nv + h + 1) * dv].copy_from_slice(&o[t * dv..(t + 1) * dv]);
                    }
                }
            }
        }
    }
}

/// One value head's inputs over a sequence.
struct Head {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
}

impl Head {
    fn inputs(&self, dk: usize, dv: usize) -> HeadInputs<'_> {
        HeadInputs { q: &self.q, k: &self.k, v: &self.v, g: &self.g, beta: &self.beta, dk, dv }
    }
}

/// One sequence's projected rows.
struct Inputs<'a> {
    /// `[n][conv_dim]`.
    qkv: &'a [f32],
    /// `[n][nv]` each.
    b: &'a [f32],
    a: &'a [f32],
}

/// PyTorch's `softplus` (β 1, threshold 20).
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}
