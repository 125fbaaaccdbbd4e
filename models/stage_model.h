// What the pipeline runtime and the trainer need from one model chunk, whatever device holds
// it: the CPU backend (CpuStageModel, around GPT2Stage<float>) and the CUDA backend
// (CudaStageModel) both implement it. Everything crossing this interface is in host memory
// (but the messages a CUDA chunk allocates on its device for a transport that carries device
// memory, NCCL's), so checkpoints never see device memory: fp32 for the gradients summed across
// ranks, parameters and optimizer state; the chunk's own activation type for the messages
// between stages (stage_message.h: bf16 on a bf16 CUDA chunk, half the bytes). Every call
// that can touch a device returns a Status: a CUDA error ends the step with the library's
// message instead of aborting the process.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/gpt2_config.h"
#include "models/grad_norm.h"
#include "models/stage_message.h"

namespace freeride {

// One AdamW step's settings (weight decay applies only to IsDecayed tensors).
struct AdamWStep {
  double lr = 0;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0;
  int64_t step = 1;         // 1-based, for the bias corrections
  double grad_scale = 1;    // multiplies every gradient first (clipping)
};

class StageModel {
 public:
  virtual ~StageModel() = default;

  virtual const ParamLayout& layout() const = 0;
  const GPT2Config& config() const { return layout().config; }
  const StageSpec& stage() const { return layout().stage; }
  int64_t num_params() const { return layout().total; }
  virtual int64_t micro_batch() const = 0;
  virtual int64_t seq_len() const = 0;
  virtual int slots() const = 0;
  // Where it runs, for logs: "cpu fp32", "cuda:0 bf16".
  virtual std::string Describe() const = 0;
  // Device memory the chunk holds (0 on the CPU). Allocated when it is created, and for device
  // messages (AllocateMessageBuffer) before the first step's receives, never inside a step
  // after that, so it is also the chunk's peak.
  virtual int64_t DeviceBytes() const { return 0; }

  // Messages (activations [B·T·C] and their gradients) hold MessageElements() values of
  // message_type(): both ends of a message must agree (every stage of a run has the same
  // precision; the stage executor refuses chunks that differ). AllocateMessageBuffer gives
  // the memory of one, MessageBytes(), for the caller to keep and reuse: on CUDA pinned host
  // memory, or device memory where `memory` asks for it (the messages' copies then stay on
  // the device); on the CPU host memory either way.
  virtual MessageType message_type() const { return MessageType::kFp32; }
  int64_t MessageElements() const { return micro_batch() * seq_len() * config().n_embd; }
  int64_t MessageBytes() const { return MessageElements() * MessageTypeBytes(message_type()); }
  virtual absl::StatusOr<MessageBuffer> AllocateMessageBuffer(MessageMemory /*memory*/) {
    MessageBuffer buffer = AllocateHostMessage(MessageBytes());
    if (buffer == nullptr) return absl::ResourceExhaustedError("out of memory for a message");
    return buffer;
  }

  // A slot's inputs: tokens [B·T] (embedding stage), targets [B·T] (head stage), activations
  // from the previous stage (others); and the gradient of its outputs from the next stage
  // (non-head stages), as messages. A CUDA chunk may still be reading a message when the call
  // returns: FinishMessageReads before writing into it again.
  virtual absl::Status SetTokens(int slot, const int32_t* tokens) = 0;
  virtual absl::Status SetTargets(int slot, const int32_t* targets) = 0;
  virtual absl::Status SetInputActivations(int slot, const void* x) = 0;
  virtual absl::Status SetOutputGrad(int slot, const void* dy) = 0;
  virtual absl::Status FinishMessageReads() { return absl::OkStatus(); }
  // A slot's outputs, as messages: activations after Forward (non-head stages), the gradient
  // of its input activations after BackwardInput (non-embedding stages). A message in host
  // memory is complete when the call returns; one in device memory once the event
  // MessageWritten returns next has completed (a CUDA chunk's copy into it is queued on its
  // stream: the send waits for the event on the transport's stream, not the host).
  virtual absl::Status GetOutputActivations(int slot, void* y) = 0;
  virtual absl::Status GetInputGrad(int slot, void* dx) = 0;
  // The event (a cudaEvent_t) recorded after the last GetOutputActivations or GetInputGrad
  // into device memory; null where that message was complete on return (host memory).
  virtual void* MessageWritten() const { return nullptr; }

  // The logits [B × Vp] at sequence position `position` of each of the slot's B sequences,
  // after a Forward (head stage; BackwardInput overwrites them with their gradient).
  virtual absl::Status GetLogitsAt(int slot, int64_t position, float* logits) = 0;

  // GPT2Stage's contract: Forward returns the head's mean loss (else 0); BackwardInput then
  // BackwardWeight; FoldHeadWteGrad once per step after the last BackwardWeight.
  virtual absl::StatusOr<double> Forward(int slot) = 0;
  // A training step's Forward: the head's mean loss stays with the chunk instead of coming
  // back, so that a device is not read (nor waited for) once per micro-batch. TakeLosses
  // returns the sum of the losses kept since it was last called, added in call order from 0
  // (the bits a caller summing Forward's returns gets; 0 without a head), and forgets them.
  // `backward_loss_scale`: the scale of the slot's BackwardInput when one follows before
  // anything reads its logits (as ForwardTraining's), else nullopt.
  virtual absl::Status ForwardKeepingLoss(int slot, std::optional<float> backward_loss_scale) = 0;
  virtual absl::StatusOr<double> TakeLosses() = 0;
  // Returns once the device has finished the work the chunk gave it (the compute calls of a
  // device backend may return once their work is queued; the CPU's have finished).
  virtual absl::Status Drain() = 0;
  // Forward for a slot whose BackwardInput(slot, loss_scale) follows, with this same
  // `loss_scale`, before anything reads its logits: a head may then make the logits gradient in
  // the pass that makes the loss (CUDA's fused classifier), so GetLogitsAt has no logits to give
  // after it. The default is Forward.
  virtual absl::StatusOr<double> ForwardTraining(int slot, float /*loss_scale*/) {
    return Forward(slot);
  }
  virtual absl::Status BackwardInput(int slot, float loss_scale) = 0;
  virtual absl::Status BackwardWeight(int slot) = 0;
  virtual absl::Status ZeroGrads() = 0;
  virtual absl::Status FoldHeadWteGrad() = 0;
  // Makes the head's share of the tied wte gradient in BackwardInput rather than in
  // BackwardWeight, so that a post-validated pipeline can sum the tied gradient once the head's
  // last I is done. The same bits when the head's Is run in its Ws' micro-batch order.
  virtual void SetHeadGradInBackwardInput(bool in_input) = 0;
  // `progress(part)` is called inside BackwardWeight as soon as the call has written its
  // last contribution to a part of the weights: 0 the head's final LayerNorm, 1 + k the k-th
  // of the chunk's blocks counted from its last, num_layers() + 1 the position embedding (wte
  // is never reported: the tied sum still adds to it). A data-parallel bucket starts summing
  // from there (pipeline/grad_buckets.h). Null: not called. CUDA's writes land on its stream
  // after the call returns: it reports a part once its products are queued (HostGrads reads
  // after them on the same stream), and nothing in the first weight gradients after ZeroGrads
  // (their buckets start when the instruction ends).
  virtual void SetWeightGradProgress(std::function<void(int part)> /*progress*/) {}

  // Gradient elements [offset, offset + n) of the stage's buffer in host memory, for a sum
  // across ranks; CommitHostGrads makes the (summed) host copy the gradient again.
  virtual absl::StatusOr<float*> HostGrads(int64_t offset, int64_t n) = 0;
  virtual absl::Status CommitHostGrads(int64_t offset, int64_t n) = 0;
  // The same gradients where they are, for a transport that sums device memory
  // (Transport::CarriesDeviceMemory: NCCL), in place and with no copy through the host: whether
  // the chunk keeps them on a device (the CPU does not: HostGrads then); elements
  // [offset, offset + n) of its buffer there; and an event (a cudaEvent_t) recorded on the
  // chunk's stream after everything it has queued so far (the products that make them, the
  // zeroing DeviceGrads may queue), which the sum's stream waits for. The chunk writes them
  // again only after the caller has seen the sum complete.
  virtual bool GradsOnDevice() const { return false; }
  virtual absl::StatusOr<float*> DeviceGrads(int64_t /*offset*/, int64_t /*n*/) {
    return absl::UnimplementedError(Describe() + " keeps no gradients on a device");
  }
  virtual absl::StatusOr<void*> GradsWritten() {
    return absl::UnimplementedError(Describe() + " keeps no gradients on a device");
  }
  // A V placement's tied sum, its embedding chunk (this one) and head chunk both on this rank:
  // wte's gradient here += `head`'s, then `head`'s becomes the sum (the bits of the two-rank
  // sum, embedding first), on the device where both chunks keep their gradients on the same
  // one (ordered between their streams by events, no copy through the host). Both chunks'
  // GradsWritten then come after all of it, the head's copy of the sum too: a sum in place
  // ordered after this chunk's event never overwrites wte's gradient before the head has
  // copied it. False where this chunk cannot: the caller adds their host copies.
  virtual absl::StatusOr<bool> SumTiedOnDevice(StageModel& /*head*/) { return false; }

  // Σ g² per model unit, in model order: the embedding (wte, wpe), each layer, the final
  // LayerNorm; a head-only stage leaves wte out (the first stage counts the tied matrix once).
  virtual absl::StatusOr<std::vector<double>> GradSquaresByUnit() = 0;
  virtual absl::Status ApplyAdamW(const AdamWStep& step) = 0;

  // fp32 parameters (the master copy), `num_params()`, in the layout's order, and AdamW
  // moments, OptimizerStateElements() each (all of the layout unless sharded): checkpoints and
  // initialisation from a whole model. A chunk that keeps the master of its ZeRO-1 share only
  // (MasterParamElements() < num_params(): bf16 on CUDA) gets that share's master and, elsewhere,
  // the compute copy widened to fp32 (exact: SetParams of it puts back the same chunk); it sets
  // its share's master and the compute copy rounded from all of `src`.
  virtual absl::Status GetParams(float* dst) = 0;
  virtual absl::Status SetParams(const float* src) = 0;
  virtual absl::Status GetOptimizerState(float* m, float* v) = 0;
  virtual absl::Status SetOptimizerState(const float* m, const float* v) = 0;

  // ZeRO-1 (parallel.zero = 1): the chunk keeps AdamW moments only for `ranges`, its share of
  // the data-parallel group's (each range inside one tensor), packed in the ranges' order, and
  // ApplyAdamW steps only them; Get/SetOptimizerState then hold the packed share. The moments
  // it had there are kept. Backends without it refuse.
  virtual absl::Status ShardOptimizerState(std::vector<ParamRange> /*ranges*/) {
    return absl::UnimplementedError(Describe() + " has no sharded optimizer (parallel.zero)");
  }
  // What the chunk holds of the moments: elements of each, and the bytes of both.
  virtual int64_t OptimizerStateElements() const { return num_params(); }
  // The elements of its fp32 master copy the chunk holds: all of them, or under ZeRO-1 where
  // the master is not the weights the forward reads (CUDA in bf16) the share's, the moments'
  // ranges. A checkpoint gathers the others from the share's owners (GetParams).
  virtual int64_t MasterParamElements() const { return num_params(); }
  virtual int64_t OptimizerStateBytes() const {
    return 2 * OptimizerStateElements() * static_cast<int64_t>(sizeof(float));
  }
  // ZeRO-1: the gradient norm's chunk sums (models/grad_norm.h) of the norm chunks inside
  // `ranges` (every chunk wholly in or out), at their places in `partials`
  // (PlanGradNorm(layout()).chunks values; the others left as they are).
  virtual absl::Status ShardGradSquares(const std::vector<ParamRange>& /*ranges*/,
                                        double* /*partials*/) {
    return absl::UnimplementedError(Describe() + " has no sharded gradient norm");
  }
  // ZeRO-1: the stage's units (GradSquaresByUnit's) from every norm chunk's sum (`partials`,
  // PlanGradNorm(layout()).chunks values, the data-parallel group's sum of ShardGradSquares),
  // added in the order this backend's GradSquaresByUnit adds them, so that the norm keeps its
  // bits: models/grad_norm.h's by default.
  virtual absl::StatusOr<std::vector<double>> CombineGradSquares(const double* partials) {
    return UnitsFromChunkSquares(PlanGradNorm(layout()), partials);
  }
  // ZeRO-1's all-gather through host memory: parameter elements [offset, offset + n) in host
  // memory (fp32; a bf16 chunk's compute copy widened); CommitHostParams makes the host copy
  // the parameters again.
  virtual absl::StatusOr<float*> HostParams(int64_t /*offset*/, int64_t /*n*/) {
    return absl::UnimplementedError(Describe() + " has no host parameters");
  }
  virtual absl::Status CommitHostParams(int64_t /*offset*/, int64_t /*n*/) {
    return absl::OkStatus();
  }
  // ZeRO-1 over a transport that carries device memory (GradsOnDevice chunks): the weights
  // the forward reads, [offset, offset + n), where they lie on the device (fp32, or the bf16
  // compute copy, which the owner's step rounded from its fp32 master: what zero = 0 rounds),
  // for the all-gather's broadcasts in place (ordered after GradsWritten, an event after
  // everything the chunk has queued, its step included). Once they have landed (the caller
  // waited for them) they are the chunk's parameters: nothing to commit.
  struct DeviceWeights {
    void* data = nullptr;
    bool bf16 = false;  // else fp32
  };
  virtual absl::StatusOr<DeviceWeights> DeviceParams(int64_t /*offset*/, int64_t /*n*/) {
    return absl::UnimplementedError(Describe() + " keeps no parameters on a device");
  }
  // GPT-2's initialisation, the same values on every backend (GPT2Stage::InitRandom).
  virtual absl::Status InitRandom(uint64_t seed) = 0;
};

}  // namespace freeride
