//! The expert router: a pure function from a query (its text and, when experts carry
//! examples, its embedding) and the loaded experts' routing data to a decision with scores and
//! a reason. `Engine::route` feeds it; nothing here touches the model.
//!
//! For each expert with keywords or examples:
//!
//! ```text
//! keyword score = (keyword hits − 2 · exclude hits) · priority          (priority defaults to 1)
//! similarity    = max over the expert's examples of cos(query, example)
//! rival         = max(cos to the nearest generic reference query, the other experts' similarities)
//! score         = weights.keywords · keyword score + weights.similarity · (similarity − rival)
//! ```
//!
//! Embeddings are the base model's last-token final hidden states. A decoder's hidden states
//! share a large common component (raw cosines of unrelated texts sit near 0.9), so every
//! vector is first centred on the mean of all example and reference embeddings and scaled to
//! unit length. The similarity term is then how much closer the query is to this expert's
//! examples than to everyday chat ([`DEFAULT_GENERIC_EXAMPLES`]) or to any other expert's
//! examples: only the nearest expert gains from similarity, and a query that touches two
//! domains gets both through their keywords.
//!
//! Experts whose score reaches `threshold` are chosen, at most `max_experts`, best first (ties:
//! higher priority, then name). A query that matches the generic patterns (greetings, thanks,
//! questions about the assistant, one-word inputs…) stays on the base model unless an expert
//! has at least `generic_min_keyword_hits` net keyword hits. An expert with neither keywords
//! nor examples is never chosen.
//!
//! Keywords match case-insensitively on whole words: text is split into words by Unicode word
//! boundaries (UAX #29, so Cyrillic, Greek, accented Latin work, and CJK text splits per
//! ideograph), and a keyword — one word or a phrase — must equal a run of consecutive words. A
//! keyword word also matches its English plural or singular (`file`/`files`,
//! `process`/`processes`), and one of six letters or more a one-edit misspelling (a letter
//! added, dropped, changed or two swapped) that keeps its first and last letters (`databse`,
//! `direcotry`; not `processed` for `processes`, nor `shall` for `shell`). A keyword never
//! matches inside a longer word.

use std::collections::HashMap;

use regex::{RegexSet, RegexSetBuilder};
use unicode_segmentation::UnicodeSegmentation;

use crate::error::{EngineError, Result};

/// The built-in generic-query patterns (case-insensitive regexes over the query, trimmed and
/// lowercased). `setRouter({ genericPatterns })` replaces them.
pub const DEFAULT_GENERIC_PATTERNS: &[&str] = &[
    // Greetings and farewells, in a few languages.
    r"^(hi|hello|hey|hiya|howdy|yo|greetings|good (morning|afternoon|evening|night)|bonjour|salut|hola|hallo|ciao|olá|привет)\b",
    r"^(bye|goodbye|see you|good night|au revoir|adios|tschüss)\b",
    // Thanks and acknowledgements.
    r"\b(thanks|thank you|thx|ty|cheers|merci|gracias|danke)\b",
    r"^(ok|okay|cool|nice|great|awesome|perfect|got it|sure|yes|no|yep|nope|lol|haha)\W*$",
    // Small talk and questions about the assistant itself.
    r"\bhow are (you|u)\b|\bhow('s| is) it going\b|\bwhat'?s up\b",
    r"\bwho (are|made|built|created|trained) you\b|\bwhat are you\b|\bwhat('s| is) your name\b",
    r"\babout yourself\b|\bare you (a |an )?(bot|robot|human|ai|person|real)\b|\byour (name|purpose|creator)\b",
    r"\b(tell|give) me a (joke|story|fun fact)\b|\bi('m| am) (bored|tired|happy|sad)\b",
    r"^what can you do\b|^(can|could) you help( me)?\W*$|^help\W*$",
];

/// Everyday queries that belong to no expert: the reference the similarity term is measured
/// against (embedded once per runtime, when the first expert with examples loads).
pub const DEFAULT_GENERIC_EXAMPLES: &[&str] = &[
    "hello, how are you?",
    "thanks a lot!",
    "who are you?",
    "tell me a joke",
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain photosynthesis simply.",
    "What should I cook tonight?",
    "Can you help me plan a trip to Italy?",
    "Why is the sky blue?",
    "Give me some tips to sleep better.",
    "Summarize the plot of Hamlet.",
    "What is a good name for a cat?",
    "How do I bake bread at home?",
    "Tell me about the history of Rome.",
    "What time is it in Tokyo?",
];

/// A routed query's embedding and the generic references', raw (the router centres them).
pub struct Embedded<'a> {
    pub query: &'a [f32],
    pub generic: &'a [Vec<f32>],
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Weights {
    pub keywords: f64,
    pub similarity: f64,
}

/// Router tuning; see [`RouterSettings::default`] for the values and the module docs for
/// their meaning.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterSettings {
    pub threshold: f64,
    pub max_experts: usize,
    pub generic_patterns: Vec<String>,
    pub weights: Weights,
    /// Chat input: how many earlier user turns join the last one in the routed text.
    pub history_turns: usize,
    /// A generic query goes to an expert only with at least this many net keyword hits.
    pub generic_min_keyword_hits: usize,
}

impl Default for RouterSettings {
    fn default() -> Self {
        Self {
            threshold: 0.5,
            max_experts: 2,
            generic_patterns: DEFAULT_GENERIC_PATTERNS.iter().map(|s| s.to_string()).collect(),
            weights: Weights { keywords: 1.0, similarity: 2.0 },
            history_turns: 0,
            generic_min_keyword_hits: 2,
        }
    }
}

/// Longest generic pattern accepted (bytes), and the compiled set's size limit: user patterns
/// are untrusted input.
const MAX_PATTERN_BYTES: usize = 4096;
const MAX_PATTERNS: usize = 256;
const REGEX_SIZE_LIMIT: usize = 2 << 20;

/// A keyword or exclude keyword, split into lowercase words.
#[derive(Clone, Debug)]
pub struct Keyword {
    pub text: String,
    words: Vec<String>,
}

impl Keyword {
    pub fn new(text: &str) -> Self {
        Self { text: text.to_string(), words: words(text) }
    }

    /// Whether the keyword matches at `query[p..]`.
    fn matches_at(&self, query: &[String], p: usize) -> bool {
        let k = self.words.len();
        k > 0 && p + k <= query.len() && query[p..p + k].iter().zip(&self.words).all(|(q, kw)| word_matches(q, kw))
    }

    #[cfg(test)]
    fn found_in(&self, query: &[String]) -> bool {
        (0..query.len()).any(|p| self.matches_at(query, p))
    }
}

/// A keyword of one candidate: which candidate, which keyword, exclude or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Slot {
    cand: usize,
    exclude: bool,
    kw: usize,
}

/// Where the candidates' keywords can match, so that routing over many experts costs a few
/// lookups per query word rather than a comparison per keyword: each keyword is indexed by its
/// first word (and that word's singular), and long first words also by their first and last
/// letters for the misspelling rule; a hit is then checked in full ([`Keyword::matches_at`]).
/// Build it once per set of experts ([`KeywordIndex::new`]).
#[derive(Default)]
pub struct KeywordIndex {
    exact: HashMap<String, Vec<Slot>>,
    fuzzy: HashMap<(char, char), Vec<Slot>>,
}

/// `w` without a plural `s` / `es` (stems of three letters or more).
fn stems(w: &str) -> impl Iterator<Item = &str> {
    let s = w.strip_suffix('s');
    let es = s.and_then(|s| s.strip_suffix('e'));
    [s, es].into_iter().flatten().filter(|x| x.chars().nth(2).is_some())
}

impl KeywordIndex {
    pub fn new(candidates: &[Candidate]) -> Self {
        let mut ix = Self::default();
        for (cand, c) in candidates.iter().enumerate() {
            for (exclude, list) in [(false, c.keywords), (true, c.exclude_keywords)] {
                for (kw, k) in list.iter().enumerate() {
                    let Some(first) = k.words.first() else { continue };
                    let slot = Slot { cand, exclude, kw };
                    for v in std::iter::once(first.as_str()).chain(stems(first)) {
                        ix.exact.entry(v.to_string()).or_default().push(slot);
                    }
                    if first.chars().nth(5).is_some() {
                        let ends = (first.chars().next().unwrap_or(' '), first.chars().next_back().unwrap_or(' '));
                        ix.fuzzy.entry(ends).or_default().push(slot);
                    }
                }
            }
        }
        ix
    }

    /// The keywords (of `candidates`, the set the index was built from) found in `query`'s
    /// words, sorted by candidate.
    fn hits(&self, query: &[String], candidates: &[Candidate]) -> Vec<Slot> {
        let mut found = Vec::new();
        for (p, w) in query.iter().enumerate() {
            let exact = std::iter::once(w.as_str()).chain(stems(w)).filter_map(|v| self.exact.get(v)).flatten();
            let ends = (w.chars().next().unwrap_or(' '), w.chars().next_back().unwrap_or(' '));
            let fuzzy = self.fuzzy.get(&ends).into_iter().flatten();
            for &slot in exact.chain(fuzzy) {
                let Some(c) = candidates.get(slot.cand) else { continue };
                let list = if slot.exclude { c.exclude_keywords } else { c.keywords };
                if list.get(slot.kw).is_some_and(|k| k.matches_at(query, p)) {
                    found.push(slot);
                }
            }
        }
        found.sort_unstable();
        found.dedup();
        found
    }
}

/// The lowercase words of `text` (Unicode word boundaries; punctuation dropped).
pub fn words(text: &str) -> Vec<String> {
    text.unicode_words().map(|w| w.to_lowercase()).collect()
}

/// `q` is `kw`, its plural or singular, or (for keywords of six letters or more) one edit away
/// with the same first and last letters.
fn word_matches(q: &str, kw: &str) -> bool {
    if q == kw || plural_of(q, kw) || plural_of(kw, q) {
        return true;
    }
    // Cheap rejections first (a route compares every query word with every keyword word).
    if kw.len() < 6
        || q.len().abs_diff(kw.len()) > 4
        || q.chars().next() != kw.chars().next()
        || q.chars().next_back() != kw.chars().next_back()
    {
        return false;
    }
    if q.is_ascii() && kw.is_ascii() {
        let (a, b) = (q.as_bytes(), kw.as_bytes());
        return a.len().abs_diff(b.len()) <= 1 && within_one_edit(a, b);
    }
    let (a, b): (Vec<char>, Vec<char>) = (q.chars().collect(), kw.chars().collect());
    b.len() >= 6 && a.len().abs_diff(b.len()) <= 1 && within_one_edit(&a, &b)
}

/// `plural` is `word` + `s` or `es` (words of three letters or more).
fn plural_of(plural: &str, word: &str) -> bool {
    plural.len() > word.len()
        && word.chars().nth(2).is_some()
        && plural.strip_suffix('s').is_some_and(|stem| stem == word || stem.strip_suffix('e') == Some(word))
}

/// Optimal-string-alignment distance ≤ 1 (insertion, deletion, substitution, transposition).
fn within_one_edit<T: PartialEq>(a: &[T], b: &[T]) -> bool {
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    let p = short.iter().zip(long).take_while(|(x, y)| x == y).count();
    if short.len() == long.len() {
        if p == short.len() {
            return true;
        }
        // One substitution, or one transposition of neighbours.
        short[p + 1..] == long[p + 1..]
            || (p + 1 < short.len() && short[p] == long[p + 1] && short[p + 1] == long[p] && short[p + 2..] == long[p + 2..])
    } else {
        // One insertion into the shorter word.
        short[p..] == long[p + 1..]
    }
}

/// What the router knows of one loaded expert.
pub struct Candidate<'a> {
    pub name: &'a str,
    pub keywords: &'a [Keyword],
    pub exclude_keywords: &'a [Keyword],
    pub priority: f64,
    /// Example embeddings, raw (empty when the manifest has no examples).
    pub examples: &'a [Vec<f32>],
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct ExpertScore {
    pub name: String,
    pub score: f64,
    pub keyword_hits: Vec<String>,
    pub exclude_hits: Vec<String>,
    pub similarity: Option<f64>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Decision {
    /// The query's similarity to the nearest generic reference query (with an embedding).
    pub generic_similarity: Option<f64>,
    /// Chosen, best first; empty = the base model.
    pub experts: Vec<String>,
    pub generic: bool,
    /// Every routable expert with something to say about the query (a keyword or exclude hit,
    /// or a similarity), best first.
    pub scores: Vec<ExpertScore>,
    pub reason: String,
}

pub struct Router {
    settings: RouterSettings,
    generic: RegexSet,
}

impl Router {
    /// Checks and compiles `settings` (`INVALID_ARGUMENT` naming what is wrong).
    pub fn new(settings: RouterSettings) -> Result<Self> {
        let bad = |m: String| EngineError::InvalidArgument(format!("router: {m}"));
        if !settings.threshold.is_finite() {
            return Err(bad("threshold must be a finite number".into()));
        }
        if settings.max_experts == 0 || settings.max_experts > 64 {
            return Err(bad("maxExperts must be between 1 and 64".into()));
        }
        let w = &settings.weights;
        if !(w.keywords.is_finite() && w.similarity.is_finite()) {
            return Err(bad("weights must be finite numbers".into()));
        }
        if settings.generic_patterns.len() > MAX_PATTERNS {
            return Err(bad(format!("at most {MAX_PATTERNS} generic patterns")));
        }
        if let Some(p) = settings.generic_patterns.iter().find(|p| p.len() > MAX_PATTERN_BYTES) {
            return Err(bad(format!("a generic pattern is {} bytes long (at most {MAX_PATTERN_BYTES})", p.len())));
        }
        let generic = RegexSetBuilder::new(&settings.generic_patterns)
            .case_insensitive(true)
            .size_limit(REGEX_SIZE_LIMIT)
            .dfa_size_limit(REGEX_SIZE_LIMIT)
            .build()
            .map_err(|e| bad(format!("a generic pattern does not compile: {e}")))?;
        Ok(Self { settings, generic })
    }

    pub fn settings(&self) -> &RouterSettings {
        &self.settings
    }

    /// Whether any expert would use a query embedding (one has examples).
    pub fn wants_embedding(candidates: &[Candidate]) -> bool {
        candidates.iter().any(|c| !c.examples.is_empty())
    }

    /// Routes `query`; `embedding` holds its embedding and the generic references' (`None`
    /// when no candidate has examples).
    pub fn route(&self, query: &str, embedding: Option<Embedded>, candidates: &[Candidate]) -> Decision {
        self.route_indexed(query, embedding, candidates, &KeywordIndex::new(candidates))
    }

    /// [`Self::route`] with the candidates' keyword index built beforehand (reused while the
    /// loaded experts stay the same).
    pub fn route_indexed(
        &self,
        query: &str,
        embedding: Option<Embedded>,
        candidates: &[Candidate],
        index: &KeywordIndex,
    ) -> Decision {
        let s = &self.settings;
        let q = words(query);
        let normalized = query.trim().to_lowercase();
        let generic = q.len() <= 1 || self.generic.is_match(&normalized);
        let space = embedding.and_then(|e| Space::new(e, candidates));
        let generic_similarity = space.as_ref().filter(|sp| !sp.generic.is_empty()).map(|sp| sp.nearest(&sp.generic));

        let mut scores: Vec<(ExpertScore, f64, i64)> = Vec::new();
        let found = index.hits(&q, candidates);
        let sims: Vec<Option<f64>> = candidates
            .iter()
            .map(|c| space.as_ref().filter(|_| !c.examples.is_empty()).map(|sp| sp.nearest_raw(c.examples)))
            .collect();
        for (i, c) in candidates.iter().enumerate() {
            if c.keywords.is_empty() && c.examples.is_empty() {
                continue;
            }
            let mine = &found[found.partition_point(|s| s.cand < i)..found.partition_point(|s| s.cand <= i)];
            // An expert with nothing to say about this query (no hit, no embedding) is left out
            // of the scores: with many experts loaded, most are.
            if sims[i].is_none() && mine.is_empty() {
                continue;
            }
            let text = |s: &Slot| if s.exclude { &c.exclude_keywords[s.kw] } else { &c.keywords[s.kw] }.text.clone();
            let hits: Vec<String> = mine.iter().filter(|s| !s.exclude).map(text).collect();
            let excl: Vec<String> = mine.iter().filter(|s| s.exclude).map(text).collect();
            let net = hits.len() as i64 - 2 * excl.len() as i64;
            let similarity = sims[i];
            let rival = sims
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .filter_map(|(_, s)| *s)
                .chain(generic_similarity)
                .fold(f64::NEG_INFINITY, f64::max);
            let margin = similarity.map_or(0.0, |a| if rival.is_finite() { a - rival } else { a });
            let score = s.weights.keywords * net as f64 * c.priority + s.weights.similarity * margin;
            let score = if score.is_finite() { score } else { f64::NEG_INFINITY };
            scores.push((
                ExpertScore { name: c.name.to_string(), score, keyword_hits: hits, exclude_hits: excl, similarity },
                c.priority,
                net,
            ));
        }
        scores.sort_by(|a, b| b.0.score.total_cmp(&a.0.score).then(b.1.total_cmp(&a.1)).then_with(|| a.0.name.cmp(&b.0.name)));

        let strong = s.generic_min_keyword_hits as i64;
        let chosen: Vec<&(ExpertScore, f64, i64)> = scores
            .iter()
            .filter(|(e, _, net)| e.score >= s.threshold && (!generic || *net >= strong))
            .take(s.max_experts)
            .collect();
        let experts: Vec<String> = chosen.iter().map(|(e, _, _)| e.name.clone()).collect();
        let routable = candidates.iter().filter(|c| !c.keywords.is_empty() || !c.examples.is_empty()).count();
        let reason = reason(&experts, generic, &scores, (candidates.len(), routable), s);
        Decision { generic_similarity, experts, generic, scores: scores.into_iter().map(|(e, _, _)| e).collect(), reason }
    }
}

fn reason(
    experts: &[String],
    generic: bool,
    scores: &[(ExpertScore, f64, i64)],
    (loaded, routable): (usize, usize),
    s: &RouterSettings,
) -> String {
    let describe = |e: &ExpertScore| {
        let mut parts = vec![format!("score {:.2}", e.score)];
        if !e.keyword_hits.is_empty() {
            parts.push(format!("keywords {}", e.keyword_hits.join(", ")));
        }
        if !e.exclude_hits.is_empty() {
            parts.push(format!("excluded by {}", e.exclude_hits.join(", ")));
        }
        if let Some(sim) = e.similarity {
            parts.push(format!("similarity {sim:.2}"));
        }
        format!("{} ({})", e.name, parts.join("; "))
    };
    if scores.is_empty() {
        return if loaded == 0 {
            "base model: no experts are loaded".into()
        } else if routable == 0 {
            "base model: no loaded expert has routing keywords or examples".into()
        } else if generic {
            "base model: a generic query, and no expert's keywords match".into()
        } else {
            "base model: no expert's keywords match the query".into()
        };
    }
    if !experts.is_empty() {
        let picked: Vec<String> =
            experts.iter().filter_map(|n| scores.iter().find(|e| &e.0.name == n)).map(|e| describe(&e.0)).collect();
        return format!("chose {}", picked.join(" and "));
    }
    let best = describe(&scores[0].0);
    if generic && scores[0].0.score >= s.threshold {
        format!("base model: a generic query, and no expert has {} keyword hits (best {best})", s.generic_min_keyword_hits)
    } else if generic {
        format!("base model: a generic query (best {best})")
    } else {
        format!("base model: no expert reached the threshold {:.2} (best {best})", s.threshold)
    }
}

/// The centred embedding space of one routing call.
struct Space {
    mean: Vec<f64>,
    query: Vec<f64>,
    generic: Vec<Vec<f64>>,
}

impl Space {
    /// `None` when the vectors do not fit together (lengths differ, or nothing to centre on).
    fn new(e: Embedded, candidates: &[Candidate]) -> Option<Self> {
        let dim = e.query.len();
        let all: Vec<&Vec<f32>> = candidates.iter().flat_map(|c| c.examples).chain(e.generic).collect();
        if dim == 0 || all.is_empty() || all.iter().any(|v| v.len() != dim) {
            return None;
        }
        let mut mean = vec![0.0f64; dim];
        for v in &all {
            mean.iter_mut().zip(v.iter()).for_each(|(m, &x)| *m += x as f64);
        }
        let n = all.len() as f64;
        mean.iter_mut().for_each(|m| *m /= n);
        let mut sp = Self { mean, query: Vec::new(), generic: Vec::new() };
        sp.query = sp.centre(e.query);
        sp.generic = e.generic.iter().map(|g| sp.centre(g)).collect();
        Some(sp)
    }

    /// `v` minus the mean, at unit length.
    fn centre(&self, v: &[f32]) -> Vec<f64> {
        let mut c: Vec<f64> = v.iter().zip(&self.mean).map(|(&x, m)| x as f64 - m).collect();
        let n = c.iter().map(|x| x * x).sum::<f64>().sqrt();
        if n > 0.0 && n.is_finite() {
            c.iter_mut().for_each(|x| *x /= n);
        }
        c
    }

    fn nearest(&self, set: &[Vec<f64>]) -> f64 {
        let cos = |v: &Vec<f64>| v.iter().zip(&self.query).map(|(a, b)| a * b).sum::<f64>();
        set.iter().map(cos).fold(f64::NEG_INFINITY, f64::max).clamp(-1.0, 1.0)
    }

    fn nearest_raw(&self, set: &[Vec<f32>]) -> f64 {
        let centred: Vec<Vec<f64>> = set.iter().map(|v| self.centre(v)).collect();
        self.nearest(&centred)
    }
}

/// `v` scaled to unit length (unchanged when it is zero or not finite).
pub fn normalize(v: &mut [f32]) {
    let n = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if n > 0.0 && n.is_finite() {
        v.iter_mut().for_each(|x| *x = (*x as f64 / n) as f32);
    }
}

#[cfg(test)]
#[path = "router_tests.rs"]
mod tests;
