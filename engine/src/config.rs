//! Job options set with `SET 'key' = 'value'`, under Flink's key names.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use weir_catalog::{OptionKind, OptionSpec, Options};

use crate::checkpoint::{CheckpointConfig, CheckpointMode};
use crate::error::{ExecError, Result};

pub const PARALLELISM: &str = "parallelism.default";
/// Flink's `execution.runtime-mode`: `streaming` (the default), `batch`
/// or `automatic` (batch when every source is bounded).
pub const RUNTIME_MODE: &str = "execution.runtime-mode";
/// The memory a batch job's operators may hold before they spill to disk.
pub const BATCH_MEMORY_LIMIT: &str = "execution.batch.memory-limit";
/// Whether a batch job may spill to disk (off: it fails at the limit).
pub const BATCH_SPILL: &str = "execution.batch.spill.enabled";
pub const MAX_PARALLELISM: &str = "pipeline.max-parallelism";
pub const PIPELINE_NAME: &str = "pipeline.name";
pub const AUTO_WATERMARK_INTERVAL: &str = "pipeline.auto-watermark-interval";
pub const SOURCE_IDLE_TIMEOUT: &str = "table.exec.source.idle-timeout";
pub const STATE_BACKEND: &str = "state.backend.type";
pub const DML_SYNC: &str = "table.dml-sync";
pub const ALIGNMENT_BUFFER_SIZE: &str = "pipeline.watermark-alignment.buffer-size";
pub const ALLOW_UNALIGNED_SPLITS: &str = "pipeline.watermark-alignment.allow-unaligned-source-splits";
pub const ALIGNMENT_SPREAD_ALERT: &str = "pipeline.watermark-alignment.spread-alert";
pub const ALIGNMENT_STATE_BUDGET: &str = "pipeline.watermark-alignment.state-budget";
pub const CHECKPOINT_INTERVAL: &str = "execution.checkpointing.interval";
pub const CHECKPOINT_TIMEOUT: &str = "execution.checkpointing.timeout";
pub use crate::paths::{CHECKPOINT_DIR, RECOVERY_PATH, S3_ENDPOINT, SAVEPOINT_DIR};
pub const CHECKPOINT_MIN_PAUSE: &str = "execution.checkpointing.min-pause";
pub const CHECKPOINT_MAX_CONCURRENT: &str = "execution.checkpointing.max-concurrent-checkpoints";
pub const CHECKPOINT_TOLERABLE: &str = "execution.checkpointing.tolerable-failed-checkpoints";
pub const CHECKPOINT_RETAINED: &str = "execution.checkpointing.num-retained";
pub const CHECKPOINT_MODE: &str = "execution.checkpointing.mode";
pub const S3_ACCESS_KEY: &str = "s3.access-key";
pub const S3_SECRET_KEY: &str = "s3.secret-key";
pub const S3_REGION: &str = "s3.region";
pub const S3_PATH_STYLE: &str = "s3.path.style.access";
pub const CHECKPOINT_INCREMENTAL: &str = "execution.checkpointing.incremental";
pub const STATE_INCREMENTAL: &str = "state.backend.incremental";
pub const CHECKPOINT_UNALIGNED: &str = "execution.checkpointing.unaligned.enabled";
pub const ALIGNED_TIMEOUT: &str = "execution.checkpointing.aligned-checkpoint-timeout";
pub const ALIGNED_TIMEOUT_DEPRECATED: &str = "execution.checkpointing.alignment-timeout";
pub const CLAIM_MODE: &str = "execution.state-recovery.claim-mode";
pub const IGNORE_UNCLAIMED_STATE: &str = "execution.state-recovery.ignore-unclaimed-state";
pub const CHECKPOINT_RETENTION: &str = "execution.checkpointing.externalized-checkpoint-retention";
pub const OPERATOR_UIDS: &str = "pipeline.operator-uids";
pub const WINDOW_BUFFER_LIMIT: &str = "table.exec.window-agg.buffer-size-limit";
pub const WINDOW_SLICING: &str = "table.exec.window-agg.slicing";
pub const STATE_TTL: &str = "table.exec.state.ttl";
pub const MINI_BATCH_ENABLED: &str = "table.exec.mini-batch.enabled";
pub const MINI_BATCH_LATENCY: &str = "table.exec.mini-batch.allow-latency";
pub const MINI_BATCH_SIZE: &str = "table.exec.mini-batch.size";
/// Flink's session time zone ([`local_time_zone`]).
pub const LOCAL_TIME_ZONE: &str = "table.local-time-zone";
/// How the shell shows a query's result (Flink's SQL client option).
pub const RESULT_MODE: &str = "sql-client.execution.result-mode";
pub const ROCKSDB_MANAGED: &str = "state.backend.rocksdb.memory.managed";
pub const ROCKSDB_PER_SLOT: &str = "state.backend.rocksdb.memory.fixed-per-slot";
pub const ROCKSDB_BLOOM: &str = "state.backend.rocksdb.use-bloom-filter";
pub const ROCKSDB_BLOCK_CACHE: &str = "state.backend.rocksdb.block.cache-size";
pub const ROCKSDB_WRITE_BUFFER: &str = "state.backend.rocksdb.writebuffer.size";
pub const RESTART_STRATEGY: &str = "restart-strategy.type";
pub const RESTART_ATTEMPTS: &str = "restart-strategy.fixed-delay.attempts";
pub const RESTART_DELAY: &str = "restart-strategy.fixed-delay.delay";
pub const RESTART_RATE_MAX: &str = "restart-strategy.failure-rate.max-failures-per-interval";
pub const RESTART_RATE_INTERVAL: &str = "restart-strategy.failure-rate.failure-rate-interval";
pub const RESTART_RATE_DELAY: &str = "restart-strategy.failure-rate.delay";
pub const RESTART_EXP_INITIAL: &str = "restart-strategy.exponential-delay.initial-backoff";
pub const RESTART_EXP_MAX: &str = "restart-strategy.exponential-delay.max-backoff";
pub const RESTART_EXP_MULTIPLIER: &str = "restart-strategy.exponential-delay.backoff-multiplier";
pub const RESTART_EXP_RESET: &str = "restart-strategy.exponential-delay.reset-backoff-threshold";
pub const RESTART_EXP_JITTER: &str = "restart-strategy.exponential-delay.jitter-factor";
pub const RESTART_EXP_ATTEMPTS: &str = "restart-strategy.exponential-delay.attempts-before-reset-backoff";

/// Every key `SET` accepts. Unknown keys are rejected so a typo never
/// silently does nothing.
pub const JOB_OPTIONS: &[OptionSpec] = &[
    OptionSpec::new(
        RUNTIME_MODE,
        OptionKind::Enum(&["streaming", "batch", "automatic"]),
        "streaming: a continuous job emitting changes as they happen; batch: bounded sources only, \
         each query's final result once, as inserts; automatic: batch when every source is bounded",
    )
    .with_default("streaming"),
    OptionSpec::new(
        BATCH_MEMORY_LIMIT,
        OptionKind::MemorySize,
        "in batch mode, the memory aggregations, joins and sorts may hold before they spill to disk",
    )
    .with_default("1 gb"),
    OptionSpec::new(
        BATCH_SPILL,
        OptionKind::Bool,
        "in batch mode, whether operators spill to disk at the memory limit (false: the job fails there)",
    )
    .with_default("true"),
    OptionSpec::new(
        LOCAL_TIME_ZONE,
        OptionKind::String,
        "the session time zone: TIMESTAMP_LTZ values are cast, formatted and shown in it, LOCALTIMESTAMP and CURRENT_DATE read in it (a tz database id, 'GMT+hh:mm' or 'UTC')",
    )
    .with_default("UTC"),
    OptionSpec::new(
        PARALLELISM,
        OptionKind::Int { min: 1, max: 1024 },
        "subtasks per operator (default: number of cores)",
    ),
    OptionSpec::new(
        MAX_PARALLELISM,
        OptionKind::Int { min: 1, max: 32768 },
        "number of key groups: the upper bound for rescaling keyed state",
    )
    .with_default("128"),
    OptionSpec::new(
        "allowed-directories",
        OptionKind::String,
        "narrows where this session's SQL may read and write files: comma-separated directories, \
         each inside the allowed ones (weir serve --allow-dir)",
    ),
    OptionSpec::new(
        PIPELINE_NAME,
        OptionKind::String,
        "the job's name and identity (default: derived from the file or statement)",
    ),
    OptionSpec::new(
        AUTO_WATERMARK_INTERVAL,
        OptionKind::Duration,
        "how often sources emit watermarks",
    )
    .with_default("200 ms"),
    OptionSpec::new(
        SOURCE_IDLE_TIMEOUT,
        OptionKind::Duration,
        "a source split without input for this long is idle (0 = never)",
    )
    .with_default("0 ms"),
    OptionSpec::new(
        STATE_BACKEND,
        OptionKind::Enum(&["rocksdb", "hashmap"]),
        "where keyed state lives",
    )
    .with_default("rocksdb"),
    OptionSpec::new(
        ROCKSDB_MANAGED,
        OptionKind::Bool,
        "all RocksDB instances of a job share one block cache and one write-buffer budget of 'state.backend.rocksdb.memory.fixed-per-slot' per parallel subtask",
    )
    .with_default("true"),
    OptionSpec::new(
        ROCKSDB_PER_SLOT,
        OptionKind::MemorySize,
        "RocksDB memory per parallel subtask (slot) with managed memory: half write buffers, the rest block cache (index and filter blocks included)",
    )
    .with_default("128 mb"),
    OptionSpec::new(
        ROCKSDB_BLOOM,
        OptionKind::Bool,
        "bloom filters (10 bits a key) on state keys, so reads of absent keys skip SST files",
    )
    .with_default("true"),
    OptionSpec::new(
        ROCKSDB_BLOCK_CACHE,
        OptionKind::MemorySize,
        "block cache of each RocksDB instance when memory is not managed",
    )
    .with_default("8 mb"),
    OptionSpec::new(
        ROCKSDB_WRITE_BUFFER,
        OptionKind::MemorySize,
        "memtable size of each column family when memory is not managed",
    )
    .with_default("64 mb"),
    OptionSpec::new(
        ALIGNMENT_BUFFER_SIZE,
        OptionKind::Int { min: 0, max: 1000 },
        "update intervals a split may run past the allowed drift before it is paused (0: pause at once)",
    )
    .with_default("3"),
    OptionSpec::new(
        ALLOW_UNALIGNED_SPLITS,
        OptionKind::Bool,
        "pause a whole source reader when its connector cannot pause single splits (right only with one split per reader)",
    )
    .with_default("false"),
    OptionSpec::new(
        ALIGNMENT_SPREAD_ALERT,
        OptionKind::Duration,
        "log a warning when the watermark spread of an alignment group stays above this (default: twice the max drift)",
    ),
    OptionSpec::new(
        ALIGNMENT_STATE_BUDGET,
        OptionKind::MemorySize,
        "state budget SHOW WATERMARKS sizes the max drift for, e.g. '2 gb'",
    ),
    OptionSpec::new(
        CHECKPOINT_INTERVAL,
        OptionKind::Duration,
        "take a checkpoint this often (absent: checkpointing off)",
    ),
    OptionSpec::new(
        CHECKPOINT_TIMEOUT,
        OptionKind::Duration,
        "a checkpoint not complete after this long is aborted",
    )
    .with_default("10 min"),
    OptionSpec::new(
        CHECKPOINT_MIN_PAUSE,
        OptionKind::Duration,
        "least time between the end of one checkpoint and the start of the next",
    )
    .with_default("0 ms"),
    OptionSpec::new(
        CHECKPOINT_MAX_CONCURRENT,
        OptionKind::Int { min: 1, max: 1 },
        "checkpoints in flight at once (only 1 is supported)",
    )
    .with_default("1"),
    OptionSpec::new(
        CHECKPOINT_TOLERABLE,
        OptionKind::Int { min: 0, max: i32::MAX as i64 },
        "consecutive failed checkpoints tolerated before the job fails",
    )
    .with_default("0"),
    OptionSpec::new(
        CHECKPOINT_RETAINED,
        OptionKind::Int { min: 1, max: 1000 },
        "completed checkpoints kept (2 by default, so a corrupt latest one can fall back)",
    )
    .with_default("2"),
    OptionSpec::new(
        CHECKPOINT_DIR,
        OptionKind::Location,
        "where checkpoints are written: a directory or an s3://, gs://, az:// URL (default: <data-dir>/checkpoints); one directory per job below it",
    ),
    OptionSpec::new(
        S3_ENDPOINT,
        OptionKind::String,
        "an S3-compatible endpoint for s3:// locations ('http://' allows plain HTTP); default: AWS",
    ),
    OptionSpec::new(
        S3_ACCESS_KEY,
        OptionKind::String,
        "the access key for s3:// locations (default: the AWS credential chain)",
    ),
    OptionSpec::new(
        S3_SECRET_KEY,
        OptionKind::String,
        "the secret key for s3:// locations (masked when shown)",
    ),
    OptionSpec::new(S3_REGION, OptionKind::String, "the region of s3:// locations (default: AWS_REGION, else us-east-1)"),
    OptionSpec::new(
        S3_PATH_STYLE,
        OptionKind::Bool,
        "address s3:// buckets by path (http://host/bucket), as most S3-compatible servers want",
    ),
    OptionSpec::new(
        CHECKPOINT_MODE,
        OptionKind::Enum(&["EXACTLY_ONCE", "AT_LEAST_ONCE"]),
        "EXACTLY_ONCE aligns barriers; AT_LEAST_ONCE only counts them (duplicates after a restore)",
    )
    .with_default("EXACTLY_ONCE"),
    OptionSpec::new(
        CHECKPOINT_UNALIGNED,
        OptionKind::Bool,
        "barriers overtake in-flight data, which is stored in the checkpoint (exactly-once only)",
    )
    .with_default("false"),
    OptionSpec::new(
        ALIGNED_TIMEOUT,
        OptionKind::Duration,
        "with unaligned checkpoints: align first, switch to unaligned after this (0: always unaligned)",
    )
    .with_default("0 s"),
    OptionSpec::new(ALIGNED_TIMEOUT_DEPRECATED, OptionKind::Duration, "deprecated name of aligned-checkpoint-timeout"),
    OptionSpec::new(
        STATE_INCREMENTAL,
        OptionKind::Bool,
        "RocksDB checkpoints upload only SST files the previous checkpoint does not hold",
    )
    .with_default("true"),
    OptionSpec::new(CHECKPOINT_INCREMENTAL, OptionKind::Bool, "Flink 2.x name of state.backend.incremental"),
    OptionSpec::new(
        RECOVERY_PATH,
        OptionKind::Location,
        "start the job from this savepoint or checkpoint directory (chk-N), local or an s3://, gs://, az:// URL, instead of its latest",
    ),
    OptionSpec::new(
        CLAIM_MODE,
        OptionKind::Enum(&["NO_CLAIM", "CLAIM"]),
        "NO_CLAIM never modifies or deletes the restored snapshot (the first checkpoint after it is full); \
         CLAIM hands it to the job, which deletes it once a newer checkpoint completes",
    )
    .with_default("NO_CLAIM"),
    OptionSpec::new(
        IGNORE_UNCLAIMED_STATE,
        OptionKind::Bool,
        "restore even when the snapshot holds state no operator of the query claims (it is dropped)",
    )
    .with_default("false"),
    OptionSpec::new(
        SAVEPOINT_DIR,
        OptionKind::Location,
        "default directory of savepoints, or an s3://, gs://, az:// URL (default: <data-dir>/savepoints/<job>)",
    ),
    OptionSpec::new(
        CHECKPOINT_RETENTION,
        OptionKind::Enum(&["DELETE_ON_CANCELLATION", "RETAIN_ON_CANCELLATION"]),
        "whether a job's checkpoints are deleted when it is stopped or cancelled (they always stay when it fails)",
    )
    .with_default("DELETE_ON_CANCELLATION"),
    OptionSpec::new(
        OPERATOR_UIDS,
        OptionKind::String,
        "explicit operator uids, 'selector=uid,...': selectors window, window#2, limit, source:<table>, \
         sink:<table>; keeps an operator's state across query changes that would change its derived uid",
    ),
    OptionSpec::new(
        WINDOW_BUFFER_LIMIT,
        OptionKind::Int { min: 1, max: i32::MAX as i64 },
        "with RocksDB state: (key, window) groups a window aggregate pre-aggregates in memory before it writes them to RocksDB",
    )
    .with_default("500000"),
    OptionSpec::new(
        RESULT_MODE,
        OptionKind::Enum(&["table", "changelog", "tableau"]),
        "how the shell shows results: 'table' a materialized view updated in place (default for updating queries \
         in the interactive shell), 'changelog' and 'tableau' every change as it comes (with its op)",
    ),
    OptionSpec::new(
        STATE_TTL,
        OptionKind::Duration,
        "state of non-windowed operators (GROUP BY, joins, Top-N) not written for this long expires; 0 = never",
    )
    .with_default("0 ms"),
    OptionSpec::new(
        MINI_BATCH_ENABLED,
        OptionKind::Bool,
        "GROUP BY applies each input batch's changes to a key at once and emits the key's result once per batch (Flink's mini-batch); needs allow-latency and size",
    )
    .with_default("false"),
    OptionSpec::new(
        MINI_BATCH_LATENCY,
        OptionKind::Duration,
        "with mini-batch: how long changes may wait to be applied (> 0; Weir applies each input batch as it comes, never later)",
    )
    .with_default("0 ms"),
    OptionSpec::new(
        MINI_BATCH_SIZE,
        OptionKind::Int { min: -1, max: i64::MAX },
        "with mini-batch: the most rows applied at once (> 0)",
    )
    .with_default("-1"),
    OptionSpec::new(
        WINDOW_SLICING,
        OptionKind::Bool,
        "HOP and CUMULATE rows update one slice each and windows merge their slices when they fire; false: each row updates every window it is in",
    )
    .with_default("true"),
    OptionSpec::new(
        RESTART_STRATEGY,
        OptionKind::Enum(&[
            "none",
            "off",
            "disable",
            "fixed-delay",
            "fixeddelay",
            "failure-rate",
            "failurerate",
            "exponential-delay",
            "exponentialdelay",
        ]),
        "what a failed job does (default: fixed-delay with checkpointing, none without)",
    ),
    OptionSpec::new(
        RESTART_RATE_MAX,
        OptionKind::Int { min: 1, max: i32::MAX as i64 },
        "failure-rate: restarts within the interval before the job fails for good",
    )
    .with_default("1"),
    OptionSpec::new(
        RESTART_RATE_INTERVAL,
        OptionKind::Duration,
        "failure-rate: the interval failures are counted in",
    )
    .with_default("1 min"),
    OptionSpec::new(RESTART_RATE_DELAY, OptionKind::Duration, "failure-rate: wait before a restart").with_default("1 s"),
    OptionSpec::new(
        RESTART_EXP_INITIAL,
        OptionKind::Duration,
        "exponential-delay: the first restart's wait",
    )
    .with_default("1 s"),
    OptionSpec::new(RESTART_EXP_MAX, OptionKind::Duration, "exponential-delay: the longest wait").with_default("1 min"),
    OptionSpec::new(
        RESTART_EXP_MULTIPLIER,
        OptionKind::Decimal,
        "exponential-delay: the wait grows by this after each failure (>= 1)",
    )
    .with_default("1.5"),
    OptionSpec::new(
        RESTART_EXP_RESET,
        OptionKind::Duration,
        "exponential-delay: a run this long without failure resets the wait and the attempts",
    )
    .with_default("1 h"),
    OptionSpec::new(
        RESTART_EXP_JITTER,
        OptionKind::Decimal,
        "exponential-delay: a random part of the wait, added or taken off (0 to 1)",
    )
    .with_default("0.1"),
    OptionSpec::new(
        RESTART_EXP_ATTEMPTS,
        OptionKind::Int { min: 1, max: i32::MAX as i64 },
        "exponential-delay: restarts before the job fails for good (counted since the last reset; default: no limit)",
    ),
    OptionSpec::new(
        RESTART_ATTEMPTS,
        OptionKind::Int { min: 0, max: i32::MAX as i64 },
        "restarts before the job fails for good",
    )
    .with_default("3"),
    OptionSpec::new(RESTART_DELAY, OptionKind::Duration, "wait before a restart").with_default("1 s"),
    OptionSpec::new(
        DML_SYNC,
        OptionKind::Bool,
        "INSERT waits for its job to finish before the next statement runs",
    )
    .with_default("false"),
];

/// Flink's restart strategies (`restart-strategy.type`); what they decide
/// is [`crate::runtime::restart::Restarts`]'.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RestartStrategy {
    None,
    FixedDelay {
        attempts: u32,
        delay: Duration,
    },
    FailureRate {
        max_failures: u32,
        interval: Duration,
        delay: Duration,
    },
    ExponentialDelay {
        initial: Duration,
        max: Duration,
        multiplier: f64,
        reset_threshold: Duration,
        jitter: f64,
        attempts: u32,
    },
}

/// How RocksDB instances use memory (Flink's `state.backend.rocksdb.*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RocksDbConfig {
    /// One budget for the job: `per_slot` × parallelism.
    pub managed: bool,
    pub per_slot: u64,
    pub bloom_filter: bool,
    /// Unmanaged: per instance.
    pub block_cache: u64,
    /// Unmanaged: per column family.
    pub write_buffer: u64,
}

impl Default for RocksDbConfig {
    fn default() -> Self {
        Self {
            managed: true,
            per_slot: 128 << 20,
            bloom_filter: true,
            block_cache: 8 << 20,
            write_buffer: 64 << 20,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateBackendKind {
    RocksDb,
    Heap,
}

/// Resolved options of one job.
#[derive(Debug, Clone)]
pub struct JobConfig {
    pub name: String,
    /// `execution.runtime-mode`.
    pub runtime_mode: RuntimeMode,
    /// `execution.batch.memory-limit`, bytes.
    pub batch_memory_limit: u64,
    /// `execution.batch.spill.enabled`.
    pub batch_spill: bool,
    /// A backfill chunk's `[from, to)` of event time, in ms: a batch job
    /// reads only the rows of its tables with a time attribute whose
    /// rowtime is in it (`weir backfill`; not a `SET` option).
    pub event_time_range: Option<(i64, i64)>,
    pub parallelism: usize,
    pub max_parallelism: u16,
    pub auto_watermark_interval: Duration,
    pub source_idle_timeout: Option<Duration>,
    pub state_backend: StateBackendKind,
    /// Samples a split's watermark ring holds for watermark alignment.
    pub alignment_buffer_size: usize,
    pub allow_unaligned_source_splits: bool,
    /// 0: twice the group's max drift.
    pub alignment_spread_alert_ms: i64,
    /// Where this job keeps its state (`<data-dir>/jobs/<name>`).
    pub job_dir: PathBuf,
    /// `None`: checkpointing off.
    pub checkpointing: Option<CheckpointConfig>,
    pub restart: RestartStrategy,
    /// `execution.state-recovery.path`.
    pub recovery_path: Option<PathBuf>,
    /// `execution.state-recovery.claim-mode` = CLAIM.
    pub claim: bool,
    pub ignore_unclaimed_state: bool,
    /// Where savepoints go by default.
    pub savepoint_dir: PathBuf,
    /// `s3.*`: how to reach S3 (and S3-compatible servers) for URLs of
    /// checkpoints, savepoints and recovery paths.
    pub s3: crate::checkpoint::objects::S3Settings,
    /// `RETAIN_ON_CANCELLATION`: checkpoints outlive a stop or cancel.
    pub retain_checkpoints: bool,
    /// `table.exec.window-agg.buffer-size-limit`.
    pub window_buffer_limit: usize,
    /// `table.exec.window-agg.slicing`.
    pub window_slicing: bool,
    /// `table.exec.mini-batch.*`: when enabled, the most rows a GROUP BY
    /// applies at once before it emits each key's result, or Flink's
    /// message when no size is set (an error only where a GROUP BY is).
    pub mini_batch_size: Option<std::result::Result<usize, String>>,
    /// `table.exec.state.ttl` (`None`: never).
    pub state_ttl: Option<Duration>,
    /// `state.backend.rocksdb.*`: memory and filters.
    pub rocksdb: RocksDbConfig,
    /// `pipeline.operator-uids`: (selector, uid).
    pub operator_uids: Vec<(String, String)>,
    /// Where the job's SQL may make Weir read and write files (checked for
    /// every path option of the job and of its tables).
    pub paths: crate::paths::PathPolicy,
    /// `table.local-time-zone` when it is not UTC.
    pub local_time_zone: Option<crate::time_zone::SessionZone>,
    /// Processing time (not an option: the wall clock, or a test's).
    pub clock: crate::clock::Clock,
    /// The job's workers when it is spread over processes (`weir worker`);
    /// `None`: every subtask in this process.
    pub cluster: Option<std::sync::Arc<crate::exchange::workers::Cluster>>,
}

/// `execution.runtime-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeMode {
    Streaming,
    Batch,
    /// Batch when every source of the job is bounded, else streaming.
    Automatic,
}

/// `table.local-time-zone`, read as Flink validates it (`None`: UTC).
pub fn local_time_zone(zone: &str) -> Result<Option<crate::time_zone::SessionZone>> {
    crate::time_zone::session_zone(zone).map_err(|message| {
        weir_catalog::CatalogError::InvalidOption {
            key: LOCAL_TIME_ZONE.into(),
            message,
        }
        .into()
    })
}

/// `table.exec.mini-batch.*`: the bundle size when enabled. Without a
/// latency every job is refused, as Flink refuses every streaming query;
/// without a size only a job with an operator that bundles rows is (the
/// message is kept for the GROUP BY's build), as in Flink.
fn mini_batch(o: &Options) -> Result<Option<std::result::Result<usize, String>>> {
    if !o.bool(MINI_BATCH_ENABLED)?.unwrap_or(false) {
        return Ok(None);
    }
    if o.duration(MINI_BATCH_LATENCY)?.is_none_or(|d| d.is_zero()) {
        return Err(ExecError::Config(format!(
            "MiniBatch Latency must be greater than 0 ms. (set '{MINI_BATCH_LATENCY}' with '{MINI_BATCH_ENABLED}')"
        )));
    }
    Ok(Some(match o.i64(MINI_BATCH_SIZE)? {
        Some(n) if n > 0 => Ok(n as usize),
        _ => Err(format!(
            "Key: '{MINI_BATCH_SIZE}' , default: -1 (fallback keys: []) must be > 0."
        )),
    }))
}

impl JobConfig {
    /// Checks one `SET` pair.
    pub fn validate_pair(key: &str, value: &str) -> Result<()> {
        let mut m = BTreeMap::new();
        m.insert(key.to_string(), value.to_string());
        Options::validate(&m, JOB_OPTIONS, "SET")?;
        if key == LOCAL_TIME_ZONE {
            local_time_zone(value)?;
        }
        if key == OPERATOR_UIDS {
            parse_pinned(value).map_err(|m| ExecError::Config(format!("'{OPERATOR_UIDS}': {m}")))?;
        }
        Ok(())
    }

    /// Checks that `key` is a known option (RESET of a value-less key).
    pub fn check_key(key: &str) -> Result<()> {
        if JOB_OPTIONS.iter().any(|s| s.matches(key)) {
            return Ok(());
        }
        Err(weir_catalog::CatalogError::UnknownOption {
            key: key.to_string(),
            context: "SET".into(),
            accepted: JOB_OPTIONS.iter().map(|s| s.key).collect::<Vec<_>>().join(", "),
        }
        .into())
    }

    pub fn from_settings(
        settings: &BTreeMap<String, String>,
        default_name: &str,
        data_dir: &std::path::Path,
    ) -> Result<Self> {
        let o = Options::validate(settings, JOB_OPTIONS, "SET")?;
        let local_time_zone = match o.get(LOCAL_TIME_ZONE) {
            Some(zone) => local_time_zone(zone)?,
            None => None,
        };
        let parallelism = match o.i64(PARALLELISM)? {
            Some(p) => p as usize,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        let max_parallelism = o.i64(MAX_PARALLELISM)?.unwrap_or(128) as u16;
        if parallelism > usize::from(max_parallelism) {
            return Err(ExecError::Config(format!(
                "'{PARALLELISM}' = {parallelism} exceeds '{MAX_PARALLELISM}' = {max_parallelism}"
            )));
        }
        let name = o.get(PIPELINE_NAME).unwrap_or(default_name).to_string();
        let idle = o.duration(SOURCE_IDLE_TIMEOUT)?.filter(|d| !d.is_zero());
        let state_backend = match o.enum_value(STATE_BACKEND).as_deref() {
            Some("hashmap") => StateBackendKind::Heap,
            _ => StateBackendKind::RocksDb,
        };
        let s3 = crate::checkpoint::objects::S3Settings {
            endpoint: o.get(S3_ENDPOINT).map(str::to_string),
            access_key: o.get(S3_ACCESS_KEY).map(str::to_string),
            secret_key: o.get(S3_SECRET_KEY).map(str::to_string),
            region: o.get(S3_REGION).map(str::to_string),
            path_style: o.bool(S3_PATH_STYLE)?,
        };
        let runtime_mode = match o.enum_value(RUNTIME_MODE).as_deref() {
            Some("batch") => RuntimeMode::Batch,
            Some("automatic") => RuntimeMode::Automatic,
            _ => RuntimeMode::Streaming,
        };
        // A batch job takes no checkpoints (as in Flink): a failed one
        // runs again from the start.
        let interval = o
            .duration(CHECKPOINT_INTERVAL)?
            .filter(|d| !d.is_zero() && runtime_mode != RuntimeMode::Batch);
        let checkpointing = match interval {
            None => None,
            Some(interval) => {
                let job = sanitize(&name);
                let (root, store) = match o.get(CHECKPOINT_DIR) {
                    Some(url) if crate::paths::is_object_url(url) => {
                        let store = crate::checkpoint::objects::open_url(url, &s3)
                            .map_err(|e| ExecError::Config(format!("'{CHECKPOINT_DIR}': {e}")))?
                            .below(&job);
                        let root = PathBuf::from(format!("{}/{job}", url.trim().trim_end_matches('/')));
                        let store: std::sync::Arc<dyn crate::checkpoint::store::CheckpointStore> =
                            std::sync::Arc::new(store);
                        (root, Some(store))
                    }
                    Some(d) => (local_path(d).join(&job), None),
                    None => (data_dir.join("checkpoints").join(&job), None),
                };
                let incremental = match (o.bool(STATE_INCREMENTAL)?, o.bool(CHECKPOINT_INCREMENTAL)?) {
                    (Some(a), Some(b)) if a != b => {
                        return Err(ExecError::Config(format!(
                            "'{STATE_INCREMENTAL}' = {a} and '{CHECKPOINT_INCREMENTAL}' = {b} disagree; set one"
                        )));
                    }
                    (a, b) => a.or(b).unwrap_or(true),
                };
                let mode = match o.enum_value(CHECKPOINT_MODE).as_deref() {
                    Some("at_least_once") => CheckpointMode::AtLeastOnce,
                    _ => CheckpointMode::ExactlyOnce,
                };
                let unaligned = o.bool(CHECKPOINT_UNALIGNED)?.unwrap_or(false);
                if unaligned && mode == CheckpointMode::AtLeastOnce {
                    return Err(ExecError::Config(format!(
                        "'{CHECKPOINT_UNALIGNED}' = true needs '{CHECKPOINT_MODE}' = EXACTLY_ONCE"
                    )));
                }
                let aligned_timeout = match o.duration(ALIGNED_TIMEOUT)? {
                    Some(d) => d,
                    None => o.duration(ALIGNED_TIMEOUT_DEPRECATED)?.unwrap_or_default(),
                };
                Some(CheckpointConfig {
                    unaligned,
                    aligned_timeout,
                    interval,
                    timeout: o.duration(CHECKPOINT_TIMEOUT)?.unwrap_or(Duration::from_secs(600)),
                    min_pause: o.duration(CHECKPOINT_MIN_PAUSE)?.unwrap_or_default(),
                    tolerable_failed: o.i64(CHECKPOINT_TOLERABLE)?.unwrap_or(0) as u32,
                    num_retained: o.i64(CHECKPOINT_RETAINED)?.unwrap_or(2) as usize,
                    root,
                    store,
                    s3: s3.clone(),
                    mode,
                    incremental,
                })
            }
        };
        let fixed_delay = RestartStrategy::FixedDelay {
            attempts: o.i64(RESTART_ATTEMPTS)?.unwrap_or(3) as u32,
            delay: o.duration(RESTART_DELAY)?.unwrap_or(Duration::from_secs(1)),
        };
        let restart = match o.enum_value(RESTART_STRATEGY).as_deref() {
            Some("fixed-delay" | "fixeddelay") => fixed_delay,
            Some("failure-rate" | "failurerate") => RestartStrategy::FailureRate {
                max_failures: o.i64(RESTART_RATE_MAX)?.unwrap_or(1) as u32,
                interval: o.duration(RESTART_RATE_INTERVAL)?.unwrap_or(Duration::from_secs(60)),
                delay: o.duration(RESTART_RATE_DELAY)?.unwrap_or(Duration::from_secs(1)),
            },
            Some("exponential-delay" | "exponentialdelay") => {
                let multiplier = o.decimal(RESTART_EXP_MULTIPLIER)?.unwrap_or(1.5);
                if multiplier < 1.0 {
                    return Err(ExecError::Config(format!(
                        "'{RESTART_EXP_MULTIPLIER}' = '{multiplier}': the wait must not shrink (expected >= 1)"
                    )));
                }
                let jitter = o.decimal(RESTART_EXP_JITTER)?.unwrap_or(0.1);
                if jitter > 1.0 {
                    return Err(ExecError::Config(format!(
                        "'{RESTART_EXP_JITTER}' = '{jitter}': expected a factor from 0 to 1"
                    )));
                }
                let initial = o.duration(RESTART_EXP_INITIAL)?.unwrap_or(Duration::from_secs(1));
                let max = o.duration(RESTART_EXP_MAX)?.unwrap_or(Duration::from_secs(60));
                if initial > max {
                    return Err(ExecError::Config(format!(
                        "'{RESTART_EXP_INITIAL}' ({initial:?}) is above '{RESTART_EXP_MAX}' ({max:?})"
                    )));
                }
                RestartStrategy::ExponentialDelay {
                    initial,
                    max,
                    multiplier,
                    reset_threshold: o.duration(RESTART_EXP_RESET)?.unwrap_or(Duration::from_secs(3600)),
                    jitter,
                    attempts: o.i64(RESTART_EXP_ATTEMPTS)?.map_or(u32::MAX, |a| a as u32),
                }
            }
            Some(_) => RestartStrategy::None,
            None if checkpointing.is_some() => fixed_delay,
            None => RestartStrategy::None,
        };
        Ok(Self {
            runtime_mode,
            batch_memory_limit: o.memory_size(BATCH_MEMORY_LIMIT)?.unwrap_or(1 << 30),
            batch_spill: o.bool(BATCH_SPILL)?.unwrap_or(true),
            event_time_range: None,
            checkpointing,
            restart,
            recovery_path: match o.get(RECOVERY_PATH) {
                Some(p) if crate::paths::is_object_url(p) => Some(PathBuf::from(p.trim().trim_end_matches('/'))),
                p => p.map(local_path),
            },
            claim: o.enum_value(CLAIM_MODE).as_deref() == Some("claim"),
            ignore_unclaimed_state: o.bool(IGNORE_UNCLAIMED_STATE)?.unwrap_or(false),
            savepoint_dir: match o.get(SAVEPOINT_DIR) {
                Some(d) if crate::paths::is_object_url(d) => PathBuf::from(d.trim().trim_end_matches('/')),
                Some(d) => local_path(d),
                None => data_dir.join("savepoints").join(sanitize(&name)),
            },
            s3,
            retain_checkpoints: o.enum_value(CHECKPOINT_RETENTION).as_deref() == Some("retain_on_cancellation"),
            window_buffer_limit: o.i64(WINDOW_BUFFER_LIMIT)?.unwrap_or(500_000) as usize,
            window_slicing: o.bool(WINDOW_SLICING)?.unwrap_or(true),
            mini_batch_size: mini_batch(&o)?,
            state_ttl: o.duration(STATE_TTL)?.filter(|d| !d.is_zero()),
            rocksdb: RocksDbConfig {
                managed: o.bool(ROCKSDB_MANAGED)?.unwrap_or(true),
                per_slot: o.memory_size(ROCKSDB_PER_SLOT)?.unwrap_or(128 << 20),
                bloom_filter: o.bool(ROCKSDB_BLOOM)?.unwrap_or(true),
                block_cache: o.memory_size(ROCKSDB_BLOCK_CACHE)?.unwrap_or(8 << 20),
                write_buffer: o.memory_size(ROCKSDB_WRITE_BUFFER)?.unwrap_or(64 << 20),
            },
            operator_uids: match o.get(OPERATOR_UIDS) {
                Some(v) => parse_pinned(v).map_err(|m| ExecError::Config(format!("'{OPERATOR_UIDS}': {m}")))?,
                None => vec![],
            },
            paths: crate::paths::PathPolicy::unrestricted(),
            local_time_zone,
            clock: crate::clock::Clock::Wall,
            cluster: None,
            job_dir: data_dir.join("jobs").join(sanitize(&name)),
            name,
            parallelism,
            max_parallelism,
            auto_watermark_interval: o
                .duration(AUTO_WATERMARK_INTERVAL)?
                .unwrap_or(Duration::from_millis(200)),
            source_idle_timeout: idle,
            state_backend,
            alignment_buffer_size: o.i64(ALIGNMENT_BUFFER_SIZE)?.unwrap_or(3) as usize,
            allow_unaligned_source_splits: o.bool(ALLOW_UNALIGNED_SPLITS)?.unwrap_or(false),
            alignment_spread_alert_ms: o.duration(ALIGNMENT_SPREAD_ALERT)?.map_or(0, |d| d.as_millis() as i64),
        })
    }
}

use crate::paths::local_path;

impl JobConfig {
    /// Restricts the job to `policy`: every path option in `settings` (the
    /// job's `SET` options) and the checkpoint directory must be allowed.
    pub fn restricted_to(
        mut self,
        policy: crate::paths::PathPolicy,
        settings: &BTreeMap<String, String>,
    ) -> std::result::Result<Self, crate::paths::PathDenied> {
        policy.check_options(settings, JOB_OPTIONS)?;
        if let Some(c) = &self.checkpointing {
            policy.check(CHECKPOINT_DIR, &c.root.to_string_lossy())?;
        }
        self.paths = policy;
        Ok(self)
    }
}

/// A job name as a directory name.
pub fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Parses `pipeline.operator-uids`: `selector=uid` pairs, comma-separated.
/// A uid is letters, digits, `-` and `_` (it names files and metadata
/// keys), and is given once.
pub fn parse_pinned(value: &str) -> Result<Vec<(String, String)>, String> {
    let mut out: Vec<(String, String)> = vec![];
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (sel, uid) = part
            .split_once('=')
            .ok_or_else(|| format!("'{part}' is not selector=uid"))?;
        let (sel, uid) = (sel.trim(), uid.trim());
        let kind_ok = matches!(
            sel.split(['#', ':']).next(),
            Some(
                "window"
                    | "group"
                    | "join"
                    | "rank"
                    | "limit"
                    | "calc"
                    | "union"
                    | "temporal_sort"
                    | "over_aggregate"
                    | "session_window"
                    | "upsert_materialize"
                    | "changelog_normalize"
                    | "source"
                    | "sink"
            )
        );
        if !kind_ok || sel.is_empty() {
            return Err(format!(
                "unknown selector '{sel}'; use a kind (window, group, join, rank, limit, calc, union, \
                 temporal_sort, over_aggregate, session_window, upsert_materialize, changelog_normalize), \
                 optionally with #N for the N-th, or source:<table> or sink:<table>"
            ));
        }
        if uid.is_empty() || !uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return Err(format!("uid '{uid}' must be letters, digits, '-' and '_'"));
        }
        if out.iter().any(|(_, u)| u == uid) {
            return Err(format!("uid '{uid}' is given twice"));
        }
        out.push((sel.to_string(), uid.to_string()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn restart(pairs: &[(&str, &str)]) -> Result<RestartStrategy> {
        let settings: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        JobConfig::from_settings(&settings, "job", std::path::Path::new("/tmp")).map(|c| c.restart)
    }

    #[test]
    fn flink_restart_strategies_parse_with_flinks_defaults() {
        assert_eq!(
            restart(&[(RESTART_STRATEGY, "failure-rate")]).expect("failure-rate"),
            RestartStrategy::FailureRate {
                max_failures: 1,
                interval: Duration::from_secs(60),
                delay: Duration::from_secs(1),
            }
        );
        assert_eq!(
            restart(&[(RESTART_STRATEGY, "exponential-delay"), (RESTART_EXP_ATTEMPTS, "4")]).expect("exponential"),
            RestartStrategy::ExponentialDelay {
                initial: Duration::from_secs(1),
                max: Duration::from_secs(60),
                multiplier: 1.5,
                reset_threshold: Duration::from_secs(3600),
                jitter: 0.1,
                attempts: 4,
            }
        );
    }

    #[test]
    fn a_bad_restart_option_is_refused_by_name() {
        for (key, value) in [
            (RESTART_EXP_MULTIPLIER, "0.5"),
            (RESTART_EXP_JITTER, "2"),
            (RESTART_EXP_MULTIPLIER, "fast"),
            (RESTART_EXP_MAX, "10 ms"),
        ] {
            let e = restart(&[(RESTART_STRATEGY, "exponential-delay"), (key, value)]).expect_err(value);
            assert!(e.to_string().contains(key), "{key} = {value}: {e}");
        }
        let e = restart(&[(RESTART_STRATEGY, "sometimes")]).expect_err("unknown strategy");
        assert!(e.to_string().contains("exponential-delay"), "{e}");
    }
}
