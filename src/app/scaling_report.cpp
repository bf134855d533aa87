#include "app/scaling_report.hpp"

#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.hpp"
#include "config/run_config.hpp"
#include "train/metrics.hpp"

extern char** environ;

namespace meshtron::app {

namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  MESH_REQUIRE(in.good(), "scaling-report: cannot read " << path.string());
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// The step lines' throughput, MFU and memory; the validation lines (no
/// "tokens_per_s_per_rank") are skipped.
void read_metrics(const fs::path& path, ScalingPoint& p) {
  std::ifstream in(path);
  MESH_REQUIRE(in.good(), "scaling-report: cannot read " << path.string());
  std::vector<double> throughput, mfu;
  long line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.empty()) continue;
    const auto rec = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    MESH_REQUIRE(rec.is_object(), "scaling-report: " << path.string() << ":" << line_no
                                                     << " is not a JSON object");
    if (!rec.contains("tokens_per_s_per_rank")) continue;
    throughput.push_back(rec["tokens_per_s_per_rank"].get<double>());
    mfu.push_back(rec.value("mfu", 0.0));
    p.memory_mib = std::max(p.memory_mib, rec.value("memory_mib", 0.0));
  }
  MESH_REQUIRE(!throughput.empty(), "scaling-report: " << path.string() << " has no step lines");
  p.steps_logged = long(throughput.size());
  if (throughput.size() > 1) {  // the first window holds the warm-up
    throughput.erase(throughput.begin());
    mfu.erase(mfu.begin());
  }
  p.tokens_per_s_per_rank = median(throughput);
  p.mfu = median(mfu);
}

bool is_run_folder(const fs::path& dir) { return fs::exists(dir / kResolvedDeckFile); }

std::string rank_word(const std::vector<ScalingPoint>& points) {
  return !points.empty() && points.front().gpu ? "GPUs" : "ranks";
}

}  // namespace

ScalingPoint read_scaling_point(const std::string& dir) {
  const fs::path folder(dir);
  MESH_REQUIRE(is_run_folder(folder), "scaling-report: " << dir << " holds no " << kResolvedDeckFile
                                                         << " (not a run folder of meshtron train)");
  const RunConfig c =
      RunConfig::from_text(read_file(folder / kResolvedDeckFile), {}, (folder / kResolvedDeckFile).string());
  ScalingPoint p;
  p.dir = dir;
  p.gpu = c.run.device == "cuda";
  p.tp = c.parallel.tensor_parallel;
  p.pp = c.parallel.pipeline_parallel;
  p.dp = std::max(c.parallel.data_parallel, 1);
  p.world = p.tp * p.pp * p.dp;
  p.global_batch = c.training.global_batch_size;
  read_metrics(folder / c.logging.metrics_file, p);
  return p;
}

std::vector<ScalingPoint> read_scaling_points(const std::vector<std::string>& dirs) {
  MESH_REQUIRE(!dirs.empty(), "scaling-report: give the run folders (or a folder above them)");
  std::vector<ScalingPoint> points;
  for (const auto& d : dirs) {
    MESH_REQUIRE(fs::is_directory(d), "scaling-report: " << d << " is not a folder");
    if (is_run_folder(d)) {
      points.push_back(read_scaling_point(d));
      continue;
    }
    std::vector<std::string> found;
    for (const auto& e : fs::recursive_directory_iterator(d))
      if (e.is_directory() && is_run_folder(e.path())) found.push_back(e.path().string());
    MESH_REQUIRE(!found.empty(), "scaling-report: no run folder (with " << kResolvedDeckFile
                                                                        << ") under " << d);
    std::sort(found.begin(), found.end());
    for (const auto& f : found) points.push_back(read_scaling_point(f));
  }
  std::stable_sort(points.begin(), points.end(),
                   [](const ScalingPoint& a, const ScalingPoint& b) { return a.world < b.world; });
  return points;
}

double scaling_efficiency(const ScalingPoint& p, const ScalingPoint& smallest) {
  return p.tokens_per_s_per_rank / smallest.tokens_per_s_per_rank;
}

std::string scaling_markdown(const std::vector<ScalingPoint>& points) {
  std::ostringstream os;
  os << "| " << rank_word(points) << " | tp x pp x dp | global batch | tokens/s | tokens/s per "
     << (rank_word(points) == "GPUs" ? "GPU" : "rank")
     << " | efficiency | MFU | peak memory (MiB) | run |\n"
     << "|---:|:---:|---:|---:|---:|---:|---:|---:|:---|\n";
  for (const ScalingPoint& p : points) {
    os << std::fixed << "| " << p.world << " | " << p.tp << " x " << p.pp << " x " << p.dp
       << " | " << p.global_batch << " | " << std::setprecision(0) << p.tokens_per_s() << " | "
       << p.tokens_per_s_per_rank << " | " << std::setprecision(1)
       << 100 * scaling_efficiency(p, points.front()) << " % | " << 100 * p.mfu << " % | "
       << std::setprecision(0) << p.memory_mib << " | " << p.dir << " |\n";
  }
  return os.str();
}

std::string scaling_csv(const std::vector<ScalingPoint>& points) {
  std::ostringstream os;
  os << "ranks,gpu,tp,pp,dp,global_batch,tokens_per_s,tokens_per_s_per_rank,efficiency,mfu,"
        "memory_mib,steps_logged,run\n"
     << std::setprecision(8);
  for (const ScalingPoint& p : points)
    os << p.world << "," << (p.gpu ? 1 : 0) << "," << p.tp << "," << p.pp << "," << p.dp << ","
       << p.global_batch << "," << p.tokens_per_s() << "," << p.tokens_per_s_per_rank << ","
       << scaling_efficiency(p, points.front()) << "," << p.mfu << "," << p.memory_mib << ","
       << p.steps_logged << ",\"" << p.dir << "\"\n";
  return os.str();
}

std::string scaling_gnuplot_data(const std::vector<ScalingPoint>& points) {
  std::ostringstream os;
  os << "# ranks tokens_per_s tokens_per_s_per_rank efficiency mfu_percent memory_mib\n"
     << std::setprecision(8);
  for (const ScalingPoint& p : points)
    os << p.world << " " << p.tokens_per_s() << " " << p.tokens_per_s_per_rank << " "
       << scaling_efficiency(p, points.front()) << " " << 100 * p.mfu << " " << p.memory_mib
       << "\n";
  return os.str();
}

std::string scaling_gnuplot_script(const std::vector<ScalingPoint>& points,
                                   const std::string& data_file, const std::string& stem) {
  const std::string x = rank_word(points);
  const std::string per = x == "GPUs" ? "GPU" : "rank";
  std::ostringstream panels;
  panels << "set xlabel '" << x << "'\n"
         << "set logscale x 2\n"
         << "set grid\n"
         << "set key off\n"
         << "set offsets graph 0.05, graph 0.05, graph 0.1, 0\n"
         << "set yrange [0:*]  # from zero: a drop reads at its true size\n"
         << "set multiplot layout 2,2 title 'meshtron scaling'\n"
         << "set ylabel 'tokens/s per " << per << "'\n"
         << "plot '" << data_file << "' using 1:3 with linespoints pt 7\n"
         << "set ylabel 'efficiency (per-" << per << " throughput / smallest run)'\n"
         << "plot '" << data_file << "' using 1:4 with linespoints pt 7, 1 dt 2\n"
         << "set ylabel 'MFU (%)'\n"
         << "plot '" << data_file << "' using 1:5 with linespoints pt 7\n"
         << "set ylabel 'peak memory per " << per << " (MiB)'\n"
         << "plot '" << data_file << "' using 1:6 with linespoints pt 7\n"
         << "unset multiplot\n";
  std::ostringstream os;
  os << "# gnuplot script written by meshtron scaling-report\n"
     << "set terminal png size 1200,900\n"
     << "set output '" << stem << ".png'\n"
     << panels.str()
     << "set terminal svg size 1200,900 dynamic\n"
     << "set output '" << stem << ".svg'\n"
     << panels.str() << "set output\n";
  return os.str();
}

void run_gnuplot(const std::string& script_file) {
  char prog[] = "gnuplot";
  std::string arg = script_file;
  char* argv[] = {prog, arg.data(), nullptr};
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, prog, nullptr, nullptr, argv, environ);
  MESH_REQUIRE(err != ENOENT, "scaling-report: gnuplot is not installed (Debian: apt-get install "
                              "gnuplot-nox); the table is written, the plots are not");
  MESH_REQUIRE(err == 0, "scaling-report: cannot start gnuplot: " << std::strerror(err));
  int status = 0;
  waitpid(pid, &status, 0);
  MESH_REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0,
               "scaling-report: gnuplot failed on " << script_file);
}

}  // namespace meshtron::app
