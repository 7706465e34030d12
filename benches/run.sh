#!/usr/bin/env bash
# Runs the recorded benchmarks on a release build and prints markdown tables
# to paste into docs/benchmarks.md together with the machine and commit.
#
#   benches/run.sh [events]
set -euo pipefail
cd "$(dirname "$0")/.."
events="${1:-10000000}"
cargo build --release --bin weir
bin="${CARGO_TARGET_DIR:-target}/release/weir"
echo "commit $(git rev-parse --short HEAD), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
"$bin" bench nexmark --events "$events"
"$bin" bench nexmark --events "$events" --queries q5,q7 --state-backend hashmap | tail -n 2
"$bin" bench alignment --events "$events" --rate 400000
"$bin" bench alignment --events "$events" --rate 400000 --buffer-size 0 | tail -n 1
"$(dirname "$0")/checkpoint.sh" 22000000 15
WEIR="$bin" "$(dirname "$0")/flight.sh"
WEIR="$bin" "$(dirname "$0")/compare.sh"
WEIR="$bin" "$(dirname "$0")/state_size/run.sh"
# The many-keys HOP beside Flink, savepoint and restore times, and Kafka
# (a tansu broker from scripts/setup.sh) — every table docs/benchmarks.md
# records.
WEIR="$bin" "$(dirname "$0")/many_keys.sh"
"$bin" bench savepoint --state-mib 1024 --parallelism 2
WEIR="$bin" "$(dirname "$0")/kafka.sh" 4000000
