#!/usr/bin/env bash
# Checkpoint benchmark: full vs incremental checkpoint size and duration on
# a job whose RocksDB state grows past 1 GB, recovery time from the latest
# checkpoint, and throughput with checkpointing every 10 s vs off.
#
#   benches/checkpoint.sh [events] [checkpoints before the kill]
#   (default 20 000 000 events: ~1 GB of state after ~45 s; 13 checkpoints)
#
# Needs the release binary: cargo build --release --bin weir
set -euo pipefail
EVENTS=${1:-20000000}
KILL_AFTER=${2:-13}
WEIR=${WEIR:-${CARGO_TARGET_DIR:-target}/release/weir}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
sed "s/\${EVENTS}/$EVENTS/" "$(dirname "$0")/checkpoint.sql" > "$WORK/job.sql"

run() { # label, extra SET lines
  { echo "$2"; cat "$WORK/job.sql"; } > "$WORK/run.sql"
  local start end
  start=$(date +%s.%N)
  "$WEIR" --data-dir "$WORK/data-$1" run "$WORK/run.sql" 2> "$WORK/$1.log" > /dev/null
  end=$(date +%s.%N)
  echo "$1: $EVENTS events in $(awk "BEGIN { print $end - $start }") s"
}

echo "== throughput (bounded run, to the end including the final firing)"
run off ""
run every10s "SET 'execution.checkpointing.interval' = '10 s';"
grep -E 'checkpoint [0-9]+ completed' "$WORK/every10s.log" | sed 's/.*job/job/'
for inc in true false; do
  echo "== incremental = $inc: checkpoints every 3 s, killed after checkpoint $KILL_AFTER"
  rm -rf "$WORK/data-kill"
  { echo "SET 'execution.checkpointing.interval' = '3 s'; SET 'state.backend.incremental' = '$inc';"; cat "$WORK/job.sql"; } > "$WORK/kill.sql"
  "$WEIR" --data-dir "$WORK/data-kill" run "$WORK/kill.sql" 2> "$WORK/kill.log" > /dev/null &
  pid=$!
  while [ "$(grep -c 'completed' "$WORK/kill.log" || true)" -lt "$KILL_AFTER" ] && kill -0 $pid 2>/dev/null; do
    sleep 0.5
  done
  kill -9 $pid 2>/dev/null || echo "(the job finished before checkpoint $KILL_AFTER)"
  wait $pid 2>/dev/null || true
  grep -E 'checkpoint [0-9]+ completed' "$WORK/kill.log" | sed 's/.*job/job/'
  du -sh "$WORK/data-kill/checkpoints" | sed 's/^/checkpoint storage: /'
  echo "== recovery from the latest checkpoint"
  "$WEIR" --data-dir "$WORK/data-kill" run "$WORK/kill.sql" 2> "$WORK/recover.log" > /dev/null &
  pid=$!
  while ! grep -q 'restoring from checkpoint' "$WORK/recover.log"; do sleep 0.2; done
  kill -9 $pid; wait $pid 2>/dev/null || true
  grep 'restoring from checkpoint' "$WORK/recover.log" | sed 's/.*job/job/'
done
