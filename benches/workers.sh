#!/usr/bin/env bash
# The cost of the network exchange (issue 42): the same Nexmark job as one
# process at parallelism 2, and as 2 `weir worker` processes of one
# subtask each on this machine (loopback), in turn; and the recovery after
# a worker is killed.
#
#   benches/workers.sh [events] [runs]
#
# Shapes: q0 (source -> sink, chained: no exchange at all), and a keyed
# HOP (2 s slide, 10 s size, COUNT(*) per auction) whose hash exchange
# sends half of the bids across the process boundary. Nexmark bids, all
# seven columns (strings included), into a blackhole. Wall time of the
# whole job (the last worker's exit).
#
# Needs the release binary (cargo build --release --bin weir).
set -euo pipefail
EVENTS=${1:-4000000}
RUNS=${2:-3}
WEIR=${WEIR:-${CARGO_TARGET_DIR:-target}/release/weir}
WORK=$(mktemp -d)
cleanup() { pkill -P $$ 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

sql() { # $1 = q0|hop, $2 = extra SET lines
  cat <<EOF
SET 'pipeline.name' = 'bench-$1';
$2
CREATE TABLE bid (
  auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING,
  dateTime TIMESTAMP(3), extra STRING,
  WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND
) WITH ('connector' = 'nexmark', 'nexmark.table' = 'bid', 'nexmark.events' = '$EVENTS');
CREATE TABLE out_q0 (auction BIGINT, bidder BIGINT, price BIGINT, dateTime TIMESTAMP(3), extra STRING)
  WITH ('connector' = 'blackhole');
CREATE TABLE out_hop (auction BIGINT, bids BIGINT, window_end TIMESTAMP(3)) WITH ('connector' = 'blackhole');
EOF
  if [ "$1" = q0 ]; then
    echo "INSERT INTO out_q0 SELECT auction, bidder, 908 * price / 1000, dateTime, extra FROM bid;"
  else
    echo "INSERT INTO out_hop SELECT auction, COUNT(*), window_end FROM TABLE(HOP(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '2' SECOND, INTERVAL '10' SECOND)) GROUP BY auction, window_start, window_end;"
  fi
}

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

one_process() { # $1 = shape
  sql "$1" "SET 'parallelism.default' = '2';" > "$WORK/one.sql"
  rm -rf "$WORK/one-data"
  local t0 t1
  t0=$(date +%s.%N)
  "$WEIR" --data-dir "$WORK/one-data" run "$WORK/one.sql" > /dev/null 2> "$WORK/one.log"
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc
}

two_workers() { # $1 = shape
  sql "$1" "" > "$WORK/two.sql"
  rm -rf "$WORK"/w0 "$WORK"/w1
  local peers t0 t1
  peers="127.0.0.1:$(port),127.0.0.1:$(port)"
  t0=$(date +%s.%N)
  "$WEIR" --data-dir "$WORK/w0" worker --index 0 --peers "$peers" "$WORK/two.sql" > /dev/null 2> "$WORK/w0.log" &
  local p0=$!
  "$WEIR" --data-dir "$WORK/w1" worker --index 1 --peers "$peers" "$WORK/two.sql" > /dev/null 2> "$WORK/w1.log" &
  local p1=$!
  wait "$p0" "$p1"
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc
}

echo "== $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); commit $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo ?)"
echo "== Nexmark bids (7 columns), $EVENTS events; seconds of wall time, runs alternating"
for shape in q0 hop; do
  for run in $(seq "$RUNS"); do
    a=$(one_process "$shape")
    b=$(two_workers "$shape")
    printf '%-4s run %d  1 process x p2: %6.2f s   2 workers x p1: %6.2f s   (%+.0f %%)\n' \
      "$shape" "$run" "$a" "$b" "$(echo "($b - $a) * 100 / $a" | bc -l)"
  done
done
