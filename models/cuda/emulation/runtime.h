// What the parts of the emulated runtime need from each other: blas.cc and runtime.cc from
// streams.cc, scheduler.cc from runtime.cc, and runtime.cc from scheduler.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string_view>

#include "models/cuda/emulation/include/cuda_runtime_api.h"

namespace freeride::emu {

// Runs `op` in stream order: on the stream's own host thread after the work enqueued before
// it, or, on the legacy default stream (null), on the caller after all other streams drain.
void Enqueue(cudaStream_t stream, std::function<void()> op);

// Waits for the work enqueued so far on every stream of the calling thread's context, or on
// those the legacy default stream waits for (not cudaStreamNonBlocking ones).
void DrainAll();
void DrainBlocking();
// Tests that run ranks as threads of one process: the calling thread's CUDA context (0 until
// set; returns the previous one), as each rank's process has its own. Streams belong to the
// context they were made in, and the device's synchronisation (the legacy default stream,
// cudaDeviceSynchronize, cudaFree, cudaFreeHost) waits for its own context's streams only:
// a rank freeing memory does not wait for another rank's collective, which waits for it.
int SetThreadContext(int context);
// Null (the legacy default stream) or a stream that exists.
bool ValidStream(cudaStream_t stream);

// Whether [p, p + bytes) lies inside one cudaMalloc allocation.
bool IsDeviceMemory(const void* p, size_t bytes);

// Tests: how many copies between host and device memory (either way; cudaMemcpy,
// cudaMemcpyAsync and cudaMemcpy2DAsync, cudaMemcpyDefault by the kind its pointers make it) of
// exactly `bytes` bytes the process has made so far: e.g. that a pipeline's messages on a
// transport that carries device memory never pass through the host.
int64_t HostDeviceCopies(size_t bytes);
// Tests: the copies from device to host memory the process has made so far, by their bytes
// (bytes → copies): e.g. that no gradient leaves the device for a sum over NCCL.
std::map<size_t, int64_t> DeviceToHostCopies();

}  // namespace freeride::emu

namespace freeride::emu {

// The calling host thread's sticky-until-read launch error (cudaGetLastError reads it).
void SetLastError(cudaError_t error);
// The dynamic shared memory a launch of `kernel` may ask for: 48 KiB unless
// cudaFuncSetAttribute raised it (up to the device's opt-in limit).
size_t MaxDynamicSharedBytes(const void* kernel);
// The order in which a block's threads run between barriers (FREERIDE_EMULATE_ORDER): lane
// order, reversed, one warp as far as it goes then the next ("warp"), or that with the warps
// and lanes reversed ("warp-reversed"); the reversed orders also run the blocks backwards.
enum class Order { kLane, kReversed, kWarp, kWarpReversed };
std::optional<Order> ParseOrder(std::string_view name);
// For tests that compare orders within one process; takes effect at the next launch.
void SetThreadOrder(Order order);

// Runs every block of a grid, one after another, on the calling thread (scheduler.cc).
void RunGrid(const char* name, dim3 grid, dim3 block, size_t shmem,
             const std::function<void()>& body);

}  // namespace freeride::emu

namespace freeride::emu {

// Tests: every NCCL group of communicators of rank `rank` (in any clique) starts `seconds` late
// on its stream, a deliberately slow communication stream (nccl.cc); 0 removes the delay.
void SetNcclRankDelay(int rank, double seconds);
// Tests: every NCCL group that holds a reduce or a broadcast (ZeRO-1's reduce-scatter and
// all-gather) starts `seconds` late on its stream, on every rank: the summed gradients and the
// parameters land after whatever does not wait for them has read them. 0 removes the delay.
void SetNcclRootedDelay(double seconds);
// Tests: every cudaMemcpyAsync between device buffers runs `seconds` late on its stream: a
// chunk's copies into and out of device messages come late, as behind a busy compute stream,
// so that whatever reads or rewrites a message without waiting for its event sees the wrong
// values. 0 removes the delay.
void SetDeviceCopyDelay(double seconds);

}  // namespace freeride::emu
