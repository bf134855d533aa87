// Error handling for meshtron: checked calls and always-on verification.
//
// Two kinds of failure, handled differently:
//
//  * A failed library call (MPI, CUDA, NCCL, HDF5) or a broken internal
//    invariant seen by one rank: print one line naming the call, file:line
//    and world rank, then MPI_Abort(MPI_COMM_WORLD) so that the whole job
//    ends together and no rank hangs in a collective waiting for a dead peer.
//
//  * Bad user input that every rank sees identically (a deck key, a degree
//    that does not divide): throw meshtron::UserError. Every rank throws at
//    the same place, main() prints the message once on rank 0 and every rank
//    exits non-zero after MPI_Finalize. Use MESH_REQUIRE for these.
//
// MESH_VERIFY is the always-on check for user-facing conditions that only
// some ranks may see (a file one rank cannot open): it aborts the job.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace meshtron {

/// Error in user input, raised identically on every rank (see file comment).
class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// World rank of this process, or -1 before MPI_Init / after MPI_Finalize.
int world_rank_or_minus_one();

/// Print "meshtron: fatal: <what> (<file>:<line>, rank <r>)" and abort the job.
[[noreturn]] void fatal(const std::string& what, const char* file, int line);

/// Build a message from stream-able pieces: MESH_MSG("tp=" << tp).
#define MESH_MSG(pieces) \
  (static_cast<std::ostringstream&&>(std::ostringstream{} << pieces).str())

}  // namespace meshtron

/// Always-on check: on failure print the message with file:line and rank and
/// abort the whole job. For conditions that may differ between ranks.
#define MESH_VERIFY(cond, msg)                                              \
  do {                                                                      \
    if (!(cond)) ::meshtron::fatal(MESH_MSG(msg), __FILE__, __LINE__);       \
  } while (0)

/// Collective user-input check: throws UserError (the same on every rank).
#define MESH_REQUIRE(cond, msg)                                             \
  do {                                                                      \
    if (!(cond)) throw ::meshtron::UserError(MESH_MSG(msg));                \
  } while (0)

/// Debug-only internal assertion (compiled out with NDEBUG).
#ifdef NDEBUG
#define MESH_ASSERT(cond) ((void)0)
#else
#define MESH_ASSERT(cond) \
  MESH_VERIFY(cond, "internal assertion failed: " #cond)
#endif

/// Checked MPI call: stringifies the call and the MPI error text.
#define MPI_CHECK(call)                                                     \
  do {                                                                      \
    int mesh_mpi_err_ = (call);                                             \
    if (mesh_mpi_err_ != MPI_SUCCESS) {                                     \
      char mesh_mpi_msg_[MPI_MAX_ERROR_STRING];                             \
      int mesh_mpi_len_ = 0;                                                \
      MPI_Error_string(mesh_mpi_err_, mesh_mpi_msg_, &mesh_mpi_len_);       \
      ::meshtron::fatal(MESH_MSG(#call << " failed: "                       \
                                       << std::string(mesh_mpi_msg_,        \
                                                      mesh_mpi_len_)),      \
                        __FILE__, __LINE__);                                \
    }                                                                       \
  } while (0)

/// Checked HDF5 call: HDF5 returns a negative value on failure.
#define H5_CHECK(call)                                                      \
  ([&]() {                                                                  \
    auto mesh_h5_ret_ = (call);                                             \
    if (mesh_h5_ret_ < 0)                                                   \
      ::meshtron::fatal(#call " failed (HDF5 returned a negative status)",  \
                        __FILE__, __LINE__);                                \
    return mesh_h5_ret_;                                                    \
  }())

/// Checked CUDA runtime call.
#define CUDA_CHECK(call)                                                    \
  do {                                                                      \
    cudaError_t mesh_cuda_err_ = (call);                                    \
    if (mesh_cuda_err_ != cudaSuccess)                                      \
      ::meshtron::fatal(MESH_MSG(#call << " failed: "                       \
                                       << cudaGetErrorString(mesh_cuda_err_)), \
                        __FILE__, __LINE__);                                \
  } while (0)

/// Checked NCCL call.
#define NCCL_CHECK(call)                                                    \
  do {                                                                      \
    ncclResult_t mesh_nccl_err_ = (call);                                   \
    if (mesh_nccl_err_ != ncclSuccess)                                      \
      ::meshtron::fatal(MESH_MSG(#call << " failed: "                       \
                                       << ncclGetErrorString(mesh_nccl_err_)), \
                        __FILE__, __LINE__);                                \
  } while (0)
