//! Units the command line reads: durations. A leaf: it imports nothing of the crate, so the
//! proxy's configuration, the SLO grammar and the tools all parse a duration the same way
//! without depending on each other.

use std::time::Duration;

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
    fn bad_durations_say_why() {
        let said = |s: &str| parse_duration(s).err().unwrap_or_default();
        assert!(said("5 fortnights").contains("unknown unit"));
        assert!(said("fast").contains("is not a duration"));
        assert!(parse_duration("").is_err());
    }
}
