# The CUDA build (-DDS_BUILD_CUDA=ON) against the torch 2.x wheel's LibTorch.
#
# Included twice: ds_cuda_before_torch() before find_package(Torch), ds_cuda_after_torch() after.
# Everything here fixes a way the wheel's LibTorch and this machine's CUDA toolkit disagree.

macro(ds_cuda_before_torch)
  # Torch 2.x headers use C++20 in host code. Our kernels (.cu) include no torch header and stay
  # C++17, which every CMake that knows nvcc 13 can ask for (3.25 cannot ask for CUDA20).
  set(CMAKE_CXX_STANDARD 20)
  # GCC 12 in C++20 mode warns that `"literal" + std::string` copies 2^63 bytes (-Wrestrict,
  # -Wstringop-overflow, -Warray-bounds inside basic_string's inlined _M_replace), and that
  # LibTorch's ivalue_inl.h reads past a 3-element array: known false positives that GCC 13 no
  # longer gives. A dozen of them buried the CUDA build's real warnings. The CPU build keeps all
  # three.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>
                        $<$<COMPILE_LANGUAGE:CXX>:-Wno-stringop-overflow>
                        $<$<COMPILE_LANGUAGE:CXX>:-Wno-array-bounds>)
  endif()
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  # Hopper (H100/H200) unless told otherwise. Without a GPU to probe, torch's cmake falls back to
  # an arch list that starts at compute_50, which nvcc 13 rejects.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(ENV{TORCH_CUDA_ARCH_LIST} "9.0")
  endif()
  # The shared CUDA runtime, the one LibTorch loads: one runtime state per process.
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  enable_language(CUDA)
  # TorchConfig.cmake finds libtorch.so and libc10.so with find_library, which looks in the system
  # folders first and so picks Debian's LibTorch 1.13 where libtorch-dev is installed: point both
  # at the wheel's before it runs.
  find_path(DS_TORCH_CMAKE_DIR Torch/TorchConfig.cmake PATHS ${CMAKE_PREFIX_PATH} ${Torch_DIR}/..
    NO_DEFAULT_PATH)
  if(NOT DS_TORCH_CMAKE_DIR)
    message(FATAL_ERROR "DS_BUILD_CUDA: no torch wheel in CMAKE_PREFIX_PATH (${CMAKE_PREFIX_PATH});"
      " build with scripts/build.sh, which finds it, after scripts/install_deps.sh --cuda")
  endif()
  get_filename_component(DS_TORCH_ROOT "${DS_TORCH_CMAKE_DIR}/../.." ABSOLUTE)
  set(TORCH_LIBRARY "${DS_TORCH_ROOT}/lib/libtorch.so" CACHE FILEPATH "the wheel's libtorch" FORCE)
  set(c10_LIBRARY "${DS_TORCH_ROOT}/lib/libc10.so" CACHE FILEPATH "the wheel's libc10" FORCE)
endmacro()

function(ds_cuda_after_torch)
  if(Torch_VERSION VERSION_LESS 2.0)
    message(FATAL_ERROR "DS_BUILD_CUDA needs LibTorch 2.x (the torch wheel), found ${Torch_VERSION}"
      " at ${Torch_DIR}; run scripts/install_deps.sh --cuda and build with scripts/build.sh")
  endif()
  # The wheel keeps its CUDA libraries (NCCL, cuBLAS, cuDNN...) in site-packages/nvidia/*/lib and
  # finds them at run time through its own RPATH. The linker must find the same ones: the
  # toolkit's older libnccl.so.2 lacks symbols libtorch_cuda.so needs (ncclPutSignal).
  get_filename_component(torch_lib "${TORCH_LIBRARY}" DIRECTORY)
  get_filename_component(site "${torch_lib}/../.." ABSOLUTE)
  file(GLOB wheel_libs LIST_DIRECTORIES true "${site}/nvidia/*/lib")
  set(dirs ${torch_lib} ${wheel_libs})
  foreach(d IN LISTS dirs)
    add_link_options("LINKER:-rpath-link,${d}")
  endforeach()
  # Binaries run from the build tree find the wheel's libraries without LD_LIBRARY_PATH.
  set(CMAKE_BUILD_RPATH ${dirs} PARENT_SCOPE)
  message(STATUS "deepspeed-cpp CUDA build: LibTorch ${Torch_VERSION}, CUDA archs "
    "$ENV{TORCH_CUDA_ARCH_LIST}, wheel libraries ${wheel_libs}")
endfunction()
