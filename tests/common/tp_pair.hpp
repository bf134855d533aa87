// A model on tp 2 against the same model on one rank: the world split into
// pairs of ranks, and every gradient element compared through the shard map.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstddef>

#include "common/mpi_test_util.hpp"
#include "model/parameter.hpp"
#include "parallel/communicator.hpp"
#include "parallel/mappings.hpp"

namespace meshtron::testing_util {

/// Ranks (0, 1), (2, 3), ... as tp 2 groups (`two`), beside each rank alone
/// as tp 1 (`one`, the reference). Needs an even world.
class TpPair {
 public:
  TpPair() : comm_(split()), pair_(comm_) {}
  ~TpPair() { MPI_Comm_free(&comm_); }
  TpPair(const TpPair&) = delete;
  TpPair& operator=(const TpPair&) = delete;
  MPI_Comm comm() const { return comm_; }

 private:
  static MPI_Comm split() {
    MPI_Comm pair;
    MPI_Comm_split(MPI_COMM_WORLD, world_rank() / 2, 0, &pair);
    return pair;
  }
  MPI_Comm comm_;  ///< Owned.
  MpiCommunicator self_{MPI_COMM_SELF}, pair_;

 public:
  TensorParallelGroup one{self_}, two{pair_};
};

/// Each local gradient element of `got` (tp 2, this rank `tp_rank`) equals
/// its global one of `want` (tp 1) to 1e-10 relative, fp64; every parameter
/// holds at least one element.
inline void expect_tp2_grads_match(const ParameterList& got, const ParameterList& want,
                                   int tp_rank) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t k = 0; k < got.size(); ++k) {
    const Parameter& p = *got[k];
    ASSERT_EQ(p.name, want[k]->name);
    const double* g = p.grad.data<double>();
    const double* r = want[k]->grad.data<double>();
    int compared = 0;
    for_each_global_index(p, tp_rank, 2, [&](index_t local, index_t global) {
      ++compared;
      ASSERT_NEAR(g[local], r[global], 1e-10 * (1 + std::fabs(r[global])))
          << p.name << " local " << local << " global " << global;
    });
    EXPECT_GT(compared, 0) << p.name;
  }
}

}  // namespace meshtron::testing_util
