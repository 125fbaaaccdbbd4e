#include "trainer/trainer.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/device.h"
#include "core/files.h"
#include "core/json_string.h"
#include "core/logging.h"
#include "core/status.h"
#include "core/timer.h"
#include "models/backend.h"
#include "models/grad_norm.h"
#include "models/llmc_checkpoint.h"
#include "pipeline/passes.h"
#include "trainer/checkpoint_manifest.h"
#include "trainer/jobs/job_runner.h"
#include "trainer/memory_report.h"
#include "trainer/pipeline_plan.h"
#include "trainer/run_dir.h"
#include "trainer/train_state.h"
#include "trainer/trainer_setup.h"
#include "trainer/transport_choice.h"

namespace freeride {
namespace {

absl::Status CheckAgrees(const Config& config, const std::string& key, int64_t configured,
                         int64_t from_checkpoint, const std::string& path) {
  if (!config.explicit_keys.count(key) || configured == from_checkpoint) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s = %d in the config, but the checkpoint %s (model.init_from) has %d: remove the key "
      "or make them agree",
      key, configured, path, from_checkpoint));
}

// Token ids at or above the vocabulary would index past the embedding: refused before
// training starts, naming the data.
absl::Status CheckVocabulary(const TokenLoader& loader, int64_t vocab_size) {
  if (loader.max_token() < vocab_size) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s holds token %d but model.vocab_size is %d", absl::StrJoin(loader.files(), ", "),
      loader.max_token(), vocab_size));
}

}  // namespace

absl::StatusOr<GPT2Config> ResolveModelConfig(const Config& config) {
  const ModelConfig& m = config.model;
  if (m.init_from.empty()) {
    if (m.arch == "llama") {
      const int64_t ffn = m.ffn_hidden > 0
                              ? m.ffn_hidden
                              : LlamaFfnHidden(m.n_embd, m.ffn_multiplier, m.multiple_of);
      return MakeLlamaConfig(m.n_layer, m.n_head, m.n_kv_head == 0 ? m.n_head : m.n_kv_head,
                             m.n_embd, m.max_seq_len, m.vocab_size, ffn, m.rope_theta, m.norm_eps,
                             m.tie_embeddings);
    }
    return MakeGPT2Config(m.n_layer, m.n_head, m.n_embd, m.max_seq_len, m.vocab_size);
  }
  absl::StatusOr<GPT2Config> c = ReadLlmcModelConfig(m.init_from);
  if (!c.ok()) return c.status();
  if (config.explicit_keys.count("model.arch") && m.arch != ModelArchName(c->arch)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model.arch = \"%s\" in the config, but the checkpoint %s (model.init_from) is \"%s\": "
        "remove the key or make them agree",
        m.arch, m.init_from, ModelArchName(c->arch)));
  }
  for (const auto& [key, configured, actual] :
       {std::tuple{"model.n_layer", m.n_layer, c->n_layer},
        std::tuple{"model.n_head", m.n_head, c->n_head},
        std::tuple{"model.n_embd", m.n_embd, c->n_embd},
        std::tuple{"model.max_seq_len", m.max_seq_len, c->max_seq_len},
        std::tuple{"model.vocab_size", m.vocab_size, c->vocab_size}}) {
    if (absl::Status s = CheckAgrees(config, key, configured, actual, m.init_from); !s.ok()) {
      return s;
    }
  }
  return c;
}

absl::Status CheckWorldSize(const Config& config, int world_size) {
  const int64_t pp = config.parallel.pp, dp = config.parallel.dp;
  if (pp * dp == world_size) return absl::OkStatus();
  std::vector<std::string> fits;
  for (int64_t p = 1; p <= world_size; ++p) {
    if (world_size % p == 0 && p <= config.model.n_layer) {
      fits.push_back(absl::StrFormat("pp=%d dp=%d", p, world_size / p));
    }
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "%d ranks, but parallel.pp × parallel.dp = %d × %d = %d; with %d ranks these fit: %s "
      "(or launch %d ranks)",
      world_size, pp, dp, pp * dp, world_size, absl::StrJoin(fits, ", "), pp * dp));
}

Trainer::Trainer(const Config& config) : config_(config) {}
// Before the chunks free their device memory, which waits for every stream of the device.
Trainer::~Trainer() {
  if (transport_ != nullptr) transport_->AbortInFlight();
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const Config& config,
                                                         pipeline::Transport* transport,
                                                         Clock* clock) {
  if (config.runtime.threads > 0) {
    omp_set_num_threads(static_cast<int>(config.runtime.threads));
    openblas_set_num_threads(static_cast<int>(config.runtime.threads));
  }
  // The process before its model: the first trainer of a process measures it.
  ProcessBaselineBytes();
  std::unique_ptr<Trainer> t(new Trainer(config));
  t->clock_ = clock;
  const bool simulated = ClockOr(clock).simulated();
  const bool emulate = config.runtime.emulate_peers;
  const TrainConfig& tc = config.train;
  const BackendOptions backend{
      config.runtime.device,    config.runtime.precision, GpuOf(config),
      config.runtime.fuse_gelu, config.runtime.attention, config.runtime.kernels};
  // The phases (trainer_setup.h), each from what the ones before it made.
  FR_ASSIGN_OR_RETURN(t->layout_, RankPhase(config, transport));
  pipeline::RankLayout& L = t->layout_;
  FR_ASSIGN_OR_RETURN(t->model_config_, ModelPhase(config));
  const GPT2Config& model = t->model_config_;
  FR_ASSIGN_OR_RETURN(const std::optional<PartCosts> part_costs,
                      PartCostsPhase(config, model, backend, L, transport, simulated));
  const bool leader = emulate || transport == nullptr || transport->rank() == 0;
  FR_ASSIGN_OR_RETURN(PipelineSetup pipeline,
                      PipelinePhase(config, model, part_costs, backend, &L, simulated, leader));
  t->flops_per_token_ = TrainingFlopsPerTokenWithRecompute(config, model, pipeline.plan);
  if (emulate) t->emulation_cost_ = pipeline.cost;
  t->schedule_seconds_per_ms_ = pipeline.cost_in_ms ? 1e-3 : 0.0;
  FR_ASSIGN_OR_RETURN(t->own_transport_,
                      TransportPhase(config, transport, pipeline, L, backend, clock));
  if (t->own_transport_ != nullptr) transport = t->own_transport_.get();
  t->transport_ = transport;
  const pipeline::Schedule& schedule = pipeline.schedule;
  const int slots = std::max(1, schedule.buffers_per_stage[L.stage]);
  const std::vector<StageSpec> own_specs = OwnChunkSpecs(pipeline, L);
  // A transport given to a CPU run is MPI's (`freeride train` under mpirun).
  FR_RETURN_IF_ERROR(t->PlanMemory(pipeline.plan, schedule, t->own_transport_ == nullptr,
                                   transport != nullptr && transport->CarriesDeviceMemory()));
  t->checkpoint_dir_ = CheckpointDirOf(config);
  // Only found at the first checkpoint otherwise, after the training it was meant to keep.
  if (!emulate && L.replica == 0) {
    FR_RETURN_IF_ERROR(CheckWritableDirectory(
        t->checkpoint_dir_, config.checkpoint.dir.empty() ? "run.dir" : "checkpoint.dir"));
  }
  // Over NCCL the executors' messages live on the chunks' device: counted in its memory check.
  std::vector<int64_t> device_messages(own_specs.size(), 0);
  if (transport != nullptr && transport->CarriesDeviceMemory()) {
    const pipeline::Schedule eval = ForwardOnlySchedule(schedule);
    for (int c = 0; c < static_cast<int>(own_specs.size()); ++c) {
      device_messages[c] =
          pipeline::StageExecutor::MessageBuffersOf(schedule.per_stage[L.stage], c) +
          (config.data.val.empty()
               ? 0
               : pipeline::StageExecutor::MessageBuffersOf(eval.per_stage[L.stage], c));
    }
  }
  FR_ASSIGN_OR_RETURN(t->chunks_,
                      StageModelsPhase(config, model, backend, L, own_specs, slots, device_messages,
                                       transport != nullptr && transport->CarriesDeviceMemory()));
  std::vector<StageModel*> raw;
  for (const std::unique_ptr<StageModel>& chunk : t->chunks_) raw.push_back(chunk.get());
  Trainer* self = t.get();
  Executors executors = ExecutorPhase(
      config, pipeline, L, raw, transport,
      pipeline::OptimizerHooks{[self] { return self->GradientUnits(); },
                               [self](const std::vector<double>& units, bool loss_finite) {
                                 return self->OptimizerStep(units, loss_finite);
                               },
                               [self] { return self->KeepBackup(); },
                               [self](const std::vector<double>& own, bool loss_finite) {
                                 return self->WillSpeculate(own, loss_finite);
                               },
                               [self] { return self->Speculate(); }},
      clock);
  t->executor_ = std::move(executors.train);
  t->eval_executor_ = std::move(executors.eval);
  if (t->executor_->zero()) {
    // ZeRO-1: each chunk keeps the moments of this rank's share only (a resume below fills
    // them): a CUDA chunk was made so (StageModelsPhase) and confirms the share here.
    for (int c = 0; c < L.chunks; ++c) {
      FR_RETURN_IF_ERROR(t->chunks_[c]->ShardOptimizerState(t->executor_->buckets()->owned(c)));
    }
  }
  t->IndexBubbles();

  // The global batch: dp replicas × batch_size sequences, replica r taking its own rows.
  FR_ASSIGN_OR_RETURN(t->train_,
                      TokenLoader::Open(config.data.train, tc.batch_size * L.dp, tc.seq_len,
                                        config.data.shuffle, config.run.seed));
  FR_RETURN_IF_ERROR(CheckVocabulary(*t->train_, model.vocab_size));
  if (!config.data.val.empty()) {
    FR_ASSIGN_OR_RETURN(
        t->val_, TokenLoader::Open(config.data.val, tc.batch_size * L.dp, tc.seq_len, false, 0));
    FR_RETURN_IF_ERROR(CheckVocabulary(*t->val_, model.vocab_size));
  }
  t->inputs_.resize(tc.batch_size * L.dp * tc.seq_len);
  t->targets_.resize(tc.batch_size * L.dp * tc.seq_len);
  if (!config.checkpoint.resume.empty()) {
    FR_ASSIGN_OR_RETURN(const std::string path,
                        ResolveCheckpoint(config.checkpoint.resume, t->checkpoint_dir_));
    FR_RETURN_IF_ERROR(t->Resume(path));
  }
  FR_RETURN_IF_ERROR(t->CreateSideTasks());
  FR_RETURN_IF_ERROR(t->CreateJobRunner());
  return t;
}

absl::Status Trainer::PlanMemory(const PipelinePlan& plan, const pipeline::Schedule& schedule,
                                 bool mpi, bool device_transport) {
  MemoryFacts facts;
  facts.baseline_bytes = ProcessBaselineBytes();
  facts.baseline_source = "this process's resident set before its model";
  FindDeviceMemory(config_, &facts);
  const bool cuda = config_.runtime.device == "cuda";
  facts.sharing = cuda || config_.runtime.emulate_peers ? 1 : NodeLocalSize();
  facts.mpi = mpi;
  facts.device_transport = device_transport;
  memory_plans_.clear();
  for (int s = 0; s < layout_.pp; ++s) {
    FR_ASSIGN_OR_RETURN(RankMemoryPlan stage, PlanRankMemory(config_, model_config_, plan, schedule,
                                                             s, layout_.replica, facts));
    memory_plans_.push_back(std::move(stage));
  }
  const RankMemoryPlan& own = memory_plans_[layout_.stage];
  FR_LOG(INFO) << absl::StrFormat(
      "memory plan of stage %d: training's peak %s on the %s (%s %s, %s allocated); side "
      "work %s (%s, %s)",
      layout_.stage, FormatBytes(own.peak_bytes), cuda ? "GPU" : "host",
      FormatBytes(own.baseline_bytes),
      cuda ? "kept for kernels and libraries" : "the process before its model",
      FormatBytes(own.peak_bytes - own.baseline_bytes),
      own.device_bytes > 0 ? FormatBytes(own.side_bytes) : "unknown", DescribeSideRoom(own),
      facts.device_source);
  FR_RETURN_IF_ERROR(CheckDevicePlan(own, facts.device_source));
  // The baseline is resident already: only what is still to be allocated must fit.
  absl::Status s = CheckHostMemoryPlan(own.host_buffers, AvailableHostMemory(),
                                       config_.runtime.emulate_peers ? 1 : NodeLocalSize());
  if (s.ok()) return s;
  return absl::ResourceExhaustedError(absl::StrFormat(
      "%s; lower train.batch_size or train.seq_len, raise train.microbatches, or spread the "
      "model over more stages",
      s.message()));
}

pipeline::MicrobatchData Trainer::Microbatches() const {
  const int64_t rows = chunks_[0]->micro_batch() * config_.train.seq_len;
  const int64_t replica_offset = layout_.replica * config_.train.batch_size * config_.train.seq_len;
  pipeline::MicrobatchData data;
  data.rows = rows;
  data.tokens = [this, rows, replica_offset](int mb) {
    return inputs_.data() + replica_offset + mb * rows;
  };
  data.targets = [this, rows, replica_offset](int mb) {
    return targets_.data() + replica_offset + mb * rows;
  };
  return data;
}

absl::StatusOr<std::vector<double>> Trainer::GradientUnits() {
  // Gradient squares per model unit (embedding, layers, final LayerNorm) at their places in
  // the whole model: every stage fills its own, the sum over the pipeline adds zeros
  // elsewhere (exact), and the units are added in model order, as one process would.
  // ZeRO-1: each rank makes the norm's chunk sums of its share, the data-parallel group sums
  // them (each has one owner: exact) and every rank adds them up in the one fixed order of its
  // backend's unsharded norm (StageModel::CombineGradSquares): the bits of that norm.
  const int64_t L = model_config_.n_layer;
  std::vector<double> units(L + 2, 0.0);
  std::vector<std::vector<double>> stage_units(chunks_.size());
  if (executor_->zero()) {
    std::vector<NormPlan> plans;
    std::vector<int64_t> first;
    int64_t chunks = 0;
    for (const auto& chunk : chunks_) {
      plans.push_back(PlanGradNorm(chunk->layout()));
      first.push_back(chunks);
      chunks += plans.back().chunks;
    }
    std::vector<double> partials(chunks, 0.0);
    for (size_t c = 0; c < chunks_.size(); ++c) {
      if (absl::Status s = chunks_[c]->ShardGradSquares(executor_->buckets()->owned(c),
                                                        partials.data() + first[c]);
          !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = transport_->AllReduceSum(
            partials.data(), chunks, layout_.DataParallelGroup(), config_.runtime.comm_timeout_s);
        !s.ok()) {
      return s;
    }
    for (size_t c = 0; c < chunks_.size(); ++c) {
      absl::StatusOr<std::vector<double>> own =
          chunks_[c]->CombineGradSquares(partials.data() + first[c]);
      if (!own.ok()) return own.status();
      stage_units[c] = *std::move(own);
    }
  } else {
    for (size_t c = 0; c < chunks_.size(); ++c) {
      absl::StatusOr<std::vector<double>> squares = chunks_[c]->GradSquaresByUnit();
      if (!squares.ok()) return squares.status();
      stage_units[c] = *std::move(squares);
    }
  }
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const StageModel* chunk = chunks_[c].get();
    const std::vector<double>& own = stage_units[c];
    size_t k = 0;
    if (chunk->stage().has_embedding) units[0] = own[k++];
    for (int64_t l = chunk->stage().first_layer; l < chunk->stage().last_layer; ++l) {
      units[1 + l] = own[k++];
    }
    if (chunk->stage().has_head) units[L + 1] = own[k++];
  }
  return units;
}

absl::Status Trainer::OptimizerStep(const std::vector<double>& units, bool loss_finite) {
  double squares = 0;
  for (double u : units) squares += u;
  last_grad_norm_ = std::sqrt(squares);
  last_lr_ = LearningRate(config_.optim, step_, config_.train.steps);
  // A NaN or infinity would reach every weight through AdamW's moments: such a step is never
  // applied (every rank sees the same summed norm and loss flag, so all of them skip it).
  last_applied_ = loss_finite && std::isfinite(last_grad_norm_);
  if (!last_applied_) return absl::OkStatus();
  return ApplyUpdate(step_ + 1, ClipScale(last_grad_norm_, config_.optim.grad_clip));
}

absl::StatusOr<double> Trainer::Evaluate() {
  if (!val_) return NAN;
  if (absl::Status s = CompleteParams(); !s.ok()) return s;
  val_->Reset();
  double loss = 0;
  for (int64_t b = 0; b < config_.eval.batches; ++b) {
    val_->Next(inputs_.data(), targets_.data());
    absl::StatusOr<pipeline::StepOutcome> outcome = eval_executor_->RunStep(Microbatches(), 0);
    if (!outcome.ok()) return outcome.status();
    loss += outcome->loss;
  }
  return loss / static_cast<double>(config_.eval.batches);
}

absl::Status Trainer::Barrier() {
  double token[1] = {0};
  return transport_->AllReduceSum(token, 1, transport_->AllRanks(),
                                  config_.runtime.comm_timeout_s);
}

void Trainer::WriteMetric(const std::string& json) {
  if (metrics_.is_open()) metrics_ << json << "\n" << std::flush;
  if (tensorboard_) {
    if (absl::Status s = tensorboard_->AddRows(json); !s.ok()) {
      // metrics.jsonl holds every value still: the training goes on without the event files.
      FR_LOG(WARN) << "run.tensorboard: " << s << "; no more TensorBoard scalars in this run";
      tensorboard_.reset();
    }
  }
}

void Trainer::RecordEnd(const absl::Status& status) {
  if (!leader()) return;
  const char* state = status.ok() ? "finished" : absl::IsCancelled(status) ? "stopped" : "failed";
  WriteMetric(
      absl::StrFormat("{\"kind\": \"end\", \"step\": %d, \"time\": \"%s\", \"status\": \"%s\", "
                      "\"reason\": %s}",
                      step_, Iso8601Utc(std::chrono::system_clock::now()), state,
                      JsonString(status.ok() ? "" : status.message())));
  FR_LOG(PROGRESS) << "to look at this run: freeride report " << config_.run.dir;
}

}  // namespace freeride
