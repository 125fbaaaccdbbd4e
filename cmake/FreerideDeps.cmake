# Third-party libraries every build needs. Each is found by what it installs (headers,
# libraries, CMake package files) under CMAKE_PREFIX_PATH, so a relocated prefix such as the
# GPU kit's works as well as /usr.

find_package(Threads REQUIRED)
find_package(MPI REQUIRED COMPONENTS C)
# The C API only: mpi.h would otherwise pull in the deprecated C++ bindings.
add_compile_definitions(OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
find_package(absl REQUIRED CONFIG)
find_package(tomlplusplus REQUIRED CONFIG)
find_package(nlohmann_json 3 REQUIRED CONFIG)
# cpp-httplib (the serve side task's HTTP server): Debian ships it compiled, with a pkg-config
# file whose flags (TLS, compression) must match the library's.
find_package(PkgConfig REQUIRED)
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
find_package(OpenMP REQUIRED COMPONENTS CXX)

# OpenBLAS: Debian's OpenBLASConfig.cmake hard-codes /usr, so look for the files instead.
# The OpenMP build comes first: it shares one thread pool with our OpenMP kernels, where the
# pthreads build's threads and OpenMP's spinning threads fight over the cores (measured 2.4x
# slower CPU training on 2 cores). The build records the chosen directory as the run path.
find_path(CBLAS_INCLUDE_DIR cblas.h
  PATH_SUFFIXES x86_64-linux-gnu/openblas-openmp openblas-openmp x86_64-linux-gnu/openblas-pthread
                openblas-pthread openblas x86_64-linux-gnu
  REQUIRED)
find_library(OPENBLAS_LIBRARY NAMES openblas
  PATH_SUFFIXES x86_64-linux-gnu/openblas-openmp openblas-openmp x86_64-linux-gnu/openblas-pthread
                openblas-pthread REQUIRED)
if(NOT OPENBLAS_LIBRARY MATCHES "openmp")
  message(WARNING "OpenBLAS is not the OpenMP build (${OPENBLAS_LIBRARY}): CPU training will be "
                  "slower; install libopenblas-openmp-dev")
endif()
add_library(freeride_cblas INTERFACE)
target_include_directories(freeride_cblas SYSTEM INTERFACE ${CBLAS_INCLUDE_DIR})
target_link_libraries(freeride_cblas INTERFACE ${OPENBLAS_LIBRARY})

find_path(PCRE2_INCLUDE_DIR pcre2.h REQUIRED)
find_library(PCRE2_LIBRARY NAMES pcre2-8 REQUIRED)
add_library(freeride_pcre2 INTERFACE)
target_include_directories(freeride_pcre2 SYSTEM INTERFACE ${PCRE2_INCLUDE_DIR})
target_link_libraries(freeride_pcre2 INTERFACE ${PCRE2_LIBRARY})
target_compile_definitions(freeride_pcre2 INTERFACE PCRE2_CODE_UNIT_WIDTH=8)

if(FREERIDE_BUILD_TESTS)
  find_package(GTest REQUIRED CONFIG)
endif()

# The commit the binary was built from, for `freeride version`.
execute_process(COMMAND git rev-parse --short=12 HEAD
  WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}
  OUTPUT_VARIABLE FREERIDE_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT FREERIDE_GIT_COMMIT)
  set(FREERIDE_GIT_COMMIT unknown)
endif()
