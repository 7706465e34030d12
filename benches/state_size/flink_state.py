#!/usr/bin/env python3
"""Flink 2.3's checkpoint size for a query once its input is consumed.

The filesystem tables are made continuous ('source.monitor-interval'), so the
job never finishes and its checkpoints hold the operators' whole state; the
job is cancelled once three checkpoints in a row have the same size (within
0.2 %), full (not incremental) checkpoints every 4 s, RocksDB, parallelism 1.
Usage: flink_state.py QUERY.sql CHECKPOINT_DIR   (QUERY.sql: paths substituted)
"""
import os, re, sys, time

def parse_statements(text):
    text = "\n".join(l for l in text.splitlines() if not l.strip().startswith("--"))
    return [s.strip() for s in re.split(r";\s*(?:\n|$)", text) if s.strip()]

def chk_sizes(root):
    out = {}
    for dirpath, _, files in os.walk(root):
        m = re.search(r"chk-(\d+)$", dirpath)
        if m and "_metadata" in files:
            out[int(m.group(1))] = sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    return out

sql, ckdir = sys.argv[1], sys.argv[2]
stmts = [s.replace("'format' = 'csv')", "'format' = 'csv', 'source.monitor-interval' = '1 h')")
         for s in parse_statements(open(sql).read())]
from pyflink.common import Configuration
from pyflink.table import EnvironmentSettings, TableEnvironment
c = Configuration()
for k, v in {"parallelism.default": "1", "state.backend.type": "rocksdb",
             "execution.checkpointing.interval": "4s",
             "execution.checkpointing.dir": "file://" + ckdir,
             "execution.checkpointing.incremental": "false",
             "execution.checkpointing.num-retained": "3"}.items():
    c.set_string(k, v)
env = TableEnvironment.create(EnvironmentSettings.new_instance().in_streaming_mode().with_configuration(c).build())
result = None
for s in stmts:
    result = env.execute_sql(s)
job = result.get_job_client()
t0 = time.time(); last = None
while time.time() - t0 < 900:
    time.sleep(2)
    sizes = chk_sizes(ckdir)
    done = sorted(sizes)
    if len(done) >= 3 and time.time() - t0 > 60:
        z, a, b = sizes[done[-3]], sizes[done[-2]], sizes[done[-1]]
        if abs(a - b) <= 0.002 * b and abs(z - b) <= 0.002 * b:
            print(f"checkpoint {done[-1]}: {b} bytes (previous {a})")
            break
job.cancel().result()
