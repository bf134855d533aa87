// FiberPair: two jobs on one thread, switching where a job yields.
//
// parallel.tp_interleave (Domino-style tensor-parallel overlap, trainer.cpp)
// runs two micro-batches' forward + backward as the two jobs. A job yields
// where it has queued a tp collective and is about to make its compute wait
// for it (Communicator::set_interleave); the other job then queues its own
// compute, which the GPU runs while the first job's collective is in
// flight, and yields at its own collective in turn.
//
// The switching is deterministic: a job runs until it yields or ends, then
// the other resumes where it stopped. So
//  * every rank issues its collectives in the same order (NCCL and MPI
//    match collectives on a communicator by order);
//  * both jobs running the same code, job a's k-th segment (the code
//    between two yields) always runs before job b's k-th: a gradient that
//    each job adds to once, or several times within one segment, gets a's
//    part first, as when the micro-batches run one after the other: the
//    same bits. (One added to in two segments of a job, like the tied word
//    table by the head and by the embedding, gets a's and b's parts in
//    another order: the same sum, rounded differently.)
//
// Stackful (POSIX ucontext): the yields happen deep inside the layers'
// code, which stays as it is. One thread; run() is not reentrant. An
// exception a job throws is caught at the job's base (it cannot cross a
// context switch), the other job still runs to its end, and run() rethrows
// the first one.
#pragma once

#include <ucontext.h>

#include <cstddef>
#include <exception>
#include <functional>
#include <memory>

namespace meshtron {

class FiberPair {
 public:
  /// Each job's stack: the layers' frames, which are shallow (a few KB);
  /// pages are touched only as used, and a guard page below each stack
  /// turns an overflow into a fault instead of corrupted memory.
  explicit FiberPair(std::size_t stack_bytes = std::size_t(8) << 20);
  ~FiberPair();
  FiberPair(const FiberPair&) = delete;
  FiberPair& operator=(const FiberPair&) = delete;

  /// Runs `a` and `b` to their ends, `a` first; rethrows the first
  /// exception a job threw (by `a` if both threw).
  void run(std::function<void()> a, std::function<void()> b);
  /// Inside a job of run(): switch to the other job unless it has ended
  /// (then return at once). Outside run(): does nothing.
  void yield();
  /// Switches between the jobs since construction (tests check that
  /// interleaving really happened).
  long switches() const { return switches_; }
  /// The running job: 0 (a) or 1 (b); -1 outside run().
  int current_job() const { return current_; }

 private:
  static void entry(unsigned self_high, unsigned self_low, int job);
  void run_job(int job);
  /// The job that ran last has ended: resume the other, or run()'s caller.
  [[noreturn]] void leave(int job);

  /// An mmap'd stack with a PROT_NONE guard page at its low end.
  class Stack {
   public:
    explicit Stack(std::size_t bytes);
    ~Stack();
    Stack(const Stack&) = delete;
    Stack& operator=(const Stack&) = delete;
    void* base() const { return base_; }  ///< above the guard page
    std::size_t bytes() const { return bytes_; }

   private:
    char* mapping_ = nullptr;
    void* base_ = nullptr;
    std::size_t bytes_ = 0, mapped_ = 0;
  };
  struct Job {
    ucontext_t context;
    std::unique_ptr<Stack> stack;
    std::function<void()> work;
    std::exception_ptr error;
    bool ended = true;
  };
  std::size_t stack_bytes_;
  Job jobs_[2];
  ucontext_t caller_;
  int current_ = -1;  ///< the running job, -1 outside run()
  long switches_ = 0;
};

}  // namespace meshtron
