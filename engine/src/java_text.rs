//! Values as Java's `toString` writes them: what Flink's `print`
//! connector shows (`Row.toString()` of the row's Java objects:
//! `LocalDateTime`, `Instant`, `Double`, `byte[]`, lists, maps, nested
//! rows), and Java's double and float text, which Flink's casts to STRING
//! also use.

use arrow::array::{Array, AsArray};
use arrow::datatypes::TimeUnit;

/// Java's `Double.toString`: plain digits for `1e-3 <= |v| < 1e7` (at
/// least one after the point), else `d.dddE±n`; the shortest digits that
/// read back as `v`.
pub fn java_double(v: f64, out: &mut String) {
    java_number(v, || format!("{v}"), || format!("{v:e}"), out);
}

/// Java's `Float.toString` (as [`java_double`], with a float's digits).
pub fn java_float(v: f32, out: &mut String) {
    java_number(f64::from(v), || format!("{v}"), || format!("{v:e}"), out);
}

/// `v`'s text as Java writes it, given Rust's plain and scientific texts
/// of it at its own precision.
fn java_number(
    v: f64,
    plain_text: impl FnOnce() -> String,
    scientific_text: impl FnOnce() -> String,
    out: &mut String,
) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "Infinity" } else { "-Infinity" });
    } else if v == 0.0 || (1e-3..1e7).contains(&v.abs()) {
        plain(&plain_text(), out);
    } else {
        scientific(&scientific_text(), out);
    }
}

fn plain(digits: &str, out: &mut String) {
    out.push_str(digits);
    if !digits.contains('.') {
        out.push_str(".0");
    }
}

/// `8.5e37` → `8.5E37`, `1e7` → `1.0E7`, `1e-5` → `1.0E-5`.
fn scientific(text: &str, out: &mut String) {
    let (mantissa, exp) = text.split_once('e').unwrap_or((text, "0"));
    out.push_str(mantissa);
    if !mantissa.contains('.') {
        out.push_str(".0");
    }
    out.push('E');
    out.push_str(exp);
}

/// Appends row `i` of `a` as Java's `toString` of Flink's external value.
pub fn java_value(a: &dyn Array, i: usize, out: &mut String) {
    use arrow::datatypes::*;
    if a.is_null(i) {
        out.push_str("null");
        return;
    }
    match a.data_type() {
        DataType::Float64 => java_double(a.as_primitive::<Float64Type>().value(i), out),
        DataType::Float32 => java_float(a.as_primitive::<Float32Type>().value(i), out),
        // `byte[]` in a Row prints its (signed) bytes.
        DataType::Binary | DataType::LargeBinary => {
            let bytes = match a.data_type() {
                DataType::Binary => a.as_binary::<i32>().value(i),
                _ => a.as_binary::<i64>().value(i),
            };
            let list: Vec<String> = bytes.iter().map(|b| (*b as i8).to_string()).collect();
            out.push('[');
            out.push_str(&list.join(", "));
            out.push(']');
        }
        DataType::Timestamp(unit, tz) => {
            let v = timestamp_value(a, unit, i);
            let (secs, nanos) = split(v, unit);
            match chrono::DateTime::from_timestamp(secs, nanos) {
                Some(t) if tz.is_some() => {
                    // `Instant.toString`: seconds always, then `Z`.
                    out.push_str(&t.format("%Y-%m-%dT%H:%M:%S").to_string());
                    fraction(nanos, out);
                    out.push('Z');
                }
                Some(t) => {
                    out.push_str(&t.format("%Y-%m-%dT").to_string());
                    local_time(&t.time(), out);
                }
                None => out.push_str(&v.to_string()),
            }
        }
        DataType::Time32(_) | DataType::Time64(_) => {
            let text = arrow::util::display::array_value_to_string(a, i).unwrap_or_default();
            match chrono::NaiveTime::parse_from_str(&text, "%H:%M:%S%.f") {
                Ok(t) => local_time(&t, out),
                Err(_) => out.push_str(&text),
            }
        }
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(..) => {
            let items = match a.data_type() {
                DataType::List(_) => a.as_list::<i32>().value(i),
                DataType::LargeList(_) => a.as_list::<i64>().value(i),
                _ => a.as_fixed_size_list().value(i),
            };
            out.push('[');
            for k in 0..items.len() {
                if k > 0 {
                    out.push_str(", ");
                }
                java_value(items.as_ref(), k, out);
            }
            out.push(']');
        }
        DataType::Map(..) => {
            let m = a.as_map();
            let (start, end) = (m.value_offsets()[i] as usize, m.value_offsets()[i + 1] as usize);
            out.push('{');
            for k in start..end {
                if k > start {
                    out.push_str(", ");
                }
                java_value(m.keys().as_ref(), k, out);
                out.push('=');
                java_value(m.values().as_ref(), k, out);
            }
            out.push('}');
        }
        // A nested ROW is a Row too: `+I[...]`.
        DataType::Struct(_) => {
            let s = a.as_struct();
            out.push_str("+I[");
            for (k, c) in s.columns().iter().enumerate() {
                if k > 0 {
                    out.push_str(", ");
                }
                java_value(c.as_ref(), i, out);
            }
            out.push(']');
        }
        _ => out.push_str(&arrow::util::display::array_value_to_string(a, i).unwrap_or_default()),
    }
}

fn timestamp_value(a: &dyn Array, unit: &TimeUnit, i: usize) -> i64 {
    use arrow::datatypes::*;
    match unit {
        TimeUnit::Second => a.as_primitive::<TimestampSecondType>().value(i),
        TimeUnit::Millisecond => a.as_primitive::<TimestampMillisecondType>().value(i),
        TimeUnit::Microsecond => a.as_primitive::<TimestampMicrosecondType>().value(i),
        TimeUnit::Nanosecond => a.as_primitive::<TimestampNanosecondType>().value(i),
    }
}

/// (seconds, nanoseconds) of a timestamp in `unit`.
fn split(v: i64, unit: &TimeUnit) -> (i64, u32) {
    let per_second: i64 = match unit {
        TimeUnit::Second => 1,
        TimeUnit::Millisecond => 1_000,
        TimeUnit::Microsecond => 1_000_000,
        TimeUnit::Nanosecond => 1_000_000_000,
    };
    let nanos = v.rem_euclid(per_second) * (1_000_000_000 / per_second);
    (v.div_euclid(per_second), u32::try_from(nanos).unwrap_or(0))
}

/// `LocalTime.toString`: `HH:mm`, then `:ss` unless seconds and fraction
/// are zero, then the fraction in groups of three digits.
fn local_time(t: &chrono::NaiveTime, out: &mut String) {
    use chrono::Timelike;
    out.push_str(&t.format("%H:%M").to_string());
    let nanos = t.nanosecond() % 1_000_000_000;
    if t.second() > 0 || nanos > 0 {
        out.push_str(&format!(":{:02}", t.second()));
    }
    fraction(nanos, out);
}

/// A fraction of a second as Java's ISO formats write it: none, or 3, 6 or
/// 9 digits.
fn fraction(nanos: u32, out: &mut String) {
    if nanos == 0 {
        return;
    }
    if nanos.is_multiple_of(1_000_000) {
        out.push_str(&format!(".{:03}", nanos / 1_000_000));
    } else if nanos.is_multiple_of(1_000) {
        out.push_str(&format!(".{:06}", nanos / 1_000));
    } else {
        out.push_str(&format!(".{nanos:09}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{BinaryArray, Float64Array, TimestampMicrosecondArray, TimestampMillisecondArray};

    fn texts(a: &dyn Array) -> Vec<String> {
        (0..a.len())
            .map(|i| {
                let mut s = String::new();
                java_value(a, i, &mut s);
                s
            })
            .collect()
    }

    #[test]
    fn timestamps_are_javas_local_date_times_and_instants() {
        let ts = TimestampMillisecondArray::from(vec![1_704_067_200_000, 1_704_067_210_500, 1_704_067_210_000]);
        assert_eq!(
            texts(&ts),
            ["2024-01-01T00:00", "2024-01-01T00:00:10.500", "2024-01-01T00:00:10"]
        );
        let micros = TimestampMicrosecondArray::from(vec![1_704_104_430_123_456]);
        assert_eq!(texts(&micros), ["2024-01-01T10:20:30.123456"]);
        let ltz = TimestampMillisecondArray::from(vec![1_704_067_210_000, 1_704_067_200_000]).with_timezone("UTC");
        assert_eq!(texts(&ltz), ["2024-01-01T00:00:10Z", "2024-01-01T00:00:00Z"]);
    }

    #[test]
    fn numbers_and_bytes_are_javas() {
        assert_eq!(texts(&Float64Array::from(vec![1e10, 0.1])), ["1.0E10", "0.1"]);
        assert_eq!(
            texts(&BinaryArray::from_vec(vec![b"ab".as_slice(), &[0xFF]])),
            ["[97, 98]", "[-1]"]
        );
    }
}
