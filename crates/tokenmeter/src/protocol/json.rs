//! Lenient JSON field types shared by the extractors.
//!
//! Servers disagree about field types (Mistral sends `content` as an array of parts, some servers
//! send `null` where others omit a field, a few send counts as floats). With strict types one odd
//! field would make a whole event unreadable and lose its tokens, so the fields an extractor reads
//! use these types instead: each accepts any JSON value and keeps only what metering needs,
//! without allocating.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::Stop;

/// Parses a message's JSON payload. `None` for the `[DONE]` sentinel and an empty payload (a
/// keep-alive), which are not malformed, and for malformed input, which is counted.
pub fn parse<'a, T: Deserialize<'a>>(data: &'a [u8], malformed: &mut u64) -> Option<T> {
    if data == b"[DONE]" || data.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    match serde_json::from_slice(data) {
        Ok(v) => Some(v),
        Err(_) => {
            *malformed += 1;
            None
        }
    }
}

/// Whether a field carries generated output: a non-empty string, array or object.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Text(pub bool);

/// A flag: JSON `true`; anything else (`false`, `"true"`, `1`, `null`) is not set.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Flag(pub bool);

/// A token count: a non-negative integer (or an integral float); anything else is `None`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Count(pub Option<u64>);

/// A measure that may have a fraction (a duration in milliseconds, a rate): any finite
/// non-negative JSON number; anything else (a negative number, a string, `null`) is `None`.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Number(pub Option<f64>);

/// The length of an array; anything else is 0.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Len(pub u64);

/// A string; anything else is `None`. Borrowed from the input when it has no escapes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Str<'a>(pub Option<Cow<'a, str>>);

/// A finish reason: a string read by [`Stop::from_reason`], or an object whose `type` is one
/// (SGLang's `{"type": "stop"}`); anything else is `None`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Reason(pub Option<Stop>);

impl<'a> Str<'a> {
    pub fn as_deref(&self) -> Option<&str> {
        self.0.as_deref()
    }

    /// The string, unless it is absent or empty.
    pub fn non_empty(self) -> Option<Cow<'a, str>> {
        self.0.filter(|s| !s.is_empty())
    }
}

impl Count {
    /// `a + b`, where either may be absent; `None` only when both are.
    pub fn plus(self, other: Count) -> Option<u64> {
        match (self.0, other.0) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
        }
    }
}

/// Consumes the rest of a sequence, returning how many elements were left.
fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<u64, A::Error> {
    let mut n = 0u64;
    while seq.next_element::<IgnoredAny>()?.is_some() {
        n += 1;
    }
    Ok(n)
}

/// Consumes the rest of a map, returning how many entries were left.
fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<u64, A::Error> {
    let mut n = 0u64;
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {
        n += 1;
    }
    Ok(n)
}

/// Implements the scalar visits of a lenient visitor as "not this kind of value".
macro_rules! other_values {
    ($v:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok($v)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok($v)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok($v)
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok($v)
        }
    };
}

// === impl Text ===

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E>(self, v: &str) -> Result<Text, E> {
                Ok(Text(!v.is_empty()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Text, A::Error> {
                Ok(Text(drain_seq(seq)? > 0))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Text, A::Error> {
                Ok(Text(drain_map(map)? > 0))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Text, E> {
                Ok(Text(false))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Text, E> {
                Ok(Text(false))
            }
            other_values!(Text(false));
        }
        d.deserialize_any(V)
    }
}

// === impl Flag ===

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Flag;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_bool<E>(self, v: bool) -> Result<Flag, E> {
                Ok(Flag(v))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Flag, E> {
                Ok(Flag(false))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Flag, E> {
                Ok(Flag(false))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Flag, E> {
                Ok(Flag(false))
            }
            fn visit_str<E>(self, _: &str) -> Result<Flag, E> {
                Ok(Flag(false))
            }
            fn visit_unit<E>(self) -> Result<Flag, E> {
                Ok(Flag(false))
            }
            fn visit_none<E>(self) -> Result<Flag, E> {
                Ok(Flag(false))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Flag, A::Error> {
                drain_seq(seq)?;
                Ok(Flag(false))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Flag, A::Error> {
                drain_map(map)?;
                Ok(Flag(false))
            }
        }
        d.deserialize_any(V)
    }
}

// === impl Count ===

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Count;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_u64<E>(self, v: u64) -> Result<Count, E> {
                Ok(Count(Some(v)))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Count, E> {
                // 2^53: beyond it a float no longer holds every integer exactly.
                let exact = v >= 0.0 && v.fract() == 0.0 && v <= 9_007_199_254_740_992.0;
                Ok(Count(exact.then_some(v as u64)))
            }
            fn visit_str<E>(self, _: &str) -> Result<Count, E> {
                Ok(Count(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Count, A::Error> {
                drain_seq(seq)?;
                Ok(Count(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Count, A::Error> {
                drain_map(map)?;
                Ok(Count(None))
            }
            other_values!(Count(None));
        }
        d.deserialize_any(V)
    }
}

// === impl Number ===

impl<'de> Deserialize<'de> for Number {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Number;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_u64<E>(self, v: u64) -> Result<Number, E> {
                Ok(Number(Some(v as f64)))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Number, E> {
                Ok(Number((v.is_finite() && v >= 0.0).then_some(v)))
            }
            fn visit_str<E>(self, _: &str) -> Result<Number, E> {
                Ok(Number(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Number, A::Error> {
                drain_seq(seq)?;
                Ok(Number(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Number, A::Error> {
                drain_map(map)?;
                Ok(Number(None))
            }
            // A negative integer is no duration: `visit_i64` is among these.
            other_values!(Number(None));
        }
        d.deserialize_any(V)
    }
}

// === impl Len ===

impl<'de> Deserialize<'de> for Len {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Len;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Len, A::Error> {
                Ok(Len(drain_seq(seq)?))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Len, A::Error> {
                drain_map(map)?;
                Ok(Len(0))
            }
            fn visit_str<E>(self, _: &str) -> Result<Len, E> {
                Ok(Len(0))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Len, E> {
                Ok(Len(0))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Len, E> {
                Ok(Len(0))
            }
            other_values!(Len(0));
        }
        d.deserialize_any(V)
    }
}

// === impl Str ===

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Str<'de>, E> {
                Ok(Str(Some(Cow::Borrowed(v))))
            }
            fn visit_str<E>(self, v: &str) -> Result<Str<'de>, E> {
                Ok(Str(Some(Cow::Owned(v.to_owned()))))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Str<'de>, A::Error> {
                drain_seq(seq)?;
                Ok(Str(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Str<'de>, A::Error> {
                drain_map(map)?;
                Ok(Str(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Str<'de>, E> {
                Ok(Str(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Str<'de>, E> {
                Ok(Str(None))
            }
            other_values!(Str(None));
        }
        d.deserialize_any(V)
    }
}

// === impl Reason ===

impl<'de> Deserialize<'de> for Reason {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Reason;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E>(self, v: &str) -> Result<Reason, E> {
                Ok(Reason(Stop::from_reason(v)))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Reason, A::Error> {
                let mut found = None;
                while let Some(key) = map.next_key::<Str<'de>>()? {
                    if key.as_deref() == Some("type") {
                        found = map.next_value::<Reason>()?.0;
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(Reason(found))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Reason, A::Error> {
                drain_seq(seq)?;
                Ok(Reason(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Reason, E> {
                Ok(Reason(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Reason, E> {
                Ok(Reason(None))
            }
            other_values!(Reason(None));
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize)]
    struct T<'a> {
        #[serde(default)]
        t: Text,
        #[serde(default)]
        c: Count,
        #[serde(default)]
        l: Len,
        #[serde(default, borrow)]
        s: Str<'a>,
    }

    fn parse(json: &str) -> (bool, Option<u64>, u64, Option<String>) {
        let v: T<'_> = serde_json::from_str(json).expect("valid JSON");
        (v.t.0, v.c.0, v.l.0, v.s.0.map(|s| s.into_owned()))
    }

    #[test]
    fn reasons_fold_into_stop_or_length() {
        let r = |json: &str| serde_json::from_str::<Reason>(json).expect("valid JSON").0;
        assert_eq!(r(r#""stop""#), Some(Stop::Stop));
        assert_eq!(r(r#""eos_token""#), Some(Stop::Stop));
        assert_eq!(r(r#""end_turn""#), Some(Stop::Stop));
        assert_eq!(r(r#""length""#), Some(Stop::Length));
        assert_eq!(r(r#""MAX_TOKENS""#), Some(Stop::Length));
        assert_eq!(r(r#""max_tokens""#), Some(Stop::Length));
        assert_eq!(r(r#"{"type":"length","matched":null}"#), Some(Stop::Length));
        assert_eq!(r(r#"{"matched":"x","type":"stop"}"#), Some(Stop::Stop));
        for none in [r#""""#, "null", "3", "[1]", r#""not_finished""#, "{}"] {
            assert_eq!(r(none), None, "{none}");
        }
    }

    #[test]
    fn accepts_any_value_and_keeps_what_counts() {
        assert_eq!(parse("{}"), (false, None, 0, None));
        assert_eq!(
            parse(r#"{"t":"x","c":7,"l":[1,[2],{"a":3}],"s":"m"}"#),
            (true, Some(7), 3, Some("m".into()))
        );
        assert_eq!(
            parse(r#"{"t":"","c":7.0,"l":{"a":1},"s":["m"]}"#),
            (false, Some(7), 0, None)
        );
        assert_eq!(
            parse(r#"{"t":[{"type":"text"}],"c":-1,"l":null,"s":null}"#),
            (true, None, 0, None)
        );
        assert_eq!(
            parse(r#"{"t":{},"c":1.5,"l":"abc","s":"a\nb"}"#),
            (false, None, 0, Some("a\nb".into()))
        );
        assert_eq!(
            parse(r#"{"t":null,"c":"12","l":true,"s":3}"#),
            (false, None, 0, None)
        );
    }

    #[test]
    fn a_flag_is_set_only_by_true() {
        #[derive(Deserialize)]
        struct F {
            #[serde(default)]
            f: Flag,
        }
        let flag = |json: &str| serde_json::from_str::<F>(json).expect("valid JSON").f.0;
        assert!(flag(r#"{"f":true}"#));
        for json in [
            "{}",
            r#"{"f":false}"#,
            r#"{"f":null}"#,
            r#"{"f":"true"}"#,
            r#"{"f":1}"#,
            r#"{"f":-1}"#,
            r#"{"f":1.0}"#,
            r#"{"f":[true]}"#,
            r#"{"f":{"a":true}}"#,
        ] {
            assert!(!flag(json), "{json}");
        }
    }

    #[test]
    fn parse_counts_only_what_is_malformed() {
        let mut bad = 0;
        assert_eq!(
            super::parse::<T<'_>>(b"[DONE]", &mut bad).map(|t| t.c.0),
            None
        );
        assert_eq!(super::parse::<T<'_>>(b" \n", &mut bad).map(|t| t.c.0), None);
        assert_eq!(bad, 0);
        assert_eq!(
            super::parse::<T<'_>>(b"{\"c\":1", &mut bad).map(|t| t.c.0),
            None
        );
        assert_eq!(
            super::parse::<T<'_>>(b"nope", &mut bad).map(|t| t.c.0),
            None
        );
        assert_eq!(bad, 2);
        assert_eq!(
            super::parse::<T<'_>>(b"{\"c\":1}", &mut bad).map(|t| t.c.0),
            Some(Some(1))
        );
    }

    #[test]
    fn plus_is_none_only_when_both_are() {
        assert_eq!(Count(None).plus(Count(None)), None);
        assert_eq!(Count(Some(2)).plus(Count(None)), Some(2));
        assert_eq!(Count(Some(2)).plus(Count(Some(3))), Some(5));
    }
}
