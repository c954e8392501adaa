#!/usr/bin/env bash
# Runs a test once more on the kernels an AVX2-only CPU takes (ds_add_test_variant; the
# environment arrives from CTest). On a CPU without AVX-512 the test's own run already took
# those kernels (ATen's avx2 capability, OpenBLAS's Haswell GEMM, CPU-Adam's AVX2, no oneDNN
# bf16), so the variant is skipped: exit 77 is the tests' SKIP_RETURN_CODE.
# DS_TEST_AVX2_VARIANTS=always runs it anyway.
if [ "${DS_TEST_AVX2_VARIANTS:-}" != always ] && ! grep -qw avx512f /proc/cpuinfo; then
  echo "skipped: this CPU has no AVX-512, so the test's own run already took the AVX2 kernels"
  exit 77
fi
exec "$@"
