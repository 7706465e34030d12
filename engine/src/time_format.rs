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
