// An out-of-tree side task as a plugin (docs/side_tasks.md walks through it): each step
// searches the next args.chunk numbers for the longest Collatz chain. Build it as a shared
// object against the freeride headers and name it in the config:
//   [[side_tasks]]
//   type = "collatz"
//   plugin = "build/sidetasks/libfreeride_collatz_plugin.so"
#include "absl/strings/str_format.h"
#include "freeride/side_task.h"

namespace {

class CollatzTask : public freeride::SideTask {
 public:
  absl::Status Create(freeride::SideTaskContext& ctx) override {
    freeride::ArgReader args(ctx.name, *ctx.args);
    if (absl::Status s = args.OnlyKnown({"chunk", "limit"}); !s.ok()) return s;
    absl::StatusOr<int64_t> chunk = args.Int("chunk", 20000, 1, int64_t{1} << 30);
    absl::StatusOr<int64_t> limit = args.Int("limit", 0, 0, int64_t{1} << 40);
    if (!chunk.ok()) return chunk.status();
    if (!limit.ok()) return limit.status();
    chunk_ = *chunk;
    limit_ = *limit;
    return absl::OkStatus();
  }
  absl::StatusOr<double> Step(freeride::SideTaskContext&) override {
    for (int64_t k = 0; k < chunk_; ++k, ++next_) {
      int64_t n = next_, length = 1;
      while (n != 1) n = (n % 2 == 0) ? n / 2 : 3 * n + 1, ++length;
      if (length > best_length_) best_length_ = length, best_ = next_;
    }
    return static_cast<double>(chunk_);
  }
  bool Done() const override { return limit_ > 0 && next_ > limit_; }
  std::string UnitName() const override { return "numbers"; }
  std::string Summary() const override {
    return absl::StrFormat("searched 1..%d: longest chain starts at %d (%d terms)", next_ - 1,
                           best_, best_length_);
  }

 private:
  int64_t chunk_ = 20000, limit_ = 0, next_ = 1, best_ = 1, best_length_ = 1;
};

}  // namespace

FREERIDE_SIDE_TASK_PLUGIN(CollatzTask, "collatz")
