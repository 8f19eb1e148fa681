#!/usr/bin/env bash
# Sets everything up on Debian 12 (as root, or with sudo) and runs the whole test suite:
# unit tests (also under ASan+UBSan), the comm tier, then the end-to-end tests against the
# built binary. Prints a table of each stage's time at the end (docs/testing.md).
# Usage: scripts/test.sh [--quick] [--no-sanitize] [--unit-only] [-- PYTEST_ARGS...]
#   --quick: format check, build, unit tier and the local e2e smoke set (pytest -m smoke) only.
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=1 unit_only=0 quick=0 pytest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --no-sanitize) sanitize=0 ;;
    --unit-only) unit_only=1 ;;
    --) shift; pytest_args=("$@"); break ;;
    *) echo "test.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done

jobs=$(nproc)
export LC_NUMERIC=C  # $EPOCHREALTIME with a decimal point
stage_names=() stage_secs=() stage_status=()
suite_start=$EPOCHREALTIME
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

# One row per stage: its name, wall seconds and status, printed whether the suite passes or not.
print_stages() {
  local rc=$? i
  printf '\n==> stage timings (%s cores, load %s)\n' "$jobs" "$(cut -d' ' -f1-3 /proc/loadavg)"
  for i in "${!stage_names[@]}"; do
    printf '  %-44s %8.1f s  %s\n' "${stage_names[$i]}" "${stage_secs[$i]}" "${stage_status[$i]}"
  done
  printf '  %-44s %8.1f s  %s\n' "total" "$(elapsed "$suite_start")" \
    "$([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)")"
}
trap print_stages EXIT

# stage NAME CMD...: runs CMD under a banner and records its time; a failure ends the suite.
# (set -e does not reach inside CMD here: the functions below chain their steps with &&.)
stage() {
  local name=$1 t0=$EPOCHREALTIME rc=0
  shift
  printf '\n==> %s\n' "$name"
  "$@" || rc=$?
  stage_names+=("$name")
  stage_secs+=("$(elapsed "$t0")")
  stage_status+=("$([ "$rc" = 0 ] && echo ok || echo "FAILED (exit $rc)")")
  return "$rc"
}

format_check() {
  # Fix with: git ls-files '*.cpp' '*.h' '*.hpp' '*.c' | xargs clang-format -i
  git ls-files '*.cpp' '*.h' '*.hpp' '*.c' | xargs clang-format --dry-run --Werror
}
build() {
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null &&
    cmake --build build -j"$jobs"
}
build_asan() {
  # The unit tests only: no agent (none of them starts one), so not the comm runtime or bench either.
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMLTRAIN_SANITIZE=ON -DMLTRAIN_EMBED_AGENT=OFF >/dev/null &&
    cmake --build build-asan -j"$jobs" --target unit_tests
}
unit_asan() {
  # Each test's limit is 300 s here (tests/CMakeLists.txt): test_comm, the longest, took 48 s loaded.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan -L unit --output-on-failure -j"$jobs"
}
e2e() {
  MLTRAIN_BIN="$PWD/build/mltrain" /usr/bin/python3 -m pytest tests/e2e -q -p no:cacheprovider "$@"
}

stage "dependencies" scripts/setup.sh --no-build --test-deps
stage "format check (clang-format)" format_check
stage "build (RelWithDebInfo)" build
stage "unit tests (ctest -L unit)" ctest --test-dir build -L unit --output-on-failure -j"$jobs"

if [ "$quick" = 1 ]; then
  stage "e2e smoke set (pytest -m smoke)" e2e -m smoke "${pytest_args[@]}"
  exit 0
fi

stage "comm tier (ctest -L comm -LE unit)" ctest --test-dir build -L comm -LE unit --output-on-failure

if [ "$sanitize" = 1 ]; then
  stage "build (ASan+UBSan, unit tests only)" build_asan
  stage "unit tests under ASan+UBSan" unit_asan
fi

[ "$unit_only" = 1 ] && exit 0

stage "end-to-end tests (pytest tests/e2e)" e2e "${pytest_args[@]}"
