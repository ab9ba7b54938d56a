//! Logit penalties: HF repetition penalty and OpenAI frequency/presence penalties.
//!
//! Design note
//! -----------
//! * All functions work in place on a mutable copy of the logits (the sampler's
//!   scratch buffer); they never allocate in steady state.
//! * Repetition penalty (HF `RepetitionPenaltyLogitsProcessor`): over the
//!   caller-supplied context (prompt + generated so far), each DISTINCT token
//!   id `t < logits.len()` gets `x > 0 ? x / p : x * p` exactly once, however
//!   often it occurs. Distinctness is tracked with [`DistinctMarker`], an epoch
//!   stamp array, so deduplication is O(context) with no clearing per call.
//! * Frequency / presence penalties (OpenAI / vLLM semantics) look at GENERATED
//!   tokens only, tracked by [`TokenCounts`]: a dense `Vec<u32>` of counts plus
//!   the list of ids that are non-zero. Applying the penalties and `clear()` are
//!   O(distinct generated tokens), not O(vocab).
//! * Order when several are active: repetition → frequency → presence, each as
//!   a separate subtraction (`x -= f * c; x -= p`), matching vLLM.

/// Ids at or above this are never stored in [`TokenCounts`] (guards against a
/// garbage id turning into a multi-GiB allocation).
const MAX_TRACKED_ID: usize = 1 << 24;

/// Generated-token occurrence counts.
#[derive(Clone, Debug, Default)]
pub struct TokenCounts {
    counts: Vec<u32>,
    /// Ids whose count is non-zero, in first-seen order.
    touched: Vec<u32>,
}

impl TokenCounts {
    pub fn new(vocab_size: usize) -> Self {
        Self { counts: vec![0; vocab_size.min(MAX_TRACKED_ID)], touched: Vec::new() }
    }

    /// Count one occurrence of `token`. Ids beyond the initial vocab grow the
    /// table (up to 2^24); larger ids are ignored.
    pub fn add(&mut self, token: u32) {
        let i = token as usize;
        if i >= self.counts.len() {
            if i >= MAX_TRACKED_ID {
                return;
            }
            self.counts.resize(i + 1, 0);
        }
        let c = &mut self.counts[i];
        if *c == 0 {
            self.touched.push(token);
        }
        *c = c.saturating_add(1);
    }

    pub fn get(&self, token: u32) -> u32 {
        self.counts.get(token as usize).copied().unwrap_or(0)
    }

    /// Number of distinct ids counted.
    pub fn distinct(&self) -> usize {
        self.touched.len()
    }

    pub fn is_empty(&self) -> bool {
        self.touched.is_empty()
    }

    /// `(id, count)` for every id with a non-zero count.
    pub fn iter(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.touched.iter().map(move |&t| (t, self.counts[t as usize]))
    }

    /// Zero all counts in O(distinct ids).
    pub fn clear(&mut self) {
        for t in self.touched.drain(..) {
            self.counts[t as usize] = 0;
        }
    }
}

/// Epoch-stamped "seen" set over token ids, reusable across calls.
#[derive(Clone, Debug, Default)]
pub struct DistinctMarker {
    stamps: Vec<u32>,
    epoch: u32,
}

impl DistinctMarker {
    /// Start a new pass over ids `< len`; everything becomes unseen.
    pub fn begin(&mut self, len: usize) {
        if self.stamps.len() < len {
            self.stamps.resize(len, 0);
        }
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.stamps.fill(0);
            self.epoch = 1;
        }
    }

    /// `true` the first time `i` is seen in the current pass. `i` must be
    /// `< len` passed to [`begin`](Self::begin).
    #[inline]
    pub fn first_visit(&mut self, i: usize) -> bool {
        let s = &mut self.stamps[i];
        if *s == self.epoch {
            false
        } else {
            *s = self.epoch;
            true
        }
    }
}

/// HF repetition penalty, in place, once per distinct id of `context` that is
/// `< logits.len()`. No-op when `penalty == 1`.
pub fn apply_repetition_penalty(logits: &mut [f32], context: &[u32], penalty: f32, marker: &mut DistinctMarker) {
    if penalty == 1.0 || context.is_empty() {
        return;
    }
    let n = logits.len();
    marker.begin(n);
    for &t in context {
        let i = t as usize;
        if i < n && marker.first_visit(i) {
            let x = logits[i];
            logits[i] = if x > 0.0 { x / penalty } else { x * penalty };
        }
    }
}

/// OpenAI frequency + presence penalties from generated-token `counts`, in place.
pub fn apply_frequency_presence_penalty(logits: &mut [f32], counts: &TokenCounts, frequency_penalty: f32, presence_penalty: f32) {
    if frequency_penalty == 0.0 && presence_penalty == 0.0 {
        return;
    }
    let n = logits.len();
    for (t, c) in counts.iter() {
        let i = t as usize;
        if i < n {
            let x = &mut logits[i];
            *x -= frequency_penalty * c as f32;
            // c > 0 for every id the iterator yields.
            *x -= presence_penalty;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repetition_penalty_hf_semantics_once_per_distinct_token() {
        let mut l = vec![2.0f32, -1.0, 0.0, 3.0, 1.5];
        let mut m = DistinctMarker::default();
        // token 0 three times, 1 twice, 2 once, 99 out of range, 4 absent.
        apply_repetition_penalty(&mut l, &[0, 1, 0, 2, 1, 0, 99], 2.0, &mut m);
        assert_eq!(l, vec![1.0, -2.0, 0.0, 3.0, 1.5]);
        // A second call with a fresh pass penalises again (marker resets).
        apply_repetition_penalty(&mut l, &[3, 3], 1.5, &mut m);
        assert_eq!(l, vec![1.0, -2.0, 0.0, 2.0, 1.5]);
        // penalty < 1 rewards: 1.0 / 0.5 = 2.0, -2.0 * 0.5 = -1.0.
        apply_repetition_penalty(&mut l, &[0, 1], 0.5, &mut m);
        assert_eq!(l, vec![2.0, -1.0, 0.0, 2.0, 1.5]);
        // -inf stays -inf.
        let mut l = vec![f32::NEG_INFINITY, 1.0];
        apply_repetition_penalty(&mut l, &[0], 1.3, &mut m);
        assert_eq!(l[0], f32::NEG_INFINITY);
    }

    #[test]
    fn marker_epoch_wraparound_clears() {
        let mut m = DistinctMarker::default();
        m.begin(4);
        assert!(m.first_visit(2));
        assert!(!m.first_visit(2));
        m.epoch = u32::MAX; // force wrap on next begin
        m.stamps[1] = 1;
        m.begin(4);
        assert_eq!(m.epoch, 1);
        assert!(m.first_visit(1));
        assert!(m.first_visit(2));
    }

    #[test]
    fn frequency_and_presence_hand_computed() {
        let mut c = TokenCounts::new(4);
        for t in [0, 0, 0, 2] {
            c.add(t);
        }
        let mut l = vec![1.0f32, 1.0, 1.0, 1.0];
        apply_frequency_presence_penalty(&mut l, &c, 0.25, 0.5);
        // 0: 1 - 0.25*3 - 0.5 = -0.25 ; 2: 1 - 0.25*1 - 0.5 = 0.25
        assert_eq!(l, vec![-0.25, 1.0, 0.25, 1.0]);
        // frequency only
        let mut l = vec![1.0f32; 4];
        apply_frequency_presence_penalty(&mut l, &c, 0.5, 0.0);
        assert_eq!(l, vec![-0.5, 1.0, 0.5, 1.0]);
        // presence only: independent of the count
        let mut l = vec![1.0f32; 4];
        apply_frequency_presence_penalty(&mut l, &c, 0.0, 0.75);
        assert_eq!(l, vec![0.25, 1.0, 0.25, 1.0]);
    }

    #[test]
    fn token_counts_grow_and_clear() {
        let mut c = TokenCounts::new(2);
        c.add(1);
        c.add(1);
        c.add(5); // beyond initial size: grows
        c.add(u32::MAX); // ignored
        assert_eq!(c.get(1), 2);
        assert_eq!(c.get(5), 1);
        assert_eq!(c.get(u32::MAX), 0);
        assert_eq!(c.distinct(), 2);
        let mut v: Vec<_> = c.iter().collect();
        v.sort();
        assert_eq!(v, vec![(1, 2), (5, 1)]);
        c.clear();
        assert!(c.is_empty());
        assert_eq!(c.get(1), 0);
        assert_eq!(c.get(5), 0);
        c.add(0);
        assert_eq!(c.iter().collect::<Vec<_>>(), vec![(0, 1)]);
    }
}
