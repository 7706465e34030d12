#!/usr/bin/env bash
# State size once the input is consumed, Weir beside Flink 2.3, for the
# Nexmark updating queries (docs/benchmarks.md, "State size"): the same
# generated CSV events, RocksDB, parallelism 1.
#
# Both jobs are kept running after their input so their checkpoints hold
# the whole state: Flink's file tables are made continuous
# ('source.monitor-interval'); Weir's bid table becomes a view over the
# file and an idle datagen table whose rows are all filtered out. Each is
# stopped after three checkpoints in a row of the same size.
#
#   benches/state_size/run.sh [queries...]     (default: q4 q16 q17 q18 q19 q20;
#   needs a release build, the events of `benches/compare.sh --rows 1000000`,
#   and for Flink's figures ~/.cache/flink23)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${WEIR:-${CARGO_TARGET_DIR:-target}/release/weir}"
events="${BENCH_DIR:-$HOME/.cache/weir-bench}/compare/nexmark-1000000"
flink="${FLINK_PYTHON:-$HOME/.cache/flink23/bin/python}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
[ -d "$events/bid" ] || { echo "no events at $events: run benches/compare.sh (or weir bench compare --rows 1000000) first" >&2; exit 2; }
queries=("$@")
[ ${#queries[@]} -gt 0 ] || queries=(q4 q16 q17 q18 q19 q20)

for q in "${queries[@]}"; do
  src="benches/queries/nexmark_$q.sql"
  sed -e "s|\${NEXMARK_BID}|$events/bid|; s|\${NEXMARK_AUCTION}|$events/auction|; s|\${NEXMARK_PERSON}|$events/person|" \
    "$src" > "$work/$q.sql"
  # Weir: bid as the file plus an idle, never-ending source.
  python3 - "$work/$q.sql" "$work/weir-$q.sql" "$work/ck-$q" <<'PY'
import sys
src, dst, ck = sys.argv[1:4]
s = open(src).read().replace("CREATE TABLE bid (", "CREATE TABLE bid_file (", 1)
cols = "auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, `dateTime` TIMESTAMP(3), extra STRING"
idle = (f"CREATE TABLE idle ({cols}) WITH ('connector' = 'datagen', 'rows-per-second' = '1', "
        "'fields.price.min' = '1', 'fields.price.max' = '10');\n"
        "CREATE VIEW bid AS SELECT * FROM bid_file UNION ALL "
        "SELECT auction, bidder, price, channel, url, `dateTime`, extra FROM idle WHERE price < 0;\n")
at = s.index("CREATE TABLE sink")
sets = ["'parallelism.default' = '1'", "'state.backend.type' = 'rocksdb'",
        "'execution.checkpointing.interval' = '1s'", "'execution.checkpointing.num-retained' = '5'",
        f"'execution.checkpointing.dir' = 'file://{ck}'"]
open(dst, "w").write("".join(f"SET {x};\n" for x in sets) + s[:at] + idle + s[at:])
PY
  "$bin" run "$work/weir-$q.sql" --data-dir "$work/data-$q" > "$work/weir-$q.log" 2>&1 &
  pid=$!
  weir=""
  for _ in $(seq 1 600); do
    sleep 1  # polling a log file, not synchronising a test
    sizes=$(grep -o "checkpoint [0-9]* completed.*state [0-9]* bytes" "$work/weir-$q.log" | grep -o "state [0-9]*" | awk '{print $2}' || true)
    if [ "$(echo "$sizes" | grep -c .)" -ge 5 ] && [ "$(echo "$sizes" | tail -3 | sort -u | wc -l)" = 1 ]; then
      weir=$(echo "$sizes" | tail -1); break
    fi
    kill -0 $pid 2>/dev/null || { echo "Weir's $q ended:"; tail -5 "$work/weir-$q.log"; break; }
  done
  kill -9 $pid 2>/dev/null || true; wait $pid 2>/dev/null || true
  flink_bytes=""
  if [ -x "$flink" ]; then
    flink_bytes=$("$flink" benches/state_size/flink_state.py "$work/$q.sql" "$work/flink-ck-$q" 2>/dev/null \
      | grep -o "checkpoint [0-9]*: [0-9]*" | awk '{print $3}' || true)
  fi
  python3 -c "import sys; w,f=sys.argv[1],sys.argv[2]; print('| %s | %s | %s | %s |' % ('$q', '%.2f MB' % (int(w)/1e6) if w else '?', '%.2f MB' % (int(f)/1e6) if f else '-', '%.2f' % (int(w)/int(f)) if w and f else ''))" "$weir" "$flink_bytes"
done
