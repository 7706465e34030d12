//! Turning a plan into running subtasks.
//!
//! Nodes joined by chainable forward edges form one chain; each chain runs
//! as `parallelism` subtasks. Between chains, every upstream subtask has a
//! bounded channel to every downstream subtask it can send to, so a slow
//! consumer back-pressures its producers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::datatypes::DataType;
use arrow::record_batch::RecordBatch;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::config::JobConfig;
use crate::error::{ExecError, Result};
use crate::keygroup::KeyEncoder;
use crate::message::StreamMessage;
use crate::operators::Operator;
use crate::operators::calc::CalcOperator;
use crate::operators::limit::LimitOperator;
use crate::operators::window::aggregate::{STATE_NAMES, WindowAggregateOperator};
use crate::plan::{Exchange, NodeId, NodeKind, StreamGraph};
use crate::runtime::alignment::AlignmentCoordinator;
use crate::runtime::chain::Chain;
use crate::runtime::gate::InputGate;
use crate::runtime::metrics::{JobMetrics, NodeMetrics, SourceStatus};
use crate::runtime::output::{Output, Partitioner};
use crate::runtime::source_task::{EmitStrategy, ReaderAlignment, SourceTask};
use crate::runtime::task::OperatorTask;
use crate::state::open_backend;

/// Messages buffered per channel before the sender waits.
const CHANNEL_CAPACITY: usize = 8;

#[derive(Debug)]
pub struct JobOutcome {
    pub elapsed: std::time::Duration,
    pub metrics: Arc<JobMetrics>,
}

/// A running job. Dropping it does not stop the job; call `stop` or
/// `cancel`.
pub struct JobHandle {
    pub name: String,
    pub metrics: Arc<JobMetrics>,
    stop: Arc<watch::Sender<bool>>,
    done: tokio::task::JoinHandle<Result<JobOutcome>>,
}

/// Asks a job to stop; can be kept while the handle is awaited.
#[derive(Clone)]
pub struct JobStopper(Arc<watch::Sender<bool>>);

impl JobStopper {
    pub fn stop(&self) {
        let _ = self.0.send(true);
    }
}

impl JobHandle {
    /// Asks sources to stop reading; the job then drains and ends without
    /// firing windows on partial input.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    pub fn stopper(&self) -> JobStopper {
        JobStopper(self.stop.clone())
    }

    pub async fn wait(self) -> Result<JobOutcome> {
        match self.done.await {
            Ok(r) => r,
            Err(e) if e.is_cancelled() => Err(ExecError::Cancelled),
            Err(e) => Err(ExecError::internal(format!("job task panicked: {e}"))),
        }
    }
}

/// Builds the chains: for each chain head, the node ids in chain order.
fn chains(graph: &StreamGraph) -> Vec<Vec<NodeId>> {
    let mut out = vec![];
    for node in &graph.nodes {
        let chained_in = graph.inputs(node.id).any(|e| graph.is_chained(e));
        if chained_in {
            continue;
        }
        let mut chain = vec![node.id];
        let mut cur = node.id;
        while let Some(e) = graph.outputs(cur).find(|e| graph.is_chained(e)) {
            chain.push(e.to);
            cur = e.to;
        }
        out.push(chain);
    }
    out
}

/// Starts every subtask of `graph`. `results` receives the rows of a bare
/// `SELECT` (a graph whose last node has no sink).
pub fn deploy(graph: StreamGraph, config: &JobConfig, results: Option<mpsc::Sender<RecordBatch>>) -> Result<JobHandle> {
    let mut sources = vec![];
    let mut coordinators: HashMap<String, Arc<AlignmentCoordinator>> = HashMap::new();
    for n in &graph.nodes {
        if let NodeKind::Source(src) = &n.kind {
            let group = src.watermark.as_ref().and_then(|w| w.alignment.clone());
            if let Some(g) = &group {
                let c = coordinators.entry(g.group.clone()).or_insert_with(|| {
                    AlignmentCoordinator::new(g.group.clone(), Duration::from_millis(g.update_interval_ms as u64))
                });
                // The group announces at the fastest interval any member asked for.
                if Duration::from_millis(g.update_interval_ms as u64) < c.update_interval {
                    let drift = c.max_drift_ms.load(std::sync::atomic::Ordering::Relaxed);
                    *c = AlignmentCoordinator::new(g.group.clone(), Duration::from_millis(g.update_interval_ms as u64));
                    c.max_drift_ms.store(drift, std::sync::atomic::Ordering::Relaxed);
                }
                c.max_drift_ms
                    .fetch_max(g.max_drift_ms, std::sync::atomic::Ordering::Relaxed);
                c.spread_alert_ms
                    .store(config.alignment_spread_alert_ms, std::sync::atomic::Ordering::Relaxed);
            }
            for subtask in 0..n.parallelism {
                sources.push(Arc::new(SourceStatus::new(
                    src.table.name.clone(),
                    subtask,
                    group.as_ref().map(|g| g.group.clone()),
                )));
            }
        }
    }
    let metrics = Arc::new(JobMetrics {
        nodes: graph
            .nodes
            .iter()
            .map(|n| Arc::new(NodeMetrics::new(format!("[{}] {}", n.id, n.describe()))))
            .collect(),
        sources,
        groups: coordinators.values().cloned().collect(),
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let chains = chains(&graph);
    let chain_of = |node: NodeId| chains.iter().position(|c| c.contains(&node));

    // Channels: for every non-chained edge, senders[from subtask][to subtask].
    let mut inputs: Vec<Vec<Vec<mpsc::Receiver<StreamMessage>>>> = chains
        .iter()
        .map(|c| (0..graph.node(c[0]).parallelism).map(|_| vec![]).collect())
        .collect();
    let mut outputs: Vec<Vec<Option<Output>>> = chains
        .iter()
        .map(|c| (0..graph.node(c[0]).parallelism).map(|_| None).collect())
        .collect();
    for edge in graph.edges.iter().filter(|e| !graph.is_chained(e)) {
        let (Some(from_chain), Some(to_chain)) = (chain_of(edge.from), chain_of(edge.to)) else {
            return Err(ExecError::internal("edge between unknown nodes"));
        };
        let p_from = graph.node(edge.from).parallelism;
        let p_to = graph.node(edge.to).parallelism;
        // `i` is the upstream subtask: it picks targets and the slot in `outputs`.
        #[allow(clippy::needless_range_loop)]
        for i in 0..p_from {
            let targets: Vec<usize> = match edge.exchange {
                Exchange::Forward if p_from == p_to => vec![i],
                Exchange::Global => vec![0],
                _ => (0..p_to).collect(),
            };
            let mut senders = vec![];
            for t in targets {
                let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
                senders.push(tx);
                inputs[to_chain][t].push(rx);
            }
            let partitioner = match &edge.exchange {
                Exchange::Hash(keys) => {
                    let input_schema = &graph.node(edge.from).schema;
                    let types = keys
                        .iter()
                        .map(|k| k.data_type(input_schema))
                        .collect::<Result<Vec<DataType>, _>>()?;
                    if types.is_empty() {
                        Partitioner::Forward
                    } else {
                        Partitioner::Hash {
                            keys: keys.clone(),
                            encoder: KeyEncoder::new(&types)?,
                            max_parallelism: config.max_parallelism,
                        }
                    }
                }
                _ if senders.len() == 1 => Partitioner::Forward,
                _ => Partitioner::Rebalance { next: i },
            };
            if outputs[from_chain][i].is_some() {
                return Err(ExecError::internal("a node with two outputs is not supported"));
            }
            outputs[from_chain][i] = Some(Output::channels(senders, partitioner));
        }
    }

    let mut tasks = JoinSet::new();
    for (ci, chain) in chains.iter().enumerate() {
        let head = graph.node(chain[0]);
        for subtask in 0..head.parallelism {
            let first_op = usize::from(matches!(head.kind, NodeKind::Source(_)));
            let mut ops: Vec<Box<dyn Operator>> = vec![];
            let mut op_metrics = vec![];
            for &id in &chain[first_op..] {
                ops.push(create_operator(&graph, id, subtask, config, &metrics)?);
                op_metrics.push(metrics.nodes[id].clone());
            }
            let tail = graph.node(*chain.last().unwrap_or(&chain[0]));
            let output = match outputs[ci][subtask].take() {
                Some(o) => o,
                None if matches!(tail.kind, NodeKind::Sink(_)) => Output::None,
                None => match &results {
                    Some(tx) => Output::Results(tx.clone()),
                    None => Output::None,
                },
            };
            let chain_ops = Chain::new(ops, op_metrics);
            match &head.kind {
                NodeKind::Source(src) => {
                    let splits = src.factory.create_splits(head.parallelism)?;
                    let mine = splits
                        .into_iter()
                        .enumerate()
                        .filter(|(i, _)| i % head.parallelism == subtask)
                        .map(|(_, s)| s)
                        .collect();
                    let emit = match src.table.options.get("scan.watermark.emit.strategy") {
                        Some(v) if v.eq_ignore_ascii_case("on-event") => EmitStrategy::OnEvent,
                        _ => EmitStrategy::OnPeriodic,
                    };
                    let rowtime_index = src
                        .watermark
                        .as_ref()
                        .and_then(|w| head.schema.index_of(&w.column).ok());
                    let alignment = match src.watermark.as_ref().and_then(|w| w.alignment.as_ref()) {
                        Some(g) => Some(ReaderAlignment {
                            coordinator: coordinators
                                .get(&g.group)
                                .cloned()
                                .ok_or_else(|| ExecError::internal("alignment group without coordinator"))?,
                            reader: (head.id, subtask),
                            max_drift_ms: g.max_drift_ms,
                            update_interval: Duration::from_millis(g.update_interval_ms as u64),
                            buffer_size: config.alignment_buffer_size,
                            allow_unaligned: config.allow_unaligned_source_splits,
                            connector: src.factory.name().to_string(),
                        }),
                        None => None,
                    };
                    let status = metrics
                        .sources
                        .iter()
                        .find(|s| s.table == src.table.name && s.subtask == subtask)
                        .cloned();
                    let task = SourceTask {
                        splits: mine,
                        bounded: src.factory.is_bounded(),
                        computed: src.computed.clone(),
                        schema: head.schema.clone(),
                        watermark: src.watermark.clone(),
                        rowtime_index,
                        emit,
                        interval: config.auto_watermark_interval,
                        chain: chain_ops,
                        output,
                        stop: stop_rx.clone(),
                        metrics: metrics.nodes[head.id].clone(),
                        alignment,
                        status,
                    };
                    tasks.spawn(task.run());
                }
                _ => {
                    let receivers = std::mem::take(&mut inputs[ci][subtask]);
                    let task = OperatorTask {
                        gate: InputGate::new(receivers),
                        chain: chain_ops,
                        output,
                    };
                    tasks.spawn(task.run());
                }
            }
        }
    }

    for c in coordinators.into_values() {
        // Ends by itself once every reader of the group is gone.
        tokio::spawn(c.run());
    }
    let job_metrics = metrics.clone();
    let started = Instant::now();
    let done = tokio::spawn(async move {
        let mut first_error = None;
        while let Some(res) = tasks.join_next().await {
            let err = match res {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e,
                Err(e) if e.is_cancelled() => continue,
                Err(e) => ExecError::internal(format!("subtask panicked: {e}")),
            };
            if first_error.is_none() {
                first_error = Some(err);
                // One failed subtask fails the job (no restart strategy yet).
                tasks.abort_all();
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(JobOutcome {
                elapsed: started.elapsed(),
                metrics: job_metrics,
            }),
        }
    });
    Ok(JobHandle {
        name: config.name.clone(),
        metrics,
        stop: Arc::new(stop_tx),
        done,
    })
}

fn create_operator(
    graph: &StreamGraph,
    id: NodeId,
    subtask: usize,
    config: &JobConfig,
    metrics: &Arc<JobMetrics>,
) -> Result<Box<dyn Operator>> {
    let node = graph.node(id);
    let input_schema = || {
        graph
            .inputs(id)
            .next()
            .map(|e| graph.node(e.from).schema.clone())
            .ok_or_else(|| ExecError::internal(format!("node {id} has no input")))
    };
    Ok(match &node.kind {
        NodeKind::Source(_) => return Err(ExecError::internal("a source is not an operator")),
        NodeKind::Calc(c) => Box::new(CalcOperator::new(c, node.schema.clone())),
        NodeKind::Limit(l) => Box::new(LimitOperator::new(l.skip, l.fetch)),
        NodeKind::Sink(s) => s.factory.create_writer(subtask, node.parallelism)?,
        NodeKind::WindowAggregate(w) => {
            let dir = config
                .job_dir
                .join("state")
                .join(format!("node-{id}-subtask-{subtask}"));
            let state = open_backend(config.state_backend, &dir, STATE_NAMES)?;
            Box::new(WindowAggregateOperator::new(
                w,
                &input_schema()?,
                node.schema.clone(),
                config.max_parallelism,
                state,
                metrics.nodes[id].clone(),
                node.parallelism,
            )?)
        }
    })
}
