// Linux scheduling classes for side work. Training threads keep the default class (SCHED_OTHER,
// nice 0); a side task's thread or process is put in SCHED_IDLE, CFS's lowest weight (3 against
// nice 0's 1024), so that it gets a core only when no normal thread of any process wants it, and
// when it does run it gives the core back at the next tick a normal thread asks for one.
// SCHED_IDLE needs no privilege to enter. Where it is refused (a seccomp filter, a kernel
// without it), nice 19 (weight 15) is the lowest weight left. Neither can be left again without
// CAP_SYS_NICE or RLIMIT_NICE: side work runs on threads and processes of its own, never on a
// training thread lowered for a while.
#pragma once

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace freeride {

enum class SchedClass { kNormal, kIdle, kLowestNice };

// "SCHED_IDLE", "nice 19", "normal".
const char* SchedClassName(SchedClass c);

// Puts the calling thread (only it: Linux schedules threads) in SCHED_IDLE, else at nice 19.
// Returns the class it is in afterwards (kNormal where both were refused).
SchedClass LowerCallingThread();

// The same for thread `tid` of this process (another thread than the caller, perhaps).
SchedClass LowerThread(pid_t tid);

// The same for a child between fork and exec: async-signal-safe, the whole new process (its
// threads inherit it).
void LowerThisProcessAfterFork();

// Every thread of process `pid` (another process of this user: a side-task worker that was
// measured alone first) into SCHED_IDLE, else nice 19; threads it makes later inherit it from
// their maker. Returns the class of the threads that went lowest least (kNormal where one was
// refused both), or an error where /proc lists no thread of it.
absl::StatusOr<SchedClass> LowerProcess(pid_t pid);

// A thread's policy and nice value, as /proc/<pid>/task/<tid>/stat shows them (fields 41 and
// 19): what a test reads back to check the class of a side thread or worker.
struct ThreadSched {
  int policy = 0;  // SCHED_OTHER 0, SCHED_BATCH 3, SCHED_IDLE 5, ...
  int nice = 0;
  SchedClass sched_class() const;
};
absl::StatusOr<ThreadSched> ReadThreadSched(pid_t pid, pid_t tid);
// The same from the text of a stat file (a thread's, or a process's /proc/<pid>/stat).
absl::StatusOr<ThreadSched> ParseProcStat(absl::string_view stat);
// The calling thread's id (gettid).
pid_t CurrentThreadId();

}  // namespace freeride
