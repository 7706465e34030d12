#!/usr/bin/env python3
"""Flight SQL server benchmark through the ADBC driver (a real client).

    python benches/flight.py grpc://127.0.0.1:PORT

1. prepared query latency: one connection, `SELECT ? + 1` bound and run
   500 times (prepare once; each run = DoPut bind + GetFlightInfo + DoGet);
2. 200 concurrent clients, each its own connection and one query;
3. live subscription throughput: `SUBSCRIBE TO` an unthrottled Nexmark bid
   stream, read batch by batch for 10 s: rows/s and MB/s at the client;
4. concurrent short bounded queries: 1 and then 50 clients, each on its own
   connection, run a small aggregate over VALUES for 5 s: queries/s (with
   one session per connection this scales with cores; under one session
   lock it stays flat).
"""
import statistics
import sys
import threading
import time

import adbc_driver_flightsql.dbapi as flight_sql


def connect(uri):
    return flight_sql.connect(uri, autocommit=True)


def main(uri):
    conn = connect(uri)
    with conn.cursor() as cur:
        lat = []
        for i in range(500):
            t = time.perf_counter()
            cur.execute("SELECT ? + 1 AS x", parameters=(i,))
            got = cur.fetch_arrow_table().column(0)[0].as_py()
            lat.append(time.perf_counter() - t)
            assert got == i + 1, got
    lat.sort()
    print(
        f"prepared query: p50 {statistics.median(lat) * 1e3:.2f} ms, "
        f"p99 {lat[int(len(lat) * 0.99)] * 1e3:.2f} ms, max {lat[-1] * 1e3:.2f} ms (500 runs)"
    )

    answered, errors = [], []

    def client(i):
        try:
            c = connect(uri)
            with c.cursor() as cur:
                cur.execute(f"SELECT {i} AS i")
                assert cur.fetch_arrow_table().column(0)[0].as_py() == i
            c.close()
            answered.append(i)
        except Exception as e:  # reported below
            errors.append(repr(e))

    t = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(200)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t
    print(f"200 concurrent clients: {len(answered)} answered, {len(errors)} errors, {wall:.2f} s wall")
    if errors:
        print("  first error:", errors[0])

    with conn.cursor() as cur:
        cur.execute(
            "CREATE TABLE IF NOT EXISTS bench_bid (auction BIGINT, bidder BIGINT, price BIGINT, "
            "dateTime TIMESTAMP(3), WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND) "
            "WITH ('connector' = 'nexmark', 'nexmark.table' = 'bid')"
        )
        cur.fetch_arrow_table()
    with conn.cursor() as cur:
        cur.execute("SUBSCRIBE TO (SELECT auction, bidder, price, dateTime FROM bench_bid)")
        reader = cur.fetch_record_batch()
        rows = nbytes = 0
        start = time.perf_counter()
        while time.perf_counter() - start < 10:
            b = reader.read_next_batch()
            rows += b.num_rows
            nbytes += b.nbytes
        secs = time.perf_counter() - start
        cur.adbc_cancel()
    print(f"subscription: {rows / secs:,.0f} rows/s, {nbytes / secs / 1e6:.1f} MB/s at the client ({rows:,} rows in {secs:.1f} s)")
    conn.close()

    for n in (1, 50):
        qps, errs = concurrent_queries(uri, n, 5.0)
        print(f"short bounded queries, {n} clients: {qps:,.0f} queries/s ({errs} errors)")


def concurrent_queries(uri, clients, seconds):
    """Queries per second from `clients` connections running a short
    bounded query (planning + execution, no table) for `seconds`."""
    sql = "SELECT sum(x * 2) AS s, count(*) AS n FROM (VALUES (1), (2), (3), (4)) AS v(x) WHERE x > 1"
    done, errors = [0] * clients, []
    conns = [connect(uri) for _ in range(clients)]
    start = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def run(i):
        start.wait()
        with conns[i].cursor() as cur:
            while time.perf_counter() < stop_at[0]:
                try:
                    cur.execute(sql)
                    cur.fetch_arrow_table()
                    done[i] += 1
                except Exception as e:  # counted, reported
                    errors.append(repr(e))
                    return

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for th in threads:
        th.start()
    stop_at[0] = time.perf_counter() + seconds
    t = time.perf_counter()
    start.wait()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t
    for c in conns:
        c.close()
    return sum(done) / wall, len(errors)


if __name__ == "__main__":
    main(sys.argv[1])
