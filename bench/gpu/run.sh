#!/usr/bin/env bash
# The GPU benchmark in one command (bench/gpu/README.md): ours (train_gpt) against PyTorch and
# DeepSpeed on one GPU, then the largest model each trains with ZeRO-3 + offload.
#   bench/gpu/run.sh                 # on the GPU machine, from a checkout with .whl/ carried
# Here first: bash bench/gpu/make_bundle.sh (DeepSpeed's wheel and its missing dependencies into
# .whl/). This script
#   1. installs .whl/*.whl into /tmp/site (no index, no dependencies: the image has the rest) and
#      puts it on PYTHONPATH; without a usable DeepSpeed the DeepSpeed runs are skipped, and said so;
#   2. gives DeepSpeed's async_io op a libaio (the machine's, else .gpu-bundle's, else the .debs
#      make_bundle.sh put in .whl/deb) for its NVMe offload;
#   3. lets a train_gpt built elsewhere run here: the torch wheel's libraries on LD_LIBRARY_PATH,
#      and, when the build's source folder (BUILD_ROOT, default /work/main: train_gpt finds the
#      GPT-2 tokenizer files under it) does not exist on this machine, a link from there to
#      this checkout;
#   4. runs bench/gpu/bench.py, which prints the table and writes $OUT/gpu_bench.txt.
# Env: TRAIN_GPT (build-cuda/bin/train_gpt), PYTHON (python3), BUILD_ROOT, SKIP_DEEPSPEED, and bench.py's
# (SIZES, STEPS, BENCH_BUDGET_S, LADDER, OFFLOAD_MODES, ...: see its docstring).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
PYTHON=${PYTHON:-python3}
export PYTHON
export TRAIN_GPT=${TRAIN_GPT:-build-cuda/bin/train_gpt}
case "$TRAIN_GPT" in /*) ;; *) TRAIN_GPT=$root/$TRAIN_GPT ;; esac
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/gpu_bench/torch_extensions}
export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ in the checkout
# Lines for the report's notes (bench.py reads BENCH_NOTES): what this script had to work around.
export BENCH_NOTES=${BENCH_NOTES:-}
say() { echo "run.sh: $*"; }
note() { say "$*"; BENCH_NOTES+="$*"$'\n'; }

# 1. DeepSpeed and its dependencies.
if [ "${SKIP_DEEPSPEED:-0}" != 1 ]; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    if "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl; then
      export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
      export PATH=/tmp/site/bin:$PATH
    else
      note "pip could not install .whl/*.whl"
    fi
  else
    note "no .whl/*.whl (bash bench/gpu/make_bundle.sh makes them)"
  fi
  if ds_version=$("$PYTHON" -c 'import deepspeed; print(deepspeed.__version__)' 2>/tmp/ds_import.err); then
    say "DeepSpeed $ds_version"
  else
    note "DeepSpeed does not import, so its runs are skipped: $(tail -1 /tmp/ds_import.err)"
    export SKIP_DEEPSPEED=1
  fi
fi

# 2. libaio for DeepSpeed's async_io (NVMe offload). Our own NVMe path needs none.
if [ ! -f /usr/include/libaio.h ]; then
  aio=""
  if [ -f .gpu-bundle/deps/usr/include/libaio.h ]; then
    aio=$root/.gpu-bundle/deps/usr
  elif ls .whl/deb/libaio*.deb >/dev/null 2>&1; then
    aio=/tmp/gpu_bench/libaio/usr
    for d in .whl/deb/libaio*.deb; do dpkg-deb -x "$d" /tmp/gpu_bench/libaio || say "cannot unpack $d"; done
  fi
  if [ -n "$aio" ]; then
    inc=$aio/include
    lib=$(dirname "$(find "$aio" -name 'libaio.so*' | head -1)")
    export CFLAGS="-I$inc ${CFLAGS:-}" LDFLAGS="-L$lib ${LDFLAGS:-}"
    export CPATH=$inc${CPATH:+:$CPATH} LIBRARY_PATH=$lib${LIBRARY_PATH:+:$LIBRARY_PATH}
    export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    note "libaio for DeepSpeed's async_io from $aio"
  else
    note "no libaio.h: DeepSpeed's NVMe offload will fail to build its async_io op"
  fi
fi

# 3. train_gpt built on another machine.
if [ -x "$TRAIN_GPT" ]; then
  if torch_lib=$("$PYTHON" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null); then
    libs=$torch_lib
    for d in "$(dirname "$(dirname "$torch_lib")")"/nvidia/*/lib; do [ -d "$d" ] && libs=$libs:$d; done
    # scripts/make_gpu_bundle.sh's libraries (zlib, libaio) for a binary built on Debian.
    [ -d "$root/.gpu-bundle/deps/usr/lib/x86_64-linux-gnu" ] &&
      libs=$libs:$root/.gpu-bundle/deps/usr/lib/x86_64-linux-gnu
    export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
  # The tokenizer's folder is compiled in (DS_GPT2_BPE_DIR, under the source folder of the build
  # machine: BUILD_ROOT, this workplace's /work/main). The compiler stores such literals as
  # immediates, so the binary cannot be searched for it reliably.
  src_root=${BUILD_ROOT:-/work/main}
  if [ -n "$src_root" ] && [ "$src_root" != "$root" ] && [ ! -e "$src_root" ]; then
    mkdir -p "$(dirname "$src_root")" && ln -s "$root" "$src_root" &&
      note "linked $src_root -> $root (train_gpt's compiled-in source folder: the tokenizer files)"
  fi
else
  note "$TRAIN_GPT is not an executable: ours is skipped (set TRAIN_GPT)"
fi

# 4. The benchmark.
exec "$PYTHON" "$root/bench/gpu/bench.py"
