#!/usr/bin/env bash
# The GPU machine's one command: configure kernels/ alone with CUDA, build, run the GPU tests and
# the GPU benchmarks (paramd against the device copy ceiling and the torch peers, same run), and
# print a short table last. Run from anywhere as scripts/gpu.sh on a machine with an NVIDIA GPU,
# nvcc 13, CMake, ninja, GoogleTest and (for the peers) python3 with torch.
#
#   env: PARAMD_GPU_BUILD_DIR (default build-gpu), OUT (logs; default $build/gpu-logs),
#        GPU_TESTS (ctest -R filter; "none" skips the tests), BENCH_SETS (one,llm,small),
#        BENCH_REPS (20), PEERS (torch_fused,torch_compile; "none" skips them), JOBS,
#        PROFILE=1 (Nsight Compute on one tile-kernel launch: ncu.txt, ncu_sass.csv),
#        BENCH_TIMEOUT / TESTS_TIMEOUT / PEERS_TIMEOUT / PROFILE_TIMEOUT (seconds per stage).
# Order: build, benchmark (GPU otherwise idle), profile, tests, peers, table. Takes about 3.5 min
# on an H200 machine (build 20 s, benchmark 100 s, tests 10 s, peers 70 s).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PARAMD_GPU_BUILD_DIR:-$root/build-gpu}
out=${OUT:-$build/gpu-logs}
jobs=${JOBS:-$(nproc)}
mkdir -p "$out"
start=$(date +%s)
stamp() { echo "== $(( $(date +%s) - start )) s: $*"; }
status=0

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1

stamp "configure + build"
if ! { cmake -S "$root" -B "$build" -G Ninja -DPARAMD_KERNELS_ONLY=ON -DPARAMD_CUDA=ON \
         -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release &&
       cmake --build "$build" -j "$jobs" --target paramd_gpu_step_bench cuda_casts_test \
         fused_step_cuda_test serve_cuda_test step_rules_cuda_test; } > "$out/build.log" 2>&1; then
  tail -40 "$out/build.log"
  echo "gpu.sh: build failed (log: $out/build.log)"
  exit 1
fi

bench_json="$out/bench.jsonl"
peers_json="$out/peers.jsonl"
rm -f "$bench_json" "$peers_json"
stamp "benchmark (GPU idle otherwise)"
timeout "${BENCH_TIMEOUT:-150}" "$build/bench/gpu/paramd_gpu_step_bench" --sweep \
  --sets "${BENCH_SETS:-one,llm,small}" --reps "${BENCH_REPS:-20}" --json "$bench_json" 2>&1 |
  tee "$out/bench.log" || status=1

if [[ -n "${PROFILE:-}" ]] && command -v ncu > /dev/null; then
  # Where a tile kernel's time goes (stall reasons, per source line): Nsight Compute on one launch
  # of the default configuration, clocks left as they are.
  stamp "ncu profile of one tile-kernel launch"
  timeout "${PROFILE_TIMEOUT:-120}" ncu --clock-control none --kernel-name regex:TileKernel --launch-skip 4 \
    --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats --section SourceCounters \
    "$build/bench/gpu/paramd_gpu_step_bench" --sets one --reps 3 > "$out/ncu.txt" 2>&1 ||
    echo "ncu failed (see ncu.txt)"
  grep -E "Duration|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issued Warp|No Eligible" \
    "$out/ncu.txt" | head -20
  # Per SASS instruction: executions and stall samples (which instructions the time goes to).
  timeout "${PROFILE_TIMEOUT:-120}" ncu --clock-control none --kernel-name regex:TileKernel \
    --launch-skip 4 --launch-count 1 --section SourceCounters --section WarpStateStats \
    --page source --print-source sass --csv \
    "$build/bench/gpu/paramd_gpu_step_bench" --sets one --reps 3 > "$out/ncu_sass.csv" 2>&1 ||
    echo "ncu (source page) failed (see ncu_sass.csv)"
fi

if [[ "${GPU_TESTS:-}" != none ]]; then
  stamp "GPU tests"
  timeout "${TESTS_TIMEOUT:-200}" ctest --test-dir "$build" -L gpu ${GPU_TESTS:+-R "$GPU_TESTS"} \
    -j 4 --timeout 190 --output-on-failure > "$out/tests.log" 2>&1 || status=1
  grep -E "Test +#|tests passed|tests failed" "$out/tests.log" | tail -25
  grep -E "Failure|differ|Which is|SKIPPED" "$out/tests.log" | head -20
fi

if [[ "${PEERS:-}" != none ]]; then
  stamp "torch peers"
  PYTHONUNBUFFERED=1 timeout "${PEERS_TIMEOUT:-200}" python3 "$root/bench/gpu/peer_torch_adam.py" \
    --sets "${BENCH_SETS:-one,llm,small}" --peers "${PEERS:-torch_fused,torch_compile,torch_eager}" \
    --json "$peers_json" > "$out/peers.log" 2>&1 || echo "peers stopped early (see peers.log)"
  grep '^{' "$out/peers.log" || tail -20 "$out/peers.log"
fi

stamp "done"
echo
echo "== GPU fused step: paramd vs the device copy ceiling and the torch peers (same run) =="
python3 "$root/bench/gpu/report.py" "$bench_json" "$peers_json"
exit $status
