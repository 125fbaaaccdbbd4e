// `freeride_side_worker`: one side task in its own process, driven by the rank that started it
// over the socket on fd 3 (freeride/worker_protocol.h). It answers create, load, step and
// finish; once loaded its data segment is capped at memory_limit (plus its runtime's slack), so
// the task runs out of memory here instead of on the training node. It exits when the rank
// closes the socket (and dies with the rank: PR_SET_PDEATHSIG).
#include <cblas.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "core/clock.h"
#include "core/arena.h"
#include "core/files.h"
#include "core/float_env.h"
#include "core/host_memory.h"
#include "freeride/side_task.h"
#include "freeride/worker_protocol.h"

namespace freeride {
namespace {

constexpr int kSocket = 3;
// What the worker's own runtime may take on top of memory_limit once the cap is set (allocator
// bookkeeping, stacks of threads a task starts). BLAS's buffers and thread pool are taken
// before the cap is measured (WarmUpBlas).
constexpr int64_t kRuntimeSlackBytes = int64_t{16} << 20;

// One small product, so OpenBLAS and OpenMP allocate their buffers and threads now: they count
// in the baseline under the cap, not against the task's memory_limit.
void WarmUpBlas() {
  std::vector<float> a(64 * 64, 1.0f), c(64 * 64);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 64, 64, 64, 1.0f, a.data(), 64, a.data(),
              64, 0.0f, c.data(), 64);
}

int64_t DataSegmentBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    long kib = 0;
    if (line.rfind("VmData:", 0) == 0 && sscanf(line.c_str(), "VmData: %ld", &kib) == 1) {
      return int64_t{kib} * 1024;
    }
  }
  return 0;
}

bool OnGpu(const TaskArgs& args) {
  auto it = args.find("device");
  return it != args.end() && std::holds_alternative<std::string>(it->second) &&
         std::get<std::string>(it->second) == "cuda";
}

class Worker {
 public:
  explicit Worker(WorkerSpec spec) : spec_(std::move(spec)), arena_(spec_.task.memory_limit_bytes) {
    ctx_.name = spec_.task.name;
    ctx_.rank = spec_.rank;
    ctx_.stage = spec_.stage;
    ctx_.args = &spec_.task.args;
    ctx_.arena = &arena_;
    ctx_.results_dir = spec_.results_dir;
    ctx_.input_ready = [] { return false; };  // the rank pauses this process instead
    ctx_.clock = &SystemClock();
  }

  // One request in, one answer out; false once the rank asked to finish.
  bool Serve(const Message& request) {
    const std::string& verb = request[0];
    if (verb == "create") return Answer(Create());
    if (verb == "load") {
      Message m = Guarded([&] { return Load(); });
      if (m[0] == "ok") m.push_back(cap_note_);
      return Answer(m);
    }
    if (verb == "step") return Answer(Step(request.size() > 1 ? request[1] : "0"));
    if (verb == "finish") {
      if (task_ != nullptr && loaded_) (void)task_->Unload(ctx_);
      Reply({"ok", "finish", task_ != nullptr ? task_->Summary() : "",
             task_ != nullptr && task_->Done() ? "1" : "0"});
      return false;
    }
    return Answer({"error", "unknown request '" + verb + "'"});
  }

 private:
  Message Create() {
    absl::StatusOr<std::unique_ptr<SideTask>> task =
        CreateSideTask(spec_.task.type, spec_.task.plugin);
    if (!task.ok()) return {"error", std::string(task.status().message()), "config"};
    task_ = *std::move(task);
    Message m = Guarded([&] { return task_->Create(ctx_); });
    if (m[0] != "ok") return {"error", m[1], "config"};
    return {"ok",
            task_->UnitName(),
            absl::StrFormat("%.9g", task_->DeclaredStepSeconds()),
            task_->FillsBubble() ? "1" : "0",
            task_->LatencySensitive() ? "1" : "0",
            absl::StrFormat("%.17g", task_->TotalUnits())};
  }

  absl::Status Load() {
    const int64_t limit = spec_.task.memory_limit_bytes;
    if (limit <= 0) {
      cap_note_ = "no memory_limit: no cap";
    } else if (OnGpu(spec_.task.args)) {
      cap_note_ = absl::StrFormat(
          "memory_limit %s holds the task's device memory, not this process's", FormatBytes(limit));
    } else {
      WarmUpBlas();
      const int64_t held = DataSegmentBytes();
      const rlim_t cap = static_cast<rlim_t>(held + limit + kRuntimeSlackBytes);
      const rlimit r{cap, cap};
      if (setrlimit(RLIMIT_DATA, &r) != 0) {
        return absl::InternalError(absl::StrFormat("setrlimit(RLIMIT_DATA): %s", strerror(errno)));
      }
      cap_text_ = FormatBytes(limit);
      cap_note_ = absl::StrFormat(
          "its data segment capped at %s: the %s it held before loading the task, memory_limit "
          "%s and %s for its runtime",
          FormatBytes(static_cast<int64_t>(cap)), FormatBytes(held), cap_text_,
          FormatBytes(kRuntimeSlackBytes));
    }
    loaded_ = true;
    return task_->Load(ctx_);
  }

  // Answers "ok", units, done, restarted, restart seconds, idle, pending work (as the step
  // ends: the worker is stopped between bubbles, and its server with it).
  // The deadline is on the system clock (MonotonicSeconds), the same in both processes.
  Message Step(const std::string& deadline) {
    (void)absl::SimpleAtod(deadline, &ctx_.deadline_s);
    return Catching([&]() -> Message {
      const auto start = std::chrono::steady_clock::now();
      bool restarted = false;
      if (spec_.task.repeat && task_->Done()) {
        if (absl::Status s = Restart(); !s.ok()) {
          return {"error", absl::StrFormat("restart %d: %s", ctx_.restarts, s.message())};
        }
        restarted = true;
      }
      const double restart_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      ctx_.idle = false;
      absl::StatusOr<double> units = task_->Step(ctx_);
      if (!units.ok()) return {"error", std::string(units.status().message())};
      return {"ok",
              absl::StrFormat("%.17g", *units),
              task_->Done() ? "1" : "0",
              restarted ? "1" : "0",
              absl::StrFormat("%.9f", restarted ? restart_s : 0.0),
              ctx_.idle ? "1" : "0",
              task_->HasPendingWork() ? "1" : "0"};
    });
  }

  // As the in-process host's: results written, a fresh object on the next input. The memory
  // cap set at the first load stays.
  absl::Status Restart() {
    ctx_.restarts += 1;
    if (task_->RestartsInPlace()) return task_->Restart(ctx_);
    if (loaded_) (void)task_->Unload(ctx_);
    loaded_ = false;
    arena_.Reset();
    absl::StatusOr<std::unique_ptr<SideTask>> fresh =
        CreateSideTask(spec_.task.type, spec_.task.plugin);
    if (!fresh.ok()) return fresh.status();
    task_ = *std::move(fresh);
    if (absl::Status s = task_->Create(ctx_); !s.ok()) return s;
    loaded_ = true;
    return task_->Load(ctx_);
  }

  Message Guarded(const std::function<absl::Status()>& call) {
    return Catching([&]() -> Message {
      absl::Status s = call();
      if (s.ok()) return {"ok"};
      return {"error", std::string(s.message())};
    });
  }

  // The task's exceptions as error answers: an exception never ends the worker.
  Message Catching(const std::function<Message()>& call) {
    try {
      return call();
    } catch (const std::bad_alloc&) {
      return {"error", OutOfMemory()};
    } catch (const std::exception& e) {
      return {"error", absl::StrFormat("threw %s", e.what())};
    } catch (...) {
      return {"error", "threw a non-standard exception"};
    }
  }

  std::string OutOfMemory() const {
    return cap_text_.empty()
               ? std::string("ran out of memory (std::bad_alloc)")
               : absl::StrFormat("exceeded its memory limit of %s (std::bad_alloc in its worker)",
                                 cap_text_);
  }

  bool Answer(const Message& m) {
    Reply(m);
    return true;
  }
  void Reply(const Message& m) {
    if (!SendMessage(kSocket, m).ok()) _exit(0);  // the rank is gone
  }

  WorkerSpec spec_;
  CappedArena arena_;
  SideTaskContext ctx_;
  std::unique_ptr<SideTask> task_;
  bool loaded_ = false;
  std::string cap_text_;
  std::string cap_note_;  // how memory_limit applies here, sent with the answer to load
};

int WorkerMain() {
  absl::StatusOr<Message> first = ReceiveMessage(kSocket);
  if (!first.ok() || first->size() < 2 || (*first)[0] != "spec") return 2;
  absl::StatusOr<WorkerSpec> spec = DecodeWorkerSpec((*first)[1]);
  if (!spec.ok()) {
    (void)SendMessage(kSocket, {"error", std::string(spec.status().message()), "config"});
    return 2;
  }
  Worker worker(*std::move(spec));
  while (true) {
    absl::StatusOr<Message> request = ReceiveMessage(kSocket);
    if (!request.ok() || request->empty()) return 0;  // the rank closed the socket
    if (!worker.Serve(*request)) return 0;
  }
}

}  // namespace
}  // namespace freeride

int main() {
  freeride::FlushSubnormalsToZero();  // as the rank does: a task runs alike in either host
  return freeride::WorkerMain();
}
