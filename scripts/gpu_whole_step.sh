#!/usr/bin/env bash
# The whole step as a GPU trainer sees it, on the GPU machine from a bundle (scripts/bundle.sh), with
# what it is judged against measured in the same run (DESIGN.md §10, BENCHMARKS.md):
#   1. the fused kernel alone for exactly that policy and served set (paramd_gpu_step_bench
#      --policies serve,delayed: fp32 master, fp8 exp_avg, fp16 exp_avg_sq, BF16 rowwise and
#      fp8_tensor or fp8_delayed rowwise);
#   2. torch.optim.AdamW(fused=True) on FP32 states of the same shapes (bench/gpu/peer_torch_adam.py);
#   3. the whole step through paramd --backend=cuda:0 in another process (paramd_whole_step_bench:
#      push + commit + pull over cuda_ipc, gradients copied into slots and lent, pulls in place and
#      copied), the daemon logging where its step's time goes (--log_level=debug).
# Shapes: 1e9 parameters as one tensor and as 291 LLM-shaped tensors. The table last has the
# ratios: whole step / kernel alone (target <= 1.25 in place) and / torch fused (<= 1.0 in place,
# <= 1.15 copied).
#   Usage: scripts/gpu_whole_step.sh BUNDLE_DIR [SETS]     (SETS, or $SETS, default one,llm; FP8=fp8_delayed
#          or fp8_tensor measures one FP8 format only, default both; GRADS=copied or lent one way
#          of pushing, default both)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bundle=$(cd "${1:?bundle dir}" && pwd)
sets=${2:-${SETS:-one,llm}}
fp8=${FP8:-fp8_delayed,fp8_tensor}
grads=${GRADS:-copied,lent}
policies=$(echo "$fp8" | sed 's/fp8_delayed/delayed/; s/fp8_tensor/serve/')
run="$bundle/run.sh"
logs=${OUT:-$(mktemp -d)}
mkdir -p "$logs"
daemon=""
cleanup() { [ -n "$daemon" ] && kill "$daemon" 2>/dev/null; }
trap cleanup EXIT
status=0

"$run" paramd_gpu_step_bench --sets "$sets" --policies "$policies" --reps 20 \
  --json "$logs/kernel.json" || status=1
python3 "$root/bench/gpu/peer_torch_adam.py" --sets "$sets" --peers torch_fused --reps 10 \
  --json "$logs/torch.json" || status=1

"$run" paramd --backend=cuda:0 --listen=127.0.0.1:0 --metrics_listen= --log_level=debug \
  --address_file="$logs/addr" 2>"$logs/paramd.log" &
daemon=$!
addr=$("$run" paramctl wait "$logs/addr" "$daemon") ||
  { tail -20 "$logs/paramd.log"; echo "paramd did not start"; exit 1; }
"$run" paramd_whole_step_bench --address="$addr" --sets="$sets" --fp8="$fp8" \
  --grads="$grads" \
  --json="$logs/whole.json" || status=1
kill -TERM "$daemon"
wait "$daemon"
daemon=""
grep -E "^[EFW] " "$logs/paramd.log" | head -5
echo "where the daemon's step time went (last lines of its debug log):"
grep -E "step of|gradient check of| step [0-9]+: " "$logs/paramd.log" | tail -12 | sed 's/^[^]]*] //'

python3 - "$logs" <<'PY'
import json, os, sys
logs = sys.argv[1]
def rows(name):
    path = os.path.join(logs, name)
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []
policy = {"serve": "fp8_tensor", "delayed": "fp8_delayed"}
kernel = {(r["set"], policy.get(r["policy"])): r for r in rows("kernel.json") if r.get("kind") == "paramd"}
torch = {r["set"]: r for r in rows("torch.json") if r.get("kind") == "peer" and "ms" in r}
print("\n| set | tensors | fp8 | grads | pull | whole step ms | kernel alone ms | x kernel | torch fused ms | x torch |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for w in rows("whole.json"):
    k = kernel.get((w["set"], w["fp8"]), {}).get("ms")
    t = torch.get(w["set"], {}).get("ms")
    fmt = lambda x: f"{x:.2f}" if x else "-"
    ratio = lambda a, b: f"{a / b:.2f}" if a and b else "-"
    print(f"| {w['set']} | {w['tensors']} | {w['fp8']} | {w['grads']} | {w['pull']} | {w['ms']:.2f} | {fmt(k)} | "
          f"{ratio(w['ms'], k)} | {fmt(t)} | {ratio(w['ms'], t)} |")
PY
exit $status
