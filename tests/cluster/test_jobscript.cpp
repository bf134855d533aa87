// jobscript.hpp and scaling_report.hpp as plain functions: the scripts'
// lines, the walltime arithmetic, the sweep's overrides, and a run folder
// read back into a table row.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "app/jobscript.hpp"
#include "app/scaling_report.hpp"
#include "common/expect_user_error.hpp"
#include "config/run_config.hpp"
#include "train/metrics.hpp"

namespace meshtron::app {
namespace {

namespace fs = std::filesystem;
using testing_util::expect_user_error;

bool has(const std::string& text, const std::string& piece) {
  return text.find(piece) != std::string::npos;
}

JobSpec gpu_job(const std::string& scheduler) {
  JobSpec j;
  j.scheduler = scheduler;
  j.nodes = 2;
  j.ranks_per_node = 4;
  j.gpu = true;
  j.cpus_per_rank = 8;
  j.time = "1-00:00:00";
  j.account = "proj42";
  j.partition = "gpu";
  j.job_name = "meshtron-gpt2";
  j.meshtron = "/opt/meshtron/bin/meshtron";
  j.decks = {"/scratch/me/gpt2 124m.deck"};
  j.overrides = {"training.train_iters=1000"};
  j.save_dir = "checkpoints/gpt2";
  j.train_iters = 1000;
  j.script_path = "/scratch/me/gpt2.pbs";
  return j;
}

/// `bash -n`: the script parses.
bool bash_parses(const std::string& script) {
  const fs::path path = fs::temp_directory_path() / "meshtron_jobscript_test.sh";
  std::ofstream(path) << script;
  const int status = std::system(("bash -n " + path.string()).c_str());
  fs::remove(path);
  return status == 0;
}

TEST(Walltime, ParsesAndRefusesWhatSchedulersWouldNot) {
  EXPECT_EQ(walltime_seconds("24:00:00", "--time"), 86400);
  EXPECT_EQ(walltime_seconds("1-02:03:04", "--time"), 93784);
  EXPECT_EQ(walltime_seconds("100:00:00", "--time"), 360000);
  expect_user_error([] { walltime_seconds("1:00", "--time"); }, {"--time '1:00'", "HH:MM:SS"});
  expect_user_error([] { walltime_seconds("00:61:00", "--time"); }, {"00:61:00"});
  expect_user_error([] { walltime_seconds("00:04:59", "--time"); }, {"shorter than 00:05:00"});
  EXPECT_EQ(signal_lead_seconds(300), 60);     // floor: Slurm's minute of slack
  EXPECT_EQ(signal_lead_seconds(3600), 360);   // a tenth
  EXPECT_EQ(signal_lead_seconds(86400), 600);  // ceiling
}

TEST(Jobscript, SlurmGpuJobBindsOneRankPerGpuSavesAndRequeues) {
  const std::string s = slurm_script(gpu_job("slurm"));
  for (const char* line :
       {"#SBATCH --nodes=2\n", "#SBATCH --ntasks-per-node=4\n", "#SBATCH --gpus-per-node=4\n",
        "#SBATCH --cpus-per-task=8\n", "#SBATCH --time=1-00:00:00\n",
        "#SBATCH --account=proj42\n", "#SBATCH --partition=gpu\n",
        "#SBATCH --signal=B:USR1@600\n", "#SBATCH --requeue\n", "#SBATCH --open-mode=append\n",
"export OMP_NUM_THREADS=8 OPENBLAS_NUM_THREADS=8\n",
        "export NCCL_DEBUG=${NCCL_DEBUG:-WARN}\n",
        "srun --mpi=pmix --cpu-bind=cores --gpu-bind=none /opt/meshtron/bin/meshtron train "
        "'/scratch/me/gpt2 124m.deck'",
        "--set training.train_iters=1000", "--set checkpoint.load=auto",
        "trap 'kill -USR1 \"$launcher\" 2>/dev/null || true' USR1\n",
        "latest=$(cat checkpoints/gpt2/latest 2>/dev/null)", "< 1000 ))",
        "scontrol requeue \"$SLURM_JOB_ID\""})
    EXPECT_TRUE(has(s, line)) << line << "\n" << s;
  EXPECT_FALSE(has(s, "exit_duration_mins")) << s;  // Slurm signals ahead of the limit
  EXPECT_TRUE(bash_parses(s)) << s;
}

TEST(Jobscript, SlurmCpuJobHasNoGpus) {
  JobSpec j = gpu_job("slurm");
  j.gpu = false;
  j.account.clear();
  j.partition.clear();
  const std::string s = job_script(j);
  EXPECT_FALSE(has(s, "gpus")) << s;
  EXPECT_FALSE(has(s, "NCCL")) << s;
  EXPECT_FALSE(has(s, "--account")) << s;
  EXPECT_FALSE(has(s, "--partition")) << s;
  EXPECT_TRUE(has(s, "srun --mpi=pmix --cpu-bind=cores /opt")) << s;
}

TEST(Jobscript, PbsStopsItselfFromTheWalltimeAndResubmits) {
  const std::string s = job_script(gpu_job("pbs"));
  for (const char* line :
       {"#PBS -l select=2:ncpus=32:ngpus=4:mpiprocs=4\n", "#PBS -l walltime=24:00:00\n",
        "#PBS -A proj42\n", "#PBS -q gpu\n", "#PBS -r y\n", "cd \"$PBS_O_WORKDIR\"",
        "mpirun -np 8 --map-by ppr:4:node:PE=8 --bind-to core",
        // 24 h less two leads of 600 s: start-up and the save
        "--set run.exit_duration_mins=1420", "--set checkpoint.load=auto",
        "trap 'kill -USR1 \"$launcher\" 2>/dev/null || true' TERM\n",
        "qsub /scratch/me/gpt2.pbs\n"})
    EXPECT_TRUE(has(s, line)) << line << "\n" << s;
  EXPECT_TRUE(bash_parses(s)) << s;
  expect_user_error([] { job_script(gpu_job("lsf")); }, {"--scheduler 'lsf'", "slurm | pbs"});
}

TEST(Jobscript, LaterOverridesReplaceEarlierOnesOfTheSameKey) {
  EXPECT_EQ(merge_overrides({"a.x=1", "b.y=2", "c.z=3"}, {"b.y=5", "d.w=6"}),
            (std::vector<std::string>{"a.x=1", "c.z=3", "b.y=5", "d.w=6"}));
  JobSpec j = gpu_job("slurm");
  j.overrides = {"checkpoint.load=some.h5"};  // the script's own wins: --set takes a key once
  const std::string s = job_script(j);
  EXPECT_FALSE(has(s, "some.h5")) << s;
  EXPECT_TRUE(has(s, "--set checkpoint.load=auto")) << s;
}

RunConfig tp2_deck() {
  RunConfig c = RunConfig::from_text(
      "[parallel]\ntensor_parallel = 2\n[training]\nmicro_batch_size = 2\n"
      "[run]\noutput_dir = runs\n[checkpoint]\nsave_dir = ck\n");
  return c;
}

TEST(Sweep, StrongKeepsTheLargestPointsGlobalBatch) {
  const auto points = sweep_points(tp2_deck(), "strong", {8, 2, 4, 16}, 4);
  ASSERT_EQ(points.size(), 4u);
  EXPECT_EQ(points[0].ranks, 2);
  EXPECT_EQ(points[0].suffix, "strong-2");
  EXPECT_EQ(points[0].overrides,
            (std::vector<std::string>{"parallel.data_parallel=1", "training.global_batch_size=16",
                                      "run.output_dir=runs/strong-2",
                                      "checkpoint.save_dir=ck/strong-2"}));
  EXPECT_EQ(points[3].overrides[0], "parallel.data_parallel=8");
  EXPECT_EQ(points[3].overrides[1], "training.global_batch_size=16");  // mbs 2 x dp 8
  EXPECT_EQ(points[2].nodes, 2);  // 8 ranks on nodes of 4
  EXPECT_EQ(points[2].ranks_per_node, 4);
  EXPECT_EQ(points[0].nodes, 1);
  EXPECT_EQ(points[0].ranks_per_node, 2);
}

TEST(Sweep, WeakScalesTheGlobalBatchWithDp) {
  const auto points = sweep_points(tp2_deck(), "weak", {2, 4, 8}, 8);
  ASSERT_EQ(points.size(), 3u);
  EXPECT_EQ(points[0].overrides[1], "training.global_batch_size=2");  // mbs 2 x dp 1
  EXPECT_EQ(points[1].overrides[1], "training.global_batch_size=4");
  EXPECT_EQ(points[2].overrides[1], "training.global_batch_size=8");
  EXPECT_EQ(points[2].overrides[2], "run.output_dir=runs/weak-8");
}

TEST(Sweep, RefusesPointsThatDoNotFit) {
  expect_user_error([] { sweep_points(tp2_deck(), "strong", {1, 2}, 4); },
                    {"--points: 1 ranks", "tensor_parallel x pipeline_parallel = 2"});
  expect_user_error([] { sweep_points(tp2_deck(), "strong", {6}, 4); },
                    {"6 ranks do not fill whole nodes of 4"});
  expect_user_error([] { sweep_points(tp2_deck(), "linear", {2}, 4); },
                    {"--sweep 'linear'", "weak | strong"});
}

/// A run folder as meshtron train leaves it: the resolved deck of `world`
/// ranks (tp 2) and step lines of the given throughputs.
fs::path fake_run(const std::string& name, int world, const std::vector<double>& tokens_per_s) {
  const fs::path dir = fs::temp_directory_path() / "meshtron_scaling_test" / name;
  fs::create_directories(dir);
  RunConfig c = tp2_deck();
  c.validate(world);
  std::ofstream(dir / kResolvedDeckFile) << c.resolved_text();
  std::ofstream metrics(dir / "metrics.jsonl");
  for (std::size_t i = 0; i < tokens_per_s.size(); ++i) {
    metrics << "{\"iteration\": " << i + 1 << ", \"tokens_per_s_per_rank\": " << tokens_per_s[i]
            << ", \"mfu\": 0.25, \"loss\": 4.0, \"memory_mib\": " << 100 + i << "}\n";
    metrics << "{\"iteration\": " << i + 1 << ", \"eval_loss\": 4.1, \"eval_ppl\": 60}\n";
  }
  return dir;
}

TEST(ScalingReport, ReadsRunsAndTabulatesEfficiency) {
  const fs::path root = fs::temp_directory_path() / "meshtron_scaling_test";
  fs::remove_all(root);
  fake_run("b", 4, {10, 800, 900, 700});  // first line (warm-up) left out: median 800
  fake_run("a", 2, {5, 1000, 1000});
  const auto points = read_scaling_points({root.string()});
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[0].world, 2);  // sorted by ranks
  EXPECT_EQ(points[0].tp, 2);
  EXPECT_EQ(points[1].dp, 2);
  EXPECT_DOUBLE_EQ(points[1].tokens_per_s_per_rank, 800);
  EXPECT_DOUBLE_EQ(points[1].tokens_per_s(), 3200);
  EXPECT_DOUBLE_EQ(points[1].memory_mib, 103);
  EXPECT_DOUBLE_EQ(scaling_efficiency(points[1], points[0]), 0.8);
  const std::string md = scaling_markdown(points);
  EXPECT_TRUE(has(md, "| 2 | 2 x 1 x 1 | 2 | 2000 | 1000 | 100.0 % | 25.0 % | 102 |")) << md;
  EXPECT_TRUE(has(md, "| 4 | 2 x 1 x 2 | 4 | 3200 | 800 | 80.0 % | 25.0 % | 103 |")) << md;
  const std::string csv = scaling_csv(points);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 3) << csv;
  const std::string gp = scaling_gnuplot_script(points, "d.dat", "out/scaling");
  EXPECT_TRUE(has(gp, "set output 'out/scaling.png'")) << gp;
  EXPECT_TRUE(has(gp, "set output 'out/scaling.svg'")) << gp;
  fs::remove_all(root);
}

TEST(ScalingReport, NamesWhatIsMissing) {
  const fs::path root = fs::temp_directory_path() / "meshtron_scaling_empty";
  fs::create_directories(root);
  expect_user_error([&] { read_scaling_points({root.string()}); },
                    {"no run folder", kResolvedDeckFile});
  const std::string old_path = std::getenv("PATH") ? std::getenv("PATH") : "";
  setenv("PATH", root.c_str(), 1);
  expect_user_error([] { run_gnuplot("x.gp"); }, {"gnuplot is not installed", "gnuplot-nox"});
  setenv("PATH", old_path.c_str(), 1);
  fs::remove_all(root);
}

}  // namespace
}  // namespace meshtron::app
