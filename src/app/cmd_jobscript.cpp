// meshtron jobscript DECK... [--set k=v ...] --scheduler slurm|pbs --nodes N
//     --gpus-per-node G | --ntasks-per-node T  [--cpus-per-task C]
//     [--time [D-]HH:MM:SS] [--account A] [--partition P] [--output FILE]
//     [--sweep weak|strong --points 1,2,4,8] [--meshtron PATH]
//
//   meshtron jobscript input_decks/gpt2-124m.deck --scheduler slurm --nodes 2
//       --gpus-per-node 4 --time 24:00:00 --output gpt2.sbatch
//   meshtron jobscript input_decks/gpt-tiny.deck --scheduler slurm
//       --ntasks-per-node 4 --sweep strong --points 2,4 --output sweep/tiny.sbatch
//
// Writes the batch script (jobscript.hpp) after validating the decks on the
// job's world, so a bad layout fails here and not in the queue. Paths stay
// as given: submit the job from the folder this command ran in. The
// executable is this one unless --meshtron names another. A sweep
// writes one script per point, FILE's stem + "-strong-4" + its extension.
// One rank does the work: the command is a tool, not an MPI job.
#include <mpi.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "app/commands.hpp"
#include "app/jobscript.hpp"
#include "common/error.hpp"

namespace meshtron::app {

namespace {

namespace fs = std::filesystem;

struct JobscriptArgs {
  DeckArgs decks;
  std::map<std::string, std::string> flags;  ///< "--nodes" -> "2"

  bool has(const std::string& flag) const { return flags.count(flag) > 0; }
  std::string text(const std::string& flag, const std::string& fallback = "") const {
    const auto it = flags.find(flag);
    return it == flags.end() ? fallback : it->second;
  }
  int count(const std::string& flag, int fallback) const {
    const std::string v = text(flag);
    if (v.empty()) return fallback;
    std::size_t used = 0;
    int n = 0;
    try {
      n = std::stoi(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MESH_REQUIRE(used == v.size() && n >= 1, "jobscript: " << flag << " '" << v
                                                 << "' is not a positive whole number");
    return n;
  }
};

const char* const kFlags[] = {"--scheduler", "--nodes",     "--gpus-per-node", "--ntasks-per-node",
                              "--cpus-per-task", "--time",  "--account",       "--partition",
                              "--output",    "--sweep",     "--points",        "--meshtron"};

JobscriptArgs parse_args(const std::vector<std::string>& args) {
  JobscriptArgs out;
  out.decks = parse_deck_args(args);
  const auto& rest = out.decks.rest;
  for (std::size_t i = 0; i < rest.size(); ++i) {
    std::string flag = rest[i], value;
    if (const auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag.resize(eq);
    } else {
      MESH_REQUIRE(i + 1 < rest.size(), "jobscript: " << flag << " needs a value");
      value = rest[++i];
    }
    MESH_REQUIRE(std::find(std::begin(kFlags), std::end(kFlags), flag) != std::end(kFlags),
                 "jobscript: unknown argument '" << flag << "'");
    out.flags[flag] = value;
  }
  MESH_REQUIRE(out.has("--scheduler"), "jobscript: --scheduler slurm|pbs is required");
  return out;
}

std::vector<int> parse_points(const std::string& text) {
  std::vector<int> points;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    JobscriptArgs one;
    one.flags["--points"] = item;
    points.push_back(one.count("--points", 0));
  }
  return points;
}

/// Ranks per node: the deck's device decides which flag gives them.
int ranks_per_node(const JobscriptArgs& a, bool gpu) {
  if (gpu) {
    MESH_REQUIRE(a.has("--gpus-per-node"),
                 "jobscript: the deck runs on GPUs (run.device = cuda): give --gpus-per-node");
    MESH_REQUIRE(!a.has("--ntasks-per-node"),
                 "jobscript: --ntasks-per-node is for CPU decks; GPU decks run one rank per "
                 "GPU (--gpus-per-node)");
    return a.count("--gpus-per-node", 1);
  }
  MESH_REQUIRE(!a.has("--gpus-per-node"),
               "jobscript: the deck runs on CPU ranks (run.device = cpu): give "
               "--ntasks-per-node instead of --gpus-per-node");
  return a.count("--ntasks-per-node", 1);
}

std::string this_executable() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("meshtron") : self.string();
}

JobSpec base_job(const JobscriptArgs& a, const RunConfig& deck,
                 const std::vector<std::string>& args) {
  JobSpec job;
  job.scheduler = a.text("--scheduler");
  job.gpu = deck.run.device == "cuda";
  job.ranks_per_node = ranks_per_node(a, job.gpu);
  job.nodes = a.count("--nodes", 1);
  job.cpus_per_rank = a.count("--cpus-per-task", 1);
  job.time = a.text("--time", job.time);
  job.account = a.text("--account");
  job.partition = a.text("--partition");
  job.job_name = "meshtron-" + deck.run.name;
  job.meshtron = a.has("--meshtron") ? a.text("--meshtron") : this_executable();
  job.decks = a.decks.decks;
  job.command_line = "meshtron jobscript";
  for (const auto& arg : args) job.command_line += " " + arg;
  job.overrides = a.decks.overrides;
  return job;
}

/// Validates the decks with the job's overrides on its world (the errors
/// name the keys) and takes what the script needs from them.
void check_job(JobSpec& job, const DeckArgs& decks) {
  RunConfig c = RunConfig::from_files(decks.decks, merge_overrides(job.overrides, {"checkpoint.load=auto"}));
  c.validate(job.world());
  MESH_REQUIRE(!c.checkpoint.save_dir.empty(),
               "jobscript: checkpoint.save_dir is empty: a requeued job would start over; "
               "set it in the deck or with --set");
  job.save_dir = c.checkpoint.save_dir;
  job.train_iters = c.training.train_iters;
  walltime_seconds(job.time, "--time");
  (void)job_script(job);  // the scheduler's name
}

void write_script(const JobSpec& job) {
  const std::string text = job_script(job);
  if (job.script_path.empty()) {
    std::cout << text;
    return;
  }
  const fs::path path(job.script_path);
  if (path.has_parent_path()) fs::create_directories(path.parent_path());
  std::ofstream out(path);
  out << text;
  MESH_REQUIRE(out.good(), "jobscript: cannot write " << path.string());
  out.close();
  fs::permissions(path, fs::perms::owner_exec | fs::perms::group_exec, fs::perm_options::add);
  std::cout << "wrote " << path.string() << " (" << job.world() << " ranks)\n";
}

/// FILE's stem + "-" + suffix + FILE's extension; "<job name>-<suffix>.sh" without FILE.
std::string point_path(const std::string& output, const std::string& job_name,
                       const std::string& suffix) {
  if (output.empty()) return job_name + "-" + suffix + ".sh";
  const fs::path p(output);
  return (p.parent_path() / (p.stem().string() + "-" + suffix + p.extension().string()))
      .string();
}

}  // namespace

int run_jobscript(const std::vector<std::string>& args) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MESH_REQUIRE(world == 1, "jobscript runs on one rank (not under mpirun or srun)");
  const JobscriptArgs a = parse_args(args);
  const RunConfig deck = read_decks(a.decks, "jobscript");
  JobSpec job = base_job(a, deck, args);
  if (!a.has("--sweep")) {
    MESH_REQUIRE(!a.has("--points"), "jobscript: --points needs --sweep weak|strong");
    job.script_path = a.text("--output");
    check_job(job, a.decks);
    write_script(job);
    return 0;
  }
  const std::vector<SweepPoint> points = sweep_points(
      deck, a.text("--sweep"), parse_points(a.text("--points")), job.ranks_per_node);
  std::vector<JobSpec> jobs;
  for (const SweepPoint& p : points) {
    JobSpec point = job;
    point.nodes = p.nodes;
    point.ranks_per_node = p.ranks_per_node;
    point.job_name = job.job_name + "-" + p.suffix;
    point.overrides = merge_overrides(job.overrides, p.overrides);
    point.script_path = point_path(a.text("--output"), job.job_name, p.suffix);
    check_job(point, a.decks);
    jobs.push_back(std::move(point));
  }
  for (const JobSpec& j : jobs) write_script(j);  // only once every point is valid
  return 0;
}

}  // namespace meshtron::app
