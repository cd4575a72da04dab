//! Units the command line reads: durations, and the calendar's day count behind the instants
//! it reads and the logs write. A leaf: it imports nothing of the crate, so the
//! proxy's configuration, the SLO grammar and the tools all parse a duration the same way
//! without depending on each other.
//!
//! A default duration is written once, as a [`HumanDuration`] beside the settings it belongs
//! to: the settings take its [`Duration`], and the command line shows it in `--help` as it is
//! written (`300s`, `15m`), which [`parse_duration`] reads back to the same value.

use std::fmt;
use std::time::Duration;

/// A duration as a person writes it: a whole number of one unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration {
    count: u64,
    unit: Unit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Millis,
    Secs,
    Mins,
}

impl HumanDuration {
    pub const fn millis(count: u64) -> Self {
        HumanDuration {
            count,
            unit: Unit::Millis,
        }
    }

    pub const fn secs(count: u64) -> Self {
        HumanDuration {
            count,
            unit: Unit::Secs,
        }
    }

    pub const fn mins(count: u64) -> Self {
        HumanDuration {
            count,
            unit: Unit::Mins,
        }
    }

    /// The duration it says.
    pub const fn get(self) -> Duration {
        match self.unit {
            Unit::Millis => Duration::from_millis(self.count),
            Unit::Secs => Duration::from_secs(self.count),
            Unit::Mins => Duration::from_secs(self.count * 60),
        }
    }
}

/// As written: `250ms`, `30s`, `15m`.
impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.unit {
            Unit::Millis => "ms",
            Unit::Secs => "s",
            Unit::Mins => "m",
        };
        write!(f, "{}{unit}", self.count)
    }
}

/// Parses durations such as `250ms`, `30s`, `5m`, `1h`, or a plain number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 500ms, 30s, 5m)"))?;
    let secs = match unit.trim() {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        u => return Err(format!("unknown unit {u:?} in {s:?} (use ms, s, m or h)")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"))
}

/// The proleptic Gregorian date `(year, month, day)` of a day count from 1970-01-01 (Howard
/// Hinnant's algorithm): no date crate for a dozen lines.
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The day count from 1970-01-01 of a proleptic Gregorian date: [`civil_from_days`]' inverse.
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_every_unit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration(" 1h "), Ok(Duration::from_secs(3600)));
    }

    #[test]
    fn a_written_duration_reads_back_as_itself() {
        for (d, text) in [
            (HumanDuration::millis(250), "250ms"),
            (HumanDuration::secs(300), "300s"),
            (HumanDuration::mins(15), "15m"),
        ] {
            assert_eq!(d.to_string(), text);
            assert_eq!(parse_duration(text), Ok(d.get()));
        }
        assert_eq!(HumanDuration::mins(15).get(), Duration::from_secs(900));
    }

    #[test]
    fn bad_durations_say_why() {
        let said = |s: &str| parse_duration(s).err().unwrap_or_default();
        assert!(said("5 fortnights").contains("unknown unit"));
        assert!(said("fast").contains("is not a duration"));
        assert!(parse_duration("").is_err());
    }
}
