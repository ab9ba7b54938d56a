//! Numeric kernels of the sampler: cleaning, a vectorisable `exp`, max / argmax
//! passes, the raw log-softmax normaliser, block weights, and the top-n / top-k
//! collectors. Pure functions over `&[f32]`; see `sampler.rs` for the design note.

use std::cmp::Ordering;

/// Weights are summed per block of this many tokens: `f32` lanes inside a
/// block (vectorises), `f64` across blocks (accuracy), and the block sums
/// speed up the no-filter draw.
pub(super) const BLOCK: usize = 1024;
/// `f32` accumulator lanes inside a block.
const LANES: usize = 16;
/// Histogram resolution for locating the top-p cut without sorting V.
pub(super) const TOP_P_BINS: usize = 2048;
/// `fast_exp` returns exactly 0 below this (e^-87 ~ 1.6e-38, the f32 normal limit).
pub(super) const EXP_MIN_ARG: f32 = -87.0;

#[inline]
pub(super) fn clean(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else if x == f32::INFINITY {
        f32::MAX
    } else {
        x
    }
}

/// `e^x` for `x <= 88`, ~2 ulp; exactly 0 for `x < -87`, -inf and NaN.
/// Branch-free `f32` arithmetic so loops over it vectorise.
#[inline(always)]
pub(super) fn fast_exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // Adding 1.5 * 2^23 rounds to an integer held in the low mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    const MAGIC_BITS: i32 = 0x4B40_0000;
    const C1: f32 = 0.693_359_4;
    const C2: f32 = -2.121_944_4e-4;
    // max/min (not clamp) so NaN maps to the bound instead of propagating.
    #[allow(clippy::manual_clamp)]
    let xc = x.max(EXP_MIN_ARG).min(88.0);
    let t = xc * LOG2E + MAGIC;
    let n = t - MAGIC;
    let r = (xc - n * C1) - n * C2;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    let ni = t.to_bits() as i32 - MAGIC_BITS;
    let scale = f32::from_bits(((ni + 127) << 23) as u32);
    if x >= EXP_MIN_ARG {
        y * scale
    } else {
        0.0
    }
}

/// `1 / t` clamped to `f32::MAX`, so that `(l - l_max) * inv` is `0` for the
/// max (not `0 * inf = NaN`) and hugely negative otherwise for tiny `t`:
/// tiny temperatures degrade to argmax. `t = inf` gives `inv = 0` (uniform).
#[inline]
pub(super) fn inv_temperature(t: f32) -> f32 {
    (1.0 / t).min(f32::MAX)
}

/// Monotone (round-to-nearest) bucket of a non-negative `d`, clamped to
/// `[0, TOP_P_BINS - 1]`. Branch-free bit trick so the loop vectorises (a
/// plain `as` cast is a saturating scalar conversion).
#[inline(always)]
pub(super) fn bucket(d: f32) -> u16 {
    const MAGIC: f32 = 12_582_912.0;
    const MAGIC_BITS: i32 = 0x4B40_0000;
    let d = d.min((TOP_P_BINS - 1) as f32).max(0.0); // NaN -> last bin
    ((d + MAGIC).to_bits() as i32 - MAGIC_BITS) as u16
}

/// Total order: higher logit first, then lower id. Never sees NaN.
#[inline]
pub(super) fn cmp_desc(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    match b.1.partial_cmp(&a.1) {
        Some(Ordering::Equal) | None => a.0.cmp(&b.0),
        Some(o) => o,
    }
}

/// Max ignoring NaN (`-inf` for empty / all NaN).
pub(super) fn max_of(xs: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; 8];
    let chunks = xs.chunks_exact(8);
    let rem = chunks.remainder();
    for c in chunks {
        for j in 0..8 {
            m[j] = m[j].max(c[j]);
        }
    }
    rem.iter().chain(m.iter()).fold(f32::NEG_INFINITY, |a, &b| a.max(b))
}

/// Min over values > -inf (NaN ignored); `+inf` when there are none.
pub(super) fn min_finite_of(xs: &[f32]) -> f32 {
    let sel = |x: f32| if x > f32::NEG_INFINITY { x } else { f32::INFINITY };
    let mut m = [f32::INFINITY; 8];
    let chunks = xs.chunks_exact(8);
    let rem = chunks.remainder();
    for c in chunks {
        for j in 0..8 {
            m[j] = m[j].min(sel(c[j]));
        }
    }
    rem.iter().map(|&x| sel(x)).chain(m.iter().copied()).fold(f32::INFINITY, f32::min)
}

/// `sum(exp(x - max))`, `max` finite and no +inf in `xs`. `f32` lanes per
/// block, `f64` across blocks (relative error ~1e-7 at V = 152k).
pub(super) fn exp_sum_shifted(xs: &[f32], max: f32) -> f64 {
    let blocks = xs.chunks_exact(BLOCK);
    let rem = blocks.remainder();
    let mut total = 0.0f64;
    for b in blocks {
        let mut acc = [0.0f32; LANES];
        for c in b.chunks_exact(LANES) {
            for j in 0..LANES {
                acc[j] += fast_exp(c[j] - max);
            }
        }
        total += acc.iter().map(|&a| a as f64).sum::<f64>();
    }
    total + rem.iter().map(|&x| fast_exp(x - max) as f64).sum::<f64>()
}

/// `out[i] = exp((xs[i] - lmax) * inv_t)` for one block (`len <= BLOCK`);
/// returns its sum.
pub(super) fn weights_into(xs: &[f32], lmax: f32, inv_t: f32, out: &mut [f32]) -> f64 {
    debug_assert_eq!(xs.len(), out.len());
    let mut acc = [0.0f32; LANES];
    let mut xc = xs.chunks_exact(LANES);
    let mut oc = out.chunks_exact_mut(LANES);
    for (x, o) in (&mut xc).zip(&mut oc) {
        for j in 0..LANES {
            let w = fast_exp((x[j] - lmax) * inv_t);
            o[j] = w;
            acc[j] += w;
        }
    }
    let mut sum: f64 = acc.iter().map(|&a| a as f64).sum();
    for (&x, o) in xc.remainder().iter().zip(oc.into_remainder()) {
        let w = fast_exp((x - lmax) * inv_t);
        *o = w;
        sum += w as f64;
    }
    sum
}

/// Argmax, ties -> lowest index, NaN ignored. `(0, -inf)` if nothing > -inf.
/// A vectorised max pass, then the first position holding it.
pub(crate) fn argmax(xs: &[f32]) -> (usize, f32) {
    let m = max_of(xs);
    if m == f32::NEG_INFINITY {
        return (0, m);
    }
    (xs.iter().position(|&x| x == m).unwrap_or(0), m)
}

/// Raw log-softmax normaliser `(max, ln(sum(exp(x - max))))`, on cleaned
/// values, so `logprob(x) = (clean(x) - max) - log_sum`. `max == -inf` means
/// nothing is finite. Also reports whether a `+inf` was present.
pub(super) fn log_softmax_norm(xs: &[f32]) -> (f32, f32, bool) {
    let max = max_of(xs);
    if max == f32::NEG_INFINITY {
        return (max, 0.0, false);
    }
    if max == f32::INFINITY {
        // Rare: +inf logits, treated as f32::MAX.
        let max = f32::MAX;
        let sum: f64 = xs.iter().map(|&x| fast_exp(clean(x) - max) as f64).sum();
        return (max, sum.ln() as f32, true);
    }
    (max, exp_sum_shifted(xs, max).ln() as f32, false)
}

/// The `n` largest cleaned values as `(id, value)`, descending, ties by lower id.
pub(super) fn top_n(xs: &[f32], n: usize, out: &mut Vec<(u32, f32)>) {
    out.clear();
    if n == 0 {
        return;
    }
    for (i, &x) in xs.iter().enumerate() {
        if out.len() == n {
            // Equal value with a later id ranks below the current last, and
            // NaN (= -inf) never beats it: skip. (Hot path: one compare.)
            #[allow(clippy::neg_cmp_op_on_partial_ord)]
            let loses = !(x > out[n - 1].1);
            if loses {
                continue;
            }
            out.pop();
        }
        let x = clean(x);
        // After all entries >= x, so earlier ids win ties.
        let pos = out.partition_point(|&(_, v)| v >= x);
        out.insert(pos, (i as u32, x));
    }
}

/// The `k` best `(id, logit)` of `xs` with logit > -inf (NaN skipped),
/// sorted by `cmp_desc`, via a threshold buffer: O(V) compares, and
/// `select_nth_unstable_by` on at most `cap` entries at a time.
pub(super) fn collect_top_k(xs: &[f32], k: usize, cand: &mut Vec<(u32, f32)>) {
    debug_assert!(k > 0);
    cand.clear();
    let cap = (2 * k).max(k + 256);
    let mut thr = f32::NEG_INFINITY;
    for (i, &x) in xs.iter().enumerate() {
        // Ties with the threshold lose: their id is higher than every id
        // already holding that value.
        if x > thr {
            cand.push((i as u32, clean(x)));
            if cand.len() == cap {
                cand.select_nth_unstable_by(k - 1, cmp_desc);
                cand.truncate(k);
                thr = cand[k - 1].1;
            }
        }
    }
    if cand.len() > k {
        cand.select_nth_unstable_by(k - 1, cmp_desc);
        cand.truncate(k);
    }
    cand.sort_unstable_by(cmp_desc);
}
