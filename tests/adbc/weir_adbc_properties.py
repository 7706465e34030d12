#!/usr/bin/env python3
"""A client with role `user` tries to make `weir serve` load code or open
files through Kafka client properties, with the ADBC Flight SQL driver as
a DB-API user would (results of DDL never read).

    python weir_adbc_properties.py grpc://127.0.0.1:PORT USER PASSWORD ALLOWED_DIR LIBRARY BROKER

LIBRARY is a shared library inside ALLOWED_DIR whose constructor writes a
marker file (the caller checks it never appears); BROKER is host:port of a
Kafka-protocol broker with topic `props` (one partition). Exit code 0 when
every step passed.
"""
import os
import sys
import time

import adbc_driver_flightsql.dbapi as flight_sql

ROWS = 50


def execute(conn, sql):
    """Runs a statement as DB-API users do: the result is never read."""
    with conn.cursor() as cur:
        cur.execute(sql)


def rows(conn, sql):
    with conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchall()


def refused(conn, sql, option):
    """The statement fails with PERMISSION_DENIED naming `option`."""
    try:
        execute(conn, sql)
    except Exception as e:  # the driver's error classes vary by status
        text = str(e)
        assert "PERMISSION_DENIED" in text or "Unauthorized" in text or "permission denied" in text, \
            f"{sql!r}: not a permission error: {text}"
        assert option in text, f"{sql!r}: the error does not name {option}: {text}"
        return
    raise AssertionError(f"{sql!r} was accepted")


def kafka_table(name, broker, props):
    extra = "".join(f", 'properties.{k}' = '{v}'" for k, v in props.items())
    return (f"CREATE TABLE {name} (id BIGINT) WITH ('connector' = 'kafka', 'topic' = 'props', "
            f"'properties.bootstrap.servers' = '{broker}', 'scan.startup.mode' = 'earliest-offset', "
            f"'format' = 'json'{extra})")


def step_a_code_loading_refused(conn, t):
    """Properties that load code or run commands are refused, wherever
    they point."""
    for prop, value in [("plugin.library.paths", t["library"]),
                        ("sasl.kerberos.kinit.cmd", f"touch {t['dir']}/kinit-ran"),
                        ("ssl.engine.location", t["library"])]:
        refused(conn, kafka_table("plugged", t["broker"], {prop: value}), f"properties.{prop}")
    # The refused table does not exist, so nothing can read it.
    tables = [r[0] for r in rows(conn, "SHOW TABLES")]
    assert "plugged" not in tables, f"a refused table exists: {tables}"


def step_b_paths_outside_refused(conn, t):
    for prop in ["ssl.ca.location", "ssl.key.location", "ssl.certificate.location", "ssl.keystore.location",
                 "ssl.crl.location", "sasl.kerberos.keytab", "sasl.oauthbearer.assertion.private.key.file",
                 "https.ca.location"]:
        refused(conn, kafka_table("outside", t["broker"], {prop: "/etc/passwd"}), f"properties.{prop}")
        refused(conn, kafka_table("outside", t["broker"], {prop: f"{t['dir']}/../../etc/passwd"}),
                f"properties.{prop}")


def step_c_paths_inside_work(conn, t):
    """The same kind of property inside the allowed directory: the table is
    created, written and read through the broker."""
    # The keytab property is a path this librdkafka build takes (its SSL
    # ones are refused by the client itself: no OpenSSL in the build).
    keytab = os.path.join(t["dir"], "weir.keytab")
    with open(keytab, "w") as f:
        f.write("# not used over plaintext\n")
    execute(conn, kafka_table("inside", t["broker"], {"sasl.kerberos.keytab": keytab}))
    # A dynamic table option is the client's input too.
    refused(conn, f"SELECT * FROM inside /*+ OPTIONS('properties.plugin.library.paths' = '{t['library']}') */",
            "properties.plugin.library.paths")
    execute(conn, "SET 'table.dml-sync' = 'true'")
    execute(conn, f"CREATE TABLE gen (id BIGINT) WITH ('connector' = 'datagen', 'number-of-rows' = '{ROWS}', "
                  "'fields.id.kind' = 'sequence', 'fields.id.start' = '1', 'fields.id.end' = '50')")
    # Under table.dml-sync the INSERT answers when the job has ended, with
    # the state it ended in (it said RUNNING).
    job = rows(conn, "INSERT INTO inside SELECT id FROM gen")
    assert [r[2] for r in job] == ["FINISHED"], f"the synchronous INSERT answered {job}"
    execute(conn, "RESET 'table.dml-sync'")
    seen = set()
    deadline = time.monotonic() + 60
    with conn.cursor() as cur:
        cur.execute("SELECT id FROM inside")
        reader = cur.fetch_record_batch()
        while len(seen) < ROWS:
            assert time.monotonic() < deadline, f"read {len(seen)} of {ROWS} rows in 60 s"
            batch = reader.read_next_batch()
            seen.update(batch.column(0).to_pylist())
    assert seen == set(range(1, ROWS + 1)), f"rows {sorted(seen)}"


STEPS = [step_a_code_loading_refused, step_b_paths_outside_refused, step_c_paths_inside_work]


def main():
    uri, user, password, allowed, library, broker = sys.argv[1:7]
    t = {"dir": allowed, "library": library, "broker": broker}
    passed, failed = 0, 0
    with flight_sql.connect(uri, db_kwargs={"username": user, "password": password}, autocommit=True) as conn:
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
    print(f"adbc properties: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
