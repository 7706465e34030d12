//! Timestamps in text files, parsed without chrono for the one layout
//! Flink writes (`yyyy-MM-dd HH:mm:ss[.fraction]`, or ISO-8601's `T`).
//!
//! arrow's CSV reader parses every timestamp through its general parser
//! (a `TimestampParser` and chrono calls per value: 10 % of a CSV scan's
//! CPU in a profile). Here the column is read as text and converted with
//! integer arithmetic; any value of another layout (time zones, short
//! dates, leap seconds) makes the caller decode the chunk the general way,
//! so results and error messages are arrow's either way.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, PrimitiveArray, StringArray};
use arrow::datatypes::{
    ArrowTimestampType, DataType, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType,
};

/// The column parsed as `TIMESTAMP(unit)` without time zone, or `None` if
/// a value is not in the fast layout.
pub fn parse_column(text: &StringArray, unit: TimeUnit) -> Option<ArrayRef> {
    match unit {
        TimeUnit::Second => parse::<TimestampSecondType>(text, 0),
        TimeUnit::Millisecond => parse::<TimestampMillisecondType>(text, 3),
        TimeUnit::Microsecond => parse::<TimestampMicrosecondType>(text, 6),
        TimeUnit::Nanosecond => parse::<TimestampNanosecondType>(text, 9),
    }
}

fn parse<T: ArrowTimestampType>(text: &StringArray, digits: u32) -> Option<ArrayRef> {
    let mut values = Vec::with_capacity(text.len());
    for i in 0..text.len() {
        values.push(if text.is_null(i) {
            0
        } else {
            to_units(text.value(i).as_bytes(), digits)?
        });
    }
    let array = PrimitiveArray::<T>::new(values.into(), text.nulls().cloned());
    Some(Arc::new(array) as ArrayRef)
}

/// `yyyy-MM-dd[ T]HH:mm:ss[.f{1,9}]` as units of 10^-`digits` s since the
/// epoch (the fraction truncated to the unit, as arrow does).
fn to_units(b: &[u8], digits: u32) -> Option<i64> {
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b' ' | b'T') || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let mut v = 0i64;
        for &c in &b[r] {
            if !c.is_ascii_digit() {
                return None;
            }
            v = v * 10 + (c - b'0') as i64;
        }
        Some(v)
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let mut fraction = 0i64; // nanoseconds
    if b.len() > 19 {
        let f = &b[20..];
        if b[19] != b'.' || f.is_empty() || f.len() > 9 {
            return None;
        }
        fraction = num(20..b.len())? * 10i64.pow(9 - f.len() as u32);
    }
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    let scale = 10i64.pow(digits);
    seconds
        .checked_mul(scale)?
        .checked_add(fraction / 10i64.pow(9 - digits))
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `schema` with every `TIMESTAMP` without time zone read as text, or
/// `None` if it has none.
pub fn text_schema(schema: &arrow::datatypes::Schema) -> Option<arrow::datatypes::SchemaRef> {
    let mut any = false;
    let fields: Vec<arrow::datatypes::Field> = schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::Timestamp(_, None) => {
                any = true;
                f.as_ref().clone().with_data_type(DataType::Utf8)
            }
            _ => f.as_ref().clone(),
        })
        .collect();
    any.then(|| {
        Arc::new(arrow::datatypes::Schema::new_with_metadata(
            fields,
            schema.metadata().clone(),
        ))
    })
}

#[cfg(test)]
mod tests {
    use arrow::compute::cast;

    use super::*;

    /// Every accepted value converts exactly as arrow's parser does.
    #[test]
    fn the_fast_layout_parses_like_arrow() {
        let values = [
            "2024-01-01 00:00:00.000",
            "2024-02-29 23:59:59.999",
            "1969-12-31 23:59:59.5",
            "1900-03-01 12:00:00",
            "0001-01-01 00:00:00.123456789",
            "9999-12-31T23:59:59.1",
            "2000-02-29T01:02:03.000004",
        ];
        let text = StringArray::from(values.iter().map(|v| Some(*v)).chain([None]).collect::<Vec<_>>());
        for unit in [TimeUnit::Second, TimeUnit::Millisecond, TimeUnit::Microsecond] {
            let want = cast(&text, &DataType::Timestamp(unit, None)).expect("test");
            let got = parse_column(&text, unit).expect("test");
            assert_eq!(got.as_ref(), want.as_ref(), "{unit:?}");
        }
    }

    #[test]
    fn other_layouts_are_left_to_arrow() {
        for v in [
            "2024-01-01",
            "2024-01-01 00:00:00Z",
            "2024-01-01 00:00:00+02:00",
            "2023-02-29 00:00:00",
            "2024-01-01 24:00:00",
            "2024-01-01 00:00:60",
            "2024-01-01 00:00:00.",
            "2024-01-01 00:00:00.1234567890",
            "2024-1-01 00:00:00",
            "x",
        ] {
            assert!(
                parse_column(&StringArray::from(vec![v]), TimeUnit::Millisecond).is_none(),
                "{v}"
            );
        }
    }
}
