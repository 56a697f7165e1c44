#!/usr/bin/env bash
# Everything that runs from a bundle on the GPU machine (scripts/bundle.sh, built on a machine with
# gRPC), part by part, each under its own time limit, with a short table last:
#   kernels fused_step_cuda_test, step_rules_cuda_test, serve_cuda_test: the kernels against the
#           CPU's, bit for bit
#   sanitize the kernel tests under compute-sanitizer's memcheck, racecheck and synccheck
#   backend cuda_backend_conformance_test: the backend conformance suite on cuda:0 (every policy
#           and format as the reference, skip and clip, export/import, state reads), then
#           cuda_checkpoint_test: checkpoints restored across backends (cpu -> cuda:0 and back)
#   limits  cuda_daemon_test: the GPU memory budget at Register, a step that finds the GPU full
#           (its job fails alone), a sticky CUDA error (every job fails); SANITIZE=1 runs it and
#           cuda_ipc_test under compute-sanitizer memcheck instead
#   nccl    nccl_communicator_test, then nccl_transport_test: the transport conformance suite for nccl
#           and its own tests, the daemon (the bundle's paramd) in a process of its own, on GPU 1
#           where there are two, else on GPU 0 as another NCCL host (NCCL_HOSTID)
#   ipc     scripts/gpu_ipc.sh: cuda_ipc_test (the conformance suite and cuda_ipc's own tests), then
#           cuda_ipc push/pull against device and peer copies, and a whole step of 1e9 parameters
#           by transport (cuda_ipc, inline)
#   whole   scripts/gpu_whole_step.sh: the whole step of 1e9 parameters (one tensor, 291 tensors)
#           over cuda_ipc, in place and copied, against the kernel alone and torch's fused AdamW
#   daemon  scripts/gpu_daemon.sh: the example jobs through paramd --backend=cuda:0
#   shm     bench/run_shm_bench.sh at 1e9 parameters, fp32 and fp8 policies (the host's CPU)
#   sharded cuda_sharded_test: a job sharded over three cuda:0 daemons, bit-identical to one cpu
#           daemon (SANITIZE=1: under compute-sanitizer memcheck); then the sharded-step benchmark
#           (bench/sharded_step_bench.cc) on this host's cores, 1, 2 and 3 daemons
#   host    shm_gpu_test: the host tier's DMA (GPU gradients into a cpu daemon's page-locked
#           segments, bit-identical to host ones; the page-locking renewed after a restart and
#           let go with the client)
#   python  tests/python/cuda_test.py: paramd.torch.AdamW with CUDA parameters over cuda_ipc (the
#           bundle's Python package: scripts/bundle.sh with PARAMD_BUNDLE_PYTHON)
#   lm      tests/python/lm_training_test.py --device cuda: examples/lm, 2 ranks on GPU 0
#   mps     scripts/gpu_mps.sh: CUDA MPS started, cuda_test.py and Llama rows under it, MPS stopped
#   llm     bench/python/lm_gpu_bench.py: a 1.1e9-parameter Llama's tokens/s and peak memory,
#           paramd against torch's fused AdamW and no optimizer (LLM_ROWS: rows; LLM_DAEMON_ARGS:
#           daemon flags; LLM_ARGS: more bench flags, e.g. "--profile --trace=$OUT/trace")
# Usage: scripts/gpu_bundle.sh BUNDLE_DIR [PART...]   (default: all but whole; logs go to $OUT when
# set, else to a temporary folder)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bundle=$(cd "${1:?bundle dir}" && pwd)
shift
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(backend limits ipc daemon shm)
logs=${OUT:-$(mktemp -d)}
mkdir -p "$logs"
rows=()
status=0

part() {
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout --signal=TERM --kill-after=10 "$limit" "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  tail -20 "$logs/$name.log"
  local verdict=pass
  [ $rc -eq 124 ] && verdict="TIMEOUT after ${limit} s"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && verdict="FAIL (exit $rc)"
  [ $rc -ne 0 ] && status=1
  rows+=("$name|$verdict|$((SECONDS - start)) s|$logs/$name.log")
}

for p in "${parts[@]}"; do
  case "$p" in
    kernels)
      for t in fused_step_cuda_test step_rules_cuda_test serve_cuda_test; do
        part "$t" "${KERNELS_TIMEOUT:-300}" "$bundle/run.sh" "$t" --gtest_brief=1
      done
      ;;
    sanitize)
      for t in fused_step_cuda_test step_rules_cuda_test serve_cuda_test; do
        for tool in memcheck racecheck synccheck; do
          part "${tool}_$t" "${SANITIZE_TIMEOUT:-200}" compute-sanitizer --tool "$tool" \
            --error-exitcode 1 "$bundle/run.sh" "$t" --gtest_brief=1
        done
      done
      ;;
    backend)
      part backend "${BACKEND_TIMEOUT:-300}" "$bundle/run.sh" cuda_backend_conformance_test
      part checkpoint "${BACKEND_TIMEOUT:-300}" "$bundle/run.sh" cuda_checkpoint_test
      ;;
    limits)
      if [ "${SANITIZE:-0}" = 1 ]; then
        # The sticky-error test breaks the context on purpose: memcheck would report its fault.
        # The full-GPU test's failed allocations are API errors it asks for, not memory errors.
        part memcheck_limits "${LIMITS_TIMEOUT:-300}" compute-sanitizer --tool memcheck \
          --report-api-errors no --error-exitcode 1 "$bundle/run.sh" cuda_daemon_test \
          --gtest_filter=-*Sticky*
        part memcheck_ipc "${LIMITS_TIMEOUT:-300}" compute-sanitizer --tool memcheck \
          --error-exitcode 1 "$bundle/run.sh" cuda_ipc_test --gtest_brief=1
      else
        part limits "${LIMITS_TIMEOUT:-120}" "$bundle/run.sh" cuda_daemon_test
      fi
      ;;
    sharded)
      if [ "${SANITIZE:-0}" = 1 ]; then
        part memcheck_sharded "${SHARDED_TIMEOUT:-400}" compute-sanitizer --tool memcheck \
          --error-exitcode 1 "$bundle/run.sh" cuda_sharded_test --gtest_brief=1
      else
        part cuda_sharded "${SHARDED_TIMEOUT:-300}" "$bundle/run.sh" cuda_sharded_test --gtest_brief=1
      fi
      for t in 16 48; do
        part "sharded_bench_$t" "${SHARDED_TIMEOUT:-300}" "$bundle/run.sh" paramd_sharded_step_bench \
          --params=200000000 --steps=6 --tensors=$t
      done
      ;;
    host) part shm_gpu "${HOST_TIMEOUT:-200}" "$bundle/run.sh" shm_gpu_test --gtest_brief=1 ;;
    ipc) part ipc "${IPC_TIMEOUT:-300}" "$root/scripts/gpu_ipc.sh" "$bundle" 4096 1000 ;;
    nccl)
      # The daemon runs as the bundle's paramd, in a process of its own.
      part nccl_communicator "${NCCL_TIMEOUT:-300}" "$bundle/run.sh" nccl_communicator_test --gtest_brief=1
      part nccl_transport "${NCCL_TIMEOUT:-300}" env PARAMD_BINARY="$bundle/bin/paramd" \
        "$bundle/run.sh" nccl_transport_test --gtest_brief=1
      ;;
    mps) part mps "${MPS_TIMEOUT:-560}" "$root/scripts/gpu_mps.sh" "$bundle" ;;
    whole) part whole "${WHOLE_TIMEOUT:-400}" "$root/scripts/gpu_whole_step.sh" "$bundle" ;;
    daemon) part daemon "${DAEMON_TIMEOUT:-200}" "$root/scripts/gpu_daemon.sh" "$bundle" ;;
    shm)
      part shm_fp32 "${SHM_TIMEOUT:-240}" "$root/bench/run_shm_bench.sh" "$bundle" \
        --elements=1000000000 --step_iters=2 --iters=5
      part shm_fp8 "${SHM_TIMEOUT:-240}" "$root/bench/run_shm_bench.sh" "$bundle" \
        --elements=1000000000 --step_iters=2 --iters=5 --step_policy=fp8 --call_iters=0
      ;;
    python | lm | llm)
      [ -d "$bundle/python/paramd" ] || { echo "gpu_bundle: $bundle has no python/ (PARAMD_BUNDLE_PYTHON)"; exit 2; }
      py=(env PYTHONPATH="$bundle/python" PARAMD_BINARY="$bundle/bin/paramd-daemon"
          PARAMD_SOURCE_DIR="$root" PYTHONUNBUFFERED=1 python3)
      case "$p" in
        python) part python "${PYTHON_TIMEOUT:-300}" "${py[@]}" "$root/tests/python/cuda_test.py" ;;
        lm) part lm "${LM_TIMEOUT:-300}" "${py[@]}" "$root/tests/python/lm_training_test.py" \
              --device cuda ;;
        llm) part llm "${LLM_TIMEOUT:-540}" "${py[@]}" "$root/bench/python/lm_gpu_bench.py" \
               --json "$logs/llm.json" --daemon_log "$logs/llm_daemon.log" \
               ${LLM_ROWS:+--rows "$LLM_ROWS"} ${LLM_DAEMON_ARGS:+"--daemon_args=$LLM_DAEMON_ARGS"} \
               ${LLM_ARGS:-} ;;
      esac
      ;;
    *) echo "gpu_bundle: unknown part $p (kernels, sanitize, backend, limits, sharded, nccl, host, ipc, whole, daemon, shm, python, lm, llm, mps)"; exit 2 ;;
  esac
done

echo
echo "| part | result | time | log |"
echo "| --- | --- | --- | --- |"
for r in "${rows[@]}"; do
  IFS='|' read -r a b c d <<<"$r"
  echo "| $a | $b | $c | $d |"
done
for f in "$logs"/*.log; do
  grep -E "^\| (cuda_ipc|inline|shm|step|same|peer|per call|memcpy|what|one|llm|set|row|none|torch|paramd)" "$f" | sed "s|^|$(basename "$f" .log): |" | head -20
done
exit $status
