// Checkpoint write and read bandwidth for GPT-2 124M (12 layers, hidden 768,
// vocabulary 50257 padded to 50304, 1024 positions) with Adam state: the
// parameter names, shapes and shards the model uses (tests/checkpoint/
// fake_model.hpp). A plain MPI program (no Google Benchmark: every timing
// is one collective save or load of ~1.5 GB).
//
//   mpirun -np 8 --oversubscribe build/perf/bench_checkpoint \
//       [--dir /tmp/meshtron_bench_ckpt] [--tp 2] [--pp 2] [--reps 3] [--chunk 1048576]
//
// Steps: 1. build and fill this rank's shards; 2. save `reps` times (each
// save = write + verify read-back + rename, as in training); 3. load `reps`
// times under the same decomposition and once on rank 0 alone (tp=pp=dp=1:
// it reads the whole file), checking every element; 4. print MB/s
// of checkpoint payload (fp32 values + 2 Adam moments, global shapes).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "io/checkpoint.hpp"
#include "parallel/topology.hpp"
#include "tests/checkpoint/fake_model.hpp"

namespace {

using namespace meshtron;
using namespace meshtron::testing_ckpt;

struct Args {
  std::string dir = "/tmp/meshtron_bench_ckpt";
  int tp = 2, pp = 2, reps = 3;
  index_t chunk = io::CheckpointOptions{}.chunk_elements;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--dir") a.dir = value;
    else if (key == "--tp") a.tp = std::stoi(value);
    else if (key == "--pp") a.pp = std::stoi(value);
    else if (key == "--reps") a.reps = std::stoi(value);
    else if (key == "--chunk") a.chunk = std::stoll(value);
  }
  return a;
}

FakeModelSpec gpt2_124m() {
  FakeModelSpec s;
  s.vocab = 50257;
  s.hidden = 768;
  s.positions = 1024;
  s.layers = 12;
  s.ffn = 3072;
  s.vocab_divisible_by = 64;  // x tp 2 = 128: padded 50304
  return s;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Wall time of a collective step: from a barrier to the slowest rank's end.
template <class F>
double timed(MPI_Comm comm, F&& step) {
  MPI_Barrier(comm);
  const auto t0 = std::chrono::steady_clock::now();
  step();
  double t = seconds_since(t0), slowest = 0;
  MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
  return slowest;
}

/// Load under `d` over `comm` (timing only load_checkpoint into `seconds`);
/// returns the number of elements that differ from the formula.
index_t load_and_count_errors(const std::string& path, MPI_Comm comm, const ParallelDegrees& d,
                              const FakeModelSpec& spec, double& seconds) {
  Topology topo(comm, d);
  FakeModel m = make_fake_model(spec, topo.tp_rank(), topo.tp(), topo.pp_rank(), topo.pp());
  clear(m);
  io::TrainState state;
  seconds = timed(comm, [&] { io::load_checkpoint(path, topo, m.tensors(true), state, true); });
  return count_mismatches(m, true);
}

void report(const char* what, const std::vector<double>& times, double megabytes) {
  const double best = *std::min_element(times.begin(), times.end());
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  std::printf("%-44s best %7.3f s  median %7.3f s  -> %8.1f MB/s (best)  %8.1f MB/s (median)\n",
              what, best, median, megabytes / best, megabytes / median);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const Args args = parse(argc, argv);
  const FakeModelSpec spec = gpt2_124m();
  try {
    // 1. This rank's shards.
    const ParallelDegrees layout{args.tp, args.pp, 0};
    Topology topo(MPI_COMM_WORLD, layout);
    FakeModel model = make_fake_model(spec, topo.tp_rank(), topo.tp(), topo.pp_rank(), topo.pp());
    fill(model);
    const FakeModel whole = make_fake_model(spec, 0, 1, 0, 1);
    index_t elements = 0;
    for (const Parameter& p : whole.params) elements += shape_numel(p.global_shape);
    const double megabytes = 3.0 * double(elements) * 4 / 1e6;
    if (rank == 0)
      std::printf("GPT-2 124M: %zu tensors, %lld parameters; payload %.1f MB (values + "
                  "exp_avg + exp_avg_sq, fp32); world %d = tp %d x pp %d x dp %d; chunk %lld "
                  "elements; dir %s\n",
                  whole.params.size(), static_cast<long long>(elements), megabytes, world,
                  topo.tp(), topo.pp(), topo.dp(), static_cast<long long>(args.chunk),
                  args.dir.c_str());

    // 2. Saves (write + verify + publish).
    std::vector<double> save_times;
    for (int rep = 0; rep < args.reps; ++rep) {
      io::TrainState state;
      state.iteration = rep + 1;
      save_times.push_back(timed(MPI_COMM_WORLD, [&] {
        io::save_checkpoint(args.dir, topo, model.tensors(true), state, /*keep_last=*/1,
                            io::CheckpointOptions{args.chunk});
      }));
    }
    std::string path;
    io::find_latest(args.dir, path);

    // 3. Loads, checked element by element.
    std::vector<double> load_times;
    index_t errors = 0;
    for (int rep = 0; rep < args.reps; ++rep) {
      double seconds = 0;
      errors += load_and_count_errors(path, MPI_COMM_WORLD, layout, spec, seconds);
      load_times.push_back(seconds);
    }
    // One rank reads the whole file alone (a 1-rank restart); the others
    // wait, so memory stays bounded on a small machine.
    double alone = 0;
    if (rank == 0) errors += load_and_count_errors(path, MPI_COMM_SELF, {1, 1, 1}, spec, alone);
    index_t total_errors = 0;
    MPI_Allreduce(&errors, &total_errors, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);

    // 4. Report.
    if (rank == 0) {
      std::printf("file size %.1f MB\n", double(std::filesystem::file_size(path)) / 1e6);
      report("save (write + verify read-back + rename)", save_times, megabytes);
      report("load, same decomposition", load_times, megabytes);
      report("load, rank 0 alone (tp=pp=dp=1)", {alone}, megabytes);
      std::printf("mismatching elements after load: %lld\n",
                  static_cast<long long>(total_errors));
      std::filesystem::remove_all(args.dir);
    }
  } catch (const UserError& e) {
    if (rank == 0) std::fprintf(stderr, "bench_checkpoint: error: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return 0;
}
