#!/usr/bin/env bash
# Fails at once, saying how much room is missing, where the test command's output cannot fit: a
# full disk otherwise stops the build minutes in, at some link, with `No space left on device`.
# What a fresh clone's test command writes (docs/testing.md): the build trees BUILD, BUILD-asan and
# BUILD-fuzz, 3.0 GB together (PARAMD_DISK_NEED_GB, default 4, less what those trees already hold),
# on the build's file system; and where the Python tests' venv has no torch yet (scripts/setup.sh
# installs it), PARAMD_VENV_NEED_GB more (default 6: PyPI's torch with its CUDA runtime packages
# is 5.4 GB) on the venv's. PARAMD_SKIP_DISK_CHECK=1 skips the check.
# Usage: check_disk.sh BUILD_DIR [VENV_DIR]
set -euo pipefail
build=${1:?usage: check_disk.sh BUILD_DIR [VENV_DIR]}
venv=${2:-}
[ "${PARAMD_SKIP_DISK_CHECK:-0}" = 1 ] && exit 0
gib=$((1024 * 1024))  # KiB per GiB

# The nearest folder of `path` that exists (a fresh clone has no build/ yet).
existing() {
  local path=$1
  while [ ! -e "$path" ]; do path=$(dirname "$path"); done
  echo "$path"
}
free_kib() { df -Pk "$(existing "$1")" | awk 'NR == 2 { print $4 }'; }
device() { stat -c %d "$(existing "$1")"; }
gb() { awk -v k="$1" 'BEGIN { printf "%.1f GB", k / 1048576 }'; }

held=0
for tree in "$build" "$build-asan" "$build-fuzz"; do
  [ -d "$tree" ] && held=$((held + $(du -sk "$tree" | cut -f1)))
done
need_build=$(awk -v g="${PARAMD_DISK_NEED_GB:-4}" -v k=$gib 'BEGIN { printf "%d", g * k }')
need_build=$((need_build > held ? need_build - held : 0))
need_venv=0
if [ -n "$venv" ] && ! { [ -x "$venv/bin/python" ] &&
                         "$venv/bin/python" -c "import torch" 2>/dev/null; }; then
  need_venv=$(awk -v g="${PARAMD_VENV_NEED_GB:-6}" -v k=$gib 'BEGIN { printf "%d", g * k }')
fi

fail=0
refuse() {  # file system of `where`, KiB needed there, what for
  local where=$1 need=$2 what=$3 free
  free=$(free_kib "$where")
  if [ "$free" -lt "$need" ]; then
    echo "check_disk: $(existing "$where") has $(gb "$free") free; the test command needs about" \
      "$(gb "$need") there ($what): free some room, point PARAMD_BUILD_DIR or PARAMD_VENV at" \
      "another disk, or set PARAMD_SKIP_DISK_CHECK=1 to try anyway"
    fail=1
  fi
}
if [ "$need_venv" -gt 0 ] && [ "$(device "$build")" = "$(device "$venv")" ]; then
  refuse "$build" $((need_build + need_venv)) \
    "the build trees $build{,-asan,-fuzz} and torch in the venv $venv"
else
  refuse "$build" "$need_build" "the build trees $build{,-asan,-fuzz}"
  [ "$need_venv" -gt 0 ] && refuse "$venv" "$need_venv" "torch in the venv $venv"
fi
exit $fail
