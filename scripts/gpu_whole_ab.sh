#!/usr/bin/env bash
# The whole step of two builds of the daemon, A and B, interleaved on one GPU in one run (what a
# change did to it, free of the spread between machines and runs): ROUNDS rounds, each starting A's
# paramd then B's, each measured by its own paramd_whole_step_bench (scripts/gpu_whole_step.sh's
# third part), then torch's fused AdamW on the same shapes once. The table last gives each build's
# median and each round's figures, and B/A.
#   Usage: scripts/gpu_whole_ab.sh BUNDLE A_BIN B_BIN [ROUNDS]
#     BUNDLE  a bundle (scripts/bundle.sh): its libraries and run.sh run both builds' programs
#     A_BIN, B_BIN  folders holding each build's paramd and paramd_whole_step_bench (a bundle's
#             bin/, or stripped copies of another commit's, built against the same libraries)
#   SETS (default llm), FP8 (default fp8_delayed), GRADS (default copied,lent) as in
#   gpu_whole_step.sh; ROUNDS default 3.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bundle=$(cd "${1:?bundle dir}" && pwd)
a_bin=$(cd "${2:?programs of A}" && pwd)
b_bin=$(cd "${3:?programs of B}" && pwd)
rounds=${4:-3}
sets=${SETS:-llm}
fp8=${FP8:-fp8_delayed}
grads=${GRADS:-copied,lent}
logs=${OUT:-$(mktemp -d)}
mkdir -p "$logs"
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
daemon=""
cleanup() { [ -n "$daemon" ] && kill "$daemon" 2>/dev/null; }
trap cleanup EXIT
status=0

# One measurement of build $1 (its programs in $2), round $3.
measure() {
  local build=$1 bin=$2 round=$3
  local addr_file="$logs/addr.$build.$round"
  "$bin/paramd" --backend=cuda:0 --listen=127.0.0.1:0 --metrics_listen= --log_level=warning \
    --address_file="$addr_file" 2>"$logs/paramd.$build.$round.log" &
  daemon=$!
  local addr
  addr=$("$bundle/run.sh" paramctl wait "$addr_file" "$daemon") ||
    { tail -20 "$logs/paramd.$build.$round.log"; echo "paramd of $build did not start"; return 1; }
  "$bin/paramd_whole_step_bench" --address="$addr" --sets="$sets" --fp8="$fp8" --grads="$grads" \
    --json="$logs/whole.$build.$round.json" >"$logs/bench.$build.$round.log" 2>&1 || status=1
  kill -TERM "$daemon"
  wait "$daemon"
  daemon=""
}

for round in $(seq 1 "$rounds"); do
  measure A "$a_bin" "$round" || status=1
  measure B "$b_bin" "$round" || status=1
done
python3 "$root/bench/gpu/peer_torch_adam.py" --sets "$sets" --peers torch_fused --reps 10 \
  --json "$logs/torch.json" || status=1

python3 - "$logs" "$rounds" <<'PY'
import json, os, statistics, sys
logs, rounds = sys.argv[1], int(sys.argv[2])
def rows(name):
    path = os.path.join(logs, name)
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []
torch = {r["set"]: r["ms"] for r in rows("torch.json") if r.get("kind") == "peer" and "ms" in r}
ms = {}  # (set, fp8, grads, pull) -> build -> [ms by round]
for build in "AB":
    for r in range(1, rounds + 1):
        for w in rows(f"whole.{build}.{r}.json"):
            key = (w["set"], w["fp8"], w["grads"], w["pull"])
            ms.setdefault(key, {}).setdefault(build, []).append(w["ms"])
print("\n| set | fp8 | grads | pull | A ms (median; rounds) | B ms (median; rounds) | B / A | A x torch | B x torch |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for key, by in ms.items():
    a, b = by.get("A", []), by.get("B", [])
    med = lambda v: statistics.median(v) if v else None
    ma, mb, t = med(a), med(b), torch.get(key[0])
    each = lambda v: ", ".join(f"{x:.2f}" for x in v)
    ratio = lambda x, y: f"{x / y:.3f}" if x and y else "-"
    print(f"| {' | '.join(key)} | {ma or 0:.2f} ({each(a)}) | {mb or 0:.2f} ({each(b)}) | "
          f"{ratio(mb, ma)} | {ratio(ma, t)} | {ratio(mb, t)} |")
print(f"\ntorch fused AdamW: {', '.join(f'{s} {v:.2f} ms' for s, v in torch.items())}")
PY
exit $status
