//! Batch mode (`execution.runtime-mode` = batch): a query over bounded
//! sources runs as one DataFusion physical plan, with DataFusion's hash
//! aggregates and joins, sorts and window functions, under a memory pool
//! that spills to disk. Two adapters join it to the rest of Weir:
//!
//! - [`SplitStream`]: a source split as a DataFusion partition, so the plan
//!   reads tables through Weir's connectors (formats, computed columns and
//!   all) as a streaming job would;
//! - [`PlanSource`]: the plan's output partitions as the splits of a
//!   source, so the result reaches the sink (or the shell) through the
//!   job runtime as any job's rows do: insert-only, once, at the end of
//!   each aggregation.
//!
//! No watermarks run through a batch plan: with every row at hand nothing
//! is late, and a window closes when its input ends.

use std::fmt;
use std::sync::{Arc, Mutex};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::error::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use futures::StreamExt;
use tokio::sync::{Notify, mpsc};

use crate::connectors::{SourceFactory, SourceSplit, SplitPoll};
use crate::error::{ConnectorError, Result};

/// How far the splits of a batch plan's scans are (each split's
/// [`SourceSplit::progress`] after its last poll), for the progress of the
/// run: the plan's result is the job's source, and its first split
/// reports this as its own.
#[derive(Debug, Default)]
pub struct ScanProgress {
    splits: Mutex<Vec<Option<(u64, u64)>>>,
}

impl ScanProgress {
    fn register(&self, now: Option<(u64, u64)>) -> usize {
        match self.splits.lock() {
            Ok(mut s) => {
                s.push(now);
                s.len() - 1
            }
            Err(_) => 0,
        }
    }

    fn set(&self, i: usize, now: Option<(u64, u64)>) {
        if let Ok(mut s) = self.splits.lock()
            && let Some(slot) = s.get_mut(i)
        {
            *slot = now;
        }
    }

    /// (done, total) over every split, when each knows its end.
    pub fn sum(&self) -> Option<(u64, u64)> {
        let s = self.splits.lock().ok()?;
        let mut sum = (0u64, 0u64);
        for p in s.iter() {
            let (done, total) = (*p)?;
            sum = (sum.0.saturating_add(done.min(total)), sum.1.saturating_add(total));
        }
        (!s.is_empty()).then_some(sum)
    }
}

/// One split of a table's source, read as a DataFusion partition. Each
/// execution opens the split afresh (a restarted job runs its plan
/// again).
pub struct SplitStream {
    table: String,
    /// The table's columns as the scan reads them (computed ones too).
    schema: SchemaRef,
    /// The table's computed columns over the split's physical rows, or
    /// `None` when it has none.
    computed: Option<Vec<Arc<dyn PhysicalExpr>>>,
    factory: Arc<dyn SourceFactory>,
    /// The splits `factory` makes (`create_splits(count)`), and which of
    /// them this is.
    count: usize,
    index: usize,
    progress: Arc<ScanProgress>,
    /// This split's place in `progress`.
    slot: usize,
}

impl fmt::Debug for SplitStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SplitStream").field("table", &self.table).finish()
    }
}

impl SplitStream {
    /// A partition per split of `factory`'s source (`count` of them where
    /// the connector chooses: generators).
    pub fn all(
        table: &str,
        factory: Arc<dyn SourceFactory>,
        count: usize,
        schema: SchemaRef,
        computed: Option<Vec<Arc<dyn PhysicalExpr>>>,
        progress: &Arc<ScanProgress>,
    ) -> Result<Vec<Arc<dyn PartitionStream>>> {
        let splits = factory.create_splits(count)?;
        Ok(splits
            .iter()
            .enumerate()
            .map(|(index, split)| {
                Arc::new(SplitStream {
                    table: table.to_string(),
                    schema: schema.clone(),
                    computed: computed.clone(),
                    factory: factory.clone(),
                    count,
                    index,
                    slot: progress.register(split.progress()),
                    progress: progress.clone(),
                }) as Arc<dyn PartitionStream>
            })
            .collect())
    }

    /// A fresh split, as the plan's first execution had it.
    fn open(&self) -> std::result::Result<Box<dyn SourceSplit>, DataFusionError> {
        let mut splits = self
            .factory
            .create_splits(self.count)
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        if self.index >= splits.len() {
            return Err(DataFusionError::Execution(format!(
                "'{}' has {} splits now, {} when the batch plan was made",
                self.table,
                splits.len(),
                self.index + 1
            )));
        }
        Ok(splits.swap_remove(self.index))
    }
}

impl PartitionStream for SplitStream {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let split = self.open();
        let table = self.table.clone();
        let schema = self.schema.clone();
        let computed = self.computed.clone();
        let waker = Arc::new(Notify::new());
        let (progress, slot) = (self.progress.clone(), self.slot);
        let state = Some(split.map(|mut s| {
            s.set_waker(waker.clone());
            s
        }));
        let rows = futures::stream::unfold(state, move |split| {
            let (table, schema, computed, waker) = (table.clone(), schema.clone(), computed.clone(), waker.clone());
            let progress = progress.clone();
            async move {
                let mut split = match split? {
                    Ok(s) => s,
                    Err(e) => return Some((Err(e), None)),
                };
                loop {
                    let polled = match split.poll_batch() {
                        Ok(p) => p,
                        Err(e) => return Some((Err(DataFusionError::External(Box::new(e))), None)),
                    };
                    progress.set(
                        slot,
                        match &polled {
                            SplitPoll::Finished => split.progress().map(|(_, total)| (total, total)),
                            _ => split.progress(),
                        },
                    );
                    let rows = match polled {
                        SplitPoll::Batch(b) => b,
                        SplitPoll::Changes(c) => match c.into_inserts(&format!("batch read of '{table}'")) {
                            Ok(rows) => rows,
                            Err(e) => return Some((Err(DataFusionError::External(Box::new(e))), None)),
                        },
                        SplitPoll::Wait(until) => {
                            tokio::select! {
                                _ = tokio::time::sleep_until(until) => {}
                                _ = waker.notified() => {}
                            }
                            continue;
                        }
                        SplitPoll::Finished => return None,
                    };
                    if !split.take_dead_letters().is_empty() {
                        // Planning refuses dead-letter sources in batch
                        // mode; a split that sets records aside anyway must
                        // not lose them.
                        return Some((
                            Err(DataFusionError::Execution(format!(
                                "'{table}' set bad records aside, which batch mode cannot keep"
                            ))),
                            None,
                        ));
                    }
                    let rows = match &computed {
                        Some(exprs) => match crate::operators::calc::project(&rows, exprs, &schema) {
                            Ok(r) => r,
                            Err(e) => return Some((Err(DataFusionError::External(Box::new(e))), None)),
                        },
                        None => rows,
                    };
                    return Some((Ok(rows), Some(Ok(split))));
                }
            }
        });
        Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), rows))
    }
}

/// A batch plan's output, read as a source: one split per output
/// partition of the plan.
pub struct PlanSource {
    plan: Arc<dyn ExecutionPlan>,
    ctx: Arc<TaskContext>,
    progress: Arc<ScanProgress>,
}

impl fmt::Debug for PlanSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlanSource").finish_non_exhaustive()
    }
}

impl PlanSource {
    pub fn new(plan: Arc<dyn ExecutionPlan>, ctx: Arc<TaskContext>, progress: Arc<ScanProgress>) -> Self {
        Self { plan, ctx, progress }
    }

    /// How many splits the source has: the plan's output partitions.
    pub fn partitions(&self) -> usize {
        use datafusion::physical_plan::ExecutionPlanProperties;
        self.plan.output_partitioning().partition_count()
    }

    pub fn schema(&self) -> SchemaRef {
        self.plan.schema()
    }
}

impl SourceFactory for PlanSource {
    fn name(&self) -> &str {
        "batch plan"
    }

    fn is_bounded(&self) -> bool {
        true
    }

    fn checkpointed(&self) -> bool {
        false
    }

    fn explain(&self) -> Option<String> {
        let plan = datafusion::physical_plan::displayable(self.plan.as_ref()).indent(false);
        Some(format!(
            "batch mode: no watermarks, final rows once; DataFusion's plan:\n{plan}"
        ))
    }

    /// Every attempt of the job runs the plan afresh (its operators'
    /// state reset, its scans' splits opened again).
    fn create_splits(&self, _count: usize) -> Result<Vec<Box<dyn SourceSplit>>> {
        let plan = datafusion::physical_plan::execution_plan::reset_plan_states(self.plan.clone())?;
        Ok((0..self.partitions())
            .map(|partition| {
                Box::new(PlanPartition {
                    plan: plan.clone(),
                    ctx: self.ctx.clone(),
                    partition,
                    progress: self.progress.clone(),
                    rows: 0,
                    ended: false,
                    running: None,
                    waker: None,
                }) as Box<dyn SourceSplit>
            })
            .collect())
    }
}

/// A partition's batches, then `None` once it ended (a sender dropped
/// without it: the task died, a panic).
type Batches = mpsc::Receiver<std::result::Result<Option<RecordBatch>, DataFusionError>>;

/// One output partition of a batch plan. Its first poll starts the
/// partition on the runtime; the rows come back through a channel of two
/// batches (the plan waits while the job is slower), and the reader's
/// waker says when one arrived.
struct PlanPartition {
    plan: Arc<dyn ExecutionPlan>,
    ctx: Arc<TaskContext>,
    partition: usize,
    progress: Arc<ScanProgress>,
    rows: u64,
    /// The partition's end came (its `None`).
    ended: bool,
    running: Option<(Batches, tokio::task::JoinHandle<()>)>,
    waker: Option<Arc<Notify>>,
}

impl Drop for PlanPartition {
    fn drop(&mut self) {
        // A cancelled job stops its plan.
        if let Some((_, task)) = &self.running {
            task.abort();
        }
    }
}

impl SourceSplit for PlanPartition {
    fn id(&self) -> String {
        format!("batch-plan-{}", self.partition)
    }

    fn poll_batch(&mut self) -> Result<SplitPoll> {
        if self.running.is_none() {
            let (tx, rx) = mpsc::channel(2);
            let waker = self.waker.clone();
            let stream = self.plan.execute(self.partition, self.ctx.clone());
            let task = tokio::spawn(async move {
                let mut stream = match stream {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        if let Some(w) = &waker {
                            w.notify_one();
                        }
                        return;
                    }
                };
                let mut failed = false;
                while let Some(b) = stream.next().await {
                    failed = b.is_err();
                    if tx.send(b.map(Some)).await.is_err() || failed {
                        break;
                    }
                    if let Some(w) = &waker {
                        w.notify_one();
                    }
                }
                if !failed {
                    let _ = tx.send(Ok(None)).await;
                }
                drop(tx);
                // The end is news too.
                if let Some(w) = &waker {
                    w.notify_one();
                }
            });
            self.running = Some((rx, task));
        }
        let Some((rx, _)) = self.running.as_mut() else {
            return Ok(SplitPoll::Finished);
        };
        match rx.try_recv() {
            Ok(Ok(Some(b))) => {
                self.rows += b.num_rows() as u64;
                Ok(SplitPoll::Batch(b))
            }
            Ok(Ok(None)) => {
                self.ended = true;
                Ok(SplitPoll::Finished)
            }
            Ok(Err(e)) => Err(batch_error(e)),
            Err(mpsc::error::TryRecvError::Disconnected) if self.ended => Ok(SplitPoll::Finished),
            // Gone without its end: the task panicked (a wrong result
            // if taken for the end of the rows).
            Err(mpsc::error::TryRecvError::Disconnected) => Err(crate::error::ExecError::internal(format!(
                "partition {} of the batch plan stopped before its end",
                self.partition
            ))),
            // The waker says when the next batch is there; without one,
            // look again soon.
            Err(mpsc::error::TryRecvError::Empty) => Ok(SplitPoll::Wait(
                tokio::time::Instant::now()
                    + match self.waker {
                        Some(_) => std::time::Duration::from_secs(3600),
                        None => std::time::Duration::from_millis(5),
                    },
            )),
        }
    }

    fn offset(&self) -> u64 {
        self.rows
    }

    /// The scans' progress, told by the first partition only (the job sums
    /// its splits').
    fn progress(&self) -> Option<(u64, u64)> {
        if self.partition == 0 {
            self.progress.sum()
        } else {
            Some((0, 0))
        }
    }

    fn seek(&mut self, position: u64) -> Result<()> {
        if position == 0 {
            return Ok(());
        }
        Err(ConnectorError::Config {
            connector: "batch".into(),
            message: "a batch job takes no checkpoints and cannot resume from one: it runs again from the start".into(),
        }
        .into())
    }

    fn supports_pause(&self) -> bool {
        false
    }

    fn set_waker(&mut self, waker: Arc<Notify>) {
        self.waker = Some(waker);
    }
}

/// A batch plan's failure in the user's words: running out of memory names
/// the options that change it.
fn batch_error(e: DataFusionError) -> crate::error::ExecError {
    use crate::config::{BATCH_MEMORY_LIMIT, BATCH_SPILL};
    // A connector's own error, as a streaming job would give it (its kind
    // kept: the restart strategy reads it).
    let e = match own_error(e) {
        Ok(own) => return own,
        Err(e) => e,
    };
    match e.find_root() {
        DataFusionError::ResourcesExhausted(m) => crate::error::ExecError::Config(format!(
            "batch job out of memory: {m} (raise '{BATCH_MEMORY_LIMIT}', or set '{BATCH_SPILL}' = 'true' so \
             operators spill to disk)"
        )),
        _ => e.into(),
    }
}

/// The Weir error a DataFusion error carries, if it carries one.
fn own_error(e: DataFusionError) -> std::result::Result<crate::error::ExecError, DataFusionError> {
    match e {
        DataFusionError::External(inner) => match inner.downcast::<crate::error::ExecError>() {
            Ok(own) => Ok(*own),
            Err(inner) => Err(DataFusionError::External(inner)),
        },
        DataFusionError::Context(what, inner) => {
            own_error(*inner).map_err(|e| DataFusionError::Context(what, Box::new(e)))
        }
        other => Err(other),
    }
}
