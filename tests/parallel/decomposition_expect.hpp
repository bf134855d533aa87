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

/// Trains `layout` on MPI_COMM_WORLD in fp32 and fp64 and compares each with
/// the 1-rank run (fp32: 1e-5 per step, 1e-4 for the weights; fp64: 1e-10);
/// returns the fp32 run for further checks.
inline RunResult expect_matches_single_rank(const Layout& layout) {
  RunResult fp32 = train_layout(MPI_COMM_WORLD, layout, DType::F32);
  {
    SCOPED_TRACE("fp32");
    expect_same_run(fp32, single_rank_reference(DType::F32), 1e-5, 1e-4);
  }
  {
    SCOPED_TRACE("fp64");
    expect_same_run(train_layout(MPI_COMM_WORLD, layout, DType::F64),
                    single_rank_reference(DType::F64), 1e-10, 1e-10);
  }
  return fp32;
}

/// Losses, gradient norms and every weight equal bit for bit.
inline void expect_bitwise_equal(const RunResult& got, const RunResult& ref) {
  EXPECT_EQ(got.losses, ref.losses);
  EXPECT_EQ(got.grad_norms, ref.grad_norms);
  for (const auto& [name, values] : ref.params) EXPECT_EQ(got.params.at(name), values) << name;
}

}  // namespace meshtron::testing
