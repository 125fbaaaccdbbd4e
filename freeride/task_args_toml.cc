#include "freeride/task_args_toml.h"

namespace freeride {
namespace {

template <typename T>
std::optional<ArgValue> ArrayOf(const toml::array& array) {
  std::vector<T> out;
  for (const toml::node& element : array) {
    std::optional<T> v = element.value_exact<T>();
    if (!v) return std::nullopt;
    out.push_back(*v);
  }
  return out;
}

}  // namespace

std::optional<ArgValue> ArgFromToml(const toml::node& node) {
  if (auto v = node.value_exact<bool>()) return *v;
  if (auto v = node.value_exact<int64_t>()) return *v;
  if (auto v = node.value_exact<double>()) return *v;
  if (auto v = node.value_exact<std::string>()) return *v;
  const toml::array* array = node.as_array();
  if (array == nullptr || array->empty()) return std::nullopt;
  if (auto v = ArrayOf<int64_t>(*array)) return v;
  if (auto v = ArrayOf<double>(*array)) return v;
  return ArrayOf<std::string>(*array);
}

}  // namespace freeride
