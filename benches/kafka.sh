#!/usr/bin/env bash
# Kafka read and write rates (issue 13), against tansu started here on a
# free port with in-memory storage: the at-least-once and exactly-once
# sinks (Nexmark bids as JSON), the librdkafka consumer alone reading the
# topic (the physical limit), Weir's q0 (topic → blackhole; JSON, and raw
# without the decode) and a q5-style
# HOP count from the topic, at parallelism 1 (and q0 JSON at 2 too).
#
#   benches/kafka.sh [rows]      (needs a release build and scripts/setup.sh's tansu)
set -euo pipefail
cd "$(dirname "$0")/.."
rows="${1:-2000000}"
bin="${WEIR:-${CARGO_TARGET_DIR:-target}/release/weir}"
tansu="${WEIR_TANSU:-$HOME/.cache/weir-tools/bin/tansu}"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
dir="$(mktemp -d)"
(cd "$dir" && exec "$tansu" broker --listener-url "tcp://127.0.0.1:$port" \
  --advertised-listener-url "tcp://127.0.0.1:$port" --storage-engine memory://tansu/ >broker.log 2>&1) &
broker=$!
trap 'kill $broker 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.1
done
echo "# $(uname -m), $(nproc) cores, commit $(git rev-parse --short HEAD), tansu 510f3e2 (memory), $rows rows"
WEIR_BENCH_BROKER_PID=$broker "$bin" bench kafka --bootstrap "127.0.0.1:$port" --rows "$rows" "${@:2}"
