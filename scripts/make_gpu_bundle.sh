#!/usr/bin/env bash
# Packs what scripts/gpu_check.sh needs on a GPU machine that has PyTorch, CMake and nvcc but no
# package registry, into .gpu-bundle/ (ignored by git; carried with the device tool's `carry`):
#   deps/usr/...  the build's other dependencies from this Debian machine: nlohmann-json, CLI11,
#                 GoogleTest (static), Gloo's headers, zlib and libaio (headers + libraries)
#   bin/          with --prebuilt: the CUDA build's gpu tests and train_gpt from build-cuda/, so the
#                 check can skip the build (minutes of 16 cores) and only run
#   .whl/         bench/gpu's DeepSpeed wheels, when bench/gpu/make_bundle.sh made them
# Small on purpose (a few MiB): the device tool carries 64 MiB at most.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/.gpu-bundle
prebuilt=0
for arg in "$@"; do
  case "$arg" in
    --prebuilt) prebuilt=1 ;;
    *) echo "make_gpu_bundle: unknown argument $arg (known: --prebuilt)" >&2; exit 2 ;;
  esac
done
rm -rf "$out"
usr=$out/deps/usr
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
mkdir -p "$usr/include" "$usr/lib/$arch/cmake" "$usr/share/cmake"
cp -r /usr/include/nlohmann /usr/include/CLI /usr/include/gtest /usr/include/gmock /usr/include/gloo \
  /usr/include/zlib.h /usr/include/zconf.h /usr/include/libaio.h "$usr/include/"
cp -r /usr/share/cmake/nlohmann_json /usr/share/cmake/CLI11 "$usr/share/cmake/"
cp -r "/usr/lib/$arch/cmake/GTest" "$usr/lib/$arch/cmake/"
cp "/usr/lib/$arch/"lib{gtest,gtest_main,gmock,gmock_main}.a "$usr/lib/$arch/"
# Libraries by their real files: the .so names link, the .so.N names load.
cp -L "/usr/lib/$arch/libz.so" "$usr/lib/$arch/libz.so"
cp -L "/usr/lib/$arch/libaio.so.1" "$usr/lib/$arch/libaio.so.1"
ln -sf libaio.so.1 "$usr/lib/$arch/libaio.so"
if ((prebuilt)); then
  mkdir -p "$out/bin"
  for b in engine_gpu_test fused_optim_gpu_test sparse_attention_gpu_test cross_entropy_gpu_test train_gpt; do
    if [ -x "$root/build-cuda/bin/$b" ]; then
      cp "$root/build-cuda/bin/$b" "$out/bin/"
      strip --strip-unneeded "$out/bin/$b"
    else
      echo "make_gpu_bundle: build-cuda/bin/$b is missing (bash scripts/build_cuda.sh)" >&2
      exit 1
    fi
  done
fi
grep -qx '/.gpu-bundle/' "$root/.git/info/exclude" 2>/dev/null || echo '/.gpu-bundle/' >>"$root/.git/info/exclude"
du -sh "$out"
