#!/usr/bin/env bash
# Sets everything up on Debian 12 (as root, or with sudo) and runs the whole test suite:
# unit tests (also under ASan+UBSan), then the end-to-end tests against the built binary.
# Usage: scripts/test.sh [--no-sanitize] [--unit-only] [-- PYTEST_ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=1 unit_only=0 pytest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-sanitize) sanitize=0 ;;
    --unit-only) unit_only=1 ;;
    --) shift; pytest_args=("$@"); break ;;
    *) echo "test.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done

jobs=$(nproc)
step() { printf '\n==> %s\n' "$*"; }

step "installing dependencies"
scripts/setup.sh --no-build --test-deps

step "format check (clang-format with .clang-format; fix with: git ls-files '*.cpp' '*.h' '*.hpp' '*.c' | xargs clang-format -i)"
git ls-files '*.cpp' '*.h' '*.hpp' '*.c' | xargs clang-format --dry-run --Werror

step "building (RelWithDebInfo)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$jobs"

step "unit tests"
ctest --test-dir build -L unit --output-on-failure -j"$jobs"

step "comm integration tests (installed package, a killed rank, bitwise-identical SGD)"
ctest --test-dir build -L comm -LE unit --output-on-failure

if [ "$sanitize" = 1 ]; then
  step "unit tests under AddressSanitizer + UndefinedBehaviorSanitizer"
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMLTRAIN_SANITIZE=ON >/dev/null
  cmake --build build-asan -j"$jobs" --target unit_tests
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan -L unit --output-on-failure -j"$jobs"
fi

[ "$unit_only" = 1 ] && exit 0

step "end-to-end tests"
export MLTRAIN_BIN="$PWD/build/mltrain"
/usr/bin/python3 -m pytest tests/e2e -q -p no:cacheprovider "${pytest_args[@]}"
