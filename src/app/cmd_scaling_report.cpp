// meshtron scaling-report RUN_DIR... [--output DIR]
//
//   meshtron scaling-report runs/strong-1 runs/strong-2 runs/strong-4 --output report
//   meshtron scaling-report runs --output report     (every run folder under runs/)
//
// Reads each run's metrics and resolved deck (scaling_report.hpp) and writes
// DIR/scaling.md, DIR/scaling.csv, and through gnuplot DIR/scaling.png and
// DIR/scaling.svg (with the data and script it plotted, scaling.dat and
// scaling.gp, to restyle by hand). The markdown table is also printed.
#include <mpi.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "app/commands.hpp"
#include "app/scaling_report.hpp"
#include "common/error.hpp"

namespace meshtron::app {

namespace {

namespace fs = std::filesystem;

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  MESH_REQUIRE(out.good(), "scaling-report: cannot write " << path.string());
}

}  // namespace

int run_scaling_report(const std::vector<std::string>& args) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MESH_REQUIRE(world == 1, "scaling-report runs on one rank (not under mpirun or srun)");
  std::vector<std::string> dirs;
  fs::path out = "scaling-report";
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--output") {
      MESH_REQUIRE(i + 1 < args.size(), "scaling-report: --output needs a folder");
      out = args[++i];
    } else {
      MESH_REQUIRE(args[i].rfind("--", 0) != 0,
                   "scaling-report: unknown argument '" << args[i] << "'");
      dirs.push_back(args[i]);
    }
  }
  const std::vector<ScalingPoint> points = read_scaling_points(dirs);
  fs::create_directories(out);
  const std::string table = scaling_markdown(points);
  write_file(out / "scaling.md", table);
  write_file(out / "scaling.csv", scaling_csv(points));
  write_file(out / "scaling.dat", scaling_gnuplot_data(points));
  write_file(out / "scaling.gp", scaling_gnuplot_script(points, (out / "scaling.dat").string(),
                                                        (out / "scaling").string()));
  std::cout << table;
  run_gnuplot((out / "scaling.gp").string());
  std::cout << "wrote " << (out / "scaling").string() << ".{md,csv,png,svg}\n";
  return 0;
}

}  // namespace meshtron::app
