#include "core/sched_class.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace freeride {

const char* SchedClassName(SchedClass c) {
  switch (c) {
    case SchedClass::kIdle:
      return "SCHED_IDLE";
    case SchedClass::kLowestNice:
      return "nice 19";
    case SchedClass::kNormal:
      break;
  }
  return "normal";
}

pid_t CurrentThreadId() { return static_cast<pid_t>(syscall(SYS_gettid)); }

SchedClass LowerThread(pid_t tid) {
  // Both calls act on the one thread (Linux's thread-level scheduling; setpriority's
  // PRIO_PROCESS takes a thread id).
  const sched_param param{};
  if (sched_setscheduler(tid, SCHED_IDLE, &param) == 0) return SchedClass::kIdle;
  if (setpriority(PRIO_PROCESS, static_cast<id_t>(tid), 19) == 0) return SchedClass::kLowestNice;
  return SchedClass::kNormal;
}

SchedClass LowerCallingThread() { return LowerThread(CurrentThreadId()); }

absl::StatusOr<SchedClass> LowerProcess(pid_t pid) {
  std::error_code error;
  const std::filesystem::path tasks = absl::StrFormat("/proc/%d/task", pid);
  SchedClass least = SchedClass::kIdle;
  int threads = 0;
  for (const auto& entry : std::filesystem::directory_iterator(tasks, error)) {
    pid_t tid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &tid)) continue;
    ++threads;
    const sched_param param{};
    if (sched_setscheduler(tid, SCHED_IDLE, &param) == 0) continue;
    if (setpriority(PRIO_PROCESS, static_cast<id_t>(tid), 19) == 0) {
      if (least == SchedClass::kIdle) least = SchedClass::kLowestNice;
    } else if (errno != ESRCH) {  // a thread that ended meanwhile needs nothing
      least = SchedClass::kNormal;
    }
  }
  if (threads == 0) {
    return absl::NotFoundError(absl::StrFormat("no thread of process %d in %s", pid,
                                               tasks.string()));
  }
  return least;
}

void LowerThisProcessAfterFork() {
  const sched_param param{};
  if (sched_setscheduler(0, SCHED_IDLE, &param) != 0) setpriority(PRIO_PROCESS, 0, 19);
}

SchedClass ThreadSched::sched_class() const {
  if (policy == SCHED_IDLE) return SchedClass::kIdle;
  if (nice >= 19) return SchedClass::kLowestNice;
  return SchedClass::kNormal;
}

absl::StatusOr<ThreadSched> ParseProcStat(absl::string_view stat) {
  // The command name (field 2) is in parentheses and may hold spaces: fields count after the
  // last ')'. Field 3 is the first after it, so field n is fields[n - 3].
  const size_t close = stat.rfind(')');
  if (close == absl::string_view::npos || close + 2 > stat.size()) {
    return absl::DataLossError("not a /proc stat line");
  }
  const std::vector<absl::string_view> fields =
      absl::StrSplit(stat.substr(close + 2), ' ', absl::SkipEmpty());
  ThreadSched out;
  if (fields.size() < 39 || !absl::SimpleAtoi(fields[19 - 3], &out.nice) ||
      !absl::SimpleAtoi(fields[41 - 3], &out.policy)) {
    return absl::DataLossError("a /proc stat line without nice (19) and policy (41) fields");
  }
  return out;
}

absl::StatusOr<ThreadSched> ReadThreadSched(pid_t pid, pid_t tid) {
  const std::string path = absl::StrFormat("/proc/%d/task/%d/stat", pid, tid);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return absl::NotFoundError(absl::StrFormat("cannot read %s", path));
  absl::StatusOr<ThreadSched> parsed = ParseProcStat(text.str());
  if (!parsed.ok()) return absl::DataLossError(absl::StrCat(path, ": ", parsed.status().message()));
  return parsed;
}

}  // namespace freeride
