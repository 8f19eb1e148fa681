#!/usr/bin/env bash
# Installs the 'comm' component of a build into a temporary prefix, builds comm/tests/consumer
# against it with find_package(mltrain), and runs it on 2 ranks (C++ API) and 3 ranks (C API).
#   comm/tests/check_install.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: check_install.sh BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/mltrain-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --component comm --prefix "$work/prefix" >/dev/null
cmake -S "$here/consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
run() {
  local n=$1 exe=$2 port=$((20000 + RANDOM % 12000)) pids=() r  # ports below the ephemeral range
  for ((r = 0; r < n; r++)); do
    RANK=$r WORLD_SIZE=$n MLTRAIN_STORE_ADDR=127.0.0.1:$port MLTRAIN_TOKEN=install "$exe" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
}
cpp=$(run 2 "$work/build/cpp_user")
c=$(run 3 "$work/build/c_user")
echo "$cpp"; echo "$c"
[[ $(grep -c ': 2 4$' <<<"$cpp") == 2 && $(grep -c 'max rank 2$' <<<"$c") == 3 ]] ||
  { echo "FAIL: unexpected output from the installed library" >&2; exit 1; }
echo "OK: find_package(mltrain) works"
