//! Speculative decoding: prompt lookup (n-gram drafting) or a smaller draft model.
//!
//! A decoding request that asks for it proposes up to `k` tokens: with `ngram`, by finding the
//! stream's last few tokens earlier in the stream (the prompt, earlier turns, its own output)
//! and copying what followed them there; with `draft`, by running a second, smaller model with
//! the same vocabulary greedily for `k` tokens (on the engine thread, with a private
//! single-sequence KV cache that keeps the longest prefix still valid after a rejection).
//!
//! The scheduler appends the proposal to the session's stream and evaluates the pending token
//! plus the drafts as `1 + k` rows of the request's normal chunk in the batched pass; then each row is sampled in order, exactly as plain decoding samples it (same context,
//! same sampler, same RNG draw), and the drafts are kept while they equal what was sampled. The
//! first difference is itself the next token, so every verification pass emits at least one.
//! Rejected positions were written to the request's own blocks past its table's length; the
//! table simply does not advance over them and the next pass overwrites them.
//!
//! Why this keeps the output distribution. A proposal is a deterministic function of the stream
//! (a point mass on one token per position), so the standard rejection rule — accept draft `d`
//! with probability `min(1, p(d)/q(d)) = p(d)`, else sample from `p` with `d` removed — gives a
//! token distributed as `p`. Sampling `x ~ p` with the row's own RNG draw and accepting when
//! `x = d` has the same acceptance probability and the same law, and it consumes the RNG exactly
//! as plain decoding does: with a seed, the output is the same tokens with or without
//! speculation, as long as the pass computes the same logits for a row whatever the rows beside
//! it (bit for bit on the integer kernels; see `model::q8`).
//!
//! Cost. On a CPU a pass of a few rows costs little more than one (the weights are read once for
//! all rows), so a wrong guess is cheap but not free. The draft length adapts: it doubles while
//! every draft is accepted and drops to one more than the accepted count otherwise; after
//! [`MISSES_TO_PAUSE`] verifications in a row accept nothing, drafting pauses for as many steps
//! as misses so far (capped), so free-form text that rarely repeats costs almost nothing.

use std::sync::Arc;

use crate::error::{EngineError, Result};
use crate::kv::KvCache;
use crate::model::decoder::Logits;
use crate::model::Decoder;
use crate::tokenizer::Tokenizer;

/// The most draft tokens a request may ask for per step.
pub const MAX_DRAFT: usize = 64;
/// The longest n-gram a request may ask to match.
pub const MAX_NGRAM: usize = 16;
/// Defaults: up to 8 drafts, matched on the last 3 tokens down to 2 (a draft model: up to 4,
/// each costing one of its passes).
pub const DEFAULT_MAX_DRAFT: usize = 8;
pub const DEFAULT_MODEL_DRAFT: usize = 4;
pub const DEFAULT_NGRAM: usize = 3;
pub const DEFAULT_MIN_NGRAM: usize = 2;
/// Verifications in a row that accept nothing before drafting pauses.
pub const MISSES_TO_PAUSE: u32 = 2;
/// The longest pause, in decode steps.
const MAX_PAUSE: u32 = 32;
/// How far back the lookup searches (tokens before the end of the stream).
const LOOKBACK: usize = 1 << 16;

/// A second model proposing drafts: its weights and tokenizer (shared with the runtime that
/// loaded it, kept alive by the requests that use it).
#[derive(Clone)]
pub struct DraftModel {
    pub decoder: Arc<Decoder>,
    pub tokenizer: Arc<Tokenizer>,
}

impl std::fmt::Debug for DraftModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraftModel").field("vocab_size", &self.decoder.cfg.vocab_size).finish()
    }
}

impl PartialEq for DraftModel {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.decoder, &other.decoder)
    }
}

impl Eq for DraftModel {}

impl DraftModel {
    /// Checks that this model's token ids mean what `tokenizer`'s do (same vocabulary size,
    /// same ids for a probe text with words, digits, code and non-Latin script), so its
    /// drafts can be compared with the target's tokens.
    pub fn check_compatible(&self, vocab_size: usize, tokenizer: &Tokenizer) -> Result<()> {
        const PROBE: &str = "The quick brown fox, 1234567 jumps! fn main() { let x = vec![1, 2]; } Größe 東京 🙂";
        let ours = self.tokenizer.encode(PROBE, false);
        let theirs = tokenizer.encode(PROBE, false);
        if self.decoder.cfg.vocab_size != vocab_size || ours.is_err() || ours != theirs {
            return Err(EngineError::InvalidArgument(format!(
                "speculative.model has another vocabulary (its vocabulary has {} tokens, this model's {vocab_size}, or they tokenize text differently): a draft model must share the target's tokenizer",
                self.decoder.cfg.vocab_size
            )));
        }
        Ok(())
    }
}

/// A request's speculative-decoding settings (`generate(…, { speculative })`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpeculativeOptions {
    /// Draft tokens per step at most (1..=[`MAX_DRAFT`]).
    pub max_draft: usize,
    /// The longest suffix of the stream matched (1..=[`MAX_NGRAM`]); n-gram drafting only.
    pub ngram: usize,
    /// The shortest suffix matched (1..=`ngram`).
    pub min_ngram: usize,
    /// `type: 'draft'`: the model that proposes the drafts.
    pub draft: Option<DraftModel>,
}

impl SpeculativeOptions {
    /// The options of a `type` (`ngram`, or `draft` with its model), checked.
    pub fn new(
        kind: &str,
        max_draft: Option<usize>,
        ngram: Option<usize>,
        min_ngram: Option<usize>,
        draft: Option<DraftModel>,
    ) -> Result<Self> {
        match (kind, draft) {
            ("ngram", None) => Self::ngram(max_draft, ngram, min_ngram),
            ("ngram", Some(_)) => Err(EngineError::InvalidArgument("speculative.model is for type 'draft'".into())),
            ("draft", Some(model)) => {
                if ngram.is_some() || min_ngram.is_some() {
                    return Err(EngineError::InvalidArgument("speculative.ngram and minNgram are for type 'ngram'".into()));
                }
                let mut o = Self::ngram(Some(max_draft.unwrap_or(DEFAULT_MODEL_DRAFT)), None, None)?;
                o.draft = Some(model);
                Ok(o)
            }
            ("draft", None) => {
                Err(EngineError::InvalidArgument("speculative type 'draft' needs a model (a loaded Runtime)".into()))
            }
            (other, _) => {
                Err(EngineError::InvalidArgument(format!("speculative.type must be 'ngram' or 'draft', not {other:?}")))
            }
        }
    }

    /// Checks the ranges, filling what is unset with the defaults.
    pub fn ngram(max_draft: Option<usize>, ngram: Option<usize>, min_ngram: Option<usize>) -> Result<Self> {
        let max_draft = max_draft.unwrap_or(DEFAULT_MAX_DRAFT);
        let ngram = ngram.unwrap_or(DEFAULT_NGRAM);
        let min_ngram = min_ngram.unwrap_or(DEFAULT_MIN_NGRAM.min(ngram));
        if !(1..=MAX_DRAFT).contains(&max_draft) {
            return Err(EngineError::InvalidArgument(format!("speculative.maxDraft must be between 1 and {MAX_DRAFT}")));
        }
        if !(1..=MAX_NGRAM).contains(&ngram) {
            return Err(EngineError::InvalidArgument(format!("speculative.ngram must be between 1 and {MAX_NGRAM}")));
        }
        if !(1..=ngram).contains(&min_ngram) {
            return Err(EngineError::InvalidArgument("speculative.minNgram must be between 1 and speculative.ngram".into()));
        }
        Ok(Self { max_draft, ngram, min_ngram, draft: None })
    }
}

/// The continuation of the latest earlier occurrence of the stream's longest matching suffix
/// (`max_n` tokens down to `min_n`), at most `max_len` tokens; empty when nothing matches.
pub fn lookup(stream: &[u32], max_n: usize, min_n: usize, max_len: usize) -> &[u32] {
    let len = stream.len();
    if max_len == 0 {
        return &[];
    }
    let floor = len.saturating_sub(LOOKBACK);
    for n in (min_n.max(1)..=max_n).rev() {
        if n >= len {
            continue;
        }
        let suffix = &stream[len - n..];
        // Occurrences that end before the suffix starts... or overlap it: any start `i` with a
        // token after the match (`i + n < len`), latest first.
        for i in (floor..len - n).rev() {
            if &stream[i..i + n] == suffix {
                let from = i + n;
                return &stream[from..(from + max_len).min(len)];
            }
        }
    }
    &[]
}

/// Where a request's drafts come from.
enum Source {
    Lookup,
    Model(Box<ModelDrafter>),
    /// The draft model failed (its error is not the request's): plain decoding from then on.
    Off,
}

/// A draft model's state for one request: its cache holds the keys and values of `fed`.
struct ModelDrafter {
    model: DraftModel,
    cache: Option<KvCache>,
    fed: Vec<u32>,
}

impl ModelDrafter {
    /// Up to `want` greedy tokens of the draft model after `stream`; `room` bounds the
    /// positions the request can still reach (sizes the cache on first use).
    fn propose(&mut self, stream: &[u32], want: usize, room: usize) -> Result<Vec<u32>> {
        let d = &self.model.decoder;
        let cache = match &mut self.cache {
            Some(c) => c,
            None => self.cache.insert(d.new_cache(d.max_positions().min(stream.len().saturating_add(room).saturating_add(2)))?),
        };
        // Positions `stream.len() .. stream.len() + want - 1` are evaluated (the last draft is not).
        let want = want.min((cache.max_len() + 1).saturating_sub(stream.len()));
        if want == 0 || stream.is_empty() {
            return Ok(Vec::new());
        }
        // Keep what is still valid: the common prefix, less the last token (its logits are needed).
        let keep = self.fed.iter().zip(stream).take_while(|(a, b)| a == b).count().min(stream.len() - 1);
        cache.truncate(keep);
        self.fed.truncate(keep);
        let mut logits = d.forward(&stream[keep..], cache, Logits::Last)?;
        self.fed.extend_from_slice(&stream[keep..]);
        let mut out = Vec::with_capacity(want);
        loop {
            let (tok, _) = crate::sampling::argmax(&logits.to_vec1::<f32>()?);
            out.push(tok as u32);
            if out.len() == want {
                return Ok(out);
            }
            logits = d.forward(&out[out.len() - 1..], cache, Logits::Last)?;
            self.fed.push(tok as u32);
        }
    }
}

/// A request's drafting state.
pub struct Drafter {
    opts: SpeculativeOptions,
    source: Source,
    /// Draft length to propose next (adapts, 1..=max_draft).
    next_len: usize,
    misses: u32,
    /// Decode steps left without drafting.
    paused: u32,
    /// The drafts being verified in the current pass (appended to the session's stream).
    pending: Vec<u32>,
}

impl Drafter {
    pub fn new(opts: SpeculativeOptions) -> Self {
        let source = match &opts.draft {
            Some(model) => Source::Model(Box::new(ModelDrafter { model: model.clone(), cache: None, fed: Vec::new() })),
            None => Source::Lookup,
        };
        Self { next_len: opts.max_draft, opts, source, misses: 0, paused: 0, pending: Vec::new() }
    }

    /// Drafts in flight (0 when this step decodes plainly).
    pub fn pending(&self) -> &[u32] {
        &self.pending
    }

    /// Proposes drafts to follow `stream` (which ends with the token about to be evaluated), at
    /// most `room` of them; they become [`Self::pending`]. A draft model that fails turns
    /// drafting off for the rest of the request.
    pub fn propose(&mut self, stream: &[u32], room: usize) -> &[u32] {
        self.pending.clear();
        if self.paused > 0 {
            self.paused -= 1;
            return &self.pending;
        }
        let want = self.next_len.min(room);
        match &mut self.source {
            Source::Lookup => self.pending.extend_from_slice(lookup(stream, self.opts.ngram, self.opts.min_ngram, want)),
            Source::Model(m) if want > 0 => match m.propose(stream, want, room) {
                Ok(d) => self.pending = d,
                Err(_) => self.source = Source::Off,
            },
            Source::Model(_) | Source::Off => {}
        }
        &self.pending
    }

    /// Records how many of the pending drafts were accepted and clears them.
    pub fn verified(&mut self, accepted: usize) {
        let drafted = self.pending.len();
        self.pending.clear();
        if drafted == 0 {
            return;
        }
        if accepted == drafted {
            self.next_len = (self.next_len * 2).min(self.opts.max_draft);
        } else {
            self.next_len = (accepted + 1).min(self.opts.max_draft);
        }
        if accepted == 0 {
            self.misses += 1;
            if self.misses >= MISSES_TO_PAUSE {
                self.paused = self.misses.min(MAX_PAUSE);
            }
        } else {
            self.misses = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_copies_what_followed_the_latest_match() {
        // "1 2 3 9 … 1 2 3 7 8 … 2 3" → the latest "2 3" (n=2, as "… 2 3" has no 3-gram match
        // with the 1 before it) is followed by 7 8.
        let s = [1, 2, 3, 9, 5, 1, 2, 3, 7, 8, 4, 2, 3];
        assert_eq!(lookup(&s, 3, 2, 4), &[7, 8, 4, 2]);
        assert_eq!(lookup(&s, 3, 2, 1), &[7]);
        // The longer match wins over a later, shorter one.
        let s = [5, 6, 7, 1, 9, 6, 7, 2, 5, 6, 7];
        assert_eq!(lookup(&s, 3, 2, 2), &[1, 9]);
    }

    #[test]
    fn lookup_stops_at_the_end_of_the_stream_and_finds_nothing_when_nothing_repeats() {
        let s = [1, 2, 3, 1, 2];
        assert_eq!(lookup(&s, 2, 1, 10), &[3, 1, 2]);
        assert!(lookup(&[1, 2, 3, 4], 3, 1, 8).is_empty());
        assert!(lookup(&[], 3, 1, 8).is_empty());
        assert!(lookup(&[7], 3, 1, 8).is_empty());
        assert!(lookup(&[7, 7], 3, 1, 0).is_empty());
        // A run of one token matches itself one position back (overlapping occurrences).
        assert_eq!(lookup(&[4, 4, 4, 4], 2, 2, 5), &[4]);
    }

    #[test]
    fn options_are_range_checked() {
        assert_eq!(SpeculativeOptions::new("ngram", Some(4), None, None, None).unwrap().max_draft, 4);
        for kind in ["draft", "", "NGRAM"] {
            assert_eq!(SpeculativeOptions::new(kind, None, None, None, None).unwrap_err().code(), "INVALID_ARGUMENT");
        }
        assert_eq!(
            SpeculativeOptions::ngram(None, None, None).unwrap(),
            SpeculativeOptions { max_draft: 8, ngram: 3, min_ngram: 2, draft: None }
        );
        assert_eq!(SpeculativeOptions::ngram(None, Some(1), None).unwrap().min_ngram, 1);
        for (d, n, m) in [
            (Some(0), None, None),
            (Some(65), None, None),
            (None, Some(0), None),
            (None, Some(17), None),
            (None, Some(3), Some(4)),
            (None, None, Some(0)),
        ] {
            let e = SpeculativeOptions::ngram(d, n, m).unwrap_err();
            assert_eq!(e.code(), "INVALID_ARGUMENT", "{d:?} {n:?} {m:?}");
        }
    }

    #[test]
    fn draft_length_adapts_and_pauses_after_misses() {
        let mut d = Drafter::new(SpeculativeOptions::ngram(Some(8), Some(1), Some(1)).unwrap());
        let stream: Vec<u32> = (0..40).map(|i| i % 10).collect();
        assert_eq!(d.propose(&stream, 100).len(), 8);
        d.verified(2);
        assert_eq!(d.propose(&stream, 100).len(), 3);
        d.verified(3);
        assert_eq!(d.propose(&stream, 100).len(), 6);
        // `room` caps the proposal.
        d.verified(6);
        assert_eq!(d.propose(&stream, 2).len(), 2);
        d.verified(0);
        assert_eq!(d.propose(&stream, 100).len(), 1);
        d.verified(0);
        // Two misses in a row: two steps without drafts, then drafting resumes.
        assert!(d.propose(&stream, 100).is_empty());
        assert!(d.propose(&stream, 100).is_empty());
        assert_eq!(d.propose(&stream, 100).len(), 1);
        d.verified(1);
        assert_eq!(d.propose(&stream, 100).len(), 2);
    }
}
