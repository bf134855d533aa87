// The time split of logging.profile's GPU trace (train/gpu_trace.hpp): pure
// interval arithmetic, checked on hand-built timelines.
#include <gtest/gtest.h>

#include "train/gpu_trace.hpp"

namespace meshtron {
namespace {

TraceEvent event(TraceEvent::Kind kind, std::uint64_t start_us, std::uint64_t end_us,
                 std::string name, std::uint32_t stream = 7) {
  TraceEvent e;
  e.kind = kind, e.start_ns = start_us * 1000, e.end_ns = end_us * 1000, e.stream = stream;
  e.name = std::move(name);
  return e;
}

constexpr auto kCompute = TraceEvent::Kind::Compute;
constexpr auto kComm = TraceEvent::Kind::Communication;
constexpr auto kCopy = TraceEvent::Kind::Copy;

// One 100 us window: compute [0, 40) and [30, 60) overlap each other;
// NCCL [50, 80) is hidden for 10 us behind compute and exposed for 20;
// a copy [90, 95); idle [80, 90) and [95, 100).
std::vector<TraceEvent> timeline() {
  std::vector<TraceEvent> events{
      event(kCompute, 0, 40, "gemm"), event(kCompute, 30, 60, "layernorm", 8),
      event(kComm, 50, 80, "ncclDevKernel_AllGather", 9), event(kCopy, 90, 95, "memcpy DtoD")};
  events.back().bytes = 4096;
  return events;
}

TEST(GpuTrace, SplitsTheWindowIntoComputeCommunicationAndIdle) {
  const TraceSummary s = summarize_trace(timeline(), 0, 100'000, /*steps=*/1);
  EXPECT_DOUBLE_EQ(s.window_ms, 0.100);
  EXPECT_DOUBLE_EQ(s.compute_ms, 0.060);  // union, not the sum 0.070
  EXPECT_DOUBLE_EQ(s.comm_ms, 0.030);
  EXPECT_DOUBLE_EQ(s.exposed_comm_ms, 0.020);
  EXPECT_DOUBLE_EQ(s.busy_ms, 0.085);
  EXPECT_DOUBLE_EQ(s.idle_ms, 0.015);
}

TEST(GpuTrace, DividesByStepsAndClipsToTheWindow) {
  // Window [20, 70) us over 2 steps: gemm contributes [20, 40), layernorm
  // [30, 60), NCCL [50, 70) of which [60, 70) exposed; the copy is outside.
  const TraceSummary s = summarize_trace(timeline(), 20'000, 70'000, /*steps=*/2);
  EXPECT_DOUBLE_EQ(s.window_ms, 0.025);
  EXPECT_DOUBLE_EQ(s.compute_ms, 0.020);
  EXPECT_DOUBLE_EQ(s.comm_ms, 0.010);
  EXPECT_DOUBLE_EQ(s.exposed_comm_ms, 0.005);
  EXPECT_DOUBLE_EQ(s.idle_ms, 0.0);
  ASSERT_EQ(s.top.size(), 3u);  // the copy never ran inside the window
}

TEST(GpuTrace, RanksKernelsByTimeAndCountsCalls) {
  std::vector<TraceEvent> events = timeline();
  events.push_back(event(kCompute, 60, 65, "layernorm"));
  const TraceSummary s = summarize_trace(events, 0, 100'000, 1, /*top_kernels=*/2);
  ASSERT_EQ(s.top.size(), 2u);
  EXPECT_EQ(s.top[0].name, "gemm");
  EXPECT_DOUBLE_EQ(s.top[0].ms_per_step, 0.040);
  EXPECT_EQ(s.top[1].name, "layernorm");
  EXPECT_DOUBLE_EQ(s.top[1].ms_per_step, 0.035);
  EXPECT_DOUBLE_EQ(s.top[1].calls_per_step, 2.0);
}

TEST(GpuTrace, ChromeTraceHasOneCompleteEventPerRecord) {
  const std::string json = chrome_trace_json(timeline(), 0, /*rank=*/3);
  std::size_t events = 0;
  for (std::size_t at = 0; (at = json.find("\"ph\": \"X\"", at)) != std::string::npos; ++at) ++events;
  EXPECT_EQ(events, 4u);
  EXPECT_NE(json.find("\"name\": \"ncclDevKernel_AllGather\", \"cat\": \"communication\""),
            std::string::npos);
  EXPECT_NE(json.find("\"pid\": 3, \"tid\": 9, \"ts\": 50.000, \"dur\": 30.000}"), std::string::npos);
  // Copies carry their size; kernels carry no args.
  EXPECT_NE(json.find("\"dur\": 5.000, \"args\": {\"bytes\": 4096}}"), std::string::npos);
  EXPECT_EQ(json.find("\"args\""), json.rfind("\"args\""));
}

}  // namespace
}  // namespace meshtron
