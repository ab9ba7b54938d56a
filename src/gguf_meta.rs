//! Typed reads of GGUF metadata (`HashMap<String, gguf_file::Value>`), shared by the model
//! config (`model::config`) and the tokenizer (`tokenizer::gguf`).
//!
//! Every getter returns `Ok(None)` for a missing key and an `Err` naming the key (and, for
//! arrays, the index) when the value has another type. Callers that treat a wrongly typed value
//! as absent use `.ok().flatten()`. This module depends on neither `model` nor `tokenizer`.

use std::collections::HashMap;
use std::fmt;

use candle_core::quantized::gguf_file::Value;

/// GGUF metadata as candle reads it.
pub type Metadata = HashMap<String, Value>;

/// `GGUF metadata {at}: expected {what}, got {type}`.
fn type_error(at: fmt::Arguments, what: &str, v: &Value) -> String {
    format!("GGUF metadata {at}: expected {what}, got {:?}", v.value_type())
}

/// Any integer type (or a bool) as `i64`; `None` for other types and for a `U64` above
/// `i64::MAX`.
pub fn value_to_i64(v: &Value) -> Option<i64> {
    Some(match v {
        Value::U8(x) => *x as i64,
        Value::I8(x) => *x as i64,
        Value::U16(x) => *x as i64,
        Value::I16(x) => *x as i64,
        Value::U32(x) => *x as i64,
        Value::I32(x) => *x as i64,
        Value::U64(x) => i64::try_from(*x).ok()?,
        Value::I64(x) => *x,
        Value::Bool(b) => *b as i64,
        _ => return None,
    })
}

pub fn get_str<'a>(md: &'a Metadata, key: &str) -> Result<Option<&'a str>, String> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(v) => Err(type_error(format_args!("'{key}'"), "a string", v)),
    }
}

/// A bool, or an integer read as `!= 0`.
pub fn get_bool(md: &Metadata, key: &str) -> Result<Option<bool>, String> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => value_to_i64(v).map(|x| Some(x != 0)).ok_or_else(|| type_error(format_args!("'{key}'"), "a bool", v)),
    }
}

/// Any integer type (see [`value_to_i64`]).
pub fn get_int(md: &Metadata, key: &str) -> Result<Option<i64>, String> {
    match md.get(key) {
        None => Ok(None),
        Some(v) => value_to_i64(v).map(Some).ok_or_else(|| type_error(format_args!("'{key}'"), "an integer", v)),
    }
}

/// A size or count as llama.cpp writes it: an unsigned integer type or a bool (what candle's
/// `to_u64` upcasts), or an `I32`, whose negative values wrap as `as u64` does.
pub fn get_u64(md: &Metadata, key: &str) -> Result<Option<u64>, String> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::I32(x)) => Ok(Some(*x as u64)),
        Some(v) => v.to_u64().map(Some).map_err(|_| type_error(format_args!("'{key}'"), "an unsigned integer", v)),
    }
}

/// A `U32` exactly.
pub fn get_u32(md: &Metadata, key: &str) -> Result<Option<u32>, String> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::U32(x)) => Ok(Some(*x)),
        Some(v) => Err(type_error(format_args!("'{key}'"), "a u32", v)),
    }
}

/// An `F32` or `F64`.
pub fn get_f64(md: &Metadata, key: &str) -> Result<Option<f64>, String> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::F32(x)) => Ok(Some(f64::from(*x))),
        Some(Value::F64(x)) => Ok(Some(*x)),
        Some(v) => Err(type_error(format_args!("'{key}'"), "a float", v)),
    }
}

/// A token id; negative values (llama.cpp writes -1 for "none") read as absent, ids at or
/// above `n_tokens` are an error.
pub fn get_token_id(md: &Metadata, key: &str, n_tokens: usize) -> Result<Option<u32>, String> {
    let Some(id) = get_int(md, key)? else {
        return Ok(None);
    };
    if id < 0 {
        return Ok(None);
    }
    if id as u64 >= n_tokens as u64 {
        return Err(format!("GGUF metadata '{key}' = {id} is out of range for a vocabulary of {n_tokens} tokens"));
    }
    Ok(Some(id as u32))
}

pub fn get_array<'a>(md: &'a Metadata, key: &str) -> Result<Option<&'a Vec<Value>>, String> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::Array(a)) => Ok(Some(a)),
        Some(v) => Err(type_error(format_args!("'{key}'"), "an array", v)),
    }
}

/// The array at `key` with every element read by `elem` (`None` = wrong type: an error naming
/// `key[i]` and `what`).
fn get_array_of<'a, T>(
    md: &'a Metadata,
    key: &str,
    what: &str,
    elem: impl Fn(&'a Value) -> Option<T>,
) -> Result<Option<Vec<T>>, String> {
    let Some(a) = get_array(md, key)? else {
        return Ok(None);
    };
    a.iter()
        .enumerate()
        .map(|(i, v)| elem(v).ok_or_else(|| type_error(format_args!("'{key}'[{i}]"), what, v)))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

pub fn get_str_array<'a>(md: &'a Metadata, key: &str) -> Result<Option<Vec<&'a str>>, String> {
    get_array_of(md, key, "a string", |v| match v {
        Value::String(s) => Some(s.as_str()),
        _ => None,
    })
}

pub fn get_int_array(md: &Metadata, key: &str) -> Result<Option<Vec<i64>>, String> {
    get_array_of(md, key, "an integer", value_to_i64)
}

/// Floats; integer elements are converted.
pub fn get_f32_array(md: &Metadata, key: &str) -> Result<Option<Vec<f32>>, String> {
    get_array_of(md, key, "a float", |v| match v {
        Value::F32(x) => Some(*x),
        Value::F64(x) => Some(*x as f32),
        v => value_to_i64(v).map(|x| x as f32),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(entries: Vec<(&str, Value)>) -> Metadata {
        entries.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
    }

    #[test]
    fn missing_is_none_and_wrong_types_name_the_key() {
        let m = md(vec![
            ("s", Value::String("x".into())),
            ("n", Value::U16(7)),
            ("a", Value::Array(vec![Value::String("t".into()), Value::F32(1.5)])),
        ]);
        assert_eq!(get_str(&m, "s"), Ok(Some("x")));
        assert_eq!(get_str(&m, "missing"), Ok(None));
        assert_eq!(get_str(&m, "n").unwrap_err(), "GGUF metadata 'n': expected a string, got U16");
        assert_eq!(get_bool(&m, "n"), Ok(Some(true)));
        assert_eq!(get_int(&m, "n"), Ok(Some(7)));
        assert_eq!(get_array(&m, "s").unwrap_err(), "GGUF metadata 's': expected an array, got String");
        assert_eq!(get_str_array(&m, "a").unwrap_err(), "GGUF metadata 'a'[1]: expected a string, got F32");
        assert_eq!(get_int_array(&m, "a").unwrap_err(), "GGUF metadata 'a'[0]: expected an integer, got String");
        assert_eq!(get_f32_array(&m, "missing"), Ok(None));
    }

    #[test]
    fn numbers() {
        let m = md(vec![
            ("u8", Value::U8(3)),
            ("i32", Value::I32(-1)),
            ("i64", Value::I64(5)),
            ("u32", Value::U32(9)),
            ("f32", Value::F32(0.5)),
            ("f64", Value::F64(0.25)),
            ("big", Value::U64(u64::MAX)),
        ]);
        assert_eq!(get_u64(&m, "u8"), Ok(Some(3)));
        assert_eq!(get_u64(&m, "i32"), Ok(Some(u64::MAX)));
        assert!(get_u64(&m, "i64").is_err());
        assert_eq!(get_u64(&m, "big"), Ok(Some(u64::MAX)));
        assert!(get_int(&m, "big").is_err());
        assert_eq!(get_u32(&m, "u32"), Ok(Some(9)));
        assert!(get_u32(&m, "u8").is_err());
        assert_eq!(get_f64(&m, "f32"), Ok(Some(0.5)));
        assert_eq!(get_f64(&m, "f64"), Ok(Some(0.25)));
        assert!(get_f64(&m, "u32").is_err());
        assert_eq!(get_token_id(&m, "u32", 10), Ok(Some(9)));
        assert_eq!(get_token_id(&m, "i32", 10), Ok(None));
        assert_eq!(
            get_token_id(&m, "u32", 9).unwrap_err(),
            "GGUF metadata 'u32' = 9 is out of range for a vocabulary of 9 tokens"
        );
    }
}
