// meshtron inspect CKPT.h5: print a checkpoint's train state, the topology
// that wrote it, and every tensor with its dtype, global shape and checksum
// status (each dataset is read in full through its Fletcher32 filter).
//
//   meshtron inspect checkpoints/iter_0000100.h5
//
// Serial: rank 0 does the work; under mpirun the other ranks only share its
// outcome, so errors stay one line and the exit status is the same everywhere.
// Exit status: 0 when every checksum holds, 1 otherwise.
#include <mpi.h>

#include <algorithm>
#include <iomanip>
#include <iostream>

#include "app/commands.hpp"
#include "common/error.hpp"
#include "io/checkpoint.hpp"

namespace meshtron::app {

namespace {

void print_info(const io::CheckpointInfo& info, std::ostream& out) {
  const io::TrainState& s = info.state;
  out << "checkpoint: " << info.path << "\n"
      << "format version: " << info.format_version << "\n"
      << "iteration: " << s.iteration << "\n"
      << "consumed samples: " << s.consumed_samples << "\n"
      << "optimizer step: " << s.optimizer_step << "  skipped steps: " << s.skipped_steps
      << "  loss scale: " << s.loss_scale << " (" << s.loss_scale_good_steps
      << " good steps since its last change)  seed: " << s.seed << "\n"
      << "written by: tp=" << info.tp << " pp=" << info.pp << " dp=" << info.dp
      << " (world " << info.world << ")\n"
      << "optimizer state: " << (info.has_optimizer_state ? "yes" : "no") << "\n"
      << "deck text: " << s.deck_text.size() << " bytes, data sampler state: "
      << s.data_sampler_state.size() << " bytes\n"
      << "tensors: " << info.tensors.size() << "\n";
  std::size_t width = 0;
  for (const auto& t : info.tensors) width = std::max(width, t.path.size());
  for (const auto& t : info.tensors) {
    out << "  " << std::left << std::setw(int(width)) << t.path << std::right << " " << t.dtype << " " << shape_string(t.shape) << "  "
        << (t.checksum_ok ? "OK" : "FAILED: " + t.error) << "\n";
  }
  std::size_t failed = 0;
  for (const auto& t : info.tensors) failed += !t.checksum_ok;
  if (failed == 0) {
    out << "checksum: OK (" << info.tensors.size() << " datasets)\n";
  } else {
    out << "checksum: FAILED in " << failed << " of " << info.tensors.size() << " datasets:";
    for (const auto& t : info.tensors)
      if (!t.checksum_ok) out << " " << t.path;
    out << "\n";
  }
}

}  // namespace

int run_inspect(const std::vector<std::string>& args) {
  MESH_REQUIRE(args.size() == 1 && args[0].rfind("--", 0) != 0,
               "usage: meshtron inspect CKPT.h5");
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string error;
  int status = 0;
  if (rank == 0) {
    try {
      const io::CheckpointInfo info = io::inspect_checkpoint(args[0]);
      print_info(info, std::cout);
      std::cout.flush();
      status = info.checksums_ok() ? 0 : 1;
    } catch (const UserError& e) {
      error = e.what();
    }
  }
  int error_len = int(error.size());
  MPI_Bcast(&error_len, 1, MPI_INT, 0, MPI_COMM_WORLD);
  error.resize(std::size_t(error_len));
  MPI_Bcast(error.data(), error_len, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (!error.empty()) throw UserError(error);
  MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return status;
}

}  // namespace meshtron::app
