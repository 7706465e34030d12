#!/usr/bin/env bash
# The many-keys window shape (issue 10), Weir beside Flink 2.3 in one run:
# a 5 M-row CSV of bids (10 000 auctions drawn uniformly, 10 rows per ms of
# event time), HOP 10 s / 2 s COUNT(*) per auction into a blackhole sink,
# parallelism 1, heap and RocksDB state.
#
#   benches/many_keys.sh [rows]        (needs a release build and, for the
#                                        Flink figures, ~/.cache/flink23)
set -euo pipefail
cd "$(dirname "$0")/.."
rows="${1:-5000000}"
work="${BENCH_DIR:-$HOME/.cache/weir-bench}/many-keys"
mkdir -p "$work"
csv="$work/bids-$rows.csv"
if [ ! -f "$csv" ]; then
  python3 - "$csv" "$rows" <<'PY'
import random, sys, datetime
path, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(7)
base = datetime.datetime(2024, 1, 1)
with open(path + ".tmp", "w") as f:
    for i in range(n):
        ms = i // 10
        t = base + datetime.timedelta(milliseconds=ms)
        f.write(f"{rng.randrange(10000)},{rng.randrange(1, 10000)},{t:%Y-%m-%d %H:%M:%S}.{ms % 1000:03d}\n")
import os; os.rename(path + ".tmp", path)
PY
fi
bin="${WEIR:-${CARGO_TARGET_DIR:-target}/release/weir}"
sql() {  # $1: state backend (weir's name)
  cat <<SQL
SET 'parallelism.default' = '1';
SET 'table.dml-sync' = 'true';
SET 'state.backend.type' = '$1';
CREATE TABLE bid (auction BIGINT, price BIGINT, \`dateTime\` TIMESTAMP(3),
  WATERMARK FOR \`dateTime\` AS \`dateTime\` - INTERVAL '1' SECOND
) WITH ('connector' = 'filesystem', 'path' = '$csv', 'format' = 'csv');
CREATE TABLE sink (auction BIGINT, window_start TIMESTAMP(3), window_end TIMESTAMP(3), cnt BIGINT)
  WITH ('connector' = 'blackhole');
INSERT INTO sink SELECT auction, window_start, window_end, COUNT(*)
FROM TABLE(HOP(TABLE bid, DESCRIPTOR(\`dateTime\`), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
GROUP BY auction, window_start, window_end;
SQL
}
echo "commit $(git rev-parse --short HEAD), $(nproc) cores,$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "| engine | state | seconds | rows/s |"
echo "|---|---|---:|---:|"
for backend in hashmap rocksdb; do
  sql "$backend" > "$work/weir-$backend.sql"
  data="$work/data-$backend"; rm -rf "$data"
  start=$(date +%s.%N)
  "$bin" --data-dir "$data" run "$work/weir-$backend.sql" > /dev/null
  end=$(date +%s.%N)
  secs=$(echo "$end - $start" | bc -l)
  printf "| Weir | %s | %.2f | %'.0f |\n" "$backend" "$secs" "$(echo "$rows / $secs" | bc -l)"
done
flink="${FLINK_PYTHON:-$HOME/.cache/flink23/bin/python}"
if [ -x "$flink" ]; then
  for backend in hashmap rocksdb; do
    # Flink's file has no SET of the backend: its runner sets it.
    sql "$backend" | grep -v "^SET 'state.backend.type'\|^SET 'table.dml-sync'" > "$work/flink-$backend.sql"
    out=$("$flink" ../shared/tools/flink/run_flink_sql.py "$work/flink-$backend.sql" -p 1 \
      --state-backend "$backend" --rows "$rows" 2>&1 | grep "rows/s" || true)
    net=$(echo "$out" | sed -n 's/.*rows\/s (net runtime): \([0-9,]*\).*/\1/p')
    printf "| Flink 2.3 | %s | | %s (net runtime) |\n" "$backend" "$net"
  done
fi
