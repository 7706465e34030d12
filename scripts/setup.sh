#!/usr/bin/env bash
# Installs what building Weir needs on Debian/Ubuntu beyond Rust itself:
# clang and libclang (bindgen for the RocksDB bindings), a C++ toolchain,
# python3 for the REPL test, and a venv with the ADBC Flight SQL driver for
# the third-party client test (scripts/adbc-venv.sh), zlib for librdkafka
# (the Kafka client, built from the rdkafka crate's sources), and the Kafka
# tests' broker.
# Safe to run again: it only installs what is missing.
set -euo pipefail

packages=(clang libclang-dev g++ make pkg-config zlib1g-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# The REPL test drives the shell through a pseudo-terminal with Python.
command -v python3 >/dev/null 2>&1 || missing+=(python3)
# The TLS test makes its certificates with openssl.
command -v openssl >/dev/null 2>&1 || missing+=(openssl)

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; install Rust from https://rustup.rs first" >&2
  exit 1
fi

# The Kafka tests' broker: tansu 0.6.0 (a Kafka-protocol broker in Rust,
# in-memory storage), built once per machine into ~/.cache/weir-tools
# (about 15 minutes on 2 cores; tests/kafka.rs finds it there). Its
# successor nisshi needs a newer rustc than these machines have.
tools="${WEIR_TOOLS:-$HOME/.cache/weir-tools}"
if [ ! -x "$tools/bin/tansu" ]; then
  echo "setup: building the Kafka test broker (tansu 0.6.0), once per machine"
  env -u CARGO_TARGET_DIR cargo install tansu --locked --version 0.6.0 --no-default-features --features dynostore \
    --root "$tools" --quiet
fi

# The ADBC client test's venv (pinned driver and pyarrow; quick when present).
"$(dirname "$0")/adbc-venv.sh" >/dev/null
echo "setup: ok"
