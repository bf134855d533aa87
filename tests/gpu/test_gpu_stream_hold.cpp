// perf::StreamHold, which bench_cuda_ops' "queued" column times behind:
// nothing queued after a hold runs before release(), events around work
// queued while held do not count the host's time, and a hold nobody
// releases gives up (and says so) instead of hanging the stream.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "common/error.hpp"
#include "gpu_test_util.hpp"
#include "perf/stream_hold.hpp"

namespace meshtron {
namespace {

using Clock = std::chrono::steady_clock;

TEST(GpuStreamHold, NothingBehindItRunsUntilReleased) {
  REQUIRE_GPU();
  perf::StreamHold hold;
  cudaEvent_t behind;
  CUDA_CHECK(cudaEventCreate(&behind));
  hold.hold(0);
  CUDA_CHECK(cudaEventRecord(behind, 0));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(cudaEventQuery(behind), cudaErrorNotReady);
  hold.release();
  CUDA_CHECK(cudaEventSynchronize(behind));
  EXPECT_FALSE(hold.gave_up());
  CUDA_CHECK(cudaEventDestroy(behind));
}

TEST(GpuStreamHold, EventsQueuedWhileHeldTimeTheGpuNotTheHost) {
  REQUIRE_GPU();
  perf::StreamHold hold;
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  hold.hold(0);
  CUDA_CHECK(cudaEventRecord(start, 0));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // the host is slow to queue
  CUDA_CHECK(cudaEventRecord(stop, 0));
  hold.release();
  CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  EXPECT_LT(ms, 5.0f) << "the events counted the host's 30 ms";
  EXPECT_FALSE(hold.gave_up());
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
}

TEST(GpuStreamHold, AHoldNeverReleasedGivesUpAndSaysSo) {
  REQUIRE_GPU();
  perf::StreamHold hold;
  const auto before = Clock::now();
  hold.hold(0);
  CUDA_CHECK(cudaStreamSynchronize(0));
  const double waited_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - before).count();
  EXPECT_TRUE(hold.gave_up());
  EXPECT_GE(waited_ms, 0.9 * perf::StreamHold::kGiveUpMs);
  // The next hold starts afresh.
  hold.hold(0);
  hold.release();
  CUDA_CHECK(cudaStreamSynchronize(0));
  EXPECT_FALSE(hold.gave_up());
}

}  // namespace
}  // namespace meshtron
