// Pipeline bubble: the measured idle fraction of each schedule on pp ranks
// against the textbook bubble (Narayanan et al., 2021):
//   gpipe, 1f1b:   bubble / compute = (pp - 1) / m
//   interleaved:   bubble / compute = (pp - 1) / (v m)
// Idle time is the time a rank spends blocked on pipeline receives (and on
// its own outstanding sends at the end of the step); the measured ratio is
// idle / (step - idle), averaged over ranks and steps.
//
//   mpirun -np 4 build/perf/bench_pipeline_bubble [micro_batches=8] [steps=3]
//
// Oversubscribed ranks (more ranks than cores) share cores, so blocked ranks
// give their core to busy ones and the measured bubble shrinks; quote only
// numbers from runs with a core per rank.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdio>
#include <cstdlib>

#include "config/model_spec_from_deck.hpp"
#include "config/run_config.hpp"
#include "train/trainer.hpp"

namespace {

using namespace meshtron;

RunConfig bench_config(int pp, const std::string& schedule, int micro_batches) {
  RunConfig c = RunConfig::from_text(R"(
[model]
num_layers = 8
hidden_size = 256
num_attention_heads = 8
seq_length = 64
vocab_size = 1000
make_vocab_size_divisible_by = 8
hidden_dropout = 0
attention_dropout = 0
[training]
micro_batch_size = 1
train_iters = 100
[lr_schedule]
warmup_iters = 0
)",
                                     {"parallel.pipeline_parallel=" + std::to_string(pp),
                                      "parallel.schedule=" + schedule,
                                      "parallel.virtual_stages=" +
                                          std::string(schedule == "interleaved" ? "2" : "1"),
                                      "training.global_batch_size=" + std::to_string(micro_batches)});
  c.validate(pp);
  return c;
}

void measure(const std::string& schedule, int pp, int m, int steps, int rank) {
  const RunConfig c = bench_config(pp, schedule, m);
  ParallelRuntime rt(MPI_COMM_WORLD, c.parallel.degrees());
  Trainer trainer(c, model_spec_from_deck(c, 1000, 1), rt, DType::F32);
  DataLayout layout{64, 1, m, 0, 1, 100, 1, 1};
  auto data = make_synthetic_data(layout, 1000);
  trainer.train_step(1, data->train_step(1));  // warm-up
  double ratio = 0, idle_fraction = 0, seconds = 0;
  for (int s = 2; s < 2 + steps; ++s) {
    const StepReport r = trainer.train_step(s, data->train_step(s));
    ratio += r.wait_seconds / (r.schedule_seconds - r.wait_seconds) / steps;
    idle_fraction += r.wait_seconds / r.schedule_seconds / steps;
    seconds += r.schedule_seconds / steps;
  }
  double sums[3] = {ratio, idle_fraction, seconds};
  MPI_Allreduce(MPI_IN_PLACE, sums, 3, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  const int v = schedule == "interleaved" ? 2 : 1;
  if (rank == 0)
    std::printf("%-12s pp=%d m=%-3d v=%d  step %7.1f ms  idle fraction %.3f  "
                "bubble/compute measured %.3f  formula (pp-1)/(v m) = %.3f\n",
                schedule.c_str(), pp, m, v, 1e3 * sums[2] / pp, sums[1] / pp, sums[0] / pp,
                double(pp - 1) / (v * m));
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    int rank = 0, world = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    const int m = argc > 1 ? std::atoi(argv[1]) : 8;
    const int steps = argc > 2 ? std::atoi(argv[2]) : 3;
    for (const char* schedule : {"gpipe", "1f1b", "interleaved"})
      measure(schedule, world, m, steps, rank);
  }
  MPI_Finalize();
  return 0;
}
