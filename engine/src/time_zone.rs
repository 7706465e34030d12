//! Time zones as Flink reads them: the session zone
//! (`table.local-time-zone`), which TIMESTAMP_LTZ values are cast, shown
//! and formatted in, and the zone arguments of functions (`CONVERT_TZ`),
//! read as Java's `TimeZone.getTimeZone` reads an id.
//!
//! A local time that names no instant (clocks forward) or two (clocks
//! back) is resolved as the Java API Flink calls resolves it, and Flink
//! calls two: casts go through `LocalDateTime.atZone` ([`Resolve::Earlier`]:
//! the earlier instant of an overlap), the string functions
//! (`UNIX_TIMESTAMP`, `CONVERT_TZ`) through a lenient `Calendar`
//! ([`Resolve::Later`]: the later one). Both move a time in a gap forward
//! by the gap's length.

use arrow::array::timezone::Tz;
use chrono::{DateTime, NaiveDateTime, Offset, TimeZone, Utc};

/// The session's zone when it is not UTC (`None` is UTC: no conversion).
#[derive(Debug, Clone)]
pub struct SessionZone {
    /// As the user wrote it (shown in plans and messages).
    pub id: String,
    pub tz: Tz,
}

impl PartialEq for SessionZone {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for SessionZone {}

impl std::hash::Hash for SessionZone {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

/// Names of UTC that Flink accepts as a session zone.
const UTC_IDS: &[&str] = &[
    "UTC",
    "GMT",
    "UCT",
    "Etc/UTC",
    "Etc/GMT",
    "Etc/UCT",
    "Etc/Universal",
    "Etc/Zulu",
    "Etc/Greenwich",
    "Etc/GMT0",
    "Etc/GMT+0",
    "Etc/GMT-0",
    "Universal",
    "Zulu",
    "Greenwich",
    "GMT0",
    "GMT+00:00",
    "GMT-00:00",
];

/// Reads `table.local-time-zone` as Flink validates it: a tz database id
/// (`America/Los_Angeles`), `UTC`, or a fixed offset written `GMT+hh:mm`
/// (`GMT+8`, `GMT-03:00`); `Ok(None)` for UTC. Ids Java would read as
/// GMT without saying so (`+08:00`, `UTC+8`, `Foo/Bar`) are errors, as in
/// Flink.
pub fn session_zone(id: &str) -> Result<Option<SessionZone>, String> {
    let invalid = || {
        format!(
            "invalid time zone '{id}': the value should be a time zone database id such as \
             'America/Los_Angeles' (with its daylight saving time), a fixed offset such as \
             'GMT-03:00' or 'GMT+03:00', or 'UTC'"
        )
    };
    if UTC_IDS.contains(&id) {
        return Ok(None);
    }
    let tz = if let Some(offset) = id.strip_prefix("GMT") {
        gmt_offset(offset).ok_or_else(invalid)?
    } else {
        id.parse::<chrono_tz_name::Checked>().map_err(|_| invalid())?.0
    };
    // `GMT+0`, `GMT-00` are UTC.
    if id.starts_with("GMT")
        && tz
            .offset_from_utc_datetime(&NaiveDateTime::default())
            .fix()
            .local_minus_utc()
            == 0
    {
        return Ok(None);
    }
    Ok(Some(SessionZone { id: id.to_string(), tz }))
}

/// A tz database name, parsed strictly (Arrow's `Tz` also reads offsets
/// such as `+08:00`, which Flink refuses as a session zone).
mod chrono_tz_name {
    pub struct Checked(pub super::Tz);

    impl std::str::FromStr for Checked {
        type Err = ();
        fn from_str(s: &str) -> Result<Self, ()> {
            if !s.chars().next().is_some_and(|c| c.is_ascii_alphabetic()) {
                return Err(());
            }
            s.parse::<super::Tz>().map(Checked).map_err(|_| ())
        }
    }
}

/// `+h`, `+hh`, `+hhmm`, `+hh:mm` (or `-`) after `GMT`, as Java reads a
/// custom zone id.
fn gmt_offset(rest: &str) -> Option<Tz> {
    let (sign, digits) = rest.split_at_checked(1)?;
    if !matches!(sign, "+" | "-") || digits.is_empty() {
        return None;
    }
    let (h, m) = digits.split_once(':').unwrap_or(match digits.len() {
        3 | 4 => digits.split_at(digits.len() - 2),
        _ => (digits, "0"),
    });
    if !h.chars().chain(m.chars()).all(|c| c.is_ascii_digit()) || h.len() > 2 || m.len() > 2 {
        return None;
    }
    let (h, m) = (h.parse::<u32>().ok()?, m.parse::<u32>().ok()?);
    if h > 23 || m > 59 {
        return None;
    }
    format!("{sign}{h:02}:{m:02}").parse().ok()
}

/// A time zone argument as Java's `TimeZone.getTimeZone` reads its id
/// (what Flink's time functions use): a tz database name, `GMT+h`,
/// `GMT+hh`, `GMT+hh:mm` or `GMT-...`; anything else is GMT, as Java falls
/// back (`'+05:30'` and `'Foo/Bar'` included).
pub fn java_zone(id: &str) -> Tz {
    let gmt = || "+00:00".parse().expect("a fixed offset");
    let id = id.trim();
    if let Some(rest) = id.strip_prefix("GMT").filter(|r| !r.is_empty()) {
        return gmt_offset(rest).unwrap_or_else(gmt);
    }
    if id.starts_with(['+', '-']) {
        return gmt();
    }
    id.parse().unwrap_or_else(|_| gmt())
}

/// How a local time in a gap or an overlap becomes an instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resolve {
    /// `LocalDateTime.atZone`: an overlap's earlier instant.
    Earlier,
    /// A lenient `java.util.Calendar`: an overlap's later instant.
    Later,
}

/// The instant a local time names in `zone`; a time in a gap (clocks
/// forward) is read with the offset before the gap, so it moves forward
/// by the gap's length, as both Java APIs do.
pub fn instant_of(local: NaiveDateTime, zone: &Tz, resolve: Resolve) -> DateTime<Utc> {
    match zone.from_local_datetime(&local) {
        chrono::LocalResult::Single(t) => t.with_timezone(&Utc),
        chrono::LocalResult::Ambiguous(earlier, later) => match resolve {
            Resolve::Earlier => earlier.with_timezone(&Utc),
            Resolve::Later => later.with_timezone(&Utc),
        },
        chrono::LocalResult::None => {
            let before = zone
                .offset_from_utc_datetime(&(local - chrono::Duration::hours(3)))
                .fix();
            (local - chrono::Duration::seconds(i64::from(before.local_minus_utc()))).and_utc()
        }
    }
}

/// The wall time in `zone` of the instant `epoch` (in `ticks_per_second`
/// units since the epoch), in the same units.
pub fn to_local(epoch: i64, ticks_per_second: i64, zone: &Tz) -> Option<i64> {
    let secs = epoch.div_euclid(ticks_per_second);
    let t = DateTime::from_timestamp(secs, 0)?;
    let offset = zone.offset_from_utc_datetime(&t.naive_utc()).fix().local_minus_utc();
    epoch.checked_add(i64::from(offset).checked_mul(ticks_per_second)?)
}

/// The instant the wall time `local` (in `ticks_per_second` units) names
/// in `zone`, in the same units.
pub fn from_local(local: i64, ticks_per_second: i64, zone: &Tz, resolve: Resolve) -> Option<i64> {
    let secs = local.div_euclid(ticks_per_second);
    let wall = DateTime::from_timestamp(secs, 0)?.naive_utc();
    let instant = instant_of(wall, zone, resolve).timestamp();
    local.checked_add((instant - secs).checked_mul(ticks_per_second)?)
}

/// A watermark as an operator of windows on `zone`'s wall clock compares
/// it ([`local_watermark`]); unchanged without a zone (UTC).
pub fn watermark_in(wm: i64, zone: Option<&Tz>) -> i64 {
    match zone {
        Some(z) => local_watermark(wm, z),
        None => wm,
    }
}

/// The wall-clock watermark of the instant watermark `wm` (milliseconds):
/// the latest wall time every instant of which is at or before `wm`, so a
/// window `[start, end)` of wall time is complete when `end - 1` is at or
/// before it (Flink fires it at the instant of `end - 1`, the later one
/// of a time that happens twice). Past a change forward, the wall time of
/// `wm`; while the clocks go back (the first pass of the repeated hour),
/// the wall time just before the repeated hour, since each of its times
/// happens again later. The ends of time stay as they are.
pub fn local_watermark(wm: i64, zone: &Tz) -> i64 {
    const HOUR: i64 = 3_600_000;
    if wm == i64::MIN || wm == i64::MAX {
        return wm;
    }
    let Some(local) = to_local(wm, 1000, zone) else {
        return wm;
    };
    match from_local(local, 1000, zone, Resolve::Later) {
        Some(later) if later > wm => {}
        _ => return local,
    }
    // In the repeated hour's first pass: the clocks go back within a few
    // hours after `wm`; find the instant they do (to the millisecond).
    let offset = |t: i64| to_local(t, 1000, zone).map(|l| l - t);
    let before = offset(wm);
    let (mut lo, mut hi) = (wm, wm.saturating_add(3 * HOUR));
    if offset(hi) == before {
        return local;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if offset(mid) == before {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    // `hi` is the first instant on the new offset: its wall time starts
    // the repeated hour.
    to_local(hi, 1000, zone).map_or(local, |start| start - 1)
}

/// Ticks per second of a timestamp type (`None`: not a timestamp).
pub fn ticks_per_second(t: &arrow::datatypes::DataType) -> Option<i64> {
    use arrow::datatypes::{DataType, TimeUnit};
    match t {
        DataType::Timestamp(TimeUnit::Second, _) => Some(1),
        DataType::Timestamp(TimeUnit::Millisecond, _) => Some(1_000),
        DataType::Timestamp(TimeUnit::Microsecond, _) => Some(1_000_000),
        DataType::Timestamp(TimeUnit::Nanosecond, _) => Some(1_000_000_000),
        _ => None,
    }
}

/// Each instant of a timestamp array as the zone's wall time (a timestamp
/// without zone, same unit); any other array unchanged.
pub fn wall_times(a: &arrow::array::ArrayRef, zone: &Tz) -> Result<arrow::array::ArrayRef, arrow::error::ArrowError> {
    use arrow::array::AsArray;
    use arrow::datatypes::{DataType, Int64Type};
    let (Some(ticks), DataType::Timestamp(unit, _)) = (ticks_per_second(a.data_type()), a.data_type()) else {
        return Ok(a.clone());
    };
    let raw = arrow::compute::cast(a, &DataType::Int64)?;
    let local = raw.as_primitive::<Int64Type>().try_unary::<_, Int64Type, _>(|v| {
        to_local(v, ticks, zone)
            .ok_or_else(|| arrow::error::ArrowError::ComputeError("a timestamp out of range in the time zone".into()))
    })?;
    arrow::compute::cast(&local, &DataType::Timestamp(*unit, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn la() -> Tz {
        "America/Los_Angeles".parse().expect("zone")
    }

    #[test]
    fn session_zones_are_read_as_flink_validates_them() {
        for utc in ["UTC", "GMT", "Etc/UTC", "GMT+00:00"] {
            assert_eq!(session_zone(utc), Ok(None), "{utc}");
        }
        for ok in ["America/Los_Angeles", "Asia/Shanghai", "GMT+8", "GMT-03:00", "GMT+0530"] {
            assert!(session_zone(ok).expect(ok).is_some(), "{ok}");
        }
        for bad in ["+08:00", "UTC+8", "Foo/Bar", "GMT+25", "asia/shanghai", "", "GMT+", "Z"] {
            let e = session_zone(bad).expect_err(bad);
            assert!(e.contains(&format!("'{bad}'")), "{e}");
        }
    }

    #[test]
    fn wall_times_and_instants_around_daylight_saving_time() {
        let ms = 1000;
        // 2024-03-10 10:00 UTC is 03:00 PDT; a millisecond before, 01:59:59.999 PST.
        let local = |epoch| to_local(epoch, ms, &la()).expect("in range");
        assert_eq!(local(1_710_064_800_000), 1_710_064_800_000 - 7 * 3_600_000);
        assert_eq!(local(1_710_064_799_999), 1_710_064_799_999 - 8 * 3_600_000);
        let wall = |s: &str| NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S").expect("time");
        let at = |s: &str, r| from_local(wall(s).and_utc().timestamp_millis(), ms, &la(), r).expect("in range");
        // In the gap: 02:30 is read with PST, 10:30 UTC (03:30 PDT).
        assert_eq!(at("2024-03-10 02:30:00", Resolve::Earlier), 1_710_066_600_000);
        assert_eq!(at("2024-03-10 02:30:00", Resolve::Later), 1_710_066_600_000);
        // In the overlap: 01:30 is 08:30 UTC (PDT) or 09:30 UTC (PST).
        assert_eq!(at("2024-11-03 01:30:00", Resolve::Earlier), 1_730_622_600_000);
        assert_eq!(at("2024-11-03 01:30:00", Resolve::Later), 1_730_626_200_000);
        // The wall-clock watermark: the wall time, except in the first pass
        // of the repeated hour (08:00-09:00 UTC on 2024-11-03), where it
        // waits at 00:59:59.999 for the second pass.
        let wall_ms = |s: &str| wall(s).and_utc().timestamp_millis();
        let z = la();
        assert_eq!(
            local_watermark(1_730_622_600_000, &z),
            wall_ms("2024-11-03 00:59:59") + 999
        );
        assert_eq!(
            local_watermark(1_730_620_800_000, &z),
            wall_ms("2024-11-03 00:59:59") + 999
        );
        assert_eq!(
            local_watermark(1_730_620_799_999, &z),
            wall_ms("2024-11-03 00:59:59") + 999
        );
        assert_eq!(local_watermark(1_730_624_400_000, &z), wall_ms("2024-11-03 01:00:00"));
        assert_eq!(local_watermark(1_710_064_800_000, &z), wall_ms("2024-03-10 03:00:00"));
        assert_eq!(local_watermark(i64::MAX, &z), i64::MAX);
        // Before the epoch, in seconds.
        assert_eq!(to_local(-1, 1, &la()), Some(-1 - 8 * 3600));
    }
}
