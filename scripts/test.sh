#!/usr/bin/env bash
# The test command: installs what is missing, checks formatting, the rooms' include rules and that
# the recipes name CMake's version, builds everything (CUDA code included when the toolkit is
# present), runs every test that needs no GPU, then the sanitizer build's tests
# (scripts/sanitize.sh) and a short fuzzing run (scripts/fuzz.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PARAMD_BUILD_DIR:-$root/build}
start=$(date +%s)

# Room for the build trees (and torch, where setup.sh has it to install), checked before anything
# is installed or built: a full disk would stop the build at some link, minutes in.
venv=()
if [ "${PARAMD_SETUP_PYTHON:-1}" != 0 ]; then
  venv=("${PARAMD_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/paramd/venv}")
fi
"$root/scripts/check_disk.sh" "$build" "${venv[@]}"
"$root/scripts/setup.sh"
"$root/scripts/check_format.sh"
"$root/scripts/check_rooms.sh"
"$root/scripts/check_version.sh"
"$root/scripts/build.sh"
# UCX over loopback needs its device named (DESIGN.md §6).
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
ctest --test-dir "$build" -LE gpu --output-on-failure -j "$(nproc)" --timeout 600
tested=$(date +%s)
# The core, kernels and RPC tests again under ASan and UBSan, in a build of their own.
"$root/scripts/sanitize.sh"
sanitized=$(date +%s)
# About 20 s of libFuzzer per target (config, registration, push path), clang-14.
"$root/scripts/fuzz.sh"
fuzzed=$(date +%s)
echo "test.sh: build and ctest $(( tested - start )) s, sanitize.sh $(( sanitized - tested )) s," \
  "fuzz.sh $(( fuzzed - sanitized )) s"
echo "test.sh: all tests passed in $(( $(date +%s) - start )) s"
