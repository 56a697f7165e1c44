#!/usr/bin/env bash
# A job sharded over 3 daemons across a network (DESIGN.md §7): each daemon, and the daemon of the
# same job alone, runs in a network namespace of its own, joined by veth pairs to a bridge in a
# hub namespace (10.250.0.0/24); the trainers run in a fifth namespace and reach the daemons over
# the veth addresses with the inline transport, and the daemons agree on every step over the same
# links. sharded_job_test's HundredsOfStepsMatchOneDaemonAcrossNamespaces trains the job for
# PARAMD_NETNS_STEPS (300) steps on both and compares every served format of every tensor after
# every step, byte for byte: a tensor split over the three, fp8 moments rounded stochastically,
# clipping, a skipped step, fp8_tensor and fp8_delayed serving.
#
#   tests/integration/netns_sharded_test.sh BUILD_DIR
#
# Needs root (ip netns): without it, or without namespaces, veth or bridges, the test fails.
set -euo pipefail

build=${1:?usage: $0 BUILD_DIR}
paramd=$build/server/paramd
test_bin=$build/tests/integration/sharded_job_test
for bin in "$paramd" "$test_bin"; do
  [ -x "$bin" ] || { echo "netns_sharded_test: FAIL: $bin is missing: build first" >&2; exit 1; }
done
fail() {
  echo "netns_sharded_test: FAIL: $*" >&2
  exit 1
}
[ "$(id -u)" = 0 ] || fail "needs root to create network namespaces (ip netns)"
command -v ip >/dev/null || fail "needs iproute2's ip"

# Names unique to this run (interface names stay within 15 bytes).
tag=pd$$
hub=$tag-hub
work=$(mktemp -d "${TMPDIR:-/tmp}/paramd-netns.XXXXXX")
pids=()
cleanup() {
  local status=$?
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "$status" -ne 0 ]; then
    for log in "$work"/*.log; do
      [ -e "$log" ] && { echo "--- $log (last 30 lines)"; tail -n 30 "$log"; }
    done
  fi
  for i in 0 1 2 3 4; do ip netns del "$tag-$i" 2>/dev/null || true; done
  ip netns del "$hub" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

ip netns add "$hub" || fail "ip netns add failed: cannot create network namespaces here"
ip -n "$hub" link add br0 type bridge || fail "cannot create a bridge in a namespace"
ip -n "$hub" link set br0 up
# Namespaces 0-2: the sharded job's daemons; 3: the one-daemon job's; 4: the trainers.
for i in 0 1 2 3 4; do
  ns=$tag-$i
  ip netns add "$ns"
  ip link add "$tag-v$i" type veth peer name "$tag-h$i" || fail "cannot create a veth pair"
  ip link set "$tag-v$i" netns "$ns"
  ip link set "$tag-h$i" netns "$hub"
  ip -n "$hub" link set "$tag-h$i" master br0 up
  ip -n "$ns" addr add "10.250.0.$((i + 1))/24" dev "$tag-v$i"
  ip -n "$ns" link set "$tag-v$i" up
  ip -n "$ns" link set lo up
done

port=7000
for i in 0 1 2 3; do
  # Listening on its veth address, each daemon advertises that address (the jobs' lists name it).
  ip netns exec "$tag-$i" "$paramd" --listen="10.250.0.$((i + 1)):$port" --metrics_listen= \
    --step_threads=1 --log_level=warning \
    --address_file="$work/addr.$i" >"$work/paramd.$i.log" 2>&1 &
  pids+=("$!")
done
for i in 0 1 2 3; do
  ip netns exec "$tag-$i" "$build/tools/paramctl" --wait_s=20 wait "$work/addr.$i" "${pids[$i]}" \
    >/dev/null || fail "the daemon in namespace $tag-$i did not start: $(cat "$work/paramd.$i.log")"
done
# The trainers' namespace reaches each daemon only over the bridge.
for i in 0 1 2 3; do
  ip netns exec "$tag-4" timeout 5 bash -c "exec 3<>/dev/tcp/10.250.0.$((i + 1))/$port" ||
    fail "the trainers' namespace does not reach 10.250.0.$((i + 1)):$port"
done
if ip netns exec "$tag-4" bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null; then
  fail "a daemon answers on the trainers' loopback: the bytes would not cross an interface"
fi

started=$SECONDS
ip netns exec "$tag-4" env \
  PARAMD_NETNS_DAEMONS="10.250.0.1:$port,10.250.0.2:$port,10.250.0.3:$port" \
  PARAMD_NETNS_SINGLE="10.250.0.4:$port" PARAMD_NETNS_STEPS="${PARAMD_NETNS_STEPS:-300}" \
  "$test_bin" --gtest_filter='ShardedJobOverANetworkTest.*' --gtest_also_run_disabled_tests \
  >"$work/test.log" 2>&1 || { cat "$work/test.log"; fail "the sharded run differs from one daemon"; }
grep -q "^\[  PASSED  \] 1 test" "$work/test.log" ||
  { cat "$work/test.log"; fail "the test did not run (skipped?)"; }
grep -q "SKIPPED" "$work/test.log" && { cat "$work/test.log"; fail "the test was skipped"; }
echo "netns_sharded_test: ${PARAMD_NETNS_STEPS:-300} steps over 3 daemons in 3 namespaces equal" \
  "one daemon's, bit for bit, in $((SECONDS - started)) s"
echo "netns_sharded_test: passed"
