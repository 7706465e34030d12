#!/usr/bin/env python3
"""A client of a `weir serve` given `--allow-dir s3://BUCKET/PREFIX` (and
the server's own S3 endpoint and keys in its environment) puts a job's
checkpoints and a table below that location, and is refused anywhere else, with the
ADBC Flight SQL driver as a DB-API user would (results of SET and DDL
never read).

    python weir_adbc_object_store.py grpc://127.0.0.1:PORT ALLOWED_URL OUTSIDE_URL SINK_DIR

Exit code 0 when every step passed.
"""
import sys

import adbc_driver_flightsql.dbapi as flight_sql

ROWS = 3000


def execute(conn, sql):
    """Runs a statement as DB-API users do: the result is never read."""
    with conn.cursor() as cur:
        cur.execute(sql)


def refused(conn, sql, option):
    """The statement fails with PERMISSION_DENIED naming `option`."""
    try:
        execute(conn, sql)
    except Exception as e:  # the driver's error classes vary by status
        text = str(e)
        assert "PERMISSION_DENIED" in text or "permission denied" in text, \
            f"{sql!r}: not a permission error: {text}"
        assert option in text, f"{sql!r}: the error does not name {option}: {text}"
        return
    raise AssertionError(f"{sql!r} was accepted")


def step_a_locations_outside_refused(conn, t):
    """Checkpoints, savepoints and restores outside the allowed location,
    or through `..`, and an endpoint of the client's choosing, are refused."""
    outside, allowed = t["outside"], t["allowed"]
    refused(conn, f"SET 'execution.checkpointing.dir' = '{outside}'", "execution.checkpointing.dir")
    refused(conn, f"SET 'execution.checkpointing.dir' = '{allowed}/../escape'", "execution.checkpointing.dir")
    refused(conn, f"SET 'execution.checkpointing.savepoint-dir' = '{outside}/sp'",
            "execution.checkpointing.savepoint-dir")
    refused(conn, f"SET 'execution.state-recovery.path' = '{outside}/sp/savepoint-1'",
            "execution.state-recovery.path")
    refused(conn, "SET 's3.endpoint' = 'http://169.254.169.254'", "s3.endpoint")
    # A table is a location too: its path must be below the allowed one.
    for path in [f"{outside}/t", f"{allowed}/../elsewhere/t", "s3://other-bucket/t"]:
        refused(conn, f"CREATE TABLE t_out (id BIGINT) WITH ('connector' = 'filesystem', "
                      f"'path' = '{path}', 'format' = 'json')", "path")


def step_b_checkpoints_below_the_allowed_location(conn, t):
    """A job checkpoints below the allowed location with the server's
    credentials and writes every row once."""
    for sql in [
        f"SET 'execution.checkpointing.dir' = '{t['allowed']}/checkpoints'",
        "SET 'execution.checkpointing.interval' = '200 ms'",
        "SET 'pipeline.name' = 'on-s3'",
        "SET 'table.dml-sync' = 'true'",
        f"CREATE TABLE gen (id BIGINT) WITH ('connector' = 'datagen', 'rows-per-second' = '1500', "
        f"'fields.id.kind' = 'sequence', 'fields.id.start' = '1', 'fields.id.end' = '{ROWS}')",
        f"CREATE TABLE out (id BIGINT) WITH ('connector' = 'filesystem', 'path' = '{t['sink']}', "
        f"'format' = 'csv')",
        "INSERT INTO out SELECT id FROM gen",
    ]:
        execute(conn, sql)


def step_c_a_table_below_the_allowed_location(conn, t):
    """A table on the store below the allowed location is written exactly
    once with checkpoints there, and read back (the count is read, as a
    query's result is)."""
    for sql in [
        f"CREATE TABLE on_s3 (id BIGINT) WITH ('connector' = 'filesystem', "
        f"'path' = '{t['allowed']}/tables/ids', 'format' = 'json')",
        "INSERT INTO on_s3 SELECT id FROM gen",
    ]:
        execute(conn, sql)
    with conn.cursor() as cur:
        cur.execute("SELECT COUNT(*), COUNT(DISTINCT id), MIN(id), MAX(id) FROM on_s3")
        rows = cur.fetchall()
    # An updating query's rows carry their change kind first; the last
    # is the final count.
    assert rows[-1][-4:] == (ROWS, ROWS, 1, ROWS), f"read back, last of {len(rows)} changes: {rows[-1]}"


STEPS = [
    step_a_locations_outside_refused,
    step_b_checkpoints_below_the_allowed_location,
    step_c_a_table_below_the_allowed_location,
]


def main():
    uri, allowed, outside, sink = sys.argv[1:5]
    t = {"allowed": allowed, "outside": outside, "sink": sink}
    passed, failed = 0, 0
    with flight_sql.connect(uri, autocommit=True) as conn:
        for step in STEPS:
            letter, name = step.__name__[5], step.__name__[7:].replace("_", " ")
            try:
                step(conn, t)
                passed += 1
                print(f"ok   {letter}. {name}")
            except Exception as e:
                failed += 1
                print(f"FAIL {letter}. {name}: {type(e).__name__}: {e}")
                break
    print(f"adbc object store: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
