use serde_json::json;

use super::{places, Step};
use crate::sampling::json_schema::prepare;

fn member(m: &str) -> Step {
    Step::Member(m.into())
}

#[test]
fn a_set_of_strings_is_placed_by_its_member_name() {
    // Pydantic's `set[str]`.
    let s =
        json!({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": true}}});
    let p = prepare(s, true).unwrap();
    assert_eq!(p["properties"]["tags"].get("uniqueItems"), None);
    assert_eq!(places(&p).unwrap(), vec![vec![member("tags")]]);
}

#[test]
fn places_are_read_through_references_branches_and_items() {
    let s = json!({
        "$defs": {"user": {"type": "string", "pattern": "^[a-z]+$"}, "Team": {"type": "object", "properties": {
            "members": {"type": "array", "items": {"$ref": "#/$defs/user"}, "uniqueItems": true}}}},
        "type": "object",
        "properties": {
            "github": {"oneOf": [{"$ref": "#/$defs/user"}, {"type": "array", "items": {"$ref": "#/$defs/user"}, "uniqueItems": true}]},
            "teams": {"type": "array", "items": {"$ref": "#/$defs/Team"}},
            "scores": {"type": "object", "additionalProperties": {"type": "array", "items": {"enum": [1, 2, "x", null]}, "uniqueItems": true}}
        }
    });
    let got = places(&prepare(s, true).unwrap()).unwrap();
    assert_eq!(
        got,
        vec![
            vec![member("github")],
            vec![member("teams"), Step::AnyItem, member("members")],
            vec![member("scores"), Step::AnyMember]
        ]
    );
}

#[test]
fn arrays_of_objects_or_of_anything_are_refused_naming_unique_items() {
    for items in [json!({"type": "object"}), json!({"type": ["string", "array"]}), json!({"enum": [[1], 2]})] {
        let s = json!({"type": "array", "items": items, "uniqueItems": true});
        let e = prepare(s, true).unwrap_err();
        assert!(e.contains("uniqueItems") && e.contains("the root"), "{e}");
    }
    // No `items`: any value may be an item.
    let e = prepare(json!({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": true}}}), true).unwrap_err();
    assert!(e.contains("uniqueItems") && e.contains("/a"), "{e}");
}

#[test]
fn a_place_some_branches_make_unique_and_others_not_is_refused() {
    let s = json!({"properties": {"a": {"anyOf": [
        {"type": "array", "items": {"type": "string"}, "uniqueItems": true},
        {"type": "array", "items": {"type": "integer"}}
    ]}}});
    let e = prepare(s, true).unwrap_err();
    assert!(e.contains("uniqueItems") && e.contains("/a"), "{e}");
    // A wildcard member overlaps a named one.
    let s = json!({"properties": {"a": {"type": "array", "items": {"type": "string"}}},
        "additionalProperties": {"type": "array", "items": {"type": "string"}, "uniqueItems": true}});
    assert!(prepare(s, true).unwrap_err().contains("uniqueItems"));
}

#[test]
fn a_unique_array_under_a_recursive_reference_or_a_foreign_one_is_refused() {
    let s = json!({"$defs": {"Node": {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": true},
        "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}}, "$ref": "#/$defs/Node"});
    let e = prepare(s, true).unwrap_err();
    assert!(e.contains("uniqueItems") && e.contains("recursive"), "{e}");
    // A recursion without a unique array below it is fine.
    let s = json!({"$defs": {"Node": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}},
        "properties": {"root": {"$ref": "#/$defs/Node"}, "ids": {"type": "array", "items": {"type": "integer"}, "uniqueItems": true}}});
    assert_eq!(places(&prepare(s, true).unwrap()).unwrap(), vec![vec![member("ids")]]);
    let s =
        json!({"properties": {"ids": {"type": "array", "items": {"$ref": "https://example.com/x.json"}, "uniqueItems": true}}});
    assert!(prepare(s, true).unwrap_err().contains("uniqueItems"));
}

#[test]
fn unique_items_false_says_nothing_and_a_schema_without_it_has_no_places() {
    let s = json!({"type": "array", "items": {"type": "object"}, "uniqueItems": false});
    let p = prepare(s, true).unwrap();
    assert_eq!(p.get("uniqueItems"), None);
    assert!(places(&p).unwrap().is_empty());
}

#[test]
fn very_deep_schemas_are_refused_not_overflowed() {
    let mut s = json!({"type": "array", "items": {"type": "string"}, "uniqueItems": true});
    for _ in 0..200 {
        s = json!({"type": "object", "properties": {"a": s}});
    }
    let e = prepare(s, true).unwrap_err();
    assert!(e.contains("uniqueItems") && e.contains("too deep"), "{e}");
}

#[test]
fn references_that_fan_out_are_read_within_a_budget() {
    // Each definition refers to the next twice: 2^40 paths to the unique array at the end.
    let mut defs = serde_json::Map::new();
    for i in 0..40 {
        defs.insert(
            format!("d{i}"),
            json!({"anyOf": [{"$ref": format!("#/$defs/d{}", i + 1)}, {"$ref": format!("#/$defs/d{}", i + 1)}]}),
        );
    }
    defs.insert("d40".into(), json!({"type": "array", "items": {"type": "string"}, "uniqueItems": true}));
    let s = json!({"$defs": defs, "$ref": "#/$defs/d0"});
    let t = std::time::Instant::now();
    let e = prepare(s, true).unwrap_err();
    assert!(e.contains("uniqueItems") && e.contains("too deep or too wide"), "{e}");
    assert!(t.elapsed().as_secs() < 5);
}
