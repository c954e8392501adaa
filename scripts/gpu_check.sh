#!/usr/bin/env bash
# The one-command GPU check (issue: GPU). On a machine with an NVIDIA GPU and PyTorch 2.x:
#   1. builds deepspeed-cpp's CUDA build against the PyTorch that `python3` imports (its LibTorch,
#      CUDA and NCCL), with the other dependencies from .gpu-bundle/ when the machine has no
#      package registry (scripts/make_gpu_bundle.sh packs them here, a few MiB);
#      --prebuilt takes the binaries in .gpu-bundle/bin instead (built here by
#      scripts/build_cuda.sh against the same torch version), which saves the build's minutes;
#   2. runs the gpu-labelled tests;
#   3. runs the GPU benchmark (bench/gpu/run.sh; --no-bench skips it);
# and writes logs and results to $DS_GPU_RESULTS, else $OUT (the device tool's folder), else
# gpu-results/. Exits non-zero when a test failed. Through the device tool (docs/gpu.md):
#   bash scripts/make_gpu_bundle.sh --prebuilt   # here
#   run(command="bash scripts/gpu_check.sh --prebuilt", carry=[".gpu-bundle", ".whl"])
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bundle=$root/.gpu-bundle
prebuilt=0
bench=1
for arg in "$@"; do
  case "$arg" in
    --prebuilt) prebuilt=1 ;;
    --no-bench) bench=0 ;;
    *) echo "gpu_check: unknown argument $arg (known: --prebuilt, --no-bench)" >&2; exit 2 ;;
  esac
done
out=${DS_GPU_RESULTS:-${OUT:-$root/gpu-results}}
mkdir -p "$out"
python=${DS_TORCH_PYTHON:-python3}
log() { echo "gpu_check: $*" | tee -a "$out/summary.txt"; }

# The wheel's LibTorch and CUDA libraries, for binaries built elsewhere (their RPATH points to
# the build machine's copy).
torch_root=$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))') || {
  log "$python cannot import torch"; exit 1; }
site=$(dirname "$torch_root")
libs=$torch_root/lib
for d in "$site"/nvidia/*/lib "$site"/nvidia/lib; do [ -d "$d" ] && libs=$libs:$d; done
arch=x86_64-linux-gnu
[ -d "$bundle/deps/usr/lib/$arch" ] && libs=$libs:$bundle/deps/usr/lib/$arch
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$out/gpu.txt" 2>&1
log "GPU: $(cat "$out/gpu.txt"); torch $("$python" -c 'import torch; print(torch.__version__)')"

if ((prebuilt)); then
  bin=$bundle/bin
  [ -d "$bin" ] || { log "--prebuilt: $bin is missing (scripts/make_gpu_bundle.sh --prebuilt)"; exit 1; }
else
  prefix=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  [ -d "$bundle/deps/usr" ] && prefix="$prefix;$bundle/deps/usr"
  build=${DS_BUILD_DIR:-$root/build-gpu}
  t0=$(date +%s)
  if ! DS_BUILD_DIR=$build DS_TORCH_PYTHON=$python bash "$root/scripts/build_cuda.sh" \
      -DDS_BUILD_TESTS=ON -DDS_BUILD_EXAMPLES=ON "-DCMAKE_PREFIX_PATH=$prefix" >"$out/build.log" 2>&1; then
    log "build failed after $(( $(date +%s) - t0 )) s; the end of build.log:"
    tail -40 "$out/build.log" | tee -a "$out/summary.txt"
    exit 1
  fi
  log "built in $(( $(date +%s) - t0 )) s"
  bin=$build/bin
fi

failed=0
for t in engine_gpu_test fused_optim_gpu_test sparse_attention_gpu_test cross_entropy_gpu_test; do
  if [ ! -x "$bin/$t" ]; then log "$t: missing from $bin"; failed=1; continue; fi
  t0=$(date +%s)
  timeout 600 "$bin/$t" >"$out/$t.log" 2>&1
  rc=$?
  summary=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$t.log" | tr '\n' ' ')
  log "$t: rc=$rc in $(( $(date +%s) - t0 )) s: $summary"
  if [ $rc -ne 0 ]; then
    failed=1
    grep -E 'FAILED|Failure|error|Expected|Which is|actual' "$out/$t.log" | head -40 | tee -a "$out/summary.txt"
  fi
done

if ((bench)) && [ -f "$root/bench/gpu/run.sh" ]; then
  # The device tool lends minutes: the bench keeps to BENCH_BUDGET_S (bench/gpu/bench.py).
  TRAIN_GPT=$bin/train_gpt OUT=$out BENCH_BUDGET_S=${BENCH_BUDGET_S:-240} \
    bash "$root/bench/gpu/run.sh" >"$out/bench.log" 2>&1
  log "bench/gpu/run.sh: rc=$?"
  tail -30 "$out/bench.log" | tee -a "$out/summary.txt"
fi
exit $failed
