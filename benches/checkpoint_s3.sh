#!/usr/bin/env bash
# Checkpoints on an S3 server beside local disk (issue 41): SeaweedFS's
# `weed mini` on loopback (scripts/setup.sh fetches it), the checkpoint
# benchmark's job (benches/checkpoint.sql: RocksDB state growing past 1 GB).
#
#   benches/checkpoint_s3.sh [events] [checkpoints before the kill]
#
# 1. Throughput of a keyed HOP over Nexmark bids with checkpoints every
#    1 s: off, to local disk, to S3.
# 2. The growing job with incremental checkpoints every 3 s, to local disk
#    and to S3, killed (SIGKILL) after N checkpoints: per checkpoint the
#    state, bytes uploaded and duration.
# 3. Restore from S3 on a new machine (the local data dir deleted) at
#    parallelism 1, 2 and 4: the time to download, verify and lay the
#    state out, and to open it.
#
# SKIP_HOP=1 leaves out part 1 (parts 2 and 3 alone: the restore figures).
# Needs the release binary: cargo build --release --bin weir
set -euo pipefail
EVENTS=${1:-22000000}
KILL_AFTER=${2:-13}
WEIR=${WEIR:-${CARGO_TARGET_DIR:-target}/release/weir}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
WEED_PID=
cleanup() { [ -n "$WEED_PID" ] && kill "$WEED_PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

# shellcheck source=benches/s3_server.sh
. "$HERE/s3_server.sh"
start_s3 "$WORK/s3"

echo "== 1. keyed HOP, checkpoints every 1 s ($EVENTS events)"
cat > "$WORK/hop.sql" <<SQL
SET 'parallelism.default' = '2';
SET 'pipeline.name' = 'bench-hop';
CREATE TABLE bid (auction BIGINT, bidder BIGINT, price BIGINT, dateTime TIMESTAMP(3),
  WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND
) WITH ('connector' = 'nexmark', 'nexmark.table' = 'bid', 'nexmark.events' = '$EVENTS');
CREATE TABLE sink (auction BIGINT, window_start TIMESTAMP(3), n BIGINT, m BIGINT) WITH ('connector' = 'blackhole');
INSERT INTO sink SELECT auction, window_start, COUNT(*), MAX(price)
FROM TABLE(HOP(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
GROUP BY auction, window_start, window_end;
SQL
hop() { # label, SET lines
  { echo "$2"; cat "$WORK/hop.sql"; } > "$WORK/hop-$1.sql"
  local start end
  start=$(date +%s.%N)
  "$WEIR" --data-dir "$WORK/data-hop-$1" run "$WORK/hop-$1.sql" 2> "$WORK/hop-$1.log" > /dev/null
  end=$(date +%s.%N)
  echo "$1: $(awk "BEGIN { printf \"%.1f s, %.0f K events/s\", $end - $start, $EVENTS / ($end - $start) / 1000 }")," \
    "$(grep -c 'checkpoint [0-9]* completed' "$WORK/hop-$1.log" || true) checkpoints"
}
if [ -z "${SKIP_HOP:-}" ]; then
  hop off ""
  hop local "SET 'execution.checkpointing.interval' = '1 s'; SET 'execution.checkpointing.dir' = '$WORK/ckpt-hop';"
  hop s3 "SET 'execution.checkpointing.interval' = '1 s'; SET 'execution.checkpointing.dir' = 's3://weir/hop'; $S3_SET"
fi

sed "s/\${EVENTS}/$EVENTS/" "$HERE/checkpoint.sql" > "$WORK/job.sql"
grow() { # label, SET lines: killed after $KILL_AFTER checkpoints
  echo "== 2. $1: incremental checkpoints every 3 s, killed after checkpoint $KILL_AFTER"
  { echo "SET 'execution.checkpointing.interval' = '3 s'; $2"; cat "$WORK/job.sql"; } > "$WORK/grow-$1.sql"
  "$WEIR" --data-dir "$WORK/data-$1" run "$WORK/grow-$1.sql" 2> "$WORK/grow-$1.log" > /dev/null &
  local pid=$!
  while [ "$(grep -c 'completed' "$WORK/grow-$1.log" || true)" -lt "$KILL_AFTER" ] && kill -0 $pid 2>/dev/null; do
    sleep 0.5
  done
  kill -9 $pid 2>/dev/null || echo "(the job finished before checkpoint $KILL_AFTER)"
  wait $pid 2>/dev/null || true
  grep -E 'checkpoint [0-9]+ completed' "$WORK/grow-$1.log" | sed 's/.*job/job/'
}
grow local "SET 'execution.checkpointing.dir' = '$WORK/ckpt-local';"
du -sh "$WORK/ckpt-local" | sed 's/^/local checkpoint storage: /'
grow s3 "SET 'execution.checkpointing.dir' = 's3://weir/grow'; $S3_SET"
du -sh "$WORK/s3" | sed 's/^/S3 server data: /'

echo "== 3. restore from S3 on a new machine"
if grep -q 'final checkpoint' "$WORK/grow-s3.log"; then
  # A finished job starts afresh: there is nothing to restore.
  echo "skipped: the S3 run finished before checkpoint $KILL_AFTER; give more events or fewer checkpoints"
  exit 0
fi
for p in 1 2 4; do
  rm -rf "$WORK/data-s3"
  sed "s/'parallelism.default' = '2'/'parallelism.default' = '$p'/" "$WORK/grow-s3.sql" > "$WORK/restore-$p.sql"
  "$WEIR" --data-dir "$WORK/data-s3" run "$WORK/restore-$p.sql" 2> "$WORK/restore-$p.log" > /dev/null &
  pid=$!
  while ! grep -q 'state of .* opened in' "$WORK/restore-$p.log" && kill -0 $pid 2>/dev/null; do sleep 0.1; done
  kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null || true
  echo "p=$p: $(grep -o 'restoring from checkpoint.*' "$WORK/restore-$p.log" | head -1);" \
    "$(grep -o 'opened in [0-9]* ms' "$WORK/restore-$p.log" | head -1)"
done
