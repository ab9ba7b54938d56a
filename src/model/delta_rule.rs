//! The arithmetic of the recurrent mixers on one sequence, in f32 on the host: the causal
//! depthwise convolution with its carried inputs, and the gated delta rule in its two forms.
//!
//! The gated delta rule keeps per value head a `dk × dv` matrix `S`. Per token, with a query
//! `q` and key `k` (L2-normed, `q` also scaled by `1/√dk`), a value `v`, a decay `g ≤ 0` and a
//! rate `β`:
//!
//! ```text
//! S ← exp(g) · S
//! S ← S + k ⊗ β (v − Sᵀk)          (the delta rule: correct S's prediction of v from k)
//! o = Sᵀ q
//! ```
//!
//! [`recurrent`] runs that token by token (decode). [`chunked`] computes the same over chunks
//! of [`CHUNK`] tokens as HF's `torch_chunk_gated_delta_rule` does (prefill): within a chunk the
//! updates are condensed by the UT transform into triangular solves and small matrix products,
//! and only the chunk's end state is carried on. The two agree to rounding; tests hold them to
//! each other and to a direct evaluation.

/// Rounds an f32 to the model's dtype and back: where HF holds a value in bf16 or f16, so do
/// the recurrent mixers (identity for f32).
pub fn rounder(dtype: candle_core::DType) -> fn(f32) -> f32 {
    match dtype {
        candle_core::DType::BF16 => |x| half::bf16::from_f32(x).to_f32(),
        candle_core::DType::F16 => |x| half::f16::from_f32(x).to_f32(),
        _ => |x| x,
    }
}

/// Where a form reports the state after each row (`(row, state)`), if anywhere.
pub type Steps<'a> = Option<&'a mut dyn FnMut(usize, &[f32])>;

/// Tokens per chunk of the chunked form (HF's `chunk_size`).
pub const CHUNK: usize = 64;

/// [`causal_conv`], recording the state after each row into `steps`' buffer, row `r` at
/// `r * stride` (a row's region may hold more than the convolution's state).
pub fn causal_conv_recorded(
    x: &[f32],
    dims: (usize, usize, usize),
    w: &[f32],
    bias: Option<&[f32]>,
    state: &mut [f32],
    out: &mut [f32],
    steps: Option<(&mut [f32], usize)>,
) {
    match steps {
        Some((buf, stride)) => {
            let mut rec = |r: usize, st: &[f32]| buf[r * stride..r * stride + st.len()].copy_from_slice(st);
            causal_conv(x, dims, w, bias, state, out, Some(&mut rec));
        }
        None => causal_conv(x, dims, w, bias, state, out, None),
    }
}

/// A causal depthwise convolution of `k` taps over `rows` rows of `ch` channels: `x[r · ch + c]`
/// in, `out` likewise; `w[c · k + j]` multiplies the input `k − 1 − j` rows back. `state` holds
/// the `k − 1` inputs before the first row (time-major, `[k − 1][ch]`) and is left holding the
/// last `k − 1` inputs. With `steps`, `steps[r]` receives the state as it stands after row `r`.
pub fn causal_conv(
    x: &[f32],
    (rows, ch, k): (usize, usize, usize),
    w: &[f32],
    bias: Option<&[f32]>,
    state: &mut [f32],
    out: &mut [f32],
    mut steps: Steps,
) {
    debug_assert_eq!((x.len(), out.len(), w.len(), state.len()), (rows * ch, rows * ch, ch * k, (k - 1) * ch));
    let past = k - 1;
    // The carried inputs followed by this pass's.
    let mut seq = Vec::with_capacity((past + rows) * ch);
    seq.extend_from_slice(state);
    seq.extend_from_slice(x);
    for r in 0..rows {
        let o = &mut out[r * ch..(r + 1) * ch];
        for (c, o) in o.iter_mut().enumerate() {
            let taps = &w[c * k..(c + 1) * k];
            let mut acc = bias.map_or(0.0, |b| b[c]);
            for (j, &wj) in taps.iter().enumerate() {
                acc += wj * seq[(r + j) * ch + c];
            }
            *o = acc;
        }
        if let Some(f) = steps.as_mut() {
            f(r, &seq[(r + 1) * ch..(r + 1 + past) * ch]);
        }
    }
    state.copy_from_slice(&seq[rows * ch..(rows + past) * ch]);
}

/// `x / √(Σx² + 1e-6)` in place (HF's `l2norm`, as the FLA kernels compute it).
pub fn l2norm(x: &mut [f32]) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let inv = 1.0 / (ss + 1e-6).sqrt();
    x.iter_mut().for_each(|v| *v *= inv);
}

/// One head's inputs over a sequence: `q`, `k` `[n][dk]`, `v` `[n][dv]`, `g` and `beta` `[n]`.
pub struct HeadInputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub g: &'a [f32],
    pub beta: &'a [f32],
    pub dk: usize,
    pub dv: usize,
}

/// The token-by-token form: advances `s` (`[dk][dv]`) over every row, writing each row's
/// output to `out` (`[n][dv]`); with `steps`, `steps(r, s)` sees the state after row `r`.
pub fn recurrent(h: &HeadInputs, s: &mut [f32], out: &mut [f32], mut steps: Steps) {
    let (dk, dv) = (h.dk, h.dv);
    let n = h.g.len();
    let mut delta = vec![0f32; dv];
    for t in 0..n {
        let (q, k, v) = (&h.q[t * dk..(t + 1) * dk], &h.k[t * dk..(t + 1) * dk], &h.v[t * dv..(t + 1) * dv]);
        let decay = h.g[t].exp();
        // Two passes over S: its prediction of v (decayed: (e^g S)ᵀk = e^g (Sᵀk)), then the
        // decay, the correction and the output row by row.
        delta.fill(0.0);
        for (i, &ki) in k.iter().enumerate() {
            for (acc, &sv) in delta.iter_mut().zip(&s[i * dv..(i + 1) * dv]) {
                *acc += sv * ki;
            }
        }
        for (d, acc) in delta.iter_mut().enumerate() {
            *acc = (v[d] - decay * *acc) * h.beta[t];
        }
        let o = &mut out[t * dv..(t + 1) * dv];
        o.fill(0.0);
        for (i, (&ki, &qi)) in k.iter().zip(q).enumerate() {
            for ((sv, &dl), acc) in s[i * dv..(i + 1) * dv].iter_mut().zip(&delta).zip(o.iter_mut()) {
                *sv = *sv * decay + ki * dl;
                *acc += *sv * qi;
            }
        }
        if let Some(f) = steps.as_mut() {
            f(t, s);
        }
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The chunked form over every row (see the module notes): the same outputs and end state as
/// [`recurrent`], computed a chunk of [`CHUNK`] rows at a time.
pub fn chunked(h: &HeadInputs, s: &mut [f32], out: &mut [f32]) {
    let (dk, dv) = (h.dk, h.dv);
    let n = h.g.len();
    let mut t0 = 0;
    // Per-chunk scratch, reused.
    let mut cum = Vec::with_capacity(CHUNK);
    let mut a = vec![0f32; CHUNK * CHUNK];
    let mut u = vec![0f32; CHUNK * dv];
    let mut w = vec![0f32; CHUNK * dk];
    let mut vnew = vec![0f32; CHUNK * dv];
    while t0 < n {
        let c = CHUNK.min(n - t0);
        let q = |i: usize| &h.q[(t0 + i) * dk..(t0 + i + 1) * dk];
        let k = |i: usize| &h.k[(t0 + i) * dk..(t0 + i + 1) * dk];
        let v = |i: usize| &h.v[(t0 + i) * dv..(t0 + i + 1) * dv];
        let beta = |i: usize| h.beta[t0 + i];
        // 1. Cumulative log-decay within the chunk.
        cum.clear();
        let mut acc = 0f32;
        for i in 0..c {
            acc += h.g[t0 + i];
            cum.push(acc);
        }
        // 2. The strictly lower system A[i][j] = β_i (k_i·k_j) exp(cum_i − cum_j), and the
        //    forward substitutions (I + A) u = β v and (I + A) w = β k exp(cum).
        for i in 0..c {
            for j in 0..i {
                a[i * CHUNK + j] = beta(i) * dot(k(i), k(j)) * (cum[i] - cum[j]).exp();
            }
        }
        for i in 0..c {
            let (ui, wi) = (i * dv, i * dk);
            for d in 0..dv {
                u[ui + d] = v(i)[d] * beta(i);
            }
            let e = cum[i].exp() * beta(i);
            for d in 0..dk {
                w[wi + d] = k(i)[d] * e;
            }
            for j in 0..i {
                let aij = a[i * CHUNK + j];
                for d in 0..dv {
                    u[ui + d] -= aij * u[j * dv + d];
                }
                for d in 0..dk {
                    w[wi + d] -= aij * w[j * dk + d];
                }
            }
        }
        // 3. Each row's correction against the carried state, then its output: the state read
        //    by the decayed query plus the chunk's own causal part.
        for i in 0..c {
            let vi = &mut vnew[i * dv..(i + 1) * dv];
            vi.copy_from_slice(&u[i * dv..(i + 1) * dv]);
            for (a_, &wa) in w[i * dk..(i + 1) * dk].iter().enumerate() {
                for (x, &sv) in vi.iter_mut().zip(&s[a_ * dv..(a_ + 1) * dv]) {
                    *x -= wa * sv;
                }
            }
        }
        for i in 0..c {
            let o = &mut out[(t0 + i) * dv..(t0 + i + 1) * dv];
            o.fill(0.0);
            let qe = cum[i].exp();
            for (a_, &qa) in q(i).iter().enumerate() {
                let qa = qa * qe;
                for (x, &sv) in o.iter_mut().zip(&s[a_ * dv..(a_ + 1) * dv]) {
                    *x += qa * sv;
                }
            }
            for j in 0..=i {
                let qk = dot(q(i), k(j)) * (cum[i] - cum[j]).exp();
                for (x, &vn) in o.iter_mut().zip(&vnew[j * dv..(j + 1) * dv]) {
                    *x += qk * vn;
                }
            }
        }
        // 4. The end state: decayed over the chunk, plus each row's key (decayed to the end)
        //    times its corrected value.
        let last = cum[c - 1];
        let total = last.exp();
        s.iter_mut().for_each(|x| *x *= total);
        for i in 0..c {
            let e = (last - cum[i]).exp();
            for (a_, &ka) in k(i).iter().enumerate() {
                let ka = ka * e;
                for (x, &vn) in s[a_ * dv..(a_ + 1) * dv].iter_mut().zip(&vnew[i * dv..(i + 1) * dv]) {
                    *x += ka * vn;
                }
            }
        }
        t0 += c;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seeded(n: usize, seed: u64) -> Vec<f32> {
        crate::kv::seeded(1, n, seed).flatten_all().unwrap().to_vec1().unwrap()
    }

    struct Case {
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        g: Vec<f32>,
        beta: Vec<f32>,
    }

    fn case(n: usize, dk: usize, dv: usize) -> Case {
        let mut q = seeded(n * dk, 1);
        let mut k = seeded(n * dk, 2);
        for t in 0..n {
            l2norm(&mut q[t * dk..(t + 1) * dk]);
            l2norm(&mut k[t * dk..(t + 1) * dk]);
        }
        let g = seeded(n, 4).iter().map(|x| -0.1 * x.abs()).collect();
        let beta = seeded(n, 5).iter().map(|x| 1.0 / (1.0 + (-x).exp())).collect();
        Case { q, k, v: seeded(n * dv, 3), g, beta }
    }

    fn heads(c: &Case, dk: usize, dv: usize) -> HeadInputs<'_> {
        HeadInputs { q: &c.q, k: &c.k, v: &c.v, g: &c.g, beta: &c.beta, dk, dv }
    }

    /// The rule evaluated literally, in f64: S ← exp(g) S; S += k ⊗ β(v − Sᵀk); o = Sᵀq.
    fn direct(h: &HeadInputs, s0: &[f32]) -> (Vec<f64>, Vec<f64>) {
        let (dk, dv) = (h.dk, h.dv);
        let mut s: Vec<f64> = s0.iter().map(|&x| x as f64).collect();
        let mut out = Vec::new();
        for t in 0..h.g.len() {
            let d = (h.g[t] as f64).exp();
            s.iter_mut().for_each(|x| *x *= d);
            for e in 0..dv {
                let pred: f64 = (0..dk).map(|i| s[i * dv + e] * h.k[t * dk + i] as f64).sum();
                let delta = (h.v[t * dv + e] as f64 - pred) * h.beta[t] as f64;
                for i in 0..dk {
                    s[i * dv + e] += h.k[t * dk + i] as f64 * delta;
                }
            }
            for e in 0..dv {
                out.push((0..dk).map(|i| s[i * dv + e] * h.q[t * dk + i] as f64).sum());
            }
        }
        (out, s)
    }

    fn max_diff(a: &[f32], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(&x, &y)| (x as f64 - y).abs()).fold(0.0, f64::max)
    }

    #[test]
    fn both_forms_follow_the_rule_across_chunks() {
        let (dk, dv) = (8, 6);
        for n in [1, 5, CHUNK, CHUNK + 1, 150] {
            let c = case(n, dk, dv);
            let h = heads(&c, dk, dv);
            let s0 = seeded(dk * dv, 9);
            let (want_out, want_s) = direct(&h, &s0);
            let (mut s1, mut o1) = (s0.clone(), vec![0f32; n * dv]);
            recurrent(&h, &mut s1, &mut o1, None);
            let (mut s2, mut o2) = (s0.clone(), vec![0f32; n * dv]);
            chunked(&h, &mut s2, &mut o2);
            for (what, got, want) in [("recurrent out", &o1, &want_out), ("chunked out", &o2, &want_out)] {
                assert!(max_diff(got, want) < 1e-4, "{what} n={n}: {}", max_diff(got, want));
            }
            assert!(max_diff(&s1, &want_s) < 1e-4 && max_diff(&s2, &want_s) < 1e-4, "state n={n}");
        }
    }

    #[test]
    fn splitting_a_sequence_carries_the_state() {
        let (dk, dv, n) = (4, 4, 100);
        let c = case(n, dk, dv);
        let h = heads(&c, dk, dv);
        let (mut whole_s, mut whole_o) = (vec![0f32; dk * dv], vec![0f32; n * dv]);
        chunked(&h, &mut whole_s, &mut whole_o);
        // 70 rows chunked, then 30 one by one: the same outputs and state.
        let part = |a: usize, b: usize| HeadInputs {
            q: &c.q[a * dk..b * dk],
            k: &c.k[a * dk..b * dk],
            v: &c.v[a * dv..b * dv],
            g: &c.g[a..b],
            beta: &c.beta[a..b],
            dk,
            dv,
        };
        let (mut s, mut o) = (vec![0f32; dk * dv], vec![0f32; n * dv]);
        chunked(&part(0, 70), &mut s, &mut o[..70 * dv]);
        let mut seen = Vec::new();
        recurrent(&part(70, n), &mut s, &mut o[70 * dv..], Some(&mut |r, st: &[f32]| seen.push((r, st.to_vec()))));
        let d = o.iter().zip(&whole_o).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(d < 1e-5, "{d}");
        assert_eq!(seen.len(), 30);
        assert_eq!(seen.last().unwrap().1, s, "the last step's state is the end state");
    }

    #[test]
    fn the_convolution_carries_its_inputs() {
        let (ch, k) = (3, 4);
        let x: Vec<f32> = (0..5 * ch).map(|i| i as f32).collect();
        let w: Vec<f32> = (0..ch * k).map(|i| (i % 5) as f32 - 2.0).collect();
        let (mut state, mut out) = (vec![0f32; (k - 1) * ch], vec![0f32; 5 * ch]);
        causal_conv(&x, (5, ch, k), &w, None, &mut state, &mut out, None);
        // Row 4, channel 1: taps over inputs of rows 1..=4.
        let want: f32 = (0..k).map(|j| w[k + j] * x[(1 + j) * ch + 1]).sum();
        assert_eq!(out[4 * ch + 1], want);
        assert_eq!(state, x[2 * ch..].to_vec(), "the last k-1 inputs");
        // The same rows in two passes.
        let (mut s2, mut o2) = (vec![0f32; (k - 1) * ch], vec![0f32; 5 * ch]);
        causal_conv(&x[..2 * ch], (2, ch, k), &w, None, &mut s2, &mut o2[..2 * ch], None);
        let mut steps = Vec::new();
        causal_conv(
            &x[2 * ch..],
            (3, ch, k),
            &w,
            Some(&[1.0; 3]),
            &mut s2,
            &mut o2[2 * ch..],
            Some(&mut |r, st: &[f32]| steps.push((r, st.to_vec()))),
        );
        assert_eq!(o2[..2 * ch], out[..2 * ch]);
        assert!(o2[2 * ch..].iter().zip(&out[2 * ch..]).all(|(a, b)| *a == b + 1.0), "bias added");
        assert_eq!(steps[2].1, state);
    }
}
