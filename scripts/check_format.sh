#!/usr/bin/env bash
# Fails when a C++ or CUDA file of the project is not clang-formatted (.clang-format).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mapfile -t files < <(git ls-files -co --exclude-standard -- '*.h' '*.cc' '*.cu' '*.cuh')
[ ${#files[@]} -gt 0 ] || exit 0
if ! clang-format --dry-run -Werror "${files[@]}" 2>/tmp/paramd-format.$$; then
  grep -E '^[^ ].*(warning|error):' /tmp/paramd-format.$$ | cut -d: -f1 | sort -u | sed 's/^/not formatted: /'
  rm -f /tmp/paramd-format.$$
  echo "check_format: run clang-format -i on the files above"
  exit 1
fi
rm -f /tmp/paramd-format.$$
echo "check_format: ${#files[@]} files formatted"
