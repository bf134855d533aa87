// FiberPair (parallel/fiber_pair.hpp): the order its two jobs run in, which
// parallel.tp_interleave's equal-results argument rests on (job a's k-th
// segment before job b's k-th), and its corner cases.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "parallel/fiber_pair.hpp"

namespace meshtron {
namespace {

/// A job that logs "<name><segment>" and yields between `segments` segments.
std::function<void()> logging_job(FiberPair& fibers, std::vector<std::string>& log,
                                  const std::string& name, int segments) {
  return [&fibers, &log, name, segments] {
    for (int s = 0; s < segments; ++s) {
      if (s > 0) fibers.yield();
      log.push_back(name + std::to_string(s));
    }
  };
}

TEST(FiberPair, SegmentsAlternateStartingWithTheFirstJob) {
  FiberPair fibers;
  std::vector<std::string> log;
  fibers.run(logging_job(fibers, log, "a", 3), logging_job(fibers, log, "b", 3));
  EXPECT_EQ(log, (std::vector<std::string>{"a0", "b0", "a1", "b1", "a2", "b2"}));
  EXPECT_EQ(fibers.switches(), 5);  // a0 | b0 | a1 | b1 | a2 | b2 (b2 follows a's end)
}

TEST(FiberPair, TheLongerJobRunsOnAloneOnceTheOtherEnds) {
  FiberPair fibers;
  std::vector<std::string> log;
  fibers.run(logging_job(fibers, log, "a", 1), logging_job(fibers, log, "b", 4));
  EXPECT_EQ(log, (std::vector<std::string>{"a0", "b0", "b1", "b2", "b3"}));
  log.clear();
  fibers.run(logging_job(fibers, log, "a", 4), logging_job(fibers, log, "b", 2));
  EXPECT_EQ(log, (std::vector<std::string>{"a0", "b0", "a1", "b1", "a2", "a3"}));
}

TEST(FiberPair, YieldOutsideRunDoesNothing) {
  FiberPair fibers;
  fibers.yield();
  EXPECT_EQ(fibers.switches(), 0);
}

TEST(FiberPair, AnExceptionIsRethrownAfterTheOtherJobEnds) {
  FiberPair fibers;
  std::vector<std::string> log;
  auto failing = [&] {
    log.push_back("a0");
    fibers.yield();
    throw std::runtime_error("job a failed");
  };
  EXPECT_THROW(
      {
        try {
          fibers.run(failing, logging_job(fibers, log, "b", 3));
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "job a failed");
          throw;
        }
      },
      std::runtime_error);
  EXPECT_EQ(log, (std::vector<std::string>{"a0", "b0", "b1", "b2"}));
  // The pair is reusable after a failure.
  log.clear();
  fibers.run(logging_job(fibers, log, "a", 2), logging_job(fibers, log, "b", 2));
  EXPECT_EQ(log, (std::vector<std::string>{"a0", "b0", "a1", "b1"}));
}

/// Recursion with a kilobyte of locals per frame, live across the call (so
/// the compiler cannot turn it into a loop): `depth` KB of stack.
int deep(FiberPair& fibers, int depth) {
  volatile int frame[256];
  frame[0] = 0;
  if (depth % 256 == 0) fibers.yield();
  if (depth > 0) frame[0] = deep(fibers, depth - 1) + 1;
  return frame[0];
}

TEST(FiberPair, JobsHaveStacksOfTheirOwn) {
  FiberPair fibers;
  int a = -1, b = -1;
  fibers.run([&] { a = deep(fibers, 1024); }, [&] { b = deep(fibers, 1000); });
  EXPECT_EQ(a, 1024);
  EXPECT_EQ(b, 1000);
  EXPECT_GT(fibers.switches(), 4);
}

}  // namespace
}  // namespace meshtron

namespace meshtron {
namespace {

// The guard page below a job's stack: running past its end faults at once
// (the test's child process dies) instead of writing over other memory.
TEST(FiberPairDeathTest, AStackOverflowFaultsInsteadOfCorruptingMemory) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        FiberPair fibers(std::size_t(64) << 10);
        int depth = 0;
        fibers.run([&] { depth = deep(fibers, 1000); }, [] {});  // ~1 MB of frames
        std::printf("%d\n", depth);
      },
      "");
}

}  // namespace
}  // namespace meshtron
