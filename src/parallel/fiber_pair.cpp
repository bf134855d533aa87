#include "parallel/fiber_pair.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>

#include "common/error.hpp"

namespace meshtron {

FiberPair::Stack::Stack(std::size_t bytes) {
  const auto page = std::size_t(sysconf(_SC_PAGESIZE));
  bytes_ = (bytes + page - 1) / page * page;
  mapped_ = bytes_ + page;
  void* m = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  MESH_VERIFY(m != MAP_FAILED, "FiberPair: cannot map a " << mapped_ << "-byte stack");
  mapping_ = static_cast<char*>(m);
  MESH_VERIFY(mprotect(mapping_, page, PROT_NONE) == 0, "FiberPair: cannot protect a guard page");
  base_ = mapping_ + page;
}

FiberPair::Stack::~Stack() { munmap(mapping_, mapped_); }

FiberPair::FiberPair(std::size_t stack_bytes) : stack_bytes_(stack_bytes) {}

FiberPair::~FiberPair() = default;

void FiberPair::entry(unsigned self_high, unsigned self_low, int job) {
  // makecontext passes int arguments only: the pointer comes in two halves.
  const auto address = (std::uintptr_t(self_high) << 32) | std::uintptr_t(self_low);
  reinterpret_cast<FiberPair*>(address)->run_job(job);
}

void FiberPair::run_job(int job) {
  Job& j = jobs_[job];
  try {
    j.work();
  } catch (...) {
    j.error = std::current_exception();
  }
  leave(job);
}

void FiberPair::leave(int job) {
  jobs_[job].ended = true;
  const int other = 1 - job;
  if (!jobs_[other].ended) {
    current_ = other;
    ++switches_;
    setcontext(&jobs_[other].context);
  } else {
    current_ = -1;
    setcontext(&caller_);
  }
  std::abort();  // setcontext returns only on failure
}

void FiberPair::run(std::function<void()> a, std::function<void()> b) {
  MESH_VERIFY(current_ < 0, "FiberPair::run called from inside a job");
  const auto address = reinterpret_cast<std::uintptr_t>(this);
  std::function<void()>* works[2] = {&a, &b};
  for (int k = 0; k < 2; ++k) {
    Job& j = jobs_[k];
    if (!j.stack) j.stack = std::make_unique<Stack>(stack_bytes_);
    j.work = std::move(*works[k]);
    j.error = nullptr;
    j.ended = false;
    MESH_VERIFY(getcontext(&j.context) == 0, "FiberPair: getcontext failed");
    j.context.uc_stack.ss_sp = j.stack->base();
    j.context.uc_stack.ss_size = j.stack->bytes();
    j.context.uc_link = nullptr;  // a job leaves through leave(), never by returning
    makecontext(&j.context, reinterpret_cast<void (*)()>(&FiberPair::entry), 3,
                unsigned(address >> 32), unsigned(address & 0xffffffffu), k);
  }
  current_ = 0;
  MESH_VERIFY(swapcontext(&caller_, &jobs_[0].context) == 0, "FiberPair: swapcontext failed");
  // Both jobs have ended.
  for (Job& j : jobs_) j.work = nullptr;
  for (Job& j : jobs_)
    if (j.error) std::rethrow_exception(j.error);
}

void FiberPair::yield() {
  if (current_ < 0) return;
  const int me = current_, other = 1 - me;
  if (jobs_[other].ended) return;
  current_ = other;
  ++switches_;
  MESH_VERIFY(swapcontext(&jobs_[me].context, &jobs_[other].context) == 0,
              "FiberPair: swapcontext failed");
}

}  // namespace meshtron
