//! `SHOW WATERMARKS FOR JOB '<name>'`: what the seed asks an operator of a
//! backfill to watch.
//!
//! - one row per source split: its watermark, lag behind the wall clock,
//!   state (active / idle / paused-by-alignment / finished), time paused;
//! - one row per alignment group: the group minimum, the max allowed
//!   watermark and the spread between the highest and lowest reader;
//! - one row per stateful operator: live state bytes, the state it holds per
//!   second of event time, and — given `pipeline.watermark-alignment.state-budget`
//!   — the max drift that budget fits (budget / bytes per second).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::{ArrayRef, Int64Array, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use weir_engine::message::{MAX_WATERMARK, MIN_WATERMARK};
use weir_engine::runtime::alignment::max_allowed;
use weir_engine::runtime::metrics::JobMetrics;

#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub scope: &'static str,
    pub name: String,
    pub watermark: String,
    pub lag_ms: Option<i64>,
    pub state: String,
    pub paused_ms: Option<i64>,
    pub detail: String,
}

pub fn format_ts(ts: i64) -> String {
    match ts {
        MIN_WATERMARK => "-inf".into(),
        MAX_WATERMARK => "+inf".into(),
        t => chrono::DateTime::from_timestamp_millis(t).map_or_else(
            || t.to_string(),
            |d| d.naive_utc().format("%Y-%m-%d %H:%M:%S%.3f").to_string(),
        ),
    }
}

fn lag(now_ms: i64, wm: i64) -> Option<i64> {
    (wm != MIN_WATERMARK && wm != MAX_WATERMARK).then(|| now_ms.saturating_sub(wm))
}

pub fn rows(metrics: &JobMetrics, budget: Option<u64>, now_ms: i64) -> Vec<Row> {
    let mut out = vec![];
    for src in &metrics.sources {
        let (splits, reader_wm) = src.snapshot();
        let drift = src.group.as_ref().and_then(|g| {
            let c = metrics.groups.iter().find(|c| &c.group == g)?;
            let min = c.group_min().filter(|m| *m != MAX_WATERMARK)?;
            if reader_wm == MIN_WATERMARK || reader_wm == MAX_WATERMARK {
                return None;
            }
            Some(reader_wm.saturating_sub(max_allowed(min, c.max_drift_ms.load(Ordering::Relaxed))))
        });
        for s in splits {
            out.push(Row {
                scope: "split",
                name: format!("{}[{}] {}", src.table, src.subtask, s.split),
                watermark: format_ts(s.watermark),
                lag_ms: lag(now_ms, s.watermark),
                state: s.state.as_str().to_string(),
                paused_ms: Some(s.paused.as_millis() as i64),
                detail: format!(
                    "offset {}{}",
                    s.offset,
                    drift
                        .map(|d| format!("; reader drift {d} ms (watermark - max allowed)"))
                        .unwrap_or_default()
                ),
            });
        }
    }
    for c in &metrics.groups {
        let min = c.group_min();
        let drift = c.max_drift_ms.load(Ordering::Relaxed);
        out.push(Row {
            scope: "group",
            name: c.group.clone(),
            watermark: min.map_or("-".into(), format_ts),
            lag_ms: min.and_then(|m| lag(now_ms, m)),
            state: "aligning".into(),
            paused_ms: None,
            detail: format!(
                "max allowed {}; spread {}; max drift {drift} ms",
                min.map_or("-".into(), |m| format_ts(max_allowed(m, drift))),
                c.spread().map_or("-".into(), |s| format!("{s} ms"))
            ),
        });
    }
    let mut total_rate = 0.0;
    for n in &metrics.nodes {
        let bytes = n.state_bytes.load(Ordering::Relaxed);
        let max_ts = n.max_event_time.load(Ordering::Relaxed);
        if max_ts == MIN_WATERMARK {
            continue;
        }
        let wm = n.watermark.load(Ordering::Relaxed);
        // State spans the event time between the watermark and the newest row.
        let span_ms = if wm == MIN_WATERMARK || wm == MAX_WATERMARK {
            0
        } else {
            max_ts.saturating_sub(wm)
        };
        let now_rate = if span_ms > 0 {
            bytes as f64 / (span_ms as f64 / 1000.0)
        } else {
            0.0
        };
        // Size for the worst seen so far, which survives the job's end.
        let rate = now_rate.max(n.peak_state_rate.load(Ordering::Relaxed) as f64);
        total_rate += rate;
        out.push(Row {
            scope: "state",
            name: n.name.clone(),
            watermark: format_ts(wm),
            lag_ms: None,
            state: format!("{bytes} bytes"),
            paused_ms: None,
            detail: format!(
                "now {now_rate:.0} bytes per second of event time over {span_ms} ms; peak {rate:.0} bytes/s; widest span {} ms",
                n.peak_state_span_ms.load(Ordering::Relaxed)
            ),
        });
    }
    if let Some(b) = budget {
        let detail = if total_rate > 0.0 {
            format!(
                "a max drift of about {:.0} s fits {b} bytes of state",
                b as f64 / total_rate
            )
        } else {
            "no state growth measured yet".to_string()
        };
        out.push(Row {
            scope: "sizing",
            name: "state-budget".into(),
            watermark: "-".into(),
            lag_ms: None,
            state: format!("{b} bytes"),
            paused_ms: None,
            detail,
        });
    }
    out
}

pub fn to_batch(rows: &[Row]) -> Result<RecordBatch, arrow::error::ArrowError> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("scope", DataType::Utf8, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("watermark", DataType::Utf8, false),
        Field::new("lag_ms", DataType::Int64, true),
        Field::new("state", DataType::Utf8, false),
        Field::new("paused_ms", DataType::Int64, true),
        Field::new("detail", DataType::Utf8, false),
    ]));
    let s = |f: fn(&Row) -> String| -> ArrayRef { Arc::new(StringArray::from(rows.iter().map(f).collect::<Vec<_>>())) };
    RecordBatch::try_new(
        schema,
        vec![
            s(|r| r.scope.to_string()),
            s(|r| r.name.clone()),
            s(|r| r.watermark.clone()),
            Arc::new(Int64Array::from(rows.iter().map(|r| r.lag_ms).collect::<Vec<_>>())),
            s(|r| r.state.clone()),
            Arc::new(Int64Array::from(rows.iter().map(|r| r.paused_ms).collect::<Vec<_>>())),
            s(|r| r.detail.clone()),
        ],
    )
}
