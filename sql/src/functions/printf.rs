//! Flink's `PRINTF(format, args...)`: `java.util.Formatter` with
//! `Locale.US` over the arguments as Flink hands them to it (its internal
//! values: an INT is an `Integer`, a DATE the `Integer` of its days, a
//! STRING a `StringData` whose `toString` is its text, a DECIMAL a
//! `DecimalData`, which no numeric conversion takes). Any exception of the
//! formatter (an unknown conversion, a missing argument, a flag a
//! conversion does not take, `%d` of a STRING) makes the result NULL, as
//! Flink's `PrintfFunction` catches it; a NULL format is NULL.
//!
//! Conversions: `%s %S %b %B %c %C %d %o %x %X %e %E %f %g %G %% %n`, with
//! the argument index (`%2$s`, `%<s`), flags `-#+ 0,(`, width and
//! precision. `%h`, `%a` and the date conversions `%t` are refused at run
//! time (their Java answers depend on hash codes and the JVM's zone).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, StringBuilder};
use arrow::datatypes::{DataType, Date32Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type};
use datafusion::common::{Result, exec_err, plan_err};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility};

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Printf {
    signature: Signature,
}

impl Printf {
    pub fn udf() -> ScalarUDF {
        ScalarUDF::new_from_impl(Self {
            signature: Signature::variadic_any(Volatility::Immutable),
        })
    }
}

/// An argument as the Java object Flink passes to the formatter.
#[derive(Debug, Clone, PartialEq)]
enum JavaValue {
    Null,
    /// `Byte`, `Short`, `Integer`, `Long`: the value and its bits.
    Integral(i64, u32),
    /// `Float` (`true`) or `Double`.
    Floating(f64, bool),
    Boolean(bool),
    /// Any other object: its `toString` (STRING, DECIMAL, TIMESTAMP).
    Text(String),
}

/// Whether PRINTF can take a value of `t` (an argument Flink would format
/// as `ArrayData@1b2c3d` or `[B@...` is refused instead).
fn printable(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Null
            | DataType::Boolean
            | DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::Float32
            | DataType::Float64
            | DataType::Decimal128(..)
            | DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
            | DataType::Date32
            | DataType::Timestamp(..)
    )
}

impl ScalarUDFImpl for Printf {
    fn name(&self) -> &str {
        "printf"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match args.first() {
            None => return plan_err!("PRINTF takes a format and its arguments"),
            Some(DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null) => {}
            Some(t) => {
                return plan_err!(
                    "PRINTF: the format must be a STRING, not {}",
                    crate::types::flink_name(t)
                );
            }
        }
        if let Some((i, t)) = args.iter().enumerate().skip(1).find(|(_, t)| !printable(t)) {
            return plan_err!(
                "PRINTF: argument {} is a {}, which Flink formats as its object's identity; cast it to STRING",
                i + 1,
                crate::types::flink_name(t)
            );
        }
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (all_scalar, rows) = crate::udf::call_rows(&args);
        let arrays = args
            .args
            .iter()
            .map(|a| a.to_array(rows))
            .collect::<Result<Vec<ArrayRef>>>()?;
        let format = arrow::compute::cast(&arrays[0], &DataType::Utf8)?;
        let format = format.as_string::<i32>();
        let mut out = StringBuilder::with_capacity(rows, rows * 16);
        let mut values = Vec::with_capacity(arrays.len() - 1);
        for row in 0..rows {
            if format.is_null(row) {
                out.append_null();
                continue;
            }
            values.clear();
            for a in &arrays[1..] {
                values.push(java_value(a, row)?);
            }
            out.append_option(format_java(format.value(row), &values)?);
        }
        crate::udf::columnar(Arc::new(out.finish()), all_scalar)
    }
}

/// Row `i` of `a` as the object Flink's PRINTF receives.
fn java_value(a: &ArrayRef, i: usize) -> Result<JavaValue> {
    if a.is_null(i) {
        return Ok(JavaValue::Null);
    }
    Ok(match a.data_type() {
        DataType::Null => JavaValue::Null,
        DataType::Boolean => JavaValue::Boolean(a.as_boolean().value(i)),
        DataType::Int8 => JavaValue::Integral(i64::from(a.as_primitive::<Int8Type>().value(i)), 8),
        DataType::Int16 => JavaValue::Integral(i64::from(a.as_primitive::<Int16Type>().value(i)), 16),
        DataType::Int32 => JavaValue::Integral(i64::from(a.as_primitive::<Int32Type>().value(i)), 32),
        DataType::Int64 => JavaValue::Integral(a.as_primitive::<Int64Type>().value(i), 64),
        // A DATE is its days since the epoch (an `Integer`), as in Flink.
        DataType::Date32 => JavaValue::Integral(i64::from(a.as_primitive::<Date32Type>().value(i)), 32),
        DataType::Float32 => JavaValue::Floating(f64::from(a.as_primitive::<Float32Type>().value(i)), true),
        DataType::Float64 => JavaValue::Floating(a.as_primitive::<Float64Type>().value(i), false),
        DataType::Timestamp(unit, _) => {
            let ts = arrow::compute::cast(a, &DataType::Timestamp(*unit, None))?;
            let text = crate::functions::cast::to_strings(&ts.slice(i, 1))?;
            JavaValue::Text(local_date_time(text.as_string::<i32>().value(0)))
        }
        _ => {
            let text = crate::functions::cast::to_strings(&a.slice(i, 1))?;
            JavaValue::Text(text.as_string::<i32>().value(0).to_string())
        }
    })
}

/// `yyyy-MM-dd HH:mm:ss[.fff]` as Java's `LocalDateTime.toString` writes
/// it (`TimestampData.toString`): a `T`, seconds only when not zero (with
/// the fraction), the fraction in groups of three digits.
fn local_date_time(text: &str) -> String {
    let (date, time) = text.split_once(' ').unwrap_or((text, "00:00:00"));
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let frac = frac.trim_end_matches('0');
    let (hm, secs) = hms.rsplit_once(':').unwrap_or((hms, "00"));
    let mut out = format!("{date}T{hm}");
    if secs != "00" || !frac.is_empty() {
        out.push(':');
        out.push_str(secs);
    }
    if !frac.is_empty() {
        let digits = frac.len().div_ceil(3) * 3;
        out.push('.');
        out.push_str(&format!("{frac:0<digits$}"));
    }
    out
}

/// A conversion the formatter cannot do (Java throws, Flink answers NULL).
struct Invalid;

/// One `%...` specifier.
#[derive(Debug, Default, Clone)]
struct Spec {
    index: Option<usize>,
    previous: bool,
    left: bool,
    alternate: bool,
    plus: bool,
    space: bool,
    zero: bool,
    group: bool,
    parens: bool,
    width: Option<usize>,
    precision: Option<usize>,
    conversion: char,
}

/// `java.util.Formatter.format(Locale.US, format, args)`; `Ok(None)` where
/// Java throws.
fn format_java(format: &str, args: &[JavaValue]) -> Result<Option<String>> {
    let chars: Vec<char> = format.chars().collect();
    let mut out = String::with_capacity(format.len() + 16);
    let (mut i, mut next_arg, mut last_arg): (usize, usize, Option<usize>) = (0, 0, None);
    while i < chars.len() {
        if chars[i] != '%' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let Some((spec, end)) = parse_spec(&chars, i + 1) else {
            return Ok(None);
        };
        i = end;
        match spec.conversion {
            '%' => {
                if spec.precision.is_some() || (spec.left && spec.width.is_none()) {
                    return Ok(None);
                }
                pad(&mut out, "%", &spec);
                continue;
            }
            'n' => {
                if spec.width.is_some() || spec.precision.is_some() || spec.left || spec.zero {
                    return Ok(None);
                }
                out.push('\n');
                continue;
            }
            'h' | 'H' | 'a' | 'A' | 't' | 'T' => {
                return exec_err!(
                    "PRINTF: the conversion %{} is not supported (its Java text depends on hash codes or the JVM's time zone)",
                    spec.conversion
                );
            }
            _ => {}
        }
        let arg = if spec.previous {
            last_arg
        } else if let Some(n) = spec.index {
            n.checked_sub(1)
        } else {
            next_arg += 1;
            Some(next_arg - 1)
        };
        let Some(value) = arg.and_then(|a| args.get(a)) else {
            return Ok(None);
        };
        last_arg = arg;
        match convert(&spec, value) {
            Ok(text) => out.push_str(&text),
            Err(Invalid) => return Ok(None),
        }
    }
    Ok(Some(out))
}

/// Parses `[n$ | <][flags][width][.precision]conversion` from `start`;
/// the spec and the index after it, `None` for a malformed one.
fn parse_spec(chars: &[char], start: usize) -> Option<(Spec, usize)> {
    let mut spec = Spec::default();
    let mut i = start;
    let digits = |i: &mut usize| -> Option<usize> {
        let from = *i;
        while *i < chars.len() && chars[*i].is_ascii_digit() {
            *i += 1;
        }
        (*i > from).then(|| chars[from..*i].iter().collect::<String>().parse().ok())?
    };
    // `n$` (a leading number followed by `$`), else it is the width.
    let save = i;
    if let Some(n) = digits(&mut i) {
        if chars.get(i) == Some(&'$') {
            if n == 0 {
                return None;
            }
            spec.index = Some(n);
            i += 1;
        } else {
            i = save;
        }
    }
    loop {
        match chars.get(i) {
            Some('-') => spec.left = true,
            Some('#') => spec.alternate = true,
            Some('+') => spec.plus = true,
            Some(' ') => spec.space = true,
            Some('0') => spec.zero = true,
            Some(',') => spec.group = true,
            Some('(') => spec.parens = true,
            Some('<') => spec.previous = true,
            _ => break,
        }
        i += 1;
    }
    spec.width = digits(&mut i);
    if chars.get(i) == Some(&'.') {
        i += 1;
        spec.precision = Some(digits(&mut i)?);
    }
    spec.conversion = *chars.get(i)?;
    if (spec.left || spec.zero) && spec.width.is_none() && spec.conversion != 'n' {
        return None;
    }
    if (spec.left && spec.zero) || (spec.plus && spec.space) {
        return None;
    }
    Some((spec, i + 1))
}

/// A NULL argument of a conversion other than `%b`: Java prints `null`,
/// cut to the precision, upper-cased for `%X`..., padded with spaces (a
/// `0` flag does not apply).
fn null_text(out: &mut String, spec: &Spec) {
    let mut text: String = "null".chars().take(spec.precision.unwrap_or(4)).collect();
    if spec.conversion.is_ascii_uppercase() {
        text = text.to_uppercase();
    }
    pad(out, &text, spec);
}

/// `text` padded with spaces to the spec's width (left-justified with `-`).
fn pad(out: &mut String, text: &str, spec: &Spec) {
    let len = text.chars().count();
    let fill = spec.width.unwrap_or(0).saturating_sub(len);
    if !spec.left {
        out.extend(std::iter::repeat_n(' ', fill));
    }
    out.push_str(text);
    if spec.left {
        out.extend(std::iter::repeat_n(' ', fill));
    }
}

fn convert(spec: &Spec, value: &JavaValue) -> Result<String, Invalid> {
    let upper = spec.conversion.is_ascii_uppercase();
    let mut out = String::new();
    match spec.conversion.to_ascii_lowercase() {
        'b' | 's' => {
            let numeric_flags = spec.plus || spec.space || spec.zero || spec.group || spec.parens;
            if numeric_flags || spec.alternate {
                return Err(Invalid);
            }
            let mut text = match (spec.conversion.to_ascii_lowercase(), value) {
                ('b', JavaValue::Null) => "false".to_string(),
                ('b', JavaValue::Boolean(b)) => b.to_string(),
                ('b', _) => "true".to_string(),
                (_, v) => java_to_string(v),
            };
            if let Some(p) = spec.precision {
                text = text.chars().take(p).collect();
            }
            if upper {
                text = text.to_uppercase();
            }
            pad(&mut out, &text, spec);
        }
        'c' => {
            if spec.precision.is_some() || spec.alternate || spec.plus || spec.space || spec.zero || spec.group {
                return Err(Invalid);
            }
            let text = match value {
                JavaValue::Null => "null".to_string(),
                JavaValue::Integral(v, bits) if *bits <= 32 => {
                    let c = u32::try_from(*v).ok().and_then(char::from_u32).ok_or(Invalid)?;
                    c.to_string()
                }
                _ => return Err(Invalid),
            };
            pad(&mut out, &if upper { text.to_uppercase() } else { text }, spec);
        }
        'd' => {
            if spec.precision.is_some() || spec.alternate {
                return Err(Invalid);
            }
            match value {
                JavaValue::Null => null_text(&mut out, spec),
                JavaValue::Integral(v, _) => {
                    let digits = v.unsigned_abs().to_string();
                    let digits = if spec.group { grouped(&digits) } else { digits };
                    signed(&mut out, *v < 0, &digits, spec);
                }
                _ => return Err(Invalid),
            }
        }
        'o' | 'x' => {
            if spec.precision.is_some() || spec.plus || spec.space || spec.group || spec.parens {
                return Err(Invalid);
            }
            match value {
                JavaValue::Null => null_text(&mut out, spec),
                JavaValue::Integral(v, bits) => {
                    // Negative values as the unsigned value of their type.
                    let raw = if *bits == 64 {
                        *v as u64
                    } else {
                        (*v as u64) & ((1u64 << bits) - 1)
                    };
                    let (mut digits, prefix) = if spec.conversion.eq_ignore_ascii_case(&'x') {
                        (format!("{raw:x}"), "0x")
                    } else {
                        (format!("{raw:o}"), "0")
                    };
                    if upper {
                        digits = digits.to_uppercase();
                    }
                    let prefix = match (spec.alternate, upper) {
                        (false, _) => String::new(),
                        (true, true) => prefix.to_uppercase(),
                        (true, false) => prefix.to_string(),
                    };
                    let width = spec.width.unwrap_or(0);
                    let body = if spec.zero {
                        let fill = width.saturating_sub(prefix.len() + digits.len());
                        format!("{prefix}{}{digits}", "0".repeat(fill))
                    } else {
                        format!("{prefix}{digits}")
                    };
                    pad(&mut out, &body, spec);
                }
                _ => return Err(Invalid),
            }
        }
        c @ ('e' | 'f' | 'g') => {
            if (c != 'f' && spec.group) || (c == 'g' && spec.alternate) {
                return Err(Invalid);
            }
            match value {
                JavaValue::Null => null_text(&mut out, spec),
                JavaValue::Floating(v, is_float) => {
                    if v.is_nan() || v.is_infinite() {
                        let text = if v.is_nan() { "NaN" } else { "Infinity" };
                        let text = if upper { text.to_uppercase() } else { text.to_string() };
                        // Java pads these with spaces, never zeros.
                        let no_zero = Spec {
                            zero: false,
                            ..spec.clone()
                        };
                        signed(&mut out, *v < 0.0, &text, &no_zero);
                    } else {
                        let digits = floating(v.abs(), *is_float, c, spec);
                        let digits = if upper { digits.to_uppercase() } else { digits };
                        // Java's sign test is `Double.compare(v, 0.0) < 0`: -0.0 too.
                        signed(&mut out, v.is_sign_negative(), &digits, spec);
                    }
                }
                _ => return Err(Invalid),
            }
        }
        _ => return Err(Invalid),
    }
    Ok(out)
}

/// A magnitude's digits with its sign as the flags say: `+`, ` `, `(...)`,
/// zero padding after the sign, then the width.
fn signed(out: &mut String, negative: bool, digits: &str, spec: &Spec) {
    let (lead, trail) = match (negative, spec.parens, spec.plus, spec.space) {
        (true, true, _, _) => ("(", ")"),
        (true, false, _, _) => ("-", ""),
        (false, _, true, _) => ("+", ""),
        (false, _, _, true) => (" ", ""),
        _ => ("", ""),
    };
    let body_len = lead.len() + digits.chars().count() + trail.len();
    let width = spec.width.unwrap_or(0);
    let body = if spec.zero && width > body_len {
        format!("{lead}{}{digits}{trail}", "0".repeat(width - body_len))
    } else {
        format!("{lead}{digits}{trail}")
    };
    pad(out, &body, spec);
}

/// `1234567` → `1,234,567` (`Locale.US`), the integer part of a number.
fn grouped(digits: &str) -> String {
    let (int, rest) = match digits.find('.') {
        Some(p) => digits.split_at(p),
        None => (digits, ""),
    };
    let mut out = String::new();
    for (n, c) in int.chars().enumerate() {
        if n > 0 && (int.len() - n).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out.push_str(rest);
    out
}

/// The shortest decimal digits of `v` (> 0 or 0) that read back as it, as
/// Java's `Double.toString` / `Float.toString` find them, and the exponent
/// of the first: `v = 0.d1d2d3... × 10^(exp + 1)`.
fn shortest_digits(v: f64, is_float: bool) -> (Vec<u8>, i32) {
    if v == 0.0 {
        return (vec![0], 0);
    }
    let text = if is_float {
        format!("{:e}", v as f32)
    } else {
        format!("{v:e}")
    };
    let (mantissa, exp) = text.split_once('e').unwrap_or((&text, "0"));
    let digits: Vec<u8> = mantissa.bytes().filter(u8::is_ascii_digit).map(|b| b - b'0').collect();
    (digits, exp.parse().unwrap_or(0))
}

/// Rounds `digits` (first digit at 10^exp) half up to keep the digits down
/// to 10^lowest; the digits and the new exponent of the first.
fn round_half_up(mut digits: Vec<u8>, mut exp: i32, lowest: i32) -> (Vec<u8>, i32) {
    let keep = exp - lowest + 1;
    if keep < 0 {
        return (vec![0], lowest);
    }
    let keep = keep as usize;
    if digits.len() > keep {
        let up = digits[keep] >= 5;
        digits.truncate(keep);
        if up {
            let mut i = keep;
            loop {
                if i == 0 {
                    digits.insert(0, 1);
                    exp += 1;
                    break;
                }
                i -= 1;
                if digits[i] == 9 {
                    digits[i] = 0;
                } else {
                    digits[i] += 1;
                    break;
                }
            }
        }
        if digits.is_empty() {
            return (vec![0], lowest);
        }
    }
    (digits, exp)
}

/// The digit at 10^k of `digits` (first at 10^exp).
fn digit_at(digits: &[u8], exp: i32, k: i32) -> u8 {
    let i = exp - k;
    if i < 0 {
        return 0;
    }
    digits.get(i as usize).copied().unwrap_or(0)
}

/// `%f` of a magnitude with `precision` fraction digits.
fn fixed(digits: Vec<u8>, exp: i32, precision: usize, spec: &Spec) -> String {
    let (digits, exp) = round_half_up(digits, exp, -(precision as i32));
    let mut int = String::new();
    for k in (0..=exp.max(0)).rev() {
        int.push((b'0' + digit_at(&digits, exp, k)) as char);
    }
    let int = if spec.group { grouped(&int) } else { int };
    let mut out = int;
    if precision > 0 || spec.alternate {
        out.push('.');
    }
    for k in 1..=precision as i32 {
        out.push((b'0' + digit_at(&digits, exp, -k)) as char);
    }
    out
}

/// `%e` of a magnitude with `precision` fraction digits: `d.ddde+XX`.
fn scientific(digits: Vec<u8>, exp: i32, precision: usize, spec: &Spec) -> String {
    let (digits, exp) = if digits == [0] {
        (digits, 0)
    } else {
        round_half_up(digits, exp, exp - precision as i32)
    };
    let mut out = String::new();
    out.push((b'0' + digits[0]) as char);
    if precision > 0 || spec.alternate {
        out.push('.');
    }
    for k in 1..=precision {
        out.push((b'0' + digits.get(k).copied().unwrap_or(0)) as char);
    }
    out.push('e');
    out.push(if exp < 0 { '-' } else { '+' });
    out.push_str(&format!("{:02}", exp.unsigned_abs()));
    out
}

/// `%e`, `%f` or `%g` of the magnitude `v` (>= 0): Java rounds the shortest
/// decimal digits of the value half up (`%.1f` of 0.25 is `0.3`).
fn floating(v: f64, is_float: bool, conversion: char, spec: &Spec) -> String {
    let (digits, exp) = shortest_digits(v, is_float);
    let precision = spec.precision.unwrap_or(6);
    match conversion {
        'f' => fixed(digits, exp, precision, spec),
        'e' => scientific(digits, exp, precision, spec),
        _ => {
            // `%g`: rounded to `precision` significant digits, then fixed
            // when 10^-4 <= value < 10^precision, else scientific.
            let precision = precision.max(1);
            let rexp = if digits == [0] {
                0
            } else {
                round_half_up(digits.clone(), exp, exp - precision as i32 + 1).1
            };
            if v != 0.0 && (rexp < -4 || rexp >= precision as i32) {
                scientific(digits, exp, precision - 1, spec)
            } else {
                fixed(digits, exp, (precision as i32 - rexp - 1).max(0) as usize, spec)
            }
        }
    }
}

/// `String.valueOf(o)` of the object Flink passes.
fn java_to_string(v: &JavaValue) -> String {
    match v {
        JavaValue::Null => "null".into(),
        JavaValue::Integral(i, _) => i.to_string(),
        JavaValue::Floating(f, is_float) => {
            let mut s = String::new();
            if *is_float {
                weir_engine::java_text::java_float(*f as f32, &mut s);
            } else {
                weir_engine::java_text::java_double(*f, &mut s);
            }
            s
        }
        JavaValue::Boolean(b) => b.to_string(),
        JavaValue::Text(t) => t.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(format: &str, args: &[JavaValue]) -> Option<String> {
        format_java(format, args).expect("supported")
    }

    fn int(v: i64) -> JavaValue {
        JavaValue::Integral(v, 32)
    }

    fn dbl(v: f64) -> JavaValue {
        JavaValue::Floating(v, false)
    }

    #[test]
    fn formats_as_javas_formatter() {
        assert_eq!(
            f("%s-%d", &[JavaValue::Text("a".into()), int(7)]).as_deref(),
            Some("a-7")
        );
        assert_eq!(
            f("%5d|%-5d|%05d", &[int(42), int(42), int(-42)]).as_deref(),
            Some("   42|42   |-0042")
        );
        assert_eq!(
            f("%,d %+d %(d", &[int(1234567), int(5), int(-5)]).as_deref(),
            Some("1,234,567 +5 (5)")
        );
        assert_eq!(
            f("%x %X %o %#x", &[int(-1), int(255), int(8), int(255)]).as_deref(),
            Some("ffffffff FF 10 0xff")
        );
        assert_eq!(
            f("%x", &[JavaValue::Integral(-1, 64)]).as_deref(),
            Some("ffffffffffffffff")
        );
        assert_eq!(
            f("%.2f %.1f %.1f %f", &[dbl(2.5), dbl(0.25), dbl(0.15), dbl(1.0)]).as_deref(),
            Some("2.50 0.3 0.2 1.000000")
        );
        assert_eq!(
            f("%e %.2E", &[dbl(12345.678), dbl(0.000123)]).as_deref(),
            Some("1.234568e+04 1.23E-04")
        );
        assert_eq!(
            f("%g %g %g", &[dbl(12345.678), dbl(0.0001), dbl(1e10)]).as_deref(),
            Some("12345.7 0.000100000 1.00000e+10")
        );
        assert_eq!(f("%,.2f", &[dbl(1234567.891)]).as_deref(), Some("1,234,567.89"));
        assert_eq!(
            f(
                "%.3s|%S|%b|%b",
                &[
                    JavaValue::Text("hello".into()),
                    JavaValue::Text("x".into()),
                    JavaValue::Null,
                    int(0)
                ]
            )
            .as_deref(),
            Some("hel|X|false|true")
        );
        assert_eq!(f("%2$s %1$s %<s", &[int(1), int(2)]).as_deref(), Some("2 1 1"));
        assert_eq!(f("100%% %n", &[]).as_deref(), Some("100% \n"));
        assert_eq!(
            f("%s %d", &[JavaValue::Null, JavaValue::Null]).as_deref(),
            Some("null null")
        );
        assert_eq!(f("%c", &[int(65)]).as_deref(), Some("A"));
    }

    #[test]
    fn what_java_throws_on_is_null() {
        assert_eq!(f("%d", &[JavaValue::Text("7".into())]), None, "%d of a String");
        assert_eq!(f("%d", &[dbl(1.0)]), None);
        assert_eq!(f("%f", &[int(1)]), None, "%f of an Integer");
        assert_eq!(f("%s %s", &[int(1)]), None, "a missing argument");
        assert_eq!(f("%q", &[int(1)]), None, "an unknown conversion");
        assert_eq!(f("%-d", &[int(1)]), None, "- without a width");
        assert_eq!(f("%.2d", &[int(1)]), None, "a precision of %d");
        assert_eq!(f("%", &[]), None, "a lone %");
        assert_eq!(f("%#s", &[int(1)]), None);
    }

    #[test]
    fn timestamps_read_as_local_date_time() {
        assert_eq!(local_date_time("2024-02-29 13:45:30.123"), "2024-02-29T13:45:30.123");
        assert_eq!(local_date_time("1970-01-01 00:00:00.000"), "1970-01-01T00:00");
        assert_eq!(local_date_time("2023-12-31 23:59:59.100"), "2023-12-31T23:59:59.100");
        assert_eq!(local_date_time("2023-12-31 23:59:00.000"), "2023-12-31T23:59");
    }
}
