//! The range a bill from a store covers: `--range 30d` ending now (or at `--end`), or `--start`
//! and `--end`.
//!
//! An instant is RFC 3339 (`2025-06-01T00:00:00Z`, `2025-06-01T02:00:00+02:00`, fractions of a
//! second kept to the millisecond) or unix seconds (`1748736000`, `1748736000.5`): what a person
//! types and what a script has. A length takes the units of every duration flag (`ms`, `s`, `m`,
//! `h`) and, since bills run over days and weeks, `d` and `w`. No crate for dates: a calendar
//! date to a day count is a dozen lines (`tokenmeter::units::days_from_civil`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokenmeter::reqlog::rfc3339;
use tokenmeter::units::{days_from_civil, parse_duration};

/// The instants a bill is taken between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub start: SystemTime,
    pub end: SystemTime,
}

impl Range {
    /// The range the flags give: `--start` and `--end`; `--range` ending at `--end`; either
    /// ending `now` without `--end`. Says which flag to fix when they do not make one.
    pub fn from_flags(
        range: Option<Duration>,
        start: Option<SystemTime>,
        end: Option<SystemTime>,
        now: SystemTime,
    ) -> Result<Range, String> {
        let end = end.unwrap_or(now);
        let start = match (range, start) {
            (Some(_), Some(_)) => {
                return Err("give --range or --start, not both (--end, or now, ends either)".into())
            }
            (None, None) => {
                return Err(
                    "--prometheus needs a range: --range 30d (ending now, or at --end), or --start and --end"
                        .into(),
                )
            }
            (Some(r), None) if r.is_zero() => return Err("--range must be longer than 0".into()),
            (Some(r), None) => end
                .checked_sub(r)
                .filter(|s| *s >= UNIX_EPOCH)
                .ok_or_else(|| "--range reaches back before 1970".to_string())?,
            (None, Some(s)) => s,
        };
        if start >= end {
            return Err(format!(
                "--start {} is not before --end {} (without --end: now)",
                rfc3339(start),
                rfc3339(end)
            ));
        }
        Ok(Range { start, end })
    }

    /// The length, as a PromQL range: whole seconds where it is, else milliseconds.
    pub fn window(&self) -> String {
        let ms = self.length().as_millis();
        if ms % 1000 == 0 {
            format!("{}s", ms / 1000)
        } else {
            format!("{ms}ms")
        }
    }

    /// The end as the query API's `time=`: unix seconds to the millisecond.
    pub fn end_param(&self) -> String {
        let d = self.end.duration_since(UNIX_EPOCH).unwrap_or_default();
        format!("{}.{:03}", d.as_secs(), d.subsec_millis())
    }

    pub fn length(&self) -> Duration {
        self.end.duration_since(self.start).unwrap_or_default()
    }

    /// "2025-06-01T00:00:00.000Z to 2025-07-01T00:00:00.000Z (30 d)", for the table.
    pub fn words(&self) -> String {
        let secs = self.length().as_secs_f64();
        let span = [(86_400.0, "d"), (3_600.0, "h"), (60.0, "min")]
            .iter()
            .find(|(unit, _)| secs >= *unit && secs % unit == 0.0)
            .map_or_else(
                || format!("{secs} s"),
                |(unit, name)| format!("{} {name}", secs / unit),
            );
        format!("{} to {} ({span})", rfc3339(self.start), rfc3339(self.end))
    }
}

/// `--range`: a duration flag's units, and `d` (days) and `w` (weeks).
pub fn parse_length(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let unit = match t.chars().last() {
        Some('d') => 86_400.0,
        Some('w') => 7.0 * 86_400.0,
        _ => return parse_duration(t),
    };
    let n: f64 = t[..t.len() - 1]
        .trim()
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite() && *n >= 0.0)
        .ok_or_else(|| format!("{s:?} is not a length (e.g. 30d, 2w, 12h, 90m)"))?;
    Duration::try_from_secs_f64(n * unit).map_err(|e| format!("{s:?}: {e}"))
}

/// `--start`, `--end`: RFC 3339 or unix seconds.
pub fn parse_instant(s: &str) -> Result<SystemTime, String> {
    let t = s.trim();
    let bad = || {
        format!(
            "{s:?} is not an instant: RFC 3339 (2025-06-01T00:00:00Z, or with an offset, +02:00) or unix seconds (1748736000)"
        )
    };
    let ms = if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        unix_millis(t).ok_or_else(bad)?
    } else {
        rfc3339_millis(t).ok_or_else(bad)?
    };
    u64::try_from(ms)
        .ok()
        .map(|ms| UNIX_EPOCH + Duration::from_millis(ms))
        .ok_or_else(|| format!("{s:?} is before 1970"))
}

/// Milliseconds since the epoch of unix seconds with an optional fraction (`1748736000.5`),
/// read as decimal digits: through a float, `.123` could come out as 122 ms.
fn unix_millis(s: &str) -> Option<i64> {
    let (whole, frac) = s.split_once('.').unwrap_or((s, "000"));
    let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || !digits(frac) {
        return None;
    }
    let secs: i64 = whole.parse().ok()?;
    // Past the year 9999 is a typo (milliseconds given as seconds, say), not a bill.
    if secs > 253_402_300_799 {
        return None;
    }
    let millis = frac
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(3)
        .fold(0, |n, d| n * 10 + i64::from(d - b'0'));
    Some(secs * 1000 + millis)
}

/// Milliseconds since the epoch of an RFC 3339 date-time (`T`, `t` or a space between date and
/// time), or None when it is not one.
fn rfc3339_millis(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |from: usize, len: usize| -> Option<i64> {
        let part = b.get(from..from + len)?;
        part.iter()
            .all(u8::is_ascii_digit)
            .then(|| part.iter().fold(0i64, |n, d| n * 10 + i64::from(d - b'0')))
    };
    let at = |i: usize, c: &[u8]| b.get(i).is_some_and(|x| c.contains(x));
    if !(at(4, b"-") && at(7, b"-") && at(10, b"Tt ") && at(13, b":") && at(16, b":")) {
        return None;
    }
    let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (hour, minute, second) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let days_in_month = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        1..=12 => 31,
        _ => return None,
    };
    // 60: a leap second, as RFC 3339 allows; it counts as the next minute's first.
    if !(1..=days_in_month).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut i = 19;
    let mut millis = 0;
    if at(i, b".") {
        let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return None;
        }
        millis = (0..3).fold(0, |n, k| {
            n * 10
                + if k < digits {
                    i64::from(b[i + 1 + k] - b'0')
                } else {
                    0
                }
        });
        i += 1 + digits;
    }
    let offset = match b.get(i..)? {
        b"Z" | b"z" => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let digits = [*h1, *h2, *m1, *m2];
            if !digits.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let d = |k: usize| i64::from(digits[k] - b'0');
            let (h, m) = (d(0) * 10 + d(1), d(2) * 10 + d(3));
            if h > 23 || m > 59 {
                return None;
            }
            (h * 60 + m) * 60 * if *sign == b'+' { 1 } else { -1 }
        }
        _ => return None,
    };
    let secs =
        days_from_civil(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second - offset;
    Some(secs * 1000 + millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn instants_in_rfc3339_and_unix_seconds() {
        let july = Ok(at(1_751_328_000));
        assert_eq!(parse_instant("2025-07-01T00:00:00Z"), july);
        assert_eq!(parse_instant("2025-07-01t00:00:00z"), july);
        assert_eq!(parse_instant("2025-07-01 02:00:00+02:00"), july);
        assert_eq!(parse_instant("2025-06-30T19:30:00-04:30"), july);
        assert_eq!(parse_instant("1751328000"), july);
        assert_eq!(parse_instant(" 1751328000 "), july);
        assert_eq!(
            parse_instant("2025-07-01T00:00:00.1239Z"),
            Ok(at(1_751_328_000) + Duration::from_millis(123))
        );
        assert_eq!(
            parse_instant("1751328000.5"),
            Ok(at(1_751_328_000) + Duration::from_millis(500))
        );
        // 1751328000.123 is 1751328000.12299990654 as a float: read as digits, 123 ms.
        assert_eq!(
            parse_instant("1751328000.123"),
            Ok(at(1_751_328_000) + Duration::from_millis(123))
        );
        assert_eq!(
            parse_instant("1751328000.1239"),
            Ok(at(1_751_328_000) + Duration::from_millis(123))
        );
        assert_eq!(parse_instant("1970-01-01T00:00:00Z"), Ok(UNIX_EPOCH));
        assert_eq!(parse_instant("2024-02-29T00:00:00Z"), Ok(at(1_709_164_800)));
        for bad in [
            "",
            "yesterday",
            "2025-07-01",
            "2025-07-01T00:00:00",
            "2025-07-01T00:00Z",
            "2025-13-01T00:00:00Z",
            "2025-02-29T00:00:00Z",
            "2025-04-31T00:00:00Z",
            "2025-07-01T24:00:00Z",
            "2025-07-01T00:00:00.Z",
            "2025-07-01T00:00:00+2:00",
            "2025-07-01T00:00:00Z trailing",
            "1.2.3",
            ".5",
            "1751328000.",
            "99999999999999999999999",
            "-5",
            "1751328000000",
            "1969-12-31T23:59:59Z",
        ] {
            assert!(parse_instant(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn lengths_take_days_and_weeks() {
        assert_eq!(parse_length("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_length("2w"), Ok(Duration::from_secs(14 * 86_400)));
        assert_eq!(parse_length("1.5d"), Ok(Duration::from_secs(129_600)));
        assert_eq!(parse_length("12h"), Ok(Duration::from_secs(43_200)));
        assert_eq!(parse_length("90"), Ok(Duration::from_secs(90)));
        for bad in ["d", "xd", "-1d", "3y", "inf d"] {
            assert!(parse_length(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_range_from_the_flags() {
        let now = at(1_751_328_000);
        let day = Duration::from_secs(86_400);
        let r = Range::from_flags(Some(30 * day), None, None, now).expect("range");
        assert_eq!((r.start, r.end), (now - 30 * day, now));
        assert_eq!(r.window(), "2592000s");
        assert_eq!(r.end_param(), "1751328000.000");
        assert!(r.words().ends_with("(30 d)"), "{}", r.words());

        let end = at(1_700_000_000);
        let r = Range::from_flags(Some(day), None, Some(end), now).expect("range ending at --end");
        assert_eq!((r.start, r.end), (end - day, end));

        let start = end - Duration::from_millis(90_500);
        let r = Range::from_flags(None, Some(start), Some(end), now).expect("start and end");
        assert_eq!(r.window(), "90500ms");
        assert_eq!(
            r.words(),
            "2023-11-14T22:11:49.500Z to 2023-11-14T22:13:20.000Z (90.5 s)"
        );
        let r = Range::from_flags(None, Some(start), None, now).expect("start to now");
        assert_eq!(r.end, now);

        for (range, start, end, says) in [
            (None, Some(end), Some(start), "is not before --end"),
            (None, Some(end), Some(end), "is not before --end"),
            (None, None, Some(end), "needs a range"),
            (None, None, None, "needs a range"),
            (Some(day), Some(start), None, "not both"),
            (Some(Duration::ZERO), None, None, "longer than 0"),
            (Some(day * 30_000), None, None, "before 1970"),
        ] {
            let Err(e) = Range::from_flags(range, start, end, now) else {
                panic!("{range:?} {start:?} {end:?} is no range");
            };
            assert!(e.contains(says), "{e}");
        }
    }
}
