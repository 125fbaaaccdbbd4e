// The measured trace of each rank: the steps trace.steps names, an arrow from every SEND to its
// RECV on the other rank, and counters of each step's waiting and harvested time. Two ranks as
// threads on real time: what is checked is the trace's structure, not its times.
#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/files.h"
#include "gtest/gtest.h"
#include "tests/pipeline/train_parity.h"

namespace freeride {
namespace {

using json = nlohmann::json;

json Trace(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  EXPECT_TRUE(text.ok()) << text.status();
  return json::parse(text.ok() ? *text : "{}");
}

TEST(TraceTest, RecordsTheConfiguredStepsWithMessageFlowsAndCounters) {
  Config config = testing::ParityConfig(testing::ParityShard(), "1f1b", 2, 1, 4);
  config.run.dir = (std::filesystem::path(::testing::TempDir()) / "trace_run").string();
  std::filesystem::remove_all(config.run.dir);
  config.trace.steps = {3, 4};
  auto transports = pipeline::MakeInProcessWorld(2);
  std::vector<std::string> failures(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto trainer = Trainer::Create(config, transports[r].get());
      absl::Status s = trainer.status();
      for (int i = 0; s.ok() && i < 5; ++i) s = (*trainer)->Step().status();
      if (s.ok()) s = (*trainer)->WriteTimelines();
      failures[r] = std::string(s.message());
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_EQ(failures, (std::vector<std::string>{"", ""}));

  // Flow id → (rank of its start, rank of its end), per message kind.
  std::map<int64_t, std::pair<int, int>> flows;
  std::map<std::string, int> flow_names;
  for (int rank = 0; rank < 2; ++rank) {
    const json trace = Trace(absl::StrFormat("%s/timeline_rank%03d.json", config.run.dir, rank));
    std::set<int> steps;
    int counters = 0;
    for (const json& e : trace["traceEvents"]) {
      const std::string ph = e["ph"];
      if (ph == "X") steps.insert(e["args"]["step"].get<int>());
      if (ph == "C") {
        ++counters;
        EXPECT_TRUE(e["args"].contains("waiting") && e["args"].contains("harvested")) << e;
      }
      if (ph == "s" || ph == "f") {
        auto& [from, to] = flows.try_emplace(e["id"].get<int64_t>(), -1, -1).first->second;
        (ph == "s" ? from : to) = rank;
        ++flow_names[e["name"].get<std::string>() + " " + ph];
        if (ph == "f") {
          EXPECT_EQ(e["bp"], "e");
        }
      }
    }
    EXPECT_EQ(steps, (std::set<int>{3, 4})) << "rank " << rank;
    EXPECT_EQ(counters, 3) << "rank " << rank;  // one per step, and the end of the last
  }
  // Per step, 4 micro-batches' activations go from rank 0 to 1 and their gradients back.
  EXPECT_EQ(flows.size(), 16u);
  for (const auto& [id, ends] : flows) {
    EXPECT_NE(ends.first, -1) << "flow " << id << " has no start";
    EXPECT_NE(ends.second, -1) << "flow " << id << " has no end";
    EXPECT_NE(ends.first, ends.second) << "flow " << id;
  }
  EXPECT_EQ(flow_names,
            (std::map<std::string, int>{
                {"activation f", 8}, {"activation s", 8}, {"gradient f", 8}, {"gradient s", 8}}));
}

TEST(TraceTest, StepsOutsideTheRangeAreRefusedByName) {
  for (const char* bad :
       {"trace.steps=[5, 2]", "trace.steps=[0, 3]", "trace.steps=[4]", "trace.steps=[1, 1001]"}) {
    absl::StatusOr<Config> config = ParseConfig("[data]\ntrain = \"t.bin\"\n", "t.toml", {bad});
    ASSERT_FALSE(config.ok()) << bad;
    EXPECT_NE(config.status().message().find("trace.steps: expected [first, last] with 1 <= "
                                             "first <= last and at most 1000 steps"),
              std::string::npos)
        << config.status().message();
  }
  EXPECT_TRUE(
      ParseConfig("[trace]\nsteps = [1, 1000]\n[data]\ntrain = \"t.bin\"\n", "t.toml").ok());
}

}  // namespace
}  // namespace freeride
