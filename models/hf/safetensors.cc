#include "models/hf/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/json_fields.h"
#include "models/stage_message.h"

namespace freeride {
namespace {

// The reference implementation's bound on the header: a length past it is refused before
// anything is read or allocated for it.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

absl::Status Bad(absl::string_view where, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", message));
}

absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& name, const nlohmann::json& value,
                                            int64_t buffer_bytes, absl::string_view where) {
  const std::string what = absl::StrFormat("%s: tensor \"%s\"", where, name);
  if (!value.is_object()) {
    return Bad(what, absl::StrCat("expected an object, found ", DescribeJson(value)));
  }
  JsonFields fields(value, what);
  SafetensorsEntry e;
  e.name = name;
  absl::StatusOr<std::string> dtype = fields.String("dtype");
  if (!dtype.ok()) return dtype.status();
  e.dtype = *dtype;
  const int bytes = SafetensorsDtypeBytes(e.dtype);
  if (bytes == 0) return Bad(what, absl::StrFormat("unknown dtype \"%s\"", e.dtype));
  absl::StatusOr<std::vector<int64_t>> shape = fields.IntArray("shape", 0);
  if (!shape.ok()) return shape.status();
  e.shape = *shape;
  absl::StatusOr<std::vector<int64_t>> offsets = fields.IntArray("data_offsets", 0);
  if (!offsets.ok()) return offsets.status();
  if (offsets->size() != 2 || (*offsets)[0] > (*offsets)[1]) {
    return Bad(what, absl::StrFormat("data_offsets [%s] are not [begin, end] with begin <= end",
                                     absl::StrJoin(*offsets, ", ")));
  }
  e.begin = (*offsets)[0];
  e.end = (*offsets)[1];
  if (e.end > buffer_bytes) {
    return Bad(what, absl::StrFormat("data_offsets [%d, %d] end past the data buffer of %d bytes",
                                     e.begin, e.end, buffer_bytes));
  }
  // Elements times dtype size, without overflow: a shape that multiplies past the buffer is
  // refused as soon as it does.
  int64_t elements = 1;
  for (int64_t d : e.shape) {
    if (d != 0 && elements > buffer_bytes / d) {
      return Bad(what, absl::StrFormat("shape [%s] holds more elements than the file has bytes",
                                       absl::StrJoin(e.shape, ", ")));
    }
    elements *= d;
  }
  if (elements * bytes != e.end - e.begin) {
    return Bad(what, absl::StrFormat("shape [%s] of %s is %d bytes, but data_offsets [%d, %d] "
                                     "hold %d",
                                     absl::StrJoin(e.shape, ", "), e.dtype, elements * bytes,
                                     e.begin, e.end, e.end - e.begin));
  }
  return e;
}

}  // namespace

int SafetensorsDtypeBytes(absl::string_view dtype) {
  static const std::map<std::string, int, std::less<>> kBytes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  auto it = kBytes.find(dtype);
  return it == kBytes.end() ? 0 : it->second;
}

int64_t SafetensorsEntry::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const SafetensorsEntry* SafetensorsHeader::Find(absl::string_view name) const {
  for (const SafetensorsEntry& e : tensors) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensors(absl::string_view file,
                                                   absl::string_view where) {
  if (file.size() < 8) {
    return Bad(where, absl::StrFormat("%d bytes: too short for the 8-byte header length of a "
                                      "safetensors file",
                                      file.size()));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[i]);
  if (n > kMaxHeaderBytes || n > file.size() - 8) {
    return Bad(where,
               absl::StrFormat("header length %d runs past the file's %d bytes", n, file.size()));
  }
  SafetensorsHeader header;
  header.data_start = static_cast<int64_t>(8 + n);
  const int64_t buffer_bytes = static_cast<int64_t>(file.size()) - header.data_start;
  absl::StatusOr<nlohmann::json> json =
      ParseJsonObject(file.substr(8, n), absl::StrCat(where, ": the header"));
  if (!json.ok()) return json.status();
  for (const auto& [name, value] : json->items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) {
        return Bad(where, absl::StrCat("__metadata__ must be an object of strings, found ",
                                       DescribeJson(value)));
      }
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) {
          return Bad(where, absl::StrFormat("__metadata__ \"%s\" must be a string, found %s", key,
                                            DescribeJson(text)));
        }
        header.metadata[key] = text.get<std::string>();
      }
      continue;
    }
    absl::StatusOr<SafetensorsEntry> entry = ParseEntry(name, value, buffer_bytes, where);
    if (!entry.ok()) return entry.status();
    header.tensors.push_back(*std::move(entry));
  }
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
            });
  int64_t at = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& e : header.tensors) {
    if (e.begin < at) {
      return Bad(where, absl::StrFormat("tensor \"%s\" at bytes [%d, %d] overlaps tensor \"%s\" "
                                        "at [%d, %d]",
                                        e.name, e.begin, e.end, previous->name, previous->begin,
                                        previous->end));
    }
    if (e.begin > at) {
      return Bad(where, absl::StrFormat("tensor \"%s\" starts at byte %d of the data buffer; the "
                                        "tensors before it end at %d (a gap)",
                                        e.name, e.begin, at));
    }
    at = e.end;
    previous = &e;
  }
  if (at != buffer_bytes) {
    return Bad(where, absl::StrFormat("the tensors cover %d bytes of a data buffer of %d", at,
                                      buffer_bytes));
  }
  return header;
}

absl::StatusOr<std::vector<float>> SafetensorsFloats(absl::string_view file,
                                                     const SafetensorsHeader& header,
                                                     const SafetensorsEntry& tensor,
                                                     absl::string_view where) {
  const char* data = file.data() + header.data_start + tensor.begin;
  const int64_t n = tensor.elements();
  std::vector<float> out(n);
  if (tensor.dtype == "F32") {
    std::memcpy(out.data(), data, n * sizeof(float));
  } else if (tensor.dtype == "BF16" || tensor.dtype == "F16") {
    const bool bf16 = tensor.dtype == "BF16";
    for (int64_t i = 0; i < n; ++i) {
      uint16_t bits;
      std::memcpy(&bits, data + 2 * i, 2);
      out[i] = bf16 ? FloatOfBf16(bits) : FloatOfHalf(bits);
    }
  } else {
    return Bad(where, absl::StrFormat("tensor \"%s\" is %s; this build reads F32, BF16 and F16",
                                      tensor.name, tensor.dtype));
  }
  return out;
}

uint16_t HalfBits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t exponent = (x >> 23) & 0xffu;
  uint32_t mantissa = x & 0x7fffffu;
  if (exponent == 0xff) return sign | 0x7c00u | (mantissa != 0 ? 0x200u | (mantissa >> 13) : 0);
  const int e = static_cast<int>(exponent) - 127 + 15;
  if (e >= 31) return sign | 0x7c00u;
  if (e <= 0) {
    if (e < -10) return sign;
    // A half subnormal: the float's significand (with its leading 1) shifted into 10 bits.
    mantissa |= 0x800000u;
    const int shift = 14 - e;
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
    return sign | half;
  }
  uint32_t half = (static_cast<uint32_t>(e) << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1fffu;
  // A carry out of the mantissa moves to the next exponent (to infinity past the largest).
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return sign | half;
}

float FloatOfHalf(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu;
  float f;
  if (exponent == 0) {
    f = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -f : f;
  }
  const uint32_t x = exponent == 31 ? sign | 0x7f800000u | (mantissa << 13)
                                    : sign | ((exponent - 15 + 127) << 23) | (mantissa << 13);
  std::memcpy(&f, &x, sizeof(f));
  return f;
}

absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<const SafetensorsTensor*>& tensors, absl::string_view dtype,
    const std::map<std::string, std::string>& metadata) {
  const int bytes = SafetensorsDtypeBytes(dtype);
  if (dtype != "F32" && dtype != "BF16" && dtype != "F16") {
    return absl::InvalidArgumentError(
        absl::StrFormat("safetensors dtype \"%s\": this build writes F32, BF16 and F16", dtype));
  }
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  if (!metadata.empty()) json["__metadata__"] = metadata;
  int64_t at = 0;
  for (const SafetensorsTensor* t : tensors) {
    int64_t elements = 1;
    for (int64_t d : t->shape) elements *= d;
    if (elements != static_cast<int64_t>(t->values.size())) {
      return absl::InternalError(absl::StrFormat("tensor \"%s\": shape [%s] but %d values", t->name,
                                                 absl::StrJoin(t->shape, ", "), t->values.size()));
    }
    json[t->name] = {{"dtype", std::string(dtype)},
                     {"shape", t->shape},
                     {"data_offsets", {at, at + elements * bytes}}};
    at += elements * bytes;
  }
  std::string text = json.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8 + text.size() + at, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xffu);
  std::memcpy(out.data() + 8, text.data(), text.size());
  char* p = out.data() + 8 + text.size();
  for (const SafetensorsTensor* t : tensors) {
    if (dtype == "F32") {
      std::memcpy(p, t->values.data(), t->values.size() * sizeof(float));
      p += t->values.size() * sizeof(float);
      continue;
    }
    for (float v : t->values) {
      const uint16_t bits = dtype == "BF16" ? Bf16Bits(v) : HalfBits(v);
      std::memcpy(p, &bits, 2);
      p += 2;
    }
  }
  return out;
}

}  // namespace freeride
