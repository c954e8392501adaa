#!/usr/bin/env bash
# The CUDA build (issue: GPU) in build-cuda/: LibTorch from the torch 2.11 wheel, NCCL, our CUDA
# kernels, the library, examples and the gpu-labelled tests. The CPU test suite and the CPU
# benchmarks stay out (scripts/test.sh covers them). Extra arguments go to cmake's configure step.
#   bash scripts/install_deps.sh --cuda && bash scripts/build_cuda.sh
# Then `ctest --test-dir build-cuda -L gpu` runs the gpu tests (they skip without a GPU).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export DS_BUILD_DIR=${DS_BUILD_DIR:-$root/build-cuda}
exec "$root/scripts/build.sh" -DDS_BUILD_CUDA=ON -DDS_BUILD_CPU_TESTS=OFF -DDS_BUILD_BENCH=OFF "$@"
