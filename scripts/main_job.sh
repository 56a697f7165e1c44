#!/usr/bin/env bash
# The main job, on built binaries: starts paramd with its default config (cpu backend, loopback,
# metrics on 127.0.0.1), trains the example MLP with WORLD_SIZE (2) trainer ranks through it for
# STEPS (200) steps, checks the final weights bit for bit against a local reference, shows the
# daemon's status and metrics, stops the daemon. Exits non-zero when anything differs or fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PARAMD_BUILD_DIR:-$root/build}
steps=${STEPS:-200}
world=${WORLD_SIZE:-2}

work=$(mktemp -d)
daemon_pid=""
cleanup() {
  [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# Default config, except that both ports are picked free so the job never collides with another.
"$build/server/paramd" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
  --address_file="$work/address" 2>"$work/paramd.log" &
daemon_pid=$!
address=$("$build/tools/paramctl" wait "$work/address" "$daemon_pid") ||
  { cat "$work/paramd.log"; echo "paramd did not start"; exit 1; }
metrics=$(grep -o 'http://[^ )]*/metrics' "$work/paramd.log" | head -1)
echo "paramd is serving on $address (metrics $metrics)"

pids=()
for ((rank = 1; rank < world; rank++)); do
  "$build/examples/mlp/paramd_train_mlp" --address="$address" --rank=$rank --world_size="$world" \
    --steps="$steps" >"$work/rank$rank.log" 2>&1 &
  pids+=($!)
done
status=0
"$build/examples/mlp/paramd_train_mlp" --address="$address" --rank=0 --world_size="$world" \
  --steps="$steps" --check || status=$?
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done

echo
"$build/tools/paramctl" --address="$address" status
echo
echo "metrics ($metrics):"
curl -s "$metrics" | grep -E '^paramd_(steps_total|trainers_attached|pushed_bytes_total|pulled_bytes_total|step_duration_seconds_(count|sum))' || true

kill -TERM "$daemon_pid"
wait "$daemon_pid" || status=$?
daemon_pid=""
if [ "$status" -ne 0 ]; then
  echo "main job FAILED (status $status); daemon log:"
  cat "$work/paramd.log"
  for f in "$work"/rank*.log; do [ -e "$f" ] && { echo "--- $f"; cat "$f"; }; done
  exit 1
fi
echo "main job passed"
