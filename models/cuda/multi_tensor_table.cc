#include "models/cuda/multi_tensor_table.h"

#include <algorithm>

#include "models/gpt2_config.h"
#include "models/grad_norm.h"

namespace freeride::cuda {
namespace {

// Cuts elements [offset, offset + n) of tensor `t` into chunks for `unit`.
void AddTensor(ParamTensor t, int64_t offset, int64_t n, int32_t unit,
               std::vector<TensorChunk>* chunks) {
  for (int64_t done = 0; done < n; done += kChunkElements) {
    TensorChunk c;
    c.offset = offset + done;
    c.moment_offset = c.offset;
    c.elements = static_cast<int32_t>(std::min(kChunkElements, n - done));
    c.unit = unit;
    c.decayed = IsDecayed(t) ? 1 : 0;
    chunks->push_back(c);
  }
}

}  // namespace

int64_t NumGradNormUnits(const StageSpec& stage) {
  return (stage.has_embedding ? 1 : 0) + stage.num_layers() + (stage.has_head ? 1 : 0);
}

MultiTensorTable MakeMultiTensorTable(const ParamLayout& layout) {
  const StageSpec& st = layout.stage;
  MultiTensorTable table;
  std::vector<TensorChunk>& chunks = table.chunks;
  auto whole = [&](ParamTensor t, int32_t unit) {
    AddTensor(t, layout.slot(t).offset, layout.slot(t).elements, unit, &chunks);
  };
  int32_t unit = 0;
  auto begin_unit = [&] { table.unit_begin.push_back(static_cast<int32_t>(chunks.size())); };
  if (st.has_embedding) {
    begin_unit();
    whole(ParamTensor::kWte, unit);
    whole(ParamTensor::kWpe, unit);
    ++unit;
  }
  for (int64_t l = 0; l < st.num_layers(); ++l, ++unit) {
    begin_unit();
    for (int i = 0; i < kNumParamTensors; ++i) {
      const ParamTensor t = static_cast<ParamTensor>(i);
      if (!IsPerLayer(t)) continue;
      const int64_t n = ParamElements(layout.config, t);
      AddTensor(t, layout.slot(t).offset + l * n, n, unit, &chunks);
    }
  }
  if (st.has_head) {
    begin_unit();
    whole(ParamTensor::kLnfW, unit);
    whole(ParamTensor::kLnfB, unit);
    whole(ParamTensor::kLmHead, unit);  // an untied Llama head's (none in GPT-2)
    ++unit;
  }
  table.unit_begin.push_back(static_cast<int32_t>(chunks.size()));
  if (st.has_head && !st.has_embedding) whole(ParamTensor::kWte, -1);
  return table;
}

std::vector<TensorChunk> MakeShareTable(const ParamLayout& layout,
                                        const std::vector<ParamRange>& ranges) {
  std::vector<TensorChunk> chunks;
  int64_t packed = 0;
  for (const ParamRange& r : ranges) {
    // The tensor it lies in (the caller checked it lies in one: TensorAt), for its decay.
    ParamTensor tensor = ParamTensor::kWte;
    for (const TensorSlot& slot : layout.slots) {
      if (slot.present && slot.offset <= r.offset && r.offset < slot.offset + slot.elements) {
        tensor = slot.tensor;
      }
    }
    const size_t first = chunks.size();
    AddTensor(tensor, r.offset, r.n, -1, &chunks);
    for (size_t i = first; i < chunks.size(); ++i) {
      chunks[i].moment_offset = packed + (chunks[i].offset - r.offset);
    }
    packed += r.n;
  }
  return chunks;
}

int64_t ShareTableChunks(const std::vector<ParamRange>& ranges) {
  int64_t chunks = 0;
  for (const ParamRange& r : ranges) chunks += (r.n + kChunkElements - 1) / kChunkElements;
  return chunks;
}

int64_t NumTensorChunks(const ParamLayout& layout) {
  return static_cast<int64_t>(MakeMultiTensorTable(layout).chunks.size());
}

}  // namespace freeride::cuda
