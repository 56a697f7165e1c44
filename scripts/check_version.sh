#!/usr/bin/env bash
# Fails when a recipe or a document names another paramd version than the CMake project's (the one
# version: CMakeLists.txt's project(paramd VERSION ...)). The programs' --version, the daemon's
# Status and paramd.__version__ are compiled from it; the wheel's metadata reads it
# (python/pyproject.toml: dynamic version, a regex over CMakeLists.txt); the image tags in the
# recipes and the docs are written out, and checked here. Usage: check_version.sh [ROOT]
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"

version=$(sed -nE 's/^project\(paramd VERSION ([0-9]+\.[0-9]+\.[0-9]+).*/\1/p' CMakeLists.txt)
if [ -z "$version" ]; then
  echo "check_version: no project(paramd VERSION X.Y.Z) line in CMakeLists.txt"
  exit 1
fi

failures=0
# The Python package takes its version from CMake; a static one would drift.
if grep -qE '^version *=' python/pyproject.toml || ! grep -qE '^dynamic *= *\[.*"version"' \
    python/pyproject.toml; then
  echo "check_version: python/pyproject.toml must read its version from CMakeLists.txt" \
    '(dynamic = ["version"], [tool.scikit-build.metadata.version]), not write it'
  failures=$((failures + 1))
fi
# Image tags (paramd:X.Y.Z-cpu) and printed versions (paramd X.Y.Z) in the recipes and the docs.
while IFS=: read -r file line text; do
  found=$(grep -oE 'paramd[: ][0-9]+\.[0-9]+\.[0-9]+' <<<"$text" | grep -oE '[0-9.]+$' | sort -u)
  for v in $found; do
    if [ "$v" != "$version" ]; then
      echo "check_version: $file:$line names paramd $v, not the project's $version"
      failures=$((failures + 1))
    fi
  done
done < <(grep -rnE 'paramd[: ][0-9]+\.[0-9]+\.[0-9]+' README.md docs docker deploy python/README.md \
           2>/dev/null || true)

if [ "$failures" -gt 0 ]; then
  echo "check_version: $failures place(s) disagree with CMakeLists.txt's version $version"
  exit 1
fi
echo "check_version: the recipes and docs name version $version, CMake's"
