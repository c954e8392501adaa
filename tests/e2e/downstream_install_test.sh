#!/usr/bin/env bash
# The installed package, used as a user would: `cmake --install` into a fresh prefix, a separate
# CMake project (tests/e2e/downstream) with find_package(deepspeed), built, and launched on 2
# ranks by the installed `deepspeed` launcher. Usage: downstream_install_test.sh BUILD_DIR SRC_DIR
set -euo pipefail
build=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
# Public headers include only public headers (or the dependencies'), never the library's private
# ones under src/.
if grep -n '#include "' "$work/prefix/include/deepspeed/"*.h | grep -v '#include "deepspeed/'; then
  echo "FAIL: an installed header includes a private header (above)"
  exit 1
fi
# Nothing of the source or build tree may be needed: the project sees only the prefix.
launcher_args=()
command -v ccache > /dev/null && launcher_args=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$src/tests/e2e/downstream" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" "${launcher_args[@]}" > "$work/configure.log" ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }

out=$(OMP_NUM_THREADS=1 "$work/prefix/bin/deepspeed" --num_gpus 2 --master_port 29731 \
        "$work/build/trainer" 2>&1) || { echo "$out"; echo "FAIL: the job failed"; exit 1; }
echo "$out"
for rank in 0 1; do
  grep -q "trainer: rank $rank of 2 ok" <<< "$out" || { echo "FAIL: rank $rank did not match"; exit 1; }
done
echo "PASS: installed package built a downstream trainer that matches plain LibTorch on 2 ranks"
