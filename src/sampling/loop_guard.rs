//! Ending a degenerate repetition under a JSON constraint.
//!
//! A small model sampling into a schema that does not bound a string or an array can repeat
//! itself until `maxTokens` (`"1.34.34.34…"`, the same item again and again), and the caller
//! gets a cut-off, invalid object. The grammar allows both continuing and closing, so the
//! constraint itself can end the loop: once the output's last tokens are one short sequence
//! repeated ([`MIN_REPEATS`] times or more, over at least [`MIN_LOOP_TOKENS`] tokens), every
//! later step keeps only the allowed tokens made of closing bytes alone: those that begin with
//! `"` whenever the grammar allows one (closing a string), else `]` and `}` where nothing that
//! begins with a letter or a digit is allowed (between values: inside a string they are text).
//! Where neither applies (a string whose pattern needs more), the token that would continue
//! the repetition is refused instead, if anything else is allowed. The object then closes as soon as the schema
//! lets it, with its required members still written, and the answer ends with `stop`.
//!
//! The same closing starts when an answer to a JSON response format (`json_object`,
//! `json_schema`) nears its `maxTokens`: within the last quarter of the budget, at most
//! [`CLOSING_MARGIN`] tokens. A small model that keeps adding items to an array the schema
//! does not bound would otherwise be cut off mid-object (`finishReason: 'length'`, text that
//! does not parse); it closes the array at the next item boundary and the object when its
//! required members are in, and ends with `stop`. Forced tool calls keep running to the budget.
//!
//! Only JSON formats (`json_object`, `json_schema`, forced tool calls) have a guard: in a
//! regex or a Lark grammar those bytes mean nothing in particular.

use std::sync::Arc;

use llguidance::toktrie::SimpleVob;

/// Fewest tokens a repetition spans before it counts as a loop.
pub const MIN_LOOP_TOKENS: usize = 32;
/// Fewest times the repeated sequence occurs.
pub const MIN_REPEATS: usize = 4;
/// Longest repeated sequence looked for, in tokens.
pub const MAX_PERIOD: usize = 32;
/// Most of an answer's last tokens in which a JSON response format closes what it can.
pub const CLOSING_MARGIN: usize = 128;

/// The tokens at the end of a `max_tokens` budget in which a JSON response format closes what it
/// can: a quarter of it, at most [`CLOSING_MARGIN`] (none for a budget under 4 tokens).
pub fn closing_margin(max_tokens: usize) -> usize {
    (max_tokens / 4).min(CLOSING_MARGIN)
}

/// The tokens made only of closing bytes (special tokens never), over `bytes` (each token's
/// bytes, as the grammar compiler's vocabulary holds them): first those that begin with `"`
/// (closing a string), then those of `]` and `}` alone.
pub fn closers(bytes: &[Vec<u8>]) -> Closers {
    let mut quote = SimpleVob::alloc(bytes.len());
    let mut bracket = SimpleVob::alloc(bytes.len());
    for (id, b) in bytes.iter().enumerate() {
        if b.is_empty() || !b.iter().all(|c| matches!(c, b'"' | b']' | b'}')) {
            continue;
        }
        if b[0] == b'"' {
            quote.allow_token(id as u32);
        } else {
            bracket.allow_token(id as u32);
        }
    }
    let mut words = SimpleVob::alloc(bytes.len());
    let mut reopen = SimpleVob::alloc(bytes.len());
    for (id, b) in bytes.iter().enumerate() {
        if b.first().is_some_and(u8::is_ascii_alphanumeric) {
            words.allow_token(id as u32);
        }
        if b.first().is_some_and(|c| matches!(c, b']' | b'}')) && b.contains(&b',') {
            reopen.allow_token(id as u32);
        }
    }
    Closers { quote, bracket, words, reopen }
}

/// See [`closers`].
#[derive(Debug)]
pub struct Closers {
    quote: SimpleVob,
    bracket: SimpleVob,
    /// Tokens that begin with a letter or a digit (allowed inside strings and values).
    words: SimpleVob,
    /// Tokens that close a value and go on to the next one (`},`, `}, {`): refused while
    /// closing, where anything else is allowed.
    reopen: SimpleVob,
}

/// One request's watch for a loop.
#[derive(Debug)]
pub struct LoopGuard {
    closers: Arc<Closers>,
    /// The last tokens (at most `2 * MAX_PERIOD * MIN_REPEATS` kept).
    recent: Vec<u32>,
    /// The period of the last loop seen: close what can be closed from then on.
    period: Option<usize>,
    /// Whether the answer's budget closes it too (JSON response formats, see the module note).
    budget: bool,
    /// Whether the budget is nearly spent: close what can be closed from then on.
    short: bool,
}

impl LoopGuard {
    pub fn new(closers: Arc<Closers>) -> Self {
        Self { closers, recent: Vec::new(), period: None, budget: false, short: false }
    }

    /// The guard of a JSON response format: it also closes what it can near the end of the
    /// answer's budget ([`Self::set_remaining`]).
    pub fn with_budget(mut self) -> Self {
        self.budget = true;
        self
    }

    /// Tells the guard that the answer may take `remaining` more tokens of `max_tokens`; `true`
    /// when that starts the closing now.
    pub fn set_remaining(&mut self, remaining: usize, max_tokens: usize) -> bool {
        if !self.budget || self.short || remaining > closing_margin(max_tokens) {
            return false;
        }
        self.short = true;
        true
    }

    /// Whether a loop was seen or the budget is nearly spent.
    pub fn closing(&self) -> bool {
        self.period.is_some() || self.short
    }

    /// Records the token just committed.
    pub fn push(&mut self, token: u32) {
        self.recent.push(token);
        let keep = MAX_PERIOD * MIN_REPEATS;
        if self.recent.len() > 2 * keep {
            self.recent.drain(..self.recent.len() - keep);
        }
        if let Some(p) = looping(&self.recent) {
            self.period = Some(p);
        }
    }

    /// Narrows `mask` once a loop was seen or the budget is nearly spent (see the module note); a
    /// mask that would be left empty stays as it is.
    pub fn narrow(&self, mask: &mut SimpleVob) {
        if !self.closing() {
            return;
        }
        let c = &*self.closers;
        if mask.len() != c.quote.len() {
            return;
        }
        if !mask.and_is_zero(&c.reopen) {
            let mut rest = mask.clone();
            rest.sub(&c.reopen);
            if !rest.is_zero() {
                *mask = rest;
            }
        }
        if !mask.and_is_zero(&c.quote) {
            mask.and(&c.quote);
            return;
        }
        if mask.and_is_zero(&c.words) && !mask.and_is_zero(&c.bracket) {
            mask.and(&c.bracket);
            return;
        }
        // No closer: refuse what would repeat the loop once more.
        let Some(p) = self.period else { return };
        if let Some(&next) = self.recent.len().checked_sub(p).and_then(|i| self.recent.get(i)) {
            if mask.is_allowed(next) && mask.num_set() > 1 {
                mask.disallow_token(next);
            }
        }
    }
}

/// The period when `tokens` end with one sequence of at most [`MAX_PERIOD`] tokens repeated at
/// least [`MIN_REPEATS`] times over at least [`MIN_LOOP_TOKENS`] tokens.
pub fn looping(tokens: &[u32]) -> Option<usize> {
    (1..=MAX_PERIOD).find(|&p| {
        let need = (p * MIN_REPEATS).max(MIN_LOOP_TOKENS);
        tokens.len() >= need && {
            let tail = &tokens[tokens.len() - need..];
            (p..need).all(|i| tail[i] == tail[i - p])
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repetitions_long_enough_are_loops() {
        assert_eq!(looping(&[7; 32]), Some(1));
        assert_eq!(looping(&[7; 31]), None);
        let period: Vec<u32> = (0..10).collect();
        let four: Vec<u32> = period.iter().cycle().take(40).copied().collect();
        assert_eq!(looping(&four), Some(10));
        assert_eq!(looping(&four[..39]), None);
        // A prefix before the loop does not matter; a change inside it does.
        let mut t: Vec<u32> = (100..150).collect();
        t.extend(&four);
        assert_eq!(looping(&t), Some(10));
        let at = t.len() - 5;
        t[at] = 99;
        assert_eq!(looping(&t), None);
        let distinct: Vec<u32> = (0..200).collect();
        assert_eq!(looping(&distinct), None);
    }

    #[test]
    fn near_the_end_of_its_budget_a_response_format_closes() {
        // 0 `"`, 1 `a`, 2 `]`, 3 `}}`, 4 `,`, 5 `},` (closes an item and opens the next), 6 `7`.
        let bytes: Vec<Vec<u8>> =
            vec![b"\"".to_vec(), b"a".to_vec(), b"]".to_vec(), b"}}".to_vec(), b",".to_vec(), b"},".to_vec(), b"7".to_vec()];
        let closers = Arc::new(closers(&bytes));
        let between = || {
            let mut m = SimpleVob::alloc(bytes.len());
            [2, 3, 4].iter().for_each(|&t| m.allow_token(t));
            m
        };
        let mut g = LoopGuard::new(closers.clone()).with_budget();
        assert_eq!(closing_margin(512), CLOSING_MARGIN);
        assert_eq!((closing_margin(100), closing_margin(3), closing_margin(4096)), (25, 0, CLOSING_MARGIN));
        assert!(!g.set_remaining(129, 512), "outside the margin");
        let mut m = between();
        g.narrow(&mut m);
        assert_eq!(m.to_list(), vec![2, 3, 4]);
        assert!(g.set_remaining(128, 512), "the margin starts the closing");
        assert!(!g.set_remaining(10, 512), "once");
        assert!(g.closing());
        g.narrow(&mut m);
        assert_eq!(m.to_list(), vec![2, 3], "a bracket, not another item");
        // After a number's digit: more digits, or a closer; not the token that closes the item
        // and opens the next one.
        let mut after_digit = SimpleVob::alloc(bytes.len());
        [3, 5, 6].iter().for_each(|&t| after_digit.allow_token(t));
        g.narrow(&mut after_digit);
        assert_eq!(after_digit.to_list(), vec![3, 6]);
        // Without a closer and without a loop, nothing is refused.
        let mut words = SimpleVob::alloc(bytes.len());
        [1, 4].iter().for_each(|&t| words.allow_token(t));
        g.narrow(&mut words);
        assert_eq!(words.to_list(), vec![1, 4]);
        // A tool call's guard (no budget) and a budget of 3 tokens never start it.
        let mut tool = LoopGuard::new(closers.clone());
        assert!(!tool.set_remaining(0, 512) && !tool.closing());
        let mut tiny = LoopGuard::new(closers).with_budget();
        assert!(!tiny.set_remaining(1, 3) && !tiny.closing());
    }

    #[test]
    fn after_a_loop_closing_tokens_win_quotes_first() {
        // 0 `"`, 1 `a`, 2 `]`, 3 `}}`, 4 `,`, 5 a special token, 6 `", "` (closes and opens), 7 `"]`.
        let bytes: Vec<Vec<u8>> = vec![
            b"\"".to_vec(),
            b"a".to_vec(),
            b"]".to_vec(),
            b"}}".to_vec(),
            b",".to_vec(),
            vec![0xFF, b'"'],
            b"\", \"".to_vec(),
            b"\"]".to_vec(),
        ];
        let mut g = LoopGuard::new(Arc::new(closers(&bytes)));
        let mut mask = SimpleVob::alloc_ones(bytes.len());
        g.narrow(&mut mask);
        assert_eq!(mask.num_set(), bytes.len(), "no loop yet: unchanged");
        for _ in 0..32 {
            g.push(1);
        }
        assert!(g.closing());
        g.narrow(&mut mask);
        assert_eq!(mask.to_list(), vec![0, 7]);
        // Outside a string: the brackets.
        let mut between = SimpleVob::alloc(bytes.len());
        [2, 3, 4].iter().for_each(|&t| between.allow_token(t));
        g.narrow(&mut between);
        assert_eq!(between.to_list(), vec![2, 3]);
        // No closer allowed: the token that would repeat the loop is refused, unless it is all.
        let mut no_closer = SimpleVob::alloc(bytes.len());
        [1, 4].iter().for_each(|&t| no_closer.allow_token(t));
        g.narrow(&mut no_closer);
        assert_eq!(no_closer.to_list(), vec![4]);
        // Brackets among letters are text inside a string: only the repetition is refused.
        let mut in_string = SimpleVob::alloc(bytes.len());
        [1, 2, 3].iter().for_each(|&t| in_string.allow_token(t));
        g.narrow(&mut in_string);
        assert_eq!(in_string.to_list(), vec![2, 3]);
        let mut only_a = SimpleVob::alloc(bytes.len());
        only_a.allow_token(1);
        g.narrow(&mut only_a);
        assert_eq!(only_a.to_list(), vec![1]);
        // The history stays bounded.
        for i in 0..10_000 {
            g.push(i);
        }
        assert!(g.recent.len() <= 2 * MAX_PERIOD * MIN_REPEATS);
    }
}
