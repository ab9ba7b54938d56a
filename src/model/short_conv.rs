//! LFM2's gated short convolution (`conv`): `in_proj` yields `B`, `C` and `x` per row; `B · x`
//! runs through a causal depthwise convolution of `l_cache` taps (no activation), continuing
//! from the sequence's last `l_cache − 1` inputs in the state pool ([`crate::kv::states`]);
//! `C` gates its output before `out_proj`. Tensors as HF names them (`in_proj`, `conv`,
//! `out_proj`); the convolution runs on the host in f32.

use candle_core::{DType, Tensor};

use super::delta_net::vector;
use super::delta_rule;
use super::layer::Pass;
use super::linear::Linear;
use super::loader::WeightSource;
use super::plan::ShortConvSpec;
use crate::error::{EngineError, Result};

pub(super) struct ShortConv {
    pub(super) in_proj: Linear,
    /// `[hidden · l_cache]`: channel `c`'s taps, oldest input first.
    conv: Vec<f32>,
    conv_bias: Option<Vec<f32>>,
    pub(super) out_proj: Linear,
    spec: ShortConvSpec,
    /// Rounds to the model's dtype where HF holds a value in it.
    round: fn(f32) -> f32,
}

impl ShortConv {
    /// Reads `{p}.conv.*` (`p` = `model.layers.{i}`).
    pub(super) fn load(src: &mut dyn WeightSource, p: &str, spec: ShortConvSpec, dtype: DType) -> Result<Self> {
        let at = format!("{p}.conv");
        let h = spec.hidden;
        let read = |src: &mut dyn WeightSource, name: &str, shape: &[usize]| vector(src, &format!("{at}.{name}"), shape, dtype);
        Ok(Self {
            in_proj: src.linear(&format!("{at}.in_proj"), 3 * h, h, spec.bias, dtype)?,
            conv: read(src, "conv.weight", &[h, 1, spec.l_cache])?,
            conv_bias: spec.bias.then(|| read(src, "conv.bias", &[h])).transpose()?,
            out_proj: src.linear(&format!("{at}.out_proj"), h, h, spec.bias, dtype)?,
            spec,
            round: delta_rule::rounder(dtype),
        })
    }

    /// f32 values of its weights other than the projections.
    pub(super) fn small_weights(&self) -> usize {
        self.conv.len() + self.conv_bias.as_ref().map_or(0, Vec::len)
    }

    pub(super) fn forward(&self, x: &Tensor, layer: usize, pass: &Pass) -> Result<Tensor> {
        let rows = x.dim(0)?;
        let h = self.spec.hidden;
        let bcx: Vec<f32> = self.in_proj.forward(x)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        // B · x per row, then per sequence the convolution from its carried inputs.
        let mut bx = vec![0f32; rows * h];
        for (r, out) in bx.chunks_exact_mut(h).enumerate() {
            let row = &bcx[r * 3 * h..(r + 1) * 3 * h];
            for (c, o) in out.iter_mut().enumerate() {
                *o = (self.round)(row[c] * row[2 * h + c]);
            }
        }
        let mut conv = vec![0f32; rows * h];
        for span in pass.recurrent {
            let slot = span.state.ok_or_else(|| EngineError::Internal("a recurrent layer's rows without a state slot".into()))?;
            let r = span.row..span.row + span.len;
            let (input, out) = (&bx[r.start * h..r.end * h], &mut conv[r.start * h..r.end * h]);
            pass.store.states().with_layer(slot, layer, (span.pos, span.len), span.steps, |state, steps| {
                let region = state.len();
                let (l, bias) = (self.spec.l_cache, self.conv_bias.as_deref());
                let record = steps.map(|buf| (buf, region));
                delta_rule::causal_conv_recorded(input, (span.len, h, l), &self.conv, bias, state, out, record);
                Ok(())
            })?;
        }
        // C gates the convolution's output.
        for (r, out) in conv.chunks_exact_mut(h).enumerate() {
            for (c, o) in out.iter_mut().enumerate() {
                *o = (self.round)((self.round)(*o) * bcx[r * 3 * h + h + c]);
            }
        }
        let y = Tensor::from_vec(conv, (rows, h), x.device())?.to_dtype(x.dtype())?;
        self.out_proj.forward(&y)
    }
}
