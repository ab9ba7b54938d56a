//! Two keywords the grammar compiler refuses, rewritten where an exact equivalent exists.
//!
//! * `propertyNames: {"enum": [...]}` (every name is one of these) and `propertyNames: {"not":
//!   {"enum": [...]}}` (no name is one of these) on an object without `patternProperties`:
//!   the listed names become `properties`. Forbidden ones get the schema `false` (a member
//!   with that name fails); allowed ones keep their schema, or take `additionalProperties`',
//!   and the object closes.
//! * `oneOf` whose branches cannot both hold for one value because their JSON types differ
//!   (read through `type`, `enum`, `const`, local `$ref`s and nested `anyOf` / `oneOf` /
//!   `allOf`) is `anyOf`: at most one branch can match, so "exactly one" is "at least one".
//!   The compiler proves such disjointness itself only without references.

use serde_json::{Map, Value};

/// Rewrites `o`'s `propertyNames` as the module note says, when it has one of the two forms.
pub fn property_names(o: &mut Map<String, Value>) {
    let Some(Value::Object(pn)) = o.get("propertyNames") else { return };
    if o.contains_key("patternProperties") || o.contains_key("unevaluatedProperties") {
        return;
    }
    let names =
        |v: Option<&Value>| -> Option<Vec<String>> { v?.as_array()?.iter().map(|n| n.as_str().map(String::from)).collect() };
    let only_enum = pn.len() == 1;
    let (allowed, forbidden) = match (names(pn.get("enum")), pn.get("not").and_then(Value::as_object)) {
        (Some(list), None) if only_enum => (Some(list), None),
        (None, Some(not)) if only_enum && not.len() == 1 => match names(not.get("enum")) {
            Some(list) => (None, Some(list)),
            None => return,
        },
        _ => return,
    };
    let extra = o.get("additionalProperties").cloned().unwrap_or(Value::Bool(true));
    let props = o.entry("properties").or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(props) = props else { return };
    if let Some(forbidden) = forbidden {
        for n in forbidden {
            props.insert(n, Value::Bool(false));
        }
    }
    if let Some(allowed) = allowed {
        let listed: Vec<String> = props.keys().cloned().collect();
        for n in listed.iter().filter(|n| !allowed.contains(n)) {
            props.insert(n.clone(), Value::Bool(false));
        }
        for n in allowed {
            props.entry(n).or_insert_with(|| extra.clone());
        }
        o.insert("additionalProperties".into(), Value::Bool(false));
    }
    o.remove("propertyNames");
}

/// The JSON types of a value: bits of [`TYPES`] (`integer` counts as `number`).
const TYPES: [&str; 6] = ["null", "boolean", "number", "string", "array", "object"];

fn type_bit(t: &str) -> Option<u8> {
    let t = if t == "integer" { "number" } else { t };
    TYPES.iter().position(|x| *x == t).map(|i| 1 << i)
}

fn value_bit(v: &Value) -> u8 {
    let i = match v {
        Value::Null => 0,
        Value::Bool(_) => 1,
        Value::Number(_) => 2,
        Value::String(_) => 3,
        Value::Array(_) => 4,
        Value::Object(_) => 5,
    };
    1 << i
}

/// Most schemas [`types`] reads for one `oneOf` (references can fan out).
const MAX_READS: usize = 4096;

/// The types a value valid against `s` can have; `None` when any type may, or when that
/// takes more than `budget` more reads to tell.
fn types(s: &Value, resolve: &dyn Fn(&str) -> Option<Value>, depth: usize, budget: &mut usize) -> Option<u8> {
    let o = s.as_object()?;
    if depth > 16 || *budget == 0 {
        return None;
    }
    *budget -= 1;
    let mut known: Option<u8> = None;
    let mut meet = |bits: u8| known = Some(known.map_or(bits, |k| k & bits));
    match o.get("type") {
        Some(Value::String(t)) => meet(type_bit(t)?),
        Some(Value::Array(ts)) => meet(ts.iter().try_fold(0, |acc, t| Some(acc | type_bit(t.as_str()?)?))?),
        _ => {}
    }
    if let Some(Value::Array(vals)) = o.get("enum") {
        meet(vals.iter().fold(0, |acc, v| acc | value_bit(v)));
    }
    if let Some(v) = o.get("const") {
        meet(value_bit(v));
    }
    if let Some(r) = o.get("$ref").and_then(Value::as_str) {
        if let Some(bits) = resolve(r).and_then(|t| types(&t, resolve, depth + 1, budget)) {
            meet(bits);
        }
    }
    for k in ["anyOf", "oneOf"] {
        if let Some(Value::Array(parts)) = o.get(k) {
            let union = parts.iter().try_fold(0, |acc, p| Some(acc | types(p, resolve, depth + 1, budget)?));
            if let Some(bits) = union {
                meet(bits);
            }
        }
    }
    for part in o.get("allOf").and_then(Value::as_array).into_iter().flatten() {
        if let Some(bits) = types(part, resolve, depth + 1, budget) {
            meet(bits);
        }
    }
    known
}

/// Renames `oneOf` to `anyOf` when its branches' types are pairwise disjoint (and `o` has
/// no `anyOf` of its own).
pub fn one_of(o: &mut Map<String, Value>, resolve: &dyn Fn(&str) -> Option<Value>) {
    let Some(Value::Array(parts)) = o.get("oneOf") else { return };
    if o.contains_key("anyOf") || parts.len() < 2 {
        return;
    }
    let mut seen = 0u8;
    let mut budget = MAX_READS;
    for p in parts {
        match types(p, resolve, 0, &mut budget) {
            Some(bits) if bits & seen == 0 => seen |= bits,
            _ => return,
        }
    }
    if let Some(parts) = o.remove("oneOf") {
        o.insert("anyOf".into(), parts);
    }
}

#[cfg(test)]
#[path = "schema_exact_tests.rs"]
mod tests;
