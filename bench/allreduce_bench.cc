// The link a CPU pipeline's ranks talk over, as `freeride project` models it: under
// `mpirun -n R`, times the trainer's own MPI transport summing float buffers of several sizes
// over all ranks (the fastest of a few runs each) and fits the ring formula of
// pipeline/network.h, t = 2(R−1)·α + 2(R−1)/R · bytes/β, by least squares. Prints each size's
// time and the fitted α (µs) and β (GB/s), the values for `project --link_latency_us/--link_gbs`
// (R = 2: the tied-embedding sum) or `--net_latency_us/--net_gbs` (the data-parallel sum).
// Usage: mpirun -n 2 build/bench/allreduce_bench [max_mib=32]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/timer.h"
#include "pipeline/comm/transport.h"

using namespace freeride;

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  std::unique_ptr<pipeline::Transport> transport = pipeline::MakeMpiTransport();
  const int rank = transport->rank(), ranks = transport->size();
  const double max_mib = argc > 1 ? std::atof(argv[1]) : 32;
  const double r = ranks, hops = 2 * (r - 1), share = 2 * (r - 1) / r;
  // x = bytes·share, y = ms: fit y = hops·α + x/β over the sizes.
  std::vector<double> xs, ys;
  if (rank == 0) std::printf("%d ranks; %12s %12s %10s\n", ranks, "bytes", "ms", "GB/s");
  for (double bytes = 4096; bytes <= max_mib * 1048576; bytes *= 2) {
    std::vector<float> data(static_cast<size_t>(bytes / sizeof(float)), 1.0f);
    double best = 1e30;
    for (int rep = 0; rep < 6; ++rep) {  // the first warms up; the fastest of the rest
      MPI_Barrier(MPI_COMM_WORLD);
      Timer t;
      absl::Status s = transport->AllReduceSum(data.data(), static_cast<int64_t>(data.size()),
                                               transport->AllRanks(), 60);
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      double ms = t.ElapsedSeconds() * 1e3;
      MPI_Allreduce(MPI_IN_PLACE, &ms, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (rep > 0) best = std::min(best, ms);
    }
    xs.push_back(bytes * share), ys.push_back(best);
    if (rank == 0) std::printf("%21.0f %12.4f %10.3f\n", bytes, best, bytes * share / best * 1e-6);
  }
  // Least squares of y = a + x·c in relative error (weights 1/y²), so the small sizes fix the
  // latency and the large ones the bandwidth: a = hops·α (ms), c = 1/β (ms per byte).
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double w = 1 / (ys[i] * ys[i]);
    sw += w, sx += w * xs[i], sy += w * ys[i], sxx += w * xs[i] * xs[i], sxy += w * xs[i] * ys[i];
  }
  const double c = (sw * sxy - sx * sy) / (sw * sxx - sx * sx), a = (sy - c * sx) / sw;
  if (rank == 0) {
    std::printf("fit: latency %.2f us, bandwidth %.3f GB/s (ring formula, %d ranks)\n",
                std::max(0.0, a / hops) * 1e3, 1e-6 / c, ranks);
  }
  transport.reset();
  MPI_Finalize();
  return 0;
}
