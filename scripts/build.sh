#!/usr/bin/env bash
# Configures and builds deepspeed-cpp into build/ (Release, Ninja, ccache). Extra arguments go to
# cmake's configure step, e.g. `scripts/build.sh -DDS_BUILD_CUDA=ON`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DS_BUILD_DIR:-$root/build}
# PCH + ccache: ccache must accept precompiled headers or it silently stops caching.
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
# Paths relative to the checkout, so that a second clone (CI) reuses the cache.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
# The CUDA build finds the torch 2.x wheel's LibTorch: the project's .venv-cuda (made by
# `scripts/install_deps.sh --cuda`), else whatever `python3` imports (the GPU machines' own torch).
# DS_TORCH_PYTHON names another interpreter.
args=("$@")
if [[ " $* " == *" -DDS_BUILD_CUDA=ON "* && " $* " != *"CMAKE_PREFIX_PATH"* && " $* " != *"Torch_DIR"* ]]; then
  py=${DS_TORCH_PYTHON:-}
  [ -z "$py" ] && [ -x "$root/.venv-cuda/bin/python" ] && py=$root/.venv-cuda/bin/python
  py=${py:-python3}
  prefix=$("$py" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null) || {
    echo "build.sh: -DDS_BUILD_CUDA=ON needs the torch wheel: $py cannot import torch" \
         "(run scripts/install_deps.sh --cuda, or set DS_TORCH_PYTHON)" >&2
    exit 1
  }
  args+=("-DCMAKE_PREFIX_PATH=$prefix")
fi
if [[ " $* " == *" -DDS_BUILD_CUDA=ON "* ]] && ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
set -- "${args[@]}"
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
elif (($#)); then
  cmake "$build" "$@"
fi
jobs=${DS_BUILD_JOBS:-$(nproc)}
cmake --build "$build" -j "$jobs"
