//! The Kafka sink: one producer per sink subtask (exactly-once: one
//! transactional producer per checkpoint, from a pool of ids).
//!
//! `sink.delivery-guarantee`:
//! - `none`: records are handed to the producer and not waited for;
//! - `at-least-once` (the default): the producer is idempotent, and at
//!   every checkpoint barrier (and at the end of input) it is flushed and
//!   every delivery checked: a record the cluster did not take fails the
//!   checkpoint, so the job restarts from the previous one and writes it
//!   again. Records may then be written twice, never lost.
//! - `exactly-once`: each checkpoint's records are one Kafka transaction,
//!   pre-committed (flushed) at the barrier and committed when the
//!   checkpoint completes (see [`Transactions`]).
//!
//! Keys are placed by `sink.partitioner`: `default` is Kafka's Java
//! client's (murmur2 of the key, so other Kafka clients put the same key in
//! the same partition; librdkafka's own default is CRC32), `fixed` writes
//! subtask i's records to partition i % partitions, `round-robin` spreads
//! them in turn.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use arrow::datatypes::SchemaRef;
use rdkafka::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::statistics::Statistics;
use weir_catalog::Options;

use super::codec::{Codec, Encoded, Headers};
use super::protocol;
use super::{NAME, REQUEST_TIMEOUT, Topics, client_config, client_properties, external, invalid};
use crate::change::ChangeBatch;
use crate::checkpoint::OperatorSnapshot;
use crate::connectors::{Committer, CommittingWriter, SinkContext, SinkFactory, SinkWriter};
use crate::error::{ConnectorError, ExecError, Result};
use crate::failpoint::failpoint;
use crate::operators::{Collector, Operator};

/// Longest a flush may wait for the cluster to acknowledge every record.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(120);

/// Transactional ids per sink subtask: one being written, the others
/// pre-committed and waiting for their checkpoint to complete (more than
/// one when checkpoints failed in between: a later one commits them).
const SLOTS: usize = 8;

/// How long a writer waits at a barrier for an id whose commit is under
/// way before it fails (every id waiting means checkpoints keep failing).
const FREE_ID_WAIT: Duration = Duration::from_secs(10);

/// Weir's default `transaction.timeout.ms`: the broker's default maximum
/// (`transaction.max.timeout.ms`, 15 min); Flink's 1 h is refused by
/// brokers left at their defaults.
const DEFAULT_TRANSACTION_TIMEOUT_MS: u64 = 900_000;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Guarantee {
    None,
    AtLeastOnce,
    ExactlyOnce { prefix: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Partitioner {
    Default,
    Fixed,
    RoundRobin,
}

/// Where a sink's records go.
#[derive(Debug, Clone)]
enum SinkTopics {
    /// Every record, whatever a `topic` column says.
    One(String),
    /// The topic a `topic` column names, one of these.
    List(Vec<String>),
    /// The topic a `topic` column names, matching this.
    Pattern(regex::Regex),
    /// The topic a `topic` column names.
    Any,
}

impl SinkTopics {
    /// The topics as messages name them.
    fn text(&self) -> String {
        match self {
            SinkTopics::One(t) => format!("topic '{t}'"),
            SinkTopics::List(l) => format!("topics '{}'", l.join(";")),
            SinkTopics::Pattern(p) => format!("topics matching '{}'", p.as_str()),
            SinkTopics::Any => "the topics of the 'topic' column".to_string(),
        }
    }

    /// Record `i`'s topic (`column`: the `topic` column's values), as
    /// Flink's `DynamicKafkaRecordSerializationSchema.getTargetTopic`.
    fn of<'a>(&'a self, column: Option<&'a [Option<String>]>, i: usize) -> Result<&'a str> {
        if let SinkTopics::One(t) = self {
            return Ok(t);
        }
        let named = column.and_then(|c| c.get(i)).and_then(|t| t.as_deref());
        let Some(topic) = named else {
            return Err(ConnectorError::Data {
                location: "kafka sink".into(),
                message: format!(
                    "a record's 'topic' metadata column is NULL: it must name one of {}",
                    self.text()
                ),
            }
            .into());
        };
        let allowed = match self {
            SinkTopics::List(l) => l.iter().any(|t| t == topic),
            SinkTopics::Pattern(p) => p.is_match(topic),
            _ => true,
        };
        if !allowed {
            return Err(ConnectorError::Data {
                location: "kafka sink".into(),
                message: format!("a record's topic '{topic}' is not one of {}", self.text()),
            }
            .into());
        }
        Ok(topic)
    }
}

#[derive(Debug, Clone)]
pub(super) struct Settings {
    guarantee: Guarantee,
    partitioner: Partitioner,
    topics: SinkTopics,
    /// `upsert-kafka`'s `sink.buffer-flush.*`: (max rows, interval).
    buffer: Option<(usize, Duration)>,
}

/// `upsert-kafka`'s reduce buffer (`sink.buffer-flush.*`): (max rows,
/// interval), both set or neither (checked at CREATE TABLE).
pub(super) fn buffer(options: &Options) -> Result<Option<(usize, Duration)>> {
    let rows = options.i64("sink.buffer-flush.max-rows")?.unwrap_or(0);
    let interval = options.duration("sink.buffer-flush.interval")?.unwrap_or_default();
    match (rows > 0, !interval.is_zero()) {
        (true, true) => Ok(Some((rows as usize, interval))),
        (false, false) => Ok(None),
        _ => Err(invalid(
            "sink.buffer-flush.max-rows",
            "'sink.buffer-flush.max-rows' and 'sink.buffer-flush.interval' must be set to be greater than zero \
             together to enable sink buffer flushing",
        )),
    }
}

/// The delivery guarantee and what it needs (checked at CREATE TABLE).
pub(super) fn check_guarantee(options: &Options) -> Result<()> {
    Settings::guarantee(options).map(|_| ())
}

impl Settings {
    fn guarantee(options: &Options) -> Result<Guarantee> {
        Ok(match options.enum_value("sink.delivery-guarantee").as_deref() {
            Some("none") => Guarantee::None,
            Some("exactly-once") => {
                let prefix = options.get("sink.transactional-id-prefix").ok_or_else(|| {
                    invalid(
                        "sink.delivery-guarantee",
                        "'exactly-once' needs 'sink.transactional-id-prefix' (unique per job writing the cluster)",
                    )
                })?;
                if prefix.trim().is_empty() {
                    return Err(invalid("sink.transactional-id-prefix", "must not be empty"));
                }
                Guarantee::ExactlyOnce {
                    prefix: prefix.to_string(),
                }
            }
            _ => Guarantee::AtLeastOnce,
        })
    }

    pub fn from_options(options: &Options) -> Result<Self> {
        let guarantee = Self::guarantee(options)?;
        let partitioner = match options.get("sink.partitioner").unwrap_or("default") {
            p if p.eq_ignore_ascii_case("default") => Partitioner::Default,
            p if p.eq_ignore_ascii_case("fixed") => Partitioner::Fixed,
            p if p.eq_ignore_ascii_case("round-robin") => Partitioner::RoundRobin,
            other => {
                return Err(invalid(
                    "sink.partitioner",
                    format!(
                        "invalid value '{other}', expected default, fixed or round-robin (Java partitioner classes cannot run in Weir)"
                    ),
                ));
            }
        };
        // As Flink's sink: one topic is where every record goes (a `topic`
        // column is then ignored); a list or a pattern is what a `topic`
        // column may name; neither lets the column name any topic.
        let topics = match (options.get("topic"), options.get("topic-pattern")) {
            (None, None) => SinkTopics::Any,
            _ => match Topics::from_options(options)? {
                Topics::List(list) if list.len() == 1 => SinkTopics::One(list[0].clone()),
                Topics::List(list) => SinkTopics::List(list),
                Topics::Pattern(p) => SinkTopics::Pattern(p),
            },
        };
        Ok(Self {
            guarantee,
            partitioner,
            topics,
            buffer: buffer(options)?,
        })
    }
}

#[derive(Debug)]
pub struct KafkaSink {
    table: String,
    properties: BTreeMap<String, String>,
    settings: Settings,
    codec: Codec,
    transactions: Arc<Transactions>,
}

impl KafkaSink {
    /// `upsert`: an `upsert-kafka` table (its options as [`super::upsert_as_kafka`] gives them).
    /// `metadata`: its written metadata columns, `(index in schema, key)`.
    pub fn new(
        options: &Options,
        schema: SchemaRef,
        table: &str,
        upsert: bool,
        metadata: &[(usize, String)],
    ) -> Result<Self> {
        let settings = Settings::from_options(options)?;
        let codec = Codec::new(
            options,
            &schema,
            upsert,
            super::metadata_columns(&schema, metadata, table, true)?,
        )?;
        if !codec.writes_topic() && !matches!(settings.topics, SinkTopics::One(_)) {
            let key = if options.get("topic-pattern").is_some() {
                "topic-pattern"
            } else {
                "topic"
            };
            return Err(invalid(
                key,
                format!(
                    "table '{table}' writes {}: each record's topic must come from a `topic` metadata column \
                     (`t STRING METADATA FROM 'topic'`), or 'topic' must name one topic",
                    settings.topics.text()
                ),
            ));
        }
        let mut properties = client_properties(options);
        // Kafka's Java client places keys by murmur2; librdkafka's default
        // (CRC32) would put them elsewhere.
        properties
            .entry("partitioner".into())
            .or_insert_with(|| "murmur2_random".into());
        match &settings.guarantee {
            Guarantee::AtLeastOnce => {
                properties
                    .entry("enable.idempotence".into())
                    .or_insert_with(|| "true".into());
            }
            Guarantee::ExactlyOnce { .. } => {
                properties
                    .entry("transaction.timeout.ms".into())
                    .or_insert_with(|| DEFAULT_TRANSACTION_TIMEOUT_MS.to_string());
                properties
                    .entry("statistics.interval.ms".into())
                    .or_insert_with(|| "100".into());
                if let Some(v) = properties.get("transactional.id") {
                    return Err(invalid(
                        "properties.transactional.id",
                        format!("'{v}': Weir names its transactions from 'sink.transactional-id-prefix'"),
                    ));
                }
            }
            Guarantee::None => {}
        }
        let bootstrap = properties.get("bootstrap.servers").cloned().unwrap_or_default();
        Ok(Self {
            table: table.to_string(),
            transactions: Arc::new(Transactions {
                prefix: match &settings.guarantee {
                    Guarantee::ExactlyOnce { prefix } => prefix.clone(),
                    _ => String::new(),
                },
                bootstrap,
                properties: properties.clone(),
                live: Mutex::new(HashMap::new()),
                committed: Condvar::new(),
                old_parallelism: Mutex::new(0),
                orphans: Mutex::new(vec![]),
            }),
            properties,
            settings,
            codec,
        })
    }

    /// The transaction timeout, checked against the checkpoints it must
    /// outlive.
    fn check_timeout(&self, ctx: &SinkContext) -> Result<()> {
        if !ctx.exactly_once {
            return Err(invalid(
                "sink.delivery-guarantee",
                "'exactly-once' commits a transaction per checkpoint: turn checkpointing on \
                 (SET 'execution.checkpointing.interval' = '10 s') or use 'at-least-once'",
            ));
        }
        let timeout = self
            .properties
            .get("transaction.timeout.ms")
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_millis)
            .ok_or_else(|| invalid("properties.transaction.timeout.ms", "expected milliseconds"))?;
        let needed = ctx.checkpoint_interval.unwrap_or_default() + ctx.checkpoint_timeout.unwrap_or_default();
        if timeout <= needed {
            return Err(invalid(
                "properties.transaction.timeout.ms",
                format!(
                    "{} ms is not longer than a checkpoint interval plus its timeout ({} ms): the broker would abort \
                     transactions before their checkpoint completes, losing their records",
                    timeout.as_millis(),
                    needed.as_millis()
                ),
            ));
        }
        Ok(())
    }
}

impl SinkFactory for KafkaSink {
    fn name(&self) -> &str {
        if self.codec.is_upsert() {
            super::UPSERT_NAME
        } else {
            NAME
        }
    }

    /// `upsert-kafka`: `+I`/`+U` as records, `-D` as tombstones, `-U` as
    /// tombstones unless superseded in its batch; a changelog value
    /// format: every change as a record.
    fn accepts_changes(&self) -> bool {
        self.codec.is_upsert() || self.codec.writes_changes()
    }

    fn requires_update_before(&self) -> bool {
        self.codec.writes_changes()
    }

    fn writes_upserts(&self) -> bool {
        self.codec.is_upsert()
    }

    fn changes_hint(&self) -> String {
        " ('kafka' writes changes with a changelog value format such as 'debezium-json'; 'upsert-kafka' writes a \
         changelog by the table's PRIMARY KEY)"
            .into()
    }

    fn create_writer(&self, subtask: usize, parallelism: usize, ctx: &SinkContext) -> Result<SinkWriter> {
        // `fixed` and `round-robin` need each topic's partition count: the
        // one topic's is read here, the others' when first written.
        let mut partitions = HashMap::new();
        if let (Partitioner::Fixed | Partitioner::RoundRobin, SinkTopics::One(t)) =
            (self.settings.partitioner, &self.settings.topics)
        {
            partitions.insert(t.clone(), self.partitions(t)?);
        }
        let delivery = match &self.settings.guarantee {
            Guarantee::ExactlyOnce { prefix } => {
                self.check_timeout(ctx)?;
                // A broker without EndTxn would take the records and never
                // let a transaction commit: refused before anything is written.
                if protocol::supports(&self.transactions.bootstrap, 26, REQUEST_TIMEOUT) == Ok(false) {
                    return Err(invalid(
                        "sink.delivery-guarantee",
                        format!(
                            "'exactly-once' needs Kafka transactions, and the cluster at '{}' does not serve EndTxn; \
                             use 'at-least-once'",
                            self.transactions.bootstrap
                        ),
                    ));
                }
                let ids: Vec<String> = (0..SLOTS).map(|s| format!("{prefix}-{subtask}-{s}")).collect();
                // Whatever an earlier run left open under these ids is
                // aborted, and its producers fenced, before writing.
                self.transactions.abort_all(&ids)?;
                let mut w = TxnWriter {
                    transactions: self.transactions.clone(),
                    ids,
                    subtask,
                    parallelism,
                    current: None,
                    next_slot: 0,
                    pending: vec![],
                    ahead: None,
                };
                w.begin()?;
                Delivery::Transactional(w)
            }
            _ => {
                let producer: BaseProducer<Deliveries> = client_config(&self.properties)
                    .create_with_context(Deliveries::default())
                    .map_err(|e| external(format!("cannot create a producer for table '{}': {e}", self.table)))?;
                Delivery::Plain(producer)
            }
        };
        let transactional = matches!(delivery, Delivery::Transactional(_));
        let writer = KafkaWriter {
            delivery,
            buffer: self.settings.buffer.map(|(max_rows, _)| ReduceBuffer {
                max_rows,
                records: HashMap::new(),
            }),
            settings: self.settings.clone(),
            codec: self.codec.clone(),
            placement: Placement {
                partitions,
                next: HashMap::new(),
            },
            subtask: subtask as i32,
        };
        Ok(if transactional {
            SinkWriter::Committing(Box::new(writer))
        } else {
            SinkWriter::Direct(Box::new(writer))
        })
    }

    fn committer(&self, _ctx: &SinkContext) -> Option<Arc<dyn Committer>> {
        matches!(self.settings.guarantee, Guarantee::ExactlyOnce { .. })
            .then(|| Arc::new(TxnCommitter(self.transactions.clone())) as Arc<dyn Committer>)
    }
}

impl KafkaSink {
    /// A topic's number of partitions (`fixed`, `round-robin`).
    fn partitions(&self, topic: &str) -> Result<i32> {
        let consumer: rdkafka::consumer::BaseConsumer = client_config(&self.properties)
            .create()
            .map_err(|e| external(format!("cannot create a client for table '{}': {e}", self.table)))?;
        use rdkafka::consumer::Consumer;
        partition_count(consumer.client(), topic, &format!(" (table '{}')", self.table))
    }
}

/// `topic`'s number of partitions, from the cluster's metadata (`about`:
/// said after an error).
fn partition_count<C: rdkafka::ClientContext>(
    client: &rdkafka::client::Client<C>,
    topic: &str,
    about: &str,
) -> Result<i32> {
    let metadata = client
        .fetch_metadata(Some(topic), REQUEST_TIMEOUT)
        .map_err(|e| external(format!("cannot read the metadata of topic '{topic}'{about}: {e}")))?;
    let n = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map_or(0, |t| t.partitions().len());
    if n == 0 {
        return Err(external(format!("topic '{topic}' does not exist{about}")));
    }
    Ok(n as i32)
}

/// A producer's delivery reports (the first failure, kept until checked)
/// and, for a transactional producer, its id and epoch from librdkafka's
/// statistics (`eos`): the only place librdkafka tells them.
#[derive(Default)]
struct Deliveries {
    failed: Mutex<Option<String>>,
    identity: Mutex<Option<(i64, i16)>>,
}

impl ClientContext for Deliveries {
    fn stats(&self, statistics: Statistics) {
        if let Some(eos) = statistics.eos
            && eos.producer_id >= 0
            && eos.producer_epoch >= 0
            && let Ok(mut id) = self.identity.lock()
        {
            *id = Some((eos.producer_id, eos.producer_epoch as i16));
        }
    }
}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, m)) = result
            && let Ok(mut failed) = self.failed.lock()
            && failed.is_none()
        {
            *failed = Some(format!(
                "a record to topic '{}' partition {} was not delivered: {e}",
                m.topic(),
                m.partition()
            ));
        }
    }
}

/// Fails if a delivery of `producer` failed since the last check.
fn check_deliveries(producer: &BaseProducer<Deliveries>) -> Result<()> {
    let failed = producer
        .context()
        .failed
        .lock()
        .map_err(|_| crate::error::ExecError::internal("delivery reports poisoned"))?
        .take();
    match failed {
        Some(message) => Err(external(message)),
        None => Ok(()),
    }
}

/// Waits until the cluster acknowledged every record sent, then checks
/// that each was taken.
fn flush(producer: &BaseProducer<Deliveries>, topic: &str) -> Result<()> {
    producer.flush(FLUSH_TIMEOUT).map_err(|e| {
        external(format!(
            "records to {topic} were not acknowledged within {} s: {e}",
            FLUSH_TIMEOUT.as_secs()
        ))
    })?;
    check_deliveries(producer)
}

/// A pre-committed transaction, as a checkpoint keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Committable {
    transactional_id: String,
    producer_id: i64,
    epoch: i16,
    subtask: usize,
    parallelism: usize,
}

/// The transactions of one sink, shared by its writers and its committer.
///
/// Transactional ids are `<prefix>-<subtask>-<slot>`, [`SLOTS`] per
/// subtask. A writer writes one transaction at a time; at the barrier it
/// flushes it (pre-commit), records `(id, producer id, epoch)` in the
/// checkpoint, hands the producer here (`live`) and begins the next
/// transaction under a free id with a new producer (librdkafka cannot
/// rename one; `init_transactions` on a new instance bumps the epoch and
/// fences the old one), opened ahead while the previous transaction was
/// written. An id is free once its transaction committed.
///
/// When the checkpoint completes, the committer commits the live producer's
/// transaction. After a restart there is no live producer: the checkpoint's
/// transactions are committed with a raw `EndTxn` carrying the stored id,
/// producer id and epoch ([`protocol::end_transaction`]; asking again for
/// one already committed answers NONE). An id is only reused (at a new
/// epoch) after its commit succeeded, so an `EndTxn` that is fenced means
/// the transaction was committed before, unless the broker aborted it on
/// its timeout, which is logged as possible loss. Then `recover` aborts
/// every other transaction the earlier run left open under the ids of its
/// subtasks, and the writers abort theirs when they start.
#[derive(Debug)]
struct Transactions {
    /// `sink.transactional-id-prefix`.
    prefix: String,
    bootstrap: String,
    properties: BTreeMap<String, String>,
    /// Pre-committed transactions by id: `Some(producer)` waiting for its
    /// checkpoint, `None` while being committed (the id is still busy).
    live: Mutex<HashMap<String, LiveTxn>>,
    committed: Condvar,
    /// The parallelism of the run a restore came from (from its committables).
    old_parallelism: Mutex<usize>,
    /// Producers still being opened ahead by writers that are gone (a
    /// failed attempt): `recover` waits for them before it aborts, so none
    /// can fence a producer the next attempt opens under the same id.
    orphans: Mutex<Vec<Opening>>,
}

/// A transactional producer being opened on a thread of its own.
type Opening = std::thread::JoinHandle<Result<BaseProducer<Deliveries>>>;

struct LiveTxn {
    producer: Option<BaseProducer<Deliveries>>,
    producer_id: i64,
    epoch: i16,
}

impl std::fmt::Debug for LiveTxn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LiveTxn({}, {})", self.producer_id, self.epoch)
    }
}

impl Transactions {
    /// A new transactional producer for `id`, its transactions initialised:
    /// whatever was open under `id` is aborted and older producers fenced.
    fn open(&self, id: &str) -> Result<BaseProducer<Deliveries>> {
        let mut config = client_config(&self.properties);
        config.set("transactional.id", id);
        let producer: BaseProducer<Deliveries> = config
            .create_with_context(Deliveries::default())
            .map_err(|e| external(format!("cannot create the transactional producer '{id}': {e}")))?;
        producer
            .init_transactions(REQUEST_TIMEOUT)
            .map_err(|e| external(format!("cannot initialise transactions of '{id}': {e}")))?;
        Ok(producer)
    }

    /// Aborts whatever is open under `ids` and fences its producers, the
    /// ids side by side (each is a round trip to the coordinator).
    fn abort_all(&self, ids: &[String]) -> Result<()> {
        std::thread::scope(|scope| {
            let opened: Vec<_> = ids.iter().map(|id| scope.spawn(|| self.open(id).map(drop))).collect();
            opened.into_iter().try_for_each(|h| {
                h.join()
                    .map_err(|_| crate::error::ExecError::internal("a Kafka transaction abort panicked"))?
            })
        })
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, HashMap<String, LiveTxn>>> {
        self.live
            .lock()
            .map_err(|_| crate::error::ExecError::internal("Kafka transactions poisoned"))
    }

    fn busy(&self, id: &str) -> Result<bool> {
        Ok(self.lock()?.contains_key(id))
    }

    /// Commits one pre-committed transaction.
    fn commit(&self, c: &Committable) -> Result<()> {
        let producer = {
            let mut live = self.lock()?;
            match live.get_mut(&c.transactional_id) {
                Some(t) if t.producer_id == c.producer_id && t.epoch == c.epoch => t.producer.take(),
                _ => None,
            }
        };
        let result = match &producer {
            Some(p) => p.commit_transaction(REQUEST_TIMEOUT).map_err(|e| {
                external(format!(
                    "transaction '{}' of a completed checkpoint could not be committed: {e}; its records are lost",
                    c.transactional_id
                ))
            }),
            None => self.commit_restored(c),
        };
        if producer.is_some() || result.is_ok() {
            let mut live = self.lock()?;
            if live
                .get(&c.transactional_id)
                .is_some_and(|t| t.producer_id == c.producer_id && t.epoch == c.epoch)
            {
                live.remove(&c.transactional_id);
            }
            self.committed.notify_all();
        }
        result
    }

    /// Commits a transaction a previous process pre-committed.
    fn commit_restored(&self, c: &Committable) -> Result<()> {
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        loop {
            match protocol::end_transaction(
                &self.bootstrap,
                &c.transactional_id,
                c.producer_id,
                c.epoch,
                true,
                REQUEST_TIMEOUT,
            ) {
                Ok(()) => {
                    // A crash while recovering: the next restore commits
                    // this transaction a second time (the broker answers
                    // that it already ended) and the others the first time.
                    failpoint("kafka_sink.restored_commit");
                    return Ok(());
                }
                Err(e) if e.is_retriable() && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(protocol::ProtocolError::Code(code @ (47 | 49 | 90))) => {
                    // The id went on to a later epoch: Weir only does that
                    // after a commit, so it was committed before the
                    // restart; the broker's timeout is the other cause.
                    tracing::warn!(
                        target: "weir::kafka",
                        "transaction '{}' (producer {} epoch {}) was ended before the restart ({}): committed by the \
                         run that pre-committed it, or aborted by the broker's transaction timeout",
                        c.transactional_id,
                        c.producer_id,
                        c.epoch,
                        protocol::error_name(code)
                    );
                    return Ok(());
                }
                Err(e) => {
                    return Err(external(format!(
                        "transaction '{}' of the restored checkpoint could not be committed: {e}",
                        c.transactional_id
                    )));
                }
            }
        }
    }
}

struct TxnCommitter(Arc<Transactions>);

impl Committer for TxnCommitter {
    fn commit(&self, _checkpoint_id: u64, committables: &[serde_json::Value]) -> Result<()> {
        for c in committables {
            let c: Committable = serde_json::from_value(c.clone()).map_err(|e| {
                crate::error::ExecError::internal(format!("a Kafka committable that does not read: {e}"))
            })?;
            if let Ok(mut p) = self.0.old_parallelism.lock() {
                *p = (*p).max(c.parallelism);
            }
            self.0.commit(&c)?;
            // One of a checkpoint's transactions committed, maybe not the
            // rest: the restored run commits those and not this one again.
            failpoint("kafka_sink.committed_one");
        }
        Ok(())
    }

    fn release(&self, committables: &[serde_json::Value]) -> Result<()> {
        for c in committables {
            let Ok(c) = serde_json::from_value::<Committable>(c.clone()) else {
                continue;
            };
            let producer = {
                let mut live = self.0.lock()?;
                match live.get(&c.transactional_id) {
                    Some(t) if t.producer_id == c.producer_id && t.epoch == c.epoch => {
                        live.remove(&c.transactional_id).and_then(|t| t.producer)
                    }
                    _ => None,
                }
            };
            self.0.committed.notify_all();
            if let Some(p) = producer {
                // Its transaction is committed (by worker 0, by producer
                // id and epoch); closing the producer may wait on the
                // broker, so not on the caller's thread.
                let _ = std::thread::Builder::new()
                    .name("weir-kafka-release".into())
                    .spawn(move || drop(p));
            }
        }
        Ok(())
    }

    fn recover(&self) -> Result<()> {
        // Producers of a failed attempt in this process hold transactions
        // no checkpoint has: dropped, and aborted below.
        self.0.lock()?.clear();
        let orphans = std::mem::take(
            &mut *self
                .0
                .orphans
                .lock()
                .map_err(|_| crate::error::ExecError::internal("Kafka transactions poisoned"))?,
        );
        for opening in orphans {
            let _ = opening.join();
        }
        let old = self.0.old_parallelism.lock().map(|p| *p).unwrap_or(0);
        let prefix = &self.0.prefix;
        // The ids of the restored run's subtasks: the writers of this run
        // abort their own when they start; these cover a run that had
        // more subtasks than this one.
        let ids: Vec<String> = (0..old)
            .flat_map(|subtask| (0..SLOTS).map(move |slot| format!("{prefix}-{subtask}-{slot}")))
            .collect();
        self.0.abort_all(&ids)
    }
}

/// The transactional writer of one subtask.
struct TxnWriter {
    transactions: Arc<Transactions>,
    ids: Vec<String>,
    subtask: usize,
    parallelism: usize,
    /// The transaction being written: its id and producer.
    current: Option<(String, BaseProducer<Deliveries>, bool)>,
    /// Where `begin` starts looking for a free id.
    next_slot: usize,
    /// Pre-committed, not known to be committed yet: kept in every
    /// checkpoint until then (a checkpoint that failed never commits them;
    /// the next completed one does).
    pending: Vec<Committable>,
    /// The next transaction's producer, opened ahead on a thread of its
    /// own: opening one (`init_transactions`) takes librdkafka about
    /// 600 ms (its coordinator lookup waits on a 500 ms timer), which the
    /// barrier waited for and stalled the sink (exactly-once wrote at half
    /// the at-least-once rate).
    ahead: Option<(usize, Opening)>,
}

impl TxnWriter {
    /// Begins a transaction under a free id with the producer opened
    /// ahead for it, and starts opening the next one.
    fn begin(&mut self) -> Result<()> {
        let opened = match self.ahead.take() {
            Some((slot, opening)) => match Self::opened(opening) {
                Ok(producer) => Some((slot, producer)),
                Err(e) => {
                    // The cluster was away when it was opened: again now.
                    tracing::warn!(target: "weir::kafka", "opening '{}' ahead failed ({e}); opening it now", self.ids[slot]);
                    None
                }
            },
            None => None,
        };
        let (slot, producer) = match opened {
            Some(opened) => opened,
            None => {
                let slot = self.free_slot()?;
                (slot, self.transactions.open(&self.ids[slot])?)
            }
        };
        let id = self.ids[slot].clone();
        self.next_slot = slot + 1;
        producer
            .begin_transaction()
            .map_err(|e| external(format!("cannot begin a transaction of '{id}': {e}")))?;
        self.current = Some((id, producer, false));
        self.open_ahead(slot)
    }

    fn opened(opening: Opening) -> Result<BaseProducer<Deliveries>> {
        opening
            .join()
            .map_err(|_| crate::error::ExecError::internal("opening a Kafka transactional producer panicked"))?
    }

    /// Starts opening the producer of the next free id after `current`'s
    /// (none free: `begin` waits for one then).
    fn open_ahead(&mut self, current: usize) -> Result<()> {
        let n = self.ids.len();
        for k in 0..n {
            let slot = (self.next_slot + k) % n;
            if slot != current && !self.transactions.busy(&self.ids[slot])? {
                let (transactions, id) = (self.transactions.clone(), self.ids[slot].clone());
                let opening = std::thread::Builder::new()
                    .name("weir-kafka-txn-open".into())
                    .spawn(move || transactions.open(&id))
                    .map_err(|e| external(format!("cannot start opening a transactional producer: {e}")))?;
                self.ahead = Some((slot, opening));
                break;
            }
        }
        Ok(())
    }

    /// The next id no pre-committed transaction holds, waiting for one if
    /// every id waits for its checkpoint.
    fn free_slot(&mut self) -> Result<usize> {
        let deadline = Instant::now() + FREE_ID_WAIT;
        loop {
            // Round the ids from the one after the last taken: an id comes
            // back only after the others, checkpoints later, so a restore
            // re-commits its checkpoint's transactions while their ids
            // hold nothing newer (a re-commit behind a newer epoch is
            // answered PRODUCER_FENCED by Kafka, but tansu drops the
            // connection instead).
            let mut free = None;
            for k in 0..self.ids.len() {
                let slot = (self.next_slot + k) % self.ids.len();
                if !self.transactions.busy(&self.ids[slot])? {
                    free = Some(slot);
                    break;
                }
            }
            if let Some(slot) = free {
                return Ok(slot);
            }
            if Instant::now() >= deadline {
                return Err(external(format!(
                    "all {SLOTS} transactional ids of sink subtask {} wait for their checkpoints to complete \
                     (checkpoints keep failing): restarting from the last completed one",
                    self.subtask
                )));
            }
            let live = self.transactions.lock()?;
            let _ = self
                .transactions
                .committed
                .wait_timeout(live, Duration::from_millis(100))
                .map_err(|_| crate::error::ExecError::internal("Kafka transactions poisoned"))?;
        }
    }

    /// The producer id and epoch of `producer`, from its statistics.
    fn identity(producer: &BaseProducer<Deliveries>, id: &str) -> Result<(i64, i16)> {
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        loop {
            if let Some(i) = *producer
                .context()
                .identity
                .lock()
                .map_err(|_| crate::error::ExecError::internal("producer statistics poisoned"))?
            {
                return Ok(i);
            }
            if Instant::now() >= deadline {
                return Err(external(format!(
                    "the producer of '{id}' reported no producer id within {} s",
                    REQUEST_TIMEOUT.as_secs()
                )));
            }
            producer.poll(Duration::from_millis(20));
        }
    }

    /// The barrier: flushes the current transaction and hands it over.
    fn pre_commit(&mut self, topic: &str, last: bool) -> Result<Vec<serde_json::Value>> {
        self.pending.retain(|c| {
            self.transactions
                .lock()
                .map(|live| {
                    live.get(&c.transactional_id)
                        .is_some_and(|t| t.producer_id == c.producer_id)
                })
                .unwrap_or(true)
        });
        if let Some((id, producer, wrote)) = self.current.take() {
            if !wrote {
                // Nothing written: the transaction goes on (librdkafka has
                // not told the broker of it yet).
                self.current = Some((id, producer, false));
            } else {
                flush(&producer, topic)?;
                let (producer_id, epoch) = Self::identity(&producer, &id)?;
                let c = Committable {
                    transactional_id: id.clone(),
                    producer_id,
                    epoch,
                    subtask: self.subtask,
                    parallelism: self.parallelism,
                };
                self.transactions.lock()?.insert(
                    id,
                    LiveTxn {
                        producer: Some(producer),
                        producer_id,
                        epoch,
                    },
                );
                self.pending.push(c);
                // Flushed, not yet in a completed checkpoint: a crash here
                // must see this transaction aborted on restore.
                failpoint("kafka_sink.pre_committed");
                if !last {
                    self.begin()?;
                }
            }
        }
        self.pending
            .iter()
            .map(|c| serde_json::to_value(c).map_err(|e| crate::error::ExecError::internal(e.to_string())))
            .collect()
    }
}

impl Drop for TxnWriter {
    /// Hands a producer still being opened ahead to `recover`, which waits
    /// for it (not here: a writer is dropped on a runtime thread, and an
    /// unreachable cluster keeps the open going for its request timeout).
    fn drop(&mut self) {
        if let Some((_, opening)) = self.ahead.take()
            && let Ok(mut orphans) = self.transactions.orphans.lock()
        {
            orphans.push(opening);
        }
    }
}

enum Delivery {
    Plain(BaseProducer<Deliveries>),
    Transactional(TxnWriter),
}

/// `upsert-kafka`'s `sink.buffer-flush.*` (Flink's `ReducingUpsertWriter`):
/// the latest record of each key, sent when `max_rows` keys are held, when
/// the interval passes and at every barrier; many updates of a key in
/// between are one record.
struct ReduceBuffer {
    max_rows: usize,
    /// Key → its latest record.
    records: HashMap<Vec<u8>, Buffered>,
}

/// A buffered record's value (`None`: a tombstone), timestamp, headers
/// and topic (from a `topic` column).
type Buffered = (Option<Vec<u8>>, Option<i64>, Headers, Option<String>);

struct KafkaWriter {
    delivery: Delivery,
    buffer: Option<ReduceBuffer>,
    settings: Settings,
    codec: Codec,
    /// `fixed`, `round-robin`: each topic's partitions (read when first
    /// written) and next partition.
    placement: Placement,
    subtask: i32,
}

/// Where `fixed` and `round-robin` put records: each topic's partition
/// count and round-robin position.
#[derive(Default)]
struct Placement {
    partitions: HashMap<String, i32>,
    next: HashMap<String, i32>,
}

impl Placement {
    /// The partition a record to `topic` goes to (`None`: by its key).
    fn partition(
        &mut self,
        partitioner: Partitioner,
        subtask: i32,
        topic: &str,
        producer: &BaseProducer<Deliveries>,
    ) -> Result<Option<i32>> {
        if partitioner == Partitioner::Default {
            return Ok(None);
        }
        let n = match self.partitions.get(topic) {
            Some(n) => *n,
            None => {
                let n = partition_count(producer.client(), topic, "")?;
                self.partitions.insert(topic.to_string(), n);
                n
            }
        };
        Ok(Some(match partitioner {
            Partitioner::Fixed => subtask % n,
            _ => {
                // Subtasks start at their own partition, then go round.
                let next = self.next.entry(topic.to_string()).or_insert(subtask);
                let p = *next % n;
                *next = (p + 1) % n;
                p
            }
        }))
    }
}

impl Operator for KafkaWriter {
    fn name(&self) -> &str {
        "Sink: kafka"
    }

    fn process_batch(&mut self, batch: ChangeBatch, _out: &mut Collector) -> Result<()> {
        let encoded = if self.codec.is_upsert() {
            self.codec.encode_changes(batch)?
        } else if self.codec.writes_changes() {
            self.codec.encode_changelog(batch)?
        } else {
            self.codec.encode(&batch.into_inserts("Sink: kafka")?)?
        };
        let Some(buffer) = self.buffer.as_mut() else {
            return self.send(encoded);
        };
        let keys = encoded.keys.unwrap_or_default();
        let mut headers = encoded.headers.map(Vec::into_iter);
        let mut topics = encoded.topics.map(Vec::into_iter);
        for (i, (key, value)) in keys.into_iter().zip(encoded.values).enumerate() {
            let timestamp = encoded.timestamps.as_ref().and_then(|t| t[i]);
            let h = headers.as_mut().and_then(Iterator::next).unwrap_or_default();
            let topic = topics.as_mut().and_then(Iterator::next).flatten();
            buffer.records.insert(key, (value, timestamp, h, topic));
        }
        if buffer.records.len() >= buffer.max_rows {
            self.send_buffered()?;
        }
        Ok(())
    }

    fn processing_time_interval(&self) -> Option<Duration> {
        self.settings.buffer.map(|(_, interval)| interval)
    }

    fn on_processing_time(&mut self, _now: i64, _out: &mut Collector) -> Result<()> {
        self.send_buffered()
    }

    fn snapshot_state(&mut self, _checkpoint_id: u64) -> Result<Option<OperatorSnapshot>> {
        // The barrier: every record before it is in the topic before the
        // checkpoint can complete (at-least-once).
        self.send_buffered()?;
        let topic = self.settings.topics.text();
        match &mut self.delivery {
            Delivery::Plain(p) if self.settings.guarantee != Guarantee::None => flush(p, &topic)?,
            Delivery::Plain(_) => {}
            // Pre-committed through `CommittingWriter`, never here.
            Delivery::Transactional(_) => {
                return Err(ExecError::internal(
                    "a transactional Kafka writer snapshotted as a direct one",
                ));
            }
        }
        Ok(None)
    }

    fn on_end_of_input(&mut self, _out: &mut Collector) -> Result<()> {
        self.send_buffered()?;
        let topic = self.settings.topics.text();
        match &self.delivery {
            Delivery::Plain(p) => flush(p, &topic),
            // Its last transaction is pre-committed by the final checkpoint.
            Delivery::Transactional(_) => Ok(()),
        }
    }
}

impl CommittingWriter for KafkaWriter {
    fn pre_commit(&mut self, _checkpoint_id: u64) -> Result<Vec<serde_json::Value>> {
        self.pre_commit_transaction(false)
    }

    fn final_pre_commit(&mut self) -> Result<Vec<serde_json::Value>> {
        // The end of input: no transaction after this one.
        self.pre_commit_transaction(true)
    }
}

impl KafkaWriter {
    /// The barrier: every record before it is in the pre-committed
    /// transaction before the checkpoint can complete.
    fn pre_commit_transaction(&mut self, last: bool) -> Result<Vec<serde_json::Value>> {
        self.send_buffered()?;
        let topic = self.settings.topics.text();
        match &mut self.delivery {
            Delivery::Transactional(w) => w.pre_commit(&topic, last),
            Delivery::Plain(_) => Err(ExecError::internal("a Kafka writer without transactions pre-committed")),
        }
    }
}

impl KafkaWriter {
    /// Sends what the reduce buffer holds.
    fn send_buffered(&mut self) -> Result<()> {
        let Some(buffer) = self.buffer.as_mut() else {
            return Ok(());
        };
        if buffer.records.is_empty() {
            return Ok(());
        }
        let mut keys = Vec::with_capacity(buffer.records.len());
        let mut values = Vec::with_capacity(buffer.records.len());
        let mut timestamps = Vec::with_capacity(buffer.records.len());
        let mut headers = Vec::with_capacity(buffer.records.len());
        let mut topics = Vec::with_capacity(buffer.records.len());
        for (k, (v, t, h, topic)) in buffer.records.drain() {
            keys.push(k);
            values.push(v);
            timestamps.push(t);
            headers.push(h);
            topics.push(topic);
        }
        self.send(Encoded {
            keys: Some(keys),
            values,
            timestamps: Some(timestamps),
            headers: Some(headers),
            topics: Some(topics),
        })
    }

    /// Sends records to the producer (or the open transaction).
    fn send(&mut self, encoded: Encoded) -> Result<()> {
        let (keys, values) = (encoded.keys, encoded.values);
        let topics = (0..values.len())
            .map(|i| self.settings.topics.of(encoded.topics.as_deref(), i))
            .collect::<Result<Vec<&str>>>()?;
        let producer = match &mut self.delivery {
            Delivery::Plain(p) => &*p,
            Delivery::Transactional(w) => match w.current.as_mut() {
                Some((_, p, wrote)) => {
                    *wrote = true;
                    &*p
                }
                None => {
                    return Err(crate::error::ExecError::internal(
                        "a Kafka transactional writer without a transaction",
                    ));
                }
            },
        };
        let mut partitions = Vec::with_capacity(values.len());
        for topic in &topics {
            let p = self
                .placement
                .partition(self.settings.partitioner, self.subtask, topic, producer)?;
            partitions.push(p);
        }
        for (i, value) in values.iter().enumerate() {
            let topic = topics[i];
            let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic);
            if let Some(v) = value {
                record = record.payload(v.as_slice());
            }
            if let Some(k) = keys.as_ref().map(|k| k[i].as_slice()) {
                record = record.key(k);
            }
            if let Some(p) = partitions[i] {
                record = record.partition(p);
            }
            if let Some(t) = encoded.timestamps.as_ref().and_then(|t| t[i]) {
                record = record.timestamp(t);
            }
            if let Some(h) = encoded.headers.as_ref().map(|h| &h[i]).filter(|h| !h.is_empty()) {
                let mut owned = rdkafka::message::OwnedHeaders::new_with_capacity(h.len());
                for (key, value) in h {
                    owned = owned.insert(rdkafka::message::Header {
                        key: key.as_str(),
                        value: value.as_deref(),
                    });
                }
                record = record.headers(owned);
            }
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                        // The producer's queue is full: wait for deliveries
                        // (back-pressure), then send again.
                        record = r;
                        producer.poll(Duration::from_millis(100));
                    }
                    Err((e, _)) => {
                        return Err(external(format!("cannot send a record to topic '{topic}': {e}")));
                    }
                }
            }
        }
        producer.poll(Duration::ZERO);
        check_deliveries(producer)
    }
}
