#!/usr/bin/env bash
# scripts/check_disk.sh passes where there is room, and refuses, saying where and how much, where
# there is not: the build trees' room, less what trees already there hold, and torch's room where
# the venv has no torch, on one file system added up.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
check=$root/scripts/check_disk.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
# expect STATUS TEXT [ENV...] -- ARGS: runs the check with ENV and ARGS, wants STATUS and TEXT.
expect() {
  local want=$1 text=$2 out status=0; shift 2
  local env=()
  while [ "$1" != -- ]; do env+=("$1"); shift; done
  shift
  out=$(env "${env[@]}" "$check" "$@" 2>&1) || status=$?
  if [ "$status" -ne "$want" ] || ! grep -qF -- "$text" <<<"$out"; then
    echo "FAIL: ${env[*]} check_disk.sh $*: exit $status (want $want), output: $out"
    fails=$((fails + 1))
  else
    echo "ok: ${env[*]} check_disk.sh $* exits $want${text:+ saying \"$text\"}"
  fi
}
free_gb() { df -Pk "$work" | awk 'NR == 2 { printf "%.6f", $4 / 1048576 + '"$1"' }'; }

expect 0 "" PARAMD_DISK_NEED_GB=0 -- "$work/build"
expect 1 "the build trees $work/build{,-asan,-fuzz}" PARAMD_DISK_NEED_GB=1000000 -- "$work/build"
expect 1 "check_disk: $work has" PARAMD_DISK_NEED_GB=1000000 -- "$work/build"
expect 0 "" PARAMD_DISK_NEED_GB=1000000 PARAMD_SKIP_DISK_CHECK=1 -- "$work/build"
# A venv without torch needs torch's room too; one file system: the two added up.
mkdir -p "$work/venv"
expect 1 "torch in the venv $work/venv" PARAMD_DISK_NEED_GB=0 PARAMD_VENV_NEED_GB=1000000 -- \
  "$work/build" "$work/venv"
expect 0 "" PARAMD_DISK_NEED_GB=0 PARAMD_VENV_NEED_GB=0 -- "$work/build" "$work/venv"
expect 1 "and torch" PARAMD_DISK_NEED_GB="$(free_gb -0.5)" PARAMD_VENV_NEED_GB=1 -- \
  "$work/build" "$work/venv"
# Trees already there count as room: 1 GiB held in a build-asan, asked for free + 0.5 GiB.
if [ "$(df -Pk "$work" | awk 'NR == 2 { print $4 }')" -gt $((3 * 1024 * 1024)) ] &&
    mkdir -p "$work/held-asan" && fallocate -l 1G "$work/held-asan/blob" 2>/dev/null; then
  expect 0 "" PARAMD_DISK_NEED_GB="$(free_gb 0.5)" -- "$work/held"
  expect 1 "needs about" PARAMD_DISK_NEED_GB="$(free_gb 0.5)" -- "$work/other"
else
  echo "note: no 3 GB free or no fallocate here; the held-trees case did not run"
fi
[ "$fails" -eq 0 ] && echo "disk_test: every case as expected"
exit "$fails"
