// Pipeline schedules as ordered task lists.
//
// A schedule is, for each pipeline rank, the order in which it runs the
// forward (F) and backward (B) passes of its micro-batches on its model
// chunks. Executing it is the same for every schedule: a task first
// receives what it needs from the neighbouring stage (blocking), computes,
// and posts its output with a non-blocking send. Since sends never block,
// any order that respects the data dependencies of every rank is free of
// deadlock, and the three schedules differ only in their orders:
//
//   gpipe        all F, then all B (Huang et al., 2019): m micro-batches in flight
//   1f1b         PipeDream-Flush (Narayanan et al., 2021): pp - rank - 1 warm-up
//                F, then alternate F and B; at most pp in flight on stage 0
//   interleaved  each rank holds v model chunks (virtual stages); Megatron's
//                interleaved 1F1B order, bubble (pp - 1) / (v m)
#pragma once

#include <string>
#include <vector>

namespace meshtron {

struct PipelineTask {
  enum Kind { Forward, Backward } kind;
  int micro_batch;
  int chunk;  ///< model chunk on this rank (0 unless interleaved)
  bool operator==(const PipelineTask&) const = default;
};

struct ScheduleShape {
  std::string name = "1f1b";  ///< gpipe | 1f1b | interleaved
  int pp = 1;                 ///< pipeline ranks
  int virtual_stages = 1;     ///< chunks per rank (interleaved)
  int micro_batches = 1;
};

/// The task order of pipeline rank `rank`; throws UserError for an
/// impossible shape (interleaved needs micro_batches % pp == 0).
std::vector<PipelineTask> schedule_tasks(const ScheduleShape& shape, int rank);

/// Largest number of micro-batches whose activations a rank holds at once.
int max_in_flight(const std::vector<PipelineTask>& tasks);

}  // namespace meshtron
