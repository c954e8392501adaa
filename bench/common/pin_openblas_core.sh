# Sourced by the benches from the repository root: pins OpenBLAS's kernels for both sides of a
# comparison. The machines' environment forces OPENBLAS_CORETYPE=Haswell (up to 2x slower on
# AVX-512 CPUs), so it is unset; then OpenBLAS detects the CPU itself, except where its release is
# older than the CPU and falls back to its generic SSE3 kernels (6x slower GEMM). deepspeed-cpp
# re-selects the CPU's kernels there (src/runtime/openblas_core.h); Python's torch does not. So
# the kernels ours runs are exported, and the Python peers on the same OpenBLAS run them too.
unset OPENBLAS_CORETYPE
if [ -x build/bin/ds_report ]; then
  pinned_core=$(build/bin/ds_report --openblas_core 2>/dev/null || true)
  if [ -n "$pinned_core" ]; then export OPENBLAS_CORETYPE=$pinned_core; fi
  unset pinned_core
fi
