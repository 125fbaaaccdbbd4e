// Checked reads of the JSON documents the project reads back from disk or the network
// (job.json, jobs.jsonl, status.json, manifest.json, run.json, metrics.jsonl, HTTP bodies).
// nlohmann-json's own accessors (`get<T>()`, `value()`, `operator[]` on a const object) throw
// on a wrong type, and an exception that escapes aborts the process (exit 134): a file edited
// by hand, cut short, or written by an older build must never do that. Every read here checks
// presence, type and range and turns a wrong value into a Status naming the document, the key,
// what was expected and what was found.
//
// Two kinds of reader use them:
// - strict (JsonFields): a document whose values decide what the program does (a job, a
//   checkpoint manifest); a wrong value is an error for the caller to report;
// - lenient (JsonNumberOr and friends): a document only shown to a person (a report, a
//   TensorBoard export), where a wrong value reads as missing.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace freeride {

// `text` as one JSON object; anything else (bad syntax, an array, a number) is a DataLoss
// error naming `where`. Never throws.
absl::StatusOr<nlohmann::json> ParseJsonObject(absl::string_view text, absl::string_view where);

// How a JSON value reads in an error: "null", "a string (\"high\")", "the number 1e+300".
std::string DescribeJson(const nlohmann::json& value);

// The fields of one JSON object, read with checks. `object` must outlive this; `where` names
// the document in errors ("RUN/jobs/3/job.json", "RUN/jobs.jsonl line 4").
class JsonFields {
 public:
  JsonFields(const nlohmann::json& object, std::string where);

  bool Has(absl::string_view key) const;
  // Whether `key` is there and null (what nlohmann writes for inf and NaN).
  bool IsNull(absl::string_view key) const;

  // Required values: a missing key, null, another type or a value outside [lo, hi] is an
  // error. Numbers are finite (nlohmann writes inf and NaN as null).
  absl::StatusOr<int64_t> Int(absl::string_view key,
                              int64_t lo = std::numeric_limits<int64_t>::min(),
                              int64_t hi = std::numeric_limits<int64_t>::max()) const;
  absl::StatusOr<double> Number(absl::string_view key,
                                double lo = std::numeric_limits<double>::lowest(),
                                double hi = std::numeric_limits<double>::max()) const;
  absl::StatusOr<std::string> String(absl::string_view key) const;
  absl::StatusOr<bool> Bool(absl::string_view key) const;
  // An array of integers, each in [lo, hi].
  absl::StatusOr<std::vector<int64_t>> IntArray(
      absl::string_view key, int64_t lo = std::numeric_limits<int64_t>::min(),
      int64_t hi = std::numeric_limits<int64_t>::max()) const;
  absl::StatusOr<const nlohmann::json*> Object(absl::string_view key) const;

  // Optional values: a missing key gives `fallback`; a present one is checked as above.
  absl::StatusOr<int64_t> IntOr(absl::string_view key, int64_t fallback,
                                int64_t lo = std::numeric_limits<int64_t>::min(),
                                int64_t hi = std::numeric_limits<int64_t>::max()) const;
  absl::StatusOr<double> NumberOr(absl::string_view key, double fallback,
                                  double lo = std::numeric_limits<double>::lowest(),
                                  double hi = std::numeric_limits<double>::max()) const;
  absl::StatusOr<std::string> StringOr(absl::string_view key, std::string fallback) const;

  const std::string& where() const { return where_; }

 private:
  // The value at `key`, or nullptr when the key is missing.
  const nlohmann::json* Find(absl::string_view key) const;
  absl::Status Wrong(absl::string_view key, absl::string_view expected,
                     const nlohmann::json& found) const;

  const nlohmann::json& object_;
  std::string where_;
};

// Lenient reads for documents that are only shown: the value at `key` of `object` when it is
// there with the right type (and, for numbers, finite), else `fallback`. `object` may be any
// JSON value (not an object: the fallback); plain or ordered JSON. Never throw.
template <class Json>
double JsonNumberOr(const Json& object, absl::string_view key, double fallback) {
  if (!object.is_object()) return fallback;
  auto it = object.find(std::string(key));
  if (it == object.end() || !it->is_number()) return fallback;
  const double v = it->template get<double>();
  return std::isfinite(v) ? v : fallback;
}
template <class Json>
int64_t JsonIntOr(const Json& object, absl::string_view key, int64_t fallback) {
  if (!object.is_object()) return fallback;
  auto it = object.find(std::string(key));
  if (it == object.end() || !it->is_number_integer()) return fallback;
  // An unsigned beyond int64's range wraps in get<int64_t>(): refuse it.
  if (it->is_number_unsigned() &&
      it->template get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return fallback;
  }
  return it->template get<int64_t>();
}
template <class Json>
std::string JsonStringOr(const Json& object, absl::string_view key, absl::string_view fallback) {
  if (!object.is_object()) return std::string(fallback);
  auto it = object.find(std::string(key));
  if (it == object.end() || !it->is_string()) return std::string(fallback);
  return it->template get<std::string>();
}
template <class Json>
bool JsonBoolOr(const Json& object, absl::string_view key, bool fallback) {
  if (!object.is_object()) return fallback;
  auto it = object.find(std::string(key));
  return it == object.end() || !it->is_boolean() ? fallback : it->template get<bool>();
}
// The object (or array) at `key`, or an empty one.
template <class Json>
Json JsonObjectOr(const Json& object, absl::string_view key) {
  if (!object.is_object()) return Json::object();
  auto it = object.find(std::string(key));
  return it == object.end() || !it->is_object() ? Json::object() : *it;
}
template <class Json>
Json JsonArrayOr(const Json& object, absl::string_view key) {
  if (!object.is_object()) return Json::array();
  auto it = object.find(std::string(key));
  return it == object.end() || !it->is_array() ? Json::array() : *it;
}

}  // namespace freeride
