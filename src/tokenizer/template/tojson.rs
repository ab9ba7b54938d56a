//! The `tojson` filter, Python-style: the output of `json.dumps` as transformers installs it
//! (separators, indent, `sort_keys`, `ensure_ascii`, float `repr`), within the render's output
//! cap.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

use super::output_cap;

/// `x|tojson(indent=None, separators=None, sort_keys=False, ensure_ascii=False)` with the output of
/// Python's `json.dumps` (the filter transformers installs).
pub(super) fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent: Option<String> = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.kind() {
            ValueKind::String => Some(v.as_str().unwrap_or("").to_owned()),
            ValueKind::Number => {
                let n = usize::try_from(v.clone()).unwrap_or(0);
                if n > output_cap() {
                    return Err(Error::new(ErrorKind::InvalidOperation, format!("tojson: indent {n} is too large")));
                }
                Some(" ".repeat(n))
            }
            _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: indent must be an integer or a string")),
        },
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let separators = kwargs.get::<Option<Value>>("separators")?;
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() && !v.is_undefined() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match (parts.first().and_then(|p| p.as_str()), parts.get(1).and_then(|p| p.as_str())) {
                (Some(a), Some(b)) if parts.len() == 2 => (a.to_owned(), b.to_owned()),
                _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be a pair of strings")),
            }
        }
        _ => (if indent.is_some() { ",".into() } else { ", ".into() }, ": ".into()),
    };
    kwargs.assert_all_used()?;
    let mut w = PyJson { out: String::new(), indent, item_sep, key_sep, sort_keys, ensure_ascii };
    w.value(value, 0)?;
    Ok(Value::from_safe_string(w.out))
}

struct PyJson {
    out: String,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl PyJson {
    fn newline(&mut self, level: usize) -> Result<(), Error> {
        if let Some(ind) = &self.indent {
            // The indent repeats once per level: stop at the render cap, not at memory's end.
            let cap = output_cap();
            if ind.len().saturating_mul(level).saturating_add(self.out.len()) >= cap {
                return Err(Error::new(ErrorKind::InvalidOperation, format!("tojson: the output exceeds {cap} bytes")));
            }
            self.out.push('\n');
            for _ in 0..level {
                self.out.push_str(ind);
            }
        }
        Ok(())
    }

    fn value(&mut self, v: &Value, level: usize) -> Result<(), Error> {
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self.out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => self.number(v),
            ValueKind::String | ValueKind::Plain => {
                let s = v.to_string();
                self.string(&s)
            }
            ValueKind::Bytes => {
                let items: Vec<Value> = v.as_bytes().unwrap_or(&[]).iter().map(|b| Value::from(*b)).collect();
                self.seq(&items, level)?
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.seq(&items, level)?
            }
            ValueKind::Map => {
                let mut entries: Vec<(String, Value)> = Vec::new();
                for k in v.try_iter()? {
                    let val = v.get_item(&k)?;
                    entries.push((key_string(&k), val));
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                if entries.is_empty() {
                    self.out.push_str("{}");
                    return Ok(());
                }
                self.out.push('{');
                for (i, (k, val)) in entries.iter().enumerate() {
                    if i > 0 {
                        let sep = self.item_sep.clone();
                        self.out.push_str(&sep);
                    }
                    self.newline(level + 1)?;
                    self.string(k);
                    let sep = self.key_sep.clone();
                    self.out.push_str(&sep);
                    self.value(val, level + 1)?;
                }
                self.newline(level)?;
                self.out.push('}');
            }
            ValueKind::Invalid => {
                return Err(Error::new(ErrorKind::InvalidOperation, "tojson: invalid value"));
            }
            _ => {
                let s = v.to_string();
                self.string(&s)
            }
        }
        Ok(())
    }

    fn seq(&mut self, items: &[Value], level: usize) -> Result<(), Error> {
        if items.is_empty() {
            self.out.push_str("[]");
            return Ok(());
        }
        self.out.push('[');
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                let sep = self.item_sep.clone();
                self.out.push_str(&sep);
            }
            self.newline(level + 1)?;
            self.value(item, level + 1)?;
        }
        self.newline(level)?;
        self.out.push(']');
        Ok(())
    }

    fn number(&mut self, v: &Value) {
        if v.is_integer() {
            // i128/u128 print fine through Display.
            self.out.push_str(&v.to_string());
            return;
        }
        let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
        self.out.push_str(&py_float_repr(f));
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{8}' => self.out.push_str("\\b"),
                '\u{c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 => self.out.push_str(&format!("\\u{:04x}", c as u32)),
                c if self.ensure_ascii && (c as u32) > 0x7e => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        self.out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// Python's `json.dumps` key coercion: str as is, numbers/bools/None to their JSON text.
fn key_string(k: &Value) -> String {
    match k.kind() {
        ValueKind::String => k.as_str().unwrap_or("").to_owned(),
        ValueKind::Bool => (if k.is_true() { "true" } else { "false" }).to_owned(),
        ValueKind::None | ValueKind::Undefined => "null".to_owned(),
        ValueKind::Number if !k.is_integer() => py_float_repr(f64::try_from(k.clone()).unwrap_or(f64::NAN)),
        _ => k.to_string(),
    }
}

/// `repr(float)` as Python prints it in JSON: `1.0`, `0.1`, `1e+16`, `1.5e-07`, `NaN`, `Infinity`.
pub(super) fn py_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    let abs = f.abs();
    if abs != 0.0 && !(1e-4..1e16).contains(&abs) {
        // Scientific: shortest round-trip mantissa, exponent with sign and at least 2 digits.
        let s = format!("{f:e}");
        let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mant}e{sign}{:02}", exp.abs());
    }
    let s = format!("{f}");
    if s.contains('.') {
        s
    } else {
        format!("{s}.0")
    }
}
