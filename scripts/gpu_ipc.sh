#!/usr/bin/env bash
# cuda_ipc on the GPU machine, from a bundle (scripts/bundle.sh, built on a machine with gRPC): the
# transport conformance suite and the cuda_ipc tests (daemon in-process on cuda:0), then the
# benchmark against a daemon in another process on cuda:0, from a trainer on cuda:0 (device copy)
# and, where there is a second GPU, on cuda:1 (peer copy); with the trainer on cuda:0, also a whole
# step of STEP_MPARAMS million parameters by transport (cuda_ipc, inline).
#   Usage: scripts/gpu_ipc.sh BUNDLE_DIR [MIB] [STEP_MPARAMS]
#          (MIB per push/pull, default 4096; STEP_MPARAMS default 1000, 0 for none)
set -uo pipefail
bundle=$(cd "${1:?bundle dir}" && pwd)
mib=${2:-4096}
step_mparams=${3:-1000}
run="$bundle/run.sh"
work=$(mktemp -d)
daemon=""
cleanup() { [ -n "$daemon" ] && kill "$daemon" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
status=0

"$run" cuda_ipc_test --gtest_brief=1 2>&1 | tail -25
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

"$run" paramd --backend=cuda:0 --listen=127.0.0.1:0 --metrics_listen= \
  --address_file="$work/addr" 2>>"$work/paramd.log" &
daemon=$!
addr=$("$run" paramctl wait "$work/addr" "$daemon") ||
  { cat "$work/paramd.log"; echo "paramd --backend=cuda:0 did not start"; exit 1; }
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
for dev in $(seq 0 $((gpus > 1 ? 1 : 0))); do
  step=0
  [ "$dev" -eq 0 ] && step=$step_mparams
  "$run" paramd_cuda_ipc_bench --address="$addr" --device="$dev" --daemon_device=0 --mib="$mib" \
    --step_mparams="$step" || status=1
done
"$run" paramctl --address="$addr" status | head -3
kill -TERM "$daemon"
wait "$daemon"
daemon=""
grep -E "^[EFW] " "$work/paramd.log" | head -5
exit $status
