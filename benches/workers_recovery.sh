#!/usr/bin/env bash
# Recovery of a job over 2 `weir worker` processes after one is killed
# (issue 42), with about 1 GiB of RocksDB state in its checkpoint:
# detection (worker 0 ends once worker 1's link resets), the restart (this
# script is the supervisor: it starts both again at once), the meeting,
# and each worker's restore of its own key groups, until both run.
#
#   benches/workers_recovery.sh [state-bytes]
#
# The job: Nexmark bids (all seven columns) grouped by (auction, bidder,
# dateTime), nearly one key per bid, keeping the longest url and extra:
# state grows with the input. Checkpoints every 20 s, incremental, to a
# directory both workers share (the object store's stand-in on one
# machine; a restore from S3 is measured for one process in
# docs/benchmarks.md).
#
# Needs the release binary (cargo build --release --bin weir).
set -euo pipefail
TARGET=${1:-1073741824}
WEIR=${WEIR:-${CARGO_TARGET_DIR:-target}/release/weir}
WORK=$(mktemp -d)
cleanup() { pkill -P $$ 2>/dev/null || true; sleep 0.5; rm -rf "$WORK"; }
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
now() { date +%s.%N; }
# Running: the process exists and is no zombie. The workers are children
# of subshells that are gone, so an exited worker waits for init to reap
# it, and `kill -0` still succeeds on it until then (on this machine for
# up to seconds).
alive() {
  local s
  s=$(grep '^State:' "/proc/$1/status" 2> /dev/null) || return 1
  [[ $s != *"(zombie)"* ]]
}

CHECKPOINTS="SET 'execution.checkpointing.dir' = '$WORK/checkpoints';"

cat > "$WORK/job.sql" <<EOF
SET 'pipeline.name' = 'recovery';
SET 'execution.checkpointing.interval' = '20 s';
SET 'execution.checkpointing.incremental' = 'true';
SET 'restart-strategy.type' = 'fixed-delay';
SET 'restart-strategy.fixed-delay.delay' = '0 ms';
$CHECKPOINTS
CREATE TABLE bid (
  auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING,
  dateTime TIMESTAMP(3), extra STRING
) WITH ('connector' = 'nexmark', 'nexmark.table' = 'bid', 'nexmark.events' = '1000000000');
CREATE TABLE out (auction BIGINT, bidder BIGINT, dateTime TIMESTAMP(3), url STRING, extra STRING, n BIGINT)
  WITH ('connector' = 'blackhole');
INSERT INTO out
SELECT auction, bidder, dateTime, MAX(url), MAX(extra), COUNT(*) FROM bid GROUP BY auction, bidder, dateTime;
EOF

PEERS="127.0.0.1:$(port),127.0.0.1:$(port)"
start() { # $1 = index
  "$WEIR" --data-dir "$WORK/w$1" worker --index "$1" --peers "$PEERS" "$WORK/job.sql" \
    > /dev/null 2>> "$WORK/w$1.log" &
  echo $!
}

echo "== $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); commit $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo ?)"
echo "== 2 workers x p1, checkpoints in a shared directory; kill once a checkpoint holds >= $TARGET bytes of state"
P0=$(start 0)
P1=$(start 1)
state=0
while [ "$state" -lt "$TARGET" ]; do
  sleep 1
  alive "$P0" || { echo "worker 0 ended:"; tail -20 "$WORK/w0.log"; exit 1; }
  state=$(grep -o 'completed in [0-9]* ms ([^)]*), state [0-9]*' "$WORK/w0.log" | tail -1 | grep -o '[0-9]*$' || echo 0)
  state=${state:-0}
done
grep 'completed in' "$WORK/w0.log" | tail -1 | sed 's/.*checkpoint:[^ ]* //'
lines0=$(wc -l < "$WORK/w0.log")
lines1=$(wc -l < "$WORK/w1.log")
t_kill=$(now)
kill -9 "$P1"
# Worker 0 ends once it finds worker 1 gone (not this shell's child: poll).
while alive "$P0"; do sleep 0.01; done
t_detect=$(now)
P0=$(start 0)
P1=$(start 1)
# Running again: each worker has opened its restored state.
until [ "$(tail -n +"$((lines0 + 1))" "$WORK/w0.log" | grep -c 'opened in')" -ge 1 ] \
  && [ "$(tail -n +"$((lines1 + 1))" "$WORK/w1.log" | grep -c 'opened in')" -ge 1 ]; do
  sleep 0.05
  alive "$P0" || { echo "worker 0 ended:"; tail -20 "$WORK/w0.log"; exit 1; }
done
t_running=$(now)
kill "$P0" "$P1" 2> /dev/null || true
printf 'detection (kill -9 of worker 1 -> worker 0 exits): %6.2f s\n' "$(echo "$t_detect - $t_kill" | bc)"
printf 'restart -> both running on restored state:        %6.2f s\n' "$(echo "$t_running - $t_detect" | bc)"
printf 'total:                                            %6.2f s\n' "$(echo "$t_running - $t_kill" | bc)"
echo "-- worker 0 after the restart:"
tail -n +"$((lines0 + 1))" "$WORK/w0.log" | grep -E 'restoring from|opened in' | sed 's/.*checkpoint:[^ ]* //'
echo "-- worker 1 after the restart:"
tail -n +"$((lines1 + 1))" "$WORK/w1.log" | grep -E 'restoring from|opened in' | sed 's/.*checkpoint:[^ ]* //'
