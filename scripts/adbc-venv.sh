#!/usr/bin/env bash
# Creates the Python venv of the tests that check Weir with other
# people's code: the ADBC Flight SQL client test (tests/adbc/weir_adbc_test.py:
# the ADBC driver manager, the Flight SQL driver, pyarrow) and the Delta
# tests' independent reader and writer (tests/delta.rs: delta-rs's Python
# package `deltalake`) and reference answers (DuckDB), at pinned versions.
# Safe to run again: a venv that already has the pinned versions is left
# alone. Prints the venv's python on stdout (progress goes to stderr).
#   WEIR_ADBC_VENV  where the venv lives (default ~/.cache/weir-adbc-venv)
set -euo pipefail

venv="${WEIR_ADBC_VENV:-$HOME/.cache/weir-adbc-venv}"
pins=(adbc-driver-manager==1.13.0 adbc-driver-flightsql==1.13.0 pyarrow==26.0.1 deltalake==1.6.6 duckdb==1.5.6)
py="$venv/bin/python"

# True when the venv's python runs and has every pinned version.
pinned() {
  "$py" - "${pins[@]}" >/dev/null 2>&1 <<'EOF'
import sys
from importlib.metadata import version
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    assert version(name) == want, pin
EOF
}

if [ -x "$py" ] && pinned; then
  echo "adbc-venv: ok ($py)" >&2
  echo "$py"
  exit 0
fi

# A venv whose python no longer runs (its base python went away) is rebuilt.
if [ -e "$venv" ] && ! "$py" -c '' >/dev/null 2>&1; then
  echo "adbc-venv: $venv is broken; recreating it" >&2
  rm -rf "$venv"
fi

if [ ! -x "$py" ]; then
  mkdir -p "$(dirname "$venv")"
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    # Debian ships venv (ensurepip) separately, in python3-venv.
    rm -rf "$venv"
    echo "adbc-venv: installing python3-venv" >&2
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv "$venv"
  fi
fi

echo "adbc-venv: installing ${pins[*]} into $venv" >&2
"$py" -m pip install --quiet --disable-pip-version-check --only-binary=:all: "${pins[@]}"
pinned || { echo "adbc-venv: the pinned versions did not install" >&2; exit 1; }
echo "$py"
