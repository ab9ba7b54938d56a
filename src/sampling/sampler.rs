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

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::constraint::apply_mask;
use super::math::{
    argmax, bucket, clean, cmp_desc, collect_top_k, fast_exp, inv_temperature, log_softmax_norm, max_of, min_finite_of, top_n,
    weights_into, BLOCK, EXP_MIN_ARG, TOP_P_BINS,
};
use super::penalties::{apply_frequency_presence_penalty, apply_repetition_penalty, DistinctMarker, TokenCounts};
use super::{Sampled, SamplingParams};
use llguidance::toktrie::SimpleVob;

/// The lowest id below `n` the mask allows (0 when it allows none).
fn first_allowed(mask: &SimpleVob, n: usize) -> u32 {
    mask.first_bit_set().filter(|&i| i < n).unwrap_or(0) as u32
}

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

/// Filter stage for one non-greedy call: temperature → top-k → top-p → min-p.
/// `work` holds the (penalised) logits with no `+inf`.
fn select(work: &[f32], p: &SamplingParams, s: &mut Scratch) -> Selection {
    let inv_t = inv_temperature(p.temperature);
    if p.top_k > 0 && p.top_k < work.len() {
        select_top_k(work, p, inv_t, s)
    } else {
        select_full(work, p, inv_t, s)
    }
}

/// Top-k path: the sorted k survivors, then top-p / min-p as prefix cuts.
fn select_top_k(work: &[f32], p: &SamplingParams, inv_t: f32, s: &mut Scratch) -> Selection {
    collect_top_k(work, p.top_k, &mut s.cand);
    if s.cand.is_empty() {
        return Selection::Empty;
    }
    let lmax = s.cand[0].1;
    s.cand_w.clear();
    s.cand_w.extend(s.cand.iter().map(|c| fast_exp((c.1 - lmax) * inv_t)));
    let mut keep = s.cand.len();
    if p.top_p < 1.0 {
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
    if p.min_p > 0.0 {
        // Sorted, so the min-p survivors are a prefix; w[0] = 1 >= min_p.
        let min_p = p.min_p.min(1.0);
        keep = s.cand_w[..keep].iter().take_while(|&&w| w >= min_p).count().max(1);
    }
    s.cand.truncate(keep);
    s.cand_w.truncate(keep);
    Selection::Cand(s.cand_w.iter().map(|&w| w as f64).sum())
}

/// Full-vocab path: every weight into `wbuf` / `blocks`; with no filter that
/// is the selection, otherwise the survivors of top-p / min-p go to `cand`.
fn select_full(work: &[f32], p: &SamplingParams, inv_t: f32, s: &mut Scratch) -> Selection {
    let use_top_p = p.top_p < 1.0;
    let use_min_p = p.min_p > 0.0;
    let lmax = max_of(work);
    if lmax == f32::NEG_INFINITY {
        return Selection::Empty;
    }
    s.wbuf.resize(work.len(), 0.0);
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
    let border = use_top_p.then(|| top_p_border(work, lmax, inv_t, p.top_p as f64 * total, s));
    let w_floor = if use_min_p { p.min_p.min(1.0) } else { f32::MIN_POSITIVE * f32::EPSILON };
    collect_survivors(work, border, w_floor, s)
}

/// Top-p on the full vocab: bucket d = (lmax - l) / t over [0, dmax] (monotone
/// in l, equal logits share a bucket) into `bins`, histogram the mass, and
/// find the border bucket where the cumulative mass crosses `target`.
/// Returns that bucket and the mass still needed from it.
fn top_p_border(work: &[f32], lmax: f32, inv_t: f32, target: f64, s: &mut Scratch) -> (u16, f64) {
    let lmin = min_finite_of(work);
    let dmax = ((lmax - lmin) * inv_t).min(-EXP_MIN_ARG);
    let per_logit = if dmax > 0.0 { ((TOP_P_BINS as f32 / dmax) * inv_t).min(f32::MAX) } else { 0.0 };
    s.bins.resize(work.len(), 0);
    for (b, &l) in s.bins.iter_mut().zip(work) {
        *b = bucket((lmax - l) * per_logit);
    }
    s.hist.clear();
    s.hist.resize(TOP_P_BINS, 0.0);
    for (&b, &w) in s.bins.iter().zip(&s.wbuf) {
        s.hist[b as usize % TOP_P_BINS] += w as f64;
    }
    let mut border_bin = u16::MAX;
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
    (border_bin, target - cum)
}

/// The full-vocab survivors into `cand` / `cand_w`: weight `>= w_floor`
/// (min-p, or just `w > 0`) and, with top-p (`border` = border bucket and the
/// mass still needed from it), not beyond the border bucket, which is cut
/// exactly.
fn collect_survivors(work: &[f32], border: Option<(u16, f64)>, w_floor: f32, s: &mut Scratch) -> Selection {
    // Branch-free compaction of ids passing min-p (w >= min_p; w > 0 always)
    // and not beyond the top-p border bucket.
    let n = work.len();
    if s.idx.len() < n {
        s.idx.resize(n, 0);
    }
    let mut kept = 0usize;
    if let Some((border_bin, _)) = border {
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
        if border.is_some_and(|(bin, _)| s.bins[i] == bin) {
            s.border.push((i as u32, work[i]));
        } else {
            s.cand.push((i as u32, work[i]));
            s.cand_w.push(s.wbuf[i]);
        }
    }
    if let Some((_, border_need)) = border {
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

    /// Whether this sampler only ever takes the argmax of the raw logits and reports its
    /// logprob: greedy, no penalties, no top logprobs. Such a row can be reduced where the
    /// logits live (`engine::readback`); a grammar mask is the caller's to check.
    pub fn greedy_only(&self) -> bool {
        let p = &self.params;
        p.temperature == 0.0
            && p.top_logprobs == 0
            && p.repetition_penalty == 1.0
            && p.frequency_penalty == 0.0
            && p.presence_penalty == 0.0
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
            || ((p.frequency_penalty != 0.0 || p.presence_penalty != 0.0) && !self.counts.is_empty())
    }

    /// Fill `penalised` with cleaned, penalised logits.
    fn penalise(&mut self, logits: &[f32], context: &[u32]) {
        self.penalised.clear();
        self.penalised.extend(logits.iter().map(|&x| clean(x)));
        let p = &self.params;
        apply_repetition_penalty(&mut self.penalised, context, p.repetition_penalty, &mut self.marker);
        apply_frequency_presence_penalty(&mut self.penalised, &self.counts, p.frequency_penalty, p.presence_penalty);
    }

    /// Sample one token from `logits`. `context` = tokens the repetition
    /// penalty looks at (prompt + generated so far, managed by the caller).
    /// Generated-token counts for frequency/presence come from `accept`.
    pub fn sample(&mut self, logits: &[f32], context: &[u32]) -> Sampled {
        self.sample_masked(logits, context, None)
    }

    /// [`Self::sample`] among the tokens `allowed` permits (a grammar's mask): the others are
    /// dropped before penalties' results are tempered and filtered. `logprob` and
    /// `top_logprobs` still come from the raw logits (the model's own distribution). When the
    /// mask leaves nothing with a finite logit, the first allowed id is chosen.
    pub fn sample_masked(&mut self, logits: &[f32], context: &[u32], allowed: Option<&SimpleVob>) -> Sampled {
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
        let copy = has_pos_inf || allowed.is_some() || self.penalties_active(context);
        if copy {
            self.penalise(logits, context);
            if let Some(mask) = allowed {
                apply_mask(mask, &mut self.penalised);
            }
        }

        let token = {
            let Sampler { params, rng, penalised, scratch, .. } = self;
            let work: &[f32] = if copy { penalised } else { logits };
            if params.temperature == 0.0 {
                let (i, v) = argmax(work);
                (v > f32::NEG_INFINITY).then_some(i as u32)
            } else {
                let sel = select(work, params, scratch);
                draw(sel, scratch, rng)
            }
        };
        // Fallback (penalties overflowed everything to -inf): raw argmax, or the first token
        // the mask allows.
        let token = token.unwrap_or_else(|| match allowed {
            Some(mask) => first_allowed(mask, logits.len()),
            None => argmax(logits).0 as u32,
        });

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

        Sampled { token, logprob, top_logprobs }
    }
}

#[cfg(test)]
#[path = "sampler_tests.rs"]
mod tests;
