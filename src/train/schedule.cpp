#include "train/schedule.hpp"

#include <algorithm>

#include "common/error.hpp"

namespace meshtron {

namespace {

std::vector<PipelineTask> gpipe(int m) {
  std::vector<PipelineTask> tasks;
  for (int i = 0; i < m; ++i) tasks.push_back({PipelineTask::Forward, i, 0});
  for (int i = 0; i < m; ++i) tasks.push_back({PipelineTask::Backward, i, 0});
  return tasks;
}

/// Warm-up forwards, steady one-forward-one-backward, cool-down backwards.
/// `forward(k)` and `backward(k)` give the k-th forward / backward task.
template <class F, class B>
std::vector<PipelineTask> one_f_one_b(int total, int warmup, F forward, B backward) {
  warmup = std::min(warmup, total);
  std::vector<PipelineTask> tasks;
  for (int k = 0; k < warmup; ++k) tasks.push_back(forward(k));
  for (int k = 0; k < total - warmup; ++k) {
    tasks.push_back(forward(warmup + k));
    tasks.push_back(backward(k));
  }
  for (int k = total - warmup; k < total; ++k) tasks.push_back(backward(k));
  return tasks;
}

std::vector<PipelineTask> interleaved(const ScheduleShape& s, int rank) {
  const int pp = s.pp, v = s.virtual_stages, m = s.micro_batches;
  MESH_REQUIRE(m % pp == 0, "interleaved schedule: micro-batches per step (" << m
                                << ") must be a multiple of pipeline_parallel (" << pp << ")");
  // Megatron's order: groups of pp micro-batches sweep chunk 0..v-1 forward
  // and chunk v-1..0 backward.
  auto micro_batch = [&](int k) { return (k / (pp * v)) * pp + k % pp; };
  auto chunk = [&](int k) { return (k % (pp * v)) / pp; };
  const int total = m * v;
  const int warmup = m == pp ? total : (pp - rank - 1) * 2 + (v - 1) * pp;
  return one_f_one_b(
      total, warmup,
      [&](int k) { return PipelineTask{PipelineTask::Forward, micro_batch(k), chunk(k)}; },
      [&](int k) {
        return PipelineTask{PipelineTask::Backward, micro_batch(k), v - 1 - chunk(k)};
      });
}

}  // namespace

std::vector<PipelineTask> schedule_tasks(const ScheduleShape& s, int rank) {
  if (s.name == "gpipe") return gpipe(s.micro_batches);
  if (s.name == "1f1b")
    return one_f_one_b(
        s.micro_batches, s.pp - rank - 1,
        [](int k) { return PipelineTask{PipelineTask::Forward, k, 0}; },
        [](int k) { return PipelineTask{PipelineTask::Backward, k, 0}; });
  if (s.name == "interleaved") return interleaved(s, rank);
  throw UserError("unknown pipeline schedule '" + s.name + "'");
}

int max_in_flight(const std::vector<PipelineTask>& tasks) {
  int live = 0, peak = 0;
  for (const auto& t : tasks) {
    live += t.kind == PipelineTask::Forward ? 1 : -1;
    peak = std::max(peak, live);
  }
  return peak;
}

}  // namespace meshtron
