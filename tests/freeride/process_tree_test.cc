// A child's whole process tree ends with it, however its descendants escape (a new session, a
// double fork, a background child), under either containment: the PID namespace and the
// subreaper fallback. Every process is followed by its pid; the guards kill whatever is left.

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "core/child_process.h"
#include "gtest/gtest.h"

namespace freeride {
namespace {

// Descends into a new session, double-forks and keeps a plain background child: three sleeps.
constexpr char kEscaping[] = "setsid sh -c 'sleep 1001; :' & (sleep 1002 &) ; sleep 1003 & wait";

// Each process's parent and name, from /proc.
struct ProcessTable {
  std::map<pid_t, pid_t> parent;
  std::map<pid_t, std::string> name;
};

ProcessTable ReadProcesses() {
  ProcessTable table;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string base = entry.path().filename().string();
    if (base.empty() || base.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    const size_t open = line.find('('), close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (state == 'Z') continue;
    const pid_t pid = std::atoi(base.c_str());
    table.parent[pid] = ppid;
    table.name[pid] = line.substr(open + 1, close - open - 1);
  }
  return table;
}

// `root`'s live descendants now.
std::set<pid_t> Descendants(pid_t root, const ProcessTable& table) {
  std::set<pid_t> out;
  for (const auto& [pid, ppid] : table.parent) {
    for (pid_t up = ppid; up > 1; up = table.parent.count(up) ? table.parent.at(up) : 0) {
      if (up == root) {
        out.insert(pid);
        break;
      }
    }
  }
  return out;
}

bool ProcessGone(pid_t pid) {
  const ProcessTable table = ReadProcesses();
  return table.parent.count(pid) == 0;
}

// Kills, on every exit path, each process the test saw.
struct Reaper {
  std::set<pid_t> pids;
  ~Reaper() {
    for (pid_t pid : pids) {
      if (!ProcessGone(pid)) kill(pid, SIGKILL);
    }
  }
};

// Waits until `root`'s tree holds `n` processes named sleep and returns the tree. Each starts in
// milliseconds; 100 s is a cap for a broken run on a machine under any load, not a figure this
// waits for.
std::set<pid_t> WaitForSleeps(pid_t root, int n) {
  std::set<pid_t> tree;
  for (int i = 0; i < 100000; ++i) {
    const ProcessTable table = ReadProcesses();
    tree = Descendants(root, table);
    int sleeps = 0;
    for (pid_t pid : tree) sleeps += table.name.at(pid) == "sleep";
    if (sleeps >= n) break;
    usleep(1000);
  }
  return tree;
}

int CountSleeps(const std::set<pid_t>& tree) {
  const ProcessTable table = ReadProcesses();
  int sleeps = 0;
  for (pid_t pid : tree) sleeps += table.name.count(pid) && table.name.at(pid) == "sleep";
  return sleeps;
}

// Waits (same cap) until every process of `tree` is gone; whether they all are.
bool AllGone(const std::set<pid_t>& tree) {
  for (int i = 0; i < 100000; ++i) {
    bool all = true;
    for (pid_t pid : tree) all = all && ProcessGone(pid);
    if (all) return true;
    usleep(1000);
  }
  return false;
}

class ProcessTreeTest : public ::testing::TestWithParam<Containment> {
 protected:
  ChildOptions Options(const std::string& script) const {
    ChildOptions options;
    options.argv = {"sh", "-c", script};
    options.containment = GetParam();
    return options;
  }
};

TEST_P(ProcessTreeTest, KillEndsEscapedDescendants) {
  auto child = ChildProcess::Start(Options(kEscaping));
  ASSERT_TRUE(child.ok()) << child.status();
  Reaper reaper;
  reaper.pids = WaitForSleeps(child->pid(), 3);
  ASSERT_EQ(CountSleeps(reaper.pids), 3);
  EXPECT_TRUE(child->Stop());  // paused, as between bubbles
  child->Kill();
  EXPECT_TRUE(AllGone(reaper.pids));
}

TEST_P(ProcessTreeTest, EscapedDescendantsEndWithTheProgram) {
  auto child = ChildProcess::Start(Options("setsid sh -c 'sleep 1001; :' & exec sleep 1002"));
  ASSERT_TRUE(child.ok()) << child.status();
  Reaper reaper;
  reaper.pids = WaitForSleeps(child->pid(), 2);
  ASSERT_EQ(CountSleeps(reaper.pids), 2);
  const pid_t program = child->ProgramPid();
  ASSERT_TRUE(reaper.pids.count(program)) << "the program is the supervisor's child";
  kill(program, SIGKILL);
  for (int i = 0; i < 100000 && !child->Ended(); ++i) usleep(1000);  // the cap as above
  ASSERT_TRUE(child->Ended());
  EXPECT_EQ(child->EndDescription(), "was killed by signal 9 (SIGKILL: Killed)");
  EXPECT_TRUE(AllGone(reaper.pids));
}

TEST_P(ProcessTreeTest, EscapedDescendantsEndWithTheRank) {
  // The process in the middle plays the rank: it starts the program, pauses it once the test
  // has seen its tree (as between bubbles) and is then SIGKILLed (no handler, no destructor).
  int to_test[2], to_middle[2];
  ASSERT_EQ(pipe(to_test), 0);
  ASSERT_EQ(pipe(to_middle), 0);
  const ChildOptions options = Options(kEscaping);
  const pid_t middle = fork();
  ASSERT_GE(middle, 0);
  if (middle == 0) {
    auto child = ChildProcess::Start(options);
    pid_t pid = child.ok() ? child->pid() : -1;
    if (write(to_test[1], &pid, sizeof(pid)) != sizeof(pid)) _exit(1);
    char go = 0;
    if (read(to_middle[0], &go, 1) != 1) _exit(1);
    child->Stop();
    if (write(to_test[1], &go, 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  Reaper reaper;
  reaper.pids.insert(middle);
  pid_t supervisor = -1;
  ASSERT_EQ(read(to_test[0], &supervisor, sizeof(supervisor)), static_cast<ssize_t>(sizeof(pid_t)));
  ASSERT_GT(supervisor, 0);
  reaper.pids.insert(supervisor);
  const std::set<pid_t> tree = WaitForSleeps(supervisor, 3);
  reaper.pids.insert(tree.begin(), tree.end());
  ASSERT_EQ(CountSleeps(tree), 3);
  char go = 'g';
  ASSERT_EQ(write(to_middle[1], &go, 1), 1);
  ASSERT_EQ(read(to_test[0], &go, 1), 1);
  kill(middle, SIGKILL);
  waitpid(middle, nullptr, 0);
  std::set<pid_t> all = tree;
  all.insert(supervisor);
  EXPECT_TRUE(AllGone(all));
  for (int fd : {to_test[0], to_test[1], to_middle[0], to_middle[1]}) close(fd);
}

INSTANTIATE_TEST_SUITE_P(Containments, ProcessTreeTest,
                         ::testing::Values(Containment::kPidNamespace, Containment::kSubreaper),
                         [](const ::testing::TestParamInfo<Containment>& info) {
                           return info.param == Containment::kPidNamespace ? "PidNamespace"
                                                                           : "Subreaper";
                         });

TEST(ChildProcessTest, OutputGoesToItsLogNotTheParents) {
  const std::string log = ::testing::TempDir() + "/child_output.log";
  std::filesystem::remove(log);
  ChildOptions options;
  options.argv = {"sh", "-c", "echo out; echo err >&2; cat"};  // cat: stdin is /dev/null
  options.output_path = log;
  auto child = ChildProcess::Start(options);
  ASSERT_TRUE(child.ok()) << child.status();
  for (int i = 0; i < 100000 && !child->Ended(); ++i) usleep(1000);  // cap as above
  ASSERT_TRUE(child->EndedCleanly()) << child->EndDescription();
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "out\nerr\n");
  options.output_path = "/nonexistent-dir/x.log";
  auto refused = ChildProcess::Start(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("/nonexistent-dir/x.log"), std::string::npos);
}

}  // namespace
}  // namespace freeride
