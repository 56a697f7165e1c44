#!/usr/bin/env bash
# Packs the daemon, paramctl, the example trainers, benchmarks and the cuda_ipc GPU test with the
# shared libraries they need that a machine without gRPC, Abseil, protobuf or prometheus-cpp lacks,
# so they run there unchanged:
#   scripts/bundle.sh [BUILD_DIR] [OUT_DIR]      -> OUT_DIR/{bin,lib}, run with OUT_DIR/run.sh CMD
# With PARAMD_BUNDLE_PYTHON=DIR (a build tree of scripts/build_python_for.sh), the Python package
# built there goes to OUT_DIR/python/paramd, its extension finding the bundle's libraries by its
# RPATH: PYTHONPATH=OUT_DIR/python imports it. OUT_DIR/bin/paramd-daemon runs the daemon with the
# bundle's libraries (for PARAMD_BINARY).
# System libraries (glibc, libstdc++, libgcc) and GPU driver/NCCL libraries are left out: the
# target machine has its own (and NCCL must never travel).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
out=${2:-$root/.bundle}
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
bins=(server/paramd tools/paramctl examples/mlp/paramd_train_mlp
      examples/classifier/paramd_train_classifier bench/paramd_inline_bench bench/paramd_shm_bench
      tests/gpu/cuda_ipc_test tests/gpu/cuda_daemon_test tests/gpu/cuda_checkpoint_test
      tests/gpu/cuda_backend_conformance_test tests/gpu/cuda_sharded_test tests/gpu/nccl_communicator_test
      tests/gpu/nccl_transport_test tests/gpu/shm_gpu_test
      tests/gpu/fused_step_cuda_test tests/gpu/step_rules_cuda_test tests/gpu/serve_cuda_test
      bench/gpu/paramd_cuda_ipc_bench bench/gpu/paramd_whole_step_bench bench/gpu/paramd_gpu_step_bench
      bench/paramd_sharded_step_bench)
# PARAMD_BUNDLE_ONLY="cuda_sharded_test ...": only these programs (a carry holds 64 MiB), besides
# the daemon and paramctl, which starts it and waits until it serves (`paramctl wait`).
for b in "${bins[@]}"; do
  if [ -n "${PARAMD_BUNDLE_ONLY:-}" ] &&
    [[ " paramd paramctl $PARAMD_BUNDLE_ONLY " != *" $(basename "$b") "* ]]; then
    continue
  fi
  [ -x "$build/$b" ] && cp "$build/$b" "$out/bin/"
done
if [ -n "${PARAMD_BUNDLE_PYTHON:-}" ]; then
  mkdir -p "$out/python/paramd"
  cp "$PARAMD_BUNDLE_PYTHON"/python/paramd/*.py "$PARAMD_BUNDLE_PYTHON"/python/paramd/_paramd*.so \
    "$out/python/paramd/"
fi
skip='^(linux-vdso|libc\.|libm\.|libpthread|libdl\.|librt\.|ld-linux|libgcc_s|libstdc\+\+|libcuda\.|libnccl|libnvidia)'
for f in "$out"/bin/* "$out"/python/paramd/*.so; do
  [ -e "$f" ] || continue
  ldd "$f" | awk '/=> \// {print $1, $3}' | while read -r name path; do
    [[ "$name" =~ $skip ]] && continue
    [ -e "$out/lib/$name" ] || cp -L "$path" "$out/lib/$name"
  done
done
# Debug information stays behind: the bundle travels.
strip --strip-unneeded "$out"/bin/* "$out"/lib/* "$out"/python/paramd/*.so 2>/dev/null || true
# The extension is loaded by an interpreter the bundle does not start: an RPATH (not RUNPATH, which
# the libraries' own dependencies would not use) points it at the bundle's libraries.
for so in "$out"/python/paramd/*.so; do
  [ -e "$so" ] && patchelf --force-rpath --set-rpath '$ORIGIN/../../lib' "$so"
done
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs a bundled program with the bundle's libraries: run.sh paramd --backend=cuda:0 ...
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
prog=$1
shift
exec "$here/bin/$prog" "$@"
RUN
chmod +x "$out/run.sh"
cat > "$out/bin/paramd-daemon" <<'DAEMON'
#!/usr/bin/env bash
# The bundled daemon with the bundle's libraries (a single path for PARAMD_BINARY).
exec "$(cd "$(dirname "$0")/.." && pwd)/run.sh" paramd "$@"
DAEMON
chmod +x "$out/run.sh" "$out/bin/paramd-daemon"
echo "bundle: $(ls "$out/bin" | wc -l) programs, $(ls "$out/lib" | wc -l) libraries, $(du -sh "$out" | cut -f1)"
