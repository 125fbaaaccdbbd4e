#include "models/hf/hf_tensors.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace freeride {

std::string HfShape(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<HfTensorValues> ReadHfTensor(const HfTensorReader& read, const std::string& name,
                                            const std::vector<int64_t>& shape) {
  absl::StatusOr<HfTensorValues> t = read(name);
  if (!t.ok()) return t.status();
  if (t->shape != shape) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tensor \"%s\" has shape %s; config.json's model needs %s", name,
                        HfShape(t->shape), HfShape(shape)));
  }
  return t;
}

absl::Status CheckHfHeadTied(const HfTensorReader& read, const GPT2Config& config,
                             const float* wte, const std::string& mismatch) {
  absl::StatusOr<HfTensorValues> head = read("lm_head.weight");
  if (!head.ok()) return head.status();
  const std::vector<int64_t> want = {config.vocab_size, config.n_embd};
  if (head->shape != want ||
      std::memcmp(head->values.data(), wte, head->values.size() * sizeof(float)) != 0) {
    return absl::InvalidArgumentError(mismatch);
  }
  return absl::OkStatus();
}

}  // namespace freeride
