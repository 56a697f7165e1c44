#!/usr/bin/env bash
# The daemon's core, kernels and RPC tests under AddressSanitizer and UndefinedBehaviorSanitizer:
# a separate build ($PARAMD_BUILD_DIR-asan, or build-asan) with -DPARAMD_SANITIZE=ON, CPU only,
# of the test binaries worth the build time; each is run directly and any report fails the run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PARAMD_BUILD_DIR:-$root/build}-asan
start=$(date +%s)

# Worth ASan/UBSan: everything that does pointer arithmetic on pushed bytes, the kernels over
# odd shapes, and real RPCs over the callback API. -O1 with line tables keeps the build short and
# the reports readable. The memory-formula test skips itself under ASan (shadow memory), so it is
# not built; the e2e and multi-process tests need the regular build's binaries and scripts.
tests=(
  tests/unit/server/step_rules_job_test tests/unit/kernels/fused_step_cpu_test
  tests/unit/kernels/recipes_test tests/unit/kernels/state_policy_test
  tests/unit/server/policy_job_test tests/unit/kernels/formats_test
  tests/unit/kernels/state_codec_test tests/unit/kernels/policy_accuracy_test
  tests/unit/kernels/step_rules_test tests/unit/kernels/adamw_accuracy_test
  tests/unit/kernels/bf16_cast_test tests/unit/kernels/thread_pool_test
  tests/unit/kernels/philox_test tests/unit/kernels/cpu_step_test
  tests/unit/server/job_test tests/unit/server/job_bad_input_test
  tests/unit/server/chunk_buffer_test tests/unit/server/registration_test
  tests/unit/server/registry_test tests/unit/server/config_test
  tests/unit/server/state_transfer_test tests/unit/server/shm_arena_test
  tests/conformance/inline_conformance_test tests/conformance/shm_conformance_test
  tests/integration/bad_input_test tests/integration/served_formats_test
  tests/integration/client_retry_test tests/integration/shm_test
  tests/integration/state_transfer_rpc_test tests/integration/pull_many_stress_test
  tests/unit/server/job_limits_test tests/unit/server/job_failure_test
  tests/unit/server/step_sequence_test tests/unit/server/checkpoint_test
  tests/integration/hostile_input_test tests/integration/sharded_job_test
  tests/integration/peer_exchange_test
)

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=None \
  "-DCMAKE_CXX_FLAGS=-O1 -g1" "-DCMAKE_C_FLAGS=-O1 -g1" -DPARAMD_SANITIZE=ON \
  -DPARAMD_CUDA=OFF -DPARAMD_NCCL=OFF -DPARAMD_UCX=OFF \
  | grep -E "paramd|Error|error|Warning" || true
cmake --build "$build" -j "$(nproc)" --target "${tests[@]##*/}"
built=$(date +%s)

# Any report ends the test with a non-zero status; leaks are reports too.
export ASAN_OPTIONS=halt_on_error=1:abort_on_error=0:detect_leaks=1:print_stacktrace=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
# One test binary: its log, and a line with its result.
run_one() {
  local t=$1 log="$results/${1##*/}.log" t0
  t0=$(date +%s)
  if "$build/$t" --gtest_brief=1 >"$log" 2>&1; then
    echo "sanitize: ${t##*/} passed in $(( $(date +%s) - t0 )) s"
  else
    echo "sanitize: ${t##*/} FAILED (log: $log); its reports:"
    grep -E -A40 "ERROR: (Address|Leak)Sanitizer|runtime error|Failure|FAILED" "$log" | head -80 || tail -40 "$log"
    touch "$log.failed"
  fi
}
results="$build/sanitize-logs"
rm -rf "$results" && mkdir -p "$results"
# As many binaries at once as there are cores, longest first.
for t in "${tests[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n || true; done
  run_one "$t" &
done
wait
failed=()
for t in "${tests[@]}"; do
  [ ! -e "$results/${t##*/}.log.failed" ] || failed+=("${t##*/}")
done
end=$(date +%s)
echo "sanitize: build $(( built - start )) s, tests $(( end - built )) s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "sanitize: FAILED: ${failed[*]}"
  exit 1
fi
echo "sanitize: ${#tests[@]} test binaries clean under ASan and UBSan in $(( end - start )) s"
