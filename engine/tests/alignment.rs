//! Watermark alignment with a driven clock (tokio's paused time: it only
//! moves when every task waits, so the runs are deterministic and take no
//! wall-clock time). Splits are paced: one batch per 100 ms of clock time,
//! each advancing event time by a fixed step.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Int64Array, TimestampMillisecondArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use datafusion::physical_expr::expressions::Column;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use weir_engine::connectors::{SourceSplit, SplitPoll};
use weir_engine::error::Result;
use weir_engine::message::StreamMessage;
use weir_engine::plan::WatermarkNode;
use weir_engine::runtime::alignment::AlignmentCoordinator;
use weir_engine::runtime::chain::Chain;
use weir_engine::runtime::metrics::{NodeMetrics, SourceStatus, SplitState};
use weir_engine::runtime::output::{Output, Partitioner};
use weir_engine::runtime::source_task::{EmitStrategy, ReaderAlignment, SourceTask};

const PACE: Duration = Duration::from_millis(100);

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("split", DataType::Int64, false),
        Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), false),
    ]))
}

/// Event time advances by `step` ms per batch, one batch per PACE.
struct Paced {
    id: i64,
    next_ts: i64,
    step: i64,
    due: Option<Instant>,
    /// When set, the split goes silent after this many batches.
    silent_after: Option<u64>,
    batches: u64,
    pausable: bool,
}

impl Paced {
    fn new(id: i64, step: i64) -> Self {
        Self {
            id,
            next_ts: 0,
            step,
            due: None,
            silent_after: None,
            batches: 0,
            pausable: true,
        }
    }
}

impl SourceSplit for Paced {
    fn id(&self) -> String {
        format!("split-{}", self.id)
    }

    fn poll_batch(&mut self) -> Result<SplitPoll> {
        let now = Instant::now();
        if self.silent_after.is_some_and(|n| self.batches >= n) {
            return Ok(SplitPoll::Wait(now + Duration::from_secs(3600)));
        }
        if let Some(d) = self.due.filter(|d| *d > now) {
            return Ok(SplitPoll::Wait(d));
        }
        self.due = Some(now + PACE);
        self.batches += 1;
        let ts = self.next_ts;
        self.next_ts += self.step;
        let b = RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from(vec![self.id])),
                Arc::new(TimestampMillisecondArray::from(vec![ts])),
            ],
        )?;
        Ok(SplitPoll::Batch(b))
    }

    fn offset(&self) -> u64 {
        self.batches
    }

    fn seek(&mut self, _position: u64) -> Result<()> {
        Ok(())
    }

    fn supports_pause(&self) -> bool {
        self.pausable
    }
}

struct Reader {
    rx: mpsc::Receiver<StreamMessage>,
    status: Arc<SourceStatus>,
    handle: tokio::task::JoinHandle<Result<()>>,
}

#[allow(clippy::too_many_arguments)]
fn reader(
    node: usize,
    splits: Vec<Paced>,
    coordinator: &Arc<AlignmentCoordinator>,
    drift_ms: i64,
    buffer: usize,
    allow_unaligned: bool,
    idle: Option<Duration>,
    stop: &watch::Receiver<bool>,
) -> Reader {
    reader_with_capacity(
        1024,
        node,
        splits
            .into_iter()
            .map(|s| Box::new(s) as Box<dyn SourceSplit>)
            .collect(),
        false,
        coordinator,
        drift_ms,
        buffer,
        allow_unaligned,
        idle,
        stop,
    )
}

#[allow(clippy::too_many_arguments)]
fn reader_with_capacity(
    capacity: usize,
    node: usize,
    splits: Vec<Box<dyn SourceSplit>>,
    bounded: bool,
    coordinator: &Arc<AlignmentCoordinator>,
    drift_ms: i64,
    buffer: usize,
    allow_unaligned: bool,
    idle: Option<Duration>,
    stop: &watch::Receiver<bool>,
) -> Reader {
    let (tx, rx) = mpsc::channel(capacity);
    let status = Arc::new(SourceStatus::new(
        format!("t{node}"),
        0,
        Some(coordinator.group.clone()),
    ));
    let task = SourceTask {
        splits,
        bounded,
        computed: None,
        schema: schema(),
        watermark: Some(WatermarkNode {
            column: "ts".into(),
            sql: "ts".into(),
            expr: Arc::new(Column::new("ts", 1)),
            idle_timeout: idle,
            alignment: None,
        }),
        rowtime_index: Some(1),
        emit: EmitStrategy::OnPeriodic,
        interval: Duration::from_millis(200),
        chain: Chain::new(vec![], vec![], vec![], 0, Default::default()),
        output: Output::channels(vec![tx], Partitioner::Forward),
        stop: stop.clone(),
        metrics: Arc::new(NodeMetrics::new(format!("source {node}"))),
        alignment: Some(ReaderAlignment {
            coordinator: coordinator.clone(),
            reader: (node, 0),
            max_drift_ms: drift_ms,
            update_interval: coordinator.update_interval,
            buffer_size: buffer,
            allow_unaligned,
            connector: "paced-test".into(),
        }),
        status: Some(status.clone()),
        uid: format!("source-{node}"),
        subtask: 0,
        restored: Default::default(),
        triggers: None,
        checkpointing: None,
        dead_letters: None,
        inbox: None,
    };
    Reader {
        rx,
        status,
        handle: tokio::spawn(task.run()),
    }
}

/// Highest event time seen per split id, updated as batches arrive.
fn drain(
    mut rx: mpsc::Receiver<StreamMessage>,
    max: Arc<std::sync::Mutex<std::collections::HashMap<i64, i64>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            if let StreamMessage::Batch(b) = m {
                let b = b.rows;
                let ids = b.column(0).as_any().downcast_ref::<Int64Array>().expect("ids");
                let ts = b
                    .column(1)
                    .as_any()
                    .downcast_ref::<TimestampMillisecondArray>()
                    .expect("ts");
                let mut g = max.lock().expect("lock");
                for i in 0..b.num_rows() {
                    let e = g.entry(ids.value(i)).or_insert(i64::MIN);
                    *e = (*e).max(ts.value(i));
                }
            }
        }
    })
}

type Seen = Arc<std::sync::Mutex<std::collections::HashMap<i64, i64>>>;

fn seen(s: &Seen, id: i64) -> i64 {
    s.lock().expect("lock").get(&id).copied().unwrap_or(i64::MIN)
}

#[tokio::test(start_paused = true)]
async fn a_fast_split_is_paused_and_the_slow_one_keeps_going() {
    let (stop_tx, stop) = watch::channel(false);
    let c = AlignmentCoordinator::new("g".into(), Duration::from_secs(1));
    tokio::spawn(c.clone().run());
    // One reader, two splits: split 1 is 10x faster in event time.
    let r = reader(
        0,
        vec![Paced::new(1, 10_000), Paced::new(2, 1_000)],
        &c,
        30_000,
        0,
        false,
        None,
        &stop,
    );
    let s: Seen = Default::default();
    let d = drain(r.rx, s.clone());
    let mut max_spread = 0;
    let mut was_paused = false;
    for step in 0..400 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Before the first announcement (up to two update intervals) nothing
        // limits the fast split, as in Flink: it runs ~200 s ahead, then
        // waits until the slow split is within the drift (~17 s of clock).
        // Measure the steady state after that.
        if step >= 250 {
            max_spread = max_spread.max(seen(&s, 1) - seen(&s, 2));
        }
        let (splits, _) = r.status.snapshot();
        was_paused |= splits
            .iter()
            .any(|x| x.split == "split-1" && x.state == SplitState::Paused);
        assert!(
            !splits
                .iter()
                .any(|x| x.split == "split-2" && x.state == SplitState::Paused),
            "the slow split is never paused"
        );
    }
    assert!(was_paused, "the fast split was paused");
    // 40 s of clock time: the slow split made ~400 s of event time.
    assert!(seen(&s, 2) >= 390_000, "slow split kept going: {}", seen(&s, 2));
    // Spread bound: drift + one batch of the fast split (buffer 0 pauses
    // right after it) + how far the slow split moved while its report and
    // the announcement travelled (two intervals at 10 s/s).
    assert!(max_spread <= 30_000 + 10_000 + 20_000, "spread {max_spread}");
    let _ = stop_tx.send(true);
    r.handle.await.expect("join").expect("clean stop");
    d.await.expect("drain");
}

/// Event time two equally fast readers reach in `secs` of clock time.
async fn progress(buffer: usize, secs: u64) -> i64 {
    let (stop_tx, stop) = watch::channel(false);
    let c = AlignmentCoordinator::new("g".into(), Duration::from_secs(1));
    tokio::spawn(c.clone().run());
    // Each: 10 s of event time per batch, 10 batches per second = 100 s/s.
    let a = reader(0, vec![Paced::new(1, 10_000)], &c, 30_000, buffer, false, None, &stop);
    let b = reader(1, vec![Paced::new(2, 10_000)], &c, 30_000, buffer, false, None, &stop);
    let s: Seen = Default::default();
    let da = drain(a.rx, s.clone());
    let db = drain(b.rx, s.clone());
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let _ = stop_tx.send(true);
    a.handle.await.expect("join").expect("stop");
    b.handle.await.expect("join").expect("stop");
    da.await.expect("drain");
    db.await.expect("drain");
    seen(&s, 1).min(seen(&s, 2))
}

#[tokio::test(start_paused = true)]
async fn buffer_zero_caps_catch_up_at_about_one_drift_per_interval_and_buffer_three_does_not() {
    let capped = progress(0, 30).await;
    let free = progress(3, 30).await;
    // Recorded in docs/benchmarks.md (run with --nocapture).
    println!(
        "30 s of clock, 100 s/s sources, drift 30 s, interval 1 s: buffer 0 -> {capped} ms, buffer 3 -> {free} ms of event time"
    );
    // Unthrottled the readers make 100 s of event time per second.
    assert!(free >= 2_500_000, "buffer 3: no cap ({free} ms in 30 s)");
    // Buffer 0: paused every announcement round trip, ~30 s per second.
    assert!(
        capped <= 30 * 45_000,
        "buffer 0 is capped near drift per interval ({capped} ms in 30 s)"
    );
    assert!(
        free > 2 * capped,
        "buffer 3 ({free}) much faster than buffer 0 ({capped})"
    );
}

#[tokio::test(start_paused = true)]
async fn an_idle_member_does_not_block_the_group() {
    let (stop_tx, stop) = watch::channel(false);
    let c = AlignmentCoordinator::new("g".into(), Duration::from_secs(1));
    tokio::spawn(c.clone().run());
    // The quiet member reads 5 batches (reaching 4 s of event time), then
    // goes idle. Were it to keep reporting 4 s, the busy member would be
    // held at 34 s; an idle reader reports MAX instead.
    let mut quiet = Paced::new(2, 1_000);
    quiet.silent_after = Some(5);
    let busy = reader(
        0,
        vec![Paced::new(1, 10_000)],
        &c,
        30_000,
        3,
        false,
        Some(Duration::from_millis(500)),
        &stop,
    );
    let idle = reader(
        1,
        vec![quiet],
        &c,
        30_000,
        3,
        false,
        Some(Duration::from_millis(500)),
        &stop,
    );
    let s: Seen = Default::default();
    let d1 = drain(busy.rx, s.clone());
    let d2 = drain(idle.rx, s.clone());
    tokio::time::sleep(Duration::from_secs(10)).await;
    // 10 s at 100 s/s (buffer 3: no cap) is far past 34 s.
    assert!(seen(&s, 1) >= 900_000, "busy reader not held back: {}", seen(&s, 1));
    let _ = stop_tx.send(true);
    busy.handle.await.expect("join").expect("stop");
    idle.handle.await.expect("join").expect("stop");
    d1.await.expect("drain");
    d2.await.expect("drain");
}

#[tokio::test(start_paused = true)]
async fn drift_zero_holds_the_leader_until_the_minimum_catches_up() {
    let (stop_tx, stop) = watch::channel(false);
    let c = AlignmentCoordinator::new("g".into(), Duration::from_secs(1));
    tokio::spawn(c.clone().run());
    let r = reader(
        0,
        vec![Paced::new(1, 5_000), Paced::new(2, 1_000)],
        &c,
        0,
        0,
        false,
        None,
        &stop,
    );
    let s: Seen = Default::default();
    let d = drain(r.rx, s.clone());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (fast_at_3s, slow_at_3s) = (seen(&s, 1), seen(&s, 2));
    tokio::time::sleep(Duration::from_secs(10)).await;
    // With drift 0 the leader may not pass the minimum: it stays where the
    // first announcement stopped it while the minimum is still below it.
    assert!(
        seen(&s, 2) < fast_at_3s,
        "minimum still behind ({} < {fast_at_3s})",
        seen(&s, 2)
    );
    assert_eq!(seen(&s, 1), fast_at_3s, "the leader did not move");
    // The minimum keeps moving (no deadlock), though buffer 0 makes it
    // pause itself after each batch (its own report is one interval old).
    assert!(seen(&s, 2) > slow_at_3s, "the minimum progresses");
    let _ = stop_tx.send(true);
    r.handle.await.expect("join").expect("stop");
    d.await.expect("drain");
}

#[tokio::test(start_paused = true)]
async fn a_connector_without_split_pause_fails_the_job_unless_allowed() {
    let (_stop_tx, stop) = watch::channel(false);
    let c = AlignmentCoordinator::new("g".into(), Duration::from_secs(1));
    tokio::spawn(c.clone().run());
    let mut fast = Paced::new(1, 10_000);
    fast.pausable = false;
    let mut slow = Paced::new(2, 1_000);
    slow.pausable = false;
    let r = reader(0, vec![fast, slow], &c, 30_000, 0, false, None, &stop);
    let s: Seen = Default::default();
    let _d = drain(r.rx, s.clone());
    let err = tokio::time::timeout(Duration::from_secs(60), r.handle)
        .await
        .expect("the job fails before the deadline")
        .expect("join")
        .expect_err("must fail");
    let msg = err.to_string();
    assert!(msg.contains("connector 'paced-test' cannot pause splits"), "{msg}");
    assert!(
        msg.contains("pipeline.watermark-alignment.allow-unaligned-source-splits"),
        "{msg}"
    );

    // Allowed: the whole reader pauses instead, and the job keeps running.
    let (stop_tx, stop) = watch::channel(false);
    let mut fast = Paced::new(1, 10_000);
    fast.pausable = false;
    let mut slow = Paced::new(2, 1_000);
    slow.pausable = false;
    let c2 = AlignmentCoordinator::new("g2".into(), Duration::from_secs(1));
    tokio::spawn(c2.clone().run());
    let r = reader(0, vec![fast, slow], &c2, 30_000, 0, true, None, &stop);
    let s: Seen = Default::default();
    let d = drain(r.rx, s.clone());
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(seen(&s, 2) > 0);
    let _ = stop_tx.send(true);
    r.handle
        .await
        .expect("join")
        .expect("whole-reader pause keeps the job alive");
    d.await.expect("drain");
}

/// Regression: a reader whose only split is paused sleeps; the announcement
/// that wakes it must also resume it (waiting on `changed()` marks the
/// announcement seen, so it has to be remembered).
#[tokio::test(start_paused = true)]
async fn a_fully_paused_reader_resumes_when_the_group_catches_up() {
    let (stop_tx, stop) = watch::channel(false);
    let c = AlignmentCoordinator::new("g".into(), Duration::from_secs(1));
    tokio::spawn(c.clone().run());
    let fast = reader(0, vec![Paced::new(1, 10_000)], &c, 30_000, 0, false, None, &stop);
    let slow = reader(1, vec![Paced::new(2, 1_000)], &c, 30_000, 0, false, None, &stop);
    let s: Seen = Default::default();
    let d1 = drain(fast.rx, s.clone());
    let d2 = drain(slow.rx, s.clone());
    let mut fast_paused_at = None;
    for _ in 0..600 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (splits, _) = fast.status.snapshot();
        if fast_paused_at.is_none() && splits.iter().any(|x| x.state == SplitState::Paused) {
            fast_paused_at = Some(seen(&s, 1));
        }
    }
    let paused_at = fast_paused_at.expect("the fast reader was paused");
    // 60 s of clock: the slow reader made ~600 s; the fast one must have
    // resumed and followed it (within the drift and one round trip).
    assert!(seen(&s, 2) >= 590_000);
    assert!(
        seen(&s, 1) > paused_at + 300_000,
        "fast reader resumed ({} vs paused at {paused_at})",
        seen(&s, 1)
    );
    assert!(
        seen(&s, 1) - seen(&s, 2) <= 30_000 + 10_000 + 20_000,
        "and stays within the drift"
    );
    let _ = stop_tx.send(true);
    fast.handle.await.expect("join").expect("stop");
    slow.handle.await.expect("join").expect("stop");
    d1.await.expect("drain");
    d2.await.expect("drain");
}

/// A reader with no split reports nothing (FLINK-32414) and a finished
/// bounded reader reports MAX (FLINK-35157): neither holds the group back.
#[tokio::test(start_paused = true)]
async fn readers_without_splits_or_finished_do_not_hold_the_group() {
    let (stop_tx, stop) = watch::channel(false);
    let c = AlignmentCoordinator::new("g".into(), Duration::from_secs(1));
    tokio::spawn(c.clone().run());
    let busy = reader(0, vec![Paced::new(1, 10_000)], &c, 30_000, 3, false, None, &stop);
    let empty = reader(1, vec![], &c, 30_000, 3, false, None, &stop);
    // A bounded reader: the split finishes after 3 batches (at 2 s).
    let mut short = Paced::new(3, 1_000);
    short.silent_after = Some(3);
    let bounded = reader_with_capacity(
        64,
        2,
        vec![Box::new(FinishAfter { inner: short, left: 3 })],
        true,
        &c,
        30_000,
        3,
        false,
        None,
        &stop,
    );
    let s: Seen = Default::default();
    let d1 = drain(busy.rx, s.clone());
    let d2 = drain(empty.rx, s.clone());
    let d3 = drain(bounded.rx, s.clone());
    tokio::time::sleep(Duration::from_secs(10)).await;
    bounded
        .handle
        .await
        .expect("join")
        .expect("the bounded reader finished");
    assert!(
        seen(&s, 1) >= 900_000,
        "busy reader not held by the empty or the finished one: {}",
        seen(&s, 1)
    );
    let _ = stop_tx.send(true);
    busy.handle.await.expect("join").expect("stop");
    empty.handle.await.expect("join").expect("stop");
    d1.await.expect("drain");
    d2.await.expect("drain");
    d3.await.expect("drain");
}

/// Ends after `left` batches.
struct FinishAfter {
    inner: Paced,
    left: u64,
}

impl SourceSplit for FinishAfter {
    fn id(&self) -> String {
        self.inner.id()
    }

    fn poll_batch(&mut self) -> Result<SplitPoll> {
        if self.left == 0 {
            return Ok(SplitPoll::Finished);
        }
        let r = self.inner.poll_batch()?;
        if matches!(r, SplitPoll::Batch(_)) {
            self.left -= 1;
        }
        Ok(r)
    }

    fn offset(&self) -> u64 {
        self.inner.offset()
    }

    fn seek(&mut self, position: u64) -> Result<()> {
        self.inner.seek(position)
    }
}

/// A split paused by alignment for longer than the idle timeout is not
/// declared idle (FLIP-471): it stays paused and keeps holding its reader's
/// watermark, instead of going idle and being released early.
#[tokio::test(start_paused = true)]
async fn time_paused_does_not_count_toward_idleness() {
    let (stop_tx, stop) = watch::channel(false);
    let c = AlignmentCoordinator::new("g".into(), Duration::from_secs(1));
    tokio::spawn(c.clone().run());
    let fast = reader(
        0,
        vec![Paced::new(1, 10_000)],
        &c,
        30_000,
        0,
        false,
        Some(Duration::from_millis(500)),
        &stop,
    );
    let slow = reader(
        1,
        vec![Paced::new(2, 1_000)],
        &c,
        30_000,
        0,
        false,
        Some(Duration::from_millis(500)),
        &stop,
    );
    let s: Seen = Default::default();
    let d1 = drain(fast.rx, s.clone());
    let d2 = drain(slow.rx, s.clone());
    let mut paused_long = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (splits, _) = fast.status.snapshot();
        assert!(
            !splits.iter().any(|x| x.state == SplitState::Idle),
            "a paused split never turns idle"
        );
        paused_long |= splits
            .iter()
            .any(|x| x.state == SplitState::Paused && x.paused > Duration::from_secs(2));
    }
    assert!(
        paused_long,
        "the fast split was paused for longer than the idle timeout"
    );
    let _ = stop_tx.send(true);
    fast.handle.await.expect("join").expect("stop");
    slow.handle.await.expect("join").expect("stop");
    d1.await.expect("drain");
    d2.await.expect("drain");
}

/// A reader whose consumer does not keep up shows its splits as
/// back-pressured (not idle, not paused).
#[tokio::test(start_paused = true)]
async fn a_reader_blocked_by_its_consumer_is_back_pressured() {
    let (stop_tx, stop) = watch::channel(false);
    let c = AlignmentCoordinator::new("g".into(), Duration::from_secs(1));
    tokio::spawn(c.clone().run());
    // Capacity 2 and nobody reading: the reader fills the channel and waits.
    let r = reader_with_capacity(
        2,
        0,
        vec![Box::new(Paced::new(1, 1_000))],
        false,
        &c,
        30_000,
        3,
        false,
        None,
        &stop,
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (splits, _) = r.status.snapshot();
    assert!(
        splits.iter().all(|x| x.state == SplitState::BackPressured),
        "{splits:?}"
    );
    let _ = stop_tx.send(true);
    drop(r.rx);
    r.handle.await.expect("join").expect("ends once its consumer is gone");
}
