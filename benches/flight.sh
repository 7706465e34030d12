#!/usr/bin/env bash
# Flight SQL server benchmark: a release `weir serve` driven by the ADBC
# driver (benches/flight.py): prepared query latency, 200 concurrent
# clients, live subscription throughput.
#
# Needs the release binary (cargo build --release --bin weir) and the ADBC
# venv (scripts/adbc-venv.sh).
set -euo pipefail
WEIR=${WEIR:-${CARGO_TARGET_DIR:-target}/release/weir}
PY=$("$(dirname "$0")/../scripts/adbc-venv.sh" 2>/dev/null)
WORK=$(mktemp -d)
PORT=${PORT:-50123}
"$WEIR" --data-dir "$WORK/data" serve --listen "127.0.0.1:$PORT" 2> "$WORK/server.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 100); do
  (echo > "/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
  sleep 0.1
done
"$PY" "$(dirname "$0")/flight.py" "grpc://127.0.0.1:$PORT"
