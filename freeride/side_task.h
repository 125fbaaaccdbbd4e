// The side-task API: work that runs inside pipeline bubbles.
//
// Lifecycle (docs/side_tasks.md): SUBMITTED → Create (host state, arguments) → CREATED → Load (device
// memory, through the context's capped arena) → LOADED ⇄ RUNNING (one Step at a time, each a
// bounded unit of work) → Unload → FINISHED (Done() said so), STOPPED (training ended first)
// or FAILED (an error, an exception, or memory beyond the limit; training goes on). A task
// configured with `repeat = true` does not finish: once Done(), its next step first restarts it
// in place (Restart) or as a fresh object (Unload, Create, Load), with `restarts` one higher, so
// it keeps the bubbles busy.
//
// Two interfaces, as in FreeRide: iterative (Step does one unit and returns) and imperative
// (`command`: an external program resumed with SIGCONT when a bubble starts and stopped with
// SIGSTOP when it ends; such a task says FillsBubble() and its Step runs until the context's
// deadline or until the awaited input is ready).
//
// Built-in tasks register with FREERIDE_REGISTER_SIDE_TASK(Type, "name"). Out-of-tree tasks
// are shared objects that define the symbols of FREERIDE_SIDE_TASK_PLUGIN(Type, "name") and
// are named in the config (`plugin = "path/to/libtask.so"`). This header is the plugin SDK's
// (installed by `cmake --install`; `find_package(freeride)` gives `freeride::side_task`).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/base/config.h"
#include "absl/status/statusor.h"
#include "core/arena.h"
#include "core/clock.h"
#include "freeride/task_args.h"

namespace freeride {

enum class TaskState { kSubmitted, kCreated, kLoaded, kRunning, kFinished, kFailed, kStopped };
const char* TaskStateName(TaskState state);

// What a task is given: who it is, where it runs, its memory, its time, where results go.
struct SideTaskContext {
  std::string name;
  int rank = 0;
  int stage = 0;
  const TaskArgs* args = nullptr;
  CappedArena* arena = nullptr;      // every allocation of the task's working memory
  std::string results_dir;           // the task's own directory for outputs
  double deadline_s = 0;             // on `clock`, by which the current Step must end
  std::function<bool()> input_ready; // true once training's awaited input has landed
  // How many times the task has been restarted (repeat = true); a task derives fresh input
  // from it (a seed + restarts, the next images), so a repeat is not the same work again.
  int64_t restarts = 0;
  // The time deadline_s is on (null: the system clock; ClockOr): steps that wait or spin for a
  // while do it on this clock, so a test on simulated time sees them take the time they say.
  Clock* clock = nullptr;
  // Set by a Step that found no work and only waited for some (a server with no request): its
  // time is not harvested work, and the report leaves it out. Cleared before each Step.
  bool idle = false;
};

class SideTask {
 public:
  virtual ~SideTask() = default;
  // Reads arguments (ArgReader) and builds host state. Errors stop the run before training.
  virtual absl::Status Create(SideTaskContext& ctx) = 0;
  // Takes device memory (on the CPU backend: working memory) from ctx.arena.
  virtual absl::Status Load(SideTaskContext&) { return absl::OkStatus(); }
  // One bounded unit of work; returns the units of work it did (iterations, images, ...).
  virtual absl::StatusOr<double> Step(SideTaskContext& ctx) = 0;
  // Gives the memory back (preemption or the end); the task may be loaded again later.
  virtual absl::Status Unload(SideTaskContext&) { return absl::OkStatus(); }
  // True once the task has nothing left to do.
  virtual bool Done() const { return false; }
  // Whether the task begins again on fresh input itself (Restart) once Done() with repeat =
  // true. Otherwise the host starts a fresh object (Unload, Create, Load): right where Create is
  // cheap. A task whose Create is costly (PageRank builds its graph) restarts in place, so that
  // a restart fits in a bubble.
  virtual bool RestartsInPlace() const { return false; }
  // Called only when RestartsInPlace(); the host has raised ctx.restarts.
  virtual absl::Status Restart(SideTaskContext&) { return absl::OkStatus(); }
  // A step's duration when known in advance (seconds); 0: measured at start.
  virtual double DeclaredStepSeconds() const { return 0; }
  // An imperative task runs for the whole remaining bubble in one Step.
  virtual bool FillsBubble() const { return false; }
  // What a unit of work is, for reports ("iterations", "images").
  virtual std::string UnitName() const { return "steps"; }
  // One line for the report: what the task produced.
  virtual std::string Summary() const { return ""; }
  // The class of its work: latency-sensitive (a server: a client waits on each request) or
  // throughput (all else). While a latency-sensitive task has work waiting, it runs before any
  // throughput task whatever their priorities, and freeride.serve_reserve of the bubble is
  // kept for it. Asked once, after Create.
  virtual bool LatencySensitive() const { return false; }
  // Whether requests wait for it (queued, or admitted and unfinished). Called from the
  // training thread while a step may run on another: read an atomic, take no lock a step holds
  // for long.
  virtual bool HasPendingWork() const { return false; }
  // The units its work comes to once done (its `count`, its `steps`), for the time left to
  // finish (`freeride jobs`); 0: open-ended or unknown. With repeat, one pass's. Asked once,
  // after Create.
  virtual double TotalUnits() const { return 0; }
};

using SideTaskFactory = std::function<std::unique_ptr<SideTask>()>;

// Registers a built-in type; returns true (for static registration).
bool RegisterSideTask(const std::string& type, SideTaskFactory factory);
std::vector<std::string> RegisteredSideTasks();

// A task of `type`: from the built-in registry when `plugin` is empty, else from the shared
// object at `plugin` (loaded once; its ABI version must match). Errors name the type, the
// plugin, the missing symbol or the version found.
absl::StatusOr<std::unique_ptr<SideTask>> CreateSideTask(const std::string& type,
                                                         const std::string& plugin);

// Bumped whenever SideTask or SideTaskContext changes layout, or the symbols a plugin defines.
inline constexpr int kSideTaskAbiVersion = 7;

}  // namespace freeride

// What else must match across dlopen: std::string, std::function and absl::Status cross it, and
// a plugin calls abseil and freeride code in the binary. So a plugin records the abseil release
// and inline namespace (Debian's options are in its name), the compiler family and major
// version, and the C++ library with its std::string ABI it was compiled with, and freeride
// refuses one whose record differs from its own.
#define FREERIDE_STRINGIFY_(x) #x
#define FREERIDE_STRINGIFY(x) FREERIDE_STRINGIFY_(x)
#if defined(ABSL_LTS_RELEASE_VERSION)
#define FREERIDE_ABSEIL_RELEASE                \
  FREERIDE_STRINGIFY(ABSL_LTS_RELEASE_VERSION) \
  "." FREERIDE_STRINGIFY(ABSL_LTS_RELEASE_PATCH_LEVEL)
#else
#define FREERIDE_ABSEIL_RELEASE "(not an LTS release)"
#endif
#if ABSL_OPTION_USE_INLINE_NAMESPACE
#define FREERIDE_ABSEIL_NAMESPACE "absl::" FREERIDE_STRINGIFY(ABSL_OPTION_INLINE_NAMESPACE_NAME)
#else
#define FREERIDE_ABSEIL_NAMESPACE "absl"
#endif
#define FREERIDE_ABSEIL_IDENTITY \
  "abseil " FREERIDE_ABSEIL_RELEASE " (namespace " FREERIDE_ABSEIL_NAMESPACE ")"
#if defined(__clang__)
#define FREERIDE_COMPILER_IDENTITY "clang " FREERIDE_STRINGIFY(__clang_major__)
#elif defined(__GNUC__)
#define FREERIDE_COMPILER_IDENTITY "GCC " FREERIDE_STRINGIFY(__GNUC__)
#else
#define FREERIDE_COMPILER_IDENTITY "an unknown compiler"
#endif
#if defined(_GLIBCXX_RELEASE) && _GLIBCXX_USE_CXX11_ABI
#define FREERIDE_CXX_LIBRARY_IDENTITY \
  "libstdc++ " FREERIDE_STRINGIFY(_GLIBCXX_RELEASE) " (C++11 std::string)"
#elif defined(_GLIBCXX_RELEASE)
#define FREERIDE_CXX_LIBRARY_IDENTITY \
  "libstdc++ " FREERIDE_STRINGIFY(_GLIBCXX_RELEASE) " (old copy-on-write std::string)"
#elif defined(_LIBCPP_VERSION)
#define FREERIDE_CXX_LIBRARY_IDENTITY "libc++ " FREERIDE_STRINGIFY(_LIBCPP_VERSION)
#else
#define FREERIDE_CXX_LIBRARY_IDENTITY "an unknown C++ library"
#endif
// "abseil 20220623.1 (namespace absl::debian3), GCC 12 with libstdc++ 12 (C++11 std::string)"
#define FREERIDE_SIDE_TASK_BUILD_IDENTITY \
  FREERIDE_ABSEIL_IDENTITY ", " FREERIDE_COMPILER_IDENTITY " with " FREERIDE_CXX_LIBRARY_IDENTITY

#define FREERIDE_REGISTER_SIDE_TASK(Type, name)                             \
  [[maybe_unused]] static const bool freeride_registered_##Type =           \
      ::freeride::RegisterSideTask(name, [] { return std::make_unique<Type>(); })

// In a plugin's source: the three C symbols freeride looks for.
#define FREERIDE_SIDE_TASK_PLUGIN(Type, name)                                                 \
  extern "C" int freeride_side_task_abi_version() { return ::freeride::kSideTaskAbiVersion; } \
  extern "C" const char* freeride_side_task_build_identity() {                                \
    return FREERIDE_SIDE_TASK_BUILD_IDENTITY;                                                 \
  }                                                                                           \
  extern "C" ::freeride::SideTask* freeride_create_side_task(const char* type) {              \
    return std::string(type) == name ? new Type() : nullptr;                                  \
  }
