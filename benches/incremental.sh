#!/usr/bin/env bash
# Incremental checkpoints of a fixed key set (issue 41's target: after 5 %
# of the keys changed, a checkpoint uploads at most 10 % of the state).
#
#   benches/incremental.sh [keys] [changed %] [local|s3]...
#
# A keyed aggregate (`MAX(v), COUNT(*)` per key) over a monitored directory
# (`source.monitor-interval`): a first file holds every key once with a
# random 200-character value (RocksDB cannot compress it away), the job
# checkpoints every 3 s until the state stops changing; then a second file
# updates `changed` % of the keys, chosen at random. Reported per
# checkpoint: state, bytes uploaded, duration; the figure is the bytes
# uploaded for the update (every checkpoint from the file's arrival until
# the state is still again) over the state. Then the job is killed and
# restored from the store on a new machine (the local data dir deleted) at
# parallelism 1, 2 and 4: the restore time the log reports.
#
# Needs the release binary (cargo build --release --bin weir) and, for
# s3, SeaweedFS (scripts/setup.sh).
set -euo pipefail
KEYS=${1:-4000000}
CHANGED=${2:-5}
shift $(( $# > 2 ? 2 : $# ))
TARGETS=${*:-local s3}
WEIR=${WEIR:-${CARGO_TARGET_DIR:-target}/release/weir}
WORK=$(mktemp -d)
WEED_PID=
cleanup() { [ -n "$WEED_PID" ] && kill "$WEED_PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

echo "== input: $KEYS keys, then $CHANGED % of them updated"
python3 - "$WORK" "$KEYS" "$CHANGED" <<'PY'
import os, random, sys
work, keys, changed = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
rnd = random.Random(41)
def value():
    return rnd.randbytes(100).hex()
with open(os.path.join(work, "all.json"), "w") as f:
    for k in range(keys):
        f.write('{"k":%d,"v":"%s"}\n' % (k, value()))
with open(os.path.join(work, "update.json"), "w") as f:
    for k in sorted(rnd.sample(range(keys), int(keys * changed / 100))):
        f.write('{"k":%d,"v":"%s"}\n' % (k, value()))
PY
ls -l "$WORK"/all.json "$WORK"/update.json | awk '{ print $5, $9 }'

S3_SET=
# shellcheck source=benches/s3_server.sh
. "$(cd "$(dirname "$0")" && pwd)/s3_server.sh"

# The completed checkpoints of a log: "id state uploaded duration_ms".
checkpoints() {
  grep -oE 'checkpoint [0-9]+ completed in [0-9]+ ms .*state [0-9]+ bytes, uploaded [0-9]+ bytes' "$1" |
    sed -E 's/checkpoint ([0-9]+) completed in ([0-9]+) ms .*state ([0-9]+) bytes, uploaded ([0-9]+) bytes/\1 \3 \4 \2/'
}
# Waits until the state is no longer $3 and stayed the same over three
# checkpoints after checkpoint $2 (the input is read and its changes are
# all in a checkpoint).
settle() {
  local log=$1 after=$2 base=$3
  for _ in $(seq 1200); do
    if checkpoints "$log" | awk -v a="$after" '$1 > a' | tail -3 |
       awk -v b="$base" 'NR == 1 { s = $2 } $2 != s { d = 1 } END { exit !(NR == 3 && !d && s != b) }'; then
      return 0
    fi
    sleep 0.5
  done
  echo "the state did not settle" >&2
  return 1
}

run() { # target, checkpoint dir, SET lines
  local target=$1 dir=$2 set=$3
  rm -rf "$WORK/in" && mkdir -p "$WORK/in"
  cat > "$WORK/job-$target.sql" <<SQL
SET 'parallelism.default' = '2';
SET 'pipeline.name' = 'bench-incremental';
SET 'execution.checkpointing.interval' = '3 s';
SET 'execution.checkpointing.dir' = '$dir';
$set
CREATE TABLE kv (k BIGINT, v STRING)
  WITH ('connector' = 'filesystem', 'path' = '$WORK/in', 'format' = 'json', 'source.monitor-interval' = '1 s');
CREATE TABLE sink (k BIGINT, v STRING, n BIGINT) WITH ('connector' = 'blackhole');
INSERT INTO sink SELECT k, MAX(v), COUNT(*) FROM kv GROUP BY k;
SQL
  cp "$WORK/all.json" "$WORK/in/.all.json" && mv "$WORK/in/.all.json" "$WORK/in/all.json"
  local log="$WORK/run-$target.log"
  WEIR_LOG=warn,weir::checkpoint=info "$WEIR" --data-dir "$WORK/data-$target" run "$WORK/job-$target.sql" 2> "$log" > /dev/null &
  local pid=$!
  settle "$log" 0 0
  local before state
  before=$(checkpoints "$log" | tail -1 | cut -d' ' -f1)
  state=$(checkpoints "$log" | tail -1 | cut -d' ' -f2)
  cp "$WORK/update.json" "$WORK/in/.update.json" && mv "$WORK/in/.update.json" "$WORK/in/update.json"
  settle "$log" "$before" "$state"
  kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null || true
  echo "== $target: checkpoints (id, state bytes, uploaded bytes, ms)"
  checkpoints "$log"
  checkpoints "$log" | awk -v b="$before" '
    $1 <= b { full = $2 }
    $1 > b { up += $3; last = $2 }
    END { printf "update of '"$CHANGED"' %% of keys: uploaded %.1f MB over the checkpoints after it, %.1f %% of the %.1f MB state\n",
          up / 1e6, 100 * up / last, last / 1e6 }'
  for p in 1 2 4; do
    rm -rf "$WORK/data-$target"
    sed "s/'parallelism.default' = '2'/'parallelism.default' = '$p'/" "$WORK/job-$target.sql" > "$WORK/restore.sql"
    WEIR_LOG=warn,weir::checkpoint=info "$WEIR" --data-dir "$WORK/data-$target" run "$WORK/restore.sql" 2> "$WORK/restore-$target-$p.log" > /dev/null &
    pid=$!
    while ! grep -q 'state of .* opened in' "$WORK/restore-$target-$p.log" && kill -0 $pid 2>/dev/null; do sleep 0.1; done
    kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null || true
    echo "restore at p=$p: $(grep -oE 'restoring from checkpoint [0-9]+.*' "$WORK/restore-$target-$p.log" | sed -E 's/\(.*\): //' | head -1);" \
      "$(grep -oE 'opened in [0-9]+ ms' "$WORK/restore-$target-$p.log" | head -1)"
  done
}

for t in $TARGETS; do
  case $t in
    local) run local "$WORK/ckpt" "" ;;
    s3) [ -z "$WEED_PID" ] && start_s3 "$WORK/s3"; run s3 "s3://weir/incremental" "$S3_SET" ;;
    *) echo "unknown target $t" >&2; exit 2 ;;
  esac
done
