#!/usr/bin/env bash
# CPU-Adam (src/ops/cpu_adam) against its ceilings and its peers, on 10M and 100M fp32 params:
# STREAM triad, a compiler-vectorized fused AdamW loop, our kernel on each SIMD path the CPU has,
# torch::optim::Adam (C++, one process with the above, interleaved) and Python's
# torch.optim.Adam (Debian's /usr/bin/python3). Builds cpu_adam_bench if needed, then prints one
# table with seconds per step, GB/s (28 B/param/step) and the ratios.
# Usage: bash bench/cpu_adam/run.sh
# Env: SIZES (10,100; millions), ROUNDS (5), STEPS (5), TORCH_STEPS (3), THREADS (2; ours, the
#      fused loop and the triad), DS_BUILD_DIR (build/), OUT_DIR (logs; default a new
#      /tmp/cpu_adam_bench.* directory), RUN_TIMEOUT_S (900).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

SIZES=${SIZES:-10,100}
ROUNDS=${ROUNDS:-5}
STEPS=${STEPS:-5}
TORCH_STEPS=${TORCH_STEPS:-3}
THREADS=${THREADS:-2}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-900}
PY=/usr/bin/python3  # Debian's python3-torch (same LibTorch build); not the pyenv python3 on PATH
build=${DS_BUILD_DIR:-$root/build}
die() { echo "cpu_adam bench: $*" >&2; exit 1; }

# Build what this needs: configure as scripts/build.sh does if the build dir is new, then only
# the benchmark's target (incremental, so a second run costs a second).
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
if [ ! -f "$build/build.ninja" ] && [ ! -f "$build/Makefile" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >&2
fi
cmake --build "$build" -j "${DS_BUILD_JOBS:-2}" --target cpu_adam_bench >&2 ||
  die "building cpu_adam_bench in $build failed"
bench_bin=$build/bin/cpu_adam_bench

if ! { [ -x "$PY" ] && "$PY" -c 'import torch' 2>/dev/null; }; then
  echo "INFO cpu_adam bench: installing python3-torch for the Python peer" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      $SUDO apt-get install -y -qq --no-install-recommends python3-torch; } >&2 ||
    die "could not install python3-torch; apt-get install --no-install-recommends python3-torch"
  "$PY" -c 'import torch' 2>/dev/null || die "$PY cannot import torch after installing python3-torch"
fi

# Pinned environment (shared reference cpu-baselines.md §2). OMP_NUM_THREADS stays unset so that
# torch shows its own default; the benchmarks set their thread counts explicitly (THREADS for
# ours, the fused loop and the triad; default, 1 and THREADS for torch).
source bench/common/pin_openblas_core.sh  # bench/README.md's pinned environment
unset OMP_NUM_THREADS
export OPENBLAS_NUM_THREADS=1

out=${OUT_DIR:-$(mktemp -d /tmp/cpu_adam_bench.XXXXXX)}
mkdir -p "$out"
echo "INFO cpu_adam bench: sizes=${SIZES}M rounds=$ROUNDS steps=$STEPS torch_steps=$TORCH_STEPS threads=$THREADS out=$out"
echo "INFO cpu: $(awk -F': ' '/model name/ && !f {print $2; f = 1}' /proc/cpuinfo), $(getconf _NPROCESSORS_ONLN) cpus," \
  "load average $(cut -d' ' -f1-3 /proc/loadavg)"

run() {  # run NAME LOG COMMAND...: under cpumon (NOISE line: CPU other processes used meanwhile)
  local name=$1 log=$2
  shift 2
  "$PY" bench/common/cpumon.py --name "$name" --timeout "$RUN_TIMEOUT_S" -- "$@" >"$log" 2>&1 ||
    { cat "$log" >&2; die "$name failed (log above)"; }
  grep -E '^INFO' "$log" || true
}
run cpu_adam.cpp "$out/cpp.log" "$bench_bin" --sizes "$SIZES" --rounds "$ROUNDS" --steps "$STEPS" \
  --torch_steps "$TORCH_STEPS" --threads "$THREADS"
run cpu_adam.python "$out/python.log" "$PY" bench/cpu_adam/torch_adam.py --sizes "$SIZES" \
  --rounds "$ROUNDS" --steps "$TORCH_STEPS" --threads "default,1,$THREADS"

"$PY" bench/cpu_adam/report.py "$out/cpp.log" "$out/python.log"
