//! A JSON schema made ready for the grammar compiler: what an object that does not say
//! `additionalProperties` means under constraint, and the keywords llguidance does not take
//! that can be enforced exactly by rewriting the schema.
//!
//! Design note
//! -----------
//! * **Strict by default.** JSON Schema leaves an object without `additionalProperties` open
//!   to any other member. Under constraint that lets a small model add member after member
//!   until it runs out of tokens, and what a caller wants back is the object the schema
//!   describes. So, as vLLM does by default (XGrammar's strict mode) and as OpenAI's
//!   `strict: true` requires, such an object is closed: `additionalProperties: false` is added.
//!   An explicit `additionalProperties` (true, false or a schema) is kept as given, and
//!   `strict: false` keeps every object as JSON Schema reads it. Objects that are parts of an
//!   `allOf` (and definitions an `allOf` refers to) are left open, since closing a part would
//!   refuse the members the other parts add.
//! * **Keywords enforced here.** A `propertyNames` that every JSON member name satisfies
//!   (`true`, `{}`, `{"type": "string"}`: Zod writes it for every record) and `uniqueItems:
//!   false` say nothing and are dropped. `minProperties` / `maxProperties` on a closed object
//!   become an `anyOf` over which optional members are required (minimum) or absent
//!   (maximum), up to [`MAX_BRANCHES`]; bounds every closed object meets are dropped. What
//!   cannot be rewritten exactly is left to llguidance, which refuses it naming the keyword.
//! * `propertyNames` listing names, and `oneOf` over branches of different types, become their
//!   exact equivalents ([`super::schema_exact`]).
//! * **Formats a model can run on in** (`date-time` and `time` fractional seconds, `duration`
//!   fields, an `email` or `hostname` part) get a `maxLength` when strict and the schema gives
//!   none ([`FORMAT_MAX_LENGTH`]): every real value fits (the email and hostname bounds are
//!   RFC 5321's and RFC 1035's).
//!   A strict `email` without a `pattern` also gets [`EMAIL_PATTERN`]: a local part as long as
//!   RFC 5321 allows and a domain with a dot, which is what validators accept.
//! * Formats the grammar compiler does not know but a pattern defines (`uri-reference`,
//!   `json-pointer`, `relative-json-pointer`) become that pattern ([`FORMAT_PATTERNS`]).
//! * `uniqueItems: true` is marked for our own layer to enforce ([`super::unique_items`]);
//!   a schema where it cannot be is refused naming it.
//! * Only schema positions are rewritten: `enum`, `const`, `default` and `examples` hold data
//!   that merely looks like schemas.

use serde_json::{Map, Value};

/// Most `anyOf` branches one `minProperties` / `maxProperties` may become.
pub const MAX_BRANCHES: usize = 64;

/// The `maxLength` a strict schema's string of these formats gets when it has none: longer
/// than any real value (`2024-01-31T23:59:59.123456789+05:30` is 35 characters).
pub const FORMAT_MAX_LENGTH: &[(&str, u64)] =
    &[("date-time", 40), ("time", 32), ("duration", 40), ("email", 254), ("hostname", 253)];

/// What a strict schema's `email` string must also match when it gives no `pattern` (the
/// grammar compiler takes both): a local part of at most 64 characters (RFC 5321) and a domain
/// with a dot, as validators read addresses (ajv's `email`, Pydantic's `EmailStr`).
pub const EMAIL_PATTERN: &str = r"^[^@]{1,64}@[^@]+\.[A-Za-z]{2,63}$";

/// Formats of JSON Schema the grammar compiler does not know, as the patterns that define
/// them (written from RFC 3986's URI-reference and RFC 6901's JSON pointer grammars). A schema
/// that gives its own `pattern` as well keeps the format, and is refused naming it.
pub const FORMAT_PATTERNS: &[(&str, &str)] = &[
    ("uri-reference", URI_REFERENCE),
    ("json-pointer", r"^(/([^/~]|~[01])*)*$"),
    ("relative-json-pointer", r"^(0|[1-9][0-9]*)(#|(/([^/~]|~[01])*)*)$"),
];

/// RFC 3986 `URI-reference`: an optional scheme, then `//` authority and an absolute path, an
/// absolute path, a relative one or none, an optional query and an optional fragment.
const URI_REFERENCE: &str = concat!(
    r"^(?:[A-Za-z][A-Za-z0-9+.\-]*:)?",
    r"(?://(?:(?:[A-Za-z0-9._~!$&'()*+,;=:\-]|%[0-9A-Fa-f]{2})*@)?",
    r"(?:\[[0-9A-Fa-f:.]+\]|(?:[A-Za-z0-9._~!$&'()*+,;=\-]|%[0-9A-Fa-f]{2})*)(?::[0-9]*)?",
    r"(?:/(?:[A-Za-z0-9._~!$&'()*+,;=:@\-]|%[0-9A-Fa-f]{2})*)*",
    r"|/?(?:(?:[A-Za-z0-9._~!$&'()*+,;=:@\-]|%[0-9A-Fa-f]{2})+(?:/(?:[A-Za-z0-9._~!$&'()*+,;=:@\-]|%[0-9A-Fa-f]{2})*)*)?)",
    r"(?:\?(?:[A-Za-z0-9._~!$&'()*+,;=:@/?\-]|%[0-9A-Fa-f]{2})*)?",
    r"(?:#(?:[A-Za-z0-9._~!$&'()*+,;=:@/?\-]|%[0-9A-Fa-f]{2})*)?$"
);

/// Keys whose value is one schema.
const SCHEMA_KEYS: &[&str] = &[
    "additionalProperties",
    "items",
    "additionalItems",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
];
/// Keys whose value is a list of schemas.
const SCHEMA_LIST_KEYS: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems", "items"];
/// Keys whose value maps names to schemas.
const SCHEMA_MAP_KEYS: &[&str] = &["properties", "patternProperties", "$defs", "definitions", "dependentSchemas"];
/// Keys that describe the document rather than the value; they stay outside a rewritten object.
const DOCUMENT_KEYS: &[&str] = &["$defs", "definitions", "$schema", "$id", "id", "x-guidance"];

/// `schema`, rewritten as the module note says. `strict`: close objects that do not say
/// `additionalProperties`. Fails naming the keyword when a bound cannot be rewritten.
pub fn prepare(mut schema: Value, strict: bool) -> Result<Value, String> {
    let mut parts = Vec::new();
    collect_all_of_refs(&schema, &mut parts);
    let defs = ["$defs", "definitions"].map(|k| (k, schema.get(k).cloned().unwrap_or(Value::Null)));
    Walk { strict, all_of_refs: parts, defs }.schema(&mut schema, false)?;
    super::unique_items::places(&schema)?;
    Ok(schema)
}

/// The `$ref`s that are parts of an `allOf` of more than one part.
fn collect_all_of_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            if let Some(Value::Array(parts)) = o.get("allOf").filter(|p| p.as_array().is_some_and(|a| a.len() > 1)) {
                out.extend(parts.iter().filter_map(|p| p.get("$ref")?.as_str().map(String::from)));
            }
            o.iter().filter(|(k, _)| !is_data_key(k)).for_each(|(_, x)| collect_all_of_refs(x, out));
        }
        Value::Array(a) => a.iter().for_each(|x| collect_all_of_refs(x, out)),
        _ => {}
    }
}

fn is_data_key(k: &str) -> bool {
    matches!(k, "enum" | "const" | "default" | "examples")
}

struct Walk {
    strict: bool,
    all_of_refs: Vec<String>,
    /// The root's definitions as given, to read the parts an `allOf` refers to.
    defs: [(&'static str, Value); 2],
}

impl Walk {
    /// Rewrites one schema; `part`: it is a part of an `allOf` (left open).
    fn schema(&self, s: &mut Value, part: bool) -> Result<(), String> {
        let Value::Object(o) = s else { return Ok(()) };
        for &k in SCHEMA_KEYS {
            if let Some(v) = o.get_mut(k).filter(|v| v.is_object()) {
                self.schema(v, false)?;
            }
        }
        for &k in SCHEMA_LIST_KEYS {
            let several = k == "allOf" && o.get(k).and_then(Value::as_array).is_some_and(|a| a.len() > 1);
            if let Some(Value::Array(list)) = o.get_mut(k) {
                for v in list {
                    self.schema(v, several)?;
                }
            }
        }
        for &k in SCHEMA_MAP_KEYS {
            let defs = matches!(k, "$defs" | "definitions");
            if let Some(Value::Object(m)) = o.get_mut(k) {
                for (name, v) in m.iter_mut() {
                    let referenced = defs && self.all_of_refs.iter().any(|r| r == &format!("#/{k}/{}", pointer_escape(name)));
                    self.schema(v, referenced)?;
                }
            }
        }
        if o.get("propertyNames").is_some_and(any_name) {
            o.remove("propertyNames");
        }
        super::schema_exact::property_names(o);
        super::schema_exact::one_of(o, &|r| self.definition(r).map(|d| Value::Object(d.clone())));
        match o.get("uniqueItems") {
            Some(Value::Bool(false)) => {
                o.remove("uniqueItems");
            }
            Some(Value::Bool(true)) => {
                o.remove("uniqueItems");
                o.insert(super::unique_items::MARKER.into(), Value::Bool(true));
            }
            _ => {}
        }
        if let Some(&(_, rx)) = FORMAT_PATTERNS.iter().find(|(f, _)| o.get("format").and_then(Value::as_str) == Some(*f)) {
            if !o.contains_key("pattern") {
                o.remove("format");
                o.insert("pattern".into(), Value::from(rx));
            }
        }
        if self.strict && o.get("format").and_then(Value::as_str) == Some("email") && !o.contains_key("pattern") {
            o.insert("pattern".into(), Value::from(EMAIL_PATTERN));
        }
        if self.strict && !o.contains_key("maxLength") {
            let format = o.get("format").and_then(Value::as_str);
            if let Some(&(_, n)) = FORMAT_MAX_LENGTH.iter().find(|(f, _)| Some(*f) == format) {
                o.insert("maxLength".into(), Value::from(n));
            }
        }
        let open = !o.contains_key("additionalProperties") && !o.contains_key("unevaluatedProperties");
        if self.strict && open && !part {
            if !o.contains_key("allOf") && is_object_schema(o) {
                o.insert("additionalProperties".into(), Value::Bool(false));
            } else if let Some(names) = self.all_of_names(o) {
                // The object allOf composes allows the members its parts name, and no others:
                // the parts stay open, this schema lists every name and closes.
                let props = o.entry("properties").or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(props) = props {
                    for n in names {
                        props.entry(n).or_insert(Value::Bool(true));
                    }
                    o.insert("additionalProperties".into(), Value::Bool(false));
                }
            }
        }
        property_counts(o)
    }

    /// The member names of an object an `allOf` of plain object parts composes (each part a
    /// schema with `properties`, or a reference to one among the root's definitions); `None`
    /// when a part is anything else (open to patterns, composed again, an outside reference).
    fn all_of_names(&self, o: &Map<String, Value>) -> Option<Vec<String>> {
        let parts = o.get("allOf")?.as_array().filter(|a| a.len() > 1)?;
        let mut names: Vec<String> =
            o.get("properties").and_then(Value::as_object).map(|p| p.keys().cloned().collect()).unwrap_or_default();
        let mut add = |s: &Map<String, Value>| -> Option<()> {
            let plain = ["patternProperties", "allOf", "anyOf", "oneOf", "$ref", "if", "unevaluatedProperties"]
                .iter()
                .all(|k| !s.contains_key(*k));
            let closed_or_unsaid = matches!(s.get("additionalProperties"), None | Some(Value::Bool(false)));
            if !plain || !closed_or_unsaid || !is_object_schema(s) {
                return None;
            }
            for n in s.get("properties").and_then(Value::as_object).into_iter().flat_map(|p| p.keys()) {
                if !names.contains(n) {
                    names.push(n.clone());
                }
            }
            Some(())
        };
        for part in parts {
            let part = part.as_object()?;
            match part.get("$ref").and_then(Value::as_str) {
                Some(r) if part.len() == 1 => add(self.definition(r)?)?,
                _ => add(part)?,
            }
        }
        Some(names)
    }

    /// `#/$defs/Name` or `#/definitions/Name` among the root's definitions.
    fn definition(&self, r: &str) -> Option<&Map<String, Value>> {
        self.defs.iter().find_map(|(k, defs)| {
            let name = r.strip_prefix("#/")?.strip_prefix(k)?.strip_prefix('/')?;
            let name = name.replace("~1", "/").replace("~0", "~");
            defs.get(&name)?.as_object()
        })
    }
}

/// `~` and `/` as a JSON pointer writes them.
fn pointer_escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

/// A `propertyNames` every member name satisfies.
fn any_name(v: &Value) -> bool {
    match v {
        Value::Bool(true) => true,
        Value::Object(o) => o.iter().all(|(k, v)| match k.as_str() {
            "type" => v == "string",
            "title" | "description" | "$comment" => true,
            _ => false,
        }),
        _ => false,
    }
}

/// A schema for objects: `type` says so, or it lists `properties` without a `type`.
fn is_object_schema(o: &Map<String, Value>) -> bool {
    match o.get("type") {
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
        Some(_) => false,
        None => o.contains_key("properties") || o.contains_key("required") || o.contains_key("patternProperties"),
    }
}

fn count(o: &Map<String, Value>, k: &str) -> Result<Option<usize>, String> {
    match o.get(k) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|n| Some(n.min(usize::MAX as u64) as usize))
            .ok_or_else(|| format!("{k} must be a non-negative integer, got {}", short(v))),
    }
}

fn short(v: &Value) -> String {
    v.to_string().chars().take(40).collect()
}

/// `minProperties` / `maxProperties` on a closed object with named `properties`, rewritten as
/// the module note says; on an open object they are left to llguidance, which takes them when
/// every listed property is required and otherwise refuses naming them.
fn property_counts(o: &mut Map<String, Value>) -> Result<(), String> {
    let (min, max) = (count(o, "minProperties")?, count(o, "maxProperties")?);
    if min.is_none() && max.is_none() {
        return Ok(());
    }
    let closed = o.get("additionalProperties") == Some(&Value::Bool(false)) && !o.contains_key("patternProperties");
    let names: Vec<String> =
        o.get("properties").and_then(Value::as_object).map(|p| p.keys().cloned().collect()).unwrap_or_default();
    let required: Vec<String> = o
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).map(String::from).collect())
        .unwrap_or_default();
    let optional: Vec<&String> = names.iter().filter(|n| !required.contains(n)).collect();
    if !closed || optional.is_empty() {
        return Ok(());
    }
    let present_required = names.iter().filter(|n| required.contains(n)).count();
    // Bounds every value meets say nothing.
    let min = min.filter(|&m| m > present_required);
    let max = max.filter(|&m| m < names.len());
    o.remove("minProperties");
    o.remove("maxProperties");
    let branches: Vec<Map<String, Value>> = match (min, max) {
        (None, None) => return Ok(()),
        (Some(_), Some(_)) => {
            return Err("minProperties together with maxProperties on an object with optional properties is not supported; \
                 give one of them, or make the properties required"
                .into())
        }
        (Some(m), None) => {
            let k = m - present_required;
            subsets(&optional, k, "minProperties")?
                .into_iter()
                .map(|chosen| {
                    let mut b = validation_part(o);
                    let mut req = required.clone();
                    req.extend(chosen.into_iter().cloned());
                    b.insert("required".into(), Value::from(req));
                    b
                })
                .collect()
        }
        (None, Some(m)) => {
            if m < present_required {
                return Err(format!("maxProperties {m} is less than the {present_required} required properties"));
            }
            subsets(&optional, m - present_required, "maxProperties")?
                .into_iter()
                .map(|allowed| {
                    let mut b = validation_part(o);
                    if let Some(Value::Object(props)) = b.get_mut("properties") {
                        for n in optional.iter().filter(|n| !allowed.contains(n)) {
                            props.insert((*n).clone(), Value::Bool(false));
                        }
                    }
                    b
                })
                .collect()
        }
    };
    o.retain(|k, _| DOCUMENT_KEYS.contains(&k.as_str()) || matches!(k.as_str(), "title" | "description"));
    o.insert("anyOf".into(), Value::Array(branches.into_iter().map(Value::Object).collect()));
    Ok(())
}

/// The object's keys that constrain the value (what a branch repeats).
fn validation_part(o: &Map<String, Value>) -> Map<String, Value> {
    o.iter().filter(|(k, _)| !DOCUMENT_KEYS.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// Every `k`-element subset of `items`, in order; more than [`MAX_BRANCHES`] is refused
/// naming `keyword`.
fn subsets<'a>(items: &[&'a String], k: usize, keyword: &str) -> Result<Vec<Vec<&'a String>>, String> {
    if k > items.len() {
        return Err(format!("{keyword} asks for more properties than the object has"));
    }
    let mut n: u128 = 1;
    for i in 0..k {
        n = n * (items.len() - i) as u128 / (i + 1) as u128;
        if n > MAX_BRANCHES as u128 {
            return Err(format!(
                "{keyword} over {} optional properties has more than {MAX_BRANCHES} ways to be met; \
                 make some of the properties required",
                items.len()
            ));
        }
    }
    let mut out = Vec::new();
    let mut pick = Vec::with_capacity(k);
    fn go<'a>(items: &[&'a String], k: usize, from: usize, pick: &mut Vec<&'a String>, out: &mut Vec<Vec<&'a String>>) {
        if pick.len() == k {
            out.push(pick.clone());
            return;
        }
        for i in from..items.len() {
            pick.push(items[i]);
            go(items, k, i + 1, pick, out);
            pick.pop();
        }
    }
    go(items, k, 0, &mut pick, &mut out);
    Ok(out)
}

#[cfg(test)]
#[path = "json_schema_tests.rs"]
mod tests;
