//! Following a JSON output token by token to refuse what the grammar cannot: a member name
//! an object already has, and an item a unique array already holds.
//!
//! Design note
//! -----------
//! * The grammar (llguidance) checks the shape of the output but keeps no memory of values,
//!   so it lets a model write `{"go": 1, "go": 2}` into an open object, or `["a", "a"]` into
//!   an array whose schema says `uniqueItems: true`. A [`JsonWatch`] reads the committed
//!   tokens' bytes with a small JSON scanner (containers, member names, scalar items) and,
//!   before each draw, takes out of the grammar's mask the tokens that would complete a member
//!   name the object already has, or an item equal to an earlier one in an array at one of
//!   the unique places ([`super::unique_items`]).
//! * Only tokens that can complete something are looked at: inside a string, those with a
//!   quote; at a number or `true`/`false`/`null` of a unique array, or where a name or an item
//!   begins, every allowed token. A token is checked up to the first name or item it
//!   completes (vocabularies have no token that completes two).
//! * Strings compare decoded (`"\u0061"` is `"a"`), numbers by value (`1` is `1.0`, as JSON
//!   Schema's equality says; integers beyond 2^53 compare as their nearest double).
//! * A mask is never left empty: where the grammar allows nothing but a repeat (a fixed
//!   enum exhausted, say), the repeat stays allowed.
//! * Bytes before the first `{` or `[` (a tool call's opening marker) and between values are
//!   skipped.

use std::collections::HashSet;
use std::sync::Arc;

use llguidance::toktrie::SimpleVob;

use super::unique_items::{Place, Step};

/// The vocabulary a watch reads: each token's bytes, and which tokens hold a quote.
#[derive(Debug)]
pub struct WatchVocab {
    bytes: Vec<Vec<u8>>,
    quoted: SimpleVob,
}

impl WatchVocab {
    pub fn new(bytes: Vec<Vec<u8>>) -> Self {
        let mut quoted = SimpleVob::alloc(bytes.len());
        for (id, b) in bytes.iter().enumerate() {
            // Special tokens (0xFF first) are never text.
            if b.first() != Some(&0xFF) && b.contains(&b'"') {
                quoted.allow_token(id as u32);
            }
        }
        Self { bytes, quoted }
    }
}

/// A scalar value, as uniqueness compares it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Item {
    Str(String),
    /// The bits of the value as an `f64` (`-0` as `0`).
    Num(u64),
    /// `true`, `false`, `null` (or a number that does not parse).
    Word(String),
}

impl Item {
    fn number(raw: &[u8]) -> Self {
        let text = String::from_utf8_lossy(raw);
        match text.parse::<f64>() {
            Ok(v) if v.is_finite() => Item::Num(if v == 0.0 { 0 } else { v.to_bits() }),
            _ => Item::Word(text.into_owned()),
        }
    }
}

/// The decoded text of a JSON string's raw bytes (between the quotes).
fn decode(raw: &[u8]) -> String {
    if raw.contains(&b'\\') {
        let mut quoted = Vec::with_capacity(raw.len() + 2);
        quoted.push(b'"');
        quoted.extend_from_slice(raw);
        quoted.push(b'"');
        if let Ok(s) = serde_json::from_slice::<String>(&quoted) {
            return s;
        }
    }
    String::from_utf8_lossy(raw).into_owned()
}

fn number_byte(b: u8) -> bool {
    matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
}

#[derive(Clone, Debug)]
enum Scalar {
    None,
    Str { raw: Vec<u8>, escape: bool },
    Num(Vec<u8>),
    Word(Vec<u8>),
}

#[derive(Clone, Debug)]
enum Frame {
    Object {
        names: HashSet<String>,
        /// A member name comes next (after `{` or `,`).
        wants_name: bool,
        /// The name of the member being written.
        name: String,
        /// That member's value is complete (a `,` or the `}` comes next).
        done: bool,
    },
    Array {
        /// The items so far, for an array at a unique place.
        unique: Option<HashSet<Item>>,
    },
}

/// One request's watch (see the module note).
#[derive(Clone, Debug)]
pub struct JsonWatch {
    vocab: Arc<WatchVocab>,
    places: Arc<Vec<Place>>,
    stack: Vec<Frame>,
    scalar: Scalar,
    /// Inside a top-level object or array.
    started: bool,
}

/// What writing a token would do where a name or an item could repeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It completes a name or an item already there.
    Repeats,
    /// It completes a new one, or leaves the place, or writes a start no repeat begins with.
    Safe,
    /// It writes a start that a name or an item already there begins with: whether a new one
    /// can still follow depends on what the grammar allows after it.
    Open,
}

/// What completing a name or an item would meet.
enum Seen<'a> {
    Names(&'a HashSet<String>),
    Items(&'a HashSet<Item>),
}

impl JsonWatch {
    pub fn new(vocab: Arc<WatchVocab>, places: Arc<Vec<Place>>) -> Self {
        Self { vocab, places, stack: Vec::new(), scalar: Scalar::None, started: false }
    }

    /// Records the token just committed.
    pub fn push(&mut self, token: u32) {
        let vocab = self.vocab.clone();
        if let Some(bytes) = vocab.bytes.get(token as usize).filter(|b| b.first() != Some(&0xFF)) {
            bytes.iter().for_each(|&b| self.feed(b));
        }
    }

    /// Whether the next token may complete something that could repeat (a name of an object
    /// with names, an item of a unique array with items).
    pub fn guarded(&self) -> bool {
        self.seen().is_some()
    }

    /// The tokens of `mask` that would complete a repeated name or item (only tokens with a
    /// quote are looked at inside a string).
    pub fn repeats_in(&self, mask: &SimpleVob) -> Vec<u32> {
        let Some(seen) = self.seen() else { return Vec::new() };
        if mask.len() != self.vocab.quoted.len() {
            return Vec::new();
        }
        let in_string = matches!(self.scalar, Scalar::Str { .. });
        let quoted = self.vocab.quoted.as_slice();
        let mut repeats = Vec::new();
        for (w, &bits) in mask.as_slice().iter().enumerate() {
            let mut bits = if in_string { bits & quoted.get(w).copied().unwrap_or(0) } else { bits };
            while bits != 0 {
                let id = (w * 32) as u32 + bits.trailing_zeros();
                bits &= bits - 1;
                if self.outcome_in(id, &seen) == Outcome::Repeats {
                    repeats.push(id);
                }
            }
        }
        repeats
    }

    /// What writing `token` next would do (see [`Outcome`]).
    pub fn outcome(&self, token: u32) -> Outcome {
        match self.seen() {
            Some(seen) => self.outcome_in(token, &seen),
            None => Outcome::Safe,
        }
    }

    /// What completing a name or an item would meet.
    fn seen(&self) -> Option<Seen<'_>> {
        match self.stack.last()? {
            Frame::Object { names, wants_name, done, .. }
                if !names.is_empty() && (*wants_name || *done || matches!(self.scalar, Scalar::Num(_) | Scalar::Word(_))) =>
            {
                Some(Seen::Names(names))
            }
            Frame::Array { unique: Some(items) } if !items.is_empty() => Some(Seen::Items(items)),
            _ => None,
        }
    }

    fn outcome_in(&self, token: u32, seen: &Seen<'_>) -> Outcome {
        let Some(bytes) = self.vocab.bytes.get(token as usize).filter(|b| b.first() != Some(&0xFF)) else {
            return Outcome::Safe;
        };
        let names = matches!(seen, Seen::Names(_));
        let verdict = |repeat: bool| if repeat { Outcome::Repeats } else { Outcome::Safe };
        let mut scalar = self.scalar.clone();
        let mut i = 0;
        while let Some(&b) = bytes.get(i) {
            i += 1;
            match &mut scalar {
                Scalar::Str { raw, escape } => {
                    if *escape {
                        *escape = false;
                    } else if b == b'\\' {
                        *escape = true;
                    } else if b == b'"' {
                        let text = decode(raw);
                        return verdict(match seen {
                            Seen::Names(n) => n.contains(&text),
                            Seen::Items(items) => items.contains(&Item::Str(text)),
                        });
                    }
                    raw.push(b);
                }
                Scalar::Num(raw) if number_byte(b) => raw.push(b),
                Scalar::Word(raw) if b.is_ascii_alphabetic() => raw.push(b),
                // A member's value ends; the byte is read again as what follows it.
                Scalar::Num(_) | Scalar::Word(_) if names => {
                    scalar = Scalar::None;
                    i -= 1;
                }
                Scalar::Num(raw) => return verdict(matches!(seen, Seen::Items(items) if items.contains(&Item::number(raw)))),
                Scalar::Word(raw) => {
                    let word = Item::Word(String::from_utf8_lossy(raw).into_owned());
                    return verdict(matches!(seen, Seen::Items(items) if items.contains(&word)));
                }
                Scalar::None => match b {
                    // After a value, a separator leads to the next name or item.
                    b' ' | b'\n' | b'\r' | b'\t' | b',' => {}
                    b'"' => scalar = Scalar::Str { raw: Vec::new(), escape: false },
                    b'-' | b'0'..=b'9' if !names => scalar = Scalar::Num(vec![b]),
                    b'a'..=b'z' if !names => scalar = Scalar::Word(vec![b]),
                    _ => return Outcome::Safe,
                },
            }
        }
        // Nothing completed: is what is being written still on the way to something seen?
        let open = match (&scalar, seen) {
            (Scalar::Str { raw, .. }, Seen::Names(n)) => {
                let part = String::from_utf8_lossy(raw);
                n.iter().any(|v| v.starts_with(&*part))
            }
            (Scalar::Str { raw, .. }, Seen::Items(items)) => {
                let part = String::from_utf8_lossy(raw);
                items.iter().any(|v| matches!(v, Item::Str(v) if v.starts_with(&*part)))
            }
            (Scalar::Num(_) | Scalar::Word(_), Seen::Items(items)) => items.iter().any(|v| !matches!(v, Item::Str(_))),
            // Where a name or an item begins (or a separator before one).
            (Scalar::None, _) => true,
            _ => false,
        };
        if open {
            Outcome::Open
        } else {
            Outcome::Safe
        }
    }

    fn feed(&mut self, b: u8) {
        match &mut self.scalar {
            Scalar::Str { raw, escape } => {
                if *escape {
                    *escape = false;
                } else if b == b'\\' {
                    *escape = true;
                } else if b == b'"' {
                    let raw = std::mem::take(raw);
                    self.scalar = Scalar::None;
                    self.string_done(&raw);
                    return;
                }
                raw.push(b);
                return;
            }
            Scalar::Num(raw) if number_byte(b) => return raw.push(b),
            Scalar::Word(raw) if b.is_ascii_alphabetic() => return raw.push(b),
            Scalar::Num(raw) => {
                let item = Item::number(raw);
                self.scalar = Scalar::None;
                self.value_done(Some(item));
            }
            Scalar::Word(raw) => {
                let item = Item::Word(String::from_utf8_lossy(raw).into_owned());
                self.scalar = Scalar::None;
                self.value_done(Some(item));
            }
            Scalar::None => {}
        }
        if !self.started {
            if !matches!(b, b'{' | b'[') {
                return;
            }
            self.started = true;
        }
        match b {
            b'{' => self.stack.push(Frame::Object { names: HashSet::new(), wants_name: true, name: String::new(), done: false }),
            b'[' => {
                let unique = self.at_unique_place().then(HashSet::new);
                self.stack.push(Frame::Array { unique });
            }
            b'}' | b']' => {
                self.stack.pop();
                self.value_done(None);
            }
            b'"' => self.scalar = Scalar::Str { raw: Vec::new(), escape: false },
            b',' => {
                if let Some(Frame::Object { wants_name, done, .. }) = self.stack.last_mut() {
                    *wants_name = true;
                    *done = false;
                }
            }
            b'-' | b'0'..=b'9' => self.scalar = Scalar::Num(vec![b]),
            b'a'..=b'z' => self.scalar = Scalar::Word(vec![b]),
            _ => {}
        }
    }

    fn string_done(&mut self, raw: &[u8]) {
        if let Some(Frame::Object { names, wants_name, name, .. }) = self.stack.last_mut() {
            if *wants_name {
                *name = decode(raw);
                names.insert(name.clone());
                *wants_name = false;
                return;
            }
        }
        self.value_done(Some(Item::Str(decode(raw))));
    }

    /// A value ended (`item`: a scalar one).
    fn value_done(&mut self, item: Option<Item>) {
        match self.stack.last_mut() {
            None => self.started = false,
            Some(Frame::Array { unique: Some(items) }) => {
                if let Some(i) = item {
                    items.insert(i);
                }
            }
            Some(Frame::Object { done, .. }) => *done = true,
            Some(_) => {}
        }
    }

    /// Whether an array opening now stands at one of the unique places.
    fn at_unique_place(&self) -> bool {
        if self.places.is_empty() {
            return false;
        }
        self.places.iter().any(|p| {
            p.len() == self.stack.len()
                && p.iter().zip(&self.stack).all(|(step, frame)| match (step, frame) {
                    (Step::Member(m), Frame::Object { name, .. }) => m == name,
                    (Step::AnyMember, Frame::Object { .. }) => true,
                    (Step::AnyItem, Frame::Array { .. }) => true,
                    _ => false,
                })
        })
    }
}

#[cfg(test)]
#[path = "json_watch_tests.rs"]
mod tests;
