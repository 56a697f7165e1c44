#!/usr/bin/env bash
# The daemon killed with SIGKILL at random points of a run of the C++ example trainer and started
# again at the same address from its checkpoints: both ranks follow it back by themselves
# (--reconnect_timeout_s), and rank 0's --check, which replays the whole job without a crash
# locally, finds the final weights (fp32 and bf16) bit-identical.
#
# Two seeds (one over shm, one inline), 2 ranks, STEPS steps, a checkpoint every 3 steps. Each
# seed kills the daemon KILLS times: once the newest checkpoint passes a step drawn from the seed
# (all in the run's first half, so no rank has finished and left), then after a drawn 0-30 ms,
# which lands anywhere in a step, often while a checkpoint is written (the test counts those). The
# daemon stays down for a drawn 50-300 ms. Every rank must print that it followed a restart.
# Last, a daemon without checkpoints comes back without the job, and the trainer exits saying its
# state is lost.
# Usage: daemon_crash_test.sh BUILD_DIR
set -euo pipefail
build=$1
steps=${STEPS:-3000}
kills=${KILLS:-3}
work=$(mktemp -d)
daemon_pid=""
trainers=()
cleanup() {
  [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  for pid in "${trainers[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "daemon_crash_test FAILED: $*"
  for f in "$work"/*/*.log; do echo "--- $f"; tail -n 40 "$f"; done
  exit 1
}

# Starts the daemon of run directory $1 listening at $2 and waits until it serves.
start_daemon() {
  rm -f "$1/address"
  "$build/server/paramd" --config="$1/paramd.textproto" --listen="$2" --address_file="$1/address" \
    >>"$1/paramd.log" 2>&1 &
  daemon_pid=$!
  "$build/tools/paramctl" --wait_s=15 wait "$1/address" "$daemon_pid" >/dev/null ||
    fail "paramd did not start at $2"
}

# The version of the newest checkpoint of the job (0 before the first).
newest_checkpoint() {
  local newest
  newest=$(ls "$1/checkpoints/mlp" 2>/dev/null | grep '^step-[0-9]*$' | sort | tail -n 1)
  [ -n "$newest" ] && echo $((10#${newest#step-})) || echo 0
}

# One run: seed $1, transport $2.
run() {
  local seed=$1 transport=$2 dir="$work/seed$1"
  mkdir -p "$dir"
  cat >"$dir/paramd.textproto" <<EOF
metrics_listen: ""
checkpoint_dir: "$dir/checkpoints"
checkpoint_every_steps: 3
keep_checkpoints: 2
step_threads: 1
EOF
  start_daemon "$dir" 127.0.0.1:0
  local address
  address=$(cat "$dir/address")
  local train=("$build/examples/mlp/paramd_train_mlp" --address="$address" --world_size=2
               --steps="$steps" --transport="$transport" --reconnect_timeout_s=30)
  "${train[@]}" --rank=0 --check >"$dir/rank0.log" 2>&1 &
  local rank0=$!
  "${train[@]}" --rank=1 >"$dir/rank1.log" 2>&1 &
  local rank1=$!
  trainers=("$rank0" "$rank1")

  RANDOM=$seed
  local made=0 k target
  for ((k = 0; k < kills; ++k)); do
    # Spread over the first half: kill k after a step in [k, k + 1) * steps / (2 * kills).
    local span=$((steps / (2 * kills)))
    target=$((k * span + 3 + RANDOM % (span - 3)))
    while [ "$(newest_checkpoint "$dir")" -lt "$target" ]; do
      kill -0 "$rank0" 2>/dev/null && kill -0 "$rank1" 2>/dev/null || break 2
      sleep 0.005
    done
    sleep "$(printf '0.%03d' $((RANDOM % 30)))"
    kill -9 "$daemon_pid"
    wait "$daemon_pid" 2>/dev/null || true
    made=$((made + 1))
    local writing=""
    if compgen -G "$dir/checkpoints/mlp/.partial-*" >/dev/null; then
      writing=", while a checkpoint was written"
      during_write=$((during_write + 1))
    fi
    echo "seed $seed: killed the daemon after checkpoint $(newest_checkpoint "$dir")$writing"
    sleep "$(printf '0.%03d' $((50 + RANDOM % 250)))"
    start_daemon "$dir" "$address"
  done

  wait "$rank0" || fail "seed $seed: rank 0 failed"
  wait "$rank1" || fail "seed $seed: rank 1 failed"
  trainers=()
  kill "$daemon_pid" && wait "$daemon_pid" 2>/dev/null || true
  daemon_pid=""
  [ "$made" -eq "$kills" ] || fail "seed $seed: the trainers ended before $kills kills ($made)"
  local followed0 followed1
  followed0=$(grep -c "rank 0: the daemon restarted" "$dir/rank0.log" || true)
  followed1=$(grep -c "rank 1: the daemon restarted" "$dir/rank1.log" || true)
  [ "$followed0" -ge 1 ] && [ "$followed1" -ge 1 ] \
    || fail "seed $seed: a rank followed no restart (rank 0: $followed0, rank 1: $followed1)"
  grep -q "check passed" "$dir/rank0.log" || fail "seed $seed: rank 0's check did not pass"
  grep "rank .: the daemon restarted" "$dir"/rank*.log | sed "s|^$dir/|seed $seed: |"
  echo "seed $seed ($transport): $made kills; $(grep "check passed" "$dir/rank0.log")"
}

# A daemon without checkpoints comes back without the job: the trainer stops, saying so.
lost() {
  local dir="$work/lost"
  mkdir -p "$dir"
  echo 'metrics_listen: ""' >"$dir/paramd.textproto"
  start_daemon "$dir" 127.0.0.1:0
  local address
  address=$(cat "$dir/address")
  "$build/examples/mlp/paramd_train_mlp" --address="$address" --world_size=1 --steps=1000000 \
    --reconnect_timeout_s=30 >"$dir/rank0.log" 2>&1 &
  local rank0=$!
  trainers=("$rank0")
  for _ in $(seq 200); do
    "$build/tools/paramctl" --address="$address" status 2>/dev/null | grep -q "next step [1-9]" \
      && break
    sleep 0.05
  done
  kill -9 "$daemon_pid"
  wait "$daemon_pid" 2>/dev/null || true
  start_daemon "$dir" "$address"
  local code=0
  wait "$rank0" || code=$?
  trainers=()
  [ "$code" -eq 1 ] || fail "the trainer of a lost job exited $code, not 1"
  grep -q 'the daemon restarted without a checkpoint of job "mlp": its state is lost' \
    "$dir/rank0.log" || fail "the trainer did not say that the job's state is lost"
  kill "$daemon_pid" && wait "$daemon_pid" 2>/dev/null || true
  daemon_pid=""
  echo "without checkpoints: $(grep -o 'train_mlp: .*' "$dir/rank0.log")"
}

started=$SECONDS
during_write=0
run 1 shm
run 2 inline
lost
echo "daemon_crash_test passed in $((SECONDS - started)) s" \
  "($during_write kills while a checkpoint was written)"
