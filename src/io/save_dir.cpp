#include "io/save_dir.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.hpp"
#include "io/checkpoint_layout.hpp"

namespace meshtron::io {

namespace fs = std::filesystem;

namespace {

std::string host_name() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

/// The batch job this process belongs to ("" outside Slurm and PBS).
std::string batch_job_id() {
  for (const char* var : {"SLURM_JOB_ID", "PBS_JOBID"})
    if (const char* id = std::getenv(var)) return id;
  return "";
}

/// Who holds a lock: the three words of the lock file.
struct LockOwner {
  std::string host, job;
  long pid = 0;

  static LockOwner self() { return {host_name(), batch_job_id(), long(getpid())}; }
  std::string text() const { return host + " " + std::to_string(pid) + " " + job + "\n"; }
  static LockOwner read(const std::string& path) {
    LockOwner o;
    std::ifstream in(path);
    in >> o.host >> o.pid >> o.job;
    return o;
  }
  /// A lock this process may take over: its run is known to be gone.
  bool gone() const {
    const LockOwner me = self();
    if (!job.empty() && job == me.job) return true;  // this job, requeued
    return host == me.host && pid > 0 && kill(pid_t(pid), 0) != 0 && errno == ESRCH;
  }
};

/// Create `path` exclusively with `text`; "" or errno's text.
std::string create_exclusively(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) return std::strerror(errno);
  const bool ok = ::write(fd, text.data(), text.size()) == ssize_t(text.size());
  ::close(fd);
  return ok ? "" : std::strerror(errno);
}

/// Rank 0's part of taking the lock: "" or the reason.
std::string take_lock(const std::string& path) {
  const LockOwner me = LockOwner::self();
  std::string error = create_exclusively(path, me.text());
  if (error.empty()) return "";
  if (errno != EEXIST) return "cannot create lock file '" + path + "': " + error;
  const LockOwner other = LockOwner::read(path);
  if (!other.gone())
    return MESH_MSG("checkpoint folder '" << fs::path(path).parent_path().string()
                                          << "' is in use by another run (host " << other.host
                                          << ", pid " << other.pid
                                          << "); give this run its own checkpoint.save_dir, or "
                                             "delete " << path << " if that run is dead");
  std::error_code ignored;
  fs::remove(path, ignored);
  error = create_exclusively(path, me.text());
  return error.empty() ? "" : "cannot create lock file '" + path + "': " + error;
}

}  // namespace

void require_writable_dir(MPI_Comm comm, const std::string& dir, const std::string& what) {
  std::string error;
  if (comm_rank(comm) == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    const std::string probe = dir + "/.meshtron_write_test." + std::to_string(getpid());
    if (ec) {
      error = what + " '" + dir + "' cannot be created: " + ec.message();
    } else if (const std::string why = create_exclusively(probe, "x"); !why.empty()) {
      error = what + " '" + dir + "' is not writable: " + why;
    }
    fs::remove(probe, ec);
  }
  raise_if_any(comm, error);
}

SaveDirLock::SaveDirLock(MPI_Comm comm, const std::string& dir) {
  require_writable_dir(comm, dir, "checkpoint.save_dir");
  std::string error;
  if (comm_rank(comm) == 0) {
    error = take_lock(dir + "/.lock");
    if (error.empty()) path_ = dir + "/.lock";
  }
  raise_if_any(comm, error);
}

SaveDirLock::~SaveDirLock() {
  if (path_.empty()) return;
  std::error_code ignored;
  fs::remove(path_, ignored);
}

}  // namespace meshtron::io
