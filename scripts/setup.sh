#!/usr/bin/env bash
# Installs what paramd needs on Debian 12 (apt), only what is missing. Safe to run again.
#   scripts/setup.sh        everything the build, the tests, the benchmarks and the bindings use
#   scripts/setup.sh main   what the main job's build uses (scripts/run_main_job.sh): a compiler,
#                           CMake, gRPC, protobuf, Abseil, prometheus-cpp and curl; no Python
set -euo pipefail

# The main job: the daemon, paramctl and the example trainer, CPU-only, and curl for /metrics.
main_packages=(
  build-essential cmake ninja-build pkg-config ca-certificates curl
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  prometheus-cpp-dev
)
if [ "${1:-}" = main ]; then
  packages=("${main_packages[@]}")
  PARAMD_SETUP_PYTHON=0
else
  packages=(
    "${main_packages[@]}" git grpc-proto
    libucx-dev ucx-utils libgtest-dev libgmock-dev libbenchmark-dev
    clang-format iperf3 prometheus python3
    pybind11-dev python3-dev python3-venv python3-yaml
    clang-14 libclang-rt-14-dev patchelf
  )
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Python for the bindings and the PyTorch test (python/, tests/python/): a venv of Debian's python3
# (the interpreter every Debian 12 machine has; its pip refuses system-wide installs) kept under
# the user's cache, so CI runs on one machine install torch once. CMake finds it there
# (python/CMakeLists.txt); PARAMD_VENV moves it. PARAMD_SETUP_PYTHON=0 skips it (an image that
# ships only the daemon needs neither torch nor its several GB of CUDA runtime packages).
if [ "${PARAMD_SETUP_PYTHON:-1}" != 0 ]; then
  venv=${PARAMD_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/paramd/venv}
  [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
  if ! "$venv/bin/python" -c "import torch, numpy" 2>/dev/null; then
    started=$(date +%s)
    # The CPU wheel index keeps the NVIDIA runtime packages (several GB) out; where that index
    # cannot be reached, PyPI's torch (which depends on them) is the only one left.
    if ! "$venv/bin/python" -m pip install -q --index-url https://download.pytorch.org/whl/cpu \
        torch 2>/dev/null; then
      echo "setup: the CPU wheel index is not reachable; installing torch from PyPI" \
        "(with its CUDA runtime packages)"
      "$venv/bin/python" -m pip install -q torch
    fi
    "$venv/bin/python" -m pip install -q numpy
    echo "setup: torch and numpy installed into $venv in $(( $(date +%s) - started )) s"
  fi
fi
