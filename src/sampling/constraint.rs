//! Grammar-constrained decoding: the token masks that make output match a JSON schema, a
//! regex or a Lark grammar, built on llguidance.
//!
//! Design note
//! -----------
//! * [`GrammarCompiler`] is made once per model (it holds the token trie: every token's bytes,
//!   see `Tokenizer::token_bytes`) and compiles one [`Constraint`] per request. Compiling
//!   happens where the request is prepared, off the engine thread; an unsupported or
//!   unsatisfiable format fails there, naming the reason.
//! * A [`Constraint`] wraps an llguidance `Matcher`. Per step: [`Constraint::compute_mask`]
//!   (the costly part; the scheduler runs it on a worker while the forward pass runs), the
//!   sampler drops the disallowed tokens ([`Constraint::mask`]) before penalties'
//!   results are tempered and filtered, then [`Constraint::commit`] advances the matcher with
//!   the chosen token. When the grammar is complete and nothing more may follow, the matcher
//!   stops and the request ends (`finishReason: 'stop'`) without waiting for an EOS token.
//! * Ids the model has beyond the tokenizer's vocabulary (padded embedding rows) are never
//!   allowed. The end-of-sequence tokens are allowed exactly when the grammar is complete.
//! * A JSON schema is first made ready ([`super::json_schema`]: objects that do not say
//!   `additionalProperties` are closed unless `strict: false`), and a JSON constraint ends a
//!   degenerate repetition by closing what it can ([`super::loop_guard`]) and refuses a repeated
//!   member name or a repeated item of a `uniqueItems` array ([`super::json_watch`]).
//! * Everything llguidance does runs under its own panic guard and fuel limits
//!   ([`ParserLimits`]); a schema larger than [`MAX_FORMAT_BYTES`] is refused before parsing,
//!   and one whose compilation would recurse too deeply before compiling
//!   ([`super::format_depth`]); compiling runs on threads with [`crate::stack::UNTRUSTED_STACK`].

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use llguidance::api::{GrammarWithLexer, ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{SimpleVob, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

use super::json_watch::{JsonWatch, Outcome, WatchVocab};
use super::loop_guard::LoopGuard;
use crate::error::panic_message;

/// Largest schema, regex or grammar text a request may give.
pub const MAX_FORMAT_BYTES: usize = 1 << 20;

/// What the output must look like (the `responseFormat` option).
#[derive(Clone, Debug)]
pub enum ResponseFormat {
    /// Free text (no constraint).
    Text,
    /// Any JSON object.
    JsonObject,
    /// A JSON value valid against `schema`.
    JsonSchema { schema: Value },
    /// Text matching the regular expression (Rust `regex` syntax), anchored at both ends.
    Regex(String),
    /// Text in the language of a Lark grammar, as llguidance reads it.
    Grammar(String),
    /// A grammar already assembled (tool calls).
    Compiled(TopLevelGrammar),
}

/// Tokenizes bytes the way the model's tokenizer does (llguidance uses it for text a grammar
/// forces).
pub type TokenizeFn = Box<dyn Fn(&[u8]) -> Vec<u32> + Send + Sync>;

/// The vocabulary a [`GrammarCompiler`] works over.
pub struct TokenVocab {
    /// Bytes of each token id (special tokens start with 0xFF); at least the model's vocab.
    pub bytes: Vec<Vec<u8>>,
    /// Ids that end a generation.
    pub eos: Vec<u32>,
    pub tokenize: TokenizeFn,
}

struct Env {
    trie: TokTrie,
    tokenize: TokenizeFn,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        (self.tokenize)(s)
    }
}

/// Compiles response formats into per-request constraints. One per model.
pub struct GrammarCompiler {
    factory: ParserFactory,
    /// The tokens that close a JSON value (`super::loop_guard`).
    closers: Arc<super::loop_guard::Closers>,
    /// What a JSON watch reads (`super::json_watch`).
    watch_vocab: Arc<WatchVocab>,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GrammarCompiler")
    }
}

/// The limits each compiled grammar runs under: llguidance's defaults bound the work of one
/// mask (lexer fuel, Earley items); the grammar size bound is lowered to what a 1 MB schema
/// can need.
fn limits() -> ParserLimits {
    ParserLimits { max_grammar_size: 2_000_000, ..ParserLimits::default() }
}

impl GrammarCompiler {
    pub fn new(vocab: TokenVocab) -> Result<Self, String> {
        let TokenVocab { bytes, eos, tokenize } = vocab;
        let closers = Arc::new(super::loop_guard::closers(&bytes));
        let n = u32::try_from(bytes.len()).map_err(|_| "the vocabulary is too large".to_string())?;
        let eos: Vec<u32> = eos.into_iter().filter(|&e| e < n).collect();
        let Some(&first_eos) = eos.first() else {
            return Err("constrained decoding needs an end-of-sequence token, and this model has none".into());
        };
        let built = catch_unwind(AssertUnwindSafe(|| {
            let info = TokRxInfo::new(n, first_eos);
            let trie = TokTrie::from(&info, &bytes).with_eos_tokens(&eos);
            let env: llguidance::toktrie::TokEnv = Arc::new(Env { trie, tokenize });
            let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
            factory.quiet();
            *factory.limits_mut() = limits();
            Ok::<_, String>(factory)
        }))
        .map_err(|p| format!("cannot build the token trie: {}", panic_message(&*p)))?;
        let factory = built.map_err(|e| format!("cannot build the token trie: {e}"))?;
        Ok(Self { factory, closers, watch_vocab: Arc::new(WatchVocab::new(bytes)) })
    }

    /// The constraint for `format`; `None` for free text. Fails with the reason when the format
    /// is malformed, unsupported or allows no output at all.
    pub fn compile(&self, format: &ResponseFormat) -> Result<Option<Constraint>, String> {
        let grammar = match format {
            ResponseFormat::Text => return Ok(None),
            ResponseFormat::JsonObject => json_grammar(serde_json::json!({ "type": "object" })),
            ResponseFormat::JsonSchema { schema } => {
                check_size("the JSON schema", serde_json::to_string(schema).map_or(usize::MAX, |s| s.len()))?;
                json_grammar(schema.clone())
            }
            ResponseFormat::Regex(rx) => {
                check_size("the regex", rx.len())?;
                TopLevelGrammar::from_regex(rx)
            }
            ResponseFormat::Grammar(lark) => {
                check_size("the grammar", lark.len())?;
                if lark.trim().is_empty() {
                    return Err("the grammar is empty".into());
                }
                TopLevelGrammar::from_lark(lark.clone())
            }
            ResponseFormat::Compiled(g) => g.clone(),
        };
        let json = matches!(format, ResponseFormat::JsonObject | ResponseFormat::JsonSchema { .. } | ResponseFormat::Compiled(_));
        let places = match format {
            ResponseFormat::JsonSchema { schema } => super::unique_items::places(schema)?,
            _ => Vec::new(),
        };
        let mut c = self.build(grammar)?;
        let response = matches!(format, ResponseFormat::JsonObject | ResponseFormat::JsonSchema { .. });
        c.guard = json.then(|| {
            let g = LoopGuard::new(self.closers.clone());
            if response {
                g.with_budget()
            } else {
                g
            }
        });
        c.watch = json.then(|| JsonWatch::new(self.watch_vocab.clone(), Arc::new(places)));
        Ok(Some(c))
    }

    fn build(&self, grammar: TopLevelGrammar) -> Result<Constraint, String> {
        // Measured before llguidance recurses over it (see `format_depth`).
        grammar.grammars.iter().try_for_each(super::format_depth::check_grammar)?;
        let made = catch_unwind(AssertUnwindSafe(|| {
            let mut matcher = Matcher::new(self.factory.create_parser(grammar));
            let first = matcher.compute_mask().map_err(|e| e.to_string());
            (matcher, first)
        }));
        let (matcher, first) = made.map_err(|p| format!("the format could not be compiled: {}", panic_message(&*p)))?;
        if let Some(e) = matcher.get_error() {
            return Err(clean_error(&e));
        }
        let first = first.map_err(|e| clean_error(&e))?;
        if first.is_zero() {
            return Err("the format allows no output at all".into());
        }
        Ok(Constraint { matcher, mask: Some(first), guard: None, watch: None })
    }
}

fn check_size(what: &str, n: usize) -> Result<(), String> {
    if n > MAX_FORMAT_BYTES {
        return Err(format!("{what} is {n} bytes; at most {MAX_FORMAT_BYTES} are accepted"));
    }
    Ok(())
}

/// JSON is written compactly (`{"a": 1, "b": [2, 3]}`): with llguidance's flexible whitespace
/// a sampled model can pad a value with blank lines until it runs out of tokens. A schema's
/// own `x-guidance` settings win.
pub fn json_grammar(mut schema: Value) -> TopLevelGrammar {
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance").or_insert_with(
            || serde_json::json!({ "whitespace_flexible": false, "item_separator": ", ", "key_separator": ": " }),
        );
    }
    TopLevelGrammar::from_grammar(GrammarWithLexer::from_json_schema(schema))
}

/// llguidance appends its parser state to some messages; keep the reason only.
fn clean_error(e: &str) -> String {
    let e = e.split("\n<state>").next().unwrap_or(e).trim();
    let e = e.strip_prefix("Error: ").unwrap_or(e);
    if e.starts_with("NoExtensionBias") {
        return "the format allows no output at all".into();
    }
    let mut s: String = e.chars().take(2000).collect();
    if s.len() < e.len() {
        s.push('…');
    }
    s
}

/// One request's grammar state.
pub struct Constraint {
    matcher: Matcher,
    /// The tokens allowed next, once computed for this step.
    mask: Option<SimpleVob>,
    /// Ends a degenerate repetition (JSON formats only).
    guard: Option<LoopGuard>,
    /// Refuses repeated member names and unique items (JSON formats only).
    watch: Option<JsonWatch>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("stopped", &self.matcher.is_stopped()).finish_non_exhaustive()
    }
}

impl Constraint {
    /// Computes the mask of the next token, unless it is known already.
    pub fn compute_mask(&mut self) -> Result<(), String> {
        if self.mask.is_none() {
            let m = catch_unwind(AssertUnwindSafe(|| self.matcher.compute_mask_or_eos()))
                .map_err(|p| format!("the output constraint failed: {}", panic_message(&*p)))?
                .map_err(|e| format!("the output constraint failed: {}", clean_error(&e.to_string())))?;
            let mut m = m;
            let refused = catch_unwind(AssertUnwindSafe(|| self.repeats(&m)))
                .map_err(|p| format!("the output constraint failed: {}", panic_message(&*p)))?;
            if !refused.is_empty() && refused.len() < m.num_set() {
                refused.into_iter().for_each(|t| m.disallow_token(t));
            }
            if let Some(g) = &self.guard {
                g.narrow(&mut m);
            }
            self.mask = Some(m);
        }
        Ok(())
    }

    /// The tokens of `mask` that would repeat a member name or a unique item, now or (where
    /// the mask is narrow) because every way on from them leads to a repeat; see
    /// `super::json_watch`.
    fn repeats(&mut self, mask: &SimpleVob) -> Vec<u32> {
        let Some(watch) = self.watch.as_ref().filter(|w| w.guarded()) else { return Vec::new() };
        if mask.num_set() > NARROW_MASK {
            return watch.repeats_in(mask);
        }
        let watch = watch.clone();
        let mut budget = LOOKAHEAD_MASKS;
        let mut refused = Vec::new();
        for t in set_tokens(mask) {
            let out = match watch.outcome(t) {
                Outcome::Repeats => true,
                Outcome::Safe => false,
                Outcome::Open => !self.leads_on(&watch, t, 1, &mut budget),
            };
            if out {
                refused.push(t);
            }
        }
        refused
    }

    /// Whether, after `token`, the grammar still allows a way on that does not repeat; `true`
    /// where that cannot be told within the depth and the budget of masks.
    fn leads_on(&mut self, watch: &JsonWatch, token: u32, depth: usize, budget: &mut usize) -> bool {
        if depth > LOOKAHEAD_DEPTH || *budget == 0 || self.matcher.consume_token(token).is_err() {
            return true;
        }
        *budget -= 1;
        let mut after = watch.clone();
        after.push(token);
        let on = match self.matcher.compute_mask() {
            Err(_) => true,
            Ok(m) if m.num_set() > NARROW_MASK => true,
            Ok(m) => {
                let next = set_tokens(&m);
                next.iter().any(|&u| after.outcome(u) == Outcome::Safe)
                    || next.iter().any(|&u| after.outcome(u) == Outcome::Open && self.leads_on(&after, u, depth + 1, budget))
            }
        };
        // The matcher was fine before the token; going back one token cannot fail.
        let _ = self.matcher.rollback(1);
        on
    }

    /// Tells the constraint that the answer may take `remaining` more tokens of `max_tokens`:
    /// near the end a JSON response format closes what it can (`super::loop_guard`).
    pub fn set_remaining(&mut self, remaining: usize, max_tokens: usize) {
        if let Some(g) = &mut self.guard {
            if g.set_remaining(remaining, max_tokens) {
                if let Some(m) = &mut self.mask {
                    g.narrow(m);
                }
            }
        }
    }

    /// The tokens allowed next (after [`Self::compute_mask`]).
    pub fn mask(&self) -> Option<&SimpleVob> {
        self.mask.as_ref()
    }

    /// Advances past `token`; returns `true` when the grammar is complete and nothing more
    /// may follow.
    pub fn commit(&mut self, token: u32) -> Result<bool, String> {
        self.mask = None;
        if let Some(g) = &mut self.guard {
            g.push(token);
        }
        if let Some(w) = &mut self.watch {
            w.push(token);
        }
        catch_unwind(AssertUnwindSafe(|| self.matcher.consume_token(token)))
            .map_err(|p| format!("the output constraint failed: {}", panic_message(&*p)))?
            .map_err(|e| format!("the output constraint failed: {}", clean_error(&e.to_string())))?;
        Ok(self.matcher.is_stopped())
    }

    /// Why the last [`Self::compute_mask`] failed, if it did (then there is no mask).
    pub fn has_mask(&self) -> bool {
        self.mask.is_some()
    }

    /// Whether the output so far is a complete match (EOS would be allowed now).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}

/// A mask of at most this many tokens is narrow: a string there is an enum's or a pattern's,
/// and a repeat may be the only way on from a start (see `Constraint::repeats`). A wider one
/// lets a string go on freely.
const NARROW_MASK: usize = 256;
/// Deepest look ahead, in tokens, for a way on that does not repeat.
const LOOKAHEAD_DEPTH: usize = 16;
/// Most masks computed in one step's look ahead.
const LOOKAHEAD_MASKS: usize = 64;

/// The ids `mask` allows.
fn set_tokens(mask: &SimpleVob) -> Vec<u32> {
    let mut out = Vec::new();
    for (w, &bits) in mask.as_slice().iter().enumerate() {
        let mut bits = bits;
        while bits != 0 {
            out.push((w * 32) as u32 + bits.trailing_zeros());
            bits &= bits - 1;
        }
    }
    out
}

/// Sets every logit the mask disallows (and every id beyond it) to `-inf`.
pub fn apply_mask(mask: &SimpleVob, logits: &mut [f32]) {
    let words = mask.as_slice();
    for (w, chunk) in logits.chunks_mut(32).enumerate() {
        let bits = words.get(w).copied().unwrap_or(0);
        if bits == u32::MAX && chunk.len() == 32 {
            continue;
        }
        for (b, l) in chunk.iter_mut().enumerate() {
            if bits & (1 << b) == 0 {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

#[cfg(test)]
#[path = "constraint_tests.rs"]
mod tests;
