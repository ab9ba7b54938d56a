//! `uniqueItems: true`, enforced in our layer: where in the output such arrays can be.
//!
//! Design note
//! -----------
//! * llguidance refuses `uniqueItems: true`. [`super::json_schema::prepare`] replaces it with
//!   [`MARKER`] (a key the grammar compiler ignores) and [`places`] reads, from the prepared
//!   schema, the paths in the output where a marked array can stand: member names, `*` for any
//!   member, `[]` for any item. [`super::json_watch`] follows the output and, inside an array
//!   at such a path, refuses a token that would complete an item equal to an earlier one.
//! * Only arrays of strings, numbers, booleans and nulls are taken: an item of those ends at
//!   a byte where the grammar still allows something else (a longer string, more digits, the
//!   end of the array). An object or array item is complete at its closing bracket, often the
//!   only byte the grammar then allows; such a schema is refused naming `uniqueItems`.
//! * A path where one branch of the schema puts a unique array and another an array that may
//!   repeat items is refused, as is a marked array under a recursive reference: which rule
//!   applies there would depend on the branch the output takes.
//! * Paths are read through local references (`#/...`), `allOf` / `anyOf` / `oneOf`, `then` /
//!   `else`, `properties`, `additionalProperties`, `patternProperties`, `items`,
//!   `prefixItems`, `additionalItems` and `contains`, at most [`MAX_DEPTH`] levels deep, at
//!   most [`MAX_PLACES`] places and [`MAX_VISITS`] schemas read (references can fan out).

use serde_json::{Map, Value};

/// The key `prepare` puts where a schema said `uniqueItems: true`.
pub const MARKER: &str = "x-expert-runtime-unique-items";
/// Deepest schema nesting followed.
pub const MAX_DEPTH: usize = 64;
/// Most array places recorded.
pub const MAX_PLACES: usize = 1024;
/// Most schema nodes read (references can make a small schema a large tree).
pub const MAX_VISITS: usize = 100_000;

/// One step of a path in the output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// The member with this name.
    Member(String),
    /// Any member.
    AnyMember,
    /// Any item of an array.
    AnyItem,
}

/// A path from the output's root, as a schema describes it.
pub type Place = Vec<Step>;

/// Whether two places can name the same spot of an output.
fn overlap(a: &[Step], b: &[Step]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| match (x, y) {
            (Step::Member(m), Step::Member(n)) => m == n,
            (Step::AnyItem, Step::AnyItem) => true,
            (Step::AnyMember, Step::Member(_)) | (Step::Member(_), Step::AnyMember) | (Step::AnyMember, Step::AnyMember) => true,
            _ => false,
        })
}

/// Whether `v` holds a [`MARKER`] anywhere.
pub fn marked(v: &Value) -> bool {
    match v {
        Value::Object(o) => o.contains_key(MARKER) || o.values().any(marked),
        Value::Array(a) => a.iter().any(marked),
        _ => false,
    }
}

/// Where the marked arrays of `schema` can stand in the output; fails naming `uniqueItems`
/// when one cannot be enforced (see the module note).
pub fn places(schema: &Value) -> Result<Vec<Place>, String> {
    if !marked(schema) {
        return Ok(Vec::new());
    }
    let mut r = Reader { root: schema, unique: Vec::new(), plain: Vec::new(), refs: Vec::new(), visits: 0 };
    r.read(schema, &mut Vec::new(), 0)?;
    for u in &r.unique {
        if let Some(p) = r.plain.iter().find(|p| overlap(u, p)) {
            return Err(format!(
                "uniqueItems holds for some but not all of the arrays that may stand at {}; \
                 give every branch there the same uniqueItems",
                show(p)
            ));
        }
    }
    Ok(r.unique)
}

/// A place as a reader would write it: `/tags/[]/*`.
pub fn show(p: &[Step]) -> String {
    if p.is_empty() {
        return "the root".into();
    }
    p.iter()
        .map(|s| match s {
            Step::Member(m) => format!("/{}", m.chars().take(40).collect::<String>()),
            Step::AnyMember => "/*".into(),
            Step::AnyItem => "/[]".into(),
        })
        .collect()
}

struct Reader<'a> {
    root: &'a Value,
    /// Places of marked arrays.
    unique: Vec<Place>,
    /// Places of arrays that may repeat items.
    plain: Vec<Place>,
    /// The references being followed (a repeat is a recursion).
    refs: Vec<&'a str>,
    /// Schema nodes read so far.
    visits: usize,
}

impl<'a> Reader<'a> {
    fn read(&mut self, s: &'a Value, path: &mut Place, depth: usize) -> Result<(), String> {
        let Value::Object(o) = s else { return Ok(()) };
        self.visits += 1;
        if depth > MAX_DEPTH || self.unique.len() + self.plain.len() > MAX_PLACES || self.visits > MAX_VISITS {
            return Err(format!(
                "uniqueItems: the schema is too deep or too wide to place its arrays (at most {MAX_DEPTH} levels, \
                 {MAX_PLACES} arrays, {MAX_VISITS} schemas read through references)"
            ));
        }
        if let Some(r) = o.get("$ref").and_then(Value::as_str) {
            let target = self.resolve(r)?;
            if self.refs.contains(&r) {
                if marked(target) {
                    return Err(format!("uniqueItems under the recursive reference {r:?} is not supported"));
                }
            } else {
                self.refs.push(r);
                let done = self.read(target, path, depth + 1);
                self.refs.pop();
                done?;
            }
        }
        if is_array_schema(o) {
            if o.contains_key(MARKER) {
                self.check_items(o, path)?;
                self.unique.push(path.clone());
            } else {
                self.plain.push(path.clone());
            }
        }
        for k in ["allOf", "anyOf", "oneOf"] {
            for part in o.get(k).and_then(Value::as_array).into_iter().flatten() {
                self.read(part, path, depth + 1)?;
            }
        }
        for k in ["then", "else"] {
            if let Some(part) = o.get(k) {
                self.read(part, path, depth + 1)?;
            }
        }
        if let Some(Value::Object(props)) = o.get("properties") {
            for (name, p) in props {
                path.push(Step::Member(name.clone()));
                let done = self.read(p, path, depth + 1);
                path.pop();
                done?;
            }
        }
        let any_member = o
            .get("patternProperties")
            .and_then(Value::as_object)
            .into_iter()
            .flat_map(|m| m.values())
            .chain(o.get("additionalProperties"));
        for p in any_member.collect::<Vec<_>>() {
            path.push(Step::AnyMember);
            let done = self.read(p, path, depth + 1);
            path.pop();
            done?;
        }
        let items = match o.get("items") {
            Some(Value::Array(list)) => list.iter().collect(),
            Some(one) => vec![one],
            None => Vec::new(),
        };
        let more = o.get("prefixItems").and_then(Value::as_array).into_iter().flatten();
        let items: Vec<&Value> = items.into_iter().chain(more).chain(o.get("additionalItems")).chain(o.get("contains")).collect();
        for p in items {
            path.push(Step::AnyItem);
            let done = self.read(p, path, depth + 1);
            path.pop();
            done?;
        }
        Ok(())
    }

    /// `#/a/b` in the root schema.
    fn resolve(&self, r: &str) -> Result<&'a Value, String> {
        let pointer = r.strip_prefix('#').filter(|p| p.is_empty() || p.starts_with('/'));
        pointer.and_then(|p| self.root.pointer(p)).ok_or_else(|| {
            format!("uniqueItems: the reference {:?} does not name a part of this schema", r.chars().take(80).collect::<String>())
        })
    }

    /// The items of a marked array must be scalars (see the module note).
    fn check_items(&self, o: &Map<String, Value>, path: &[Step]) -> Result<(), String> {
        let mut items: Vec<&Value> = match o.get("items") {
            Some(Value::Array(list)) => list.iter().collect(),
            Some(one) => vec![one],
            None => Vec::new(),
        };
        items.extend(o.get("prefixItems").and_then(Value::as_array).into_iter().flatten());
        items.extend(o.get("additionalItems"));
        let only_prefix = o.get("items") == Some(&Value::Bool(false)) || o.get("additionalItems") == Some(&Value::Bool(false));
        let open = !(o.contains_key("items") || only_prefix && o.contains_key("prefixItems"));
        let scalar = !open && items.iter().all(|i| *i == &Value::Bool(false) || self.scalar(i, 0));
        if scalar {
            Ok(())
        } else {
            Err(format!(
                "uniqueItems is enforced for arrays of strings, numbers, booleans and nulls; the array at {} may hold objects or arrays",
                show(path)
            ))
        }
    }

    /// Whether every value `s` allows is a string, number, boolean or null.
    fn scalar(&self, s: &Value, depth: usize) -> bool {
        let Value::Object(o) = s else { return false };
        if depth > 16 {
            return false;
        }
        if let Some(r) = o.get("$ref").and_then(Value::as_str) {
            return self.resolve(r).is_ok_and(|t| self.scalar(t, depth + 1));
        }
        let is_scalar = |v: &Value| !(v.is_object() || v.is_array());
        if let Some(Value::Array(vals)) = o.get("enum") {
            return vals.iter().all(is_scalar);
        }
        if let Some(v) = o.get("const") {
            return is_scalar(v);
        }
        for k in ["anyOf", "oneOf"] {
            if let Some(Value::Array(parts)) = o.get(k) {
                return parts.iter().all(|p| self.scalar(p, depth + 1));
            }
        }
        if let Some(Value::Array(parts)) = o.get("allOf") {
            if parts.iter().any(|p| self.scalar(p, depth + 1)) {
                return true;
            }
        }
        let scalar_type = |t: &Value| matches!(t.as_str(), Some("string" | "number" | "integer" | "boolean" | "null"));
        match o.get("type") {
            Some(Value::Array(ts)) => !ts.is_empty() && ts.iter().all(scalar_type),
            Some(t) => scalar_type(t),
            None => false,
        }
    }
}

/// A schema for arrays: `type` says so, or it has `items` / `prefixItems` without a `type`.
fn is_array_schema(o: &Map<String, Value>) -> bool {
    match o.get("type") {
        Some(Value::String(t)) => t == "array",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "array"),
        Some(_) => false,
        None => o.contains_key("items") || o.contains_key("prefixItems") || o.contains_key(MARKER),
    }
}

#[cfg(test)]
#[path = "unique_items_tests.rs"]
mod tests;
