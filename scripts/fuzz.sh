#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang-14 (ASan, UBSan; $PARAMD_BUILD_DIR-fuzz, or
# build-fuzz) and runs each for FUZZ_SECONDS (default 20) from its seed corpus in tests/fuzz/corpus
# (python3 tests/fuzz/make_corpus.py writes it).
# Fails on any crash, leak, sanitizer report, broken invariant or timeout. New inputs the fuzzer
# finds go to a scratch corpus in the build folder, not to the tree.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PARAMD_BUILD_DIR:-$root/build}-fuzz
seconds=${FUZZ_SECONDS:-20}
# A fixed seed makes a run repeatable (CI); FUZZ_SEED=0 lets libFuzzer pick one.
seed=${FUZZ_SEED:-1}
start=$(date +%s)

cxx=$(command -v clang++-14 || true)
cc=$(command -v clang-14 || true)
if [ -z "$cxx" ] || [ -z "$cc" ]; then
  echo "fuzz: FAILED: clang-14 is not installed (scripts/setup.sh installs clang-14 and libclang-rt-14-dev)"
  exit 1
fi
if ! "$cxx" -print-file-name=libclang_rt.fuzzer-x86_64.a | grep -q /; then
  echo "fuzz: FAILED: libFuzzer's runtime is missing (package libclang-rt-14-dev; scripts/setup.sh)"
  exit 1
fi

targets=(config_fuzz register_fuzz push_fuzz)
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=None "-DCMAKE_CXX_FLAGS=-O1 -g1" \
  "-DCMAKE_C_FLAGS=-O1 -g1" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$cc" -DPARAMD_FUZZ=ON \
  -DPARAMD_CUDA=OFF -DPARAMD_NCCL=OFF -DPARAMD_UCX=OFF \
  | grep -E "paramd|Error|error|Warning" || true
# The daemon's RPC room too (paramd_server): every server/ file is compiled by clang here, which
# checks the locks' annotations (-Wthread-safety, cmake/ParamdOptions.cmake).
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" paramd_server
built=$(date +%s)

export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:print_stacktrace=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
failed=()
for t in "${targets[@]}"; do
  seeds="$root/tests/fuzz/corpus/$t"
  scratch="$build/corpus/$t"
  artifacts="$build/artifacts/$t/"
  mkdir -p "$scratch" "$artifacts"
  log="$build/$t.log"
  # -rss_limit_mb and -timeout turn runaway memory or time into failures; 2 GiB leaves room for
  # ASan's shadow.
  dict=()
  [ ! -f "$root/tests/fuzz/${t%_fuzz}.dict" ] || dict=(-dict="$root/tests/fuzz/${t%_fuzz}.dict")
  if "$build/tests/fuzz/$t" "${dict[@]}" -seed="$seed" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
       -max_len=4096 -print_final_stats=1 -artifact_prefix="$artifacts" "$scratch" "$seeds" \
       >"$log" 2>&1; then
    echo "fuzz: $t clean: $(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}') runs in ${seconds} s"
  else
    echo "fuzz: $t FAILED (log: $log; inputs: $artifacts)"
    grep -E -B2 -A40 "ERROR: |runtime error|Check failed|deadly signal|==[0-9]+==" "$log" | head -80 || tail -40 "$log"
    failed+=("$t")
  fi
done
end=$(date +%s)
echo "fuzz: build $(( built - start )) s, fuzzing $(( end - built )) s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}"
  exit 1
fi
