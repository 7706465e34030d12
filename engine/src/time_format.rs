//! Java `DateTimeFormatter` / `SimpleDateFormat` patterns (what Flink's
//! `DATE_FORMAT` and partition time extractors take) as chrono layouts.
//!
//! Letters: `yyyy`/`uuuu`, `yy`, `MM`/`M`, `MMM`, `MMMM`, `dd`/`d`,
//! `HH`/`H`, `hh`/`h`, `mm`/`m`, `ss`/`s`, `S` runs of 3, 6 or 9 (the
//! fraction), `EEE`/`EEEE`, `a`; `'text'` is literal (`''` a quote);
//! anything else not a letter is literal. Other letters are refused, so a
//! pattern never silently formats differently from Flink.

/// The chrono layout of Java pattern `java`, or what is not supported.
pub fn java_to_chrono(java: &str) -> Result<String, String> {
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
                    "pattern letters '{}' in '{java}' are not supported (yyyy, yy, M, MM, MMM, MMMM, d, dd, H, HH, h, hh, m, mm, s, ss, SSS, EEE, EEEE, a and 'quoted text' are)",
                    chars[i..i + run].iter().collect::<String>()
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
    Ok(out)
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
}

/// Timestamps as `yyyy-MM-dd HH:mm:ss.SSS` (`T` between date and time
/// with `iso`), written digit by digit: what the json and csv sinks write
/// for every timestamp, where chrono's `strftime` interpreter was a tenth
/// of a Kafka sink's time. `ticks` per second is the column's unit; the
/// fraction is cut to milliseconds, as `%.3f`. `None` for a year outside
/// 0000–9999 (the caller formats those the slow way).
pub fn write_millis_text(value: i64, ticks_per_second: i64, iso: bool, out: &mut String) -> Option<()> {
    let secs = value.div_euclid(ticks_per_second);
    let sub = value.rem_euclid(ticks_per_second);
    let millis = if ticks_per_second >= 1000 {
        sub / (ticks_per_second / 1000)
    } else {
        0
    };
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
        let mut buf = [b'0'; 4];
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
    out.push('.');
    digits(out, millis, 3);
    Some(())
}

#[cfg(test)]
mod millis_text_tests {
    use super::write_millis_text;

    #[test]
    fn matches_chrono_for_every_unit_and_sign() {
        let layout = "%Y-%m-%d %H:%M:%S%.3f";
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
            let expected = chrono::DateTime::from_timestamp_millis(ms)
                .expect("in range")
                .naive_utc()
                .format(layout)
                .to_string();
            let at = |scale: i64, extra: i64| ms.checked_mul(scale).and_then(|v| v.checked_add(extra));
            for (ticks, v) in [
                (1000, Some(ms)),
                (1_000_000, at(1000, 999)),
                (1_000_000_000, at(1_000_000, 999_999)),
            ] {
                // Nanoseconds reach only the years 1677 to 2262.
                let Some(v) = v else { continue };
                let mut s = String::new();
                write_millis_text(v, ticks, false, &mut s).expect("in range");
                assert_eq!(s, expected, "{v} at {ticks} ticks");
            }
        }
        let mut s = String::new();
        write_millis_text(5, 1, true, &mut s).expect("in range");
        assert_eq!(s, "1970-01-01T00:00:05.000");
        assert!(write_millis_text(253_402_300_800_000, 1000, false, &mut String::new()).is_none());
    }
}
