// The device side of the CUDA emulation: what a kernel sees of its thread (threadIdx, blockIdx,
// blockDim, gridDim), the block and warp barriers, the __shfl_*_sync family and warp votes,
// dynamic shared memory and the launch. Every CUDA thread of a block is a fiber on one host
// thread; the scheduler (scheduler.cc) runs a block's fibers in the order FREERIDE_EMULATE_ORDER
// picks, each until its next barrier or collective, then the next block. See README.md for what
// this models and what it does not.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <source_location>
#include <tuple>
#include <type_traits>
#include <utility>

#include "models/cuda/emulation/include/cuda_runtime_api.h"
#include "models/cuda/emulation/qualifiers.h"
#include "models/cuda/emulation/vector_types.h"

namespace freeride::emu {

struct ThreadIndices {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};
// The running CUDA thread's indices; the scheduler points it at each fiber before resuming it.
extern thread_local const ThreadIndices* current_thread;

// __syncthreads(): waits for every thread of the block that has not exited. `where` is the
// caller's line, for the barrier mutants (SkipsBarrier).
void SyncThreads(const std::source_location& where);
// __syncwarp(mask): waits for the lanes of `mask` (which must hold the caller and no lane that
// has exited).
void SyncWarp(unsigned mask, const std::source_location& where);
// Whether the barrier called at `where` is the one FREERIDE_EMULATE_SKIP_BARRIER deletes
// (barrier_mutant.cc); counts the call if so.
bool SkipsBarrier(const std::source_location& where);
// A warp collective: deposits `bits` for the lanes of `mask`, waits for them all and returns
// the 32 deposited slots (valid until the caller's next collective). `what` names it in faults.
const uint64_t* WarpExchange(unsigned mask, uint64_t bits, const char* what);
int LaneId();
// The block's dynamic shared memory (the launch's byte count), poisoned with 0xFF (NaN as
// fp32, bf16 and fp64) at the start of every block.
void* DynamicShared();
// Stops the process with the kernel, block and thread named: a kernel bug the hardware would
// hang on, fault on or leave undefined.
[[noreturn]] void KernelFault(const char* format, ...) __attribute__((format(printf, 1, 2)));

// Enqueues a grid of `body` on `stream` (checks the configuration first: an invalid one sets
// the calling thread's last error, as a launch does, and runs nothing).
void LaunchKernel(const char* name, const void* kernel, dim3 grid, dim3 block, size_t shmem,
                  cudaStream_t stream, std::function<void()> body);

template <typename... Params>
class Launcher {
 public:
  Launcher(const char* name, dim3 grid, dim3 block, size_t shmem, cudaStream_t stream,
           void (*kernel)(Params...))
      : name_(name), grid_(grid), block_(block), shmem_(shmem), stream_(stream), kernel_(kernel) {}

  // The arguments are converted to the kernel's parameter types and copied at the launch, as
  // CUDA copies them into the launch's parameter buffer; every thread gets its own copy.
  template <typename... Args>
  void operator()(Args&&... args) const {
    static_assert(sizeof...(Args) == sizeof...(Params), "kernel launched with wrong arity");
    std::tuple<std::decay_t<Params>...> params(std::forward<Args>(args)...);
    auto* kernel = kernel_;
    LaunchKernel(name_, reinterpret_cast<const void*>(kernel), grid_, block_, shmem_, stream_,
                 [kernel, params]() { std::apply(kernel, params); });
  }

 private:
  const char* name_;
  dim3 grid_, block_;
  size_t shmem_;
  cudaStream_t stream_;
  void (*kernel_)(Params...);
};
template <typename... Params>
Launcher<Params...> MakeLauncher(const char* name, dim3 grid, dim3 block, size_t shmem,
                                 cudaStream_t stream, void (*kernel)(Params...)) {
  return Launcher<Params...>(name, grid, block, shmem, stream, kernel);
}

template <typename T>
uint64_t ToBits(T value) {
  static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable_v<T>,
                "warp collectives move at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof value);
  return bits;
}
template <typename T>
T FromBits(uint64_t bits) {
  T value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}
// Lane `src` of the exchange, or the caller's own value where CUDA returns it (`src` < 0).
template <typename T>
T Shuffled(unsigned mask, T value, int src, const char* what) {
  const uint64_t* slots = WarpExchange(mask, ToBits(value), what);
  if (src < 0) return value;
  if (!(mask & (1u << src)))
    KernelFault("%s reads lane %d, which is not in mask 0x%08x", what, src, mask);
  return FromBits<T>(slots[src]);
}

}  // namespace freeride::emu

#define threadIdx (::freeride::emu::current_thread->thread_idx)
#define blockIdx (::freeride::emu::current_thread->block_idx)
#define blockDim (::freeride::emu::current_thread->block_dim)
#define gridDim (::freeride::emu::current_thread->grid_dim)
constexpr int warpSize = 32;

// The caller's line comes along, so that one call site can be deleted at run time.
inline void __syncthreads(std::source_location where = std::source_location::current()) {
  ::freeride::emu::SyncThreads(where);
}
inline void __syncwarp(unsigned mask = 0xffffffffu,
                       std::source_location where = std::source_location::current()) {
  ::freeride::emu::SyncWarp(mask, where);
}

template <typename T>
T __shfl_sync(unsigned mask, T value, int src_lane, int width = 32) {
  const int lane = ::freeride::emu::LaneId();
  return ::freeride::emu::Shuffled(mask, value, lane / width * width + src_lane % width,
                                   "__shfl_sync");
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  const int lane = ::freeride::emu::LaneId(), src = lane ^ lane_mask;
  // A lane of a later width-group is out of reach: the caller keeps its own value.
  const bool reachable = src / width <= lane / width && src < 32;
  return ::freeride::emu::Shuffled(mask, value, reachable ? src : -1, "__shfl_xor_sync");
}
template <typename T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  const int lane = ::freeride::emu::LaneId(), src = lane + static_cast<int>(delta);
  const bool reachable = src / width == lane / width && src < 32;
  return ::freeride::emu::Shuffled(mask, value, reachable ? src : -1, "__shfl_down_sync");
}
template <typename T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  const int lane = ::freeride::emu::LaneId(), src = lane - static_cast<int>(delta);
  const bool reachable = src >= lane / width * width;
  return ::freeride::emu::Shuffled(mask, value, reachable ? src : -1, "__shfl_up_sync");
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  const uint64_t* slots = ::freeride::emu::WarpExchange(mask, predicate != 0, "__ballot_sync");
  unsigned ballot = 0;
  for (int lane = 0; lane < 32; ++lane) {
    if ((mask & (1u << lane)) && slots[lane]) ballot |= 1u << lane;
  }
  return ballot;
}
inline int __all_sync(unsigned mask, int predicate) {
  return __ballot_sync(mask, predicate) == mask;
}
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }

// The device math the kernels call that the host's <cmath> lacks or spells otherwise.
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
template <typename A, typename B>
inline std::common_type_t<A, B> min(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(b) < static_cast<C>(a) ? static_cast<C>(b) : static_cast<C>(a);
}
template <typename A, typename B>
inline std::common_type_t<A, B> max(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(b) : static_cast<C>(a);
}
