// Claiming the folders a run writes into, before its first step: a folder
// that cannot be written is found at start-up, not after hours of training,
// and two live runs never share a checkpoint folder (they would replace
// each other's files and `latest`).
#pragma once

#include <mpi.h>

#include <string>

namespace meshtron::io {

/// Collective over `comm`: rank 0 creates `dir` if needed and checks that a
/// file can be created in it; a one-line UserError on every rank otherwise.
/// `what` names the folder in the message ("checkpoint.save_dir").
void require_writable_dir(MPI_Comm comm, const std::string& dir, const std::string& what);

/// dir/.lock held by one run. Constructing it is collective: rank 0 creates
/// the lock file exclusively, holding "host pid job"; when another run holds
/// it, every rank throws a one-line UserError naming that run's host and
/// pid. A lock left by a run that no longer exists is taken over: one of
/// this host whose pid is gone, or one of this batch job (a requeued job
/// restarts under the same SLURM_JOB_ID / PBS_JOBID). Rank 0 removes the
/// file on destruction.
class SaveDirLock {
 public:
  SaveDirLock(MPI_Comm comm, const std::string& dir);
  ~SaveDirLock();
  SaveDirLock(const SaveDirLock&) = delete;
  SaveDirLock& operator=(const SaveDirLock&) = delete;

 private:
  std::string path_;  ///< empty except on the rank that holds the lock
};

}  // namespace meshtron::io
