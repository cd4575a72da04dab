//! Python's spelling of values, for the chat template: `json.dumps` (HF's `tojson` filter),
//! `str()` (what Jinja2 prints for `{{ value }}`) and `datetime.strftime` (HF's
//! `strftime_now`).
//!
//! A chat template is written against Jinja2, which runs on Python objects; MiniJinja's own
//! spellings differ (`true`/`none` for `True`/`None`, compact HTML-escaping JSON), and every
//! character the template prints is a character the engine tokenizes, so the prompt's count
//! depends on printing exactly what Python prints.

use std::fmt::Write as _;

use minijinja::value::ValueKind;
use minijinja::{Error, ErrorKind, Value};

use crate::units::{civil_from_days, days_from_civil};

/// The options of `json.dumps` that HF's `tojson` exposes:
/// `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
pub(crate) struct Json {
    /// `None`: everything on one line; `Some(unit)`: a newline and `unit` per level.
    pub indent: Option<String>,
    /// Between items (`", "` on one line, `","` with an indent: Python's defaults).
    pub item_separator: String,
    /// Between a key and its value.
    pub key_separator: String,
    pub sort_keys: bool,
    pub ensure_ascii: bool,
}

impl Json {
    /// Python's defaults for the given indent: `(", ", ": ")` without one, `(",", ": ")` with.
    pub fn new(indent: Option<String>) -> Json {
        let item_separator = if indent.is_some() { "," } else { ", " };
        Json {
            indent,
            item_separator: item_separator.to_owned(),
            key_separator: ": ".to_owned(),
            sort_keys: false,
            ensure_ascii: false,
        }
    }

    /// `json.dumps(value, ...)` with these options.
    pub fn dumps(&self, value: &Value) -> Result<String, Error> {
        let mut out = String::new();
        self.write(value, 0, &mut out)?;
        Ok(out)
    }

    fn write(&self, value: &Value, depth: usize, out: &mut String) -> Result<(), Error> {
        match value.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => write_number(value, true, out),
            ValueKind::String => {
                let s = value.as_str().unwrap_or_default();
                write_json_string(s, self.ensure_ascii, out);
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.write_container(out, depth, '[', ']', &items, |item, depth, out| {
                    self.write(item, depth, out)
                })?;
            }
            ValueKind::Map => {
                let mut entries = Vec::new();
                for key in value.try_iter()? {
                    let item = value.get_item(&key)?;
                    entries.push((json_key(&key)?, item));
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.write_container(out, depth, '{', '}', &entries, |(key, item), depth, out| {
                    write_json_string(key, self.ensure_ascii, out);
                    out.push_str(&self.key_separator);
                    self.write(item, depth, out)
                })?;
            }
            // Python raises TypeError for what json cannot spell: an undefined variable, bytes,
            // a namespace or a macro.
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("Object of type {} is not JSON serializable", value.kind()),
                ))
            }
        }
        Ok(())
    }

    /// A list or an object: empty as `[]`/`{}` whatever the indent, as Python does.
    fn write_container<T>(
        &self,
        out: &mut String,
        depth: usize,
        open: char,
        close: char,
        items: &[T],
        mut each: impl FnMut(&T, usize, &mut String) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if items.is_empty() {
            out.push(close);
            return Ok(());
        }
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                out.push_str(&self.item_separator);
            }
            self.newline(out, depth + 1);
            each(item, depth + 1, out)?;
        }
        self.newline(out, depth);
        out.push(close);
        Ok(())
    }

    fn newline(&self, out: &mut String, depth: usize) {
        if let Some(unit) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(unit);
            }
        }
    }
}

/// A dict key as `json.dumps` writes it: strings as they are, numbers, booleans and None
/// spelled as JSON; anything else is Python's TypeError.
fn json_key(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_owned(),
        ValueKind::None => "null".to_owned(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_owned(),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(key, true, &mut s);
            s
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("keys must be str, int, float, bool or None, not {kind}"),
            ))
        }
    })
}

/// Python's `json.encoder.py_encode_basestring` (or its ASCII twin): `"` and `\` escaped, the
/// five short control escapes, other control characters as `\u00XX`.
fn write_json_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.reserve(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A number as Python spells it: integers as they are, floats as `repr(float)`; `json` spells
/// the non-finite ones `NaN` and `Infinity`, `str()` spells them `nan` and `inf`.
fn write_number(value: &Value, json: bool, out: &mut String) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return;
    }
    let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    if f.is_nan() {
        out.push_str(if json { "NaN" } else { "nan" });
    } else if f.is_infinite() {
        if f < 0.0 {
            out.push('-');
        }
        out.push_str(if json { "Infinity" } else { "inf" });
    } else {
        out.push_str(&float_repr(f));
    }
}

/// `repr(float)`: the shortest digits that read back to the same float (Rust's `{:e}` finds the
/// same digits), positioned as Python does: plain notation for a decimal exponent from -4 to
/// 15 with at least one digit after the point, scientific with a signed two-digit exponent
/// otherwise (`1e+16`, `1.5e-05`).
pub(crate) fn float_repr(f: f64) -> String {
    let sci = format!("{:e}", f.abs());
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let mut out = String::new();
    if f.is_sign_negative() {
        out.push('-');
    }
    if (-4..16).contains(&exponent) {
        if exponent < 0 {
            out.push_str("0.");
            for _ in 0..(-exponent - 1) {
                out.push('0');
            }
            out.push_str(&digits);
        } else {
            let point = exponent as usize + 1;
            if digits.len() <= point {
                out.push_str(&digits);
                for _ in digits.len()..point {
                    out.push('0');
                }
                out.push_str(".0");
            } else {
                out.push_str(&digits[..point]);
                out.push('.');
                out.push_str(&digits[point..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(
            out,
            "e{}{:02}",
            if exponent < 0 { '-' } else { '+' },
            exponent.abs()
        );
    }
    out
}

/// `str(value)`: what Jinja2 prints for `{{ value }}` and what its `string` filter returns.
pub(crate) fn str(value: &Value, out: &mut String) {
    match value.kind() {
        // Jinja2's Undefined prints as nothing.
        ValueKind::Undefined => {}
        ValueKind::String => out.push_str(value.as_str().unwrap_or_default()),
        _ => repr(value, out),
    }
}

/// `repr(value)`: how Python spells a value inside a printed list or dict.
fn repr(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => write_number(value, false, out),
        ValueKind::String => repr_string(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq => {
            out.push('[');
            if let Ok(items) = value.try_iter() {
                for (i, item) in items.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    repr(&item, out);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(keys) = value.try_iter() {
                for (i, key) in keys.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    repr(&key, out);
                    out.push_str(": ");
                    repr(&value.get_item(&key).unwrap_or_default(), out);
                }
            }
            out.push('}');
        }
        // Objects with no Python twin (a loop, a macro, a namespace): MiniJinja's spelling.
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

/// `repr(str)`: single quotes unless the text has a single quote and no double one; the
/// backslash, the quote and the control characters escaped. Python also escapes the printable
/// characters' complement in the rest of Unicode (`str.isprintable`); here the common ones
/// (C1 controls, the no-break and zero-width spaces, line and paragraph separators, the byte
/// order mark) are, which covers what a chat template meets.
fn repr_string(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if not_printable(c) => {
                let n = c as u32;
                let _ = if n <= 0xff {
                    write!(out, "\\x{n:02x}")
                } else if n <= 0xffff {
                    write!(out, "\\u{n:04x}")
                } else {
                    write!(out, "\\U{n:08x}")
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

fn not_printable(c: char) -> bool {
    matches!(c as u32,
        0x00..=0x1f | 0x7f..=0xa0 | 0xad | 0x1680 | 0x180e | 0x2000..=0x200f | 0x2028..=0x202f
        | 0x205f..=0x2064 | 0x2066..=0x206f | 0x3000 | 0xd800..=0xdfff | 0xe000..=0xf8ff
        | 0xfeff | 0xfff9..=0xfffb)
}

/// `datetime.strftime(format)` for a UTC time given as seconds since the epoch, with the
/// directives chat templates use (`%d %b %Y` is Llama 3's) and those C's strftime adds that
/// glibc's Python passes through (`%e`, `%-d`, `%F`, `%T`). An unknown directive is written as it
/// is, as glibc does.
pub(crate) fn strftime(format: &str, unix_seconds: i64) -> String {
    const DAYS: [&str; 7] = [
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
    ];
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
    let days = unix_seconds.div_euclid(86_400);
    let secs = unix_seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let weekday = (days + 4).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let month_name = MONTHS[(month - 1) as usize];
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };

    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        // glibc's `%-d`: the number without padding.
        let unpadded = chars.peek() == Some(&'-');
        if unpadded {
            chars.next();
        }
        let number = |out: &mut String, n: i64, width: usize| {
            let _ = if unpadded {
                write!(out, "{n}")
            } else {
                write!(out, "{n:0width$}")
            };
        };
        match chars.next() {
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('b') | Some('h') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('d') => number(&mut out, day, 2),
            Some('e') => {
                let _ = write!(out, "{day:2}");
            }
            Some('m') => number(&mut out, month, 2),
            Some('y') => number(&mut out, year.rem_euclid(100), 2),
            Some('Y') => {
                let _ = write!(out, "{year}");
            }
            Some('H') => number(&mut out, hour, 2),
            Some('I') => number(&mut out, hour12, 2),
            Some('M') => number(&mut out, minute, 2),
            Some('S') => number(&mut out, second, 2),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('j') => number(&mut out, yday, 3),
            Some('F') => {
                let _ = write!(out, "{year}-{month:02}-{day:02}");
            }
            Some('T') => {
                let _ = write!(out, "{hour:02}:{minute:02}:{second:02}");
            }
            // A naive datetime has no zone: Python writes nothing.
            Some('Z') | Some('z') => {}
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test that unwraps fails loudly, which is its job
mod tests {
    use super::*;

    fn value(json: &str) -> Value {
        serde_json::from_str(json).unwrap()
    }

    fn py_str(v: &Value) -> String {
        let mut out = String::new();
        str(v, &mut out);
        out
    }

    // Expected strings from CPython 3.12: json.dumps(json.loads(src), ensure_ascii=False, ...).
    #[test]
    fn dumps_spells_json_as_python_does() {
        let v = value(r#"{"b": [1, 2.5, null, true], "a": "x\"y\n\u0001é<>&", "c": {}, "d": []}"#);
        assert_eq!(
            Json::new(None).dumps(&v).unwrap(),
            r#"{"b": [1, 2.5, null, true], "a": "x\"y\n\u0001é<>&", "c": {}, "d": []}"#
        );
        let mut sorted = Json::new(Some("  ".into()));
        sorted.sort_keys = true;
        assert_eq!(
            sorted.dumps(&v).unwrap(),
            "{\n  \"a\": \"x\\\"y\\n\\u0001é<>&\",\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"c\": {},\n  \"d\": []\n}"
        );
        let mut compact = Json::new(None);
        compact.item_separator = ",".into();
        compact.key_separator = ":".into();
        compact.ensure_ascii = true;
        assert_eq!(
            compact.dumps(&value(r#"{"k": ["é", "😀"]}"#)).unwrap(),
            r#"{"k":["\u00e9","\ud83d\ude00"]}"#
        );
        assert!(Json::new(None).dumps(&Value::UNDEFINED).is_err());
    }

    // Expected strings from CPython 3.12: repr(float(x)).
    #[test]
    fn floats_are_spelled_as_python_repr() {
        let cases = [
            (1.0, "1.0"),
            (2.5, "2.5"),
            (-0.0, "-0.0"),
            (0.1, "0.1"),
            (123456789.0, "123456789.0"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.25e-7, "1.25e-07"),
            (1e100, "1e+100"),
            (-3.75, "-3.75"),
        ];
        for (f, expected) in cases {
            assert_eq!(float_repr(f), expected, "{f}");
        }
    }

    // Expected strings from CPython 3.12: str(json.loads(src)).
    #[test]
    fn str_spells_values_as_python_does() {
        assert_eq!(py_str(&value("null")), "None");
        assert_eq!(py_str(&value("true")), "True");
        assert_eq!(py_str(&value("1.0")), "1.0");
        assert_eq!(py_str(&value(r#""plain""#)), "plain");
        assert_eq!(
            py_str(&value(
                r#"{"a": [1, "it's", "x\ny", null, false], "b": "\"q\""}"#
            )),
            r#"{'a': [1, "it's", 'x\ny', None, False], 'b': '"q"'}"#
        );
        assert_eq!(py_str(&Value::UNDEFINED), "");
    }

    #[test]
    fn strftime_spells_dates_as_python_does() {
        // 2024-07-26 13:25:09 UTC, a Friday, day 208 of a leap year.
        let t = 1_722_000_309;
        assert_eq!(strftime("%d %b %Y", t), "26 Jul 2024");
        assert_eq!(
            strftime("%A %B %-d, %y %H:%M:%S %p %j", t),
            "Friday July 26, 24 13:25:09 PM 208"
        );
        assert_eq!(
            strftime("%F %T %I %e %% %Q", t),
            "2024-07-26 13:25:09 01 26 % %Q"
        );
        assert_eq!(strftime("%Y-%m-%d %a", 0), "1970-01-01 Thu");
        assert_eq!(strftime("%Y-%m-%d %j", 951_782_400), "2000-02-29 060");
    }
}
