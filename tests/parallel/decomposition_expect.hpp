// GoogleTest comparisons of a decomposed run with the 1-rank run, shared by
// the decomposition and overlap tests (decomposition.hpp trains the runs).
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>

#include "decomposition.hpp"

namespace meshtron::testing {

/// The 1-rank run every layout is compared with (trained once per dtype).
inline const RunResult& single_rank_reference(DType dtype) {
  static const RunResult fp32 = train_layout(MPI_COMM_SELF, Layout{}, DType::F32);
  static const RunResult fp64 = train_layout(MPI_COMM_SELF, Layout{}, DType::F64);
  return dtype == DType::F64 ? fp64 : fp32;
}

/// Losses and grad norms within step_tol (relative) at every step; every
/// parameter within param_tol norm-wise (see norm_rel_error).
inline void expect_same_run(const RunResult& got, const RunResult& ref, double step_tol,
                            double param_tol) {
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (std::size_t k = 0; k < ref.losses.size(); ++k) {
    EXPECT_NEAR(got.losses[k], ref.losses[k], step_tol * std::fabs(ref.losses[k]))
        << "step " << k + 1;
    EXPECT_NEAR(got.grad_norms[k], ref.grad_norms[k], step_tol * ref.grad_norms[k])
        << "step " << k + 1;
  }
  for (const auto& [name, values] : ref.params)
    EXPECT_LE(norm_rel_error(got.params.at(name), values), param_tol) << name;
}

}  // namespace meshtron::testing
