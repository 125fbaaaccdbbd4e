// The stream-order hazards of a CUDA chunk's device messages that no pipeline run can show (the
// pipeline's own order hides them: docs/training.md#over-nccl), each on one chunk behind copies
// made deliberately late (emu::SetDeviceCopyDelay), so that the wait that guards it is the only
// thing between the chunk and the wrong values.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "models/cuda/cuda_stage_model.h"
#include "models/cuda/emulation/runtime.h"

namespace freeride {
namespace {

constexpr int64_t kB = 2, kT = 8;

// A middle stage (no embedding, no head): it takes activations and gives activations.
std::unique_ptr<CudaStageModel> MiddleChunk() {
  const GPT2Config config = *MakeGPT2Config(4, 2, 16, kT, 64);
  auto chunk = CudaStageModel::Create(config, StageSpec{1, 3, false, false}, kB, kT, 1, {});
  EXPECT_TRUE(chunk.ok()) << chunk.status();
  if (!chunk.ok()) return nullptr;
  EXPECT_TRUE((*chunk)->InitRandom(5).ok());
  return *std::move(chunk);
}

// The chunk's output activations for the message `x` (device memory) handed to it: read back
// once the chunk's stream has run.
std::vector<float> Output(CudaStageModel& chunk, void* x, void* y) {
  EXPECT_TRUE(chunk.SetInputActivations(0, x).ok());
  EXPECT_TRUE(chunk.Forward(0).ok());
  EXPECT_TRUE(chunk.GetOutputActivations(0, y).ok());
  EXPECT_TRUE(chunk.Drain().ok());
  std::vector<float> out(chunk.MessageElements());
  EXPECT_EQ(cudaMemcpy(out.data(), y, chunk.MessageBytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

// A received message's buffer is written again (the next step's receive into it) only once the
// chunk's copy out of it has run: FinishMessageReads waits for it. Here the copy out comes
// late and the host rewrites the buffer right after FinishMessageReads; the chunk still sees
// the message it was handed. Caught here, and nowhere else, when FinishMessageReads returns
// without waiting (CudaStage::FinishMessageReads): in a pipeline the next message into a
// buffer comes after the chunk has sent on what it computed from the last (the step's sends
// are waited for), which its stream does after the copy.
TEST(MessageHazardsTest, FinishMessageReadsWaitsForTheCopyOutOfAReceivedMessage) {
  std::unique_ptr<CudaStageModel> chunk = MiddleChunk();
  ASSERT_NE(chunk, nullptr);
  absl::StatusOr<MessageBuffer> x = chunk->AllocateMessageBuffer(MessageMemory::kDevice);
  absl::StatusOr<MessageBuffer> y = chunk->AllocateMessageBuffer(MessageMemory::kDevice);
  ASSERT_TRUE(x.ok() && y.ok());
  std::vector<float> message(chunk->MessageElements()), other(message.size(), 7.0f);
  for (size_t i = 0; i < message.size(); ++i) message[i] = 0.01f * static_cast<float>(i % 97);
  ASSERT_EQ(cudaMemcpy(x->get(), message.data(), chunk->MessageBytes(), cudaMemcpyHostToDevice),
            cudaSuccess);
  const std::vector<float> expected = Output(*chunk, x->get(), y->get());

  emu::SetDeviceCopyDelay(0.05);
  ASSERT_TRUE(chunk->SetInputActivations(0, x->get()).ok());
  ASSERT_TRUE(chunk->FinishMessageReads().ok());
  // The next message lands (the legacy stream does not wait for the chunk's nonblocking one).
  ASSERT_EQ(cudaMemcpy(x->get(), other.data(), chunk->MessageBytes(), cudaMemcpyHostToDevice),
            cudaSuccess);
  emu::SetDeviceCopyDelay(0);
  ASSERT_TRUE(chunk->Forward(0).ok());
  ASSERT_TRUE(chunk->GetOutputActivations(0, y->get()).ok());
  ASSERT_TRUE(chunk->Drain().ok());
  std::vector<float> got(message.size());
  ASSERT_EQ(cudaMemcpy(got.data(), y->get(), chunk->MessageBytes(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(got, expected) << "the chunk read a message rewritten after FinishMessageReads";
}

// A message the chunk writes into device memory is complete once MessageWritten's event has
// completed, not when GetOutputActivations returns (no host wait there): the transport's stream
// waits for the event before it sends. Behind a late copy, the buffer still holds the old
// values when the call returns, and the new ones once the event has completed.
TEST(MessageHazardsTest, ADeviceMessageIsWrittenWhenItsEventCompletes) {
  std::unique_ptr<CudaStageModel> chunk = MiddleChunk();
  ASSERT_NE(chunk, nullptr);
  absl::StatusOr<MessageBuffer> x = chunk->AllocateMessageBuffer(MessageMemory::kDevice);
  absl::StatusOr<MessageBuffer> y = chunk->AllocateMessageBuffer(MessageMemory::kDevice);
  ASSERT_TRUE(x.ok() && y.ok());
  std::vector<float> message(chunk->MessageElements(), 0.5f), stale(message.size(), -3.0f);
  ASSERT_EQ(cudaMemcpy(x->get(), message.data(), chunk->MessageBytes(), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(y->get(), stale.data(), chunk->MessageBytes(), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_TRUE(chunk->SetInputActivations(0, x->get()).ok());
  ASSERT_TRUE(chunk->Forward(0).ok());
  ASSERT_TRUE(chunk->Drain().ok());
  emu::SetDeviceCopyDelay(0.05);
  ASSERT_TRUE(chunk->GetOutputActivations(0, y->get()).ok());
  emu::SetDeviceCopyDelay(0);
  void* written = chunk->MessageWritten();
  ASSERT_NE(written, nullptr) << "a message into device memory has an event to wait for";
  std::vector<float> got(message.size());
  // A host read from a nonblocking stream's buffer does not wait for it: the old values.
  ASSERT_EQ(cudaMemcpy(got.data(), y->get(), chunk->MessageBytes(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(got, stale);
  ASSERT_EQ(cudaEventSynchronize(static_cast<cudaEvent_t>(written)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got.data(), y->get(), chunk->MessageBytes(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_NE(got, stale);
  // A message into pinned host memory is complete on return: no event.
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, chunk->MessageBytes()), cudaSuccess);
  ASSERT_TRUE(chunk->GetOutputActivations(0, pinned).ok());
  EXPECT_EQ(chunk->MessageWritten(), nullptr);
  EXPECT_EQ(
      std::vector<float>(static_cast<float*>(pinned), static_cast<float*>(pinned) + message.size()),
      got);
  cudaFreeHost(pinned);
}

// A V placement's tied sum on one rank (StageModel::SumTiedOnDevice): the embedding chunk adds
// the head's share into its wte gradient, and the head's stream copies the sum back. What writes
// the embedding's gradient next, ordered only after the embedding chunk's GradsWritten (the
// data-parallel sum in place, on its communicator's stream), must not overtake that copy back,
// which reads it. Here the copy back comes late and a write on a stream of its own follows
// GradsWritten, as that sum does; the head still gets the tied sum. Fails when the embedding
// chunk's stream does not wait for the copy back (CudaStage::SumTiedOnDevice): the head then
// copies what the write left, the intermittent dualpipev loss of
// NcclPipelineTest.TwoStagesTwoReplicas* (issue 50).
TEST(MessageHazardsTest, TheTiedSumIsCopiedToTheHeadBeforeTheEmbeddingGradientIsWrittenAgain) {
  const GPT2Config config = *MakeGPT2Config(4, 2, 16, kT, 64);
  auto embedding = CudaStageModel::Create(config, StageSpec{0, 2, true, false}, kB, kT, 1, {});
  auto head = CudaStageModel::Create(config, StageSpec{2, 4, false, true}, kB, kT, 1, {});
  ASSERT_TRUE(embedding.ok() && head.ok());
  const int64_t n = TiedElements(config);
  const int64_t mine = (*embedding)->layout().slot(ParamTensor::kWte).offset;
  const int64_t theirs = (*head)->layout().slot(ParamTensor::kWte).offset;
  // Each chunk's share of wte's gradient: 1 in the embedding's, 2 in the head's.
  for (auto [chunk, offset, value] :
       {std::tuple{embedding->get(), mine, 1.0f}, std::tuple{head->get(), theirs, 2.0f}}) {
    ASSERT_TRUE(chunk->ZeroGrads().ok());
    absl::StatusOr<float*> grads = chunk->HostGrads(offset, n);
    ASSERT_TRUE(grads.ok()) << grads.status();
    std::fill(*grads, *grads + n, value);
    ASSERT_TRUE(chunk->CommitHostGrads(offset, n).ok());
  }
  emu::SetDeviceCopyDelay(0.05);
  absl::StatusOr<bool> summed = (*embedding)->SumTiedOnDevice(**head);
  emu::SetDeviceCopyDelay(0);
  ASSERT_TRUE(summed.ok()) << summed.status();
  ASSERT_TRUE(*summed) << "two CUDA chunks on one device sum on it";
  absl::StatusOr<float*> grads = (*embedding)->DeviceGrads(mine, n);
  absl::StatusOr<void*> written = (*embedding)->GradsWritten();
  ASSERT_TRUE(grads.ok() && written.ok());
  cudaStream_t next = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&next, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(next, static_cast<cudaEvent_t>(*written), 0), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(*grads, 0, n * sizeof(float), next), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(next), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(next), cudaSuccess);
  ASSERT_TRUE((*head)->Drain().ok() && (*embedding)->Drain().ok());
  absl::StatusOr<float*> head_grads = (*head)->HostGrads(theirs, n);
  ASSERT_TRUE(head_grads.ok()) << head_grads.status();
  EXPECT_EQ(std::vector<float>(*head_grads, *head_grads + n), std::vector<float>(n, 3.0f))
      << "the head's wte gradient is not the tied sum";
}

}  // namespace
}  // namespace freeride
