// Test helpers: generator options, and schedules and simulations that must succeed (a failure
// is reported where it happened and yields an empty result).
#pragma once

#include "gtest/gtest.h"
#include "pipeline/generators.h"
#include "pipeline/simulator.h"

namespace freeride::pipeline {

inline ScheduleOptions Options(ScheduleKind kind, int p, int m, int v = 1,
                               CostModel cost = CostModel::Uniform()) {
  ScheduleOptions o;
  o.kind = kind;
  o.stages = p;
  o.microbatches = m;
  o.chunks = v;
  o.cost = cost;
  return o;
}

inline Schedule MustBuild(ScheduleKind kind, int p, int m, int v = 1,
                          CostModel cost = CostModel::Uniform()) {
  absl::StatusOr<Schedule> s = BuildSchedule(Options(kind, p, m, v, cost));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : Schedule{};
}

inline SimResult MustSimulate(const Schedule& schedule, const CostModel& cost) {
  absl::StatusOr<SimResult> r = Simulate(schedule, cost);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : SimResult{};
}

}  // namespace freeride::pipeline
