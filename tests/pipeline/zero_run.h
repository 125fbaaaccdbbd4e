// ZeRO-1's training harness, shared by the CPU's tests (tests/pipeline/zero_train_test.cc)
// and the CUDA emulation's (tests/emulation/zero_cuda_test.cc): a run's losses, norms, every
// rank's parameters and moments (at their places in the chunk) as bits, ranks as threads over
// the in-process transport (host sums in rank order, as MPI's at dp 2), and the comparison of
// a sharded run with the unsharded one.
#pragma once

#include <bit>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "models/stage_message.h"
#include "tests/pipeline/train_parity.h"

namespace freeride::testing {

struct ZeroRun {
  std::vector<uint64_t> losses, norms;  // bit patterns
  std::vector<bool> applied;
  std::vector<double> norm_values;
  std::vector<std::vector<uint32_t>> params;  // per rank, every chunk's
  // Per rank, parallel to params: whether the value is the fp32 master's (else the chunk keeps
  // its share's master only, and it is the bf16 compute copy widened: GetParams).
  std::vector<std::vector<bool>> master;
  // Per rank: each chunk's moments at their places in the chunk (element → m, v bits); a
  // ZeRO-1 rank's hold its share only.
  std::vector<std::map<std::pair<int, int64_t>, std::pair<uint32_t, uint32_t>>> moments;
  std::vector<int64_t> moment_bytes;  // per rank, what its chunks hold
};

// `gpu_per_rank`: rank r on CUDA device r (runtime.gpu), as each rank of mpirun takes its own.
// With `over`, each rank trains on the transport it makes over the in-process one.
inline ZeroRun Train(const Config& config, int steps = 5, bool gpu_per_rank = false,
                     const TransportOver& over = nullptr) {
  const int world = static_cast<int>(config.parallel.pp * config.parallel.dp);
  auto transports = pipeline::MakeInProcessWorld(world);
  ZeroRun run;
  run.params.resize(world);
  run.master.resize(world);
  run.moments.resize(world);
  run.moment_bytes.resize(world);
  std::vector<std::string> failures(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      Config mine = config;
      if (gpu_per_rank) mine.runtime.gpu = r;
      std::unique_ptr<pipeline::Transport> wrapped;
      if (over) {
        auto made = over(*transports[r]);
        if (!made.ok()) {
          failures[r] = std::string(made.status().message());
          return;
        }
        wrapped = *std::move(made);
      }
      auto trainer = Trainer::Create(mine, over ? wrapped.get() : transports[r].get());
      if (!trainer.ok()) {
        failures[r] = std::string(trainer.status().message());
        return;
      }
      if ((*trainer)->executor().buckets() != nullptr) {
        (*trainer)->executor().set_verify_buckets(true);
      }
      for (int i = 0; i < steps; ++i) {
        absl::StatusOr<StepStats> s = (*trainer)->Step();
        if (!s.ok()) {
          failures[r] = std::string(s.status().message());
          return;
        }
        if (r == 0) {
          run.losses.push_back(std::bit_cast<uint64_t>(s->loss));
          run.norms.push_back(std::bit_cast<uint64_t>(s->grad_norm));
          run.norm_values.push_back(s->grad_norm);
          run.applied.push_back(s->applied);
        }
      }
      const pipeline::StageExecutor& executor = (*trainer)->executor();
      for (int c = 0; c < (*trainer)->num_chunks(); ++c) {
        StageModel& chunk = (*trainer)->model(c);
        std::vector<float> p(chunk.num_params());
        EXPECT_TRUE(chunk.GetParams(p.data()).ok());
        for (float x : p) run.params[r].push_back(std::bit_cast<uint32_t>(x));
        const bool whole_master = chunk.MasterParamElements() == chunk.num_params();
        const size_t first = run.master[r].size();
        run.master[r].resize(first + p.size(), whole_master);
        if (!whole_master) {
          int64_t held_master = 0;
          for (const ParamRange& range : executor.buckets()->owned(c)) {
            std::fill_n(run.master[r].begin() + first + range.offset, range.n, true);
            held_master += range.n;
          }
          EXPECT_EQ(held_master, chunk.MasterParamElements()) << "rank " << r << " chunk " << c;
        }
        const int64_t held = chunk.OptimizerStateElements();
        std::vector<float> m(held), v(held);
        EXPECT_TRUE(chunk.GetOptimizerState(m.data(), v.data()).ok());
        std::vector<ParamRange> places = {{0, chunk.num_params()}};
        if (executor.zero()) places = executor.buckets()->owned(c);
        int64_t at = 0;
        for (const ParamRange& range : places) {
          for (int64_t i = 0; i < range.n; ++i, ++at) {
            run.moments[r][{c, range.offset + i}] = {std::bit_cast<uint32_t>(m[at]),
                                                     std::bit_cast<uint32_t>(v[at])};
          }
        }
        EXPECT_EQ(at, held) << "rank " << r << " chunk " << c;
        run.moment_bytes[r] += chunk.OptimizerStateBytes();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
  return run;
}

// `sharded` trained the bits of `whole`, and each of its ranks holds the unsharded moments at
// exactly its share's places, the shares of a stage's replicas covering the stage once.
inline void ExpectSameBits(const ZeroRun& sharded, const ZeroRun& whole, int pp) {
  EXPECT_EQ(sharded.losses, whole.losses);
  EXPECT_EQ(sharded.norms, whole.norms);
  EXPECT_EQ(sharded.applied, whole.applied);
  ASSERT_EQ(sharded.params.size(), whole.params.size());
  for (size_t r = 0; r < whole.params.size(); ++r) {
    // Where the sharded rank keeps no fp32 master, its weights are the bf16 rounding of the
    // unsharded master (widened): what zero = 0's compute copy holds.
    ASSERT_EQ(sharded.params[r].size(), whole.params[r].size());
    std::vector<uint32_t> expected = whole.params[r];
    for (size_t i = 0; i < expected.size(); ++i) {
      ASSERT_TRUE(whole.master[r][i]);
      if (!sharded.master[r][i]) {
        expected[i] = std::bit_cast<uint32_t>(
            FloatOfBf16(Bf16Bits(std::bit_cast<float>(whole.params[r][i]))));
      }
    }
    EXPECT_TRUE(sharded.params[r] == expected) << "rank " << r << "'s parameters differ";
    EXPECT_LT(sharded.moment_bytes[r], whole.moment_bytes[r]) << "rank " << r;
    for (const auto& [place, bits] : sharded.moments[r]) {
      auto it = whole.moments[r].find(place);
      ASSERT_NE(it, whole.moments[r].end());
      EXPECT_EQ(bits, it->second) << "rank " << r << " chunk " << place.first << " element "
                                  << place.second;
      if (bits != it->second) return;
    }
  }
  for (int stage = 0; stage < pp; ++stage) {
    std::map<std::pair<int, int64_t>, int> holders;
    for (size_t r = stage; r < whole.params.size(); r += pp) {
      for (const auto& [place, bits] : sharded.moments[r]) ++holders[place];
    }
    EXPECT_EQ(holders.size(), whole.moments[stage].size()) << "stage " << stage;
    for (const auto& [place, count] : holders) {
      ASSERT_EQ(count, 1) << "stage " << stage << " element " << place.second;
    }
  }
}

}  // namespace freeride::testing
