//! The Kafka source: one split per topic partition.
//!
//! The enumerator (`create_splits`) reads the topics' metadata and decides
//! every partition's start offset by `scan.startup.mode` and, when bounded,
//! its stop offset by `scan.bounded.mode`, once, as Flink's enumerator
//! does; a partition with checkpointed state starts at its checkpointed
//! offset instead (`seek`), whatever the startup mode.
//!
//! A split reads its partition with a consumer of its own, assigned (never
//! subscribed) at an explicit offset, polled by the split's fetcher thread
//! (`fetcher`): the reader decodes one chunk while the next is fetched. A
//! split paused by watermark alignment is simply not polled: its fetcher
//! stops a chunk ahead, librdkafka fetches until the partition's local
//! queue holds `queued.max.messages.kbytes`, then stops fetching it, and
//! nothing fetched is thrown away (librdkafka's `pause()` would purge the
//! prefetched records and fetch them again on resume).
//!
//! The position a checkpoint records is the split's next offset: the
//! offset after the last record handed on, or the consumer's position when
//! it is further (control records of transactions take offsets too, so a
//! bounded read ends by position, not by last offset + 1: FLINK-34470).
//! After a checkpoint completes the offsets are committed to the consumer
//! group, for monitoring only; the source never reads them back except for
//! `group-offsets` startup.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow::datatypes::SchemaRef;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{Offset, TopicPartitionList};
use weir_catalog::Options;

use super::codec::{Codec, Decoders};
use super::fetcher::{Fetched, Fetcher, Partition};
use super::{
    NAME, REQUEST_TIMEOUT, Topics, client_config, client_properties, external, invalid, parse_specific_offsets,
};
use crate::connectors::{Committer, SinkContext, SourceFactory, SourceSplit, SplitPoll};
use crate::error::{ConnectorError, Result};

/// How long an empty split waits before it is polled again; its fetcher
/// wakes the reader sooner when a chunk is ready.
const EMPTY_WAIT: Duration = Duration::from_millis(200);

#[derive(Debug, Clone)]
enum Startup {
    Earliest,
    Latest,
    Group,
    Timestamp(i64),
    Specific(BTreeMap<i32, i64>),
}

#[derive(Debug, Clone)]
enum Bounded {
    Unbounded,
    Latest,
    Group,
    Timestamp(i64),
    Specific(BTreeMap<i32, i64>),
}

#[derive(Debug, Clone)]
pub(super) struct Settings {
    startup: Startup,
    bounded: Bounded,
}

impl Settings {
    pub fn from_options(options: &Options) -> Result<Self> {
        let millis = |mode_key: &str, key: &str| -> Result<i64> {
            options
                .i64(key)?
                .ok_or_else(|| invalid(mode_key, format!("mode 'timestamp' needs option '{key}'")))
        };
        let specific = |mode_key: &str, key: &str| -> Result<BTreeMap<i32, i64>> {
            let text = options
                .get(key)
                .ok_or_else(|| invalid(mode_key, format!("mode 'specific-offsets' needs option '{key}'")))?;
            parse_specific_offsets(key, text)
        };
        let startup = match options.enum_value("scan.startup.mode").as_deref() {
            Some("earliest-offset") => Startup::Earliest,
            Some("latest-offset") => Startup::Latest,
            Some("timestamp") => Startup::Timestamp(millis("scan.startup.mode", "scan.startup.timestamp-millis")?),
            Some("specific-offsets") => {
                Startup::Specific(specific("scan.startup.mode", "scan.startup.specific-offsets")?)
            }
            _ => Startup::Group,
        };
        let bounded = match options.enum_value("scan.bounded.mode").as_deref() {
            Some("latest-offset") => Bounded::Latest,
            Some("group-offsets") => Bounded::Group,
            Some("timestamp") => Bounded::Timestamp(millis("scan.bounded.mode", "scan.bounded.timestamp-millis")?),
            Some("specific-offsets") => {
                Bounded::Specific(specific("scan.bounded.mode", "scan.bounded.specific-offsets")?)
            }
            _ => Bounded::Unbounded,
        };
        for (key, applies) in [
            (
                "scan.startup.timestamp-millis",
                matches!(startup, Startup::Timestamp(_)),
            ),
            ("scan.startup.specific-offsets", matches!(startup, Startup::Specific(_))),
            (
                "scan.bounded.timestamp-millis",
                matches!(bounded, Bounded::Timestamp(_)),
            ),
            ("scan.bounded.specific-offsets", matches!(bounded, Bounded::Specific(_))),
        ] {
            if options.get(key).is_some() && !applies {
                let mode = if key.starts_with("scan.startup") {
                    "scan.startup.mode"
                } else {
                    "scan.bounded.mode"
                };
                return Err(invalid(key, format!("does not apply to the '{mode}' given")));
            }
        }
        Ok(Self { startup, bounded })
    }
}

/// Offsets of the topics' partitions at a moment, for one startup or stop rule.
type PartitionOffsets = BTreeMap<(String, i32), i64>;

#[derive(Debug)]
pub struct KafkaSource {
    table: String,
    properties: BTreeMap<String, String>,
    topics: Topics,
    settings: Settings,
    codec: Codec,
    /// The user's consumer group, where offsets are committed.
    group: Option<String>,
    /// `scan.topic-partition-discovery.interval`.
    discovery: Option<Duration>,
}

impl KafkaSource {
    /// `upsert`: an `upsert-kafka` table (its options as [`super::upsert_as_kafka`] gives them).
    /// `metadata`: its metadata columns, `(index in schema, key)`.
    pub fn new(
        options: &Options,
        schema: SchemaRef,
        table: &str,
        upsert: bool,
        metadata: &[(usize, String)],
    ) -> Result<Self> {
        let mut properties = client_properties(options);
        let group = properties.get("group.id").cloned();
        if let Some(reset) = properties.get("auto.offset.reset")
            && !matches!(
                reset.as_str(),
                "earliest" | "latest" | "smallest" | "largest" | "error" | "none"
            )
        {
            return Err(invalid(
                "properties.auto.offset.reset",
                format!("invalid value '{reset}', expected earliest, latest or none"),
            ));
        }
        // Offsets are Weir's (checkpoints); the group is only told.
        properties.insert("enable.auto.commit".into(), "false".into());
        properties.insert("enable.auto.offset.store".into(), "false".into());
        properties.insert("enable.partition.eof".into(), "true".into());
        properties
            .entry("isolation.level".into())
            .or_insert_with(|| "read_committed".into());
        // A paused split keeps at most this much fetched (librdkafka's
        // per-partition queue limit: a split has its own consumer).
        properties
            .entry("queued.max.messages.kbytes".into())
            .or_insert_with(|| "8192".into());
        // librdkafka stops fetching a partition for this long once its
        // queue passed a threshold (default 1 s): a split drains its queue
        // in milliseconds, then sat idle the rest of the second (a 4-partition
        // backfill read at a third of the client's rate).
        properties
            .entry("fetch.queue.backoff.ms".into())
            .or_insert_with(|| "10".into());
        properties
            .entry("group.id".into())
            .or_insert_with(|| format!("weir-{table}"));
        Ok(Self {
            table: table.to_string(),
            properties,
            topics: Topics::from_options(options)?,
            settings: Settings::from_options(options)?,
            codec: Codec::new(
                options,
                &schema,
                upsert,
                super::metadata_columns(&schema, metadata, table, false)?,
            )?,
            group,
            discovery: options.duration("scan.topic-partition-discovery.interval")?,
        })
    }

    fn consumer(&self) -> Result<BaseConsumer> {
        let mut config = client_config(&self.properties);
        // What `group-offsets` falls back to is ours to apply (below).
        config.remove("auto.offset.reset");
        config
            .create()
            .map_err(|e| external(format!("cannot create a consumer for table '{}': {e}", self.table)))
    }

    /// The group told of each completed checkpoint's positions: the
    /// user's `properties.group.id`, unless
    /// `properties.commit.offsets.on.checkpoint` is false.
    fn offsets_group(&self) -> Option<String> {
        let commit = self
            .properties
            .get("commit.offsets.on.checkpoint")
            .is_none_or(|v| v != "false");
        self.group.clone().filter(|_| commit)
    }

    fn servers(&self) -> &str {
        self.properties.get("bootstrap.servers").map_or("", String::as_str)
    }

    /// Every partition of the topics read, sorted.
    fn partitions(&self, consumer: &BaseConsumer) -> Result<Vec<(String, i32)>> {
        let topic = match &self.topics {
            Topics::List(list) if list.len() == 1 => Some(list[0].as_str()),
            _ => None,
        };
        let metadata = consumer.fetch_metadata(topic, REQUEST_TIMEOUT).map_err(|e| {
            external(format!(
                "cannot read the metadata of the cluster at '{}' within {} s: {e}",
                self.servers(),
                REQUEST_TIMEOUT.as_secs()
            ))
        })?;
        let mut out = vec![];
        let mut missing = vec![];
        match &self.topics {
            Topics::List(list) => {
                for name in list {
                    match metadata.topics().iter().find(|t| t.name() == name) {
                        Some(t) if t.error().is_none() && !t.partitions().is_empty() => {
                            out.extend(t.partitions().iter().map(|p| (name.clone(), p.id())));
                        }
                        _ => missing.push(name.clone()),
                    }
                }
            }
            Topics::Pattern(re) => {
                for t in metadata.topics() {
                    if re.is_match(t.name()) && !t.name().starts_with("__") && t.error().is_none() {
                        out.extend(t.partitions().iter().map(|p| (t.name().to_string(), p.id())));
                    }
                }
            }
        }
        if !missing.is_empty() {
            return Err(external(format!(
                "topic '{}' does not exist on the cluster at '{}' (table '{}')",
                missing.join("', '"),
                self.servers(),
                self.table
            )));
        }
        out.sort();
        Ok(out)
    }

    /// The earliest or latest offset of each partition.
    fn watermarks(&self, consumer: &BaseConsumer, parts: &[(String, i32)], latest: bool) -> Result<PartitionOffsets> {
        let mut out = BTreeMap::new();
        for (t, p) in parts {
            let (low, high) = consumer
                .fetch_watermarks(t, *p, REQUEST_TIMEOUT)
                .map_err(|e| external(format!("cannot read the offsets of topic '{t}' partition {p}: {e}")))?;
            out.insert((t.clone(), *p), if latest { high } else { low });
        }
        Ok(out)
    }

    /// The offset of each partition's first record at or after `millis`
    /// (its latest offset when there is none).
    fn at_time(&self, consumer: &BaseConsumer, parts: &[(String, i32)], millis: i64) -> Result<PartitionOffsets> {
        let mut tpl = TopicPartitionList::new();
        for (t, p) in parts {
            tpl.add_partition_offset(t, *p, Offset::Offset(millis))
                .map_err(|e| external(e.to_string()))?;
        }
        let found = consumer
            .offsets_for_times(tpl, REQUEST_TIMEOUT)
            .map_err(|e| external(format!("cannot look up offsets by time {millis}: {e}")))?;
        let latest = self.watermarks(consumer, parts, true)?;
        let mut out = BTreeMap::new();
        for e in found.elements() {
            let key = (e.topic().to_string(), e.partition());
            let o = match e.offset() {
                Offset::Offset(o) => o,
                _ => latest.get(&key).copied().unwrap_or(0),
            };
            out.insert(key, o);
        }
        Ok(out)
    }

    /// The group's committed offsets; a partition without one follows
    /// `properties.auto.offset.reset`, and fails the job without it, as
    /// Flink's default (NONE) does.
    fn committed(&self, consumer: &BaseConsumer, parts: &[(String, i32)]) -> Result<PartitionOffsets> {
        let mut tpl = TopicPartitionList::new();
        for (t, p) in parts {
            let _ = tpl.add_partition(t, *p);
        }
        let found = consumer.committed_offsets(tpl, REQUEST_TIMEOUT).map_err(|e| {
            external(format!(
                "cannot read the committed offsets of group '{}': {e}",
                self.properties.get("group.id").map_or("", String::as_str)
            ))
        })?;
        let mut out = BTreeMap::new();
        let mut fallback = vec![];
        for e in found.elements() {
            let key = (e.topic().to_string(), e.partition());
            match e.offset() {
                Offset::Offset(o) => {
                    out.insert(key, o);
                }
                _ => fallback.push(key),
            }
        }
        if !fallback.is_empty() {
            let reset = self.properties.get("auto.offset.reset").map(String::as_str);
            let latest = match reset {
                Some("earliest" | "smallest") => false,
                Some("latest" | "largest") => true,
                _ => {
                    let (t, p) = &fallback[0];
                    return Err(invalid(
                        "scan.startup.mode",
                        format!(
                            "'group-offsets': group '{}' has no committed offset for topic '{t}' partition {p}; \
                             set 'properties.auto.offset.reset' to 'earliest' or 'latest', or choose another startup mode",
                            self.properties.get("group.id").map_or("", String::as_str)
                        ),
                    ));
                }
            };
            let ends = self.watermarks(consumer, &fallback, latest)?;
            out.extend(ends);
        }
        Ok(out)
    }

    fn start_offsets(&self, consumer: &BaseConsumer, parts: &[(String, i32)]) -> Result<PartitionOffsets> {
        match &self.settings.startup {
            Startup::Earliest => self.watermarks(consumer, parts, false),
            Startup::Latest => self.watermarks(consumer, parts, true),
            Startup::Group => self.committed(consumer, parts),
            Startup::Timestamp(ms) => self.at_time(consumer, parts, *ms),
            Startup::Specific(offsets) => {
                // A partition not listed starts at its earliest offset.
                let mut out = self.watermarks(consumer, parts, false)?;
                for ((_, p), o) in out.iter_mut() {
                    if let Some(given) = offsets.get(p) {
                        *o = *given;
                    }
                }
                Ok(out)
            }
        }
    }

    fn stop_offsets(&self, consumer: &BaseConsumer, parts: &[(String, i32)]) -> Result<Option<PartitionOffsets>> {
        Ok(Some(match &self.settings.bounded {
            Bounded::Unbounded => return Ok(None),
            Bounded::Latest => self.watermarks(consumer, parts, true)?,
            Bounded::Group => self.committed(consumer, parts)?,
            Bounded::Timestamp(ms) => self.at_time(consumer, parts, *ms)?,
            // A partition not listed is not read (stops at 0: before anything).
            Bounded::Specific(offsets) => parts
                .iter()
                .map(|(t, p)| ((t.clone(), *p), offsets.get(p).copied().unwrap_or(0)))
                .collect(),
        }))
    }

    /// The splits of `parts`; those in `restored` start where the
    /// checkpoint says (`seek`), the others by the startup mode. A bounded
    /// read's stop offsets are taken now, but for those the checkpoint
    /// recorded (`ends`): the first attempt's, as Flink keeps them in its
    /// split state, so records written since are not read.
    fn splits_of(
        &self,
        parts: Vec<(String, i32)>,
        restored: &[(String, i32)],
        ends: &PartitionOffsets,
    ) -> Result<Vec<Box<dyn SourceSplit>>> {
        let consumer = self.consumer()?;
        let fresh: Vec<(String, i32)> = parts.iter().filter(|p| !restored.contains(p)).cloned().collect();
        let starts = if fresh.is_empty() {
            BTreeMap::new()
        } else if !restored.is_empty() {
            // Partitions that appeared after the job started are read
            // whole, as Flink's enumerator reads discovered partitions.
            self.watermarks(&consumer, &fresh, false)?
        } else {
            self.start_offsets(&consumer, &fresh)?
        };
        let mut stops = self.stop_offsets(&consumer, &parts)?;
        if let Some(stops) = stops.as_mut() {
            stops.extend(ends.iter().map(|(k, v)| (k.clone(), *v)));
        }
        self.splits_at(parts, &starts, stops.as_ref())
    }

    fn splits_at(
        &self,
        parts: Vec<(String, i32)>,
        starts: &PartitionOffsets,
        stops: Option<&PartitionOffsets>,
    ) -> Result<Vec<Box<dyn SourceSplit>>> {
        let shared = Arc::new(Shared {
            table: self.table.clone(),
            properties: self.properties.clone(),
            codec: self.codec.clone(),
            ignore_parse_errors: self.codec.ignores_parse_errors(),
            commits_offsets: self.offsets_group().is_some(),
        });
        Ok(parts
            .into_iter()
            .map(|(topic, partition)| {
                let key = (topic, partition);
                let start = starts.get(&key).copied().unwrap_or(0);
                // A partition without a stop offset (not listed in specific
                // offsets) is not read: it stops at 0, before anything.
                let stop = stops.map(|s| s.get(&key).copied().unwrap_or(0));
                Box::new(KafkaSplit {
                    shared: shared.clone(),
                    topic: key.0,
                    partition: key.1,
                    next_offset: start,
                    stop,
                    fetcher: None,
                    decoders: None,
                    waker: None,
                    skipped: 0,
                }) as Box<dyn SourceSplit>
            })
            .collect())
    }
}

fn split_id(topic: &str, partition: i32) -> String {
    format!("{topic}:{partition}")
}

impl SourceFactory for KafkaSource {
    fn name(&self) -> &str {
        NAME
    }

    fn is_bounded(&self) -> bool {
        !matches!(self.settings.bounded, Bounded::Unbounded)
    }

    fn bounding_hint(&self) -> String {
        "set 'scan.bounded.mode' ('latest-offset', 'group-offsets', 'timestamp' or 'specific-offsets')".into()
    }

    fn produces_changes(&self) -> bool {
        self.codec.produces_changes()
    }

    fn is_upsert(&self) -> bool {
        self.codec.is_upsert()
    }

    fn create_splits(&self, _count: usize) -> Result<Vec<Box<dyn SourceSplit>>> {
        let consumer = self.consumer()?;
        let parts = self.partitions(&consumer)?;
        self.splits_of(parts, &[], &PartitionOffsets::new())
    }

    fn restore_splits(&self, recorded: &[crate::checkpoint::SplitPosition]) -> Result<Vec<Box<dyn SourceSplit>>> {
        // The checkpointed partitions, and any the topics have gained
        // since (they start by the startup mode, as on a fresh start).
        let consumer = self.consumer()?;
        let mut restored: Vec<(String, i32)> = vec![];
        let mut ends = PartitionOffsets::new();
        for r in recorded {
            let id = &r.split;
            let (t, p) = id
                .rsplit_once(':')
                .and_then(|(t, p)| Some((t.to_string(), p.parse::<i32>().ok()?)))
                .ok_or_else(|| crate::error::ExecError::internal(format!("not a Kafka split id: '{id}'")))?;
            if let Some(end) = r.end {
                ends.insert((t.clone(), p), end as i64);
            }
            restored.push((t, p));
        }
        let mut parts = restored.clone();
        for p in self.partitions(&consumer)? {
            if !parts.contains(&p) {
                parts.push(p);
            }
        }
        parts.sort();
        self.splits_of(parts, &restored, &ends)
    }

    fn discovery_interval(&self) -> Option<Duration> {
        // As Flink: a bounded read lists its partitions once.
        self.discovery.filter(|d| !d.is_zero() && !self.is_bounded())
    }

    fn discover(&self, known: &std::collections::BTreeSet<String>) -> Result<Vec<Box<dyn SourceSplit>>> {
        let consumer = self.consumer()?;
        let new: Vec<(String, i32)> = self
            .partitions(&consumer)?
            .into_iter()
            .filter(|(t, p)| !known.contains(&split_id(t, *p)))
            .collect();
        if new.is_empty() {
            return Ok(vec![]);
        }
        tracing::info!(
            target: "weir::kafka",
            "table '{}': found {} new partition(s), read from their earliest offset: {}",
            self.table,
            new.len(),
            new.iter().map(|(t, p)| split_id(t, *p)).collect::<Vec<_>>().join(", ")
        );
        // Read whole, as Flink's enumerator reads discovered partitions.
        let starts = self.watermarks(&consumer, &new, false)?;
        self.splits_at(new, &starts, None)
    }

    fn committer(&self, _ctx: &SinkContext) -> Option<Arc<dyn Committer>> {
        self.offsets_group().map(|group| {
            Arc::new(OffsetCommitter {
                group,
                properties: self.properties.clone(),
                consumer: std::sync::Mutex::new(None),
            }) as Arc<dyn Committer>
        })
    }
}

/// What the splits of one source share.
#[derive(Debug)]
/// A split consumer's context: the end-of-partition events a bounded read
/// asks for are expected, not errors to log.
struct SplitContext;

impl rdkafka::ClientContext for SplitContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::PartitionEOF) {
            return;
        }
        tracing::error!(target: "weir::kafka", "librdkafka: {error}: {reason}");
    }
}

impl rdkafka::consumer::ConsumerContext for SplitContext {}

struct Shared {
    table: String,
    properties: BTreeMap<String, String>,
    codec: Codec,
    ignore_parse_errors: bool,
    /// Positions are told to the group when a checkpoint completes.
    commits_offsets: bool,
}

pub struct KafkaSplit {
    shared: Arc<Shared>,
    topic: String,
    partition: i32,
    /// The next offset to read (exclusive end of what was handed on).
    next_offset: i64,
    /// Bounded: the offset the split ends before.
    stop: Option<i64>,
    /// Polls the split's consumer on a thread of its own, once opened.
    fetcher: Option<Fetcher>,
    decoders: Option<Decoders>,
    waker: Option<Arc<tokio::sync::Notify>>,
    /// Bad records skipped (`*.ignore-parse-errors`) since last taken.
    skipped: u64,
}

impl KafkaSplit {
    fn location(&self, offset: i64) -> String {
        format!(
            "kafka topic '{}' partition {} offset {offset}",
            self.topic, self.partition
        )
    }

    /// A consumer assigned at the split's next offset, and its fetcher.
    fn open(&mut self) -> Result<()> {
        let mut config = client_config(&self.shared.properties);
        // An offset no longer on the broker (retention): read from the
        // earliest kept, unless the user chose otherwise.
        if !self.shared.properties.contains_key("auto.offset.reset") {
            config.set("auto.offset.reset", "earliest");
        }
        let consumer: BaseConsumer<SplitContext> = config.create_with_context(SplitContext).map_err(|e| {
            external(format!(
                "cannot create a consumer for topic '{}' partition {}: {e}",
                self.topic, self.partition
            ))
        })?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.topic, self.partition, Offset::Offset(self.next_offset))
            .map_err(|e| external(e.to_string()))?;
        consumer.assign(&tpl).map_err(|e| {
            external(format!(
                "cannot assign topic '{}' partition {}: {e}",
                self.topic, self.partition
            ))
        })?;
        let part = Partition {
            topic: self.topic.clone(),
            partition: self.partition,
            next_offset: self.next_offset,
            stop: self.stop,
            reads_headers: self.shared.codec.reads_headers(),
            keeps_tombstones: self.shared.codec.is_upsert(),
        };
        let fetcher = Fetcher::start(consumer, part, self.waker.clone()).map_err(|e| {
            external(format!(
                "cannot start the fetcher of topic '{}' partition {}: {e}",
                self.topic, self.partition
            ))
        })?;
        self.decoders = Some(self.shared.codec.decoders(&self.topic));
        self.fetcher = Some(fetcher);
        Ok(())
    }

    fn done(&self) -> bool {
        self.stop.is_some_and(|s| self.next_offset >= s)
    }
}

impl SourceSplit for KafkaSplit {
    fn id(&self) -> String {
        split_id(&self.topic, self.partition)
    }

    fn offset(&self) -> u64 {
        self.next_offset.max(0) as u64
    }

    fn seek(&mut self, position: u64) -> Result<()> {
        self.next_offset = position as i64;
        // Fetched from the old position: opened again at the new one on
        // the next poll.
        self.fetcher = None;
        Ok(())
    }

    fn end(&self) -> Option<u64> {
        self.stop.map(|s| s as u64)
    }

    fn set_waker(&mut self, waker: Arc<tokio::sync::Notify>) {
        self.waker = Some(waker);
    }

    fn take_skipped(&mut self) -> u64 {
        std::mem::take(&mut self.skipped)
    }

    fn committable(&self) -> Option<serde_json::Value> {
        self.shared.commits_offsets.then_some(())?;
        Some(serde_json::json!({
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.next_offset,
        }))
    }

    fn poll_batch(&mut self) -> Result<SplitPoll> {
        if self.done() {
            // The fetcher has closed the consumer on its way out.
            self.fetcher = None;
            return Ok(SplitPoll::Finished);
        }
        if self.fetcher.is_none() {
            self.open()?;
        }
        let chunk = match self.fetcher.as_ref().and_then(Fetcher::try_next) {
            // The fetcher wakes the reader when a chunk is ready.
            None => return Ok(SplitPoll::Wait(tokio::time::Instant::now() + EMPTY_WAIT)),
            Some(Fetched::Failed { offset, error }) => {
                let at = offset.unwrap_or(self.next_offset);
                return Err(external(format!("{}: {error}", self.location(at))));
            }
            Some(Fetched::Chunk(chunk)) => chunk,
        };
        self.next_offset = self.next_offset.max(chunk.next_offset);
        let records = chunk.records;
        if records.is_empty() {
            if self.done() {
                self.fetcher = None;
                return Ok(SplitPoll::Finished);
            }
            return Ok(SplitPoll::Wait(tokio::time::Instant::now()));
        }
        let Some(decoders) = self.decoders.as_ref() else {
            return Err(crate::error::ExecError::internal("a Kafka split without its decoders"));
        };
        let decoded = self.shared.codec.decode(decoders, &records)?;
        if let Some((offset, reason)) = decoded.bad.first() {
            if !self.shared.ignore_parse_errors {
                return Err(ConnectorError::Data {
                    location: self.location(*offset),
                    message: format!("{reason} (table '{}')", self.shared.table),
                }
                .into());
            }
            for (offset, reason) in &decoded.bad {
                tracing::debug!(target: "weir::kafka", "{}: skipped: {reason}", self.location(*offset));
            }
            self.skipped += decoded.bad.len() as u64;
        }
        match decoded.rows {
            Some(rows) if rows.kinds.is_some() => Ok(SplitPoll::Changes(rows)),
            Some(rows) => Ok(SplitPoll::Batch(rows.rows)),
            // Only bad records or tombstones: poll again at once.
            None => Ok(SplitPoll::Wait(tokio::time::Instant::now())),
        }
    }
}

/// Commits the offsets of a completed checkpoint to the consumer group
/// (for monitoring: lag tools read them; the source does not).
struct OffsetCommitter {
    group: String,
    properties: BTreeMap<String, String>,
    consumer: std::sync::Mutex<Option<BaseConsumer>>,
}

impl Committer for OffsetCommitter {
    fn commit(&self, _checkpoint_id: u64, committables: &[serde_json::Value]) -> Result<()> {
        let mut tpl = TopicPartitionList::new();
        for c in committables {
            let (Some(t), Some(p), Some(o)) = (c["topic"].as_str(), c["partition"].as_i64(), c["offset"].as_i64())
            else {
                continue;
            };
            if tpl.add_partition_offset(t, p as i32, Offset::Offset(o)).is_err() {
                continue;
            }
        }
        if tpl.count() == 0 {
            return Ok(());
        }
        let mut guard = self
            .consumer
            .lock()
            .map_err(|_| crate::error::ExecError::internal("offset committer poisoned"))?;
        if guard.is_none() {
            match client_config(&self.properties).create::<BaseConsumer>() {
                Ok(c) => *guard = Some(c),
                Err(e) => {
                    tracing::warn!(target: "weir::kafka", "cannot commit offsets to group '{}': {e}", self.group);
                    return Ok(());
                }
            }
        }
        if let Some(c) = guard.as_ref()
            && let Err(e) = c.commit(&tpl, CommitMode::Sync)
        {
            // Offsets live in the checkpoint: a failed commit only leaves
            // the group's view behind.
            tracing::warn!(target: "weir::kafka", "cannot commit offsets to group '{}': {e}", self.group);
        }
        Ok(())
    }

    fn recover(&self) -> Result<()> {
        Ok(())
    }
}
