#include "core/json_fields.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace freeride {

using nlohmann::json;

absl::StatusOr<json> ParseJsonObject(absl::string_view text, absl::string_view where) {
  json value = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    return absl::DataLossError(absl::StrCat(where, ": not valid JSON"));
  }
  if (!value.is_object()) {
    return absl::DataLossError(
        absl::StrCat(where, ": expected a JSON object, found ", DescribeJson(value)));
  }
  return value;
}

std::string DescribeJson(const json& value) {
  switch (value.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return value.get<bool>() ? "true" : "false";
    case json::value_t::string: {
      std::string text = value.get<std::string>();
      if (text.size() > 40) text = text.substr(0, 40) + "...";
      // dump() escapes quotes and control characters, so the message stays one line.
      return absl::StrCat("a string (", json(text).dump(-1, ' ', true, json::error_handler_t::replace),
                          ")");
    }
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: return absl::StrCat("the number ", value.dump());
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    default: return "a value of another kind";
  }
}

JsonFields::JsonFields(const json& object, std::string where)
    : object_(object), where_(std::move(where)) {}

const json* JsonFields::Find(absl::string_view key) const {
  if (!object_.is_object()) return nullptr;
  auto it = object_.find(std::string(key));
  return it == object_.end() ? nullptr : &*it;
}

bool JsonFields::Has(absl::string_view key) const { return Find(key) != nullptr; }

bool JsonFields::IsNull(absl::string_view key) const {
  const json* v = Find(key);
  return v != nullptr && v->is_null();
}

absl::Status JsonFields::Wrong(absl::string_view key, absl::string_view expected,
                               const json& found) const {
  return absl::DataLossError(absl::StrFormat("%s: \"%s\": expected %s, found %s", where_, key,
                                             expected, DescribeJson(found)));
}

namespace {

std::string IntRange(int64_t lo, int64_t hi) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (lo == kMin && hi == kMax) return "an integer";
  if (hi == kMax) return absl::StrCat("an integer >= ", lo);
  if (lo == kMin) return absl::StrCat("an integer <= ", hi);
  return absl::StrCat("an integer in [", lo, ", ", hi, "]");
}

std::string NumberRange(double lo, double hi) {
  constexpr double kMin = std::numeric_limits<double>::lowest();
  constexpr double kMax = std::numeric_limits<double>::max();
  if (lo == kMin && hi == kMax) return "a finite number";
  if (hi == kMax) return absl::StrCat("a finite number >= ", lo);
  if (lo == kMin) return absl::StrCat("a finite number <= ", hi);
  return absl::StrCat("a number in [", lo, ", ", hi, "]");
}

// `v` as an int64 when it is an integer that fits.
bool AsInt(const json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (!v.is_number_integer()) return false;
  *out = v.get<int64_t>();
  return true;
}

}  // namespace

absl::StatusOr<int64_t> JsonFields::Int(absl::string_view key, int64_t lo, int64_t hi) const {
  const json* v = Find(key);
  if (v == nullptr) return absl::DataLossError(absl::StrFormat("%s: \"%s\" is missing", where_, key));
  int64_t out = 0;
  if (!AsInt(*v, &out) || out < lo || out > hi) return Wrong(key, IntRange(lo, hi), *v);
  return out;
}

absl::StatusOr<double> JsonFields::Number(absl::string_view key, double lo, double hi) const {
  const json* v = Find(key);
  if (v == nullptr) return absl::DataLossError(absl::StrFormat("%s: \"%s\" is missing", where_, key));
  if (!v->is_number()) return Wrong(key, NumberRange(lo, hi), *v);
  const double out = v->get<double>();
  if (!std::isfinite(out) || out < lo || out > hi) return Wrong(key, NumberRange(lo, hi), *v);
  return out;
}

absl::StatusOr<std::string> JsonFields::String(absl::string_view key) const {
  const json* v = Find(key);
  if (v == nullptr) return absl::DataLossError(absl::StrFormat("%s: \"%s\" is missing", where_, key));
  if (!v->is_string()) return Wrong(key, "a string", *v);
  return v->get<std::string>();
}

absl::StatusOr<bool> JsonFields::Bool(absl::string_view key) const {
  const json* v = Find(key);
  if (v == nullptr) return absl::DataLossError(absl::StrFormat("%s: \"%s\" is missing", where_, key));
  if (!v->is_boolean()) return Wrong(key, "true or false", *v);
  return v->get<bool>();
}

absl::StatusOr<std::vector<int64_t>> JsonFields::IntArray(absl::string_view key, int64_t lo,
                                                          int64_t hi) const {
  const json* v = Find(key);
  if (v == nullptr) return absl::DataLossError(absl::StrFormat("%s: \"%s\" is missing", where_, key));
  const std::string expected = absl::StrCat("an array of ", IntRange(lo, hi), "s");
  if (!v->is_array()) return Wrong(key, expected, *v);
  std::vector<int64_t> out;
  for (const json& e : *v) {
    int64_t i = 0;
    if (!AsInt(e, &i) || i < lo || i > hi) return Wrong(key, expected, e);
    out.push_back(i);
  }
  return out;
}

absl::StatusOr<const json*> JsonFields::Object(absl::string_view key) const {
  const json* v = Find(key);
  if (v == nullptr) return absl::DataLossError(absl::StrFormat("%s: \"%s\" is missing", where_, key));
  if (!v->is_object()) return Wrong(key, "an object", *v);
  return v;
}

absl::StatusOr<int64_t> JsonFields::IntOr(absl::string_view key, int64_t fallback, int64_t lo,
                                          int64_t hi) const {
  return Has(key) ? Int(key, lo, hi) : fallback;
}

absl::StatusOr<double> JsonFields::NumberOr(absl::string_view key, double fallback, double lo,
                                            double hi) const {
  return Has(key) ? Number(key, lo, hi) : fallback;
}

absl::StatusOr<std::string> JsonFields::StringOr(absl::string_view key,
                                                 std::string fallback) const {
  return Has(key) ? String(key) : fallback;
}

}  // namespace freeride
