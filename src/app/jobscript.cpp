#include "app/jobscript.hpp"

#include <algorithm>
#include <cstdio>
#include <regex>
#include <sstream>

#include "common/error.hpp"

namespace meshtron::app {

namespace {

/// `word` as one shell word: as it is when it holds only safe characters,
/// else in single quotes.
std::string shell_quote(const std::string& word) {
  static const std::regex safe("[A-Za-z0-9_./=:,+@%-]+");
  if (std::regex_match(word, safe)) return word;
  std::string out = "'";
  for (char ch : word) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

/// "meshtron train DECK... --set k=v ..." with the script's own overrides last.
std::string train_command(const JobSpec& job, const std::vector<std::string>& own) {
  std::ostringstream os;
  os << shell_quote(job.meshtron) << " train";
  for (const auto& d : job.decks) os << " " << shell_quote(d);
  for (const auto& o : merge_overrides(job.overrides, own))
    os << " \\\n    --set " << shell_quote(o);
  return os.str();
}

std::string override_key(const std::string& o) { return o.substr(0, o.find('=')); }

std::string environment(const JobSpec& job) {
  std::ostringstream os;
  os << "# Host threads per rank (OpenBLAS and OpenMP), as many as its CPUs.\n"
     << "export OMP_NUM_THREADS=" << job.cpus_per_rank
     << " OPENBLAS_NUM_THREADS=" << job.cpus_per_rank << "\n";
  if (job.gpu) {
    os << "# NCCL: one line naming the failing call and peer when a collective fails.\n"
       << "export NCCL_DEBUG=${NCCL_DEBUG:-WARN}\n"
       << "# Tensors move between GPUs through NCCL, which finds NVLink and InfiniBand\n"
       << "# itself; MPI (UCX under Open MPI) carries only small host messages, so\n"
       << "# UCX_TLS is left to the site. Where NCCL's bootstrap picks the wrong\n"
       << "# network interface, name it:\n"
       << "# export NCCL_SOCKET_IFNAME=ib0\n";
  }
  return os.str();
}

/// Runs the launcher in the background and passes `signal` on to it, so
/// the ranks save while the script waits (`wait` returns early when a trap
/// runs, hence the loop).
std::string launch_and_wait(const std::string& launcher, const std::string& signal) {
  std::ostringstream os;
  os << "launcher=\n"
     << "trap 'kill -USR1 \"$launcher\" 2>/dev/null || true' " << signal << "\n"
     << launcher << " &\n"
     << "launcher=$!\n"
     << "status=0\n"
     << "while kill -0 \"$launcher\" 2>/dev/null; do\n"
     << "  wait \"$launcher\" && status=0 || status=$?\n"
     << "done\n";
  return os.str();
}

/// A bash function: true while the latest checkpoint (its file name holds
/// the iteration, iter_0000150.h5) is short of training.train_iters.
std::string unfinished_function(const JobSpec& job) {
  std::ostringstream os;
  os << "unfinished() {\n"
     << "  local latest\n"
     << "  latest=$(cat " << shell_quote(job.save_dir + "/latest") << " 2>/dev/null) || return 1\n"
     << "  latest=${latest#iter_}\n"
     << "  (( 10#${latest%.h5} < " << job.train_iters << " ))\n"
     << "}\n";
  return os.str();
}

std::string deck_list(const JobSpec& job) {
  std::string out;
  for (const auto& d : job.decks) out += (out.empty() ? "" : " ") + d;
  return out;
}

/// "# written by: meshtron jobscript ...\n", or "" without a command line.
std::string written_by(const JobSpec& job) {
  return job.command_line.empty() ? "" : "# written by: " + job.command_line + "\n";
}

std::string layout_line(const JobSpec& job) {
  std::ostringstream os;
  os << job.nodes << " node(s) x " << job.ranks_per_node
     << (job.gpu ? " GPU(s), one MPI rank per GPU" : " CPU rank(s)");
  return os.str();
}

/// PBS takes HH:MM:SS only (hours may pass 24).
std::string pbs_walltime(long seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%02ld:%02ld:%02ld", seconds / 3600, seconds / 60 % 60,
                seconds % 60);
  return buf;
}

}  // namespace

std::vector<std::string> merge_overrides(const std::vector<std::string>& base,
                                         const std::vector<std::string>& later) {
  std::vector<std::string> out;
  for (const auto& o : base) {
    const bool replaced = std::any_of(later.begin(), later.end(), [&](const std::string& l) {
      return override_key(l) == override_key(o);
    });
    if (!replaced) out.push_back(o);
  }
  out.insert(out.end(), later.begin(), later.end());
  return out;
}

long walltime_seconds(const std::string& text, const std::string& flag) {
  static const std::regex form("(?:([0-9]+)-)?([0-9]+):([0-5][0-9]):([0-5][0-9])");
  std::smatch m;
  MESH_REQUIRE(std::regex_match(text, m, form),
               flag << " '" << text << "' is not a walltime [D-]HH:MM:SS");
  const long days = m[1].matched ? std::stol(m[1]) : 0;
  const long s = ((days * 24 + std::stol(m[2])) * 60 + std::stol(m[3])) * 60 + std::stol(m[4]);
  MESH_REQUIRE(s >= 300, flag << " " << text << " is shorter than 00:05:00: no time to "
                              "save ahead of it");
  return s;
}

long signal_lead_seconds(long walltime_s) {
  return std::clamp(walltime_s / 10, 60L, 600L);
}

std::string slurm_script(const JobSpec& job) {
  const long lead = signal_lead_seconds(walltime_seconds(job.time, "--time"));
  std::ostringstream os;
  os << "#!/bin/bash\n"
     << "# meshtron train " << deck_list(job) << "\n"
     << "# on " << layout_line(job) << ".   sbatch THIS_FILE (from the folder\n"
     << "# that the relative paths below start from)\n"
     << written_by(job)
     << "# " << lead << " s before the time limit Slurm sends SIGUSR1 to this script\n"
     << "# (--signal=B:USR1@" << lead << "); it passes it to srun, which passes it to\n"
     << "# every rank: they finish the step, save a checkpoint and exit 0. While the\n"
     << "# latest checkpoint is short of the last iteration the script requeues the\n"
     << "# job, which resumes from it (checkpoint.load = auto).\n"
     << "#SBATCH --job-name=" << job.job_name << "\n"
     << "#SBATCH --nodes=" << job.nodes << "\n"
     << "#SBATCH --ntasks-per-node=" << job.ranks_per_node << "\n";
  if (job.gpu) os << "#SBATCH --gpus-per-node=" << job.ranks_per_node << "\n";
  os << "#SBATCH --cpus-per-task=" << job.cpus_per_rank << "\n"
     << "#SBATCH --time=" << job.time << "\n";
  if (!job.account.empty()) os << "#SBATCH --account=" << job.account << "\n";
  if (!job.partition.empty()) os << "#SBATCH --partition=" << job.partition << "\n";
  os << "#SBATCH --signal=B:USR1@" << lead << "\n"
     << "#SBATCH --requeue\n"
     << "#SBATCH --open-mode=append\n"
     << "#SBATCH --output=" << job.job_name << "-%j.out\n"
     << "set -euo pipefail  # in the folder sbatch ran in: relative paths resolve from it\n"
     << environment(job) << unfinished_function(job);
  // --mpi=pmix: Open MPI 4/5 and MPICH 4 take their rank and world from
  // PMIx. GPU ranks see every GPU of the node (--gpu-bind=none) and meshtron
  // takes GPU (node-local rank): NCCL's NVLink and CUDA IPC paths need the
  // peers' GPUs visible, which a one-GPU-per-task binding would hide.
  std::string srun = "srun --mpi=pmix --cpu-bind=cores";
  if (job.gpu) srun += " --gpu-bind=none";
  os << "# Every rank on its own cores" << (job.gpu ? "; rank r of a node drives GPU r." : ".")
     << "\n"
     << launch_and_wait(srun + " " + train_command(job, {"checkpoint.load=auto"}), "USR1")
     << "if (( status == 0 )) && unfinished; then\n"
     << "  echo \"requeueing job $SLURM_JOB_ID to resume from $(cat "
     << shell_quote(job.save_dir + "/latest") << ")\"\n"
     << "  scontrol requeue \"$SLURM_JOB_ID\"\n"
     << "fi\n"
     << "exit \"$status\"\n";
  return os.str();
}

std::string pbs_script(const JobSpec& job) {
  const long walltime = walltime_seconds(job.time, "--time");
  const long lead = signal_lead_seconds(walltime);
  // exit_duration_mins counts from the start of training: two leads short
  // of the walltime leave one for start-up and one for the save.
  const double exit_mins = double(walltime - 2 * lead) / 60.0;
  std::ostringstream os;
  os << "#!/bin/bash\n"
     << "# meshtron train " << deck_list(job) << "\n"
     << "# on " << layout_line(job) << ".   qsub THIS_FILE (from the folder\n"
     << "# that the relative paths below start from)\n"
     << written_by(job)
     << "# PBS sends no signal ahead of the walltime, so the run stops itself:\n"
     << "# run.exit_duration_mins = " << exit_mins << " saves a checkpoint and exits 0.\n"
     << "# A preemption's SIGTERM reaches the ranks as SIGUSR1 (mpirun forwards it),\n"
     << "# which save the same way. While the latest checkpoint is short of the last\n"
     << "# iteration the script submits itself again; the next job resumes from it\n"
     << "# (checkpoint.load = auto).\n"
     << "#PBS -N " << job.job_name << "\n"
     << "#PBS -l select=" << job.nodes << ":ncpus=" << job.ranks_per_node * job.cpus_per_rank;
  if (job.gpu) os << ":ngpus=" << job.ranks_per_node;
  os << ":mpiprocs=" << job.ranks_per_node << "\n"
     << "#PBS -l walltime=" << pbs_walltime(walltime) << "\n";
  if (!job.account.empty()) os << "#PBS -A " << job.account << "\n";
  if (!job.partition.empty()) os << "#PBS -q " << job.partition << "\n";
  os << "#PBS -r y\n"
     << "#PBS -j oe\n"
     << "set -euo pipefail\n"
     << "cd \"$PBS_O_WORKDIR\"  # where qsub ran: relative paths resolve from it\n"
     << environment(job) << unfinished_function(job);
  std::ostringstream mpirun;
  mpirun << "mpirun -np " << job.world() << " --map-by ppr:" << job.ranks_per_node
         << ":node:PE=" << job.cpus_per_rank << " --bind-to core";
  std::ostringstream exit_set;
  exit_set << "run.exit_duration_mins=" << exit_mins;
  os << "# Every rank on its own cores" << (job.gpu ? "; rank r of a node drives GPU r." : ".")
     << "\n"
     << launch_and_wait(mpirun.str() + " " +
                            train_command(job, {"checkpoint.load=auto", exit_set.str()}),
                        "TERM")
     << "if (( status == 0 )) && unfinished; then\n";
  if (job.script_path.empty())
    os << "  echo \"unfinished: submit this script again to resume\"\n";
  else
    os << "  qsub " << shell_quote(job.script_path) << "\n";
  os << "fi\n"
     << "exit \"$status\"\n";
  return os.str();
}

std::string job_script(const JobSpec& job) {
  if (job.scheduler == "slurm") return slurm_script(job);
  if (job.scheduler == "pbs") return pbs_script(job);
  throw UserError("--scheduler '" + job.scheduler + "' is not one of slurm | pbs");
}

namespace {

void require_fits(int ranks, int model_parallel, int per_node) {
  MESH_REQUIRE(ranks >= 1 && ranks % model_parallel == 0,
               "--points: " << ranks << " ranks is not a multiple of tensor_parallel x "
                            "pipeline_parallel = " << model_parallel);
  MESH_REQUIRE(ranks <= per_node || ranks % per_node == 0,
               "--points: " << ranks << " ranks do not fill whole nodes of " << per_node);
}

}  // namespace

std::vector<SweepPoint> sweep_points(const RunConfig& base, const std::string& kind,
                                     const std::vector<int>& ranks, int per_node) {
  MESH_REQUIRE(kind == "strong" || kind == "weak",
               "--sweep '" << kind << "' is not one of weak | strong");
  MESH_REQUIRE(!ranks.empty(), "--sweep needs --points, e.g. --points 1,2,4,8");
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  const int mp = base.parallel.tensor_parallel * base.parallel.pipeline_parallel;
  for (int n : sorted) require_fits(n, mp, per_node);
  const int mbs = base.training.micro_batch_size, deck_gbs = base.training.global_batch_size;
  const int dp_min = sorted.front() / mp, dp_max = sorted.back() / mp;
  std::vector<SweepPoint> points;
  for (int n : sorted) {
    SweepPoint p;
    p.ranks = n;
    p.ranks_per_node = std::min(n, per_node);
    p.nodes = n / p.ranks_per_node;
    p.suffix = kind + "-" + std::to_string(n);
    const int dp = n / mp;
    const long gbs = kind == "strong" ? (deck_gbs > 0 ? deck_gbs : long(mbs) * dp_max)
                                      : long(deck_gbs > 0 ? deck_gbs : mbs * dp_min) * dp / dp_min;
    p.overrides = {"parallel.data_parallel=" + std::to_string(dp),
                   "training.global_batch_size=" + std::to_string(gbs),
                   "run.output_dir=" + base.run.output_dir + "/" + p.suffix};
    if (!base.checkpoint.save_dir.empty())
      p.overrides.push_back("checkpoint.save_dir=" + base.checkpoint.save_dir + "/" + p.suffix);
    points.push_back(std::move(p));
  }
  return points;
}

}  // namespace meshtron::app
