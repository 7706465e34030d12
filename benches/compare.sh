#!/usr/bin/env bash
# Every query of benches/queries on Weir and Flink 2.3, side by side, at
# parallelism 1 and 2, heap and RocksDB state (docs/benchmarks.md); the
# updating queries at parallelism 1 with RocksDB state.
#   benches/compare.sh            (needs a release build; Flink optional)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${WEIR:-${CARGO_TARGET_DIR:-target}/release/weir}"
q=benches/queries
for p in 1 2; do
  "$bin" bench compare $q/passthrough.sql $q/projection.sql $q/passthrough_json.sql $q/projection_json.sql $q/filter.sql $q/tumble_max.sql $q/hop_count.sql -p "$p" --state-backend hashmap --runs 2
  "$bin" bench compare $q/tumble_max.sql $q/hop_count.sql -p "$p" --state-backend rocksdb --runs 2
done
# Updating queries (GROUP BY, joins, Top-N, deduplication) with RocksDB state
# on both engines, as the issue asks.
"$bin" bench compare $q/group_counts.sql $q/join_auction.sql $q/join_agg_avg.sql $q/top10.sql $q/dedup_last.sql \
  -p 1 --state-backend rocksdb --runs 1 --rows 1000000
# Nexmark's updating queries (Flink's SQL) over the same generated events.
"$bin" bench compare $q/nexmark_q3.sql $q/nexmark_q4.sql $q/nexmark_q9.sql $q/nexmark_q15.sql $q/nexmark_q16.sql \
  $q/nexmark_q17.sql $q/nexmark_q18.sql $q/nexmark_q19.sql $q/nexmark_q20.sql \
  -p 1 --state-backend rocksdb --runs 1 --rows 1000000
