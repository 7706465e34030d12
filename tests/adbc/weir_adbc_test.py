#!/usr/bin/env python3
"""Weir's Flight SQL server driven by a real third-party client: the ADBC
Flight SQL driver (Go, through adbc_driver_manager's Python DB-API).

    python weir_adbc_test.py grpc://127.0.0.1:PORT [SINK_DIR] [--skip d,f] [--keep-going]

Runs the steps a-l below in order against a fresh `weir serve`; exit code 0
when every step that ran passed. The driver's pitfalls
(`../shared/design/clients.md` §1-§2): the DB-API prepares every statement;
a failed execute with parameters leaves that cursor unusable, so each step
uses its own cursors; an endless stream must be read batch by batch (fetchall
would block forever) and with no fetch timeout (a total deadline that kills
the stream).
"""
import argparse
import os
import tempfile
import threading
import time

import adbc_driver_flightsql.dbapi as flight_sql

CANCEL_WITHIN = 5.0  # seconds for a cancelled stream to stop
READ_WITHIN = 60.0  # seconds for the first three batches of a subscription


def rows(conn, sql, parameters=None):
    """A bounded statement's result as a list of dicts."""
    with conn.cursor() as cur:
        cur.execute(sql, parameters)
        return cur.fetch_arrow_table().to_pylist()


def until(what, check, timeout=30.0):
    """Polls check() until it returns something truthy, or fails after timeout."""
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f}s"
        time.sleep(0.05)
    return got


def step_a_ddl(conn, t):
    for sql in [
        "SET 'parallelism.default' = '1'",
        # Unbounded and paced, so the job keeps running without eating a core.
        "CREATE TABLE bids (auction BIGINT, price BIGINT, dateTime TIMESTAMP(3), "
        "WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND) WITH ('connector' = 'nexmark', "
        "'nexmark.table' = 'bid', 'nexmark.events-per-second' = '20000')",
        f"CREATE TABLE sink (auction BIGINT, price BIGINT) "
        f"WITH ('connector' = 'filesystem', 'path' = '{t['sink']}', 'format' = 'csv')",
    ]:
        got = rows(conn, sql)
        assert got == [], f"{sql!r} should return no rows, got {got}"


def step_b_start_job(conn, t):
    job = rows(conn, "INSERT INTO sink SELECT auction, price FROM bids WHERE price > 0")
    assert len(job) == 1, f"INSERT should return one row for the job, got {job}"
    assert set(job[0]) == {"job_id", "job_name", "state"}, f"job row columns: {list(job[0])}"
    assert job[0]["state"] == "RUNNING", f"the job should be RUNNING at once: {job[0]}"
    t["job"] = job[0]["job_name"]
    print(f"    job {t['job']!r}")


def step_c_show_jobs(conn, t):
    assert "job" in t, "needs the job that step b starts"
    jobs = rows(conn, "SHOW JOBS")
    mine = [j for j in jobs if j["job_name"] == t["job"]]
    assert [j["state"] for j in mine] == ["RUNNING"], f"SHOW JOBS should list {t['job']!r} RUNNING once: {jobs}"
    written = lambda: os.path.isdir(t["sink"]) and os.listdir(t["sink"])
    until(f"file from the job in {t['sink']}", written, timeout=60)


def step_d_parameters(conn, t):
    got = rows(conn, "SELECT ? + 1 AS x", (41,))
    assert got == [{"x": 42}], f"SELECT ? + 1 with 41 should be [{{'x': 42}}], got {got}"
    got = rows(conn, "SELECT $1 * 2 AS y", (21,))
    assert got == [{"y": 42}], f"SELECT $1 * 2 with 21 should be [{{'y': 42}}], got {got}"
    # One prepared statement, run again with new parameters (the handle is reused).
    sql = "SELECT x FROM (VALUES (1), (2), (3)) AS v(x) WHERE x > ?"
    with conn.cursor() as cur:
        for bound, want in [(1, [2, 3]), (2, [3]), (3, [])]:
            cur.execute(sql, (bound,))
            got = sorted(r[0] for r in cur.fetchall())
            assert got == want, f"{sql} with {bound}: want {want}, got {got}"


def step_e_metadata(conn, t):
    info = conn.adbc_get_info()
    assert info.get("vendor_name") == "Weir", f"vendor_name: {info}"
    types = conn.adbc_get_table_types()
    assert "TABLE" in types, f"table types: {types}"
    objects = conn.adbc_get_objects(depth="all").read_all().to_pylist()
    catalogs = {c["catalog_name"]: c["catalog_db_schemas"] for c in objects}
    assert "weir" in catalogs, f"catalogs: {list(catalogs)}"
    schemas = {s["db_schema_name"]: s["db_schema_tables"] for s in catalogs["weir"]}
    assert "default" in schemas, f"schemas in weir: {list(schemas)}"
    tables = {x["table_name"]: [c["column_name"] for c in x["table_columns"]] for x in schemas["default"]}
    assert tables.get("bids") == ["auction", "price", "dateTime"], f"tables: {tables}"
    assert tables.get("sink") == ["auction", "price"], f"tables: {tables}"
    schema = conn.adbc_get_table_schema("bids")
    assert schema.names == ["auction", "price", "dateTime"], f"bids schema: {schema}"


def step_f_subscribe(conn, t):
    sql = "SUBSCRIBE TO (SELECT auction, price FROM bids)"
    cur = conn.cursor()
    watchdog = threading.Timer(READ_WITHIN, cur.adbc_cancel)  # a stuck read fails instead of hanging
    watchdog.start()
    try:
        cur.execute(sql)
        reader = cur.fetch_record_batch()
        assert reader.schema.names == ["_op", "auction", "price"], f"{sql}: columns {reader.schema.names}"
        with_rows = 0
        while with_rows < 3:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                raise AssertionError(f"{sql} ended after {with_rows} batches; it should never end")
            except OSError as e:
                raise AssertionError(f"{sql}: only {with_rows} batches with rows in {READ_WITHIN:.0f}s ({e})")
            if batch.num_rows:
                ops = set(batch.column(0).to_pylist())
                assert ops == {"+I"}, f"an append-only source should give only '+I' in _op, got {ops}"
                with_rows += 1
        # Cancel from this thread while another one is blocked reading.
        ended = threading.Event()
        threading.Thread(target=drain, args=(reader, ended), daemon=True).start()
        start = time.monotonic()
        cur.adbc_cancel()
        assert ended.wait(CANCEL_WITHIN), f"the stream still ran {CANCEL_WITHIN}s after adbc_cancel()"
        print(f"    3 batches with rows, then cancelled in {(time.monotonic() - start) * 1000:.0f} ms")
    finally:
        watchdog.cancel()
        cur.close()
    got = rows(conn, "SELECT 1 AS one")
    assert got == [{"one": 1}], f"the connection should still work after the cancel, got {got}"


def drain(reader, ended):
    """Reads until the stream fails (cancelled: OSError) or ends, then sets ended."""
    try:
        while True:
            reader.read_next_batch()
    except BaseException:
        ended.set()


def step_g_stop_job(conn, t):
    assert "job" in t, "needs the job that step b starts"
    job = t["job"]
    rows(conn, f"STOP JOB '{job}'")

    def not_running():
        mine = [j["state"] for j in rows(conn, "SHOW JOBS") if j["job_name"] == job]
        return (mine or ["(gone)"]) if mine != ["RUNNING"] else None

    print(f"    state after STOP JOB: {until(f'stop of {job!r}', not_running)}")


def step_h_unread_statements(conn, t):
    """The usual DB-API pattern: execute every statement, read no result.
    Statements with effects happen when submitted, exactly once."""
    tables = lambda: {r["table name"] for r in rows(conn, "SHOW TABLES")}
    cur = conn.cursor()
    for i in range(5):
        cur.execute(f"CREATE TABLE unread{i} (id BIGINT) WITH ('connector' = 'datagen', 'number-of-rows' = '10')")
    have = tables()
    assert all(f"unread{i}" in have for i in range(5)), f"five unread CREATE TABLEs, SHOW TABLES has {sorted(have)}"
    # CREATE then INSERT at once, neither read; a query in between, read.
    cur.execute("CREATE TABLE unread_src (auction BIGINT) WITH ('connector' = 'nexmark', "
                "'nexmark.table' = 'bid', 'nexmark.events-per-second' = '1000')")
    cur.execute("SELECT 7 AS seven")
    got = cur.fetchall()
    assert got == [(7,)], f"a query between unread statements: {got}"
    cur.execute("CREATE TABLE unread_sink (auction BIGINT) WITH ('connector' = 'blackhole')")
    cur.execute("SET 'pipeline.name' = 'unread-job'")
    cur.execute("INSERT INTO unread_sink SELECT auction FROM unread_src")
    cur.execute("RESET 'pipeline.name'")
    running = lambda: [j["state"] for j in rows(conn, "SHOW JOBS") if j["job_name"] == "unread-job"]
    assert running() == ["RUNNING"], f"the unread INSERT started one job: {running()}"
    cur.execute("STOP JOB 'unread-job'")
    until("the unread STOP JOB to stop the job", lambda: running() and running() != ["RUNNING"])
    cur.close()
    # JDBC style: execute, then close the statement at once.
    for sql in ["CREATE TABLE closed_at_once (id BIGINT) WITH ('connector' = 'blackhole')",
                "DROP TABLE unread0"]:
        c = conn.cursor()
        c.execute(sql)
        c.close()
    have = tables()
    assert "closed_at_once" in have and "unread0" not in have, f"statements closed unread: {sorted(have)}"
    # Exactly once: running the same CREATE again is refused only if it differs.
    with conn.cursor() as c:
        c.execute("CREATE TABLE unread1 (id BIGINT) WITH ('connector' = 'datagen', 'number-of-rows' = '10')")
    print("    5 unread CREATEs, CREATE+INSERT+STOP unread, close-at-once: all took effect")


def step_i_updating_query(conn, t):
    """A GROUP BY without a window over a bounded table: a database client
    gets the final table (no `_op`), announced so before running; with
    Flink's `sql-client.execution.result-mode` = 'changelog' it gets the
    changes instead, which applied give the same table."""
    nexmark = ("CREATE TABLE few_bids (auction BIGINT, price BIGINT) WITH ('connector' = 'nexmark', "
               "'nexmark.table' = 'bid', 'nexmark.events' = '2000')")
    with conn.cursor() as cur:
        cur.execute(nexmark)  # never read, as DB-API users do
    grouped = "SELECT auction % 3 AS g, COUNT(*) AS n FROM few_bids GROUP BY auction % 3"
    with conn.cursor() as cur:
        cur.execute(grouped)
        rows = cur.fetchall()
        names = [d[0] for d in cur.description]
    assert names == ["g", "n"], f"columns {names}"
    assert sorted(g for g, _ in rows) == [0, 1, 2], f"one row per group: {rows}"
    # 2000 events, 46 of every 50 bids.
    assert sum(n for _, n in rows) == 1840, f"every bid counted once: {rows}"
    with conn.cursor() as cur:
        cur.execute("SET 'sql-client.execution.result-mode' = 'changelog'")
    with conn.cursor() as cur:
        cur.execute(grouped)
        table = cur.fetch_arrow_table()
    assert table.schema.names == ["_op", "g", "n"], f"columns {table.schema.names}"
    final = {}
    for r in table.to_pylist():
        assert r["_op"] in ("+I", "-U", "+U", "-D"), f"op {r['_op']}"
        key = (r["g"], r["n"])
        final[key] = final.get(key, 0) + (1 if r["_op"] in ("+I", "+U") else -1)
    live = sorted(k for k, v in final.items() if v > 0)
    assert live == sorted(rows), f"the changes add up to the table: {live} vs {rows}"
    assert any(r["_op"] == "-U" for r in table.to_pylist()), "updates retract the old row"
    with conn.cursor() as cur:
        cur.execute("RESET 'sql-client.execution.result-mode'")


def step_j_nested_columns(conn, t):
    """ARRAY, MAP and ROW columns reach a DB-API client as Arrow lists, maps
    and structs: NULL values, empty ones and NULLs inside included."""
    data = os.path.join(t["sink"], "arrays.json")
    with open(data, "w") as f:
        f.write('{"id": 1, "tags": ["a", "b"], "nums": [1, null], "attrs": {"k": 1, "z": null}, '
                '"addr": {"city": "Oslo", "zip": 150}}\n')
        f.write('{"id": 2, "tags": [], "nums": null, "attrs": {}, "addr": null}\n')
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE nested (id INT, tags ARRAY<STRING>, nums ARRAY<INT>, attrs MAP<STRING, INT>, "
                    "addr ROW<city STRING, zip INT>) WITH ("
                    f"'connector' = 'filesystem', 'path' = '{data}', 'format' = 'json')")
    with conn.cursor() as cur:
        cur.execute("SELECT id, tags, nums, ARRAY[id, id + 1] AS made, CARDINALITY(tags) AS n, attrs, addr, "
                    "MAP['id', id] AS m, ROW(id, addr.city) AS r FROM nested")
        table = cur.fetch_arrow_table()
    types = {f.name: str(f.type) for f in table.schema}
    assert types["tags"] == "list<item: string>", f"tags is {types['tags']}"
    assert types["attrs"].startswith("map<string, int32"), f"attrs is {types['attrs']}"
    assert types["addr"] == "struct<city: string, zip: int32>", f"addr is {types['addr']}"
    assert types["r"] == "struct<EXPR$0: int32, EXPR$1: string>", f"r is {types['r']}"
    got = sorted(table.to_pylist(), key=lambda r: r["id"])
    assert got == [
        {"id": 1, "tags": ["a", "b"], "nums": [1, None], "made": [1, 2], "n": 2,
         "attrs": [("k", 1), ("z", None)], "addr": {"city": "Oslo", "zip": 150},
         "m": [("id", 1)], "r": {"EXPR$0": 1, "EXPR$1": "Oslo"}},
        {"id": 2, "tags": [], "nums": None, "made": [2, 3], "n": 0,
         "attrs": [], "addr": None, "m": [("id", 2)], "r": {"EXPR$0": 2, "EXPR$1": None}},
    ], f"rows {got}"


def step_k_multisets(conn, t):
    """A MULTISET column reaches a DB-API client as an Arrow map from each
    element to its count (INT), as Flink holds one."""
    data = os.path.join(t["sink"], "multisets.json")
    with open(data, "w") as f:
        f.write('{"id": 1, "bag": {"a": 2, "b": 1}}\n{"id": 2, "bag": {}}\n{"id": 3, "bag": null}\n')
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE bags (id INT, bag MULTISET<STRING>) WITH ("
                    f"'connector' = 'filesystem', 'path' = '{data}', 'format' = 'json')")
    with conn.cursor() as cur:
        cur.execute("SELECT id, bag, CAST(bag AS STRING) AS text FROM bags")
        table = cur.fetch_arrow_table()
    bag = table.schema.field("bag").type
    assert str(bag).startswith("map<string, int32"), f"bag is {bag}"
    got = sorted(table.to_pylist(), key=lambda r: r["id"])
    assert got == [
        {"id": 1, "bag": [("a", 2), ("b", 1)], "text": "{a=2, b=1}"},
        {"id": 2, "bag": [], "text": "{}"},
        {"id": 3, "bag": None, "text": None},
    ], f"rows {got}"


def step_l_session_time_zone(conn, t):
    """In a session with 'table.local-time-zone' set (never read, as DB-API
    users run SET), TIMESTAMP_LTZ values reach the client as instants and
    their casts and wall-clock functions are the zone's (Flink 2.3's
    answers for America/Los_Angeles)."""
    import datetime
    data = os.path.join(t["sink"], "instants.csv")
    with open(data, "w") as f:
        f.write("1,1710064800000,2024-11-03 01:30:00\n")
    with conn.cursor() as cur:
        cur.execute("SET 'table.local-time-zone' = 'America/Los_Angeles'")
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE instants (id INT, ms BIGINT, s STRING) WITH ("
                    f"'connector' = 'filesystem', 'path' = '{data}', 'format' = 'csv')")
    got = rows(conn, "SELECT TO_TIMESTAMP_LTZ(ms, 3) AS l, CAST(TO_TIMESTAMP_LTZ(ms, 3) AS STRING) AS t, "
                     "HOUR(TO_TIMESTAMP_LTZ(ms, 3)) AS h, UNIX_TIMESTAMP(s) AS u FROM instants")
    assert got == [{
        "l": datetime.datetime(2024, 3, 10, 10, 0, tzinfo=datetime.timezone.utc),
        "t": "2024-03-10 03:00:00.000",
        "h": 3,
        "u": 1730626200,
    }], f"rows {got}"
    with conn.cursor() as cur:
        cur.execute("RESET 'table.local-time-zone'")


STEPS = [step_a_ddl, step_b_start_job, step_c_show_jobs, step_d_parameters,
         step_e_metadata, step_f_subscribe, step_g_stop_job, step_h_unread_statements,
         step_i_updating_query, step_j_nested_columns, step_k_multisets, step_l_session_time_zone]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("uri", help="grpc://127.0.0.1:PORT of a fresh `weir serve`")
    p.add_argument("sink", nargs="?", help="directory for the file sink (default: a new temp dir)")
    p.add_argument("--skip", default="", help="step letters to skip, e.g. d,f,g")
    p.add_argument("--keep-going", action="store_true", help="run the later steps after a failure")
    args = p.parse_args()
    t = {"sink": os.path.abspath(args.sink or tempfile.mkdtemp(prefix="weir-adbc-sink-"))}
    skip = set(args.skip.replace(",", ""))
    passed, failed = 0, 0
    with flight_sql.connect(args.uri, autocommit=True) as conn:
        for step in STEPS:
            letter, name = step.__name__[5], step.__name__[7:].replace("_", " ")
            if letter in skip:
                print(f"skip {letter}. {name}")
                continue
            try:
                step(conn, t)
                passed += 1
                print(f"ok   {letter}. {name}")
            except Exception as e:  # AssertionError, or the driver's own errors
                failed += 1
                print(f"FAIL {letter}. {name}: {type(e).__name__}: {e}")
                if not args.keep_going:
                    break
    print(f"adbc: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
