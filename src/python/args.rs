//! Keyword arguments, checked the way lib/checks.ts checks Node's options objects: an unknown
//! key, a wrong type or an integer out of range is `INVALID_ARGUMENT` naming the option, never a
//! `TypeError` from deep inside or a silent wrap.

use pyo3::conversion::FromPyObjectOwned;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use super::error::invalid;

/// A function's keyword arguments (`**kwargs`).
pub struct Kwargs<'py> {
    dict: Option<Bound<'py, PyDict>>,
}

impl<'py> Kwargs<'py> {
    /// Refuses any key not in `known` (a misspelt option would otherwise be ignored).
    pub fn new(dict: Option<&Bound<'py, PyDict>>, known: &[&str], what: &str) -> PyResult<Self> {
        if let Some(d) = dict {
            for k in d.keys() {
                let k: String = k.extract().map_err(|_| invalid(format!("{what}: option names must be strings")))?;
                if !known.contains(&k.as_str()) {
                    let k: String = k.chars().take(64).collect();
                    return Err(invalid(match nearest(&k, known) {
                        Some(near) => format!("{what}: unknown option '{k}' (did you mean '{near}'?)"),
                        None => format!("{what}: unknown option '{k}' (known: {})", known.join(", ")),
                    }));
                }
            }
        }
        Ok(Self { dict: dict.cloned() })
    }

    /// The value of `key`; `None` when absent or `None`.
    pub fn any(&self, key: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(d) = &self.dict else { return Ok(None) };
        Ok(d.get_item(key)?.filter(|v| !v.is_none()))
    }

    pub fn u32(&self, key: &str) -> PyResult<Option<u32>> {
        self.any(key)?.map(|v| int(&v, key)).transpose()
    }

    /// A positive integer that fits a `u32` (a count that must be at least one).
    pub fn positive_u32(&self, key: &str) -> PyResult<Option<u32>> {
        let Some(v) = self.any(key)? else { return Ok(None) };
        let n: i128 = int(&v, key)?;
        match u32::try_from(n) {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(invalid(format!("{key} must be a positive integer (1 to {}), got {n}", u32::MAX))),
        }
    }

    pub fn u64(&self, key: &str) -> PyResult<Option<u64>> {
        self.any(key)?.map(|v| int(&v, key)).transpose()
    }

    /// A real number; NaN and infinities pass through to the engine's range checks.
    pub fn f64(&self, key: &str) -> PyResult<Option<f64>> {
        self.any(key)?.map(|v| float(&v, key)).transpose()
    }

    pub fn bool(&self, key: &str) -> PyResult<Option<bool>> {
        self.any(key)?.map(|v| boolean(&v, key)).transpose()
    }

    pub fn string(&self, key: &str) -> PyResult<Option<String>> {
        self.any(key)?.map(|v| string(&v, key)).transpose()
    }

    pub fn strings(&self, key: &str) -> PyResult<Option<Vec<String>>> {
        self.any(key)?.map(|v| strings(&v, key)).transpose()
    }
}

/// The known name closest to `key` (a typo: at most a third of its letters differ), if any.
fn nearest<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    let key: Vec<char> = key.to_lowercase().chars().collect();
    let distance = |k: &str| {
        let k: Vec<char> = k.to_lowercase().chars().collect();
        // Levenshtein distance, one row at a time.
        let mut row: Vec<usize> = (0..=k.len()).collect();
        for (i, a) in key.iter().enumerate() {
            let mut prev = row[0];
            row[0] = i + 1;
            for (j, b) in k.iter().enumerate() {
                let next = (prev + usize::from(a != b)).min(row[j] + 1).min(row[j + 1] + 1);
                prev = row[j + 1];
                row[j + 1] = next;
            }
        }
        row[k.len()]
    };
    let (best, d) = known.iter().map(|k| (*k, distance(k))).min_by_key(|&(_, d)| d)?;
    (d <= key.len().max(best.len()) / 3).then_some(best)
}

/// A non-negative integer that fits `T` (a `bool` is not a number here).
pub fn int<'py, T: FromPyObjectOwned<'py>>(v: &Bound<'py, PyAny>, what: &str) -> PyResult<T> {
    if !v.is_instance_of::<PyInt>() || v.is_instance_of::<PyBool>() {
        return Err(invalid(format!("{what} must be an integer, got {}", type_name(v))));
    }
    v.extract::<T>().map_err(|_| invalid(format!("{what} is out of range: {}", short(v))))
}

pub fn float(v: &Bound<'_, PyAny>, what: &str) -> PyResult<f64> {
    if !(v.is_instance_of::<PyFloat>() || v.is_instance_of::<PyInt>()) || v.is_instance_of::<PyBool>() {
        return Err(invalid(format!("{what} must be a number, got {}", type_name(v))));
    }
    // An int too large for a double is refused rather than rounded to infinity.
    v.extract::<f64>().map_err(|_| invalid(format!("{what} is out of range: {}", short(v))))
}

pub fn boolean(v: &Bound<'_, PyAny>, what: &str) -> PyResult<bool> {
    if !v.is_instance_of::<PyBool>() {
        return Err(invalid(format!("{what} must be True or False, got {}", type_name(v))));
    }
    v.extract::<bool>()
}

pub fn string(v: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    if !v.is_instance_of::<PyString>() {
        return Err(invalid(format!("{what} must be a string, got {}", type_name(v))));
    }
    // A lone surrogate cannot become UTF-8.
    v.extract::<String>().map_err(|_| invalid(format!("{what} is not valid Unicode text")))
}

/// A list or tuple of strings (a bare string is refused, not split into characters).
pub fn strings(v: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<String>> {
    seq(v, what)?.iter().map(|x| string(x, what)).collect()
}

/// The items of a list or tuple.
pub fn seq<'py>(v: &Bound<'py, PyAny>, what: &str) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if let Ok(l) = v.cast::<PyList>() {
        return Ok(l.iter().collect());
    }
    if let Ok(t) = v.cast::<PyTuple>() {
        return Ok(t.iter().collect());
    }
    Err(invalid(format!("{what} must be a list, got {}", type_name(v))))
}

/// A `dict` (for nested options and messages).
pub fn dict<'py>(v: &Bound<'py, PyAny>, what: &str) -> PyResult<Bound<'py, PyDict>> {
    v.cast::<PyDict>().cloned().map_err(|_| invalid(format!("{what} must be a dict, got {}", type_name(v))))
}

pub fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "an object".into())
}

/// At most 40 characters of `repr(v)`, for messages.
fn short(v: &Bound<'_, PyAny>) -> String {
    let r = v.repr().map(|r| r.to_string()).unwrap_or_default();
    let mut s: String = r.chars().take(40).collect();
    if s.len() < r.len() {
        s.push('…');
    }
    s
}
