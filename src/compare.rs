//! `weir bench compare FILE.sql...`: the same Flink SQL on Weir and on
//! Flink 2.3, side by side, over the same input, runs alternating.
//!
//! Each engine runs as its own process: Weir as `weir run` (this binary),
//! credited with its whole wall time, start-up included; Flink through
//! `../shared/tools/flink/run_flink_sql.py` on a local mini-cluster,
//! credited with its job's net runtime (JVM and cluster start-up
//! excluded) and the JVM's CPU over the job's run (from its submission
//! to its end: the span its rows/s is measured over; the JVM's CPU from
//! planning on also counts SQL planning, code generation and the
//! mini-cluster's start, and divided into the rows made Flink look like
//! it used more cores than the machine has). Peak memory is
//! the peak RSS (`VmHWM`) of the Weir process and of Flink's JVM, sampled
//! from `/proc` every 20 ms.
//!
//! `${BIDS}` in a file is the many-keys bid CSV (generated on first use):
//! `--rows` bids of 10 000 auctions drawn uniformly, 10 bids per
//! millisecond of event time from 2024-01-01. `${NEXMARK_BID}`,
//! `${NEXMARK_AUCTION}` and `${NEXMARK_PERSON}` are directories of CSV
//! files of the Nexmark events Weir's generator makes for `--rows` events
//! (written once by `weir run`, so both engines read the same events).
//! Other `${NAME}`s come from `-D NAME=VALUE`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;

#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// Flink SQL files (DDL and one INSERT), e.g. benches/queries/*.sql.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Rows of the generated bids (`${BIDS}`), and the rows each query reads.
    #[arg(long, default_value_t = 5_000_000)]
    pub rows: u64,
    /// Runs of each engine, alternating.
    #[arg(long, default_value_t = 2)]
    pub runs: usize,
    #[arg(long, short = 'p', default_value_t = 1)]
    pub parallelism: usize,
    /// hashmap or rocksdb (both engines).
    #[arg(long, default_value = "hashmap")]
    pub state_backend: String,
    /// NAME=VALUE for `${NAME}` in the files.
    #[arg(short = 'D', value_name = "NAME=VALUE")]
    pub defines: Vec<String>,
    /// The Python of a venv with apache-flink 2.3.0 installed; without
    /// one, only Weir runs. Install: `python3 -m venv ~/.cache/flink23 &&
    /// ~/.cache/flink23/bin/pip install apache-flink==2.3.0`.
    /// Default: $FLINK_PYTHON, else ~/.cache/flink23/bin/python.
    #[arg(long)]
    pub flink_python: Option<PathBuf>,
    /// Flink's runner script.
    #[arg(long, default_value = "../shared/tools/flink/run_flink_sql.py")]
    pub flink_runner: PathBuf,
    /// Where inputs are generated (default: $BENCH_DIR, else
    /// ~/.cache/weir-bench).
    #[arg(long)]
    pub bench_dir: Option<PathBuf>,
}

/// One run of one engine.
#[derive(Debug, Clone, Copy)]
struct Figures {
    seconds: f64,
    cpu_seconds: f64,
    peak_rss_bytes: u64,
}

pub fn run_compare(args: &CompareArgs) -> i32 {
    match compare(args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

fn compare(args: &CompareArgs) -> Result<(), String> {
    let bench_dir = args
        .bench_dir
        .clone()
        .or_else(|| std::env::var_os("BENCH_DIR").map(PathBuf::from))
        .unwrap_or_else(|| home().join(".cache/weir-bench"))
        .join("compare");
    std::fs::create_dir_all(&bench_dir).map_err(|e| format!("{}: {e}", bench_dir.display()))?;
    let flink = flink_python(args);
    if flink.is_none() {
        eprintln!(
            "Flink is not installed: Weir only. To compare, install Flink 2.3 with\n  \
             python3 -m venv ~/.cache/flink23 && ~/.cache/flink23/bin/pip install apache-flink==2.3.0\n\
             and pass --flink-python ~/.cache/flink23/bin/python (or set FLINK_PYTHON)."
        );
    }
    let weir = std::env::current_exe().map_err(|e| format!("cannot find the weir binary: {e}"))?;
    println!(
        "{} | parallelism {} | state {} | {} rows | {}",
        machine(),
        args.parallelism,
        args.state_backend,
        args.rows,
        commit()
    );
    match startup(&weir, &bench_dir) {
        Ok(secs) => println!("Weir start-up, SQL file to first row (one-row CSV into print): {secs:.3} s\n"),
        Err(e) => eprintln!("start-up not measured: {e}"),
    }
    // The floor of the inputs the queries read: what any engine's reading
    // of the file costs at least.
    let mut floors = false;
    for (var, make) in [
        ("${BIDS}", bids_csv as fn(&Path, u64) -> Result<PathBuf, String>),
        ("${BIDS_JSON}", bids_json),
    ] {
        // Not when `-D` names another file for it.
        let name = &var[2..var.len() - 1];
        let mut used = !args
            .defines
            .iter()
            .any(|d| d.split_once('=').is_some_and(|(k, _)| k == name));
        let mut any = false;
        for file in &args.files {
            any |= std::fs::read_to_string(file).is_ok_and(|t| t.contains(var));
        }
        used &= any;
        if used {
            floors = true;
            let path = make(&bench_dir, args.rows)?;
            let (secs, records) = floor(&path)?;
            println!(
                "Floor of {var} ({}): read and split into records and fields, no parsing, one thread: {secs:.3} s, {:.0} rows/s",
                path.display(),
                records as f64 / secs
            );
        }
    }
    if floors {
        println!();
    }
    println!(
        "| query | engine | run | seconds | rows/s | CPU s | CPU s per M rows | peak RSS MB |\n|---|---|---:|---:|---:|---:|---:|---:|"
    );
    let mut summary = vec![];
    let mut failed = false;
    for file in &args.files {
        let name = file
            .file_stem()
            .map_or("query".into(), |s| s.to_string_lossy().to_string());
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let body = substitute(&text, args, &bench_dir)?;
        let work = tempfile::tempdir().map_err(|e| e.to_string())?;
        let weir_sql = work.path().join("weir.sql");
        let flink_sql = work.path().join("flink.sql");
        write(
            &weir_sql,
            &format!(
                "SET 'parallelism.default' = '{}';\nSET 'state.backend.type' = '{}';\nSET 'table.dml-sync' = 'true';\n{body}",
                args.parallelism, args.state_backend
            ),
        )?;
        write(&flink_sql, &body)?;
        let (mut w, mut f) = (vec![], vec![]);
        for run in 1..=args.runs {
            let data = work.path().join(format!("data-{run}"));
            // A query one engine cannot run is reported and the others go on.
            match run_weir(&weir, &data, &weir_sql) {
                Ok(fig) => {
                    print_row(&name, "Weir", run, args.rows, &fig);
                    w.push(fig);
                }
                Err(e) => {
                    failed = true;
                    eprintln!("{name}: {e}");
                    println!("| {name} | Weir | {run} | failed | | | | |");
                }
            }
            if let Some(py) = &flink {
                match run_flink(py, args, &flink_sql) {
                    Ok(fig) => {
                        print_row(&name, "Flink 2.3", run, args.rows, &fig);
                        f.push(fig);
                    }
                    Err(e) => {
                        eprintln!("{name}: {e}");
                        println!("| {name} | Flink 2.3 | {run} | failed | | | | |");
                    }
                }
            }
        }
        if let Some(w) = best(&w) {
            summary.push((name, w, best(&f)));
        }
    }
    println!(
        "\nBest run of each (rows/s, CPU s per M rows, peak RSS):\n\n| query | Weir rows/s | Flink rows/s | Weir / Flink | Weir CPU s/M | Flink CPU s/M | Weir MB | Flink MB |\n|---|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (name, w, f) in summary {
        let rate = |x: &Figures| args.rows as f64 / x.seconds;
        let cpu = |x: &Figures| x.cpu_seconds / (args.rows as f64 / 1e6);
        let mb = |x: &Figures| x.peak_rss_bytes as f64 / 1e6;
        match f {
            Some(f) => println!(
                "| {name} | {:.0} | {:.0} | {:.1}× | {:.2} | {:.2} | {:.0} | {:.0} |",
                rate(&w),
                rate(&f),
                rate(&w) / rate(&f),
                cpu(&w),
                cpu(&f),
                mb(&w),
                mb(&f)
            ),
            None => println!("| {name} | {:.0} | | | {:.2} | | {:.0} | |", rate(&w), cpu(&w), mb(&w)),
        }
    }
    if failed {
        return Err("a query failed on Weir (see above)".into());
    }
    Ok(())
}

fn best(runs: &[Figures]) -> Option<Figures> {
    runs.iter().copied().min_by(|a, b| a.seconds.total_cmp(&b.seconds))
}

fn print_row(query: &str, engine: &str, run: usize, rows: u64, f: &Figures) {
    println!(
        "| {query} | {engine} | {run} | {:.2} | {:.0} | {:.2} | {:.2} | {:.0} |",
        f.seconds,
        rows as f64 / f.seconds,
        f.cpu_seconds,
        f.cpu_seconds / (rows as f64 / 1e6),
        f.peak_rss_bytes as f64 / 1e6
    );
}

fn home() -> PathBuf {
    std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from)
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

fn flink_python(args: &CompareArgs) -> Option<PathBuf> {
    let py = args
        .flink_python
        .clone()
        .or_else(|| std::env::var_os("FLINK_PYTHON").map(PathBuf::from))
        .unwrap_or_else(|| home().join(".cache/flink23/bin/python"));
    (py.is_file() && args.flink_runner.is_file()).then_some(py)
}

/// `${BIDS}` (generated if missing) and `-D` values substituted; an
/// unknown `${NAME}` is an error naming it.
fn substitute(text: &str, args: &CompareArgs, bench_dir: &Path) -> Result<String, String> {
    let mut out = text.to_string();
    for d in &args.defines {
        let (k, v) = d
            .split_once('=')
            .ok_or_else(|| format!("-D {d}: expected NAME=VALUE"))?;
        out = out.replace(&format!("${{{k}}}"), v);
    }
    if out.contains("${BIDS}") {
        let bids = bids_csv(bench_dir, args.rows)?;
        out = out.replace("${BIDS}", &bids.display().to_string());
    }
    if out.contains("${BIDS_JSON}") {
        let bids = bids_json(bench_dir, args.rows)?;
        out = out.replace("${BIDS_JSON}", &bids.display().to_string());
    }
    if out.contains("${BIDS_NARROW}") {
        let bids = bids_narrow_csv(bench_dir, args.rows)?;
        out = out.replace("${BIDS_NARROW}", &bids.display().to_string());
    }
    if out.contains("${AUCTIONS}") {
        let auctions = auctions_csv(bench_dir)?;
        out = out.replace("${AUCTIONS}", &auctions.display().to_string());
    }
    if out.contains("${NEXMARK_") {
        let dir = nexmark_csv(bench_dir, args.rows)?;
        for table in ["bid", "auction", "person"] {
            let name = format!("${{NEXMARK_{}}}", table.to_ascii_uppercase());
            out = out.replace(&name, &dir.join(table).display().to_string());
        }
    }
    if let Some(i) = out.find("${") {
        let name: String = out[i + 2..].chars().take_while(|c| *c != '}').collect();
        return Err(format!("${{{name}}} is not defined: pass -D {name}=VALUE"));
    }
    Ok(out)
}

/// The many-keys bid CSV with `rows` rows (deterministic), made once, in
/// the shape of Nexmark's bids: `auction, bidder, price, channel, url,
/// dateTime, extra`, strings as Weir's Nexmark generator makes them (half
/// the channels the four hot ones, the rest of 10 000 with their URLs;
/// `extra` padding a bid to 100 bytes on average), but 10 000 auctions
/// and 100 000 bidders drawn uniformly (many keys, no hot key), 10 bids
/// per millisecond of event time.
pub fn bids_csv(dir: &Path, rows: u64) -> Result<PathBuf, String> {
    bids_nexmark(&dir.join(format!("bids-nexmark-uniform10k-{rows}.csv")), rows, false)
}

/// The rows of [`bids_csv`] as JSON lines (`${BIDS_JSON}`), one object per
/// bid with the columns' names, `dateTime` in the form Flink's JSON format
/// reads TIMESTAMP(3) by default (`json.timestamp-format.standard` 'SQL':
/// `yyyy-MM-dd HH:mm:ss.SSS`).
pub fn bids_json(dir: &Path, rows: u64) -> Result<PathBuf, String> {
    bids_nexmark(&dir.join(format!("bids-nexmark-uniform10k-{rows}.json")), rows, true)
}

fn bids_nexmark(path: &Path, rows: u64, json: bool) -> Result<PathBuf, String> {
    use weir_engine::connectors::nexmark::generator;
    let mut rng = generator::Rng::new(7, 0);
    let mut channels: std::collections::HashMap<u64, (String, String)> = std::collections::HashMap::new();
    let mut extra = String::new();
    bids_file(path, rows, |out, stamp| {
        let auction = rng.below(10_000);
        let bidder = rng.below(100_000);
        let price = 1 + rng.below(9_999);
        // As the Nexmark generator: a hot channel half the time.
        let channel = if rng.below(2) > 0 {
            rng.below(4)
        } else {
            4 + rng.below(10_000)
        };
        let (name, url) = channels
            .entry(channel)
            .or_insert_with(|| generator::channel_and_url(channel));
        extra.clear();
        rng.push_extra(&mut extra, generator::BID_FIXED_BYTES + name.len() + url.len(), 100);
        if json {
            let text = |v: &str| serde_json::Value::from(v).to_string();
            writeln!(
                out,
                "{{\"auction\":{auction},\"bidder\":{bidder},\"price\":{price},\"channel\":{},\"url\":{},\"dateTime\":\"{stamp}\",\"extra\":{}}}",
                text(name),
                text(url),
                text(&extra)
            )
        } else {
            writeln!(out, "{auction},{bidder},{price},{name},{url},{stamp},{extra}")
        }
    })
}

/// What reading `path` costs at least: the file read and split into
/// records and fields by a minimal loop (a byte count of line breaks and
/// commas, no parsing, no Arrow, one thread). Returns the best of two
/// reads' seconds (the page cache warm) and the records.
fn floor(path: &Path) -> Result<(f64, u64), String> {
    use std::io::Read;
    let io = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut best = f64::MAX;
    let mut records = 0;
    for _ in 0..2 {
        let started = Instant::now();
        let mut f = std::fs::File::open(path).map_err(io)?;
        let mut buf = vec![0u8; 1 << 22];
        let (mut lines, mut fields) = (0u64, 0u64);
        loop {
            let n = f.read(&mut buf).map_err(io)?;
            if n == 0 {
                break;
            }
            for &b in &buf[..n] {
                lines += u64::from(b == b'\n');
                fields += u64::from(b == b',');
            }
        }
        std::hint::black_box(fields);
        best = best.min(started.elapsed().as_secs_f64());
        records = lines;
    }
    Ok((best, records))
}

/// The narrow variant of [`bids_csv`] (`${BIDS_NARROW}`): 10 000 auctions
/// drawn uniformly, prices and times, three numeric columns and no strings
/// (the shape earlier figures were measured on; it flatters a CSV reader).
pub fn bids_narrow_csv(dir: &Path, rows: u64) -> Result<PathBuf, String> {
    let path = dir.join(format!("bids-uniform10k-{rows}.csv"));
    let mut state = 7u64;
    let mut next = move || {
        // splitmix64
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    bids_file(&path, rows, |out, stamp| {
        writeln!(out, "{},{},{stamp}", next() % 10_000, 1 + next() % 9_999)
    })
}

/// Writes `path` once (through a temporary file, so a crash leaves no half
/// file): `rows` lines made by `line`, given the event time (10 rows per
/// millisecond from 2024-01-01).
fn bids_file(
    path: &Path,
    rows: u64,
    mut line: impl FnMut(&mut dyn Write, &str) -> std::io::Result<()>,
) -> Result<PathBuf, String> {
    if path.is_file() {
        return Ok(path.to_path_buf());
    }
    // Named after the whole file name and this process: two runs, or the
    // CSV and JSON files of one size, never share a temporary file.
    let name = path
        .file_name()
        .map_or("bids".into(), |n| n.to_string_lossy().to_string());
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let io = |e: std::io::Error| format!("{}: {e}", tmp.display());
    let mut out = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
    let base = chrono::NaiveDate::from_ymd_opt(2024, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .ok_or("bad base date")?;
    let mut stamp = String::new();
    for i in 0..rows {
        if i % 10 == 0 {
            stamp = (base + chrono::Duration::milliseconds((i / 10) as i64))
                .format("%Y-%m-%d %H:%M:%S%.3f")
                .to_string();
        }
        line(&mut out, &stamp).map_err(io)?;
    }
    out.flush().map_err(io)?;
    drop(out);
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path.to_path_buf())
}

/// Directories `bid/`, `auction/`, `person/` of CSV files holding the
/// Nexmark events of `events` generated events (Weir's generator, seed
/// 0), written once by `weir run` through the filesystem sink.
pub fn nexmark_csv(dir: &Path, events: u64) -> Result<PathBuf, String> {
    let path = dir.join(format!("nexmark-{events}"));
    if path.join("done").is_file() {
        return Ok(path);
    }
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut sql = String::from("SET 'parallelism.default' = '1';\nSET 'table.dml-sync' = 'true';\n");
    for (table, cols) in [
        ("bid", crate::bench::BID_COLUMNS),
        ("auction", crate::bench::AUCTION_COLUMNS),
        ("person", crate::bench::PERSON_COLUMNS),
    ] {
        sql.push_str(&format!(
            "CREATE TABLE gen_{table} ({cols}) WITH ('connector' = 'nexmark', 'nexmark.table' = '{table}', \
             'nexmark.events' = '{events}');\n\
             CREATE TABLE out_{table} ({cols}) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');\n\
             INSERT INTO out_{table} SELECT * FROM gen_{table};\n",
            path.join(table).display()
        ));
    }
    let script = path.join("generate.sql");
    write(&script, &sql)?;
    let weir = std::env::current_exe().map_err(|e| format!("cannot find the weir binary: {e}"))?;
    let out = Command::new(weir)
        .arg("--data-dir")
        .arg(path.join("data"))
        .arg("run")
        .arg(&script)
        .output()
        .map_err(|e| format!("weir run {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "generating the Nexmark files failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let _ = std::fs::remove_dir_all(path.join("data"));
    write(&path.join("done"), "")?;
    Ok(path)
}

/// The auctions the bids bid on: ids 0..10 000 (every bid's auction),
/// `id, seller, category, dateTime` (category `10 + id % 20`, seller
/// `id % 1000`), made once.
pub fn auctions_csv(dir: &Path) -> Result<PathBuf, String> {
    let path = dir.join("auctions-10k.csv");
    if path.is_file() {
        return Ok(path);
    }
    let mut text = String::new();
    for id in 0..10_000u64 {
        text.push_str(&format!(
            "{id},{},{},2024-01-01 00:00:00.000\n",
            id % 1000,
            10 + id % 20
        ));
    }
    // Named after the whole file name and this process: two runs, or the
    // CSV and JSON files of one size, never share a temporary file.
    let name = path
        .file_name()
        .map_or("bids".into(), |n| n.to_string_lossy().to_string());
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    write(&tmp, &text)?;
    std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// Seconds from starting `weir run` on a SQL file to its first output row.
fn startup(weir: &Path, bench_dir: &Path) -> Result<f64, String> {
    use std::io::BufRead;
    let work = tempfile::tempdir_in(bench_dir).map_err(|e| e.to_string())?;
    let csv = work.path().join("one.csv");
    write(&csv, "1,2024-01-01 00:00:00.000\n")?;
    let sql = work.path().join("one.sql");
    write(
        &sql,
        &format!(
            "CREATE TABLE t (id BIGINT, ts TIMESTAMP(3)) WITH ('connector' = 'filesystem', 'path' = '{}', 'format' = 'csv');\n\
             CREATE TABLE out (id BIGINT, ts TIMESTAMP(3)) WITH ('connector' = 'print');\n\
             INSERT INTO out SELECT id, ts FROM t;\n",
            csv.display()
        ),
    )?;
    let started = Instant::now();
    let mut child = Command::new(weir)
        .arg("--data-dir")
        .arg(work.path().join("data"))
        .arg("run")
        .arg(&sql)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut first = None;
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.map_err(|e| e.to_string())?;
        if first.is_none() && line.contains("+I[") {
            first = Some(started.elapsed().as_secs_f64());
        }
    }
    child.wait().map_err(|e| e.to_string())?;
    first.ok_or_else(|| "the job printed no row".to_string())
}

fn run_weir(weir: &Path, data: &Path, sql: &Path) -> Result<Figures, String> {
    let started = Instant::now();
    let child = Command::new(weir)
        .arg("--data-dir")
        .arg(data)
        .arg("run")
        .arg(sql)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", weir.display()))?;
    let (peak, cpu, output) = watch(child)?;
    let seconds = started.elapsed().as_secs_f64();
    if !output.status.success() {
        return Err(format!(
            "weir run failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let _ = std::fs::remove_dir_all(data);
    Ok(Figures {
        seconds,
        cpu_seconds: cpu,
        peak_rss_bytes: peak,
    })
}

fn run_flink(python: &Path, args: &CompareArgs, sql: &Path) -> Result<Figures, String> {
    let child = Command::new(python)
        .arg(&args.flink_runner)
        .arg(sql)
        .arg("-p")
        .arg(args.parallelism.to_string())
        .arg("--state-backend")
        .arg(&args.state_backend)
        .arg("--rows")
        .arg(args.rows.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", python.display()))?;
    let (peak, _, output) = watch(child)?;
    let text = String::from_utf8_lossy(&output.stdout);
    // The JVM may outlive the Python that started it by a moment; the next
    // (Weir) run must not share the CPUs with its shutdown.
    settle(Duration::from_secs(30));
    let number_after = |label: &str| -> Option<f64> {
        let rest = &text[text.find(label)? + label.len()..];
        rest.trim_start()
            .split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .next()?
            .parse()
            .ok()
    };
    match (
        number_after("job net runtime:"),
        number_after("jvm cpu (submit..end, ~the job's run):"),
    ) {
        (Some(seconds), Some(cpu)) if output.status.success() => Ok(Figures {
            seconds,
            cpu_seconds: cpu,
            peak_rss_bytes: peak,
        }),
        _ => Err(format!(
            "the Flink run failed:\n{}\n{}",
            text.trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        )),
    }
}

/// Waits for `child`, sampling its process tree every 20 ms: (the largest
/// peak RSS of a process in it, the child's CPU seconds, its output).
fn watch(mut child: std::process::Child) -> Result<(u64, f64, std::process::Output), String> {
    let pid = child.id();
    let mut peak = 0u64;
    let mut cpu = 0f64;
    // Drain pipes in threads so a chatty child never blocks on them.
    let drain = |r: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = vec![];
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    );
    loop {
        for p in tree(pid) {
            peak = peak.max(hwm_bytes(p));
        }
        // A zombie still reports its CPU time; read it before reaping.
        if let Some((state, seconds)) = stat(pid) {
            cpu = seconds;
            if state == 'Z' {
                break;
            }
        }
        if child.try_wait().map_err(|e| e.to_string())?.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    let output = std::process::Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    };
    Ok((peak, cpu, output))
}

/// Waits (up to `limit`) until no Java process runs on the machine.
fn settle(limit: Duration) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline && java_running() {
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn java_running() -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|e| {
        e.file_name().to_str().is_some_and(|s| s.parse::<u32>().is_ok())
            && std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "java")
    })
}

/// `pid` and its descendants.
fn tree(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = vec![];
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(ppid) = std::fs::read_to_string(format!("/proc/{p}/stat")).ok().and_then(|s| {
                s.rsplit_once(')')
                    .and_then(|(_, r)| r.split_whitespace().nth(1)?.parse().ok())
            }) {
                parents.push((p, ppid));
            }
        }
    }
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        out.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    out
}

fn hwm_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// (state, user + system CPU seconds) of a process.
fn stat(pid: u32) -> Option<(char, f64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some((state, ticks / clock_ticks()))
}

fn clock_ticks() -> f64 {
    // USER_HZ is 100 on every Linux Weir runs on (getconf CLK_TCK).
    100.0
}

fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default();
    format!("{cores} cores, {cpu}")
}

fn commit() -> String {
    Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| format!("commit {}", String::from_utf8_lossy(&o.stdout).trim()))
        .unwrap_or_else(|| "commit unknown".into())
}
