//! Checkpoint storage on a real S3 server (SeaweedFS on loopback, started
//! here): the layout's every operation through the object store, with a
//! file large enough to go up in parts.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use weir_engine::checkpoint::metadata::{CheckpointMetadata, FORMAT_VERSION, OperatorState};
use weir_engine::checkpoint::objects::ObjectCheckpointStore;
use weir_engine::checkpoint::store::{CheckpointStore, Created};
use weir_engine::checkpoint::{CheckpointError, CheckpointStorage, Fence};

fn s3(server: &common::S3Server, prefix: &str) -> ObjectCheckpointStore {
    let base = format!("s3://{}/{prefix}", server.bucket);
    ObjectCheckpointStore::new(Arc::new(server.client()), prefix, &base)
}

fn metadata(id: u64, operators: Vec<(&str, OperatorState)>) -> CheckpointMetadata {
    CheckpointMetadata {
        format: FORMAT_VERSION,
        checkpoint_id: id,
        job: "q5".into(),
        plan_fingerprint: "plan".into(),
        trigger_time_ms: 0,
        is_final: false,
        max_parallelism: 128,
        key_format: weir_engine::state::codec::FORMAT_VERSION,
        savepoint: None,
        operator_info: Default::default(),
        sources: Default::default(),
        operators: operators.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
    }
}

#[test]
fn checkpoints_live_on_an_s3_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("s3")).expect("dir");
    let server = common::s3_server(&dir.path().join("s3"));
    let store = Arc::new(s3(&server, "checkpoints/q5"));
    let storage = CheckpointStorage::on(store.clone(), PathBuf::from("s3://weir/checkpoints/q5"));
    assert_eq!(
        storage.next_id().expect("next id"),
        1,
        "an empty prefix has no checkpoint"
    );

    // Checkpoint 1: a 12 MiB SST (uploaded in parts), a small one and a
    // private file, then its metadata.
    let fence = Fence::claim(&storage).expect("claim a generation");
    assert!(fence.claim_id(1).expect("claim id 1"));
    let big: Vec<u8> = (0..(12u32 << 20)).map(|i| (i % 251) as u8).collect();
    let (big_src, small_src) = (dir.path().join("big.sst"), dir.path().join("small.sst"));
    std::fs::write(&big_src, &big).expect("write");
    std::fs::write(&small_src, b"small").expect("write");
    let big_ref = storage
        .upload(1, &big_src, "op-0-c1-000001.sst", true)
        .expect("upload big");
    assert_eq!(big_ref.size, big.len() as u64);
    let small_ref = storage
        .upload(1, &small_src, "op-0-c1-000002.sst", true)
        .expect("upload small");
    let heap = storage
        .write_private(1, "limit-0-heap.bin", b"counters")
        .expect("private");
    let files = [("000001.sst", big_ref.clone()), ("000002.sst", small_ref.clone())];
    let meta = metadata(
        1,
        vec![
            (
                "op/0",
                OperatorState::Rocksdb {
                    files: files.iter().map(|(n, f)| (n.to_string(), f.clone())).collect(),
                    key_groups: 0..128,
                    identity: "instance".into(),
                },
            ),
            ("limit/0", OperatorState::Heap { file: heap.clone() }),
        ],
    );
    storage.commit_metadata(&meta).expect("commit");
    fence.publish(1).expect("publish");
    assert_eq!(storage.complete_ids().expect("ids"), [1]);

    // Another client (a new machine) finds it, verifies it and downloads
    // it byte for byte.
    let again = CheckpointStorage::on(
        Arc::new(s3(&server, "checkpoints/q5")),
        PathBuf::from("s3://weir/checkpoints/q5"),
    );
    let loaded = again.load(1).expect("load");
    assert_eq!(loaded, meta);
    let local = dir.path().join("restored.sst");
    again.restore_file(&big_ref, &local).expect("restore");
    assert_eq!(std::fs::read(&local).expect("read"), big);
    assert_eq!(again.read_file(&heap).expect("read"), b"counters");

    // A file whose bytes differ from the metadata's is refused by name.
    store.put("shared/op-0-c1-000002.sst", b"SMALL").expect("overwrite");
    match again.read_file(&small_ref) {
        Err(CheckpointError::Corrupt { path, .. }) => {
            assert_eq!(path, "s3://weir/checkpoints/q5/shared/op-0-c1-000002.sst")
        }
        other => panic!("a changed file was read: {other:?}"),
    }
    store.put("shared/op-0-c1-000002.sst", b"small").expect("put back");

    // A failed attempt at 2 leaves nothing of its own and its id taken.
    assert!(fence.claim_id(2).expect("claim id 2"));
    storage
        .upload(2, &small_src, "op-0-c2-000003.sst", true)
        .expect("upload");
    storage.write_private(2, "limit-0-heap.bin", b"x").expect("private");
    storage
        .discard_attempt(2, &["op-0-c2-000003.sst".into()])
        .expect("discard");
    let left: Vec<String> = store.list("chk-2").expect("list").into_iter().map(|l| l.name).collect();
    assert_eq!(left, ["_claim"], "only the claim of the id is left");
    assert_eq!(storage.next_id().expect("next id"), 3);

    // Garbage collection keeps what checkpoint 1 references.
    let stray = storage
        .upload(1, &small_src, "op-0-c1-000004.sst", true)
        .expect("upload");
    storage.collect_garbage(&[&loaded]).expect("gc");
    assert_eq!(again.load(1).expect("load after gc"), meta);
    assert!(matches!(again.read_file(&stray), Err(CheckpointError::Missing { .. })));

    // Retained on cancellation: moved aside, still restorable there.
    let aside = storage
        .retain_aside(7, None)
        .expect("retain")
        .expect("something retained");
    assert_eq!(aside, PathBuf::from("s3://weir/checkpoints/q5/retained-7"));
    assert!(storage.complete_ids().expect("ids").is_empty());
    let retained = CheckpointStorage::on(
        Arc::new(s3(&server, "checkpoints/q5/retained-7")),
        PathBuf::from("s3://weir/checkpoints/q5/retained-7"),
    );
    assert_eq!(retained.load(1).expect("load retained"), meta);
    storage.clear(None).expect("clear");
}

/// The fence's primitive on a real server: of writers racing to create
/// one key, exactly one does, and every other reads the winner's bytes.
#[test]
fn of_writers_racing_to_create_one_key_on_s3_exactly_one_wins() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = common::s3_server(dir.path());
    let stores: Vec<Arc<ObjectCheckpointStore>> = (0..8).map(|_| Arc::new(s3(&server, "fence"))).collect();
    for round in 0..10 {
        let key = format!("log/{round:020}.json");
        let results: Vec<(usize, Created)> = std::thread::scope(|s| {
            let handles: Vec<_> = stores
                .iter()
                .enumerate()
                .map(|(w, store)| {
                    let key = key.clone();
                    s.spawn(move || (w, store.create(&key, format!("writer {w}").as_bytes()).expect("create")))
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        let winners: Vec<usize> = results
            .iter()
            .filter(|(_, c)| *c == Created::Created)
            .map(|(w, _)| *w)
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        let winner = format!("writer {}", winners[0]).into_bytes();
        assert!(
            results
                .iter()
                .all(|(_, c)| *c == Created::Created || *c == Created::Exists(winner.clone())),
            "round {round}: {results:?}"
        );
    }
}

/// Runs `weir run` on `sql` with its own data directory below `dir`;
/// panics with its output if it fails.
fn weir_run(dir: &std::path::Path, name: &str, sql: &str) {
    let file = dir.join(format!("{name}.sql"));
    std::fs::write(&file, sql).expect("write sql");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .arg("--data-dir")
        .arg(dir.join(format!("data-{name}")))
        .arg("run")
        .arg(&file)
        .env_remove("WEIR_FAILPOINTS")
        .output()
        .expect("run weir");
    assert!(
        out.status.success(),
        "weir run {name} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The JSON rows of the visible part files below `dir` (partition
/// directories `k=v` add their column), sorted.
fn json_rows(dir: &std::path::Path) -> Vec<String> {
    let mut rows = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with('.') || name.starts_with('_') {
                continue;
            }
            if e.path().is_dir() {
                stack.push(e.path());
                continue;
            }
            let text = std::fs::read_to_string(e.path()).expect("read part");
            rows.extend(text.lines().filter(|l| !l.is_empty()).map(str::to_string));
        }
    }
    rows.sort();
    rows
}

/// Tables on an S3 server, through `weir run` as a user writes them: with
/// checkpoints (parts staged as multipart uploads, completed at
/// checkpoints) a json table, a partitioned parquet table (committed
/// partitions get a `_SUCCESS` object) and a debezium-json changelog of an
/// aggregate; without, a csv table (each part put when the job ends).
/// Then all are read back into local files (several objects per table:
/// several splits; partition values from the key's `k=v` segments; one
/// big json object cut into byte ranges): the rows are the input's, the
/// changes the changelog's, nothing hidden is left in the bucket and no
/// multipart upload is open. A path naming nothing is an error, not an
/// empty table.
#[test]
fn tables_are_written_to_and_read_back_from_an_s3_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("s3")).expect("dir");
    let server = common::s3_server(&dir.path().join("s3"));
    let input = dir.path().join("in");
    std::fs::create_dir_all(&input).expect("input dir");
    let mut expected = vec![];
    let mut text = String::new();
    // ~24 MB: a writer's part of the table written without checkpoints
    // (one part per writer) is larger than an upload part (8 MiB).
    let pad = "x".repeat(100);
    for i in 0..200_000 {
        let row = format!("{{\"id\":{i},\"name\":\"n\\\"{}{pad}\",\"k\":\"p{}\"}}", i * 7, i % 3);
        text.push_str(&row);
        text.push('\n');
        expected.push(row);
    }
    expected.sort();
    std::fs::write(input.join("rows.json"), text).expect("input");
    let b = &server.bucket;
    let settings = server.checkpoint_settings();
    let tables = format!(
        "CREATE TABLE s3_json (id BIGINT, name STRING, k STRING)
  WITH ('connector' = 'filesystem', 'path' = 's3://{b}/tables/json', 'format' = 'json');
CREATE TABLE s3_pq (id BIGINT, name STRING, k STRING) PARTITIONED BY (k)
  WITH ('connector' = 'filesystem', 'path' = 's3://{b}/tables/pq/', 'format' = 'parquet',
        'sink.partition-commit.policy.kind' = 'success-file');
CREATE TABLE s3_csv (id BIGINT, name STRING, k STRING)
  WITH ('connector' = 'filesystem', 'path' = 's3://{b}/tables/csv', 'format' = 'csv');
CREATE TABLE s3_cdc (k STRING, n BIGINT)
  WITH ('connector' = 'filesystem', 'path' = 's3://{b}/tables/cdc', 'format' = 'debezium-json');
"
    );
    weir_run(
        dir.path(),
        "write",
        &format!(
            "SET 'parallelism.default' = '2';
{settings}
{tables}
CREATE TABLE src (id BIGINT, name STRING, k STRING)
  WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'json');
SET 'execution.checkpointing.interval' = '50 ms';
INSERT INTO s3_json SELECT * FROM src;
INSERT INTO s3_pq SELECT * FROM src;
INSERT INTO s3_cdc SELECT k, COUNT(*) FROM src WHERE id % 1000 = 0 GROUP BY k;
RESET 'execution.checkpointing.interval';
INSERT INTO s3_csv SELECT * FROM src;
",
            input.display()
        ),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let client = server.client();
    let listed: Vec<(String, u64)> = rt.block_on(async {
        use futures::TryStreamExt;
        object_store::ObjectStore::list(&client, Some(&object_store::path::Path::from("tables")))
            .map_ok(|m| (m.location.to_string(), m.size))
            .try_collect()
            .await
            .expect("list")
    });
    let keys: Vec<String> = listed.iter().map(|(k, _)| k.clone()).collect();
    assert!(
        listed
            .iter()
            .any(|(k, size)| k.starts_with("tables/csv/") && *size > 8 << 20),
        "no part went up in several upload parts: {listed:?}"
    );
    assert!(
        keys.iter()
            .all(|k| !k.rsplit('/').next().unwrap_or_default().starts_with('.')),
        "hidden objects left: {keys:?}"
    );
    for t in ["json", "csv"] {
        let parts = keys
            .iter()
            .filter(|k| k.starts_with(&format!("tables/{t}/part-")))
            .count();
        assert!(
            parts >= 2,
            "{t}: {parts} part objects, not one per writer at least: {keys:?}"
        );
    }
    assert!(
        keys.iter().any(|k| k.starts_with("tables/pq/k=p0/part-")),
        "no partition prefix: {keys:?}"
    );
    // Each partition committed: its success object is there (and is not
    // read as data below).
    for p in ["p0", "p1", "p2"] {
        assert!(
            keys.contains(&format!("tables/pq/k={p}/_SUCCESS")),
            "partition k={p} has no success file: {keys:?}"
        );
    }
    assert!(server.multipart_uploads().is_empty(), "uploads left open");
    // One object of 24 MB read by two subtasks: two byte ranges, each
    // downloaded alone.
    rt.block_on(object_store::ObjectStoreExt::put(
        &client,
        &object_store::path::Path::from("one/rows.json"),
        object_store::PutPayload::from(std::fs::read(input.join("rows.json")).expect("input")),
    ))
    .expect("put");
    let back = |t: &str| dir.path().join(format!("back-{t}"));
    weir_run(
        dir.path(),
        "read",
        &format!(
            "SET 'parallelism.default' = '2';
{settings}
{tables}
CREATE TABLE back_json (id BIGINT, name STRING, k STRING) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'json');
CREATE TABLE back_pq (id BIGINT, name STRING, k STRING) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'json');
CREATE TABLE back_csv (id BIGINT, name STRING, k STRING) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'json');
CREATE TABLE s3_one (id BIGINT, name STRING, k STRING)
  WITH ('connector' = 'filesystem', 'path' = 's3://{b}/one/rows.json', 'format' = 'json', 'source.split.min-size' = '1048576');
CREATE TABLE back_one (id BIGINT, name STRING, k STRING) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'json');
CREATE TABLE back_cdc (k STRING, n BIGINT) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'debezium-json');
INSERT INTO back_cdc SELECT * FROM s3_cdc;
INSERT INTO back_one SELECT * FROM s3_one;
INSERT INTO back_json SELECT * FROM s3_json;
INSERT INTO back_pq SELECT id, name, k FROM s3_pq;
INSERT INTO back_csv SELECT * FROM s3_csv;
",
            back("json").display(),
            back("pq").display(),
            back("csv").display(),
            back("one").display(),
            back("cdc").display()
        ),
    );
    // A changelog written to S3 reads back as the same changes: the
    // envelopes in the bucket and those the read wrote locally are one
    // multiset (an update is a delete and an insert in both).
    let cdc_on_s3: Vec<String> = {
        let cdc = dir.path().join("cdc-on-s3");
        std::fs::create_dir_all(&cdc).expect("dir");
        for key in keys.iter().filter(|k| k.starts_with("tables/cdc/part-")) {
            let bytes = rt
                .block_on(async {
                    object_store::ObjectStoreExt::get(&client, &object_store::path::Path::from(key.as_str()))
                        .await?
                        .bytes()
                        .await
                })
                .expect("get");
            std::fs::write(cdc.join(key.replace('/', "_")), bytes).expect("write");
        }
        json_rows(&cdc)
    };
    assert!(
        cdc_on_s3.iter().any(|l| l.contains("\"op\":\"d\"")),
        "no update in the changelog: {cdc_on_s3:?}"
    );
    assert_eq!(json_rows(&back("cdc")), cdc_on_s3, "the changelog read back from S3");
    for t in ["json", "pq", "csv", "one"] {
        assert_eq!(json_rows(&back(t)), expected, "table {t} read back from S3");
    }
    // Nothing at the path: an error naming it.
    let file = dir.path().join("missing.sql");
    std::fs::write(
        &file,
        format!(
            "{settings}
CREATE TABLE nothing (id BIGINT) WITH ('connector' = 'filesystem', 'path' = 's3://{b}/no/such/table', 'format' = 'json');
CREATE TABLE sink (id BIGINT) WITH ('connector' = 'blackhole');
INSERT INTO sink SELECT * FROM nothing;
"
        ),
    )
    .expect("write sql");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .arg("--data-dir")
        .arg(dir.path().join("data-missing"))
        .arg("run")
        .arg(&file)
        .output()
        .expect("run weir");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains(&format!("s3://{b}/no/such/table")) && stderr.contains("no object"),
        "{stderr}"
    );
}
