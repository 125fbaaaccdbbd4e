// NVTX ranges for Nsight Systems: every schedule instruction, bubble and side-task step shows
// on the timeline by name. Compiled only in a CUDA build (NVTX 3 is header-only, in the CUDA
// toolkit; not in the emulation build); elsewhere the macros expand to nothing and their arguments are not evaluated. With
// no profiler attached an NVTX call returns at once.
//   FR_NVTX_RANGE(name);               a range for the rest of the enclosing scope
//   FR_NVTX_RANGE_START(name, &id);    a range that ends elsewhere: FR_NVTX_RANGE_END(id)
#pragma once

#if defined(FREERIDE_WITH_CUDA) && !defined(FREERIDE_CUDA_EMULATED)
#include <nvtx3/nvToolsExt.h>

#include <cstdint>
#include <string>

namespace freeride {

class NvtxRange {
 public:
  explicit NvtxRange(const std::string& name) { nvtxRangePushA(name.c_str()); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace freeride

#define FR_NVTX_CONCAT_(a, b) a##b
#define FR_NVTX_CONCAT(a, b) FR_NVTX_CONCAT_(a, b)
#define FR_NVTX_RANGE(name) \
  const ::freeride::NvtxRange FR_NVTX_CONCAT(fr_nvtx_range_, __LINE__)(name)
#define FR_NVTX_RANGE_START(name, id) (*(id) = nvtxRangeStartA(std::string(name).c_str()))
#define FR_NVTX_RANGE_END(id) nvtxRangeEnd(id)
#else
#define FR_NVTX_RANGE(name) static_cast<void>(0)
#define FR_NVTX_RANGE_START(name, id) static_cast<void>(0)
#define FR_NVTX_RANGE_END(id) static_cast<void>(0)
#endif
