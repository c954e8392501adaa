# `cmake --install <build> --prefix P` lays out deepspeed-cpp for other CMake projects:
#   P/include/deepspeed/*.h          the public headers (they include no private header)
#   P/lib/libdeepspeed.a, libds_ops_cpu_adam.a (+ libds_ops_cuda_optim.a in CUDA builds)
#   P/bin/deepspeed, ds_config, ds_report, zero_to_fp32, ds_to_universal
#   P/lib/cmake/deepspeed/deepspeedConfig.cmake (+ Version, Targets)
# A downstream project then writes
#   find_package(deepspeed REQUIRED)
#   target_link_libraries(my_trainer PRIVATE deepspeed::deepspeed)
# and gets LibTorch, c10d Gloo (USE_C10D_GLOO), nlohmann-json and C++17 through the target.
include(CMakePackageConfigHelpers)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/deepspeed
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
# A static libdeepspeed names its kernel libraries in the export, so they are installed with it.
set(ds_installed_libraries deepspeed ds_ops_cpu_adam)
if(TARGET ds_ops_cuda_optim)
  list(APPEND ds_installed_libraries ds_ops_cuda_optim)
endif()
install(TARGETS ${ds_installed_libraries}
        EXPORT deepspeedTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS deepspeed_launcher ds_config ds_elastic ds_report zero_to_fp32 ds_to_universal
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

set(DS_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/deepspeed)
install(EXPORT deepspeedTargets
        NAMESPACE deepspeed::
        DESTINATION ${DS_INSTALL_CMAKEDIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/deepspeedConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/deepspeedConfig.cmake
                              INSTALL_DESTINATION ${DS_INSTALL_CMAKEDIR}
                              PATH_VARS CMAKE_INSTALL_BINDIR)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/deepspeedConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION}
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/deepspeedConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/deepspeedConfigVersion.cmake
        DESTINATION ${DS_INSTALL_CMAKEDIR})
