// A capped host allocator: every allocation of a side task goes through one, so a task that
// asks for more than its memory limit gets an error (and is marked FAILED) instead of taking
// memory training needs.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

#include "absl/status/statusor.h"

namespace freeride {

class CappedArena {
 public:
  // `cap_bytes` 0: no cap.
  explicit CappedArena(int64_t cap_bytes = 0) : cap_(cap_bytes) {}
  ~CappedArena() { Reset(); }
  CappedArena(const CappedArena&) = delete;
  CappedArena& operator=(const CappedArena&) = delete;

  // 64-byte aligned, zero-filled. ResourceExhausted (naming `what`, the request, what is in
  // use and the cap) when it would exceed the cap.
  absl::StatusOr<void*> Allocate(int64_t bytes, const std::string& what);
  template <typename T>
  absl::StatusOr<T*> AllocateArray(int64_t count, const std::string& what) {
    absl::StatusOr<void*> p = Allocate(count * static_cast<int64_t>(sizeof(T)), what);
    if (!p.ok()) return p.status();
    return static_cast<T*>(*p);
  }
  void Free(void* p);
  void Reset();  // frees everything

  int64_t used() const { return used_; }
  int64_t peak() const { return peak_; }
  int64_t cap() const { return cap_; }

 private:
  int64_t cap_, used_ = 0, peak_ = 0;
  std::unordered_map<void*, int64_t> blocks_;
};

}  // namespace freeride
