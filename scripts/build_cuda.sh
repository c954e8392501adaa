#!/usr/bin/env bash
# The CUDA build (issue: GPU) in build-cuda/: LibTorch from the torch 2.11 wheel, NCCL, our CUDA
# kernels, the library, examples, the gpu-labelled tests and the libtorch2-labelled ones (a few
# multi-rank tests of the CPU suite, on this LibTorch: tests/CMakeLists.txt). The rest of the CPU
# suite and the CPU benchmarks stay out (scripts/test.sh covers them). Extra arguments go to
# cmake's configure step.
#   bash scripts/install_deps.sh --cuda && bash scripts/build_cuda.sh
# Then `ctest --test-dir build-cuda -L 'gpu|libtorch2'` runs them (the gpu tests skip without a GPU).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export DS_BUILD_DIR=${DS_BUILD_DIR:-$root/build-cuda}
exec "$root/scripts/build.sh" -DDS_BUILD_CUDA=ON -DDS_BUILD_CPU_TESTS=OFF -DDS_BUILD_BENCH=OFF "$@"
