// Small MPI helpers for tests.
#pragma once

#include <mpi.h>

namespace meshtron::testing_util {

inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

}  // namespace meshtron::testing_util
