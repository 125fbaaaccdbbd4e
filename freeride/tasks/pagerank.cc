// `pagerank`: PageRank by power iteration over a CSR graph, pulled along incoming edges. The
// graph is a SNAP edge list (args.edges: "u v" per line, '#' comments) or an R-MAT graph of
// 2^args.scale vertices and edge_factor·2^scale edges (a, b, c, d = 0.57, 0.19, 0.19, 0.05).
// A step updates args.rows_per_step vertices of the current iteration; an iteration ends with
// the L1 change, and the task is done when it is below args.tolerance (or after
// args.iterations, when set). Ranks go to results_dir/ranks.txt. A restart (repeat = true)
// keeps the graph and answers a new query: PageRank personalized to vertex (seed + restarts)
// mod n, so that it fits in a bubble where rebuilding the graph would not.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <unordered_map>

#include "absl/strings/str_format.h"
#include "core/files.h"
#include "freeride/side_task.h"

namespace freeride {
namespace {

struct Edge {
  int64_t from, to;
};

std::vector<Edge> Rmat(int scale, int64_t edges, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<Edge> out(edges);
  for (Edge& e : out) {
    int64_t from = 0, to = 0;
    for (int bit = 0; bit < scale; ++bit) {
      const double r = u(rng);
      const int quadrant = r < 0.57 ? 0 : r < 0.76 ? 1 : r < 0.95 ? 2 : 3;
      from = (from << 1) | (quadrant >> 1);
      to = (to << 1) | (quadrant & 1);
    }
    e = {from, to};
  }
  return out;
}

absl::StatusOr<std::vector<Edge>> ReadSnap(const std::string& path, int64_t* vertices) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrFormat("args.edges: cannot open %s", path));
  std::unordered_map<int64_t, int64_t> dense;
  auto id = [&](int64_t raw) {
    auto [it, inserted] = dense.emplace(raw, static_cast<int64_t>(dense.size()));
    return it->second;
  };
  std::vector<Edge> edges;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    int64_t u, v;
    if (!(fields >> u >> v)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s:%d: expected two vertex ids \"u v\", found \"%s\"", path, line_no, line));
    }
    edges.push_back({id(u), id(v)});
  }
  if (edges.empty()) return absl::InvalidArgumentError(absl::StrFormat("%s: no edges", path));
  *vertices = static_cast<int64_t>(dense.size());
  return edges;
}

class PageRankTask : public SideTask {
 public:
  absl::Status Create(SideTaskContext& ctx) override {
    ArgReader args(ctx.name, *ctx.args);
    if (absl::Status s = args.OnlyKnown({"edges", "scale", "edge_factor", "seed", "damping",
                                         "tolerance", "iterations", "rows_per_step"});
        !s.ok()) {
      return s;
    }
    auto edges_path = args.String("edges", "");
    auto scale = args.Int("scale", 16, 1, 30);
    auto factor = args.Int("edge_factor", 8, 1, 1024);
    auto seed = args.Int("seed", 1, 0, int64_t{1} << 62);
    auto damping = args.Number("damping", 0.85, 0, 1);
    auto tolerance = args.Number("tolerance", 1e-6, 0, 1);
    auto iterations = args.Int("iterations", 0, 0, int64_t{1} << 40);
    auto rows = args.Int("rows_per_step", 8192, 1, int64_t{1} << 40);
    for (const absl::Status& s : {edges_path.status(), scale.status(), factor.status(),
                                  seed.status(), damping.status(), tolerance.status(),
                                  iterations.status(), rows.status()}) {
      if (!s.ok()) return s;
    }
    seed_ = *seed;
    damping_ = *damping;
    tolerance_ = *tolerance;
    max_iterations_ = *iterations;
    rows_per_step_ = *rows;
    std::vector<Edge> edges;
    if (!edges_path->empty()) {
      absl::StatusOr<std::vector<Edge>> read = ReadSnap(*edges_path, &n_);
      if (!read.ok()) return read.status();
      edges = *std::move(read);
    } else {
      n_ = int64_t{1} << *scale;
      edges = Rmat(static_cast<int>(*scale), *factor * n_, static_cast<uint64_t>(*seed));
    }
    // CSR over incoming edges, and out-degrees.
    offsets_.assign(n_ + 1, 0);
    out_degree_.assign(n_, 0);
    for (const Edge& e : edges) {
      ++offsets_[e.to + 1];
      ++out_degree_[e.from];
    }
    std::partial_sum(offsets_.begin(), offsets_.end(), offsets_.begin());
    sources_.resize(edges.size());
    std::vector<int64_t> fill(offsets_.begin(), offsets_.end() - 1);
    for (const Edge& e : edges) sources_[fill[e.to]++] = e.from;
    return absl::OkStatus();
  }

  absl::Status Load(SideTaskContext& ctx) override {
    for (double** v : {&rank_, &next_, &contrib_}) {
      absl::StatusOr<double*> p = ctx.arena->AllocateArray<double>(n_, "pagerank vectors");
      if (!p.ok()) return p.status();
      *v = *p;
    }
    std::fill(rank_, rank_ + n_, 1.0 / n_);
    cursor_ = 0;
    StartIteration();
    return absl::OkStatus();
  }

  // A restart (repeat) keeps the graph and ranks it for a new query: personalized PageRank, the
  // random surfer teleporting to vertex (seed + restarts) mod n only.
  bool RestartsInPlace() const override { return true; }
  absl::Status Restart(SideTaskContext& ctx) override {
    source_ = (seed_ + ctx.restarts) % n_;
    std::fill(rank_, rank_ + n_, 1.0 / n_);
    iterations_ = 0;
    change_ = 1;
    cursor_ = 0;
    StartIteration();
    return absl::OkStatus();
  }

  absl::StatusOr<double> Step(SideTaskContext&) override {
    const int64_t end = std::min(n_, cursor_ + rows_per_step_);
    // Teleport and dangling mass go where the surfer restarts: every vertex alike, or the source.
    const double restart_mass = (1 - damping_) + damping_ * dangling_;
    const double base = source_ < 0 ? restart_mass / n_ : 0.0;
    int64_t edges = 0;
    for (int64_t v = cursor_; v < end; ++v) {
      double sum = 0;
      for (int64_t k = offsets_[v]; k < offsets_[v + 1]; ++k) sum += contrib_[sources_[k]];
      next_[v] = base + (v == source_ ? restart_mass : 0.0) + damping_ * sum;
      edges += offsets_[v + 1] - offsets_[v];
    }
    cursor_ = end;
    if (cursor_ == n_) {
      change_ = 0;
      for (int64_t v = 0; v < n_; ++v) change_ += std::fabs(next_[v] - rank_[v]);
      std::swap(rank_, next_);
      ++iterations_;
      cursor_ = 0;
      StartIteration();
    }
    return static_cast<double>(edges);
  }

  absl::Status Unload(SideTaskContext& ctx) override {
    if (rank_ == nullptr) return absl::OkStatus();
    std::string text = absl::StrFormat(
        "# vertex rank (%d iterations, L1 change %.3g%s)\n", iterations_, change_,
        source_ < 0 ? "" : absl::StrFormat(", personalized to vertex %d", source_));
    for (int64_t v = 0; v < n_; ++v) absl::StrAppendFormat(&text, "%d %.9g\n", v, rank_[v]);
    rank_ = next_ = contrib_ = nullptr;
    return WriteFileAtomically(ctx.results_dir + "/ranks.txt", text);
  }

  bool Done() const override {
    return iterations_ > 0 &&
           (change_ < tolerance_ || (max_iterations_ > 0 && iterations_ >= max_iterations_));
  }
  std::string UnitName() const override { return "edges"; }
  std::string Summary() const override {
    return absl::StrFormat("%d vertices, %d edges, %d iterations, L1 change %.3g", n_,
                           sources_.size(), iterations_, change_);
  }

 private:
  void StartIteration() {
    dangling_ = 0;
    for (int64_t v = 0; v < n_; ++v) {
      contrib_[v] = out_degree_[v] > 0 ? rank_[v] / out_degree_[v] : 0;
      if (out_degree_[v] == 0) dangling_ += rank_[v];
    }
  }

  int64_t n_ = 0, rows_per_step_ = 8192, max_iterations_ = 0, iterations_ = 0, cursor_ = 0;
  int64_t seed_ = 1, source_ = -1;  // source_ >= 0: personalized to that vertex (restarts)
  double damping_ = 0.85, tolerance_ = 1e-6, change_ = 1, dangling_ = 0;
  std::vector<int64_t> offsets_, sources_, out_degree_;
  double *rank_ = nullptr, *next_ = nullptr, *contrib_ = nullptr;
};

}  // namespace

FREERIDE_REGISTER_SIDE_TASK(PageRankTask, "pagerank");

}  // namespace freeride
