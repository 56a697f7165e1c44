#!/usr/bin/env bash
# Probes CUDA MPS on the GPU machine once, then stops it: whether the MPS control daemon runs
# there, whether CUDA IPC memory and event handles work between two MPS clients (paramd's
# cuda_ipc: tests/python/cuda_test.py's lent-gradient and in-place cases, the daemon and the
# trainer being two clients), and if they do, the 1.1e9 Llama's training rows under MPS
# (bench/python/lm_gpu_bench.py; MPS_ROWS, default torch_fused,paramd,paramd_fp32). The GPU's
# compute mode is read, never changed; the control daemon gets pipe and log folders of its own and
# is stopped (echo quit | nvidia-cuda-mps-control) however the script ends.
#   scripts/gpu_mps.sh BUNDLE_DIR      (a bundle with PARAMD_BUNDLE_PYTHON; logs to $OUT when set)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bundle=$(cd "${1:?bundle dir}" && pwd)
logs=${OUT:-$(mktemp -d)}
mkdir -p "$logs"
if ! command -v nvidia-cuda-mps-control >/dev/null; then
  echo "mps: nvidia-cuda-mps-control is not on this machine: MPS cannot run here"
  exit 0
fi
echo "mps: compute mode $(nvidia-smi --query-gpu=compute_mode --format=csv,noheader)"
CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d)
CUDA_MPS_LOG_DIRECTORY=$(mktemp -d)
export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
stop() {
  echo quit | nvidia-cuda-mps-control
  # The control daemon and its server take a moment to go (the kernel cuts their names to 15
  # characters: nvidia-cuda-mps).
  for _ in $(seq 100); do pgrep -f nvidia-cuda-mps >/dev/null || break; sleep 0.1; done
  cp "$CUDA_MPS_LOG_DIRECTORY"/*.log "$logs/" 2>/dev/null
  if pgrep -af nvidia-cuda-mps; then echo "mps: still running 10 s after quit"; else echo "mps: stopped"; fi
}
if ! nvidia-cuda-mps-control -d; then
  echo "mps: the control daemon did not start"
  exit 1
fi
trap stop EXIT
py=(env PYTHONPATH="$bundle/python" PARAMD_BINARY="$bundle/bin/paramd-daemon"
    PARAMD_SOURCE_DIR="$root" PYTHONUNBUFFERED=1 python3)
status=0
# Two MPS clients sharing memory and events over CUDA IPC: the daemon and the test's trainer.
timeout 300 "${py[@]}" "$root/tests/python/cuda_test.py" >"$logs/mps_cuda_test.log" 2>&1 || status=1
tail -5 "$logs/mps_cuda_test.log"
echo "mps: servers running: $(echo get_server_list | nvidia-cuda-mps-control | tr '\n' ' ')"
if [ $status -eq 0 ]; then
  timeout 420 "${py[@]}" "$root/bench/python/lm_gpu_bench.py" --rows "${MPS_ROWS:-torch_fused,paramd,paramd_fp32}" \
    --json "$logs/mps_llm.json" ${MPS_ARGS:-} >"$logs/mps_llm.log" 2>&1 || status=1
  grep -E "^\|" "$logs/mps_llm.log"
else
  echo "mps: cuda_ipc between MPS clients failed (mps_cuda_test.log): no training rows"
fi
exit $status
