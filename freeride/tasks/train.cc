// `train`: a small model trained in bubbles, on its own data. A GPT (args.n_layer, n_embd,
// n_head, vocab) learns a synthetic token stream with structure to find (token i is
// (7i + i/13) mod vocab); a step is one AdamW step on one batch of args.batch × args.seq_len
// tokens, and the task reports its loss. args.steps > 0 ends it. The model keeps its own
// buffers; their size (parameters, gradients, moments) is reserved in the task's arena at
// Load, so its memory_limit caps them.
#include <random>

#include "absl/strings/str_format.h"
#include "freeride/side_task.h"
#include "models/cpu/optimizer.h"
#include "models/gpt2.h"

namespace freeride {
namespace {

class TrainTask : public SideTask {
 public:
  absl::Status Create(SideTaskContext& ctx) override {
    ArgReader args(ctx.name, *ctx.args);
    if (absl::Status s = args.OnlyKnown({"n_layer", "n_embd", "n_head", "vocab", "seq_len",
                                         "batch", "lr", "steps", "seed"});
        !s.ok()) {
      return s;
    }
    auto layers = args.Int("n_layer", 1, 1, 64), width = args.Int("n_embd", 32, 1, 4096);
    auto heads = args.Int("n_head", 2, 1, 64), vocab = args.Int("vocab", 64, 2, 65536);
    auto seq = args.Int("seq_len", 32, 2, 4096), batch = args.Int("batch", 4, 1, 4096);
    auto lr = args.Number("lr", 3e-3, 0, 1);
    auto steps = args.Int("steps", 0, 0, int64_t{1} << 40);
    auto seed = args.Int("seed", 1, 0, int64_t{1} << 62);
    for (const absl::Status& s : {layers.status(), width.status(), heads.status(),
                                  vocab.status(), seq.status(), batch.status(), lr.status(),
                                  steps.status(), seed.status()}) {
      if (!s.ok()) return s;
    }
    absl::StatusOr<GPT2Config> config = MakeGPT2Config(*layers, *heads, *width, *seq, *vocab);
    if (!config.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("side task '%s': %s", ctx.name, config.status().message()));
    }
    config_ = *config, batch_ = *batch, seq_ = *seq, lr_ = *lr, limit_ = *steps;
    seed_ = static_cast<uint64_t>(*seed);
    return absl::OkStatus();
  }

  absl::Status Load(SideTaskContext& ctx) override {
    model_ = std::make_unique<GPT2Stage<float>>(config_, WholeModel(config_), batch_, seq_, 1);
    model_->InitRandom(seed_);
    m_.assign(model_->num_params(), 0.0f);
    v_.assign(model_->num_params(), 0.0f);
    const int64_t bytes = 4 * model_->num_params() * static_cast<int64_t>(sizeof(float));
    return ctx.arena->Allocate(bytes, "train task parameters, gradients and moments").status();
  }

  absl::StatusOr<double> Step(SideTaskContext&) override {
    // The synthetic sequence: token i of the stream is (i·7 + i/13) mod vocab.
    const int64_t V = config_.vocab_size;
    for (int64_t i = 0; i < batch_ * seq_; ++i) {
      const int64_t pos = cursor_ + i;
      model_->tokens(0)[i] = static_cast<int32_t>((pos * 7 + pos / 13) % V);
      model_->targets(0)[i] = static_cast<int32_t>(((pos + 1) * 7 + (pos + 1) / 13) % V);
    }
    cursor_ += batch_ * seq_;
    model_->ZeroGrads();
    loss_ = model_->Forward(0);
    model_->BackwardInput(0, 1.0f / static_cast<float>(batch_ * seq_));
    model_->BackwardWeight(0);
    model_->FoldHeadWteGrad();
    cpu::AdamWParams p;
    p.lr = static_cast<float>(lr_);
    p.step = ++steps_;
    cpu::AdamWUpdate(model_->params(), model_->grads(), m_.data(), v_.data(), model_->num_params(), p);
    if (steps_ == 1) first_loss_ = loss_;
    return 1.0;
  }

  absl::Status Unload(SideTaskContext&) override {
    model_.reset();
    return absl::OkStatus();
  }
  bool Done() const override { return limit_ > 0 && steps_ >= limit_; }
  std::string UnitName() const override { return "training steps"; }
  std::string Summary() const override {
    return absl::StrFormat("%d steps, loss %.4f -> %.4f", steps_, first_loss_, loss_);
  }
  double loss() const { return loss_; }

 private:
  GPT2Config config_;
  int64_t batch_ = 4, seq_ = 32, limit_ = 0, steps_ = 0, cursor_ = 0;
  uint64_t seed_ = 1;
  double lr_ = 3e-3, loss_ = 0, first_loss_ = 0;
  std::unique_ptr<GPT2Stage<float>> model_;
  std::vector<float> m_, v_;
};

}  // namespace

FREERIDE_REGISTER_SIDE_TASK(TrainTask, "train");

}  // namespace freeride
