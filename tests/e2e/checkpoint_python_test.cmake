# Checkpoint files across the language boundary (python3-torch) and the zero_to_fp32 tool.
ds_add_test(NAME checkpoint_python_test LABELS e2e SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint_python_test.cpp
  ${CMAKE_CURRENT_LIST_DIR}/engine_checkpoint_python_test.cpp)
target_include_directories(checkpoint_python_test PRIVATE ${PROJECT_SOURCE_DIR}/tests/unit/checkpoint)
target_compile_definitions(checkpoint_python_test PRIVATE
  DS_PYTHON="/usr/bin/python3"
  DS_CHECKPOINT_PY="${CMAKE_CURRENT_LIST_DIR}/checkpoint_python_test.py"
  DS_ZERO_TO_FP32_BIN="$<TARGET_FILE:zero_to_fp32>")
add_dependencies(checkpoint_python_test zero_to_fp32)
