#!/usr/bin/env bash
# Delta sink benchmark (issue 43): q0-style pass-through of Nexmark bids
# (the generator's seven columns, strings included; five written) into a
# Delta table, beside the Parquet file sink in the same run, at parallelism
# 1 and 2, checkpoints every 10 s. Prints rows/s, the Delta commits (their
# latency and files) and the files per checkpoint.
#
#   benches/delta.sh [events]      (default 5 000 000)
#
# Needs the release binary: cargo build --release --bin weir
set -euo pipefail
EVENTS=${1:-5000000}
WEIR=${WEIR:-${CARGO_TARGET_DIR:-target}/release/weir}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

run() { # label, parallelism, sink DDL's WITH clause
  local label=$1 p=$2 with=$3
  cat > "$WORK/$label.sql" <<SQL
SET 'parallelism.default' = '$p';
SET 'pipeline.name' = 'bench-delta';
SET 'execution.checkpointing.interval' = '10 s';
CREATE TABLE bid WITH ('connector' = 'nexmark', 'nexmark.table' = 'bid', 'nexmark.events' = '$EVENTS');
CREATE TABLE sink (auction BIGINT, bidder BIGINT, price BIGINT, dateTime TIMESTAMP(3), extra STRING)
  WITH ($with);
INSERT INTO sink SELECT auction, bidder, price, dateTime, extra FROM bid;
SQL
  local start end
  start=$(date +%s.%N)
  "$WEIR" --data-dir "$WORK/data-$label" run "$WORK/$label.sql" 2> "$WORK/$label.log" > /dev/null
  end=$(date +%s.%N)
  local secs
  secs=$(awk "BEGIN { print $end - $start }")
  local rows
  rows=$(awk "BEGIN { printf \"%.0f\", $EVENTS * 0.92 / $secs }")
  local checkpoints
  checkpoints=$(grep -c ' completed in ' "$WORK/$label.log" || true)
  local files
  files=$(find "$WORK/out-$label" -name '*.parquet' -not -name '.*' | wc -l)
  echo "$label (p$p): $secs s, ~$rows bids/s, $checkpoints checkpoints, $files parquet files, $(du -sh "$WORK/out-$label" | cut -f1)"
  grep -E 'Delta table .* committed as version' "$WORK/$label.log" | sed 's/.*Delta table/  Delta table/' || true
}

for p in 1 2; do
  run "parquet-p$p" "$p" "'connector' = 'filesystem', 'path' = '$WORK/out-parquet-p$p', 'format' = 'parquet'"
  run "delta-p$p" "$p" "'connector' = 'delta', 'path' = '$WORK/out-delta-p$p'"
done
