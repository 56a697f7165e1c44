#!/usr/bin/env bash
# A trainer killed mid-step while it holds mapped shared-memory segments and a lease on served
# weights: the daemon goes on, the lease expires and its buffers return to the pool, the restarted
# trainer re-attaches and resumes at the step the daemon collects, and the run ends bit-identical
# to an uninterrupted one (rank 0 --check replays the whole job locally and compares every bit).
# Usage: trainer_crash_test.sh BUILD_DIR
set -euo pipefail
build=$1
steps=30
crash_at=10
work=$(mktemp -d)
daemon_pid=""
cleanup() {
  [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "trainer_crash_test FAILED: $*"
  for f in "$work"/*.log; do echo "--- $f"; cat "$f"; done
  exit 1
}

"$build/server/paramd" --listen=127.0.0.1:0 --metrics_listen= --address_file="$work/address" \
  2>"$work/paramd.log" &
daemon_pid=$!
address=$("$build/tools/paramctl" wait "$work/address" "$daemon_pid") || fail "paramd did not start"
train=("$build/examples/mlp/paramd_train_mlp" --address="$address" --world_size=2 --steps=$steps
       --transport=shm --in_place)
status() { "$build/tools/paramctl" --address="$address" status; }

"${train[@]}" --rank=0 --check >"$work/rank0.log" 2>&1 &
rank0=$!
crashed=0
"${train[@]}" --rank=1 --crash_at_step=$crash_at --lease_ms=1500 >"$work/rank1_first.log" 2>&1 \
  || crashed=$?
[ "$crashed" -eq 137 ] || fail "rank 1 was to die by SIGKILL (137), exited $crashed"
grep -q "killing itself at step $crash_at holding lease" "$work/rank1_first.log" \
  || fail "rank 1 did not reach its crash point"
kill -0 "$daemon_pid" 2>/dev/null || fail "the daemon died with the trainer"
status >"$work/status_after_crash.log"
grep -q "transports 0:shm 1:shm" "$work/status_after_crash.log" || fail "transports not reported"

# The dead trainer's lease ends by itself (1.5 s, reaped within a second of that).
expired=0
for _ in $(seq 100); do
  if status | grep -q "leases held 0"; then expired=1; break; fi
  sleep 0.1
done
[ "$expired" -eq 1 ] || fail "the dead trainer's lease never expired"
echo "lease of the killed trainer expired; daemon still serving"

"${train[@]}" --rank=1 >"$work/rank1_restart.log" 2>&1 || fail "restarted rank 1 failed"
grep -q "rank 1 resumes at step $crash_at" "$work/rank1_restart.log" \
  || fail "restarted rank 1 did not resume at step $crash_at"
wait "$rank0" || fail "rank 0 failed"
grep -q "check passed" "$work/rank0.log" || fail "rank 0's check did not pass"
grep "check passed" "$work/rank0.log"
status | grep -E "leases held|shared memory"
echo "trainer_crash_test passed"
