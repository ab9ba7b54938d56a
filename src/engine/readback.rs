//! What a pass's logits cost to bring back to the host.
//!
//! The sampler works on a whole row of logits in host memory. On a GPU that means copying
//! `rows × vocab` floats every step (39 MB for 64 sessions of a 152k vocabulary) and a pass of
//! the CPU over all of them, while most requests only want the greedy token and its logprob.
//! For those rows the reduction runs on the device instead, and three numbers per row come
//! back: the row's maximum, the lowest id that reaches it (the host's tie rule), and
//! `log Σ exp(x − max)`; the token's logprob is then `−log_sum`, as the host computes it. Rows
//! that need more (sampling, penalties, top logprobs, a grammar mask) and rows whose maximum or
//! sum is not finite (NaN or ±inf logits, which the host sampler cleans) are copied whole.
//! With the CPU kernels every row is copied: host memory is where the logits already are.

use candle_core::{DType, Tensor, D};

use crate::backend::cpu_kernels;
use crate::error::Result;

/// One row of logits as the sampler receives it.
pub enum RowLogits {
    /// The whole row.
    Full(Vec<f32>),
    /// Reduced on the device: the greedy token and `log Σ exp(x − max)`.
    Greedy { token: u32, log_sum: f32 },
}

/// Reads `logits` (`[rows, vocab]`, f32) back; `greedy[r]` says that row `r` wants only the
/// greedy token and its logprob. `reduced` is the pass's own reduction of the rows
/// (`[rows, 3]`, as [`greedy_reduce`] computes it), where it made one.
pub fn read_rows(logits: &Tensor, greedy: &[bool], reduced: Option<&Tensor>) -> Result<Vec<RowLogits>> {
    if cpu_kernels(logits.device()) || !greedy.iter().any(|&g| g) {
        return Ok(logits.to_vec2::<f32>()?.into_iter().map(RowLogits::Full).collect());
    }
    read_reduced(logits, greedy, reduced)
}

/// [`read_rows`] with the greedy rows reduced where the logits live.
fn read_reduced(logits: &Tensor, greedy: &[bool], reduced: Option<&Tensor>) -> Result<Vec<RowLogits>> {
    let reduced = unpack(&match reduced {
        Some(r) => r.clone(),
        None => greedy_reduce(logits)?,
    })?;
    let mut out: Vec<Option<RowLogits>> = Vec::with_capacity(greedy.len());
    let mut full = Vec::new();
    for (r, (&want, &[max, token, log_sum])) in greedy.iter().zip(&reduced).enumerate() {
        if want && max.is_finite() && log_sum.is_finite() {
            out.push(Some(RowLogits::Greedy { token: token as u32, log_sum }));
        } else {
            out.push(None);
            full.push(r as u32);
        }
    }
    if !full.is_empty() {
        let n = full.len();
        let idx = Tensor::from_slice(&full, n, logits.device())?;
        let rows = logits.index_select(&idx, 0)?.to_vec2::<f32>()?;
        for (r, row) in full.into_iter().zip(rows) {
            out[r as usize] = Some(RowLogits::Full(row));
        }
    }
    Ok(out.into_iter().map(|r| r.expect("every row filled")).collect())
}

/// Per row of `[rows, vocab]` f32 logits: `[max, lowest id reaching it, log Σ exp(x − max)]`
/// (`[rows, 3]`), computed where the logits live.
fn greedy_reduce(logits: &Tensor) -> Result<Tensor> {
    let (rows, vocab) = logits.dims2()?;
    let dev = logits.device();
    let max = logits.max_keepdim(D::Minus1)?;
    // The lowest id among the maxima: ids where the row reaches its max, `vocab` elsewhere.
    let at_max = logits.broadcast_eq(&max)?;
    let ids = Tensor::arange(0u32, vocab as u32, dev)?.unsqueeze(0)?.broadcast_as((rows, vocab))?;
    let none = Tensor::full(vocab as u32, (rows, vocab), dev)?;
    let token = at_max.where_cond(&ids, &none)?.min_keepdim(D::Minus1)?;
    let log_sum = logits.broadcast_sub(&max)?.exp()?.sum_keepdim(D::Minus1)?.log()?;
    // Ids up to 2^24 are exact in f32; vocabularies are far below that.
    Ok(Tensor::cat(&[&max, &token.to_dtype(DType::F32)?, &log_sum], 1)?)
}

/// A `[rows, 3]` reduction read back in one copy.
fn unpack(reduced: &Tensor) -> Result<Vec<[f32; 3]>> {
    Ok(reduced.to_vec2::<f32>()?.into_iter().map(|r| [r[0], r[1], r[2]]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::{Sampler, SamplingParams};
    use candle_core::Device;

    fn greedy_params() -> SamplingParams {
        SamplingParams { temperature: 0.0, ..SamplingParams::default() }
    }

    /// The device reduction picks the token the host sampler picks (ties → lowest id) with the
    /// same logprob, on rows with ties at the maximum, negative rows and a one-hot row.
    #[test]
    fn device_greedy_equals_the_host_sampler() {
        let vocab = 1000;
        let mut rows: Vec<Vec<f32>> =
            (0..4).map(|r| (0..vocab).map(|i| ((i * 7919 + r * 104_729) % 1000) as f32 / 97.0 - 5.0).collect()).collect();
        // Ties at the maximum in row 1 (the lowest id must win), all-negative row 2, one-hot row 3.
        rows[1][10] = 20.0;
        rows[1][500] = 20.0;
        rows[1][999] = 20.0;
        rows[2].iter_mut().for_each(|x| *x = -*x - 50.0);
        rows[3] = vec![-30.0; vocab];
        rows[3][777] = 4.0;
        let t = Tensor::from_vec(rows.concat(), (rows.len(), vocab), &Device::Cpu).unwrap();
        let reduced = unpack(&greedy_reduce(&t).unwrap()).unwrap();
        for (row, [max, token, log_sum]) in rows.iter().zip(reduced) {
            let host = Sampler::new(greedy_params(), vocab).sample(row, &[]);
            assert_eq!(token as u32, host.token);
            assert_eq!(max, row[host.token as usize]);
            assert!((-log_sum - host.logprob).abs() < 1e-5, "{} vs {}", -log_sum, host.logprob);
        }
    }

    /// Greedy rows come back reduced, the others (and a greedy row with a NaN) whole, in order.
    #[test]
    fn mixed_rows_keep_their_order() {
        let vocab = 32;
        let mut rows: Vec<Vec<f32>> = (0..4).map(|r| (0..vocab).map(|i| ((i + 3 * r) % 11) as f32).collect()).collect();
        rows[2][5] = f32::NAN;
        let t = Tensor::from_vec(rows.concat(), (4, vocab), &Device::Cpu).unwrap();
        let out = read_reduced(&t, &[true, false, true, true], None).unwrap();
        for (r, o) in out.iter().enumerate() {
            match (r, o) {
                (0 | 3, RowLogits::Greedy { token, .. }) => assert_eq!(rows[r][*token as usize], 10.0),
                (1, RowLogits::Full(v)) => assert_eq!(v, &rows[1]),
                (2, RowLogits::Full(v)) => assert!(v[5].is_nan() && v[..5] == rows[2][..5]),
                _ => panic!("row {r} came back in the wrong form"),
            }
        }
    }

    /// A reduction the pass already made (the CUDA decode path's kernel) is taken as it is;
    /// a row it marks not finite still comes back whole.
    #[test]
    fn a_pass_reduction_is_used_when_given() {
        let t = Tensor::from_vec((0..8).map(|i| i as f32).collect::<Vec<_>>(), (2, 4), &Device::Cpu).unwrap();
        let given = Tensor::from_vec(vec![3.0f32, 1.0, 0.25, f32::NAN, 0.0, 0.0], (2, 3), &Device::Cpu).unwrap();
        let out = read_reduced(&t, &[true, true], Some(&given)).unwrap();
        assert!(matches!(out[0], RowLogits::Greedy { token: 1, log_sum } if log_sum == 0.25));
        assert!(matches!(&out[1], RowLogits::Full(v) if v == &[4.0, 5.0, 6.0, 7.0]));
    }

    /// NaN or infinite logits are not reduced on the device: such rows come back whole, for the
    /// host sampler's cleaning.
    #[test]
    fn rows_that_are_not_finite_come_back_whole() {
        let vocab = 16;
        let mut rows = vec![vec![0.5f32; vocab]; 3];
        rows[0][3] = 2.0;
        rows[1][4] = f32::NAN;
        rows[2] = vec![f32::NEG_INFINITY; vocab];
        let t = Tensor::from_vec(rows.concat(), (3, vocab), &Device::Cpu).unwrap();
        let reduced = unpack(&greedy_reduce(&t).unwrap()).unwrap();
        assert_eq!(reduced[0][1], 3.0);
        assert!(!(reduced[1][0].is_finite() && reduced[1][2].is_finite()));
        assert!(!(reduced[2][0].is_finite() && reduced[2][2].is_finite()));
    }
}
