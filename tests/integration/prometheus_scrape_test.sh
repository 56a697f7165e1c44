#!/usr/bin/env bash
# A real Prometheus server scrapes a real paramd. The daemon, started with deploy/'s example config
# (so that file keeps parsing), serves on free loopback ports; a 20-step training job runs through
# it; Prometheus's HTTP API must then answer paramd_steps_total = 20 (with the training job's name
# in `training_job`, as deploy/'s dashboard and alert rules expect) and up{job="paramd"} = 1. Every
# wait is bounded; every process this test starts is stopped on exit.
#
#   tests/integration/prometheus_scrape_test.sh BUILD_DIR
#
# Needs the `prometheus` binary (Debian package `prometheus`, installed by scripts/setup.sh),
# curl and python3. Fails, never skips, when one is missing.
set -euo pipefail

build=${1:?usage: $0 BUILD_DIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
config=$root/deploy/paramd.example.textproto
paramd=$build/server/paramd
trainer=$build/examples/mlp/paramd_train_mlp
steps=20

fail() {
  echo "prometheus_scrape_test: FAIL: $*" >&2
  exit 1
}

command -v prometheus >/dev/null 2>&1 ||
  fail "the prometheus server is not installed (Debian package 'prometheus'; scripts/setup.sh installs it)"
for tool in curl python3; do
  command -v "$tool" >/dev/null 2>&1 || fail "$tool is not installed"
done
for bin in "$paramd" "$trainer"; do
  [ -x "$bin" ] || fail "$bin is missing: build the project first"
done
[ -f "$config" ] || fail "$config is missing"

work=$(mktemp -d "${TMPDIR:-/tmp}/paramd-prometheus-test.XXXXXX")
paramd_pid=""
prometheus_pid=""
stop() {  # stop PID: SIGTERM, up to 10 s, then SIGKILL
  local pid=$1
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local status=$?
  stop "$prometheus_pid"
  stop "$paramd_pid"
  if [ "$status" -ne 0 ]; then
    for log in "$work"/*.log; do
      [ -e "$log" ] && { echo "--- $log (last 40 lines)"; tail -n 40 "$log"; }
    done
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# promql QUERY: prints one line "LABELS VALUE" per series of an instant query (empty if none);
# fails when Prometheus answers with an error.
promql() {
  curl -sS --max-time 5 -G --data-urlencode "query=$1" "$prometheus_url/api/v1/query" |
    python3 -c '
import json, sys
r = json.load(sys.stdin)
if r.get("status") != "success":
    sys.exit("query failed: %s" % r)
for s in r["data"]["result"]:
    labels = ",".join("%s=%s" % kv for kv in sorted(s["metric"].items()))
    print(labels, s["value"][1])
'
}

# The daemon, on free ports; its log names the metrics address.
"$paramd" --config="$config" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --address_file="$work/address" \
  2>"$work/paramd.log" &
paramd_pid=$!
address=$("$build/tools/paramctl" --wait_s=10 wait "$work/address" "$paramd_pid") ||
  fail "paramd did not serve within 10 s: $(cat "$work/paramd.log")"
metrics_url=$(grep -o 'metrics http://[^ )]*/metrics' "$work/paramd.log" | head -1 | cut -d' ' -f2)
[ -n "$metrics_url" ] || fail "paramd's log has no 'metrics http://HOST:PORT/metrics' line"
metrics_target=${metrics_url#http://}
metrics_target=${metrics_target%/metrics}
echo "paramd: $address, metrics $metrics_url"

cat >"$work/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: paramd
    static_configs:
      - targets: ["$metrics_target"]
EOF

# Prometheus on a free loopback port. The port is found free, then bound by Prometheus: another
# process can take it in between, so a start that fails is retried on a new port.
started=""
for attempt in 1 2 3 4 5; do
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  prometheus_url=http://127.0.0.1:$port
  prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
    --web.listen-address="127.0.0.1:$port" >"$work/prometheus.log" 2>&1 &
  prometheus_pid=$!
  for _ in $(seq 300); do  # up to 30 s
    if curl -sf --max-time 1 "$prometheus_url/-/ready" >/dev/null 2>&1; then
      started=yes
      break
    fi
    kill -0 "$prometheus_pid" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$started" ] && break
  echo "prometheus did not start on port $port (attempt $attempt); retrying" >&2
  stop "$prometheus_pid"
  prometheus_pid=""
  rm -rf "$work/tsdb"
done
[ -n "$started" ] || fail "prometheus did not become ready"
echo "prometheus: $prometheus_url"

# Counters move: a 20-step, one-rank training job through the daemon, checked bit for bit.
timeout 120 "$trainer" --address="$address" --rank=0 --world_size=1 --steps="$steps" --check \
  >"$work/trainer.log" 2>&1 || fail "the training job failed (status $?)"

# Prometheus scrapes every second; its answer must reach the final count within 30 s.
answer=""
for _ in $(seq 60); do
  answer=$(promql 'paramd_steps_total') || fail "Prometheus rejected the query: $answer"
  [[ "$answer" =~ (^|[[:space:]])$steps$ ]] && break
  sleep 0.5
done
echo "paramd_steps_total: $answer"
if [ "$(wc -l <<<"$answer")" -ne 1 ] || ! [[ "$answer" =~ (^|[[:space:]])$steps$ ]]; then
  fail "paramd_steps_total is not one series of value $steps within 30 s: '$answer'"
fi
[[ "$answer" == *"training_job=mlp"* && "$answer" == *"job=paramd"* ]] ||
  fail "paramd_steps_total lacks training_job=mlp (the training job) and job=paramd: '$answer'"

# The job serves the version after its last step.
version=$(promql 'paramd_job_version{training_job="mlp"}')
echo "paramd_job_version{training_job=\"mlp\"}: $version"
[[ "$version" =~ (^|[[:space:]])$steps$ ]] || fail "paramd_job_version of mlp is not $steps: '$version'"

# The trainer ran on this node, so it chose the shm transport, and the gauge says so.
shm=$(promql 'paramd_trainers_by_transport{transport="shm"}')
echo "paramd_trainers_by_transport{transport=\"shm\"}: $shm"
[[ "$shm" =~ (^|[[:space:]])1$ ]] || fail "one trainer on shm expected: '$shm'"

up=$(promql 'up{job="paramd"} == 1')
echo "up{job=\"paramd\"} == 1: $up"
[[ "$up" == *"instance=$metrics_target"* ]] ||
  fail "Prometheus does not see the paramd target up: '$up'"

echo "prometheus_scrape_test: PASS"
