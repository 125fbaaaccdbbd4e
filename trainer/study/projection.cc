#include "trainer/study/projection.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/json_string.h"
#include "core/status.h"
#include "pipeline/generators.h"
#include "pipeline/simulator.h"
#include "trainer/pipeline_plan.h"

namespace freeride {
namespace {

using pipeline::ScheduleKind;

// One pipeline's stages for `pp` ranks of `chunks` chunks each: their costs (CostModelFromParts)
// and the most parameters any rank holds (whose gradients the all-reduce waits for).
struct StagePlan {
  pipeline::CostModel cost;
  int64_t max_rank_params = 0;
  std::vector<std::vector<StageSpec>> stage_chunks;  // per stage, its chunks in chunk order
};

absl::StatusOr<StagePlan> PlanStages(const GPT2Config& model, const PartCosts& parts, int pp,
                                     int chunks, pipeline::Placement placement) {
  const int virtual_stages = pp * chunks;
  std::vector<int> owners;
  for (int k = 0; k < virtual_stages; ++k) {
    owners.push_back(pipeline::StageOfVirtual(placement, pp, k));
  }
  FR_ASSIGN_OR_RETURN(
      std::vector<StageSpec> specs,
      BalancedStages(model, virtual_stages, parts, chunks > 1 ? owners : std::vector<int>{}));
  StagePlan plan;
  plan.cost = CostModelFromParts(specs, parts, placement, pp);
  std::vector<int64_t> params(pp, 0);
  for (int k = 0; k < virtual_stages; ++k)
    params[owners[k]] += MakeParamLayout(model, specs[k]).total;
  plan.max_rank_params = *std::max_element(params.begin(), params.end());
  plan.stage_chunks.resize(pp);
  for (int stage = 0; stage < pp; ++stage) {
    for (int c = 0; c < chunks; ++c) {
      plan.stage_chunks[stage].push_back(specs[pipeline::VirtualStageOf(placement, pp, stage, c)]);
    }
  }
  return plan;
}

// Side work the executor would pack into one bubble: tasks in order; an in-process task runs
// whole steps while one fits what is left of the bubble less the margin, a worker runs to it.
double Packed(double bubble_ms, const ProjectionOptions& options) {
  double left = bubble_ms * (1 - options.margin), packed = 0;
  for (const ProjectedTask& task : options.tasks) {
    if (left <= 0) break;
    if (task.pausable) {
      packed += left;
      left = 0;
    } else if (task.step_ms > 0) {
      const double steps = std::floor(left / task.step_ms);
      packed += steps * task.step_ms;
      left -= steps * task.step_ms;
    }
  }
  return packed;
}

}  // namespace

double TiedSumMs(const GPT2Config& model, const ProjectionOptions& options) {
  if (TiedElements(model) == 0) return 0;  // an untied head: nothing shared to sum
  return pipeline::AllReduceMs(
      pipeline::AllReduceAlgorithm::kRing, options.link,
      static_cast<double>(model.vocab_size * model.n_embd * options.bytes_per_value), 2);
}

absl::StatusOr<Projection> Project(const GPT2Config& model, const ProjectionOptions& options) {
  if (options.global_batch < 1 || options.micro_batch < 1 || options.seq_len < 1) {
    return absl::InvalidArgumentError("projection: global batch, micro-batch and seq_len >= 1");
  }
  Projection out;
  std::map<std::tuple<int, int, int>, StagePlan> plans;  // by (pp, chunks, placement)
  const double activation_bytes = static_cast<double>(
      options.micro_batch * options.seq_len * model.n_embd * options.message_bytes_per_value);
  for (int64_t gpus : options.gpus) {
    for (ScheduleKind kind : options.kinds) {
      const int chunks = pipeline::ChunksFor(kind, options.chunks);
      const pipeline::Placement placement = pipeline::PlacementOf(kind);
      std::vector<std::string> reasons;
      size_t fitted = 0;
      for (int64_t pp = 1; pp <= std::min<int64_t>(gpus, model.n_layer); ++pp) {
        if (gpus % pp != 0 || pp * chunks > model.n_layer) continue;
        const int64_t dp = gpus / pp;
        if (options.global_batch % (dp * options.micro_batch) != 0) continue;
        const int64_t m = options.global_batch / (dp * options.micro_batch);
        const auto key = std::make_tuple(static_cast<int>(pp), chunks, static_cast<int>(placement));
        if (!plans.count(key)) {
          FR_ASSIGN_OR_RETURN(plans[key], PlanStages(model, options.costs, static_cast<int>(pp),
                                                     chunks, placement));
        }
        const StagePlan& plan = plans[key];
        pipeline::ScheduleOptions schedule;
        schedule.kind = kind;
        schedule.stages = static_cast<int>(pp);
        schedule.microbatches = static_cast<int>(m);
        schedule.chunks = chunks;
        schedule.cost = plan.cost;
        schedule.cost.comm = pp > 1 ? pipeline::PointToPointMs(options.link, activation_bytes) : 0;
        const double grad_bytes =
            static_cast<double>(plan.max_rank_params * options.bytes_per_value);
        schedule.cost.reduce =
            pipeline::AllReduceMs(options.algorithm, options.network, grad_bytes, dp);
        if (options.dp_bucket_mb > 0 && dp > 1) {
          // Equal buckets per chunk, each an all-reduce of its own (its latency included).
          const double bucket_bytes = options.dp_bucket_mb * (1 << 20);
          const int buckets =
              static_cast<int>(std::max(1.0, std::ceil(grad_bytes / chunks / bucket_bytes)));
          schedule.cost.reduce_buckets = buckets;
          schedule.cost.reduce = chunks * buckets *
                                 pipeline::AllReduceMs(options.algorithm, options.network,
                                                       grad_bytes / (chunks * buckets), dp);
        }
        // A head tied to the embedding (GPT-2's, a tied Llama's): where they are on different
        // ranks, those two sum the matrix's gradient over the stage link before the update.
        schedule.cost.tied = pp > 1 ? TiedSumMs(model, options) : 0;
        schedule.cost.optimizer =
            static_cast<double>(plan.max_rank_params) * options.optimizer_ms_per_param;
        schedule.data_parallel = dp > 1;
        schedule.step_sync = options.step_sync;
        absl::StatusOr<pipeline::Schedule> built = pipeline::BuildSchedule(schedule);
        if (!built.ok()) {
          reasons.push_back(absl::StrFormat("pp %d, m %d: %s", pp, m, built.status().message()));
          continue;
        }
        FR_ASSIGN_OR_RETURN(pipeline::SimResult sim, pipeline::Simulate(*built, schedule.cost));
        ProjectionRow row;
        row.gpus = gpus, row.pp = pp, row.dp = dp, row.microbatches = m;
        row.kind = kind, row.chunks = chunks;
        row.step_ms = sim.step_time;
        row.allreduce_ms = schedule.cost.reduce;
        row.bubble_fraction = sim.bubble_fraction;
        for (const pipeline::StageResult& stage : sim.stages) {
          row.exposed_sync_ms =
              std::max(row.exposed_sync_ms,
                       stage.bubble_by_kind[static_cast<int>(pipeline::BubbleKind::kSync)]);
        }
        const double gpu_ms = static_cast<double>(pp) * sim.step_time;
        double packed = 0;
        for (const pipeline::StageResult& stage : sim.stages) {
          for (int k = 0; k < pipeline::kNumBubbleKinds; ++k) {
            row.bubble_by_kind[k] += stage.bubble_by_kind[k] / gpu_ms;
          }
          // The runtime places BUBBLEs where its measured F, B and W leave a stage idle; the
          // waits for sums (sync) stay inside OPTIMIZER and REDUCE_GRADS, unharvested.
          for (const pipeline::BubbleSpan& b : stage.bubbles) {
            if (b.kind != pipeline::BubbleKind::kSync) packed += Packed(b.duration, options);
          }
        }
        row.harvested_fraction = packed / gpu_ms;
        row.tokens_per_s =
            static_cast<double>(options.global_batch * options.seq_len) / (sim.step_time * 1e-3);
        row.stage_chunks = plan.stage_chunks;
        for (int stage = 0; stage < pp; ++stage) {
          row.stage_slots.push_back(std::max(1, built->buffers_per_stage[stage]));
        }
        out.rows.push_back(row);
        ++fitted;
      }
      if (fitted == 0) {
        out.skipped.push_back(absl::StrFormat(
            "%d GPUs, %s: no pp × dp fits (pp ≤ %d layers / %d chunks, global batch %d a multiple "
            "of dp × micro-batch %d)%s",
            gpus, pipeline::ScheduleKindName(kind), model.n_layer, chunks, options.global_batch,
            options.micro_batch,
            reasons.empty() ? "" : "; refused: " + absl::StrJoin(reasons, "; ")));
      }
    }
  }
  return out;
}

std::vector<ProjectionRow> BestRows(const Projection& projection) {
  std::vector<ProjectionRow> best;
  for (const ProjectionRow& row : projection.rows) {
    auto same = std::find_if(best.begin(), best.end(), [&](const ProjectionRow& b) {
      return b.gpus == row.gpus && b.kind == row.kind;
    });
    if (same == best.end()) {
      best.push_back(row);
    } else if (row.step_ms < same->step_ms || (row.step_ms == same->step_ms &&
                                               row.harvested_fraction > same->harvested_fraction)) {
      *same = row;
    }
  }
  return best;
}

std::string ProjectionMarkdown(const GPT2Config& model, const Projection& projection,
                               const ProjectionOptions& options) {
  std::string md = absl::StrFormat(
      "# Projection\n\nModel: %s, %d layers × n_embd %d, %d parameters, %.4g GFLOP per token "
      "to train at T = %d.\n\nGlobal batch %d sequences of %d tokens, micro-batch %d; per "
      "micro-batch "
      "(F + B + W) embedding %.4g ms, block %.4g ms, head %.4g ms; stage link %.4g µs + %.4g "
      "GB/s (with pp > 1, the tied-embedding sum over it: %.3g ms); data-parallel %s all-reduce "
      "%.4g µs + %.4g GB/s%s; optimizer %.3g ns per parameter, %s; "
      "side tasks: %s; margin %.0f%%.%s\n\n"
      "Per GPU count and schedule, the fastest pp × dp:\n\n"
      "| GPUs | schedule | pp × dp | micro-batches | step ms | tokens/s | all-reduce ms | "
      "exposed sync ms | bubble | bubble GPUs | reclaimed GPUs |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|\n",
      ModelArchName(model.arch), model.n_layer, model.n_embd, NumParameters(model),
      TrainingFlopsPerToken(model, options.seq_len) / 1e9, options.seq_len, options.global_batch,
      options.seq_len, options.micro_batch, options.costs.embedding, options.costs.block,
      options.costs.head, options.link.latency_us, options.link.bandwidth_gbs,
      TiedSumMs(model, options), pipeline::AllReduceAlgorithmName(options.algorithm),
      options.network.latency_us, options.network.bandwidth_gbs,
      options.dp_bucket_mb > 0
          ? absl::StrFormat(" in %.4g MiB buckets overlapping the last backward",
                            options.dp_bucket_mb)
          : std::string(" after the last backward"),
      options.optimizer_ms_per_param * 1e6,
      options.step_sync == pipeline::StepSync::kPostValidate
          ? "post-validated (no barrier; the steady period)"
          : "behind a barrier of every stage",
      options.tasks.empty() ? "none"
                            : absl::StrJoin(options.tasks, ", ",
                                            [](std::string* out, const ProjectedTask& t) {
                                              absl::StrAppendFormat(out, "%s (%.3g ms steps%s)",
                                                                    t.name, t.step_ms,
                                                                    t.pausable ? ", worker" : "");
                                            }),
      100 * options.margin,
      options.links.empty() ? std::string() : absl::StrCat(" Links: ", options.links, "."));
  for (const ProjectionRow& r : BestRows(projection)) {
    absl::StrAppendFormat(
        &md, "| %d | %s | %d × %d | %d | %.4g | %.4g | %.3g | %.3g | %.1f%% | %.1f | %.1f |\n",
        r.gpus, pipeline::ScheduleKindName(r.kind), r.pp, r.dp, r.microbatches, r.step_ms,
        r.tokens_per_s, r.allreduce_ms, r.exposed_sync_ms, 100 * r.bubble_fraction, r.bubble_gpus(),
        r.reclaimed_gpus());
  }
  if (!projection.skipped.empty()) {
    absl::StrAppend(&md, "\nNothing fits:\n\n- ", absl::StrJoin(projection.skipped, "\n- "), "\n");
  }
  absl::StrAppend(&md,
                  "\nBubble: idle GPU time over all GPU time. Bubble GPUs: that fraction of the "
                  "GPUs. Reclaimed GPUs: the side work packed into the bubbles, in GPUs' worth of "
                  "time (at the tasks' standalone speed).\n");
  return md;
}

std::string ProjectionCsv(const Projection& projection) {
  std::string csv =
      "gpus,schedule,chunks,pp,dp,microbatches,step_ms,tokens_per_s,allreduce_ms,"
      "exposed_sync_ms,bubble_fraction,bubble_gpus,harvested_fraction,reclaimed_gpus";
  for (int k = 0; k < pipeline::kNumBubbleKinds; ++k) {
    absl::StrAppend(&csv, ",bubble_",
                    pipeline::BubbleKindName(static_cast<pipeline::BubbleKind>(k)));
  }
  csv += "\n";
  for (const ProjectionRow& r : projection.rows) {
    absl::StrAppendFormat(&csv, "%d,%s,%d,%d,%d,%d,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g", r.gpus,
                          pipeline::ScheduleKindName(r.kind), r.chunks, r.pp, r.dp, r.microbatches,
                          r.step_ms, r.tokens_per_s, r.allreduce_ms, r.exposed_sync_ms,
                          r.bubble_fraction, r.bubble_gpus(), r.harvested_fraction,
                          r.reclaimed_gpus());
    for (double f : r.bubble_by_kind) absl::StrAppendFormat(&csv, ",%.6g", f);
    csv += "\n";
  }
  return csv;
}

std::string ProjectionJson(const Projection& projection) {
  std::vector<std::string> rows;
  for (const ProjectionRow& r : projection.rows) {
    std::vector<std::string> kinds;
    for (int k = 0; k < pipeline::kNumBubbleKinds; ++k) {
      kinds.push_back(absl::StrFormat(
          "\"%s\": %.6g", pipeline::BubbleKindName(static_cast<pipeline::BubbleKind>(k)),
          r.bubble_by_kind[k]));
    }
    rows.push_back(absl::StrFormat(
        "{\"gpus\": %d, \"schedule\": \"%s\", \"chunks\": %d, \"pp\": %d, \"dp\": %d, "
        "\"microbatches\": %d, \"step_ms\": %.6g, \"tokens_per_s\": %.6g, \"allreduce_ms\": %.6g, "
        "\"exposed_sync_ms\": %.6g, \"bubble_fraction\": %.6g, \"bubble_by_kind\": {%s}, "
        "\"bubble_gpus\": %.6g, \"harvested_fraction\": %.6g, \"reclaimed_gpus\": %.6g}",
        r.gpus, pipeline::ScheduleKindName(r.kind), r.chunks, r.pp, r.dp, r.microbatches, r.step_ms,
        r.tokens_per_s, r.allreduce_ms, r.exposed_sync_ms, r.bubble_fraction,
        absl::StrJoin(kinds, ", "), r.bubble_gpus(), r.harvested_fraction, r.reclaimed_gpus()));
  }
  std::vector<std::string> skipped;
  for (const std::string& s : projection.skipped) skipped.push_back(JsonString(s));
  return absl::StrFormat("{\"rows\": [\n  %s\n], \"skipped\": [%s]}\n",
                         absl::StrJoin(rows, ",\n  "), absl::StrJoin(skipped, ", "));
}

std::string ProjectionSvg(const Projection& projection) {
  const std::vector<ProjectionRow> best = BestRows(projection);
  std::vector<int64_t> gpus;
  std::vector<pipeline::ScheduleKind> kinds;
  double most_reclaimed = 0;
  for (const ProjectionRow& r : best) {
    if (std::find(gpus.begin(), gpus.end(), r.gpus) == gpus.end()) gpus.push_back(r.gpus);
    if (std::find(kinds.begin(), kinds.end(), r.kind) == kinds.end()) kinds.push_back(r.kind);
    most_reclaimed = std::max(most_reclaimed, r.reclaimed_gpus());
  }
  std::sort(gpus.begin(), gpus.end());
  const double width = 760, left = 70, right = 150, plot_w = width - left - right;
  const double plot_h = 200, top1 = 40, top2 = top1 + plot_h + 70, height = top2 + plot_h + 50;
  const double lo = gpus.empty() ? 0 : std::log2(static_cast<double>(gpus.front()));
  const double hi = gpus.empty() ? 1 : std::log2(static_cast<double>(gpus.back()));
  auto x = [&](int64_t n) {
    return hi > lo ? left + plot_w * (std::log2(static_cast<double>(n)) - lo) / (hi - lo)
                   : left + plot_w / 2;
  };
  const double reclaimed_top = most_reclaimed > 0 ? most_reclaimed * 1.1 : 1;
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" "
      "fill=\"white\"/>\n",
      width, height);
  const char* titles[2] = {"bubble, % of GPU time (fastest pp × dp per GPU count)",
                           "reclaimed side work, GPU-equivalents"};
  for (int panel = 0; panel < 2; ++panel) {
    const double top = panel == 0 ? top1 : top2;
    absl::StrAppendFormat(&svg,
                          "<text x=\"%.0f\" y=\"%.0f\" font-weight=\"bold\">%s</text>\n"
                          "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" "
                          "fill=\"none\" stroke=\"#888\"/>\n",
                          left, top - 12, titles[panel], left, top, plot_w, plot_h);
    for (int t = 0; t <= 4; ++t) {
      const double v = panel == 0 ? 25.0 * t : reclaimed_top * t / 4;
      const double y = top + plot_h * (1 - t / 4.0);
      absl::StrAppendFormat(
          &svg,
          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>"
          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.4g</text>\n",
          left, y, left + plot_w, y, left - 6, y + 4, v);
    }
    for (int64_t n : gpus) {
      absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%d</text>\n",
                            x(n), top + plot_h + 16, n);
    }
    absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">GPUs</text>\n",
                          left + plot_w / 2, top + plot_h + 32);
  }
  static constexpr const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                            "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
  for (size_t k = 0; k < kinds.size(); ++k) {
    const char* color = kColors[k % 8];
    for (int panel = 0; panel < 2; ++panel) {
      const double top = panel == 0 ? top1 : top2;
      std::vector<std::pair<int64_t, double>> values;  // by GPU count
      for (const ProjectionRow& r : best) {
        if (r.kind != kinds[k]) continue;
        values.emplace_back(r.gpus,
                            panel == 0 ? r.bubble_fraction : r.reclaimed_gpus() / reclaimed_top);
      }
      std::sort(values.begin(), values.end());
      std::vector<std::string> points;
      for (const auto& [n, v] : values) {
        const double px = x(n), py = top + plot_h * (1 - v);
        points.push_back(absl::StrFormat("%.1f,%.1f", px, py));
        absl::StrAppendFormat(&svg, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", px,
                              py, color);
      }
      absl::StrAppendFormat(&svg,
                            "<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" "
                            "stroke-width=\"2\"/>\n",
                            absl::StrJoin(points, " "), color);
    }
    const double ly = top1 + 14 + 18 * static_cast<double>(k);
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"%s\" "
                          "stroke-width=\"3\"/><text x=\"%.0f\" y=\"%.1f\">%s</text>\n",
                          left + plot_w + 14, ly - 4, left + plot_w + 34, ly - 4, color,
                          left + plot_w + 40, ly, pipeline::ScheduleKindName(kinds[k]));
  }
  return svg + "</svg>\n";
}

}  // namespace freeride
