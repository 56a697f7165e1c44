#!/usr/bin/env bash
# deploy/slurm/paramd_job.sbatch end to end on one machine: srun, scontrol and hostname are the
# stand-ins of tests/deploy/fake_slurm, which run each task locally as one of 3 nodes (node1..3,
# each named by a loopback address of its own, in an order that is not the sorted one), and the
# variables sbatch would set are set here. The script starts 3 real daemons, which must take
# distinct ports of a 5-port range although every node tries the same one first. Two jobs:
#
#   1. the default trainer (the example MLP, 3 ranks through the list's first daemon, node2's,
#      rank 0 checking its result bit for bit);
#   2. tests/deploy/slurm_trainer_check.py as the trainer, 2 ranks per node: each checks
#      PARAMD_DAEMONS (every daemon, sorted as Register wants) and has its own node's daemon
#      accept a job registered with that list, with the job's token (PARAMD_TOKEN_FILE), and
#      refuse a register without one.
#
# Both run with the job's own tokens (the script's default): every call of the script, the
# trainers and the daemons to each other carries one.
#
# Each must exit 0 with every daemon advertising the address its node published, that address
# reached, every daemon drained and stopped with status 0, and no daemon left running.
#
#   tests/deploy/slurm_job_test.sh BUILD_DIR PYTHON
#
# PYTHON: an interpreter that imports the build's bindings (BUILD_DIR/python). About 10 s.
set -euo pipefail

build=${1:?usage: $0 BUILD_DIR PYTHON}
python=${2:?usage: $0 BUILD_DIR PYTHON}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
nodes=(node1 node2 node3)
# Byte order puts 127.0.0.10 and 127.0.0.11 before 127.0.0.9: not the node order, nor numeric.
hosts=(127.0.0.9 127.0.0.10 127.0.0.11)

fail() {
  echo "slurm_job_test: FAIL: $*" >&2
  exit 1
}
for bin in server/paramd tools/paramctl examples/mlp/paramd_train_mlp; do
  [ -x "$build/$bin" ] || fail "$build/$bin is missing: build the project first"
done

work=$(mktemp -d "${TMPDIR:-/tmp}/paramd-slurm-test.XXXXXX")
# The pids of this test's daemons still running: paramd processes with their address file under
# $work (read from /proc, so that the test needs no procps).
leftover_daemons() {
  local cmdline args=()
  for cmdline in /proc/[0-9]*/cmdline; do
    mapfile -d '' -t args 2>/dev/null <"$cmdline" || continue
    [ "${args[0]:-}" = "$build/server/paramd" ] || continue
    [[ " ${args[*]} " == *" --address_file=$work/"* ]] || continue
    cmdline=${cmdline#/proc/}
    echo "${cmdline%/cmdline}"
  done
}
cleanup() {
  local status=$?
  local pids
  pids=$(leftover_daemons)
  # shellcheck disable=SC2086  # one pid per word
  [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
  if [ "$status" -ne 0 ]; then
    for log in "$work"/*.out "$work"/*/paramd.*.log; do
      [ -e "$log" ] && { echo "--- $log (last 40 lines)"; tail -n 40 "$log"; }
    done
  fi
  [ -n "${KEEP_WORK:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

# What sbatch --nodes=3 would give the batch script, and the stand-ins first on PATH; none of the
# script's knobs from the caller's environment.
unset PARAMD_PORT PARAMD_IFACE PARAMD_CONFIG PARAMD_METRICS_LISTEN PARAMD_PROM_SD_DIR \
  PARAMD_RUN_DIR TRAINERS_PER_NODE PARAMD_TOKENS PARAMD_TOKEN_FILE
base=$((20000 + RANDOM % 10000))
export PATH="$here/fake_slurm:$PATH" SLURM_JOB_ID=$((1000 + RANDOM)) SLURM_JOB_NUM_NODES=3 \
  SLURM_JOB_NODELIST="node[1-3]" SLURM_SUBMIT_DIR=$root FAKE_SLURM_NODE_ADDRESSES="${hosts[*]}"
export PARAMD_BUILD_DIR=$build PARAMD_BIN=$build/server/paramd PARAMCTL_BIN=$build/tools/paramctl \
  PARAMD_PORT_RANGE=$base-$((base + 4)) PARAMD_READY_TIMEOUT=30 PARAMD_STOP_TIMEOUT=15 \
  PYTHONPATH=$build/python${PYTHONPATH:+:$PYTHONPATH}

# run NAME [TRAINER COMMAND...]: the batch script, its output in $work/NAME.out, its run
# directory $work/NAME; then the checks every job shares.
run() {
  local name=$1
  shift
  local out=$work/$name.out dir=$work/$name started=$SECONDS status=0
  PARAMD_RUN_DIR=$dir timeout 60 bash "$root/deploy/slurm/paramd_job.sbatch" "$@" >"$out" 2>&1 ||
    status=$?
  echo "slurm_job_test: $name: the batch script exited with status $status" \
    "in $((SECONDS - started)) s"
  [ "$status" -eq 0 ] || fail "$name: the batch script exited with status $status"

  # The job's tokens: the daemons took its token file, and only the job's user may read them.
  [ "$(stat -c %a "$dir")" = 700 ] || fail "$name: $dir is not the job's user's alone"
  local file
  for file in tokens trainer.token admin.token; do
    [ "$(stat -c %a "$dir/$file")" = 600 ] || fail "$name: $dir/$file is not mode 600"
  done
  grep -q "^trainer [0-9a-f]\{48\} \*$" "$dir/tokens" ||
    fail "$name: $dir/tokens has no trainer token for every job"
  local expected=() i address port ports=() taken=0
  for i in "${!nodes[@]}"; do
    local node=${nodes[i]} log=$dir/paramd.${nodes[i]}.log
    address=$(cat "$dir/address.$node") || fail "$name: $node published no address"
    [[ $address =~ ^${hosts[i]//./\\.}:([0-9]+)$ ]] ||
      fail "$name: $node published '$address', not ${hosts[i]}:PORT"
    port=${BASH_REMATCH[1]}
    ((port >= base && port <= base + 4)) ||
      fail "$name: $node's port $port is outside PARAMD_PORT_RANGE $base-$((base + 4))"
    grep -q "paramd serving on 0\.0\.0\.0:$port (advertised as $address," "$log" ||
      fail "$name: the daemon on $node does not advertise $address"
    grep -qx "paramd_job: $node: paramd serving on $address" "$out" ||
      fail "$name: the script did not find $node's daemon at $address"
    grep -qx "paramd on $node exited with status 0" "$log" ||
      fail "$name: the daemon on $node did not stop with status 0"
    grep -q "draining: new work is refused" "$log" ||
      fail "$name: the daemon on $node was not drained"
    grep -q "is taken on $node" "$log" && taken=$((taken + 1))
    expected+=("$address")
    ports+=("$port")
  done
  [ "$(printf "%s\n" "${ports[@]}" | sort -u | wc -l)" -eq 3 ] ||
    fail "$name: the daemons share a port: ${ports[*]}"
  # All 3 nodes try the same port first: 2 of them at least find it taken and move on.
  [ "$taken" -ge 2 ] || fail "$name: only $taken daemon(s) found their first port taken"
  local sorted
  sorted=$(printf "%s\n" "${expected[@]}" | LC_ALL=C sort | paste -sd, -)
  [ "$sorted" = "${hosts[1]}:${ports[1]},${hosts[2]}:${ports[2]},${hosts[0]}:${ports[0]}" ] ||
    fail "$name: byte order of the addresses is not the one this test expects: $sorted"
  grep -qx "paramd_job: PARAMD_DAEMONS=$sorted PARAMD_ADDRESS=${expected[1]}" "$out" ||
    fail "$name: PARAMD_DAEMONS is not $sorted with PARAMD_ADDRESS ${expected[1]}, the first"
  grep -qx "paramd_job: trainers exited with status 0" "$out" || fail "$name: trainers failed"
  [ -z "$(leftover_daemons)" ] ||
    fail "$name: daemons still run after the script: $(leftover_daemons)"
  DAEMONS=$sorted
}

run default_trainer
grep -q "^check passed" "$work/default_trainer.out" ||
  fail "default_trainer: the example trainer's check did not pass"
# The script's `paramctl status` of each daemon before the drain: the list's first held the job.
awk -v at="  at ${DAEMONS%%,*}  " '/^paramd [0-9.]+  at / { here = index($0, at) > 0 }
    here && /^job mlp: 3\/3 ranks registered, next step 200/ { found = 1 } END { exit !found }' \
  "$work/default_trainer.out" || fail "default_trainer: ${DAEMONS%%,*} did not hold job mlp"

mkdir "$work/results"
PARAMD_CHECK_RESULTS_DIR=$work/results TRAINERS_PER_NODE=2 \
  run registration "$python" "$here/slurm_trainer_check.py"
for rank in 0 1 2 3 4 5; do
  grep -qx "rank $rank: the daemon at .* accepted job deploy with daemons $DAEMONS" \
    "$work/results/rank.$rank" 2>/dev/null || {
    echo "--- what the ranks printed"
    grep -n "rank" "$work/registration.out" || true
    fail "registration: rank $rank did not register with $DAEMONS"
  }
done
echo "slurm_job_test: passed"
