#!/usr/bin/env bash
# paramctl against a real daemon: status, tensors, set-lr, delete, checkpoint, restore and drain,
# human-readable and --json, and the error path (unknown job -> NOT_FOUND, exit status 1); a job
# over two daemons, and over a daemon of two backends; `wait` for a daemon that serves, one that
# exits before it serves, an address nobody answers and no address at all.
# Usage: paramctl_test.sh BUILD_DIR
set -euo pipefail
build=$1
work=$(mktemp -d)
daemon=""
second=""
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2>/dev/null
  [ -n "$second" ] && kill "$second" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

echo "checkpoint_dir: \"$work/checkpoints\"" >"$work/paramd.textproto"
"$build/server/paramd" --config="$work/paramd.textproto" --listen=127.0.0.1:0 --metrics_listen= \
  --address_file="$work/addr" --log_level=warning &
daemon=$!
addr=$("$build/tools/paramctl" wait "$work/addr" "$daemon") || fail "paramd did not serve"
ctl() { "$build/tools/paramctl" --address="$addr" "$@"; }

# wait: a daemon that exits before serving fails it at once, naming the process; an address nobody
# answers and a file never written fail it after --wait_s, saying which.
"$build/server/paramd" --listen=127.0.0.1:99999 --metrics_listen= --address_file="$work/never" \
  2>/dev/null &
doomed=$!
start=$SECONDS
if "$build/tools/paramctl" --wait_s=30 wait "$work/never" "$doomed" 2>"$work/err"; then
  fail "wait succeeded for a daemon that exited"
fi
[ $((SECONDS - start)) -lt 10 ] || fail "wait for a daemon that exited took $((SECONDS - start)) s"
grep -q "paramctl wait: process $doomed ended before the daemon served" "$work/err" ||
  fail "wait names the process that ended: $(cat "$work/err")"
wait "$doomed" 2>/dev/null || true
echo "127.0.0.1:1" >"$work/stale"
if "$build/tools/paramctl" --wait_s=0.5 wait "$work/stale" 2>"$work/err"; then
  fail "wait succeeded for an address nobody answers"
fi
grep -q "no daemon served within 0.5 s: its address 127.0.0.1:1 does not answer" "$work/err" ||
  fail "wait says the address does not answer: $(cat "$work/err")"
if "$build/tools/paramctl" --wait_s=0.2 wait "$work/absent" 2>"$work/err"; then
  fail "wait succeeded without an address file"
fi
grep -q "no daemon served within 0.2 s: it wrote no address to $work/absent" "$work/err" ||
  fail "wait says no address was written: $(cat "$work/err")"
[ "$("$build/tools/paramctl" wait "$work/addr" "$daemon")" = "$addr" ] ||
  fail "wait prints a serving daemon's address"

ctl status | grep -q "no jobs" || fail "status of an empty daemon"
"$build/examples/mlp/paramd_train_mlp" --address="$addr" --job=ctl --world_size=1 --steps=5 \
  >/dev/null 2>&1 || fail "training job"

out=$(ctl status)
echo "$out"
grep -q "job ctl: 1/1 ranks registered, next step 5" <<<"$out" || fail "status shows the job"
grep -q "^paramd .*  at $addr  backend cpu" <<<"$out" || fail "status shows the advertised address"
grep -q "^  daemons this one alone$" <<<"$out" || fail "status shows the job's daemon list"
grep -q "state by kind: master 2.3 KiB, exp_avg 2.3 KiB, exp_avg_sq 2.3 KiB" <<<"$out" \
  || fail "status shows state bytes by kind"
grep -q "skipped steps 0, clipping off" <<<"$out" || fail "status shows skips and clipping"
out=$(ctl tensors ctl)
echo "$out"
grep -qE '^w1 +32x16 +FP32 +5 ' <<<"$out" || fail "tensors lists w1 at version 5"
ctl --json status ctl | python3 -c '
import json, sys
s = json.load(sys.stdin)
job = s["jobs"][0]
assert job["name"] == "ctl" and int(job["applied_steps"]) == 5, job
assert [t["name"] for t in job["tensors"]] == ["w1", "b1", "w2", "b2"]
assert int(job["state_bytes"]) == 12 * (512 + 32 + 32 + 1), job["state_bytes"]
' || fail "--json status"

ctl set-lr ctl 0.125 | grep -q "lr 0.125" || fail "set-lr"
[ "$(ctl --json status ctl | python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["hyperparams"]["lr"])')" = "0.125" ] \
  || fail "set-lr is visible in status"

set +e
err=$(ctl tensors nosuchjob 2>&1)
code=$?
set -e
[ $code -eq 1 ] || fail "unknown job exits 1 (got $code)"
grep -q "NOT_FOUND" <<<"$err" || fail "unknown job reports NOT_FOUND: $err"
{ ctl set-lr ctl nan 2>&1 || true; } | grep -q "INVALID_ARGUMENT" || fail "set-lr nan is INVALID_ARGUMENT"

out=$(ctl status)
grep -qE "memory budget: .* of .* reserved by jobs" <<<"$out" || fail "status shows the memory budget"
grep -qE "  reserved [0-9.]+ [KMG]iB of host memory" <<<"$out" || fail "status shows the job's reservation"
# delete frees the job and its budget; the name can be trained again.
"$build/examples/mlp/paramd_train_mlp" --address="$addr" --job=gone --world_size=1 --steps=2 \
  >/dev/null 2>&1 || fail "second training job"
reserved=$(ctl --json status | python3 -c 'import json,sys; print(json.load(sys.stdin)["memory_reserved_bytes"])')
out=$(ctl delete gone)
echo "$out"
grep -qE "job gone deleted; [0-9.]+ [KMG]iB of host memory back in the budget" <<<"$out" || fail "delete"
after=$(ctl --json status | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["memory_reserved_bytes"], len(s["jobs"]))')
[ "${after#* }" = "1" ] || fail "delete removes the job ($after)"
[ "${after% *}" -lt "$reserved" ] || fail "delete gives the budget back ($reserved -> ${after% *})"
{ ctl delete gone 2>&1 || true; } | grep -q "NOT_FOUND" || fail "delete of an unknown job is NOT_FOUND"

# checkpoint and restore: one line each; the progress bar is drawn only on a terminal's stderr.
ctl checkpoint ctl >"$work/out" 2>"$work/err" || fail "checkpoint"
cat "$work/out"
grep -qE "^job ctl: version 5 checkpointed to $work/checkpoints/ctl/step-000000000005 \(" \
  "$work/out" || fail "checkpoint names the version and its directory"
[ ! -s "$work/err" ] || fail "checkpoint wrote to a stderr that is no terminal: $(cat "$work/err")"
ctl restore ctl >"$work/out" 2>"$work/err" || fail "restore"
cat "$work/out"
grep -qE "^job ctl: version 5 restored from $work/checkpoints/ctl/step-000000000005 \(" \
  "$work/out" || fail "restore names the version and its directory"
[ ! -s "$work/err" ] || fail "restore wrote to a stderr that is no terminal: $(cat "$work/err")"
ctl --json status ctl | python3 -c '
import json, sys
assert "checkpoint_progress" not in json.load(sys.stdin)["jobs"][0]
' || fail "status shows no checkpoint under way once it is done"

# A job over two daemons (the example trainer given both, which shards it over them): status shows
# each owner of its shard map with what its daemon says (its backend, the version it serves of its
# part of the job), this daemon's marked; the other daemon, once it is gone, is shown unreachable.
"$build/server/paramd" --listen=127.0.0.1:0 --metrics_listen= --address_file="$work/addr2" \
  --log_level=warning &
second=$!
addr2=$("$build/tools/paramctl" wait "$work/addr2" "$second") || fail "the second paramd did not serve"
"$build/examples/mlp/paramd_train_mlp" --address="$addr" --job=two --world_size=1 --steps=2 \
  --daemons="$addr2,$addr" >/dev/null 2>&1 || fail "training job over two daemons"
out=$(ctl status two)
echo "$out"
grep -qE "^  owner $addr cpu: [0-9]+ tensors? in [0-9]+ pieces?, [0-9]+ rows?, [0-9.]+ [KMG]?i?B of state, version 2 \(this daemon\)$" \
  <<<"$out" || fail "status shows this daemon's share of a two-daemon job and its version"
grep -qE "^  owner $addr2 cpu: [0-9]+ tensors? in [0-9]+ pieces?, [1-9][0-9]* rows?, [0-9.]+ [KMG]?i?B of state, version 2$" \
  <<<"$out" || fail "status shows the other daemon's share and the version it serves"
[ "$(grep -c "^  owner " <<<"$out")" = 2 ] || fail "status shows two owners"
kill "$second"
wait "$second" 2>/dev/null || true
second=""
ctl status two | grep -qE "^  owner $addr2 device unknown: .* of state, unreachable \(UNAVAILABLE\)$" \
  || fail "status shows a daemon of the job that is gone as unreachable, its device unknown"

# A daemon of two backends: the example trainer given its address alone shards the job over them;
# status at the daemon's address names both backends, and each backend's address gives its own.
"$build/server/paramd" --listen=127.0.0.1:0 --metrics_listen= --address_file="$work/addr3" \
  --backend=cpu:0,cpu:1 --log_level=warning &
second=$!
addr3=$("$build/tools/paramctl" wait "$work/addr3" "$second") || fail "the third paramd did not serve"
"$build/examples/mlp/paramd_train_mlp" --address="$addr3" --job=pair --world_size=1 --steps=2 \
  >/dev/null 2>&1 || fail "training job on a daemon of two backends"
out=$("$build/tools/paramctl" --address="$addr3" status pair)
echo "$out"
grep -q "^paramd .*  at $addr3/cpu:0  backend cpu:0 " <<<"$out" || fail "status of backend cpu:0"
grep -q "^backends of this daemon: $addr3/cpu:0 $addr3/cpu:1 " <<<"$out" \
  || fail "status names the daemon's backends"
grep -qE "^  owner $addr3/cpu:1 cpu:1: [0-9]+ tensors? in [0-9]+ pieces?, .*, version 2$" <<<"$out" \
  || fail "status shows the other backend's share of the job"
"$build/tools/paramctl" --address="$addr3/cpu:1" status pair | grep -q "  backend cpu:1 " \
  || fail "status at a backend's address is that backend's"
{ "$build/tools/paramctl" --address="$addr3/cpu:5" status 2>&1 || true; } | grep -q "NOT_FOUND" \
  || fail "a backend the daemon does not hold is NOT_FOUND"
kill "$second"
wait "$second" 2>/dev/null || true
second=""

ctl drain | grep -q "draining" || fail "drain"
ctl status | grep -q "DRAINING" || fail "status shows draining"
{ ctl set-lr ctl 0.5 2>&1 || true; } | grep -q "UNAVAILABLE" || fail "set-lr after drain is UNAVAILABLE"
echo "paramctl_test: passed"
