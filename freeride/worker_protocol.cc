#include "freeride/worker_protocol.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include <toml++/toml.h>

#include "freeride/task_args_toml.h"

namespace freeride {
namespace {

constexpr char kSeparator = '\x1f';
constexpr size_t kMaxMessage = 1 << 20;

toml::node_view<const toml::node> Get(const toml::table& t, const char* key) { return t[key]; }

template <typename T>
toml::array ToArray(const std::vector<T>& values) {
  toml::array a;
  for (const T& v : values) a.push_back(v);
  return a;
}

}  // namespace

std::string EncodeWorkerSpec(const WorkerSpec& spec) {
  toml::table args;
  // Not a structured binding: clang before 16 cannot capture one in the lambda (the fuzz build).
  for (const auto& arg : spec.task.args) {
    const std::string& name = arg.first;
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, std::vector<int64_t>> ||
                        std::is_same_v<V, std::vector<double>> ||
                        std::is_same_v<V, std::vector<std::string>>) {
            args.insert(name, ToArray(v));
          } else {
            args.insert(name, v);
          }
        },
        arg.second);
  }
  toml::table t{{"type", spec.task.type},
                {"name", spec.task.name},
                {"plugin", spec.task.plugin},
                {"memory_limit", spec.task.memory_limit_bytes},
                {"repeat", spec.task.repeat},
                {"rank", spec.rank},
                {"stage", spec.stage},
                {"results_dir", spec.results_dir},
                {"args", std::move(args)}};
  std::ostringstream out;
  out << t;
  return out.str();
}

absl::StatusOr<WorkerSpec> DecodeWorkerSpec(absl::string_view text) {
  toml::table t;
  try {
    t = toml::parse(std::string_view(text.data(), text.size()));
  } catch (const toml::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrFormat("worker spec: %s", std::string(e.description())));
  }
  WorkerSpec spec;
  spec.task.type = Get(t, "type").value_or(std::string());
  spec.task.name = Get(t, "name").value_or(std::string());
  spec.task.plugin = Get(t, "plugin").value_or(std::string());
  spec.task.memory_limit_bytes = Get(t, "memory_limit").value_or(int64_t{0});
  spec.task.isolation = "process";
  spec.task.repeat = Get(t, "repeat").value_or(false);
  spec.rank = static_cast<int>(Get(t, "rank").value_or(int64_t{0}));
  spec.stage = static_cast<int>(Get(t, "stage").value_or(int64_t{0}));
  spec.results_dir = Get(t, "results_dir").value_or(std::string());
  if (const toml::table* args = t["args"].as_table()) {
    for (auto&& [key, node] : *args) {
      const std::string name(key.str());
      std::optional<ArgValue> value = ArgFromToml(node);
      if (!value) {
        return absl::InvalidArgumentError("worker spec: args." + name +
                                          ": not a scalar or a list of one scalar type");
      }
      spec.task.args[name] = *std::move(value);
    }
  }
  if (spec.task.type.empty()) return absl::InvalidArgumentError("worker spec: no type");
  return spec;
}

absl::Status SendMessage(int fd, const Message& message) {
  const std::string data = absl::StrJoin(message, std::string(1, kSeparator));
  if (data.size() > kMaxMessage) return absl::InvalidArgumentError("worker message too long");
  while (true) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(data.size())) return absl::OkStatus();
    if (n < 0 && errno == EINTR) continue;
    return absl::UnavailableError(
        absl::StrFormat("the other end of the worker socket is gone (%s)", strerror(errno)));
  }
}

absl::StatusOr<Message> ReceiveMessage(int fd) {
  thread_local std::vector<char> buffer(kMaxMessage);  // once: messages are many and small
  while (true) {
    const ssize_t n = recv(fd, buffer.data(), buffer.size(), 0);
    if (n > 0) {
      return Message(absl::StrSplit(absl::string_view(buffer.data(), static_cast<size_t>(n)),
                                    kSeparator));
    }
    if (n < 0 && errno == EINTR) continue;
    return absl::UnavailableError(n == 0 ? "the worker socket closed"
                                         : absl::StrFormat("worker socket: %s", strerror(errno)));
  }
}

}  // namespace freeride
