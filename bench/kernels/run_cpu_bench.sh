#!/usr/bin/env bash
# Runs paramd's CPU fused-step benchmark for every state policy and its peers (DeepSpeedCPUAdam,
# torch AdamW plain and fused=True) with the same element count and thread count, interleaved round
# by round (bandwidth on a shared machine drifts), and prints a table: per policy its elements/s,
# bytes/s against the ceiling of its own access pattern, and ratios to each peer's elements/s.
#
#   bench/kernels/run_cpu_bench.sh [BUILD_DIR]
#   (env: THREADS, N, REPS, ROUNDS, PYTHON, PEERS, POLICIES)
# Needs the built paramd_cpu_step_bench; for the peers, python3 with torch and deepspeed
# (pip install torch deepspeed ninja; DeepSpeed compiles its CPU Adam on first use).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build_dir="${1:-${here}/../../build-kernels}"
bench="${build_dir}/bench/kernels/paramd_cpu_step_bench"
threads="${THREADS:-$(nproc)}"
n="${N:-67108864}"
reps="${REPS:-5}"
rounds="${ROUNDS:-3}"
python="${PYTHON:-python3}"
peers="${PEERS:-deepspeed,torch_foreach,torch_fused}"
policies="${POLICIES:-all}"

if [[ ! -x "${bench}" ]]; then
  echo "error: ${bench} not found; build it first:" \
    "cmake --build ${build_dir} --target paramd_cpu_step_bench" >&2
  exit 1
fi

echo "== paramd alone: the table =="
"${bench}" --threads "${threads}" --n "${n}" --reps "${reps}" --policy "${policies}"
if ! "${python}" -c "import torch" 2> /dev/null; then
  echo "no torch for ${python}: peers not measured (pip install torch deepspeed ninja)" >&2
  exit 0
fi
echo "== paramd and peers, interleaved =="
"${python}" "${here}/peer_cpu_adam.py" --threads "${threads}" --n "${n}" --reps "${reps}" \
  --rounds "${rounds}" --peers "${peers}" --paramd "${bench}" --policies "${policies}"
