#include "common/error.hpp"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>

namespace meshtron {

int world_rank_or_minus_one() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return -1;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

void fatal(const std::string& what, const char* file, int line) {
  const int rank = world_rank_or_minus_one();
  std::fprintf(stderr, "meshtron: fatal: %s (%s:%d, rank %d)\n", what.c_str(),
               file, line, rank);
  std::fflush(stderr);
  if (rank >= 0) MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

}  // namespace meshtron
