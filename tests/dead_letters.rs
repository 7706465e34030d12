//! Dead letters (`'scan.dead-letter.path'`): CSV and JSON files with bad
//! lines of every kind (wrong number of fields, a word in a BIGINT column,
//! broken JSON, an invalid timestamp, a record split over two lines,
//! invalid UTF-8) are read by jobs with
//! and without checkpointing; the good rows reach the sink, every bad line
//! is in the dead-letter directory exactly once with its file, line, byte
//! offset, raw text and reason, and SHOW JOBS counts them.
//! (Exactly once across kills and restores: `tests/crash.rs`.)

use std::collections::BTreeMap;
use std::path::Path;

use arrow::array::{Array, StringArray, UInt64Array};
use weir::{Session, StatementResult};

/// Two CSV files (two splits: parallelism 2 reads them in two subtasks).
const CSV_A: &str = "1,a,10,2024-01-01 00:00:01.000
2,b,20
3,c,oops,2024-01-01 00:00:03.000
4,d,40,2024-01-01 00:00:04.000
5,e,50,not a time

6,f,60,2024-01-01 00:00:06.000
";
const CSV_B: &str = "7,g,70,2024-01-01 00:00:07.000
8,h,80,2024-01-01 00:00:08.000,extra
9,i,90,2024-01-01 00:00:09.000
";
const JSON: &str = r#"{"id":11,"user":"a","amount":1,"ts":"2024-01-01 00:00:01.000"}
{"id":12,"user":"b","amount":2,"ts":"2024-01-01 00:00:02.000"]
{"id":13,"user":"c","amount":"x","ts":"2024-01-01 00:00:03.000"}
{"id":14,"user":"d","amount":4,"ts":"yesterday"}
{"id":15,"user":"e","amount":5,"ts":"2024-01-01 00:00:05.000"}
{"id":16,"user":"f","amount":6,"ts":"2024-01-01
{"id":17,"user":"g","amount":
7,"ts":"2024-01-01 00:00:07.000"}
"#;

/// (table, file name, line) of every bad line, and a word its reason has.
const BAD: &[(&str, &str, u64, &str)] = &[
    ("orders_csv", "a.csv", 2, "number of fields"),
    ("orders_csv", "a.csv", 3, "oops"),
    ("orders_csv", "a.csv", 5, "not a time"),
    ("orders_csv", "b.csv", 2, "number of fields"),
    ("orders_json", "orders.json", 2, "invalid JSON record"),
    ("orders_json", "orders.json", 3, "invalid JSON record"),
    ("orders_json", "orders.json", 4, "invalid JSON record"),
    ("orders_json", "orders.json", 6, "invalid JSON record"),
    // Two halves of a record: joined they would decode as one.
    ("orders_json", "orders.json", 7, "invalid JSON record"),
    ("orders_json", "orders.json", 8, "invalid JSON record"),
];

fn script(dir: &Path, checkpointing: bool) -> String {
    let p = |name: &str| dir.join(name).display().to_string();
    format!(
        "SET 'parallelism.default' = '2';
SET 'table.dml-sync' = 'true';
{checkpoints}
CREATE TABLE orders_csv (id BIGINT, `user` STRING, amount BIGINT, ts TIMESTAMP(3))
WITH ('connector' = 'filesystem', 'path' = '{csv}', 'format' = 'csv', 'scan.dead-letter.path' = 'file://{dead}');
CREATE TABLE orders_json (id BIGINT, `user` STRING, amount BIGINT, ts TIMESTAMP(3))
WITH ('connector' = 'filesystem', 'path' = '{json}', 'format' = 'json', 'scan.dead-letter.path' = '{dead}');
CREATE TABLE good (id BIGINT, amount BIGINT, ts TIMESTAMP(3)) WITH ('connector' = 'filesystem', 'path' = '{out}', 'format' = 'csv');
SET 'pipeline.name' = 'csv-job';
INSERT INTO good SELECT id, amount, ts FROM orders_csv;
SET 'pipeline.name' = 'json-job';
INSERT INTO good SELECT id, amount, ts FROM orders_json;",
        checkpoints = if checkpointing {
            "SET 'execution.checkpointing.interval' = '50 ms';"
        } else {
            ""
        },
        csv = p("csv"),
        json = p("orders.json"),
        dead = p("dead"),
        out = p("out"),
    )
}

/// The lines of every visible file in `dir`.
fn visible_lines(dir: &Path) -> Vec<String> {
    let mut lines = vec![];
    for e in std::fs::read_dir(dir).expect("dir").flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        assert!(
            !name.starts_with('.'),
            "{name}: in-progress or pending file left behind"
        );
        let text = std::fs::read_to_string(e.path()).expect("read");
        lines.extend(text.lines().map(str::to_string));
    }
    lines
}

/// Byte offset of 1-based line `line` in `text`.
fn offset_of(text: &str, line: u64) -> u64 {
    text.split_inclusive('\n')
        .take(line as usize - 1)
        .map(|l| l.len() as u64)
        .sum()
}

/// `dead_letters` of each job in SHOW JOBS.
async fn dead_letter_counts(session: &mut Session) -> BTreeMap<String, u64> {
    let results = session.execute_sql("SHOW JOBS;").await.expect("show jobs");
    let Some(StatementResult::Rows(_, batches)) = results.into_iter().next() else {
        panic!("rows expected")
    };
    let mut counts = BTreeMap::new();
    for b in batches {
        let names = b
            .column_by_name("job_name")
            .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            .expect("job_name");
        let dead = b
            .column_by_name("dead_letters")
            .and_then(|c| c.as_any().downcast_ref::<UInt64Array>())
            .expect("dead_letters");
        for i in 0..b.num_rows() {
            counts.insert(names.value(i).to_string(), dead.value(i));
        }
    }
    counts
}

async fn run(checkpointing: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("csv")).expect("mkdir");
    std::fs::write(dir.path().join("csv/a.csv"), CSV_A).expect("write");
    std::fs::write(dir.path().join("csv/b.csv"), CSV_B).expect("write");
    std::fs::write(dir.path().join("orders.json"), JSON).expect("write");
    let mut session = Session::open(dir.path().join("data")).expect("session");
    session
        .execute_sql(&script(dir.path(), checkpointing))
        .await
        .expect("both jobs run to the end");

    let mut good: Vec<i64> = visible_lines(&dir.path().join("out"))
        .iter()
        .map(|l| l.split(',').next().and_then(|id| id.parse().ok()).expect("an id"))
        .collect();
    good.sort();
    assert_eq!(good, vec![1, 4, 6, 7, 9, 11, 15], "the good rows, once each");

    let letters: Vec<serde_json::Value> = visible_lines(&dir.path().join("dead"))
        .iter()
        .map(|l| serde_json::from_str(l).expect("a JSON object per line"))
        .collect();
    let shown = || letters.iter().map(|l| l.to_string()).collect::<Vec<_>>().join("\n");
    assert_eq!(letters.len(), BAD.len(), "one dead letter per bad line:\n{}", shown());
    for (table, file, line, word) in BAD {
        let matching: Vec<&serde_json::Value> = letters
            .iter()
            .filter(|l| {
                l["table"] == *table && l["file"].as_str().is_some_and(|f| f.ends_with(file)) && l["line"] == *line
            })
            .collect();
        assert_eq!(matching.len(), 1, "{table} {file}:{line} exactly once:\n{}", shown());
        let l = matching[0];
        let path = l["file"].as_str().unwrap_or_default();
        let text = std::fs::read_to_string(path).expect("the file the letter names");
        let raw = text.lines().nth(*line as usize - 1).unwrap_or_default();
        assert_eq!(l["raw"], raw, "{table} {file}:{line} keeps its text");
        assert_eq!(l["raw_bytes"], raw.len());
        assert_eq!(
            l["byte_offset"],
            offset_of(&text, *line),
            "{table} {file}:{line} byte offset"
        );
        let reason = l["reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains(word),
            "{table} {file}:{line}: reason '{reason}' lacks '{word}'"
        );
    }

    let counts = dead_letter_counts(&mut session).await;
    assert_eq!(counts.get("csv-job"), Some(&4), "{counts:?}");
    assert_eq!(counts.get("json-job"), Some(&6), "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_lines_are_dead_lettered_once_each_with_checkpointing() {
    run(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_lines_are_dead_lettered_once_each_without_checkpointing() {
    run(false).await;
}

/// A line that is not UTF-8 is a bad record too, not an I/O error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_that_is_not_utf8_is_a_dead_letter() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("in.csv");
    std::fs::write(&input, b"1,a\n2,\xff\xfeb\n3,c\n").expect("write");
    let sql = format!(
        "SET 'table.dml-sync' = 'true';
CREATE TABLE t (id BIGINT, s STRING)
WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv', 'scan.dead-letter.path' = '{}');
CREATE TABLE o (id BIGINT) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');
INSERT INTO o SELECT id FROM t;",
        input.display(),
        dir.path().join("dead").display(),
        dir.path().join("out").display()
    );
    let mut session = Session::open(dir.path().join("data")).expect("session");
    session.execute_sql(&sql).await.expect("job");
    let mut ids = visible_lines(&dir.path().join("out"));
    ids.sort();
    assert_eq!(ids, vec!["1", "3"]);
    let letters = visible_lines(&dir.path().join("dead"));
    assert_eq!(letters.len(), 1, "{letters:?}");
    let l: serde_json::Value = serde_json::from_str(&letters[0]).expect("json");
    assert_eq!(l["line"], 2);
    assert_eq!(l["byte_offset"], 4);
    assert_eq!(l["raw"], "2,\u{fffd}\u{fffd}b");
    assert_eq!(l["raw_bytes"], 5);
    assert!(l["reason"].as_str().is_some_and(|r| r.contains("UTF-8")), "{l}");
}
