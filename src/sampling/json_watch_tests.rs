use std::sync::Arc;

use llguidance::toktrie::SimpleVob;

use super::{JsonWatch, Outcome, WatchVocab};
use crate::sampling::unique_items::{Place, Step};

/// The 256 single bytes, then these words, then a special token.
const WORDS: &[&str] = &["\"go\"", "\": ", ", \"", "\"go", "1.0", "true", "\"x\""];

fn vocab() -> Arc<WatchVocab> {
    let mut bytes: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    bytes.extend(WORDS.iter().map(|w| w.as_bytes().to_vec()));
    bytes.push(b"\xff<eos>".to_vec());
    Arc::new(WatchVocab::new(bytes))
}

fn word(w: &str) -> u32 {
    256 + WORDS.iter().position(|x| *x == w).unwrap() as u32
}

fn watch(places: Vec<Place>, text: &str) -> JsonWatch {
    let mut w = JsonWatch::new(vocab(), Arc::new(places));
    text.bytes().for_each(|b| w.push(b as u32));
    w
}

/// What an open string loses when ending it would repeat: every token whose first byte is
/// the closing quote.
fn closing() -> Vec<u32> {
    vec![b'"' as u32, word("\"go\""), word("\": "), word("\"go"), word("\"x\"")]
}

/// The tokens a full mask loses.
fn refused(w: &JsonWatch) -> Vec<u32> {
    let n = 256 + WORDS.len() + 1;
    let mut mask = SimpleVob::alloc(n);
    mask.set_all(true);
    w.repeats_in(&mask)
}

#[test]
fn a_member_name_an_object_has_cannot_be_written_again() {
    let w = watch(vec![], r#"{"go": 1, "go"#);
    assert_eq!(refused(&w), closing());
    // Where a name begins, a token that writes it whole is refused; one that goes on is not.
    let w = watch(vec![], r#"{"go": 1, "#);
    assert_eq!(refused(&w), vec![word("\"go\"")]);
    // Names compare decoded.
    let w = watch(vec![], r#"{"a": 1, "\u0061"#);
    assert_eq!(refused(&w), closing());
}

#[test]
fn names_belong_to_their_own_object_and_values_are_not_names() {
    assert!(refused(&watch(vec![], r#"{"go": {"go"#)).is_empty());
    assert!(refused(&watch(vec![], r#"{"go": "go"#)).is_empty());
    assert!(refused(&watch(vec![], r#"{"go": {"a": 1}, "b": ["go"#)).is_empty());
    // Back in the outer object after the inner one closes.
    assert_eq!(refused(&watch(vec![], r#"{"go": {"a": 1}, "go"#)), closing());
}

#[test]
fn items_of_a_unique_array_cannot_repeat() {
    let tags = || vec![vec![Step::Member("tags".into())]];
    assert_eq!(refused(&watch(tags(), r#"{"tags": ["x", "x"#)), closing());
    assert_eq!(refused(&watch(tags(), r#"{"tags": ["x", "#)), vec![word("\"x\"")]);
    // Numbers by value: 1, then 1 or 1.0 would end at `,` or `]`.
    let r = refused(&watch(tags(), r#"{"tags": [1, 1"#));
    assert!(r.contains(&(b',' as u32)) && r.contains(&(b']' as u32)) && !r.contains(&(b'0' as u32)), "{r:?}");
    // A number is complete only at the byte after it.
    assert!(refused(&watch(tags(), r#"{"tags": [1, "#)).is_empty());
    let r = refused(&watch(tags(), r#"{"tags": [1.0, 1"#));
    assert!(r.contains(&(b']' as u32)) && !r.contains(&(b'.' as u32)), "{r:?}");
    let r = refused(&watch(tags(), r#"{"tags": [true, true"#));
    assert!(r.contains(&(b',' as u32)) && r.contains(&(b']' as u32)), "{r:?}");
    // The same array elsewhere may repeat.
    assert!(refused(&watch(tags(), r#"{"other": ["x", "x"#)).is_empty());
    assert!(refused(&watch(tags(), r#"{"a": {"tags": ["x", "x"#)).is_empty());
}

#[test]
fn wildcard_places_match_any_member_and_any_item() {
    let places = vec![vec![Step::AnyItem, Step::AnyMember]];
    assert_eq!(refused(&watch(places.clone(), r#"[{"k": ["x", "x"#)), closing());
    assert!(refused(&watch(places, r#"[["x", "x"#)).is_empty());
}

#[test]
fn text_before_the_value_is_skipped_and_each_top_level_value_starts_afresh() {
    assert_eq!(refused(&watch(vec![], r#"<tool_call>{"go": 1, "go"#)), closing());
    assert!(refused(&watch(vec![], r#"{"go": 1}</tool_call>{"go"#)).is_empty());
}

#[test]
fn a_start_that_a_seen_name_or_item_begins_with_is_open() {
    let w = watch(vec![], r#"{"go": 1, "#);
    assert_eq!(w.outcome(word("\"go")), Outcome::Open);
    assert_eq!(w.outcome(b'"' as u32), Outcome::Open);
    assert_eq!(w.outcome(word("\"go\"")), Outcome::Repeats);
    assert_eq!(w.outcome(word("\"x\"")), Outcome::Safe);
    assert_eq!(w.outcome(b'}' as u32), Outcome::Safe);
    let w = watch(vec![], r#"{"go": 1, "g"#);
    assert_eq!(w.outcome(b'o' as u32), Outcome::Open);
    assert_eq!(w.outcome(b'x' as u32), Outcome::Safe);
    // Numbers and words of a unique array stay open until they end.
    let w = watch(vec![vec![]], "[1, ");
    assert_eq!(w.outcome(b'1' as u32), Outcome::Open);
    assert_eq!(w.outcome(b']' as u32), Outcome::Safe);
    assert!(!watch(vec![], "[1, ").guarded());
}
