//! The globals and filters a chat template gets beyond minijinja's own, as transformers has
//! them: `raise_exception`, `strftime_now` (with a C `strftime` subset, in UTC), and `indent` /
//! `format` bounded to [`MAX_PAD`] characters of padding.

use minijinja::value::Kwargs;
use minijinja::{Error, ErrorKind, Value};

use super::output_cap;

/// Widest padding `indent` and `format` may produce: far beyond any chat template's needs.
pub const MAX_PAD: usize = 1024;

fn too_wide(what: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("{what} is wider than {MAX_PAD} characters"))
}

/// Jinja's `indent(width=4, first=false, blank=false)` with `width` at most [`MAX_PAD`] and
/// the result within the render's output cap.
pub(super) fn bounded_indent(
    value: String,
    width: Option<usize>,
    first: Option<bool>,
    blank: Option<bool>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let width = match width {
        Some(w) => w,
        None => kwargs.get::<Option<usize>>("width")?.unwrap_or(4),
    };
    let first = first.map_or_else(|| kwargs.get::<Option<bool>>("first").map(|v| v.unwrap_or(false)), Ok)?;
    let blank = blank.map_or_else(|| kwargs.get::<Option<bool>>("blank").map(|v| v.unwrap_or(false)), Ok)?;
    kwargs.assert_all_used()?;
    if width > MAX_PAD {
        return Err(too_wide("indent"));
    }
    let text = value.strip_suffix('\n').unwrap_or(&value);
    let text = text.strip_suffix('\r').unwrap_or(text);
    let lines = text.split('\n').count();
    if lines.saturating_mul(width + 1).saturating_add(text.len()) > output_cap() {
        return Err(Error::new(ErrorKind::InvalidOperation, "indent: the result would exceed the rendering limit"));
    }
    let pad = " ".repeat(width);
    let mut out = String::with_capacity(text.len() + lines * (width + 1));
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let is_blank = line.is_empty() || line == "\r";
        if (i > 0 || first) && (!is_blank || blank) {
            out.push_str(&pad);
        }
        out.push_str(line);
    }
    Ok(Value::from(out))
}

/// minijinja's `format` with every width and precision in the format string at most
/// [`MAX_PAD`] (and none taken from the arguments).
pub(super) fn bounded_format(
    state: &mut minijinja::State,
    format_str: &Value,
    args: minijinja::value::Rest<minijinja::value::ValueOrKwargs>,
) -> Result<Value, Error> {
    if let Some(f) = format_str.as_str() {
        let mut digits = 0usize;
        let mut in_spec = false;
        for c in f.chars() {
            match c {
                '%' | ':' => (in_spec, digits) = (true, 0),
                '*' if in_spec => return Err(too_wide("a format width taken from the arguments")),
                '0'..='9' if in_spec => {
                    digits = digits.saturating_mul(10).saturating_add(c as usize - '0' as usize);
                    if digits > MAX_PAD {
                        return Err(too_wide("a format width"));
                    }
                }
                '.' | '-' | '+' | ' ' | '#' | '<' | '>' | '^' | '=' if in_spec => digits = 0,
                _ => in_spec = false,
            }
        }
    }
    minijinja::filters::format(state, format_str, args)
}

pub(super) fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, format!("raise_exception: {msg}")))
}

pub(super) fn strftime_now(fmt: String) -> Result<Value, Error> {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    Ok(Value::from(strftime_utc(&fmt, secs)))
}

/// (year, month 1-12, day 1-31) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// A C `strftime` subset, in UTC: %Y %y %m %d %e %j %H %I %M %S %p %A %a %B %b %h %F %T %D %Z %z
/// %n %t %%; unknown directives are copied through.
pub(crate) fn strftime_utc(fmt: &str, unix_secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    let days = unix_secs.div_euclid(86_400);
    let sod = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (sod / 3600, (sod / 60) % 60, sod % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday (index 3)
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let h12 = if hh % 12 == 0 { 12 } else { hh % 12 };

    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('H') => out.push_str(&format!("{hh:02}")),
            Some('I') => out.push_str(&format!("{h12:02}")),
            Some('M') => out.push_str(&format!("{mm:02}")),
            Some('S') => out.push_str(&format!("{ss:02}")),
            Some('p') => out.push_str(if hh < 12 { "AM" } else { "PM" }),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('B') => out.push_str(MONTHS[m as usize - 1]),
            Some('b') | Some('h') => out.push_str(&MONTHS[m as usize - 1][..3]),
            Some('F') => out.push_str(&format!("{y}-{m:02}-{d:02}")),
            Some('T') => out.push_str(&format!("{hh:02}:{mm:02}:{ss:02}")),
            Some('D') => out.push_str(&format!("{m:02}/{d:02}/{:02}", y.rem_euclid(100))),
            Some('Z') => out.push_str("UTC"),
            Some('z') => out.push_str("+0000"),
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 } as i64;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}
