#!/usr/bin/env bash
# `shm` push/pull against the CPU copy ceiling (memcpy, same run), per-call costs, and a whole step
# (push + commit + pull, one rank) over shm and over inline, each transport's step in a daemon of
# its own (a daemon keeps every job it registered, and 1e9 parameters are many bytes).
# Usage: bench/run_shm_bench.sh [BUILD_DIR] [ARGS...]; ARGS go to paramd_shm_bench, e.g.
# --elements=1000000000 --step_policy=fp8 (13 bytes per parameter in the daemon).
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
  ctl=("$build/run.sh" paramctl)
  bench=("$build/run.sh" paramd_shm_bench)
else
  daemon=("$build/server/paramd")
  ctl=("$build/tools/paramctl")
  bench=("$build/bench/paramd_shm_bench")
fi

# Runs the bench with ARGS against a daemon started for it; its output goes to $work/out.$1.
phase() {
  local name=$1
  shift
  rm -f "$work/addr"
  "${daemon[@]}" --listen=127.0.0.1:0 --metrics_listen= --address_file="$work/addr" \
    2>"$work/log.$name" &
  pid=$!
  local addr
  addr=$("${ctl[@]}" wait "$work/addr" "$pid") ||
    { cat "$work/log.$name"; echo "paramd did not start"; exit 1; }
  "${bench[@]}" --address="$addr" "$@" | tee "$work/out.$name"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=""
}
phase shm "$@" --step_transports=shm
phase inline "$@" --transfers=false --call_iters=0 --many_tensors=0 --step_transports=inline

python3 - "$work/out.shm" "$work/out.inline" <<'PY'
import sys

def fields(path, tag):
    out = {}
    for line in open(path):
        if line.startswith(tag + " ") or line.rstrip() == tag:
            for kv in line.split()[1:]:
                k, v = kv.split("=")
                try:
                    out[k] = float(v)
                except ValueError:
                    out[k] = v
    return out

r = fields(sys.argv[1], "RESULT")
r.update(fields(sys.argv[2], "RESULT"))
calls = fields(sys.argv[1], "CALLS")
print()
print("| what | figure | ratio | target |")
print("| --- | --- | --- | --- |")
if "copy_gbps" in r:
    copy = r["copy_gbps"]
    print("| memcpy, one thread (the ceiling) | %.2f GB/s | 1 | |" % copy)
    print("| shm push | %.2f GB/s | %.2f of memcpy | >= 0.8 |" % (r["push_gbps"], r["push_gbps"] / copy))
    print("| shm pull (copy out) | %.2f GB/s | %.2f of memcpy | >= 0.8 |" %
          (r["pull_gbps"], r["pull_gbps"] / copy))
    print("| shm pull in place + release | %.0f us | no copy | |" % r["view_us"])
if calls:
    u = calls["unary_us"]
    for key, what in (("push_us", "push"), ("commit_us", "commit"), ("pull_us", "pull, copy out"),
                      ("view_us", "pull in place"), ("release_us", "release")):
        print("| per call, small tensor: %s | %.0f us | %.2f of a no-op unary RPC (%.0f us) | |" %
              (what, calls[key], calls[key] / u, u))
if "many_ms" in r:
    print("| pull of %d tensors of %d KiB after a step, one Pull each | %.2f ms | | |" %
          (r["many_tensors"], r["many_kib"], r["one_by_one_ms"]))
    print("| the same, one PullMany | %.2f ms | %.2fx faster | |" %
          (r["many_ms"], r["one_by_one_ms"] / r["many_ms"]))
if "shm_step_ms" in r and "inline_step_ms" in r:
    print("| step of %.3g parameters (%s policy), shm | %.1f ms | | |" %
          (r["elements"], r["policy"], r["shm_step_ms"]))
    print("| step of %.3g parameters (%s policy), inline | %.1f ms | shm %.2fx faster | |" %
          (r["elements"], r["policy"], r["inline_step_ms"], r["inline_step_ms"] / r["shm_step_ms"]))
PY
