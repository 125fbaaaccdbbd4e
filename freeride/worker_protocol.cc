#include "freeride/worker_protocol.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <sstream>
#include <type_traits>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include <toml++/toml.h>
#include "core/status.h"
#include "freeride/task_args_toml.h"

namespace freeride {
namespace {

constexpr char kSeparator = '\x1f';
constexpr size_t kMaxMessage = 1 << 20;

// A field of the spec: absent gives `fallback`, another type is refused. Only a node of T's own
// type converts: toml++'s value_or casts a float to int64_t unchecked, which is undefined beyond
// int64_t's range (fuzz_worker_spec found `rank = 1e69`).
template <typename T>
absl::StatusOr<T> Field(const toml::table& t, const char* key, T fallback) {
  const toml::node* node = t.get(key);
  if (node == nullptr) return fallback;
  if (std::optional<T> v = node->value_exact<T>()) return *std::move(v);
  return absl::InvalidArgumentError(absl::StrFormat("worker spec: %s: not %s", key,
                                                    std::is_same_v<T, std::string> ? "a string"
                                                    : std::is_same_v<T, bool>      ? "a boolean"
                                                                                   : "an integer"));
}

// An int field (rank, stage) that fits an int.
absl::StatusOr<int> IntField(const toml::table& t, const char* key) {
  FR_ASSIGN_OR_RETURN(int64_t v, Field<int64_t>(t, key, 0));
  if (v < 0 || v > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("worker spec: %s: %d is out of range", key, v));
  }
  return static_cast<int>(v);
}

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
  // Basic strings only: toml++ 3.3 writes a string holding ''''' as a multi-line literal string
  // that it cannot read back (fuzz_worker_spec found it).
  std::ostringstream out;
  out << toml::toml_formatter{t, toml::format_flags::none};
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
  FR_ASSIGN_OR_RETURN(spec.task.type, Field<std::string>(t, "type", ""));
  FR_ASSIGN_OR_RETURN(spec.task.name, Field<std::string>(t, "name", ""));
  FR_ASSIGN_OR_RETURN(spec.task.plugin, Field<std::string>(t, "plugin", ""));
  FR_ASSIGN_OR_RETURN(spec.task.memory_limit_bytes, Field<int64_t>(t, "memory_limit", 0));
  spec.task.isolation = "process";
  FR_ASSIGN_OR_RETURN(spec.task.repeat, Field<bool>(t, "repeat", false));
  FR_ASSIGN_OR_RETURN(spec.rank, IntField(t, "rank"));
  FR_ASSIGN_OR_RETURN(spec.stage, IntField(t, "stage"));
  FR_ASSIGN_OR_RETURN(spec.results_dir, Field<std::string>(t, "results_dir", ""));
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
