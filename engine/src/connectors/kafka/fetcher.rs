//! A split's fetcher: a thread of its own that polls the split's consumer
//! and hands its records to the reader in chunks, so the reader decodes
//! one chunk while the next is fetched. Flink's Kafka source is cut the
//! same way (a fetcher thread polls, the task thread deserializes); read
//! on one thread, librdkafka's per-record poll and the JSON decode took
//! turns, and a JSON backfill read at about 70 % of the bare client.
//!
//! The fetcher reads ahead by at most [`AHEAD`] chunks waiting in the
//! channel and the one it is handing on: a split the reader does not poll
//! (paused by watermark alignment) stops its fetcher there,
//! and librdkafka then stops fetching once its queue is full. A record is
//! handed on, and the split's position moves past it, only when the reader
//! takes its chunk: a checkpoint never covers what is still in flight here.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;

use super::codec::Record;
use super::metadata::RecordMeta;

/// Most records in a chunk.
const MAX_RECORDS: usize = 8192;

/// Chunks fetched ahead of the reader.
const AHEAD: usize = 1;

/// How long the fetcher waits in librdkafka for a record before it looks
/// whether its split was dropped.
const POLL_WAIT: Duration = Duration::from_millis(100);

/// Records the reader takes at once, and where the split stands after them.
pub(super) struct Chunk {
    pub records: Vec<Record>,
    /// The split's position once these records are handed on: after the
    /// last of them, or further (past the control records of transactions,
    /// which take offsets too).
    pub next_offset: i64,
}

pub(super) enum Fetched {
    Chunk(Chunk),
    /// An error the client cannot recover from, at this offset (`None`:
    /// the fetcher stopped without a word).
    Failed {
        offset: Option<i64>,
        error: String,
    },
}

/// What the fetcher needs to know of its split.
pub(super) struct Partition {
    pub topic: String,
    pub partition: i32,
    /// The first offset to hand on.
    pub next_offset: i64,
    /// Bounded: the offset the split ends before.
    pub stop: Option<i64>,
    pub reads_headers: bool,
    /// `upsert-kafka`: a record without a value is a delete, not skipped.
    pub keeps_tombstones: bool,
}

/// The reader's end of a running fetcher; dropping it stops the thread
/// (within [`POLL_WAIT`]), which closes the consumer on its way out.
pub(super) struct Fetcher {
    chunks: Receiver<Fetched>,
    halt: Arc<AtomicBool>,
}

impl Fetcher {
    /// Starts fetching `part` with `consumer`, already assigned at its
    /// next offset; `waker` is told whenever a chunk is ready.
    pub fn start(
        consumer: BaseConsumer<impl rdkafka::consumer::ConsumerContext + 'static>,
        part: Partition,
        waker: Option<Arc<tokio::sync::Notify>>,
    ) -> std::io::Result<Self> {
        let (tx, chunks) = std::sync::mpsc::sync_channel(AHEAD);
        let halt = Arc::new(AtomicBool::new(false));
        let halted = halt.clone();
        std::thread::Builder::new()
            .name(format!("weir-kafka-fetch-{}", part.partition))
            .spawn(move || run(consumer, part, tx, halted, waker))?;
        Ok(Self { chunks, halt })
    }

    /// The next chunk or failure, if one is ready.
    pub fn try_next(&self) -> Option<Fetched> {
        match self.chunks.try_recv() {
            Ok(f) => Some(f),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => Some(Fetched::Failed {
                offset: None,
                error: "the partition's fetcher stopped".into(),
            }),
        }
    }
}

impl Drop for Fetcher {
    fn drop(&mut self) {
        self.halt.store(true, Ordering::Relaxed);
    }
}

fn run(
    consumer: BaseConsumer<impl rdkafka::consumer::ConsumerContext>,
    mut part: Partition,
    tx: SyncSender<Fetched>,
    halt: Arc<AtomicBool>,
    waker: Option<Arc<tokio::sync::Notify>>,
) {
    let wake = || {
        if let Some(w) = &waker {
            w.notify_one();
        }
    };
    while !halt.load(Ordering::Relaxed) {
        let fetched = match read_chunk(&consumer, &mut part) {
            Ok(None) => continue,
            Ok(Some(chunk)) => Fetched::Chunk(chunk),
            Err(error) => Fetched::Failed {
                offset: Some(part.next_offset),
                error,
            },
        };
        let last = !matches!(fetched, Fetched::Chunk(_)) || part.stop.is_some_and(|s| part.next_offset >= s);
        // Blocks while the reader is a chunk behind; fails once it is gone.
        if tx.send(fetched).is_err() {
            return;
        }
        wake();
        if last {
            return;
        }
    }
}

/// Up to [`MAX_RECORDS`] records: those librdkafka holds now, or the first
/// to arrive within [`POLL_WAIT`]. `None`: nothing arrived and the
/// position did not move.
fn read_chunk(
    consumer: &BaseConsumer<impl rdkafka::consumer::ConsumerContext>,
    part: &mut Partition,
) -> Result<Option<Chunk>, String> {
    let start = part.next_offset;
    // Keys and values go into one buffer, each record a slice of it.
    let mut data: Vec<u8> = vec![];
    type Span = std::ops::Range<usize>;
    let mut read: Vec<(i64, Option<Span>, Option<Span>, RecordMeta)> = vec![];
    let mut wait = POLL_WAIT;
    while read.len() < MAX_RECORDS && part.stop.is_none_or(|s| part.next_offset < s) {
        let polled = consumer.poll(wait);
        wait = Duration::ZERO;
        match polled {
            None => break,
            Some(Err(KafkaError::PartitionEOF(_))) => {
                // Past the partition's last record: the consumer's
                // position also passes the control records after it.
                if let Some(p) = position(consumer, part) {
                    part.next_offset = part.next_offset.max(p);
                }
                break;
            }
            Some(Err(e)) => {
                if is_fatal(&e) {
                    return Err(e.to_string());
                }
                // A broker down: librdkafka reconnects and the split goes
                // on, polled again after a pause (not a log line per poll).
                tracing::warn!(target: "weir::kafka", "topic '{}' partition {}: {e} (retrying)", part.topic, part.partition);
                if read.is_empty() {
                    std::thread::sleep(POLL_WAIT);
                }
                break;
            }
            Some(Ok(m)) => {
                let offset = m.offset();
                if offset < part.next_offset {
                    continue;
                }
                if let Some(stop) = part.stop.filter(|s| offset >= *s) {
                    part.next_offset = stop;
                    break;
                }
                part.next_offset = offset + 1;
                // A record without a value (a tombstone) is no row of a
                // plain `kafka` table (its offset is passed), and the
                // delete of its key in an `upsert-kafka` one.
                if m.payload().is_some() || part.keeps_tombstones {
                    let mut copy = |p: Option<&[u8]>| {
                        p.map(|p| {
                            data.extend_from_slice(p);
                            data.len() - p.len()..data.len()
                        })
                    };
                    let (key, value) = (copy(m.key()), copy(m.payload()));
                    read.push((offset, key, value, RecordMeta::of(&m, part.reads_headers)));
                }
            }
        }
    }
    if read.is_empty() && part.next_offset == start {
        return Ok(None);
    }
    let data = bytes::Bytes::from(data);
    let records = read
        .into_iter()
        .map(|(offset, key, value, meta)| Record {
            offset,
            key: key.map(|r| data.slice(r)),
            value: value.map(|r| data.slice(r)),
            meta,
        })
        .collect();
    Ok(Some(Chunk {
        records,
        next_offset: part.next_offset,
    }))
}

/// The consumer's position in the partition.
fn position(consumer: &BaseConsumer<impl rdkafka::consumer::ConsumerContext>, part: &Partition) -> Option<i64> {
    let positions = consumer.position().ok()?;
    positions
        .find_partition(&part.topic, part.partition)
        .and_then(|e| match e.offset() {
            rdkafka::Offset::Offset(o) => Some(o),
            _ => None,
        })
}

/// An error the client cannot recover from (the others, such as a broker
/// down, librdkafka retries by itself).
fn is_fatal(e: &KafkaError) -> bool {
    match e {
        KafkaError::MessageConsumptionFatal(_) => true,
        KafkaError::MessageConsumption(code) => matches!(
            code,
            RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::GroupAuthorizationFailed
                | RDKafkaErrorCode::Fatal
                | RDKafkaErrorCode::AutoOffsetReset
                | RDKafkaErrorCode::UnknownTopic
        ),
        _ => false,
    }
}
