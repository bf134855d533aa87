// `meshtron scaling-report`: the runs of a scaling sweep (jobscript --sweep)
// as a table and plots. Each run folder holds the step lines of
// logging.metrics_file (train/metrics.hpp) and the resolved deck
// (kResolvedDeckFile), which gives its layout.
#pragma once

#include <string>
#include <vector>

namespace meshtron::app {

/// One run folder, summarised.
struct ScalingPoint {
  std::string dir;
  bool gpu = false;  ///< run.device = cuda: the ranks are GPUs
  int world = 1, tp = 1, pp = 1, dp = 1;
  long global_batch = 0;
  long steps_logged = 0;
  /// Medians over the step lines after the first (whose window holds the
  /// warm-up: first allocations, GEMM plans); the only one when alone.
  double tokens_per_s_per_rank = 0, mfu = 0;
  double memory_mib = 0;  ///< the largest of the run's peaks (max over ranks)

  double tokens_per_s() const { return tokens_per_s_per_rank * world; }
};

/// The run in `dir`: a UserError naming the missing or unreadable file.
ScalingPoint read_scaling_point(const std::string& dir);
/// Each of `dirs` is a run folder, or a folder whose subfolders (at any
/// depth) are; the runs sorted by world size. A UserError when none is found.
std::vector<ScalingPoint> read_scaling_points(const std::vector<std::string>& dirs);

/// Per-rank throughput relative to the smallest run's: 1 is perfect
/// scaling, weak or strong alike (strong: the same tokens per step over
/// more ranks; weak: more tokens per step).
double scaling_efficiency(const ScalingPoint& p, const ScalingPoint& smallest);

std::string scaling_markdown(const std::vector<ScalingPoint>& points);
std::string scaling_csv(const std::vector<ScalingPoint>& points);
/// Whitespace-separated columns for gnuplot: ranks, tokens/s, tokens/s per
/// rank, efficiency, MFU %, memory MiB.
std::string scaling_gnuplot_data(const std::vector<ScalingPoint>& points);
/// A gnuplot script that plots `data_file` (scaling_gnuplot_data) as four
/// panels (throughput per rank, efficiency, MFU, memory against ranks) into
/// `stem`.png and `stem`.svg.
std::string scaling_gnuplot_script(const std::vector<ScalingPoint>& points,
                                   const std::string& data_file, const std::string& stem);
/// Runs `gnuplot script_file`; a one-line UserError when gnuplot is not
/// installed or fails.
void run_gnuplot(const std::string& script_file);

}  // namespace meshtron::app
