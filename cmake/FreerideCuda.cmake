# The CUDA backend: FREERIDE_CUDA=AUTO turns it on when nvcc is found (on PATH or in
# /usr/local/cuda), ON requires it, OFF never looks, EMULATE compiles the CUDA sources with the
# host compiler against the emulation layer (models/cuda/emulation/README.md) and needs no
# toolkit. Sets FREERIDE_WITH_CUDA (and FREERIDE_CUDA_EMULATED) and, when on, the target
# freeride_cuda_libs (cudart, cuBLASLt, NCCL, and cuDNN where found, opened on first use;
# or the emulation).
#
# cuDNN and NCCL come from -DCUDNN_ROOT / -DNCCL_ROOT (or those environment variables) when
# given, else from the CUDA toolkit's prefix and CMAKE_PREFIX_PATH, else from pip wheels
# (site-packages/nvidia/{cudnn,nccl}/{include,lib}, which hold only versioned libraries such
# as libcudnn.so.9). cuDNN is optional: nothing but its version and error text uses it yet.

# The site-packages folders a pip wheel of NVIDIA's libraries may sit in: this python3's,
# those under CMAKE_PREFIX_PATH (the variable and the environment's), the system's and the
# user's.
function(freeride_wheel_roots package out)
  set(sites "")
  find_program(FREERIDE_PYTHON3 python3)
  if(FREERIDE_PYTHON3)
    execute_process(
      COMMAND ${FREERIDE_PYTHON3} -c
        "import site, sysconfig; print(';'.join(site.getsitepackages() + [site.getusersitepackages(), sysconfig.get_paths()['purelib'], sysconfig.get_paths()['platlib']]))"
      OUTPUT_VARIABLE python_sites OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    list(APPEND sites ${python_sites})
  endif()
  set(env_prefixes "$ENV{CMAKE_PREFIX_PATH}")
  string(REPLACE ":" ";" env_prefixes "${env_prefixes}")
  foreach(prefix IN LISTS CMAKE_PREFIX_PATH env_prefixes)
    file(GLOB prefix_sites "${prefix}/lib/python3*/site-packages" "${prefix}/lib/python3*/dist-packages"
                           "${prefix}/site-packages")
    list(APPEND sites ${prefix_sites})
  endforeach()
  file(GLOB system_sites /usr/local/lib/python3*/dist-packages /usr/local/lib/python3*/site-packages
                         /usr/lib/python3/dist-packages "$ENV{HOME}/.local/lib/python3*/site-packages")
  list(APPEND sites ${system_sites})
  set(roots "")
  foreach(site IN LISTS sites)
    if(IS_DIRECTORY "${site}/nvidia/${package}")
      list(APPEND roots "${site}/nvidia/${package}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES roots)
  set(${out} ${roots} PARENT_SCOPE)
endfunction()

# Finds <PREFIX>_LIBRARY and <PREFIX>_INCLUDE_DIR for a CUDA-side library (header, library
# names tried in order, the pip wheel's folder name) and says where they came from in
# <PREFIX>_FROM. With <PREFIX>_ROOT set (cache or environment) only that folder is searched.
function(freeride_find_cuda_library prefix header wheel)
  set(names ${ARGN})
  if(NOT ${prefix}_ROOT AND DEFINED ENV{${prefix}_ROOT})
    set(${prefix}_ROOT "$ENV{${prefix}_ROOT}")
  endif()
  if(${prefix}_ROOT)
    find_path(${prefix}_INCLUDE_DIR ${header} PATHS ${${prefix}_ROOT} PATH_SUFFIXES include
      NO_DEFAULT_PATH)
    find_library(${prefix}_LIBRARY NAMES ${names} PATHS ${${prefix}_ROOT}
      PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu NO_DEFAULT_PATH)
    set(from "${prefix}_ROOT=${${prefix}_ROOT}")
  else()
    find_path(${prefix}_INCLUDE_DIR ${header} HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(${prefix}_LIBRARY NAMES ${names} HINTS ${CUDAToolkit_LIBRARY_DIR})
    set(from "the CUDA toolkit or CMAKE_PREFIX_PATH")
    if(NOT ${prefix}_INCLUDE_DIR OR NOT ${prefix}_LIBRARY)
      freeride_wheel_roots(${wheel} roots)
      unset(${prefix}_INCLUDE_DIR CACHE)
      unset(${prefix}_LIBRARY CACHE)
      find_path(${prefix}_INCLUDE_DIR ${header} PATHS ${roots} PATH_SUFFIXES include
        NO_DEFAULT_PATH)
      find_library(${prefix}_LIBRARY NAMES ${names} PATHS ${roots} PATH_SUFFIXES lib
        NO_DEFAULT_PATH)
      set(from "a pip wheel (${roots})")
    endif()
  endif()
  if(${prefix}_INCLUDE_DIR AND ${prefix}_LIBRARY)
    set(${prefix}_FROM "${${prefix}_LIBRARY}, ${${prefix}_INCLUDE_DIR}/${header} (from ${from})"
      PARENT_SCOPE)
  else()
    set(${prefix}_FROM "" PARENT_SCOPE)
  endif()
endfunction()

set(FREERIDE_WITH_CUDA OFF)
set(FREERIDE_CUDA_EMULATED OFF)
if(FREERIDE_CUDA STREQUAL "EMULATE")
  set(FREERIDE_WITH_CUDA ON)
  set(FREERIDE_CUDA_EMULATED ON)
  set(CMAKE_CUDA_ARCHITECTURES "emulated")
  # The fibers of the CUDA threads.
  find_package(Boost 1.74 REQUIRED COMPONENTS context)
  add_library(freeride_cuda_libs INTERFACE)
  target_include_directories(freeride_cuda_libs INTERFACE
    ${CMAKE_CURRENT_SOURCE_DIR}/models/cuda/emulation/include)
  # NCCL too, between the threads of one process (models/cuda/emulation/nccl.cc).
  target_compile_definitions(freeride_cuda_libs INTERFACE FREERIDE_WITH_CUDA=1
    FREERIDE_CUDA_EMULATED=1 FREERIDE_WITH_NCCL=1)
  # Defined in models/cuda/emulation/CMakeLists.txt.
  target_link_libraries(freeride_cuda_libs INTERFACE freeride_cuda_emulation)
  message(STATUS "freeride: CUDA emulated on the CPU (models/cuda/emulation), Boost.Context "
                 "${Boost_VERSION}")
elseif(NOT FREERIDE_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(FREERIDE_NVCC nvcc HINTS /usr/local/cuda/bin)
    if(FREERIDE_NVCC)
      set(CMAKE_CUDA_COMPILER ${FREERIDE_NVCC})
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(FREERIDE_WITH_CUDA ON)
  elseif(FREERIDE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "FREERIDE_CUDA=ON but no CUDA compiler was found "
                        "(looked for nvcc on PATH and in /usr/local/cuda/bin)")
  else()
    message(STATUS "freeride: nvcc not found, building the CPU backend only")
  endif()
endif()

if(FREERIDE_WITH_CUDA AND NOT FREERIDE_CUDA_EMULATED)
  # Only the two architectures the project targets (A100, H100/H200), to keep builds short.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80 90)
  endif()
  set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 knows no CUDA 20 flags for nvcc
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  enable_language(CUDA)
  # Debian 12's CMake 3.25.1 marks CUDA::nvToolsExt deprecated without checking that the
  # target exists, and CUDA 13 has no libnvToolsExt (NVTX 3 is header-only): configure fails in
  # FindCUDAToolkit. An empty target of that name, linked by nothing, lets it finish (found by
  # bench/gpu_rehearsal.sh; this machine's copy of the module had been patched by hand).
  if(NOT TARGET CUDA::nvToolsExt)
    add_library(CUDA::nvToolsExt INTERFACE IMPORTED)
  endif()
  find_package(CUDAToolkit REQUIRED)
  # Versioned names last: a wheel ships no unversioned link.
  freeride_find_cuda_library(NCCL nccl.h nccl nccl libnccl.so.2)
  if(NOT NCCL_FROM)
    message(FATAL_ERROR "NCCL not found (nccl.h and libnccl) in -DNCCL_ROOT, the CUDA toolkit "
                        "(${CUDAToolkit_LIBRARY_DIR}), CMAKE_PREFIX_PATH or a pip wheel's "
                        "site-packages/nvidia/nccl; give its folder with -DNCCL_ROOT=")
  endif()
  freeride_find_cuda_library(CUDNN cudnn.h cudnn cudnn libcudnn.so.9)
  if(NOT CUDNN_FROM AND CUDNN_ROOT)
    message(FATAL_ERROR "cuDNN not found (cudnn.h and libcudnn) in CUDNN_ROOT=${CUDNN_ROOT}")
  endif()
  # cuBLAS, cuBLASLt, NCCL and cuDNN are opened at their first call (core/cuda_lazy_libs.cc:
  # the files found here), and the runtime is linked statically, which opens the driver at its
  # first call: a command that touches no device loads none of them.
  add_library(freeride_cuda_lazy STATIC ${CMAKE_CURRENT_SOURCE_DIR}/core/cuda_lazy_libs.cc)
  set_target_properties(freeride_cuda_lazy PROPERTIES POSITION_INDEPENDENT_CODE ON)
  target_include_directories(freeride_cuda_lazy SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS}
    ${NCCL_INCLUDE_DIR})
  target_compile_definitions(freeride_cuda_lazy PRIVATE
    FREERIDE_CUBLAS_LIBRARY="$<TARGET_FILE:CUDA::cublas>"
    FREERIDE_CUBLASLT_LIBRARY="$<TARGET_FILE:CUDA::cublasLt>"
    FREERIDE_NCCL_LIBRARY="${NCCL_LIBRARY}")
  target_link_libraries(freeride_cuda_lazy PRIVATE ${CMAKE_DL_LIBS})
  add_library(freeride_cuda_libs INTERFACE)
  target_include_directories(freeride_cuda_libs SYSTEM INTERFACE ${NCCL_INCLUDE_DIR})
  target_link_libraries(freeride_cuda_libs INTERFACE CUDA::cudart_static freeride_cuda_lazy)
  target_compile_definitions(freeride_cuda_libs INTERFACE FREERIDE_WITH_CUDA=1
    FREERIDE_WITH_NCCL=1)
  if(CUDNN_FROM)
    target_include_directories(freeride_cuda_libs SYSTEM INTERFACE ${CUDNN_INCLUDE_DIR})
    target_include_directories(freeride_cuda_lazy SYSTEM PRIVATE ${CUDNN_INCLUDE_DIR})
    target_compile_definitions(freeride_cuda_lazy PRIVATE FREERIDE_WITH_CUDNN=1
      FREERIDE_CUDNN_LIBRARY="${CUDNN_LIBRARY}")
    target_compile_definitions(freeride_cuda_libs INTERFACE FREERIDE_WITH_CUDNN=1)
  endif()
  message(STATUS "freeride: CUDA ${CUDAToolkit_VERSION} (${CUDAToolkit_BIN_DIR}), "
                 "architectures ${CMAKE_CUDA_ARCHITECTURES}")
  freeride_report_dependency("NCCL" "${NCCL_FROM}")
  if(CUDNN_FROM)
    freeride_report_dependency("cuDNN" "${CUDNN_FROM}")
  else()
    freeride_report_dependency("cuDNN" "not found (optional; -DCUDNN_ROOT= names its folder)")
  endif()
endif()
