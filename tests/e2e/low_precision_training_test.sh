#!/usr/bin/env bash
# Low-precision training through a real daemon (DESIGN.md §3's training bar): starts build/server/paramd
# on a free port, trains the example classifier through it with its defaults (fp8 exp_avg, fp16
# exp_avg_sq, mxfp8 rowwise weights; one rank), which also trains the same model with local FP32
# AdamW and exits non-zero unless the daemon-trained held-out loss is within 2 % of it; then stops
# the daemon. Usage: low_precision_training_test.sh [BUILD_DIR] [extra trainer flags...]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-${PARAMD_BUILD_DIR:-$root/build}}
shift || true

work=$(mktemp -d)
daemon_pid=""
cleanup() {
  if [ -n "$daemon_pid" ]; then
    kill "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

"$build/server/paramd" --listen=127.0.0.1:0 --metrics_listen= --address_file="$work/address" \
  2>"$work/paramd.log" &
daemon_pid=$!
address=$("$build/tools/paramctl" wait "$work/address" "$daemon_pid") ||
  { cat "$work/paramd.log"; echo "paramd did not start"; exit 1; }
echo "paramd is serving on $address"

status=0
"$build/examples/classifier/paramd_train_classifier" --address="$address" "$@" || status=$?

kill -TERM "$daemon_pid"
wait "$daemon_pid" || status=$?
daemon_pid=""
if [ "$status" -ne 0 ]; then
  echo "low-precision training FAILED (status $status); daemon log:"
  cat "$work/paramd.log"
  exit 1
fi
echo "low-precision training passed"
