#!/usr/bin/env bash
# Builds the paramd Python package (the _paramd extension and the pure-Python modules) for another
# interpreter than the one scripts/build.sh uses, into its own build tree: the GPU machine runs
# Python 3.12 and has no gRPC, so its extension is built here, against a local 3.12, and carried
# there in the daemon's bundle (scripts/bundle.sh with PARAMD_BUNDLE_PYTHON set to this tree).
#   scripts/build_python_for.sh PYTHON [BUILD_DIR]   e.g. ~/.pyenv/versions/3.12.1/bin/python3.12
# pybind11 comes from PYTHON's own site-packages when it has one (pip install pybind11: Debian's
# 2.10 predates 3.12), else from the system.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${1:?usage: build_python_for.sh PYTHON [BUILD_DIR]}
version=$("$python" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
build=${2:-$root/build-py$version}
extra=()
if pybind11_dir=$("$python" -m pybind11 --cmakedir 2>/dev/null); then
  extra+=(-Dpybind11_DIR="$pybind11_dir")
fi
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  extra+=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPARAMD_PYTHON=ON \
  -DPython_EXECUTABLE="$python" "${extra[@]}" | grep -E "paramd|Error|error" || true
cmake --build "$build" -j "$(nproc)" --target paramd_python
echo "built $(ls "$build"/python/paramd/_paramd*.so) for $("$python" --version)"
