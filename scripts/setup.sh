#!/usr/bin/env bash
# Installs everything mltrain needs to build, test and run on Debian 12, then builds it.
# Usage: scripts/setup.sh [--no-build] [--test-deps]
set -euo pipefail
cd "$(dirname "$0")/.."

build=1 test_deps=0
for a in "$@"; do
  case "$a" in
    --no-build) build=0 ;;
    --test-deps) test_deps=1 ;;
    *) echo "setup.sh: unknown option '$a'" >&2; exit 2 ;;
  esac
done

packages=(build-essential cmake ninja-build pkg-config git
  libcli11-dev libssh-dev libtomlplusplus-dev
  nlohmann-json3-dev libspdlog-dev libfmt-dev doctest-dev libzstd-dev libxxhash-dev libre2-dev)
if [ "$test_deps" = 1 ]; then
  packages+=(clang-format python3 python3-pytest python3-pytest-xdist python3-torch python3-numpy python3-venv python3-setuptools python3-wheel python3-yaml zstd openssh-server openssh-client iproute2 procps bash-completion zsh fish tcsh tmux slurmctld slurmd slurm-client munge)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [ "$build" = 1 ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  # Only the binary: the tests and benchmarks are built by scripts/test.sh.
  cmake --build build -j"$(nproc)" --target mltrain
fi
