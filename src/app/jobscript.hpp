// Batch scripts for `meshtron jobscript`: the text of a Slurm or PBS job
// that trains a deck with one MPI rank per GPU (or a given number of CPU
// ranks per node), saves ahead of the walltime and goes on in a requeued or
// resubmitted job from its latest checkpoint (checkpoint.load = auto).
//
// Plain functions of plain values, so the scripts are unit-tested as text;
// cmd_jobscript.cpp reads the command line and the decks.
#pragma once

#include <string>
#include <vector>

#include "config/run_config.hpp"

namespace meshtron::app {

/// One job: where and how long it runs, and what it trains.
struct JobSpec {
  std::string scheduler;          ///< slurm | pbs
  int nodes = 1;
  int ranks_per_node = 1;         ///< GPUs per node on cuda decks, CPU ranks otherwise
  bool gpu = false;               ///< run.device = cuda: one GPU per rank
  int cpus_per_rank = 1;
  std::string time = "01:00:00";  ///< walltime, [D-]HH:MM:SS
  std::string account, partition; ///< "" = the site's default
  std::string job_name;
  std::string meshtron;           ///< the executable
  /// Relative paths here, in the overrides and in the decks resolve from
  /// the folder the job is submitted from, as when run by hand there.
  std::vector<std::string> decks;
  std::vector<std::string> overrides;  ///< "section.key=value", the job's own appended
  std::string save_dir;           ///< checkpoint.save_dir, for the "finished?" test
  long train_iters = 0;
  std::string script_path;        ///< where the script is written ("" = stdout): PBS resubmits it
  std::string command_line;       ///< the jobscript command that wrote it, for its header

  int world() const { return nodes * ranks_per_node; }
};

/// `base` then `later` ("section.key=value" each), an entry of `base`
/// dropped where `later` sets the same key: --set takes a key once.
std::vector<std::string> merge_overrides(const std::vector<std::string>& base,
                                         const std::vector<std::string>& later);

/// "[D-]HH:MM:SS" -> seconds; a UserError naming `flag` otherwise.
long walltime_seconds(const std::string& text, const std::string& flag);
/// Seconds ahead of the walltime at which the job asks the run to save:
/// a tenth of the walltime, at least 60 s (Slurm delivers --signal up to a
/// minute early or late) and at most 600 s (a save of a 1.5B-parameter
/// model's weights and Adam states, 18 GB, takes well under that on a
/// parallel file system).
long signal_lead_seconds(long walltime_s);

/// The batch script of `job` for its scheduler.
std::string job_script(const JobSpec& job);
std::string slurm_script(const JobSpec& job);
std::string pbs_script(const JobSpec& job);

/// One point of a scaling sweep: the ranks and the overrides that make it.
struct SweepPoint {
  int ranks = 0;
  int nodes = 1, ranks_per_node = 1;
  std::vector<std::string> overrides;  ///< dp, global batch, output and save folders
  std::string suffix;                  ///< "strong-4": names its folders and its job
};

/// The points of a weak or strong sweep of the deck `base` (parsed, not
/// validated) over `ranks` (1,2,4,8...) with at most `per_node` ranks a
/// node. Strong: the global batch of the largest point at every point.
/// Weak: the global batch of the smallest point times dp / dp_smallest.
/// Each point writes run.output_dir/<suffix> and checkpoint.save_dir/<suffix>.
/// UserError when a point's ranks do not fill whole nodes or are not a
/// multiple of tp x pp.
std::vector<SweepPoint> sweep_points(const RunConfig& base, const std::string& kind,
                                     const std::vector<int>& ranks, int per_node);

}  // namespace meshtron::app
