# The CUDA backend: FREERIDE_CUDA=AUTO turns it on when nvcc is found (on PATH or in
# /usr/local/cuda), ON requires it, OFF never looks. Sets FREERIDE_WITH_CUDA and, when on,
# the target freeride_cuda_libs (cudart, cuBLASLt, cuDNN, NCCL from the toolkit).

set(FREERIDE_WITH_CUDA OFF)
if(NOT FREERIDE_CUDA STREQUAL "OFF")
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

if(FREERIDE_WITH_CUDA)
  # Only the two architectures the project targets (A100, H100/H200), to keep builds short.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80 90)
  endif()
  set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 knows no CUDA 20 flags for nvcc
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  find_library(CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} REQUIRED)
  find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} REQUIRED)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} REQUIRED)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} REQUIRED)
  add_library(freeride_cuda_libs INTERFACE)
  target_include_directories(freeride_cuda_libs SYSTEM INTERFACE
    ${CUDNN_INCLUDE_DIR} ${NCCL_INCLUDE_DIR})
  target_link_libraries(freeride_cuda_libs INTERFACE
    CUDA::cudart CUDA::cublasLt CUDA::cublas ${CUDNN_LIBRARY} ${NCCL_LIBRARY})
  target_compile_definitions(freeride_cuda_libs INTERFACE FREERIDE_WITH_CUDA=1)
  message(STATUS "freeride: CUDA ${CUDAToolkit_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")
endif()
