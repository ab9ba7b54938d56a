//! The per-sequence [`Sampler`]: penalties → greedy | temperature → top-k →
//! top-p → min-p → softmax → seeded draw, plus raw-logit logprobs.
//!
//! Design note
//! -----------
//! * Budget: V up to ~152k, one call per generated token, so every pass over V
//!   must be branch-light and vectorisable, and nothing may sort V. `exp` is
//!   the dominant cost, so it uses [`fast_exp`] (Cephes-style range reduction +
//!   degree-6 polynomial, ~2 ulp, pure `f32` ops so LLVM vectorises it even on
//!   baseline SSE2); sums accumulate in `f64` across 8 lanes.
//! * Raw log-softmax (for `logprob` / `top_logprobs`): one max pass + one
//!   exp-sum pass over the raw logits. `top_logprobs` is a single scan keeping
//!   a sorted list of <= 20 entries.
//! * Top-k path (`0 < top_k < V`): one scan through a threshold buffer of
//!   ~2k entries; whenever it fills, `select_nth_unstable_by` keeps the best k
//!   and raises the admission threshold, so the work is O(V) compares. Only the
//!   k survivors are sorted; top-p / min-p are then prefix cuts of that list.
//! * Full-vocab path (`top_k` off): one pass writes weights
//!   `w = exp((l - l_max) / T)` into a reused buffer with per-block sums.
//!   - no filters: draw directly by walking block sums, then one block;
//!   - top-p: a 2048-bucket histogram of mass over `(l_max - l) / T` finds
//!     the bucket where the cumulative mass crosses `top_p * Z`; buckets
//!     before it are kept whole, buckets after it dropped, and only that one
//!     border bucket is sorted to place the exact cut (smallest prefix with
//!     mass >= target). Bucketing is a branch-free bit trick and survivors
//!     are compacted branch-free into a reused id buffer;
//!   - min-p: `w >= min_p` per token (w_max = 1, so `p < min_p * p_max` <=>
//!     `w < min_p`). Top-p and min-p both keep a prefix of the sorted order, so
//!     applying both is their intersection: same result as sequential.
//! * Scratch buffers live in the sampler and are reused; the only per-call
//!   allocation is the returned `top_logprobs` Vec (none when it is 0). When no
//!   penalty is active the raw slice is read in place (no copy).
//! * Numerics: NaN logits are -inf, +inf is `f32::MAX`. Weights multiply by
//!   `1/T` clamped to `f32::MAX` (never `0 * inf`), so tiny temperatures
//!   degrade to argmax, not NaN. If
//!   every raw logit is -inf / NaN (or the slice is empty) the result is token 0
//!   with logprob -inf; nothing panics.
//! * Ordering is total (logit desc, id asc), so ties resolve to the lower id
//!   everywhere (greedy, top-k, top-p border, top_logprobs). Exactly one `f64`
//!   is drawn from the `StdRng` per non-greedy call, so a seed reproduces.
//! * `logits.len()` is authoritative per call; `vocab_size` only pre-sizes
//!   buffers. Context / accepted ids beyond `logits.len()` are ignored.

use std::cmp::Ordering;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::penalties::{
    apply_frequency_presence_penalty, apply_repetition_penalty, DistinctMarker, TokenCounts,
};
use super::{Sampled, SamplingParams};

/// Weights are summed per block of this many tokens: `f32` lanes inside a
/// block (vectorises), `f64` across blocks (accuracy), and the block sums
/// speed up the no-filter draw.
const BLOCK: usize = 1024;
/// `f32` accumulator lanes inside a block.
const LANES: usize = 16;
/// Histogram resolution for locating the top-p cut without sorting V.
const TOP_P_BINS: usize = 2048;
/// `fast_exp` returns exactly 0 below this (e^-87 ~ 1.6e-38, the f32 normal limit).
const EXP_MIN_ARG: f32 = -87.0;

/// Per-sequence sampler. One per sequence; not shared between threads.
pub struct Sampler {
    params: SamplingParams,
    vocab_size: usize,
    rng: StdRng,
    counts: TokenCounts,
    marker: DistinctMarker,
    /// Penalised, cleaned logits (only filled when a penalty is active).
    penalised: Vec<f32>,
    scratch: Scratch,
}

/// Reusable per-call buffers for the sampling (non-greedy) path.
#[derive(Default)]
struct Scratch {
    /// Survivors `(id, logit)`.
    cand: Vec<(u32, f32)>,
    /// Weights aligned with `cand` (unnormalised probabilities).
    cand_w: Vec<f32>,
    /// Top-p border-bin members (full-vocab path).
    border: Vec<(u32, f32)>,
    /// Full-vocab weights and their per-`BLOCK` sums.
    wbuf: Vec<f32>,
    blocks: Vec<f64>,
    /// Full-vocab top-p buckets, their mass histogram, and compacted survivor ids.
    bins: Vec<u16>,
    hist: Vec<f64>,
    idx: Vec<u32>,
}

/// What the filter stage left to draw from.
enum Selection {
    /// Nothing has positive weight.
    Empty,
    /// Every token, weights in `wbuf` / `blocks`, total mass given.
    Full(f64),
    /// `cand` with weights `cand_w`, total mass given.
    Cand(f64),
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler")
            .field("params", &self.params)
            .field("vocab_size", &self.vocab_size)
            .field("generated_distinct", &self.counts.distinct())
            .finish_non_exhaustive()
    }
}

#[inline]
fn clean(x: f32) -> f32 {
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
fn fast_exp(x: f32) -> f32 {
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
fn inv_temperature(t: f32) -> f32 {
    (1.0 / t).min(f32::MAX)
}

/// Monotone (round-to-nearest) bucket of a non-negative `d`, clamped to
/// `[0, TOP_P_BINS - 1]`. Branch-free bit trick so the loop vectorises (a
/// plain `as` cast is a saturating scalar conversion).
#[inline(always)]
fn bucket(d: f32) -> u16 {
    const MAGIC: f32 = 12_582_912.0;
    const MAGIC_BITS: i32 = 0x4B40_0000;
    let d = d.min((TOP_P_BINS - 1) as f32).max(0.0); // NaN -> last bin
    ((d + MAGIC).to_bits() as i32 - MAGIC_BITS) as u16
}

/// Total order: higher logit first, then lower id. Never sees NaN.
#[inline]
fn cmp_desc(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    match b.1.partial_cmp(&a.1) {
        Some(Ordering::Equal) | None => a.0.cmp(&b.0),
        Some(o) => o,
    }
}

/// Max ignoring NaN (`-inf` for empty / all NaN).
fn max_of(xs: &[f32]) -> f32 {
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
fn min_finite_of(xs: &[f32]) -> f32 {
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
fn exp_sum_shifted(xs: &[f32], max: f32) -> f64 {
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
fn weights_into(xs: &[f32], lmax: f32, inv_t: f32, out: &mut [f32]) -> f64 {
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
fn argmax(xs: &[f32]) -> (usize, f32) {
    let m = max_of(xs);
    if m == f32::NEG_INFINITY {
        return (0, m);
    }
    (xs.iter().position(|&x| x == m).unwrap_or(0), m)
}

/// Raw log-softmax normaliser `(max, ln(sum(exp(x - max))))`, on cleaned
/// values, so `logprob(x) = (clean(x) - max) - log_sum`. `max == -inf` means
/// nothing is finite. Also reports whether a `+inf` was present.
fn log_softmax_norm(xs: &[f32]) -> (f32, f32, bool) {
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
fn top_n(xs: &[f32], n: usize, out: &mut Vec<(u32, f32)>) {
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
fn collect_top_k(xs: &[f32], k: usize, cand: &mut Vec<(u32, f32)>) {
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

/// Filter stage for one non-greedy call: temperature → top-k → top-p → min-p.
/// `work` holds the (penalised) logits with no `+inf`.
fn select(work: &[f32], p: &SamplingParams, s: &mut Scratch) -> Selection {
    let n = work.len();
    let inv_t = inv_temperature(p.temperature);
    let use_top_p = p.top_p < 1.0;
    let use_min_p = p.min_p > 0.0;
    let min_p = p.min_p.min(1.0);

    if p.top_k > 0 && p.top_k < n {
        // ---- top-k path: sorted k survivors, then prefix cuts.
        collect_top_k(work, p.top_k, &mut s.cand);
        if s.cand.is_empty() {
            return Selection::Empty;
        }
        let lmax = s.cand[0].1;
        s.cand_w.clear();
        s.cand_w.extend(s.cand.iter().map(|c| fast_exp((c.1 - lmax) * inv_t)));
        let mut keep = s.cand.len();
        if use_top_p {
            let total: f64 = s.cand_w.iter().map(|&w| w as f64).sum();
            let target = p.top_p as f64 * total;
            let mut cum = 0.0f64;
            for (i, &w) in s.cand_w.iter().enumerate() {
                cum += w as f64;
                if cum >= target {
                    keep = i + 1;
                    break;
                }
            }
        }
        if use_min_p {
            // Sorted, so the min-p survivors are a prefix; w[0] = 1 >= min_p.
            keep = s.cand_w[..keep].iter().take_while(|&&w| w >= min_p).count().max(1);
        }
        s.cand.truncate(keep);
        s.cand_w.truncate(keep);
        return Selection::Cand(s.cand_w.iter().map(|&w| w as f64).sum());
    }

    // ---- full-vocab path.
    let lmax = max_of(work);
    if lmax == f32::NEG_INFINITY {
        return Selection::Empty;
    }
    s.wbuf.resize(n, 0.0);
    s.blocks.clear();
    for (x, w) in work.chunks(BLOCK).zip(s.wbuf.chunks_mut(BLOCK)) {
        s.blocks.push(weights_into(x, lmax, inv_t, w));
    }
    let total: f64 = s.blocks.iter().sum();
    if total.is_nan() || total <= 0.0 {
        return Selection::Empty;
    }
    if !use_top_p && !use_min_p {
        return Selection::Full(total);
    }

    // Top-p: bucket d = (lmax - l) / t over [0, dmax] (monotone in l, equal
    // logits share a bucket), histogram the mass, and find the border bucket
    // where the cumulative mass crosses the target.
    let mut border_bin = u16::MAX; // MAX = top-p off: every bucket passes
    let mut border_need = 0.0f64;
    if use_top_p {
        let lmin = min_finite_of(work);
        let dmax = ((lmax - lmin) * inv_t).min(-EXP_MIN_ARG);
        let per_logit = if dmax > 0.0 {
            ((TOP_P_BINS as f32 / dmax) * inv_t).min(f32::MAX)
        } else {
            0.0
        };
        s.bins.resize(n, 0);
        for (b, &l) in s.bins.iter_mut().zip(work) {
            *b = bucket((lmax - l) * per_logit);
        }
        s.hist.clear();
        s.hist.resize(TOP_P_BINS, 0.0);
        for (&b, &w) in s.bins.iter().zip(&s.wbuf) {
            s.hist[b as usize % TOP_P_BINS] += w as f64;
        }
        let target = p.top_p as f64 * total;
        let mut cum = 0.0f64;
        for (b, &m) in s.hist.iter().enumerate() {
            if m > 0.0 {
                border_bin = b as u16;
                if cum + m >= target {
                    break;
                }
            }
            cum += m;
        }
        // If rounding kept `cum + m < target` to the end, border_bin is the
        // last non-empty bucket and everything is kept.
        border_need = target - cum;
    }

    // Branch-free compaction of ids passing min-p (w >= min_p; w > 0 always)
    // and not beyond the top-p border bucket.
    if s.idx.len() < n {
        s.idx.resize(n, 0);
    }
    let w_floor = if use_min_p { min_p } else { f32::MIN_POSITIVE * f32::EPSILON };
    let mut kept = 0usize;
    if use_top_p {
        for (i, (&w, &b)) in s.wbuf.iter().zip(&s.bins).enumerate() {
            s.idx[kept] = i as u32;
            kept += ((w >= w_floor) & (b <= border_bin)) as usize;
        }
    } else {
        for (i, &w) in s.wbuf.iter().enumerate() {
            s.idx[kept] = i as u32;
            kept += (w >= w_floor) as usize;
        }
    }

    s.cand.clear();
    s.cand_w.clear();
    s.border.clear();
    for &i in &s.idx[..kept] {
        let i = i as usize;
        if use_top_p && s.bins[i] == border_bin {
            s.border.push((i as u32, work[i]));
        } else {
            s.cand.push((i as u32, work[i]));
            s.cand_w.push(s.wbuf[i]);
        }
    }
    if use_top_p {
        // Border members that passed min-p are a prefix of the border bucket
        // in sorted order, so cutting them at the remaining mass gives the
        // intersection of the two prefix filters.
        s.border.sort_unstable_by(cmp_desc);
        let mut cum = 0.0f64;
        for &(id, l) in s.border.iter() {
            let w = s.wbuf[id as usize];
            s.cand.push((id, l));
            s.cand_w.push(w);
            cum += w as f64;
            if cum >= border_need {
                break;
            }
        }
    }
    if s.cand.is_empty() {
        return Selection::Empty;
    }
    Selection::Cand(s.cand_w.iter().map(|&w| w as f64).sum())
}

/// One draw from the selection. `None` for `Selection::Empty`.
fn draw(sel: Selection, s: &Scratch, rng: &mut StdRng) -> Option<u32> {
    match sel {
        Selection::Empty => None,
        Selection::Cand(total) => {
            let u = rng.random::<f64>() * total;
            let mut cum = 0.0f64;
            let mut last = None;
            for (c, &w) in s.cand.iter().zip(&s.cand_w) {
                if w > 0.0 {
                    cum += w as f64;
                    if u < cum {
                        return Some(c.0);
                    }
                    last = Some(c.0);
                }
            }
            last // rounding left u at/above the final sum
        }
        Selection::Full(total) => {
            let u = rng.random::<f64>() * total;
            let mut start = 0.0f64;
            for (bi, &bs) in s.blocks.iter().enumerate() {
                if u < start + bs {
                    let base = bi * BLOCK;
                    let mut cum = start;
                    for (j, &w) in s.wbuf[base..(base + BLOCK).min(s.wbuf.len())].iter().enumerate() {
                        if w > 0.0 {
                            cum += w as f64;
                            if u < cum {
                                return Some((base + j) as u32);
                            }
                        }
                    }
                }
                start += bs;
            }
            s.wbuf.iter().rposition(|&w| w > 0.0).map(|i| i as u32)
        }
    }
}

impl Sampler {
    /// New sampler. `vocab_size` pre-sizes internal buffers; each call's
    /// `logits.len()` is what actually counts. `params` should have passed
    /// [`SamplingParams::validate`].
    pub fn new(params: SamplingParams, vocab_size: usize) -> Self {
        let rng = match params.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        Self {
            params,
            vocab_size,
            rng,
            counts: TokenCounts::new(vocab_size),
            marker: DistinctMarker::default(),
            penalised: Vec::new(),
            scratch: Scratch::default(),
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Generated-token counts recorded via [`accept`](Self::accept).
    pub fn counts(&self) -> &TokenCounts {
        &self.counts
    }

    /// Record a generated token (feeds frequency / presence penalties).
    pub fn accept(&mut self, token: u32) {
        self.counts.add(token);
    }

    /// Clear generated-token counts (O(distinct generated)); the RNG stream
    /// keeps going.
    pub fn reset(&mut self) {
        self.counts.clear();
    }

    fn penalties_active(&self, context: &[u32]) -> bool {
        let p = &self.params;
        (p.repetition_penalty != 1.0 && !context.is_empty())
            || ((p.frequency_penalty != 0.0 || p.presence_penalty != 0.0)
                && !self.counts.is_empty())
    }

    /// Fill `penalised` with cleaned, penalised logits.
    fn penalise(&mut self, logits: &[f32], context: &[u32]) {
        self.penalised.clear();
        self.penalised.extend(logits.iter().map(|&x| clean(x)));
        let p = &self.params;
        apply_repetition_penalty(
            &mut self.penalised,
            context,
            p.repetition_penalty,
            &mut self.marker,
        );
        apply_frequency_presence_penalty(
            &mut self.penalised,
            &self.counts,
            p.frequency_penalty,
            p.presence_penalty,
        );
    }

    /// Sample one token from `logits`. `context` = tokens the repetition
    /// penalty looks at (prompt + generated so far, managed by the caller).
    /// Generated-token counts for frequency/presence come from `accept`.
    pub fn sample(&mut self, logits: &[f32], context: &[u32]) -> Sampled {
        let n_top = self.params.top_logprobs.min(logits.len());
        let (raw_max, log_sum, has_pos_inf) = log_softmax_norm(logits);

        if raw_max == f32::NEG_INFINITY {
            // Empty or all -inf/NaN: nothing is samplable.
            return Sampled {
                token: 0,
                logprob: f32::NEG_INFINITY,
                top_logprobs: (0..n_top as u32).map(|i| (i, f32::NEG_INFINITY)).collect(),
            };
        }

        // The cleaned copy also removes +inf, which the weight math must not see.
        let copy = has_pos_inf || self.penalties_active(context);
        if copy {
            self.penalise(logits, context);
        }

        let token = {
            let Sampler {
                params,
                rng,
                penalised,
                scratch,
                ..
            } = self;
            let work: &[f32] = if copy { penalised } else { logits };
            if params.temperature == 0.0 {
                let (i, v) = argmax(work);
                (v > f32::NEG_INFINITY).then_some(i as u32)
            } else {
                let sel = select(work, params, scratch);
                draw(sel, scratch, rng)
            }
        };
        // Fallback (penalties overflowed everything to -inf): raw argmax.
        let token = token.unwrap_or_else(|| argmax(logits).0 as u32);

        let lp = |x: f32| {
            let x = clean(x);
            if x == f32::NEG_INFINITY {
                f32::NEG_INFINITY
            } else {
                (x - raw_max) - log_sum
            }
        };
        let logprob = lp(logits[token as usize]);

        let mut top_logprobs = Vec::with_capacity(n_top);
        if n_top > 0 {
            top_n(logits, n_top, &mut top_logprobs);
            for e in top_logprobs.iter_mut() {
                e.1 = lp(e.1);
            }
        }

        Sampled {
            token,
            logprob,
            top_logprobs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: Some(1234),
            top_logprobs: 0,
        }
    }

    fn log_softmax_ref(xs: &[f32]) -> Vec<f64> {
        let m = xs.iter().cloned().fold(f64::NEG_INFINITY, |a, b| a.max(b as f64));
        let s: f64 = xs.iter().map(|&x| (x as f64 - m).exp()).sum();
        xs.iter().map(|&x| x as f64 - m - s.ln()).collect()
    }

    /// Histogram of `draws` tokens.
    fn histogram(s: &mut Sampler, logits: &[f32], draws: usize) -> Vec<usize> {
        let mut h = vec![0usize; logits.len()];
        for _ in 0..draws {
            h[s.sample(logits, &[]).token as usize] += 1;
        }
        h
    }

    fn allowed_only(h: &[usize], allowed: &[usize]) {
        for (i, &c) in h.iter().enumerate() {
            if allowed.contains(&i) {
                assert!(c > 0, "allowed id {i} never drawn: {h:?}");
            } else {
                assert_eq!(c, 0, "disallowed id {i} drawn: {h:?}");
            }
        }
    }

    #[test]
    fn greedy_argmax_and_tie_rule() {
        let mut s = Sampler::new(SamplingParams::greedy(), 5);
        assert_eq!(s.sample(&[0.1, 2.0, -1.0, 1.9, 0.0], &[]).token, 1);
        // tie between 1 and 3 -> lowest id
        assert_eq!(s.sample(&[0.1, 2.0, -1.0, 2.0, 0.0], &[]).token, 1);
        assert_eq!(s.sample(&[3.0, 3.0, 3.0], &[]).token, 0);
        // greedy ignores filters entirely (argmax always survives them)
        let mut p = params(0.0, 1, 0.1, 0.9);
        p.seed = None;
        let mut s = Sampler::new(p, 3);
        assert_eq!(s.sample(&[1.0, 5.0, 2.0], &[]).token, 1);
    }

    #[test]
    fn logprob_is_raw_log_softmax() {
        let logits = [1.0f32, 2.5, -0.5, 0.0, 2.0];
        let reference = log_softmax_ref(&logits);
        // greedy
        let mut s = Sampler::new(SamplingParams::greedy(), 5);
        let r = s.sample(&logits, &[]);
        assert_eq!(r.token, 1);
        assert!((r.logprob as f64 - reference[1]).abs() < 1e-6, "{} vs {}", r.logprob, reference[1]);
        // sampled with temperature + filters: still raw logprobs
        let mut s = Sampler::new(params(0.3, 2, 0.9, 0.0), 5);
        for _ in 0..50 {
            let r = s.sample(&logits, &[]);
            let want = reference[r.token as usize];
            assert!((r.logprob as f64 - want).abs() < 1e-6);
        }
        // with penalties: choice changes, logprob stays raw
        let mut p = SamplingParams::greedy();
        p.repetition_penalty = 10.0;
        let mut s = Sampler::new(p, 5);
        let r = s.sample(&logits, &[1]);
        assert_eq!(r.token, 4); // 2.5/10 = 0.25 < 2.0
        assert!((r.logprob as f64 - reference[4]).abs() < 1e-6);
    }

    #[test]
    fn top_logprobs_sorted_desc_ties_by_lower_id() {
        let logits = [0.5f32, 2.0, 2.0, -1.0, 1.0, 2.0];
        let reference = log_softmax_ref(&logits);
        let mut p = SamplingParams::greedy();
        p.top_logprobs = 4;
        let mut s = Sampler::new(p, 6);
        let r = s.sample(&logits, &[]);
        let ids: Vec<u32> = r.top_logprobs.iter().map(|e| e.0).collect();
        assert_eq!(ids, vec![1, 2, 5, 4]);
        for &(id, lp) in &r.top_logprobs {
            assert!((lp as f64 - reference[id as usize]).abs() < 1e-6);
        }
        assert_eq!(r.top_logprobs[0].1, r.logprob);
        // more than vocab -> whole vocab
        let mut p = SamplingParams::greedy();
        p.top_logprobs = 20;
        let mut s = Sampler::new(p, 3);
        let r = s.sample(&[0.0, 1.0, 0.0], &[]);
        assert_eq!(r.top_logprobs.iter().map(|e| e.0).collect::<Vec<_>>(), vec![1, 0, 2]);
        // sum of probs over full vocab ~ 1
        let total: f64 = r.top_logprobs.iter().map(|e| (e.1 as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
    }

    #[test]
    fn top_k_keeps_only_k() {
        let logits = [1.0f32, 3.0, 2.0, 0.5, 2.5];
        let mut s = Sampler::new(params(1.0, 2, 1.0, 0.0), 5);
        allowed_only(&histogram(&mut s, &logits, 200), &[1, 4]);
        let mut s = Sampler::new(params(1.0, 3, 1.0, 0.0), 5);
        allowed_only(&histogram(&mut s, &logits, 200), &[1, 2, 4]);
        // ties at the k boundary go to the lower id
        let mut s = Sampler::new(params(1.0, 2, 1.0, 0.0), 4);
        allowed_only(&histogram(&mut s, &[1.0, 1.0, 1.0, 1.0], 200), &[0, 1]);
        // k = 1 is greedy
        let mut s = Sampler::new(params(5.0, 1, 1.0, 0.0), 5);
        allowed_only(&histogram(&mut s, &logits, 200), &[1]);
        // k >= vocab keeps everything
        let mut s = Sampler::new(params(1.0, 10, 1.0, 0.0), 3);
        allowed_only(&histogram(&mut s, &[0.0, 0.1, -0.1], 200), &[0, 1, 2]);
    }

    #[test]
    fn top_p_boundary() {
        // Equal logits give exactly representable probabilities 0.25 each.
        let flat = [0.0f32; 4];
        // mass 0.5 reached exactly by {0,1} (ties -> lower ids)
        let mut s = Sampler::new(params(1.0, 0, 0.5, 0.0), 4);
        allowed_only(&histogram(&mut s, &flat, 200), &[0, 1]);
        let mut s = Sampler::new(params(1.0, 0, 0.75, 0.0), 4);
        allowed_only(&histogram(&mut s, &flat, 200), &[0, 1, 2]);
        // just above 0.5 needs a third token
        let mut s = Sampler::new(params(1.0, 0, 0.5001, 0.0), 4);
        allowed_only(&histogram(&mut s, &flat, 200), &[0, 1, 2]);

        // probs ~ [0.5, 0.25, 0.125, 0.125] with ids shuffled
        let l = [0.0f32, 2.0f32.ln(), 4.0f32.ln(), 0.0]; // p: .125 .25 .5 .125
        let mut s = Sampler::new(params(1.0, 0, 0.45, 0.0), 4);
        allowed_only(&histogram(&mut s, &l, 200), &[2]);
        let mut s = Sampler::new(params(1.0, 0, 0.74, 0.0), 4);
        allowed_only(&histogram(&mut s, &l, 200), &[1, 2]);
        // 0.8 needs one of the tied 0.125 tokens: the lower id (0)
        let mut s = Sampler::new(params(1.0, 0, 0.8, 0.0), 4);
        allowed_only(&histogram(&mut s, &l, 300), &[0, 1, 2]);
        // tiny top_p still keeps one token
        let mut s = Sampler::new(params(1.0, 0, 1e-6, 0.0), 4);
        allowed_only(&histogram(&mut s, &l, 100), &[2]);
        // top_p after top_k: top_k=2 -> {2,1} renormalised p = 2/3, 1/3;
        // top_p 0.6 keeps only id 2, 0.7 keeps both.
        let mut s = Sampler::new(params(1.0, 2, 0.6, 0.0), 4);
        allowed_only(&histogram(&mut s, &l, 200), &[2]);
        let mut s = Sampler::new(params(1.0, 2, 0.7, 0.0), 4);
        allowed_only(&histogram(&mut s, &l, 200), &[1, 2]);
    }

    #[test]
    fn min_p_boundary() {
        // w = exp(l - lmax): exp(-0.69)=0.5016 (kept), exp(-0.70)=0.4966 (dropped)
        let l = [0.0f32, -0.69, -0.70, -5.0];
        let mut s = Sampler::new(params(1.0, 0, 1.0, 0.5), 4);
        allowed_only(&histogram(&mut s, &l, 300), &[0, 1]);
        // min_p uses post-temperature probabilities: at T=2,
        // exp(-0.35)=0.7047 kept, exp(-2.5)=0.082 dropped.
        let mut s = Sampler::new(params(2.0, 0, 1.0, 0.5), 4);
        allowed_only(&histogram(&mut s, &l, 300), &[0, 1, 2]);
        // min_p = 1 keeps only the (tied) maxima
        let mut s = Sampler::new(params(1.0, 0, 1.0, 1.0), 4);
        allowed_only(&histogram(&mut s, &[1.0, 3.0, 3.0, 2.0], 200), &[1, 2]);
        // combined with top_p: top_p would keep {0} only (p0 ~ 0.4 >= 0.3)
        let mut s = Sampler::new(params(1.0, 0, 0.3, 0.5), 4);
        allowed_only(&histogram(&mut s, &l, 200), &[0]);
        // combined with top_p where min_p is tighter than top_p
        let mut s = Sampler::new(params(1.0, 0, 0.99, 0.5), 4);
        allowed_only(&histogram(&mut s, &l, 300), &[0, 1]);
    }

    #[test]
    fn very_low_temperature_is_greedy() {
        let logits = [1.0f32, 1.1, 0.9, -3.0];
        for t in [1e-3f32, 1e-20, 1e-38] {
            let mut s = Sampler::new(params(t, 0, 1.0, 0.0), 4);
            allowed_only(&histogram(&mut s, &logits, 200), &[1]);
        }
        // high temperature spreads mass over all tokens
        let mut s = Sampler::new(params(100.0, 0, 1.0, 0.0), 4);
        allowed_only(&histogram(&mut s, &logits, 400), &[0, 1, 2, 3]);
    }

    #[test]
    fn repetition_penalty_changes_choice_exactly() {
        let logits = [2.0f32, 1.9, -1.0, -1.05];
        let mut p = SamplingParams::greedy();
        // 2.0 / 1.05 = 1.9048 > 1.9 -> still 0
        p.repetition_penalty = 1.05;
        let mut s = Sampler::new(p.clone(), 4);
        assert_eq!(s.sample(&logits, &[0]).token, 0);
        assert!((s.penalised[0] - 2.0 / 1.05).abs() < 1e-6);
        // 2.0 / 1.06 = 1.8868 < 1.9 -> 1
        p.repetition_penalty = 1.06;
        let mut s = Sampler::new(p.clone(), 4);
        assert_eq!(s.sample(&logits, &[0, 0, 0]).token, 1);
        // applied once per distinct token, not per occurrence
        assert!((s.penalised[0] - 2.0 / 1.06).abs() < 1e-6);
        // negative logits are multiplied: -1.0 * 1.06 = -1.06 < -1.05
        let mut s = Sampler::new(p.clone(), 2);
        assert_eq!(s.sample(&[-1.0, -1.05], &[0]).token, 1);
        assert_eq!(s.penalised, vec![-1.06, -1.05]);
        // tokens outside the vocab in context are ignored
        let mut s = Sampler::new(p, 2);
        assert_eq!(s.sample(&[1.0, 0.5], &[7, 1000]).token, 0);
    }

    #[test]
    fn frequency_and_presence_penalties_on_generated_only() {
        let logits = [1.0f32, 0.5, 0.0];
        let mut p = SamplingParams::greedy();
        p.frequency_penalty = 0.3;
        p.presence_penalty = 0.2;
        let mut s = Sampler::new(p, 3);
        // context is NOT used for frequency/presence
        assert_eq!(s.sample(&logits, &[0, 0, 0, 0]).token, 0);
        s.accept(0);
        // 1.0 - 0.3 - 0.2 = 0.5 ties with id 1 (0.5) -> lowest id 0
        let r = s.sample(&logits, &[]);
        assert!((s.penalised[0] - 0.5).abs() < 1e-6);
        assert_eq!(r.token, 0);
        s.accept(0);
        // 1.0 - 0.6 - 0.2 = 0.2 < 0.5 -> 1
        assert_eq!(s.sample(&logits, &[]).token, 1);
        assert!((s.penalised[0] - 0.2).abs() < 1e-6);
        s.accept(1);
        // 0: 0.2, 1: 0.5 - 0.3 - 0.2 = 0.0, 2: 0.0 -> 0
        assert_eq!(s.sample(&logits, &[]).token, 0);
        assert!((s.penalised[1] - 0.0).abs() < 1e-6);
        assert_eq!(s.penalised[2], 0.0);
        // reset clears counts -> back to raw argmax
        s.reset();
        assert!(s.counts().is_empty());
        assert_eq!(s.sample(&logits, &[]).token, 0);
        assert_eq!(s.counts().get(0), 0);

        // presence is independent of count; frequency scales with it
        let mut p = SamplingParams::greedy();
        p.presence_penalty = 0.45;
        let mut s = Sampler::new(p, 2);
        for _ in 0..5 {
            s.accept(0);
        }
        // 1.0 - 0.45 = 0.55 > 0.5
        assert_eq!(s.sample(&[1.0, 0.5], &[]).token, 0);
        assert!((s.penalised[0] - 0.55).abs() < 1e-6);

        // both repetition and frequency: rep first then subtract
        let mut p = SamplingParams::greedy();
        p.repetition_penalty = 2.0;
        p.frequency_penalty = 0.1;
        let mut s = Sampler::new(p, 2);
        s.accept(0);
        s.accept(0);
        s.sample(&[1.0, -1.0], &[0, 1]);
        // 0: 1.0/2 - 0.2 = 0.3 ; 1: -1.0*2 = -2.0
        assert!((s.penalised[0] - 0.3).abs() < 1e-6);
        assert_eq!(s.penalised[1], -2.0);
    }

    #[test]
    fn seed_determinism() {
        let logits: Vec<f32> = (0..16).map(|i| ((i * 7) % 5) as f32 * 0.3).collect();
        let mut p = params(1.0, 0, 1.0, 0.0);
        p.seed = Some(42);
        let mut a = Sampler::new(p.clone(), 16);
        let mut b = Sampler::new(p.clone(), 16);
        let da: Vec<u32> = (0..50).map(|_| a.sample(&logits, &[]).token).collect();
        let db: Vec<u32> = (0..50).map(|_| b.sample(&logits, &[]).token).collect();
        assert_eq!(da, db);
        p.seed = Some(43);
        let mut c = Sampler::new(p.clone(), 16);
        let dc: Vec<u32> = (0..50).map(|_| c.sample(&logits, &[]).token).collect();
        assert_ne!(da, dc);
        // default params (top_k/top_p/min_p all active) are deterministic too
        let d = SamplingParams { seed: Some(9), ..Default::default() };
        let mut x = Sampler::new(d.clone(), 16);
        let mut y = Sampler::new(d, 16);
        for _ in 0..50 {
            assert_eq!(x.sample(&logits, &[]), y.sample(&logits, &[]));
        }
        // reset does not restart the rng stream
        let mut e = Sampler::new(p.clone(), 16);
        let first: Vec<u32> = (0..20).map(|_| e.sample(&logits, &[]).token).collect();
        e.reset();
        let second: Vec<u32> = (0..20).map(|_| e.sample(&logits, &[]).token).collect();
        assert_ne!(first, second);
        // unseeded samplers work
        let mut u = Sampler::new(SamplingParams { seed: None, ..p }, 16);
        assert!((u.sample(&logits, &[]).token as usize) < 16);
    }

    #[test]
    fn empirical_distribution_matches_softmax() {
        let probs = [0.5f64, 0.3, 0.2];
        let logits: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
        let mut s = Sampler::new(params(1.0, 0, 1.0, 0.0), 3);
        let n = 5000;
        let h = histogram(&mut s, &logits, n);
        for (i, &c) in h.iter().enumerate() {
            let f = c as f64 / n as f64;
            // sigma <= sqrt(.25/5000) ~ 0.007
            assert!((f - probs[i]).abs() < 0.025, "id {i}: {f} vs {} ({h:?})", probs[i]);
        }
        // same distribution through the candidate paths (full-vocab min-p,
        // and top-k) — a 4th token that every filter removes.
        let mut l4 = logits.clone();
        l4.push(-100.0);
        for p in [params(1.0, 0, 1.0, 1e-3), params(1.0, 3, 1.0, 0.0), params(1.0, 0, 0.99999, 0.0)] {
            let mut s = Sampler::new(p, 4);
            let h = histogram(&mut s, &l4, n);
            assert_eq!(h[3], 0);
            for (i, &c) in h[..3].iter().enumerate() {
                let f = c as f64 / n as f64;
                assert!((f - probs[i]).abs() < 0.025, "id {i}: {f} vs {} ({h:?})", probs[i]);
            }
        }
        // temperature 2 flattens: p ~ sqrt(p) normalised
        let mut s = Sampler::new(params(2.0, 0, 1.0, 0.0), 3);
        let h = histogram(&mut s, &logits, n);
        let z: f64 = probs.iter().map(|p| p.sqrt()).sum();
        for (i, &c) in h.iter().enumerate() {
            let f = c as f64 / n as f64;
            let want = probs[i].sqrt() / z;
            assert!((f - want).abs() < 0.025, "T=2 id {i}: {f} vs {want}");
        }
    }

    #[test]
    fn nan_and_inf_handling() {
        // NaN treated as -inf
        let mut s = Sampler::new(SamplingParams::greedy(), 3);
        let r = s.sample(&[f32::NAN, 1.0, f32::NAN], &[]);
        assert_eq!(r.token, 1);
        assert!(r.logprob.abs() < 1e-6);
        let mut s = Sampler::new(params(1.0, 0, 0.9, 0.1), 3);
        allowed_only(&histogram(&mut s, &[f32::NAN, 1.0, f32::NEG_INFINITY], 100), &[1]);
        // all -inf / NaN / empty: token 0, logprob -inf, no panic
        for p in [SamplingParams::greedy(), SamplingParams::default()] {
            let mut p = p;
            p.top_logprobs = 2;
            let mut s = Sampler::new(p, 3);
            let r = s.sample(&[f32::NEG_INFINITY, f32::NAN, f32::NEG_INFINITY], &[0]);
            assert_eq!(r.token, 0);
            assert_eq!(r.logprob, f32::NEG_INFINITY);
            assert_eq!(r.top_logprobs.len(), 2);
            let r = s.sample(&[], &[]);
            assert_eq!(r.token, 0);
            assert_eq!(r.logprob, f32::NEG_INFINITY);
            assert!(r.top_logprobs.is_empty());
        }
        // +inf logit: chosen, finite logprob, no NaN anywhere
        let p = SamplingParams { seed: Some(1), top_logprobs: 3, ..Default::default() };
        let mut s = Sampler::new(p, 3);
        let r = s.sample(&[0.0, f32::INFINITY, 1.0], &[]);
        assert_eq!(r.token, 1);
        assert!(!r.logprob.is_nan());
        assert!(r.top_logprobs.iter().all(|e| !e.1.is_nan()));
    }

    /// Reference filter: full sort, then top-k, top-p, min-p literally.
    fn reference_filter(l: &[f32], t: f32, k: usize, top_p: f32, min_p: f32) -> Vec<u32> {
        let mut c: Vec<(u32, f32)> = l
            .iter()
            .enumerate()
            .map(|(i, &x)| (i as u32, x))
            .filter(|c| c.1 > f32::NEG_INFINITY)
            .collect();
        c.sort_by(cmp_desc);
        if k > 0 {
            c.truncate(k);
        }
        let lmax = c[0].1;
        let w: Vec<f64> = c.iter().map(|x| ((x.1 - lmax) / t).exp() as f64).collect();
        let total: f64 = w.iter().sum();
        let mut keep = c.len();
        if top_p < 1.0 {
            let mut cum = 0.0;
            for (i, wi) in w.iter().enumerate() {
                cum += wi;
                if cum >= top_p as f64 * total {
                    keep = i + 1;
                    break;
                }
            }
        }
        let mut out: Vec<u32> = c[..keep]
            .iter()
            .zip(&w)
            .filter(|(_, &wi)| min_p == 0.0 || wi >= min_p as f64)
            .filter(|(_, &wi)| wi > 0.0)
            .map(|(x, _)| x.0)
            .collect();
        out.sort();
        out
    }

    /// Ids that survive `select` (all positive-weight ids for `Full`).
    fn selected_ids(logits: &[f32], p: &SamplingParams) -> Vec<u32> {
        let mut s = Scratch::default();
        let mut ids: Vec<u32> = match select(logits, p, &mut s) {
            Selection::Empty => vec![],
            Selection::Full(_) => (0..logits.len() as u32).filter(|&i| s.wbuf[i as usize] > 0.0).collect(),
            Selection::Cand(total) => {
                let sum: f64 = s.cand_w.iter().map(|&w| w as f64).sum();
                assert!((sum - total).abs() <= 1e-9 * total);
                assert_eq!(s.cand.len(), s.cand_w.len());
                s.cand.iter().map(|c| c.0).collect()
            }
        };
        ids.sort();
        let before = ids.len();
        ids.dedup();
        assert_eq!(before, ids.len(), "duplicate survivors");
        ids
    }

    #[test]
    fn fast_exp_accuracy() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x <= 10.0 {
            let got = fast_exp(x) as f64;
            let want = (x as f64).exp();
            worst = worst.max(((got - want) / want).abs());
            x += 0.000_37;
        }
        assert!(worst < 3e-7, "worst rel err {worst}");
        assert_eq!(fast_exp(0.0), 1.0);
        assert_eq!(fast_exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(fast_exp(f32::NAN), 0.0);
        assert_eq!(fast_exp(-100.0), 0.0);
    }

    #[test]
    fn filters_match_full_sort_reference_large_vocab() {
        let mut rng = StdRng::seed_from_u64(7);
        let v = 152_064;
        let uniform: Vec<f32> = (0..v).map(|_| rng.random::<f32>() * 20.0 - 10.0).collect();
        // LLM-like: a few strong tokens over a broad low tail, plus -inf holes.
        let peaked: Vec<f32> = (0..v)
            .map(|i| match i % 50_000 {
                7 => 12.0,
                13 => 11.5,
                99 => 10.0,
                _ if i % 997 == 0 => f32::NEG_INFINITY,
                _ => rng.random::<f32>() * 8.0 - 6.0,
            })
            .collect();
        let cases = [
            (1.0, 0, 0.9, 0.0),
            (1.0, 0, 0.5, 0.0),
            (0.7, 0, 0.95, 0.0),
            (1.0, 40, 0.95, 0.05),
            (0.8, 0, 0.95, 0.05),
            (1.0, 0, 1.0, 0.01),
            (2.0, 1000, 0.3, 0.0),
            (5.0, 0, 0.99, 0.0),
            (1.0, 5000, 1.0, 0.0),
            (0.01, 0, 0.9, 0.0),
            (50.0, 0, 0.9, 0.2),
        ];
        for logits in [&uniform, &peaked] {
            for (t, k, tp, m) in cases {
                let p = params(t, k, tp, m);
                let got = selected_ids(logits, &p);
                let want = reference_filter(logits, t, k, tp, m);
                assert_eq!(got.len(), want.len(), "case {:?}", (t, k, tp, m));
                assert_eq!(got, want, "case {:?}", (t, k, tp, m));
            }
        }
    }

    #[test]
    fn small_vocab_filters_match_reference() {
        let mut rng = StdRng::seed_from_u64(11);
        for trial in 0..300 {
            let n = 1 + trial % 40;
            // Coarse values so ties are common.
            let logits: Vec<f32> = (0..n).map(|_| (rng.random::<f32>() * 8.0).floor() * 0.5).collect();
            let t = [0.5f32, 1.0, 3.0][trial % 3];
            let k = [0usize, 1, 3, 10][(trial / 3) % 4];
            let tp = [1.0f32, 0.9, 0.5, 0.1][(trial / 12) % 4];
            let m = [0.0f32, 0.1, 0.6][(trial / 48) % 3];
            let p = params(t, k, tp, m);
            assert_eq!(
                selected_ids(&logits, &p),
                reference_filter(&logits, t, k, tp, m),
                "trial {trial}: {logits:?} {:?}",
                (t, k, tp, m)
            );
        }
    }
}
