#!/usr/bin/env bash
# What a token costs (issue: trust at the boundary), measured pair by pair in one run, rounds
# interleaved: inline push/pull GB/s and the 4 KiB round trip of a daemon without tokens over TCP
# against one with a token file, the client sending its token ($PARAMD_TOKEN_FILE); and the shm
# whole step (push + commit + pull) without a token over TCP against a token over a Unix socket.
# Target: within 2 %. Usage: bench/run_token_bench.sh [BUILD_DIR] [ROUNDS] [ELEMENTS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${PARAMD_BUILD_DIR:-$root/build}}
rounds=${2:-3}
elements=${3:-20000000}
work=$(mktemp -d)
chmod 700 "$work"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
token=bench-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
(umask 077; printf 'admin %s\n' "$token" >"$work/tokens"; echo "$token" >"$work/client.token")

# start NAME ARGS...: a daemon of its own; its address goes to $work/NAME.addr
start() {
  local name=$1
  shift
  "$build/server/paramd" --metrics_listen= --address_file="$work/$name.addr" "$@" \
    2>"$work/$name.log" &
  pids+=($!)
  "$build/tools/paramctl" --token_file="$work/client.token" wait "$work/$name.addr" "${pids[-1]}" \
    >/dev/null || { cat "$work/$name.log"; echo "paramd $name did not start"; exit 1; }
}
: >"$work/results"
for round in $(seq "$rounds"); do
  # Daemons of the round's own (the benches' jobs have fixed names).
  start open --listen=127.0.0.1:0
  start token --listen=127.0.0.1:0 --token_file="$work/tokens"
  start socket --listen="unix:$work/paramd.sock" --token_file="$work/tokens"
  open=$(cat "$work/open.addr")
  token_addr=$(cat "$work/token.addr")
  socket=$(cat "$work/socket.addr")
  # inline: without, then with a token (the order alternates between rounds)
  for side in $([ $((round % 2)) = 1 ] && echo "open token" || echo "token open"); do
    if [ "$side" = open ]; then
      r=$(PARAMD_TOKEN_FILE= "$build/bench/paramd_inline_bench" --address="$open" | grep '^RESULT')
    else
      r=$(PARAMD_TOKEN_FILE="$work/client.token" "$build/bench/paramd_inline_bench" \
        --address="$token_addr" | grep '^RESULT')
    fi
    echo "inline $side $r" >>"$work/results"
  done
  for side in $([ $((round % 2)) = 1 ] && echo "open socket" || echo "socket open"); do
    args=(--elements="$elements" --transfers=false --call_iters=0 --many_tensors=0
          --step_transports=shm --step_iters=3)
    if [ "$side" = open ]; then
      r=$(PARAMD_TOKEN_FILE= "$build/bench/paramd_shm_bench" --address="$open" "${args[@]}" |
        grep '^RESULT')
    else
      r=$(PARAMD_TOKEN_FILE="$work/client.token" "$build/bench/paramd_shm_bench" \
        --address="$socket" "${args[@]}" | grep '^RESULT')
    fi
    echo "shm $side $r" >>"$work/results"
  done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
  rm -f "$work"/*.addr
done
python3 - "$work/results" "$elements" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    kind, side, _, *kv = line.split()
    rows.setdefault((kind, side), []).append(dict(x.split("=", 1) for x in kv))
def cell(kind, side, key):
    v = [float(r[key]) for r in rows[(kind, side)]]
    return statistics.median(v), "%.3g (%.3g-%.3g)" % (statistics.median(v), min(v), max(v))
print("| figure | no token, TCP: median (min-max) | token | token / no token, medians | target |")
print("| --- | --- | --- | --- | --- |")
for key, name, target in (("push_gbps", "inline push GB/s, token over TCP", ">= 0.98"),
                          ("pull_gbps", "inline pull GB/s, token over TCP", ">= 0.98"),
                          ("rtt_p50_us", "4 KiB push+commit+pull p50 us, token over TCP", "")):
    (a, ta), (b, tb) = cell("inline", "open", key), cell("inline", "token", key)
    print("| %s | %s | %s | %.3f | %s |" % (name, ta, tb, b / a, target))
(a, ta), (b, tb) = cell("shm", "open", "shm_step_ms"), cell("shm", "socket", "shm_step_ms")
print("| shm whole step of %s parameters ms, token over a Unix socket | %s | %s | %.3f | <= 1.02 |"
      % (sys.argv[2], ta, tb, b / a))
print("(%d interleaved rounds, each with daemons of its own)" % len(rows[("inline", "open")]))
PY
