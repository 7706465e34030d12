//! Java `DateTimeFormatter` / `SimpleDateFormat` patterns (what Flink's
//! `DATE_FORMAT` and partition time extractors take) as chrono layouts.
//!
//! Letters: `yyyy`/`uuuu`, `yy`, `MM`/`M`, `MMM`, `MMMM`, `dd`/`d`,
//! `HH`/`H`, `hh`/`h`, `mm`/`m`, `ss`/`s`, `S` runs of 3, 6 or 9 (the
//! fraction), `EEE`/`EEEE`, `a`; `'text'` is literal (`''` a quote);
//! anything else not a letter is literal. Other letters are refused, so a
//! pattern never silently formats differently from Flink. Formatting (not
//! parsing) also takes the week-based year `YYYY`/`YY` and week `ww`/`w`
//! (see [`JavaFormat`]).

use chrono::{Datelike, NaiveDate, NaiveDateTime};

/// The chrono layout of Java pattern `java`, or what is not supported.
pub fn java_to_chrono(java: &str) -> Result<String, String> {
    let mut out = String::new();
    for piece in pieces(java, false)? {
        if let Piece::Layout(l) = piece {
            out.push_str(&l);
        }
    }
    Ok(out)
}

/// A Java pattern for formatting: chrono layouts between the fields
/// chrono has no letter for. The week fields follow Flink's JVM in the
/// en_US locale (`DateTimeFormatter.ofPattern` takes the default locale):
/// weeks start on Sunday, and week 1 is the one holding January 1st, so
/// the last days of December can be week 1 of the next week-based year
/// (and a year can have a week 53), unlike ISO weeks (chrono's `%G`/`%V`).
pub struct JavaFormat {
    pieces: Vec<Piece>,
}

enum Piece {
    Layout(String),
    /// A layout parsed once, for formatting row after row.
    Items(Vec<chrono::format::Item<'static>>),
    /// `YY` (2) or `YYYY` (4).
    WeekYear(usize),
    /// `w` (1) or `ww` (2).
    Week(usize),
}

impl JavaFormat {
    pub fn new(java: &str) -> Result<JavaFormat, String> {
        let pieces = pieces(java, true)?
            .into_iter()
            .map(|p| match p {
                Piece::Layout(l) => chrono::format::StrftimeItems::new(&l)
                    .parse_to_owned()
                    .map(Piece::Items)
                    .map_err(|e| format!("pattern '{java}': {e}")),
                other => Ok(other),
            })
            .collect::<Result<_, _>>()?;
        Ok(JavaFormat { pieces })
    }

    pub fn format(&self, t: &NaiveDateTime) -> String {
        let mut out = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Layout(l) => out.push_str(&t.format(l).to_string()),
                Piece::Items(items) => {
                    use std::fmt::Write;
                    let _ = write!(out, "{}", t.format_with_items(items.iter()));
                }
                // Java: `YY` is the year's last two digits without a sign;
                // `YYYY` pads to four and signs a year past 9999 or below 0
                // (as chrono's `%Y` does for `yyyy`).
                Piece::WeekYear(2) => out.push_str(&format!("{:02}", us_week(t.date()).0.unsigned_abs() % 100)),
                Piece::WeekYear(_) => {
                    let y = us_week(t.date()).0;
                    if (0..=9999).contains(&y) {
                        out.push_str(&format!("{y:04}"));
                    } else {
                        out.push_str(&format!("{y:+05}"));
                    }
                }
                Piece::Week(1) => out.push_str(&us_week(t.date()).1.to_string()),
                Piece::Week(_) => out.push_str(&format!("{:02}", us_week(t.date()).1)),
            }
        }
        out
    }
}

/// The week-based year and week of `d` in the en_US locale: weeks from
/// Sunday to Saturday, week 1 the one holding January 1st.
fn us_week(d: NaiveDate) -> (i32, u32) {
    // From the day of the year alone: no date arithmetic, which would
    // leave chrono's range at its ends.
    let weekday = i64::from(d.weekday().num_days_from_sunday());
    let day = i64::from(d.ordinal0());
    let days = if NaiveDate::from_ymd_opt(d.year(), 2, 29).is_some() {
        366
    } else {
        365
    };
    if day + 6 - weekday >= days {
        // The week's Saturday is in the next year: it holds next 1 January.
        return (d.year() + 1, 1);
    }
    // Days from the Sunday starting week 1 (on or before 1 January).
    let from_first = day + (weekday - day).rem_euclid(7);
    (d.year(), (from_first / 7 + 1) as u32)
}

/// Java pattern `java` as pieces; `weeks`: whether the week fields are
/// taken (formatting) or refused (parsing, chrono layouts).
fn pieces(java: &str, weeks: bool) -> Result<Vec<Piece>, String> {
    let mut pieces = vec![];
    let chars: Vec<char> = java.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\'' {
            // Quoted text; `''` is a quote.
            let mut j = i + 1;
            if chars.get(j) == Some(&'\'') {
                out.push('\'');
                i = j + 1;
                continue;
            }
            loop {
                match chars.get(j) {
                    None => return Err(format!("unterminated quote in pattern '{java}'")),
                    Some('\'') if chars.get(j + 1) == Some(&'\'') => {
                        out.push('\'');
                        j += 2;
                    }
                    Some('\'') => break,
                    Some('%') => {
                        out.push_str("%%");
                        j += 1;
                    }
                    Some(x) => {
                        out.push(*x);
                        j += 1;
                    }
                }
            }
            i = j + 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|x| **x == c).count();
        let week = match (c, run) {
            ('Y', 2 | 4) if weeks => Some(Piece::WeekYear(run)),
            ('w', 1 | 2) if weeks => Some(Piece::Week(run)),
            _ => None,
        };
        if let Some(w) = week {
            pieces.push(Piece::Layout(std::mem::take(&mut out)));
            pieces.push(w);
            i += run;
            continue;
        }
        let piece = match (c, run) {
            ('y' | 'u', 4) => "%Y",
            ('y' | 'u', 2) => "%y",
            ('M', 1) => "%-m",
            ('M', 2) => "%m",
            ('M', 3) => "%b",
            ('M', 4) => "%B",
            ('d', 1) => "%-d",
            ('d', 2) => "%d",
            ('H', 1) => "%-H",
            ('H', 2) => "%H",
            ('h', 1) => "%-I",
            ('h', 2) => "%I",
            ('m', 1) => "%-M",
            ('m', 2) => "%M",
            ('s', 1) => "%-S",
            ('s', 2) => "%S",
            ('S', 3) => "%3f",
            ('S', 6) => "%6f",
            ('S', 9) => "%9f",
            ('E', 3) => "%a",
            ('E', 4) => "%A",
            ('a', 1) => "%p",
            ('%', _) => {
                for _ in 0..run {
                    out.push_str("%%");
                }
                i += run;
                continue;
            }
            (c, _) if c.is_ascii_alphabetic() => {
                return Err(format!(
                    "pattern letters '{}' in '{java}' are not supported (yyyy, yy, M, MM, MMM, MMMM, d, dd, H, HH, h, hh, m, mm, s, ss, SSS, EEE, EEEE, a{} and 'quoted text' are)",
                    chars[i..i + run].iter().collect::<String>(),
                    if weeks { ", YYYY, YY, ww, w" } else { "" }
                ));
            }
            _ => {
                out.extend(&chars[i..i + run]);
                i += run;
                continue;
            }
        };
        out.push_str(piece);
        i += run;
    }
    pieces.push(Piece::Layout(out));
    pieces.retain(|p| !matches!(p, Piece::Layout(l) if l.is_empty()));
    Ok(pieces)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_patterns_become_chrono_layouts() {
        assert_eq!(
            java_to_chrono("yyyy-MM-dd HH:mm:ss").as_deref(),
            Ok("%Y-%m-%d %H:%M:%S")
        );
        assert_eq!(java_to_chrono("yyyyMMdd'T'HH").as_deref(), Ok("%Y%m%dT%H"));
        assert_eq!(java_to_chrono("HH:mm:ss.SSS").as_deref(), Ok("%H:%M:%S.%3f"));
        assert_eq!(
            java_to_chrono("d/M/yy h a 'o''clock' 100%").as_deref(),
            Ok("%-d/%-m/%y %-I %p o'clock 100%%")
        );
        assert!(java_to_chrono("yyyy-MM-dd EEE").is_ok());
        assert!(java_to_chrono("yyyy-ww").is_err());
        assert!(java_to_chrono("'open").is_err());
    }

    #[test]
    fn week_fields_follow_the_us_locale() {
        let f = JavaFormat::new("YYYY-'W'ww w YY yyyy-MM-dd").expect("pattern");
        let at = |y, m, d| {
            f.format(
                &NaiveDate::from_ymd_opt(y, m, d)
                    .and_then(|d| d.and_hms_opt(0, 0, 0))
                    .expect("date"),
            )
        };
        // Tuesday: its week (Sun 29 Dec .. Sat 4 Jan) holds 1 January 2025.
        assert_eq!(at(2024, 12, 31), "2025-W01 1 25 2024-12-31");
        assert_eq!(at(2025, 1, 4), "2025-W01 1 25 2025-01-04");
        assert_eq!(at(2025, 1, 5), "2025-W02 2 25 2025-01-05");
        // Saturday 31 December 2022: week 53 (1 January 2022 was a Saturday).
        assert_eq!(at(2022, 12, 31), "2022-W53 53 22 2022-12-31");
        assert_eq!(at(2023, 1, 1), "2023-W01 1 23 2023-01-01");
        // Both ends of chrono's range, and years Java signs.
        for d in [NaiveDate::MIN, NaiveDate::MAX] {
            let _ = f.format(&d.and_hms_opt(0, 0, 0).expect("time"));
        }
        let y = JavaFormat::new("YYYY YY").expect("pattern");
        let jan = |year| {
            y.format(
                &NaiveDate::from_ymd_opt(year, 1, 10)
                    .and_then(|d| d.and_hms_opt(0, 0, 0))
                    .expect("date"),
            )
        };
        assert_eq!(jan(-5), "-0005 05");
        assert_eq!(jan(10000), "+10000 00");
        assert_eq!(jan(1969), "1969 69");
        assert!(JavaFormat::new("YYY").is_err());
        assert!(JavaFormat::new("www").is_err());
    }
}

/// Timestamps as Flink's json and csv formats write them:
/// `yyyy-MM-dd HH:mm:ss` (`T` between date and time with `iso`), then the
/// fraction of the column's unit without its trailing zeros (none when
/// zero: `00:00:00.12`, `00:00:00`), then `Z` for a TIMESTAMP_LTZ
/// (`zoned`), written digit by digit: chrono's `strftime` interpreter was
/// a tenth of a Kafka sink's time. `ticks` per second is the column's
/// unit. `None` for a year outside 0000–9999 (the caller formats those
/// the slow way).
pub fn write_timestamp_text(value: i64, ticks_per_second: i64, iso: bool, zoned: bool, out: &mut String) -> Option<()> {
    let secs = value.div_euclid(ticks_per_second);
    let sub = value.rem_euclid(ticks_per_second);
    let days = secs.div_euclid(86_400);
    let of_day = secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    if !(0..=9999).contains(&year) {
        return None;
    }
    fn digits(out: &mut String, v: i64, n: usize) {
        let mut buf = [b'0'; 9];
        let mut v = v;
        for b in buf[..n].iter_mut().rev() {
            *b = b'0' + (v % 10) as u8;
            v /= 10;
        }
        out.extend(buf[..n].iter().map(|b| char::from(*b)));
    }
    digits(out, year, 4);
    out.push('-');
    digits(out, month, 2);
    out.push('-');
    digits(out, day, 2);
    out.push(if iso { 'T' } else { ' ' });
    digits(out, of_day / 3600, 2);
    out.push(':');
    digits(out, of_day % 3600 / 60, 2);
    out.push(':');
    digits(out, of_day % 60, 2);
    if sub > 0 {
        // The fraction in nanoseconds, its trailing zeros left out.
        let mut nanos = sub * (1_000_000_000 / ticks_per_second.clamp(1, 1_000_000_000));
        let mut n = 9;
        while nanos % 10 == 0 {
            nanos /= 10;
            n -= 1;
        }
        out.push('.');
        digits(out, nanos, n);
    }
    if zoned {
        out.push('Z');
    }
    Some(())
}

#[cfg(test)]
mod timestamp_text_tests {
    use super::write_timestamp_text;

    fn text(v: i64, ticks: i64, iso: bool, zoned: bool) -> String {
        let mut s = String::new();
        write_timestamp_text(v, ticks, iso, zoned, &mut s).expect("in range");
        s
    }

    #[test]
    fn matches_chrono_for_every_unit_and_sign() {
        for ms in [
            0i64,
            1,
            -1,
            999,
            -999,
            1_709_214_330_123,
            951_782_400_000,
            -62_167_219_200_000,
            253_402_300_799_999,
            -86_400_001,
        ] {
            let t = chrono::DateTime::from_timestamp_millis(ms)
                .expect("in range")
                .naive_utc();
            let at = |scale: i64, extra: i64| ms.checked_mul(scale).and_then(|v| v.checked_add(extra));
            for (ticks, v) in [
                (1000, Some(ms)),
                (1_000_000, at(1000, 999)),
                (1_000_000_000, at(1_000_000, 999_999)),
            ] {
                // Nanoseconds reach only the years 1677 to 2262.
                let Some(v) = v else { continue };
                // The ticks below the millisecond, in nanoseconds.
                let below = (v - ms * (ticks / 1000)) * (1_000_000_000 / ticks);
                let expected = t + chrono::TimeDelta::nanoseconds(below);
                let digits = expected.format("%Y-%m-%d %H:%M:%S%.9f").to_string();
                let trimmed = digits.trim_end_matches('0').trim_end_matches('.');
                assert_eq!(text(v, ticks, false, false), trimmed, "{v} at {ticks} ticks");
            }
        }
        assert!(write_timestamp_text(253_402_300_800_000, 1000, false, false, &mut String::new()).is_none());
    }

    /// Flink 2.3's json sink, for TIMESTAMP(3), TIMESTAMP_LTZ(3) and the
    /// ISO-8601 standard.
    #[test]
    fn writes_what_flinks_json_format_writes() {
        assert_eq!(text(1_704_067_200_120, 1000, false, false), "2024-01-01 00:00:00.12");
        assert_eq!(text(1_704_067_200_500, 1000, false, false), "2024-01-01 00:00:00.5");
        assert_eq!(text(1_704_067_200_000, 1000, false, false), "2024-01-01 00:00:00");
        assert_eq!(text(1_704_067_200_001, 1000, false, true), "2024-01-01 00:00:00.001Z");
        assert_eq!(text(1_704_067_200, 1, false, true), "2024-01-01 00:00:00Z");
        assert_eq!(text(1_704_067_200_120, 1000, true, false), "2024-01-01T00:00:00.12");
        assert_eq!(text(1_704_067_200_000, 1000, true, true), "2024-01-01T00:00:00Z");
        // Microseconds are kept, not cut to milliseconds.
        assert_eq!(
            text(1_704_067_200_123_456, 1_000_000, false, false),
            "2024-01-01 00:00:00.123456"
        );
    }
}
