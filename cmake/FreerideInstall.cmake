# What `cmake --install BUILD --prefix PREFIX` puts in PREFIX: the `freeride` binary and its
# side-task worker (bin/), and the plugin SDK: the headers a plugin includes
# (include/freeride-sdk/), a CMake package (lib/cmake/freeride/: find_package(freeride) gives
# the target freeride::side_task and FREERIDE_EXECUTABLE) and the example plugin as a project of
# its own (share/freeride/examples/). docs/side_tasks.md shows both ways to build a plugin.
include(CMakePackageConfigHelpers)

install(TARGETS freeride freeride_side_worker RUNTIME DESTINATION bin)
# The installed binaries keep the run paths of the libraries they were linked with outside the
# system's (the OpenMP build of OpenBLAS, the CUDA toolkit's), as the built ones do.
set_target_properties(freeride freeride_side_worker PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)

# side_task.h and every project header it includes, at the paths it includes them by.
install(FILES freeride/side_task.h freeride/task_args.h DESTINATION include/freeride-sdk/freeride)
install(FILES core/arena.h core/clock.h DESTINATION include/freeride-sdk/core)
install(FILES freeride/examples/collatz_plugin.cc freeride/examples/CMakeLists.txt
  DESTINATION share/freeride/examples)

install(TARGETS freeride_side_task EXPORT freerideTargets)
install(EXPORT freerideTargets NAMESPACE freeride:: DESTINATION lib/cmake/freeride)
configure_package_config_file(cmake/freerideConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/freerideConfig.cmake INSTALL_DESTINATION lib/cmake/freeride)
# The side-task ABI is checked when a plugin loads, not here: any 0.1.x package will do.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/freerideConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/freerideConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/freerideConfigVersion.cmake DESTINATION lib/cmake/freeride)
