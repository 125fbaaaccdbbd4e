#include "core/stop_request.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>

#include "core/child_process.h"

namespace freeride {
namespace {

std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");
// Checkpoint writes in flight (the low bits, counted) and a second signal deferred until they
// end (its number, shifted above them). One word, so that the handler and the writer that
// ends the last write agree on who exits: whichever changes it second sees the other's mark.
std::atomic<int> g_writes{0};
constexpr int kWriteBits = 8;
constexpr int kWriteMask = (1 << kWriteBits) - 1;

constexpr const char* kCheckpointNotice =
    "freeride: stop requested; stopping at the next step boundary with a checkpoint (send the "
    "signal again to exit at once)\n";
std::atomic<const char*> g_notice{kCheckpointNotice};
static_assert(std::atomic<const char*>::is_always_lock_free,
              "the signal handler reads the notice lock-free");

void WriteStderr(const char* text) {
  ssize_t ignored = write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

void OnStopSignal(int signal_number) {
  // Side-task processes go at once: training needs nothing from them to reach its checkpoint,
  // and a rank that mpirun kills next must not leave them behind.
  KillChildProcessGroups();
  int expected = 0;
  if (g_stop_signal.compare_exchange_strong(expected, signal_number)) {
    WriteStderr(g_notice.load());
    return;
  }
  int writes = g_writes.load();
  while ((writes & kWriteMask) != 0) {
    if (g_writes.compare_exchange_weak(writes, (writes & kWriteMask) |
                                                   (signal_number << kWriteBits))) {
      WriteStderr("freeride: second stop signal; exiting once the checkpoint being written is "
                  "complete, without another\n");
      return;
    }
  }
  WriteStderr("freeride: second stop signal; exiting now without a checkpoint\n");
  _exit(128 + signal_number);
}

}  // namespace

bool InstallStopHandlers() {
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  // Restart interrupted system calls: a signal must not turn a read or a wait into an error.
  action.sa_flags = SA_RESTART;
  bool ok = true;
  for (int s : {SIGTERM, SIGINT, SIGUSR1}) ok = sigaction(s, &action, nullptr) == 0 && ok;
  return ok;
}

void SetStopNotice(const char* notice) { g_notice.store(notice); }

void BeginCheckpointWrite() { g_writes.fetch_add(1); }

void EndCheckpointWrite() {
  const int before = g_writes.fetch_sub(1);
  const int deferred = before >> kWriteBits;
  if ((before & kWriteMask) == 1 && deferred != 0) {
    WriteStderr("freeride: the checkpoint is complete; exiting (second stop signal)\n");
    _exit(128 + deferred);
  }
}

int StopRequestedBy() { return g_stop_signal.load(std::memory_order_relaxed); }

void ClearStopRequest() {
  g_stop_signal.store(0);
  g_writes.store(0);
}

const char* StopSignalName(int signal_number) {
  switch (signal_number) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: break;
  }
  static thread_local char name[24];
  std::snprintf(name, sizeof(name), "signal %d", signal_number);
  return name;
}

}  // namespace freeride
