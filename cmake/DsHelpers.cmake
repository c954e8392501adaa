# Shared CMake helpers for deepspeed-cpp.

# ds_use_torch_pch(target): the heavy LibTorch headers are compiled once (in ds_pch) and reused by
# every target that includes them; a rebuild after one .cpp changes then costs seconds, not a minute.
function(ds_use_torch_pch target)
  if(TARGET ds_pch)
    target_precompile_headers(${target} REUSE_FROM ds_pch)
  endif()
endfunction()

# ds_add_test(NAME name SOURCES a.cpp ... LABELS unit|dist|e2e [TIMEOUT s] [LIBS ...])
# One CMake line per test executable; CTest labels let `ctest -L unit` stay fast.
function(ds_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LABELS;LIBS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE deepspeed ds_test_support GTest::gtest_main ${T_LIBS})
  ds_use_torch_pch(${T_NAME})
  add_test(NAME ${T_NAME} COMMAND ${T_NAME})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
endfunction()

# ds_add_test_variant(BASE name SUFFIX s ENVIRONMENT "K=V;...")
# The test `name` once more as `name_s` with extra environment: the suite runs on AVX2-only
# machines and on AVX-512 ones (AMD's Zen 4, Intel's with AMX), and LibTorch, OpenBLAS and
# CPU-Adam take other kernels on each; a variant runs here the kernels this machine would not
# pick by itself. ENVIRONMENT takes every K=V given (it took only the first before).
function(ds_add_test_variant)
  cmake_parse_arguments(V "" "BASE;SUFFIX" "ENVIRONMENT" ${ARGN})
  get_test_property(${V_BASE} LABELS labels)
  get_test_property(${V_BASE} TIMEOUT timeout)
  get_test_property(${V_BASE} ENVIRONMENT env)
  # Every variant is an AVX2 one: skipped where this CPU takes those kernels by itself.
  add_test(NAME ${V_BASE}_${V_SUFFIX}
           COMMAND bash ${PROJECT_SOURCE_DIR}/tests/run_avx2_variant.sh $<TARGET_FILE:${V_BASE}>)
  set_tests_properties(${V_BASE}_${V_SUFFIX} PROPERTIES LABELS "${labels}" TIMEOUT ${timeout}
    ENVIRONMENT "${env};${V_ENVIRONMENT}" SKIP_RETURN_CODE 77)
endfunction()
