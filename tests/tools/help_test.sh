#!/usr/bin/env bash
# `--help` of every program paramd builds prints its usage and its own flags, and exits 0;
# `--version` prints its name and the project's one version (CMakeLists.txt), and exits 0.
# Usage: tests/tools/help_test.sh BUILD_DIR
set -euo pipefail
build=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
version=$(sed -nE 's/^project\(paramd VERSION ([0-9.]+) .*/\1/p' "$root/CMakeLists.txt")
[ -n "$version" ] || { echo "help_test: no version in CMakeLists.txt's project()"; exit 1; }
check() {
  local program=$1 flag=$2
  local out
  if ! out=$("$build/$program" --help 2>&1); then
    echo "help_test: $program --help exited non-zero:"; echo "$out"; exit 1
  fi
  if ! grep -q -- "--$flag " <<<"$out"; then
    echo "help_test: $program --help does not list --$flag:"; echo "$out"; exit 1
  fi
  if grep -q "No flags matched" <<<"$out"; then
    echo "help_test: $program --help found no flags"; exit 1
  fi
  echo "help_test: $program --help lists its flags ($(grep -c -- '^  --' <<<"$out"))"
  if ! out=$("$build/$program" --version 2>&1) || [ "$out" != "$(basename "$program") $version" ]; then
    echo "help_test: $program --version says \"$out\", not \"$(basename "$program") $version\""
    exit 1
  fi
}
check server/paramd backend
check tools/paramctl address
check examples/mlp/paramd_train_mlp world_size
check examples/classifier/paramd_train_classifier steps
check bench/paramd_shm_bench mib
check bench/paramd_inline_bench mib
