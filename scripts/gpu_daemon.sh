#!/usr/bin/env bash
# The daemon on the GPU: paramd --backend=cuda:0 from a bundle (scripts/bundle.sh, built on a
# machine with gRPC), the example jobs through it, checked as on the CPU: the MLP's served FP32 and
# BF16 weights bit-identical to the local reference (2 ranks), the low-precision classifier within
# 2 % of FP32 AdamW. Prints a short table last.   Usage: scripts/gpu_daemon.sh BUNDLE_DIR
set -uo pipefail
bundle=$(cd "${1:?bundle dir}" && pwd)
run="$bundle/run.sh"
work=$(mktemp -d)
daemon=""
cleanup() { [ -n "$daemon" ] && kill "$daemon" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
results=()

start_daemon() {
  rm -f "$work/addr"
  "$run" paramd --backend=cuda:0 --listen=127.0.0.1:0 --metrics_listen= \
    --address_file="$work/addr" "$@" 2>>"$work/paramd.log" &
  daemon=$!
  addr=$("$run" paramctl wait "$work/addr" "$daemon") ||
    { cat "$work/paramd.log"; echo "paramd --backend=cuda:0 did not start"; exit 1; }
}
stop_daemon() { kill -TERM "$daemon"; wait "$daemon"; daemon=""; }

start_daemon
"$run" paramd_train_mlp --address="$addr" --rank=1 --world_size=2 --steps=300 >"$work/r1.log" 2>&1 &
r1=$!
"$run" paramd_train_mlp --address="$addr" --rank=0 --world_size=2 --steps=300 --check \
  >"$work/r0.log" 2>&1
mlp=$?
wait $r1 || mlp=1
tail -2 "$work/r0.log"
results+=("mlp 2 ranks x 300 steps, bit-identical to the reference|$([ $mlp -eq 0 ] && echo pass || echo FAIL)")

"$run" paramd_train_classifier --address="$addr" >"$work/cls.log" 2>&1
cls=$?
tail -2 "$work/cls.log"
results+=("classifier fp8 m + fp16 v + mxfp8, within 2 % of FP32 AdamW|$([ $cls -eq 0 ] && echo pass || echo FAIL) ($(grep -o "paramd's is [^(]*" "$work/cls.log"))")
"$run" paramctl --address="$addr" status | head -3
stop_daemon

echo
echo "| daemon on cuda:0 | result |"
echo "| --- | --- |"
for r in "${results[@]}"; do echo "| ${r%%|*} | ${r#*|} |"; done
grep -E "^[EF] " "$work/paramd.log" | head -5
[ $mlp -eq 0 ] && [ $cls -eq 0 ]
