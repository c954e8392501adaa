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
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
elif (($#)); then
  cmake "$build" "$@"
fi
jobs=${DS_BUILD_JOBS:-$(nproc)}
cmake --build "$build" -j "$jobs"
