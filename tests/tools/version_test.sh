#!/usr/bin/env bash
# scripts/check_version.sh passes on the tree and refuses a recipe, a document or the Python
# package that names another version than CMakeLists.txt's, planted in a copy of those files.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$root" && git ls-files -co --exclude-standard -- CMakeLists.txt README.md docs docker deploy \
   python/README.md python/pyproject.toml | tar -cf - -T -) | tar -xf - -C "$work"

"$root/scripts/check_version.sh" "$work" >/dev/null || { echo "FAIL: the tree itself is refused"; exit 1; }
version=$(sed -nE 's/^project\(paramd VERSION ([0-9.]+).*/\1/p' "$work/CMakeLists.txt")

# Each case: a file, a sed expression that plants a disagreement, and what the refusal must say.
fails=0
check() {
  local file=$1 edit=$2 expect=$3
  cp "$work/$file" "$work/$file.orig"
  sed -i -E "$edit" "$work/$file"
  local out status=0
  out=$("$root/scripts/check_version.sh" "$work" 2>&1) || status=$?
  mv "$work/$file.orig" "$work/$file"
  if [ "$status" -ne 1 ] || ! grep -qF "$expect" <<<"$out"; then
    echo "FAIL: $file edited with $edit: exit $status, output:"
    echo "$out"
    fails=$((fails + 1))
  else
    echo "ok: $file edited with $edit is refused"
  fi
}
check deploy/kubernetes/daemonset.yaml "s/paramd:$version-cpu/paramd:9.9.9-cpu/" \
  "deploy/kubernetes/daemonset.yaml:"
check docker/README.md "s/paramd:$version-cuda/paramd:9.9.9-cuda/" "docker/README.md:"
check python/pyproject.toml 's/^dynamic = .*/version = "9.9.9"/' "must read its version"
# The project's version moves: every written tag is now behind it.
check CMakeLists.txt "s/^project\\(paramd VERSION $version/project(paramd VERSION 9.9.9/" \
  "names paramd $version, not the project's 9.9.9"

[ "$fails" -eq 0 ] || exit 1
echo "version_test: every disagreement is refused"
