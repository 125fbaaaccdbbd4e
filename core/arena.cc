#include "core/arena.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_format.h"

namespace freeride {

absl::StatusOr<void*> CappedArena::Allocate(int64_t bytes, const std::string& what) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrFormat("%s: negative size", what));
  if (cap_ > 0 && used_ + bytes > cap_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: %d bytes requested with %d in use exceeds the memory limit of %d bytes", what, bytes,
        used_, cap_));
  }
  const size_t rounded = static_cast<size_t>((bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrFormat("%s: out of memory for %d bytes", what, bytes));
  }
  std::memset(p, 0, rounded == 0 ? 64 : rounded);
  blocks_[p] = bytes;
  used_ += bytes;
  peak_ = std::max(peak_, used_);
  return p;
}

void CappedArena::Free(void* p) {
  auto it = blocks_.find(p);
  if (it == blocks_.end()) return;
  used_ -= it->second;
  blocks_.erase(it);
  std::free(p);
}

void CappedArena::Reset() {
  for (auto& [p, bytes] : blocks_) std::free(p);
  blocks_.clear();
  used_ = 0;
}

}  // namespace freeride
