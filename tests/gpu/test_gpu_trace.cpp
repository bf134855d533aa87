// GpuTracer (logging.profile's CUPTI trace) on real device work: the kernels
// and copies launched between start() and stop() come back with their names,
// streams and device times, inside the window, and nothing launched outside
// it does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>

#include "gpu_test_util.hpp"
#include "ops/ops.hpp"
#include "train/gpu_trace.hpp"

namespace meshtron {
namespace {

/// Whether `name` contains `part`, ignoring case (kernels are named after
/// their functors: "map3_packed_kernel<float, meshtron::cuda::Scale>").
bool mentions(std::string name, std::string part) {
  for (std::string* s : {&name, &part})
    for (char& c : *s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return name.find(part) != std::string::npos;
}

bool has_event(const GpuTracer& t, const std::string& part, TraceEvent::Kind kind) {
  return std::any_of(t.events().begin(), t.events().end(), [&](const TraceEvent& e) {
    return e.kind == kind && mentions(e.name, part);
  });
}

TEST(GpuTrace, RecordsTheKernelsAndCopiesOfTheWindowOnly) {
  REQUIRE_GPU();
  ASSERT_TRUE(GpuTracer::available());
  Tensor x = gpu_test::random_rounded({256, 1024}, DType::F32, 1, -2, 2).to(DType::F32).to_device();
  Tensor y = Tensor::empty(x.shape(), DType::F32, MemorySpace::Cuda);
  ops::scale(x, 0.5);  // before the window: must not be recorded
  GpuTracer tracer;
  tracer.start();
  ops::gelu_forward(x, y);
  ops::gelu_forward(y, x);
  const Tensor back = y.to_host();  // a device-to-host copy
  tracer.stop();

  EXPECT_TRUE(has_event(tracer, "gelu", TraceEvent::Kind::Compute));
  EXPECT_FALSE(has_event(tracer, "scale", TraceEvent::Kind::Compute));
  EXPECT_TRUE(has_event(tracer, "memcpy DtoH", TraceEvent::Kind::Copy));
  long gelu = 0;
  for (const TraceEvent& e : tracer.events()) {
    EXPECT_LE(tracer.begin_ns(), e.start_ns) << e.name;
    EXPECT_LT(e.start_ns, e.end_ns) << e.name;
    EXPECT_LE(e.end_ns, tracer.end_ns()) << e.name;
    gelu += mentions(e.name, "gelu");
  }
  EXPECT_EQ(gelu, 2);

  const TraceSummary s =
      summarize_trace(tracer.events(), tracer.begin_ns(), tracer.end_ns(), /*steps=*/1);
  EXPECT_GT(s.compute_ms, 0.0);
  EXPECT_EQ(s.comm_ms, 0.0);
  EXPECT_LE(s.busy_ms, s.window_ms);
}

}  // namespace
}  // namespace meshtron
