# Third-party libraries every build needs. Each is found by what it installs (headers,
# libraries, CMake package files) under CMAKE_PREFIX_PATH, so a relocated prefix such as the
# GPU kit's works as well as /usr; pkg-config is asked only where it is installed. Configure
# prints where each one came from (freeride_report_dependency).

# "freeride: <name>: <where>" at configure time, so a build on an unfamiliar machine says which
# copy of each library it took.
function(freeride_report_dependency name where)
  message(STATUS "freeride: ${name}: ${where}")
endfunction()

find_package(Threads REQUIRED)
find_package(MPI REQUIRED COMPONENTS C)
# The C API only: mpi.h would otherwise pull in the deprecated C++ bindings.
add_compile_definitions(OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
find_package(absl REQUIRED CONFIG)
find_package(tomlplusplus REQUIRED CONFIG)
find_package(nlohmann_json 3 REQUIRED CONFIG)
# The command line's option parsing (Debian: libcli11-dev, header-only).
find_package(CLI11 2 REQUIRED CONFIG)
find_package(OpenMP REQUIRED COMPONENTS CXX)
# Protocol Buffers: TensorBoard's event files (trainer/tensorboard_event.proto).
find_package(Protobuf REQUIRED)
# zlib: gzip'd corpora for `freeride prepare` (Debian's libprotobuf-dev depends on it already).
find_package(ZLIB REQUIRED)
freeride_report_dependency("MPI" "${MPI_C_LIBRARIES}")
freeride_report_dependency("abseil" "${absl_DIR}")
freeride_report_dependency("toml++" "${tomlplusplus_DIR}")
freeride_report_dependency("nlohmann_json" "${nlohmann_json_DIR}")
freeride_report_dependency("protobuf" "${Protobuf_LIBRARIES} (protoc ${Protobuf_PROTOC_EXECUTABLE})")
freeride_report_dependency("zlib" "${ZLIB_LIBRARIES}")

# cpp-httplib (the serve side task's HTTP server): Debian ships it compiled, with a pkg-config
# file whose flags (TLS, compression) must match the library's. Through pkg-config where it is
# installed; else the library, its header and the -D flags of its .pc file, found under
# CMAKE_PREFIX_PATH like everything else.
add_library(freeride_httplib INTERFACE)
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(HTTPLIB QUIET IMPORTED_TARGET cpp-httplib)
endif()
if(HTTPLIB_FOUND)
  target_link_libraries(freeride_httplib INTERFACE PkgConfig::HTTPLIB)
  freeride_report_dependency("cpp-httplib" "pkg-config ${PKG_CONFIG_EXECUTABLE}: ${HTTPLIB_LINK_LIBRARIES}")
else()
  find_path(HTTPLIB_INCLUDE_DIR httplib.h REQUIRED)
  find_library(HTTPLIB_LIBRARY NAMES cpp-httplib libcpp-httplib.so.0.11 REQUIRED)
  find_file(HTTPLIB_PC cpp-httplib.pc
    PATH_SUFFIXES lib/x86_64-linux-gnu/pkgconfig lib/pkgconfig share/pkgconfig)
  set(httplib_defines "")
  if(HTTPLIB_PC)
    file(STRINGS "${HTTPLIB_PC}" httplib_cflags REGEX "^Cflags:")
    string(REGEX MATCHALL "-D[A-Za-z0-9_=]+" httplib_flags "${httplib_cflags}")
    foreach(flag IN LISTS httplib_flags)
      string(SUBSTRING "${flag}" 2 -1 define)
      list(APPEND httplib_defines ${define})
    endforeach()
  endif()
  # The TLS and compression support the library was built with need their own libraries.
  set(httplib_extra "")
  if("CPPHTTPLIB_OPENSSL_SUPPORT" IN_LIST httplib_defines)
    find_package(OpenSSL REQUIRED)
    list(APPEND httplib_extra OpenSSL::SSL OpenSSL::Crypto)
  endif()
  target_include_directories(freeride_httplib SYSTEM INTERFACE ${HTTPLIB_INCLUDE_DIR})
  target_compile_definitions(freeride_httplib INTERFACE ${httplib_defines})
  target_link_libraries(freeride_httplib INTERFACE ${HTTPLIB_LIBRARY} ${httplib_extra})
  freeride_report_dependency("cpp-httplib"
    "${HTTPLIB_LIBRARY} (no pkg-config; flags from ${HTTPLIB_PC}: ${httplib_defines})")
endif()
# Debian keeps per-architecture headers under include/<multiarch> (openssl/opensslconf.h, which
# httplib.h reaches): the compiler looks there by itself only under /usr, not in a relocated
# prefix such as the GPU kit's.
find_path(HTTPLIB_HEADER_DIR httplib.h HINTS ${HTTPLIB_INCLUDE_DIRS} REQUIRED)
if(CMAKE_LIBRARY_ARCHITECTURE AND NOT HTTPLIB_HEADER_DIR STREQUAL "/usr/include"
   AND IS_DIRECTORY "${HTTPLIB_HEADER_DIR}/${CMAKE_LIBRARY_ARCHITECTURE}")
  target_include_directories(freeride_httplib SYSTEM INTERFACE
    "${HTTPLIB_HEADER_DIR}/${CMAKE_LIBRARY_ARCHITECTURE}")
endif()

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
freeride_report_dependency("OpenBLAS" "${OPENBLAS_LIBRARY}")
add_library(freeride_cblas INTERFACE)
target_include_directories(freeride_cblas SYSTEM INTERFACE ${CBLAS_INCLUDE_DIR})
target_link_libraries(freeride_cblas INTERFACE ${OPENBLAS_LIBRARY})

# Boost.Math, header-only (Debian: libboost-math-dev, whose headers are libboost1.74-dev's): the
# Student t quantiles of the harvest study's intervals.
find_path(BOOST_MATH_INCLUDE_DIR boost/math/distributions/students_t.hpp REQUIRED)
add_library(freeride_boost_math INTERFACE)
target_include_directories(freeride_boost_math SYSTEM INTERFACE ${BOOST_MATH_INCLUDE_DIR})
freeride_report_dependency("Boost.Math" "${BOOST_MATH_INCLUDE_DIR}")

find_path(PCRE2_INCLUDE_DIR pcre2.h REQUIRED)
find_library(PCRE2_LIBRARY NAMES pcre2-8 REQUIRED)
add_library(freeride_pcre2 INTERFACE)
target_include_directories(freeride_pcre2 SYSTEM INTERFACE ${PCRE2_INCLUDE_DIR})
target_link_libraries(freeride_pcre2 INTERFACE ${PCRE2_LIBRARY})
target_compile_definitions(freeride_pcre2 INTERFACE PCRE2_CODE_UNIT_WIDTH=8)
freeride_report_dependency("PCRE2" "${PCRE2_LIBRARY}")

if(FREERIDE_BUILD_TESTS)
  find_package(GTest REQUIRED CONFIG)
  freeride_report_dependency("GoogleTest" "${GTest_DIR}")
endif()

# The commit the binary was built from, for `freeride version`.
execute_process(COMMAND git rev-parse --short=12 HEAD
  WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}
  OUTPUT_VARIABLE FREERIDE_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT FREERIDE_GIT_COMMIT)
  set(FREERIDE_GIT_COMMIT unknown)
endif()
