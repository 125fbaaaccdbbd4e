// The emulation layer itself (models/cuda/emulation): thread indices, barriers, shuffles and
// votes in every thread order, dynamic shared memory and its limit, streams and events, device
// memory, bf16 rounding and wmma, each against a closed form. The kernels here are written as
// the project's are (FR_LAUNCH, FR_DYNAMIC_SHARED), in this host file, which includes what nvcc
// would put in front of a .cu (cuda_runtime.h).
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "models/cuda/emulation/barrier_mutant.h"
#include "models/cuda/emulation/runtime.h"
#include "models/cuda/launch.h"

namespace freeride::emu {
namespace {

constexpr Order kOrders[] = {Order::kLane, Order::kReversed, Order::kWarp, Order::kWarpReversed};

template <typename T>
T* DeviceCopy(const std::vector<T>& host) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return static_cast<T*>(p);
}
template <typename T>
std::vector<T> HostCopy(const T* device, size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

class OrderTest : public testing::TestWithParam<Order> {
 protected:
  void SetUp() override { SetThreadOrder(GetParam()); }
  void TearDown() override { SetThreadOrder(Order::kLane); }
};

__global__ void IndexKernel(int* out) {
  const int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int b = blockIdx.x + gridDim.x * blockIdx.y;
  out[b * blockDim.x * blockDim.y * blockDim.z + t] = b * 1000 + t;
}

TEST_P(OrderTest, EveryThreadOfEveryBlockRunsOnceWithItsIndices) {
  const dim3 grid(3, 2), block(8, 4, 2);
  std::vector<int> init(6 * 64, -1);
  int* out = DeviceCopy(init);
  FR_LAUNCH(grid, block, 0, nullptr, IndexKernel)(out);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<int> got = HostCopy(out, init.size());
  for (int b = 0; b < 6; ++b) {
    for (int t = 0; t < 64; ++t) EXPECT_EQ(got[b * 64 + t], b * 1000 + t);
  }
  cudaFree(out);
}

// Each thread writes its slot, then reads its neighbour's: right only with the barrier between.
template <bool kBarrier>
__global__ void NeighbourKernel(float* out) {
  FR_DYNAMIC_SHARED(float, slots);
  const int t = threadIdx.x, n = blockDim.x;
  slots[t] = static_cast<float>(t + blockIdx.x);
  if (kBarrier) __syncthreads();
  out[blockIdx.x * n + t] = slots[(t + 1) % n];
}

// NeighbourKernel<true> with its barrier a __syncwarp where `kWarp` (one warp a block then);
// also writes the barrier's line to `line`, the site a mutant names.
template <bool kWarp>
__global__ void MutantNeighbourKernel(float* out, unsigned* line) {
  FR_DYNAMIC_SHARED(float, slots);
  const int t = threadIdx.x, n = blockDim.x;
  slots[t] = static_cast<float>(t + blockIdx.x);
  constexpr unsigned kBarrierLine = __LINE__ + 1;
  kWarp ? __syncwarp() : __syncthreads();  // one line: one site for either barrier
  out[blockIdx.x * n + t] = slots[(t + 1) % n];
  *line = kBarrierLine;
}

// Runs MutantNeighbourKernel on 4 blocks of 128 threads (of 32 with kWarp); returns how many
// threads read a wrong neighbour and sets `line` to the barrier's.
template <bool kWarp>
int WrongNeighbours(unsigned* line) {
  const int n = kWarp ? 32 : 128;
  float* out = DeviceCopy(std::vector<float>(4 * n, 0.0f));
  unsigned* device_line = DeviceCopy(std::vector<unsigned>(1, 0));
  FR_LAUNCH(4, n, n * sizeof(float), nullptr, MutantNeighbourKernel<kWarp>)(out, device_line);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> got = HostCopy(out, 4 * n);
  *line = HostCopy(device_line, 1)[0];
  cudaFree(out);
  cudaFree(device_line);
  int wrong = 0;
  for (int b = 0; b < 4; ++b) {
    for (int t = 0; t < n; ++t) wrong += !(got[b * n + t] == static_cast<float>((t + 1) % n + b));
  }
  return wrong;
}

// FREERIDE_EMULATE_SKIP_BARRIER deletes one barrier call site at run time, as deleting it from
// the source would (tests/scripts/emulation_mutants.sh): that barrier only, every call counted.
template <bool kWarp>
void ExpectDeletedAtItsSiteOnly() {
  unsigned line = 0;
  ASSERT_EQ(WrongNeighbours<kWarp>(&line), 0);
  ASSERT_GT(line, 0u);
  // Another line of this file, and this line of another file, leave it in place.
  for (const BarrierSite& other :
       {BarrierSite{"cuda_emulation_test.cc", line + 1}, BarrierSite{"kernels.cu", line}}) {
    SetSkippedBarrier(other);
    EXPECT_EQ(WrongNeighbours<kWarp>(&line), 0) << other.file << ":" << other.line;
    EXPECT_EQ(SkippedBarrierCalls(), 0);
  }
  SetSkippedBarrier(BarrierSite{"cuda_emulation_test.cc", line});
  EXPECT_GT(WrongNeighbours<kWarp>(&line), 0);
  EXPECT_EQ(SkippedBarrierCalls(), 4 * (kWarp ? 32 : 128));  // every thread of every block
  SetSkippedBarrier(std::nullopt);
  EXPECT_EQ(WrongNeighbours<kWarp>(&line), 0);
  EXPECT_EQ(SkippedBarrierCalls(), 0);
}

TEST(BarrierMutantTest, ASkippedSyncThreadsIsDeletedAtItsLineOnly) {
  ExpectDeletedAtItsSiteOnly<false>();
}

TEST(BarrierMutantTest, ASkippedSyncWarpIsDeletedAtItsLineOnly) {
  ExpectDeletedAtItsSiteOnly<true>();
}

TEST(BarrierMutantTest, SitesAreABaseNameAndALine) {
  const std::optional<BarrierSite> site = ParseBarrierSite("flash_attention.cu:259");
  ASSERT_TRUE(site.has_value());
  EXPECT_EQ(site->file, "flash_attention.cu");
  EXPECT_EQ(site->line, 259u);
  for (const char* bad : {"", "flash_attention.cu", "flash_attention.cu:", ":259",
                          "models/cuda/kernels.cu:44", "kernels.cu:0", "kernels.cu:4x",
                          "kernels.cu:-4", "kernels.cu:12345678901"}) {
    EXPECT_FALSE(ParseBarrierSite(bad).has_value()) << bad;
  }
}

TEST_P(OrderTest, SyncThreadsOrdersSharedMemory) {
  std::vector<float> init(4 * 128, 0.0f);
  float* out = DeviceCopy(init);
  FR_LAUNCH(4, 128, 128 * sizeof(float), nullptr, NeighbourKernel<true>)(out);
  const std::vector<float> got = HostCopy(out, init.size());
  for (int b = 0; b < 4; ++b) {
    for (int t = 0; t < 128; ++t)
      EXPECT_EQ(got[b * 128 + t], static_cast<float>((t + 1) % 128 + b));
  }
  cudaFree(out);
}

TEST_P(OrderTest, AMissingBarrierReadsPoisonOrAnotherBlocksValues) {
  std::vector<float> init(4 * 128, 0.0f);
  float* out = DeviceCopy(init);
  FR_LAUNCH(4, 128, 128 * sizeof(float), nullptr, NeighbourKernel<false>)(out);
  const std::vector<float> got = HostCopy(out, init.size());
  int wrong = 0;
  for (int b = 0; b < 4; ++b) {
    for (int t = 0; t < 128; ++t)
      wrong += !(got[b * 128 + t] == static_cast<float>((t + 1) % 128 + b));
  }
  // Without the barrier every thread runs to its end before the next starts: in lane order
  // all but the last read poison (NaN), reversed only the first; no order gets them all right.
  EXPECT_GT(wrong, 0);
  cudaFree(out);
}

__global__ void ShuffleKernel(float* sums, int* down, unsigned* ballots) {
  const int lane = threadIdx.x % 32;
  float v = static_cast<float>(threadIdx.x);
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  sums[threadIdx.x] = v;
  down[threadIdx.x] = __shfl_down_sync(0xffffffffu, static_cast<int>(threadIdx.x), 3);
  ballots[threadIdx.x] = __ballot_sync(0xffffffffu, lane % 3 == 0);
}

TEST_P(OrderTest, ShufflesAndBallotsSeeTheWholeWarp) {
  float* sums = DeviceCopy(std::vector<float>(64));
  int* down = DeviceCopy(std::vector<int>(64));
  unsigned* ballots = DeviceCopy(std::vector<unsigned>(64));
  FR_LAUNCH(1, 64, 0, nullptr, ShuffleKernel)(sums, down, ballots);
  const std::vector<float> s = HostCopy(sums, 64);
  const std::vector<int> d = HostCopy(down, 64);
  const std::vector<unsigned> b = HostCopy(ballots, 64);
  unsigned expected_ballot = 0;
  for (int lane = 0; lane < 32; lane += 3) expected_ballot |= 1u << lane;
  for (int t = 0; t < 64; ++t) {
    const int warp0 = t / 32 * 32;
    EXPECT_EQ(s[t], static_cast<float>(32 * warp0 + 31 * 32 / 2)) << t;
    EXPECT_EQ(d[t], t % 32 + 3 < 32 ? t + 3 : t) << t;  // past the warp's end: its own value
    EXPECT_EQ(b[t], expected_ballot);
  }
  cudaFree(sums);
  cudaFree(down);
  cudaFree(ballots);
}

INSTANTIATE_TEST_SUITE_P(AllOrders, OrderTest, testing::ValuesIn(kOrders));

__global__ void PoisonKernel(unsigned* out) {
  FR_DYNAMIC_SHARED(unsigned, words);
  if (threadIdx.x == 0) {
    out[blockIdx.x] = words[blockIdx.x];
    words[blockIdx.x + 1] = 7;  // the next block must not see it
  }
}

TEST(SharedMemoryTest, DynamicSharedMemoryIsPoisonedAtEveryBlock) {
  unsigned* out = DeviceCopy(std::vector<unsigned>(3, 0));
  FR_LAUNCH(3, 32, 64, nullptr, PoisonKernel)(out);
  for (unsigned word : HostCopy(out, 3)) EXPECT_EQ(word, 0xffffffffu);
  cudaFree(out);
}

__global__ void BigSharedKernel(unsigned* out) {
  FR_DYNAMIC_SHARED(unsigned, words);
  words[threadIdx.x] = threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = words[31 - threadIdx.x];
}

TEST(SharedMemoryTest, OverFortyEightKibNeedsTheAttribute) {
  unsigned* out = DeviceCopy(std::vector<unsigned>(32, 0));
  const size_t bytes = 64 << 10;
  FR_LAUNCH(1, 32, bytes, nullptr, BigSharedKernel)(out);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read once
  EXPECT_EQ(HostCopy(out, 1)[0], 0u);          // it did not run
  ASSERT_EQ(cudaFuncSetAttribute(BigSharedKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(bytes)),
            cudaSuccess);
  FR_LAUNCH(1, 32, bytes, nullptr, BigSharedKernel)(out);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(HostCopy(out, 32)[0], 31u);
  int optin = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0),
            cudaSuccess);
  EXPECT_EQ(
      cudaFuncSetAttribute(BigSharedKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin + 1),
      cudaErrorInvalidValue);
  cudaFree(out);
}

TEST(LaunchTest, InvalidConfigurationsRunNothing) {
  unsigned* out = DeviceCopy(std::vector<unsigned>(32, 0));
  FR_LAUNCH(1, 1025, 0, nullptr, BigSharedKernel)(out);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  FR_LAUNCH(0, 32, 0, nullptr, BigSharedKernel)(out);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  cudaFree(out);
}

__global__ void DivergentSyncKernel() {
  if (threadIdx.x % 32 < 16) __syncwarp();
}
__global__ void ExitBeforeShuffleKernel() {
  if (threadIdx.x == 5) return;
  __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}
// Half a warp waits for the block while the other half waits for the whole warp.
__global__ void HalfBlockBarrierKernel() {
  if (threadIdx.x % 32 < 16) {
    __syncthreads();
  } else {
    __syncwarp();
  }
}

TEST(FaultTest, KernelBugsStopTheProcessNamingTheKernel) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(FR_LAUNCH(1, 32, 0, nullptr, DivergentSyncKernel)(),
               "DivergentSyncKernel.*exited while lanes");
  EXPECT_DEATH(FR_LAUNCH(1, 32, 0, nullptr, ExitBeforeShuffleKernel)(),
               "ExitBeforeShuffleKernel.*exited");
  EXPECT_DEATH(FR_LAUNCH(1, 64, 0, nullptr, HalfBlockBarrierKernel)(),
               "HalfBlockBarrierKernel deadlocks");
}

#if defined(__SANITIZE_ADDRESS__)
// Only in an AddressSanitizer build (tests/scripts/emulation_asan.sh): device memory is host
// memory of exactly the size asked for, so ASan sees a kernel write one past its end.
__global__ void OnePastTheEndKernel(float* x, int n) { x[n + threadIdx.x] = 1.0f; }

TEST(AddressSanitizerTest, AnOutOfBoundsWriteInAKernelIsReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  float* x = DeviceCopy(std::vector<float>(32, 0.0f));
  EXPECT_DEATH(FR_LAUNCH(1, 32, 0, nullptr, OnePastTheEndKernel)(x, 32), "heap-buffer-overflow");
  cudaFree(x);
}
#endif

__global__ void AddOneKernel(float* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.0f;
}

TEST(StreamTest, EventsOrderWorkAcrossStreams) {
  const int n = 1 << 12;
  float* x = DeviceCopy(std::vector<float>(n, 0.0f));
  cudaStream_t a, b;
  cudaEvent_t done;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), cudaSuccess);
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), n * sizeof(float)), cudaSuccess);
  for (int round = 0; round < 20; ++round) {
    FR_LAUNCH(n / 256, 256, 0, a, AddOneKernel)(x, n);
    ASSERT_EQ(cudaEventRecord(done, a), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(b, done), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(pinned, x, n * sizeof(float), cudaMemcpyDeviceToHost, b),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
    EXPECT_EQ(pinned[0], round + 1.0f);
    EXPECT_EQ(pinned[n - 1], round + 1.0f);
  }
  EXPECT_EQ(cudaEventQuery(done), cudaSuccess);
  cudaPointerAttributes attributes;
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, pinned), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost);
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, x + 5), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
  cudaFreeHost(pinned);
  cudaEventDestroy(done);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
  cudaFree(x);
}

TEST(MemoryTest, AllocationsAreCountedAndCopiesChecked) {
  size_t free0 = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 1 << 20), cudaSuccess);
  size_t free1 = 0;
  ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
  EXPECT_EQ(free0 - free1, size_t{1} << 20);
  void* too_big = nullptr;
  EXPECT_EQ(cudaMalloc(&too_big, total), cudaErrorMemoryAllocation);
  float fresh = 0;
  ASSERT_EQ(cudaMemcpy(&fresh, p, sizeof fresh, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(std::isnan(fresh));  // new device memory is poison, not zeros
  std::vector<char> host(16);
  EXPECT_EQ(cudaMemcpy(host.data(), host.data() + 8, 8, cudaMemcpyDeviceToHost),
            cudaErrorInvalidValue);  // the "device" side is host memory
  EXPECT_EQ(
      cudaMemcpy(static_cast<char*>(p) + (1 << 20) - 4, host.data(), 8, cudaMemcpyHostToDevice),
      cudaErrorInvalidValue);  // past the allocation's end
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaErrorInvalidValue);
}

TEST(Bf16Test, RoundsToNearestEven) {
  EXPECT_EQ(static_cast<float>(__float2bfloat16_rn(1.0f + 0x1p-8f)), 1.0f);  // tie: to even
  EXPECT_EQ(static_cast<float>(__float2bfloat16_rn(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
  EXPECT_EQ(static_cast<float>(__float2bfloat16_rn(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);
  EXPECT_TRUE(std::isnan(static_cast<float>(__float2bfloat16_rn(NAN))));
  EXPECT_TRUE(std::isinf(static_cast<float>(__float2bfloat16_rn(3.4e38f))));  // rounds up
}

namespace wmma = nvcuda::wmma;

__global__ void TileProductKernel(float* d, const __nv_bfloat16* a, const __nv_bfloat16* b) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 1.0f);
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::mma_sync(acc, fa, fb, acc);
  wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}

TEST(WmmaTest, TileProductMatchesFloat64) {
  std::vector<__nv_bfloat16> a(256), b(256);
  for (int i = 0; i < 256; ++i) {
    a[i] = __float2bfloat16_rn(std::sin(0.37 * i));
    b[i] = __float2bfloat16_rn(std::cos(0.11 * i));
  }
  float* d = DeviceCopy(std::vector<float>(256));
  __nv_bfloat16* da = DeviceCopy(a);
  __nv_bfloat16* db = DeviceCopy(b);
  FR_LAUNCH(1, 32, 0, nullptr, TileProductKernel)(d, da, db);
  const std::vector<float> got = HostCopy(d, 256);
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) {
      double want = 1.0;
      for (int k = 0; k < 16; ++k)
        want += double(a[r * 16 + k]) * double(b[c * 16 + k]);  // b col-major
      EXPECT_NEAR(got[r * 16 + c], want, 1e-5 * (1 + std::abs(want)));
    }
  }
  cudaFree(d);
  cudaFree(da);
  cudaFree(db);
}

}  // namespace
}  // namespace freeride::emu
