#!/usr/bin/env bash
# Installs what building Weir needs on Debian/Ubuntu beyond Rust itself:
# clang and libclang (bindgen for the RocksDB bindings), a C++ toolchain,
# python3 for the REPL test, and a venv with the ADBC Flight SQL driver for
# the third-party client test (scripts/adbc-venv.sh).
# Safe to run again: it only installs what is missing.
set -euo pipefail

packages=(clang libclang-dev g++ make pkg-config)
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

# The ADBC client test's venv (pinned driver and pyarrow; quick when present).
"$(dirname "$0")/adbc-venv.sh" >/dev/null
echo "setup: ok"
