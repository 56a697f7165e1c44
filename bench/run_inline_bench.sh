#!/usr/bin/env bash
# `inline` push/pull against one-stream iperf3 over loopback, measured in the same run, plus the
# small-tensor round trip. Usage: bench/run_inline_bench.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${PARAMD_BUILD_DIR:-$root/build}}
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

command -v iperf3 >/dev/null || { echo "iperf3 is missing (scripts/setup.sh installs it)"; exit 1; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
iperf3 -s -1 -B 127.0.0.1 -p "$port" >/dev/null 2>&1 &
pids+=($!)
sleep 0.5
iperf_gbps=$(iperf3 -c 127.0.0.1 -p "$port" -t 5 -P 1 -J |
  python3 -c 'import json,sys; print("%.3f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9))')

# The daemon with its default limits (4 MiB push chunks, 1 MiB pull chunks).
"$build/server/paramd" --listen=127.0.0.1:0 --metrics_listen= --address_file="$work/addr" \
  2>"$work/log" &
pids+=($!)
addr=$("$build/tools/paramctl" wait "$work/addr" "${pids[-1]}") ||
  { cat "$work/log"; echo "paramd did not start"; exit 1; }
"$build/bench/paramd_inline_bench" --address="$addr" | tee "$work/out"
result=$(grep '^RESULT' "$work/out")
python3 - "$iperf_gbps" "$result" <<'PY'
import sys
iperf = float(sys.argv[1])
r = dict(kv.split("=") for kv in sys.argv[2].split()[1:])
push, pull = float(r["push_gbps"]), float(r["pull_gbps"])
print()
print("| what | GB/s | ratio to iperf3 (%.2f GB/s, one stream) | target |" % iperf)
print("| --- | --- | --- | --- |")
print("| inline push, 64 MiB, one stream | %.2f | %.2f | >= 0.5 |" % (push, push / iperf))
print("| inline pull, 64 MiB, one stream | %.2f | %.2f | >= 0.5 |" % (pull, pull / iperf))
print("| 4 KiB push+commit+pull | p50 %s us, p99 %s us | | |" % (r["rtt_p50_us"], r["rtt_p99_us"]))
PY
