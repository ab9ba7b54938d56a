use serde_json::json;

use super::prepare;

#[test]
fn objects_without_additional_properties_are_closed_when_strict() {
    let s = json!({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}}}});
    let p = prepare(s.clone(), true).unwrap();
    assert_eq!(p["additionalProperties"], json!(false));
    assert_eq!(p["properties"]["a"]["additionalProperties"], json!(false));
    // Not strict: as JSON Schema reads it.
    assert_eq!(prepare(s, false).unwrap().get("additionalProperties"), None);
}

#[test]
fn an_explicit_additional_properties_is_kept() {
    for given in [json!(true), json!(false), json!({"type": "string"})] {
        let s = json!({"type": "object", "properties": {"a": {}}, "additionalProperties": given.clone()});
        assert_eq!(prepare(s, true).unwrap()["additionalProperties"], given);
    }
}

#[test]
fn all_of_parts_and_the_definitions_they_name_stay_open() {
    let s = json!({
        "$defs": {"Base": {"type": "object", "properties": {"id": {"type": "integer"}}}, "Other": {"type": "object"}},
        "allOf": [{"$ref": "#/$defs/Base"}, {"type": "object", "properties": {"name": {"type": "string"}}}]
    });
    let p = prepare(s, true).unwrap();
    assert_eq!(p["$defs"]["Base"].get("additionalProperties"), None);
    assert_eq!(p["allOf"][1].get("additionalProperties"), None);
    // The composed object closes over the names its parts list.
    assert_eq!(p["additionalProperties"], json!(false));
    assert_eq!(p["properties"], json!({"id": true, "name": true}));
    // A definition no allOf names is closed.
    assert_eq!(p["$defs"]["Other"]["additionalProperties"], json!(false));
    // A part open to patterns (or anything but plain properties) leaves the composition open.
    let s = json!({"allOf": [{"type": "object", "properties": {"a": {}}}, {"type": "object", "patternProperties": {"^x": {}}}]});
    assert_eq!(prepare(s, true).unwrap().get("additionalProperties"), None);
    // Not strict: nothing closes.
    let s = json!({"allOf": [{"type": "object", "properties": {"a": {}}}, {"type": "object", "properties": {"b": {}}}]});
    assert_eq!(prepare(s.clone(), false).unwrap().get("additionalProperties"), None);
    assert_eq!(prepare(s, true).unwrap()["additionalProperties"], json!(false));
}

#[test]
fn data_positions_are_not_rewritten() {
    let s = json!({"enum": [{"type": "object"}], "const": {"type": "object"}, "default": {"properties": {}}, "examples": [{"type": "object"}]});
    assert_eq!(prepare(s.clone(), true).unwrap(), s);
}

#[test]
fn keywords_that_say_nothing_are_dropped() {
    let s = json!({"type": "object", "propertyNames": {"type": "string"}, "additionalProperties": {"type": "number"}});
    assert_eq!(prepare(s, true).unwrap().get("propertyNames"), None);
    let s = json!({"type": "array", "items": {"type": "string"}, "uniqueItems": false});
    assert_eq!(prepare(s, true).unwrap().get("uniqueItems"), None);
    // One that constrains stays, for llguidance to take or refuse by name; `uniqueItems: true`
    // is marked for our own layer.
    let s = json!({"type": "object", "propertyNames": {"pattern": "^a"}, "uniqueItems": true});
    let p = prepare(s, true).unwrap();
    assert!(p.get("propertyNames").is_some() && p.get("uniqueItems").is_none());
    assert_eq!(p[crate::sampling::unique_items::MARKER], json!(true));
}

#[test]
fn a_strict_email_gets_a_bounded_local_part_and_a_dotted_domain() {
    let p = prepare(json!({"type": "string", "format": "email"}), true).unwrap();
    assert_eq!(p["pattern"], json!(super::EMAIL_PATTERN));
    assert_eq!(p["maxLength"], json!(254));
    let rx = regex::Regex::new(super::EMAIL_PATTERN).unwrap();
    assert!(rx.is_match("lead@example.com") && rx.is_match(&format!("{}@a.io", "x".repeat(64))));
    assert!(!rx.is_match("lead@example") && !rx.is_match(&format!("{}@a.io", "x".repeat(65))));
    // A pattern of the schema's own is kept; not strict, nothing is added.
    let p = prepare(json!({"type": "string", "format": "email", "pattern": "@corp\\.com$"}), true).unwrap();
    assert_eq!(p["pattern"], json!("@corp\\.com$"));
    assert_eq!(prepare(json!({"type": "string", "format": "email"}), false).unwrap().get("pattern"), None);
}

#[test]
fn min_properties_becomes_a_choice_of_required_members() {
    let s = json!({"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "required": ["a"], "minProperties": 2});
    let p = prepare(s, true).unwrap();
    let branches = p["anyOf"].as_array().unwrap();
    let required: Vec<_> = branches.iter().map(|b| b["required"].clone()).collect();
    assert_eq!(required, vec![json!(["a", "b"]), json!(["a", "c"])]);
    assert!(branches.iter().all(|b| b["additionalProperties"] == json!(false) && b.get("minProperties").is_none()));
    // A bound the required members already meet is dropped.
    let s = json!({"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a"], "minProperties": 1});
    let p = prepare(s, true).unwrap();
    assert!(p.get("minProperties").is_none() && p.get("anyOf").is_none());
}

#[test]
fn max_properties_becomes_a_choice_of_absent_members() {
    let s = json!({"$defs": {}, "type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "maxProperties": 2});
    let p = prepare(s, true).unwrap();
    let branches = p["anyOf"].as_array().unwrap();
    assert_eq!(branches.len(), 3);
    assert_eq!(branches[0]["properties"]["c"], json!(false));
    assert_eq!(branches[2]["properties"]["a"], json!(false));
    assert!(p.get("$defs").is_some() && branches.iter().all(|b| b.get("$defs").is_none()));
    let s = json!({"type": "object", "properties": {"a": {}, "b": {}}, "maxProperties": 2});
    assert!(prepare(s, true).unwrap().get("anyOf").is_none());
}

#[test]
fn bounds_that_cannot_be_rewritten_are_refused_naming_the_keyword() {
    let many: serde_json::Map<_, _> = (0..20).map(|i| (format!("p{i}"), json!({}))).collect();
    let s = json!({"type": "object", "properties": many, "minProperties": 10});
    assert!(prepare(s, true).unwrap_err().contains("minProperties"));
    let s = json!({"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 1, "maxProperties": 1});
    assert!(prepare(s, true).unwrap_err().contains("maxProperties"));
    let s = json!({"type": "object", "properties": {"a": {}}, "minProperties": -1});
    assert!(prepare(s, true).unwrap_err().contains("minProperties"));
    let s = json!({"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "required": ["a", "b"], "maxProperties": 1});
    assert!(prepare(s, true).unwrap_err().contains("maxProperties"));
}

#[test]
fn formats_with_unbounded_digits_get_a_length_when_strict() {
    let s = json!({"type": "object", "properties": {"at": {"type": "string", "format": "date-time"}, "d": {"type": "string", "format": "duration", "maxLength": 90}}});
    let p = prepare(s.clone(), true).unwrap();
    assert_eq!(p["properties"]["at"]["maxLength"], json!(40));
    assert_eq!(p["properties"]["d"]["maxLength"], json!(90));
    assert_eq!(prepare(s, false).unwrap()["properties"]["at"].get("maxLength"), None);
}

#[test]
fn formats_the_compiler_lacks_become_their_patterns() {
    let rx = |f: &str| {
        let p = prepare(json!({"type": "string", "format": f}), true).unwrap();
        assert_eq!(p.get("format"), None, "{f}");
        regex::Regex::new(p["pattern"].as_str().unwrap()).unwrap()
    };
    let uri_ref = rx("uri-reference");
    for ok in ["https://example.com/a?b=c#d", "../up/one", "/abs", "", "#frag", "mailto:a@b.c", "//host:80/p", "a%20b"] {
        assert!(uri_ref.is_match(ok), "{ok:?}");
    }
    for bad in ["has space", "http://a/\"q\"", "100%", "a<b>"] {
        assert!(!uri_ref.is_match(bad), "{bad:?}");
    }
    let ptr = rx("json-pointer");
    assert!(ptr.is_match("") && ptr.is_match("/a~1b/0") && !ptr.is_match("a") && !ptr.is_match("/~2"));
    let rel = rx("relative-json-pointer");
    assert!(rel.is_match("0") && rel.is_match("1/a") && rel.is_match("2#") && !rel.is_match("01") && !rel.is_match("/a"));
    // With a pattern of its own the format stays, for the compiler to refuse by name.
    let p = prepare(json!({"type": "string", "format": "uri-reference", "pattern": "^/"}), true).unwrap();
    assert_eq!(p["format"], json!("uri-reference"));
}
