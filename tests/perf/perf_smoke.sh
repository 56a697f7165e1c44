#!/usr/bin/env bash
# The perf smoke of the test command (an exception to "targets live in benchmarks", so that a large
# regression of the same-node paths fails CI): a few seconds of the benchmarks at fixed sizes, each
# figure the best of several runs, as ratios against a ceiling measured in the same run, held to
# half of DESIGN.md §10's targets:
#   shm push and pull (copy out) of 256 MiB   >= 0.4 of memcpy, measured in the same process
#   inline push and pull of 64 MiB            >= 0.25 of one-stream iperf3 over loopback
#   a whole step of 64 Mi FP32 parameters     faster over shm than over inline
# Each measurement gets a daemon of its own. Usage: tests/perf/perf_smoke.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-${PARAMD_BUILD_DIR:-$root/build}}
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
command -v iperf3 >/dev/null || { echo "perf_smoke: iperf3 is missing (scripts/setup.sh installs it)"; exit 1; }

# Runs one program against a daemon started for it; its output goes to $work/out.NAME.
phase() {
  local name=$1
  shift
  rm -f "$work/addr"
  "$build/server/paramd" --listen=127.0.0.1:0 --metrics_listen= --address_file="$work/addr" \
    --log_level=warning 2>"$work/log.$name" &
  local pid=$!
  pids+=("$pid")
  local addr
  addr=$("$build/tools/paramctl" wait "$work/addr" "$pid") ||
    { echo "perf_smoke: the daemon did not start"; cat "$work/log.$name"; exit 1; }
  "$@" --address="$addr" >"$work/out.$name"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}

started=$(date +%s)
elements=$((64 << 20))
phase shm "$build/bench/paramd_shm_bench" --mib=256 --iters=4 --call_iters=0 --many_tensors=0 \
  --elements=$elements --step_iters=3 --step_transports=shm
phase inline_step "$build/bench/paramd_shm_bench" --transfers=false --call_iters=0 \
  --many_tensors=0 --elements=$elements --step_iters=3 --step_transports=inline
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
iperf3 -s -1 -B 127.0.0.1 -p "$port" >/dev/null 2>&1 &
pids+=($!)
sleep 0.3
iperf3 -c 127.0.0.1 -p "$port" -t 2 -P 1 -J >"$work/iperf.json"
phase inline "$build/bench/paramd_inline_bench" --mib=64 --iters=4 --small_iters=20

python3 - "$work" "$(( $(date +%s) - started ))" <<'PY'
import json, sys
work, seconds = sys.argv[1], sys.argv[2]

def result(name):
    for line in open(f"{work}/out.{name}"):
        if line.startswith("RESULT "):
            return {k: float(v) for k, v in (kv.split("=") for kv in line.split()[1:])
                    if v.replace(".", "", 1).isdigit()}
    sys.exit(f"perf_smoke: no RESULT line from {name}")

shm, step, inline = result("shm"), result("inline_step"), result("inline")
iperf = json.load(open(f"{work}/iperf.json"))["end"]["sum_received"]["bits_per_second"] / 8e9
rows = [
    ("shm push 256 MiB / memcpy", shm["push_best_gbps"] / shm["copy_gbps"], 0.4),
    ("shm pull 256 MiB (copy out) / memcpy", shm["pull_best_gbps"] / shm["copy_gbps"], 0.4),
    ("inline push 64 MiB / iperf3", inline["push_best_gbps"] / iperf, 0.25),
    ("inline pull 64 MiB / iperf3", inline["pull_best_gbps"] / iperf, 0.25),
    ("step of 64 Mi parameters: inline ms / shm ms", step["inline_step_best_ms"] / shm["shm_step_best_ms"],
     1.0),
]
print(f"perf smoke (best of the runs; memcpy {shm['copy_gbps']:.2f} GB/s, iperf3 {iperf:.2f} GB/s, "
      f"shm step {shm['shm_step_best_ms']:.0f} ms, inline step {step['inline_step_best_ms']:.0f} ms, {seconds} s)")
print("| what | ratio | bar |")
print("| --- | --- | --- |")
failed = False
for what, ratio, bar in rows:
    ok = ratio > bar if bar == 1.0 else ratio >= bar
    failed |= not ok
    print(f"| {what} | {ratio:.2f} | {'>' if bar == 1.0 else '>='} {bar}{'' if ok else '  FAILED'} |")
sys.exit(1 if failed else 0)
PY
