#!/usr/bin/env bash
# `shm` push/pull against the CPU copy ceiling (memcpy, same run), and a whole step (push + commit
# + pull, one rank, FP32) over shm and inline. Usage: bench/run_shm_bench.sh [BUILD_DIR] [ARGS...]
# (ARGS go to paramd_shm_bench, e.g. --elements=1000000000 on a machine with the memory).
# BUILD_DIR may also be a bundle made by scripts/bundle.sh (a machine without gRPC).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${PARAMD_BUILD_DIR:-$root/build}}
shift || true
work=$(mktemp -d)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

# From the build tree, or through a bundle's run.sh (which execs, so $! is the daemon itself).
if [ -x "$build/run.sh" ]; then
  daemon=("$build/run.sh" paramd)
  bench=("$build/run.sh" paramd_shm_bench)
else
  daemon=("$build/server/paramd")
  bench=("$build/bench/paramd_shm_bench")
fi
"${daemon[@]}" --listen=127.0.0.1:0 --metrics_listen= --address_file="$work/addr" 2>"$work/log" &
pid=$!
for _ in $(seq 100); do [ -s "$work/addr" ] && break; sleep 0.1; done
"${bench[@]}" --address="$(cat "$work/addr")" "$@" | tee "$work/out"
result=$(grep '^RESULT' "$work/out")
python3 - "$result" <<'PY'
import sys
r = {k: float(v) for k, v in (kv.split("=") for kv in sys.argv[1].split()[1:])}
copy = r["copy_gbps"]
print()
print("| what | figure | ratio to memcpy (best, %.2f GB/s, one thread) | target |" % copy)
print("| --- | --- | --- | --- |")
print("| shm push | %.2f GB/s | %.2f | >= 0.8 |" % (r["push_gbps"], r["push_gbps"] / copy))
print("| shm pull (copy out) | %.2f GB/s | %.2f | >= 0.8 |" % (r["pull_gbps"], r["pull_gbps"] / copy))
print("| shm pull in place + release | %.0f us | no copy | |" % r["view_us"])
print("| step of %.3g parameters, shm | %.1f ms | | |" % (r["elements"], r["shm_step_ms"]))
print("| step of %.3g parameters, inline | %.1f ms | shm %.2fx faster | |" %
      (r["elements"], r["inline_step_ms"], r["inline_step_ms"] / r["shm_step_ms"]))
PY
