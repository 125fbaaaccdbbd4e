// The CUDA thread model of the emulation: each thread of a block is a fiber (Boost.Context),
// the block's fibers run on one host thread in the order FREERIDE_EMULATE_ORDER picks, each
// until it reaches a barrier or a warp collective or exits, and the blocks of a grid run one
// after another. Barriers are counted, never timed: a missing one shows as a thread reading
// what another has not written yet, and a thread order under which that differs.
#include <sys/mman.h>

#include <atomic>
#include <boost/context/fiber.hpp>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

#include "models/cuda/emulation/device.h"
#include "models/cuda/emulation/runtime.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

namespace freeride::emu {

thread_local const ThreadIndices* current_thread = nullptr;

namespace {

namespace bctx = boost::context;

// Kernels keep fragments and tiles on the stack; ASan's redzones roughly double that.
constexpr size_t kStackBytes = 256 << 10;
constexpr size_t kGuardBytes = 4096;

Order OrderFromEnvironment() {
  const char* value = std::getenv("FREERIDE_EMULATE_ORDER");
  const std::optional<Order> order = ParseOrder(value == nullptr ? "" : value);
  if (!order) {
    std::fprintf(stderr,
                 "FREERIDE_EMULATE_ORDER=%s: expected lane, reversed, warp or warp-reversed\n",
                 value);
    std::exit(2);
  }
  return *order;
}
std::atomic<Order> thread_order{OrderFromEnvironment()};

// Fiber stacks, mapped once per host thread and reused by every block it runs; each has an
// inaccessible page below it so that an overflow faults instead of corrupting a neighbour.
class StackPool {
 public:
  ~StackPool() {
    for (void* base : all_) munmap(base, kStackBytes + kGuardBytes);
  }
  void* Take() {
    if (free_.empty()) {
      void* base = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (base == MAP_FAILED) {
        std::fprintf(stderr, "freeride CUDA emulation: no memory for a fiber stack\n");
        std::abort();
      }
      mprotect(base, kGuardBytes, PROT_NONE);
      all_.push_back(base);
      free_.push_back(base);
    }
    void* base = free_.back();
    free_.pop_back();
    return base;
  }
  void Give(void* base) { free_.push_back(base); }

 private:
  std::vector<void*> all_, free_;
};
thread_local StackPool stack_pool;

// AddressSanitizer is told of every switch between the scheduler's stack and a fiber's, so
// that it checks each against the right stack (no-ops in other builds).
void StartSwitch([[maybe_unused]] void** fake_stack, [[maybe_unused]] const void* bottom,
                 [[maybe_unused]] size_t size) {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_start_switch_fiber(fake_stack, bottom, size);
#endif
}
void FinishSwitch([[maybe_unused]] void* fake_stack, [[maybe_unused]] const void** bottom,
                  [[maybe_unused]] size_t* size) {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(fake_stack, bottom, size);
#endif
}
// The stack of the host thread that runs the scheduler, as a fiber's switches back name it.
thread_local const void* scheduler_stack = nullptr;
thread_local size_t scheduler_stack_size = 0;

// Boost.Context's StackAllocator over the pool; tells `*bottom` where the stack it gave lies.
struct PooledStack {
  const void** bottom;
  bctx::stack_context allocate() {
    bctx::stack_context stack;
    stack.size = kStackBytes;
    char* usable = static_cast<char*>(stack_pool.Take()) + kGuardBytes;
    *bottom = usable;
    stack.sp = usable + kStackBytes;
    return stack;
  }
  void deallocate(bctx::stack_context& stack) {
    stack_pool.Give(static_cast<char*>(stack.sp) - kStackBytes - kGuardBytes);
  }
};

struct Fiber {
  bctx::fiber context;    // resumes the CUDA thread
  bctx::fiber scheduler;  // from inside the thread: back to the scheduler
  ThreadIndices indices{};
  const void* stack = nullptr;  // its lowest address, kStackBytes long
  int warp = 0, lane = 0;
  bool done = false;
  // Blocked while *wait_on still equals wait_generation (a barrier not yet released).
  const uint64_t* wait_on = nullptr;
  uint64_t wait_generation = 0;
  const char* waiting_in = "";
  bool Runnable() const { return !done && (wait_on == nullptr || *wait_on != wait_generation); }
};

struct Warp {
  unsigned lanes = 0;  // the lanes that exist (a partial last warp has fewer than 32)
  unsigned live = 0;   // those that have not exited
  unsigned arrived = 0;
  unsigned barrier_mask = 0;
  const char* barrier_what = "";
  uint64_t generation = 0;
  // Collectives alternate between the two rows: a lane can deposit into a row again only
  // after a later collective, which every lane reaches after reading this one's row.
  uint64_t slots[2][32] = {};
};

struct Block {
  const char* kernel = "";
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  int live = 0, arrived = 0;
  uint64_t generation = 0;
  char* shared = nullptr;
  Fiber* running = nullptr;
};
thread_local Block* block = nullptr;

void Yield(Fiber& f, const uint64_t* wait_on, const char* what) {
  f.wait_on = wait_on;
  f.wait_generation = *wait_on;
  f.waiting_in = what;
  void* fake_stack = nullptr;
  StartSwitch(&fake_stack, scheduler_stack, scheduler_stack_size);
  f.scheduler = std::move(f.scheduler).resume();
  FinishSwitch(fake_stack, &scheduler_stack, &scheduler_stack_size);
  f.wait_on = nullptr;
}

void Resume(Block& b, Fiber& f) {
  b.running = &f;
  current_thread = &f.indices;
  void* fake_stack = nullptr;
  StartSwitch(&fake_stack, f.stack, kStackBytes);
  f.context = std::move(f.context).resume();
  FinishSwitch(fake_stack, nullptr, nullptr);
  b.running = nullptr;
  current_thread = nullptr;
}

void ReleaseBlockBarrier(Block& b) {
  b.arrived = 0;
  ++b.generation;
}

void WarpBarrier(unsigned mask, const char* what) {
  Block& b = *block;
  Fiber& f = *b.running;
  Warp& w = b.warps[f.warp];
  const unsigned bit = 1u << f.lane;
  if (!(mask & bit))
    KernelFault("%s: mask 0x%08x does not name the calling lane %d", what, mask, f.lane);
  if (mask & ~w.lanes) {
    KernelFault("%s: mask 0x%08x names lanes warp %d does not have (0x%08x)", what, mask, f.warp,
                w.lanes);
  }
  if (mask & ~w.live) {
    KernelFault("%s: mask 0x%08x names lanes that have exited (live 0x%08x)", what, mask, w.live);
  }
  if (w.arrived == 0) {
    w.barrier_mask = mask;
    w.barrier_what = what;
  } else if (w.barrier_mask != mask ||
             (w.barrier_what != what && std::strcmp(w.barrier_what, what) != 0)) {
    KernelFault("%s (mask 0x%08x) meets %s (mask 0x%08x) of lanes 0x%08x: divergent warp", what,
                mask, w.barrier_what, w.barrier_mask, w.arrived);
  }
  w.arrived |= bit;
  if (w.arrived == w.barrier_mask) {
    w.arrived = 0;
    ++w.generation;
    return;
  }
  Yield(f, &w.generation, what);
}

void Exit(Block& b, Fiber& f) {
  f.done = true;
  --b.live;
  Warp& w = b.warps[f.warp];
  const unsigned bit = 1u << f.lane;
  w.live &= ~bit;
  if (w.arrived != 0 && (w.barrier_mask & bit)) {
    KernelFault("exited while lanes 0x%08x of its warp wait for it in %s", w.arrived,
                w.barrier_what);
  }
  // Exited threads no longer count at __syncthreads, as on the hardware.
  if (b.arrived > 0 && b.arrived == b.live) ReleaseBlockBarrier(b);
}

[[noreturn]] void Deadlock(Block& b) {
  std::fprintf(stderr, "freeride CUDA emulation: kernel %s deadlocks in block (%u,%u,%u):\n",
               b.kernel, b.fibers[0].indices.block_idx.x, b.fibers[0].indices.block_idx.y,
               b.fibers[0].indices.block_idx.z);
  int shown = 0;
  for (const Fiber& f : b.fibers) {
    if (f.done || shown++ >= 8) continue;
    std::fprintf(stderr, "  thread (%u,%u,%u) waits in %s\n", f.indices.thread_idx.x,
                 f.indices.thread_idx.y, f.indices.thread_idx.z, f.waiting_in);
  }
  std::abort();
}

// Runs the fibers in `order` until all have exited.
void Schedule(Block& b, Order order) {
  const int n = static_cast<int>(b.fibers.size());
  auto run = [&b](int t) {
    Fiber& f = b.fibers[t];
    if (!f.Runnable()) return false;
    Resume(b, f);
    return true;
  };
  while (b.live > 0) {
    bool progress = false;
    if (order == Order::kLane) {
      for (int t = 0; t < n; ++t) progress |= run(t);
    } else if (order == Order::kReversed) {
      for (int t = n - 1; t >= 0; --t) progress |= run(t);
    } else {
      // One warp as far as it goes, then the next: what a warp scheduler that favours the
      // oldest warp does.
      const int warps = static_cast<int>(b.warps.size());
      const bool reversed = order == Order::kWarpReversed;
      for (int i = 0; i < warps; ++i) {
        const int w = reversed ? warps - 1 - i : i;
        const int first = w * 32, last = std::min(n, first + 32);
        for (bool warp_progress = true; warp_progress;) {
          warp_progress = false;
          if (reversed) {
            for (int t = last - 1; t >= first; --t) warp_progress |= run(t);
          } else {
            for (int t = first; t < last; ++t) warp_progress |= run(t);
          }
          progress |= warp_progress;
        }
      }
    }
    if (!progress) Deadlock(b);
  }
}

void RunBlock(const char* name, uint3 block_idx, dim3 grid, dim3 dims, char* shared, size_t shmem,
              const std::function<void()>& body, Order order) {
  Block b;
  b.kernel = name;
  const int n = static_cast<int>(dims.x * dims.y * dims.z);
  b.fibers.resize(n);
  b.warps.resize((n + 31) / 32);
  b.live = n;
  if (shmem > 0) std::memset(shared, 0xff, shmem);
  b.shared = shared;
  for (int t = 0; t < n; ++t) {
    Fiber& f = b.fibers[t];
    f.indices = {{t % dims.x, t / dims.x % dims.y, t / (dims.x * dims.y)}, block_idx, dims, grid};
    f.warp = t / 32;
    f.lane = t % 32;
    b.warps[f.warp].lanes |= 1u << f.lane;
    f.context = bctx::fiber(
        std::allocator_arg, PooledStack{&f.stack}, [&b, &f, &body](bctx::fiber&& scheduler) {
          FinishSwitch(nullptr, &scheduler_stack, &scheduler_stack_size);
          f.scheduler = std::move(scheduler);
          body();
          Exit(b, f);
          StartSwitch(nullptr, scheduler_stack, scheduler_stack_size);  // null: this stack is done
          return std::move(f.scheduler);
        });
  }
  for (Warp& w : b.warps) w.live = w.lanes;
  Block* outer = block;
  block = &b;
  Schedule(b, order);
  block = outer;
}

}  // namespace

void RunGrid(const char* name, dim3 grid, dim3 dims, size_t shmem,
             const std::function<void()>& body) {
  const Order order = thread_order.load();
  // 128-byte aligned, as the hardware's shared memory window is.
  std::unique_ptr<char, decltype(&std::free)> shared(
      shmem > 0 ? static_cast<char*>(std::aligned_alloc(128, (shmem + 127) / 128 * 128)) : nullptr,
      &std::free);
  const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
  const bool reversed = order == Order::kReversed || order == Order::kWarpReversed;
  for (uint64_t i = 0; i < blocks; ++i) {
    // Reversed orders also reverse the blocks: a kernel that reads another block's output of
    // the same launch is wrong on the hardware, which promises no order between blocks.
    const uint64_t k = reversed ? blocks - 1 - i : i;
    const uint3 idx{static_cast<unsigned>(k % grid.x), static_cast<unsigned>(k / grid.x % grid.y),
                    static_cast<unsigned>(k / (uint64_t{grid.x} * grid.y))};
    RunBlock(name, idx, grid, dims, shared.get(), shmem, body, order);
  }
}

std::optional<Order> ParseOrder(std::string_view name) {
  if (name == "lane" || name.empty()) return Order::kLane;
  if (name == "reversed") return Order::kReversed;
  if (name == "warp") return Order::kWarp;
  if (name == "warp-reversed") return Order::kWarpReversed;
  return std::nullopt;
}
void SetThreadOrder(Order order) { thread_order.store(order); }

void SyncThreads(const std::source_location& where) {
  if (SkipsBarrier(where)) return;
  Block& b = *block;
  if (++b.arrived == b.live) {
    ReleaseBlockBarrier(b);
    return;
  }
  Yield(*b.running, &b.generation, "__syncthreads");
}

void SyncWarp(unsigned mask, const std::source_location& where) {
  if (SkipsBarrier(where)) return;
  WarpBarrier(mask, "__syncwarp");
}

const uint64_t* WarpExchange(unsigned mask, uint64_t bits, const char* what) {
  Block& b = *block;
  const Fiber& f = *b.running;
  Warp& w = b.warps[f.warp];
  uint64_t* row = w.slots[w.generation & 1];
  row[f.lane] = bits;
  WarpBarrier(mask, what);
  return row;
}

int LaneId() { return block->running->lane; }

void* DynamicShared() { return block->shared; }

void KernelFault(const char* format, ...) {
  const ThreadIndices* t = current_thread;
  std::fprintf(stderr, "freeride CUDA emulation: fault in kernel %s", block ? block->kernel : "?");
  if (t != nullptr) {
    std::fprintf(stderr, ", block (%u,%u,%u), thread (%u,%u,%u)", t->block_idx.x, t->block_idx.y,
                 t->block_idx.z, t->thread_idx.x, t->thread_idx.y, t->thread_idx.z);
  }
  std::fprintf(stderr, ": ");
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fprintf(stderr, "\n");
  std::abort();
}

void LaunchKernel(const char* name, const void* kernel, dim3 grid, dim3 dims, size_t shmem,
                  cudaStream_t stream, std::function<void()> body) {
  const uint64_t threads = uint64_t{dims.x} * dims.y * dims.z;
  if (threads == 0 || threads > 1024 || dims.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.y > 65535 || grid.z > 65535) {
    SetLastError(cudaErrorInvalidConfiguration);
    return;
  }
  if (shmem > MaxDynamicSharedBytes(kernel)) {
    SetLastError(cudaErrorInvalidValue);
    return;
  }
  Enqueue(stream, [name, grid, dims, shmem, body = std::move(body)] {
    RunGrid(name, grid, dims, shmem, body);
  });
}

}  // namespace freeride::emu
