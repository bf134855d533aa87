#include "train/gpu_trace.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>

#include "common/error.hpp"

#ifdef MESHTRON_HAVE_CUPTI
#include <cuda_runtime.h>
#include <cupti.h>
#include <cxxabi.h>
#endif

namespace meshtron {

namespace {

using Interval = std::pair<std::uint64_t, std::uint64_t>;

/// Sorted, disjoint union of the intervals.
std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const Interval& i : v) {
    if (!out.empty() && i.first <= out.back().second)
      out.back().second = std::max(out.back().second, i.second);
    else
      out.push_back(i);
  }
  return out;
}

std::uint64_t length(const std::vector<Interval>& disjoint) {
  std::uint64_t n = 0;
  for (const Interval& i : disjoint) n += i.second - i.first;
  return n;
}

/// Length of the intersection of two sorted disjoint unions.
std::uint64_t overlap(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  std::uint64_t n = 0;
  for (std::size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    const std::uint64_t lo = std::max(a[i].first, b[j].first);
    const std::uint64_t hi = std::min(a[i].second, b[j].second);
    if (lo < hi) n += hi - lo;
    (a[i].second < b[j].second) ? ++i : ++j;
  }
  return n;
}

std::string json_escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out;
}

}  // namespace

std::string TraceSummary::line() const {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "step %.2f ms: busy %.2f (compute %.2f, communication %.2f of which exposed "
                "%.2f), idle %.2f",
                window_ms, busy_ms, compute_ms, comm_ms, exposed_comm_ms, idle_ms);
  return buf;
}

TraceSummary summarize_trace(const std::vector<TraceEvent>& events, std::uint64_t begin_ns,
                             std::uint64_t end_ns, int steps, int top_kernels) {
  MESH_VERIFY(steps >= 1 && end_ns > begin_ns, "summarize_trace: empty window");
  std::vector<Interval> all, compute, comm;
  std::map<std::string, std::pair<std::uint64_t, long>> per_name;  // ns, calls
  for (const TraceEvent& e : events) {
    const std::uint64_t lo = std::max(e.start_ns, begin_ns), hi = std::min(e.end_ns, end_ns);
    if (lo >= hi) continue;
    all.emplace_back(lo, hi);
    if (e.kind == TraceEvent::Kind::Compute) compute.emplace_back(lo, hi);
    if (e.kind == TraceEvent::Kind::Communication) comm.emplace_back(lo, hi);
    auto& [ns, calls] = per_name[e.name];
    ns += hi - lo;
    ++calls;
  }
  const auto busy = merged(std::move(all)), work = merged(std::move(compute)),
             talk = merged(std::move(comm));
  const double per_step_ms = 1e-6 / steps;
  TraceSummary s;
  s.steps = steps;
  s.window_ms = double(end_ns - begin_ns) * per_step_ms;
  s.busy_ms = double(length(busy)) * per_step_ms;
  s.compute_ms = double(length(work)) * per_step_ms;
  s.comm_ms = double(length(talk)) * per_step_ms;
  s.exposed_comm_ms = double(length(talk) - overlap(talk, work)) * per_step_ms;
  s.idle_ms = s.window_ms - s.busy_ms;
  for (const auto& [name, total] : per_name)
    s.top.push_back({name, double(total.first) * per_step_ms, double(total.second) / steps});
  std::sort(s.top.begin(), s.top.end(),
            [](const KernelTotal& a, const KernelTotal& b) { return a.ms_per_step > b.ms_per_step; });
  if (int(s.top.size()) > top_kernels) s.top.resize(std::size_t(top_kernels));
  return s;
}

std::string chrome_trace_json(const std::vector<TraceEvent>& events, std::uint64_t begin_ns,
                              int rank) {
  std::ostringstream os;
  os.precision(3);
  os << std::fixed << "{\"traceEvents\": [\n";
  bool first = true;
  for (const TraceEvent& e : events) {
    if (e.end_ns <= begin_ns) continue;
    const char* category = e.kind == TraceEvent::Kind::Communication ? "communication"
                           : e.kind == TraceEvent::Kind::Copy        ? "copy"
                                                                     : "compute";
    os << (first ? "" : ",\n") << "{\"name\": \"" << json_escaped(e.name) << "\", \"cat\": \""
       << category << "\", \"ph\": \"X\", \"pid\": " << rank << ", \"tid\": " << e.stream
       << ", \"ts\": " << double(std::int64_t(e.start_ns - begin_ns)) / 1e3
       << ", \"dur\": " << double(e.end_ns - e.start_ns) / 1e3;
    if (e.bytes) os << ", \"args\": {\"bytes\": " << e.bytes << "}";
    os << "}";
    first = false;
  }
  os << "\n], \"displayTimeUnit\": \"ms\"}\n";
  return os.str();
}

#ifdef MESHTRON_HAVE_CUPTI

#define CUPTI_CHECK(call)                                                  \
  do {                                                                     \
    const CUptiResult status_ = (call);                                    \
    if (status_ != CUPTI_SUCCESS) {                                        \
      const char* text_ = "";                                              \
      cuptiGetResultString(status_, &text_);                               \
      MESH_VERIFY(false, #call << " failed: " << text_);                   \
    }                                                                      \
  } while (0)

namespace {

// CUPTI's buffer callbacks carry no user pointer: the recording tracer is
// the one process-wide value they need (GpuTracer::start checks there is
// only one).
GpuTracer* recording_tracer = nullptr;
std::mutex recording_mutex;  ///< guards recording_tracer and its events
constexpr std::size_t kBufferBytes = 8u << 20;
constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                         CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};

/// "void ns::(anonymous namespace)::kernel<T, 8>(args)" -> "ns::kernel<T, 8>".
std::string readable_kernel_name(const char* mangled) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  for (const std::string junk : {"(anonymous namespace)::", "void "}) {
    for (std::size_t at; (at = name.find(junk)) != std::string::npos;) name.erase(at, junk.size());
  }
  if (const std::size_t paren = name.find('('); paren != std::string::npos) name.resize(paren);
  return name;
}

const char* copy_kind_name(std::uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "memcpy PtoP";
    default: return "memcpy";
  }
}

/// Size, device times and stream of a copy or set record.
template <class Record>
void take_span(const Record* m, TraceEvent& e) {
  e.bytes = m->bytes;
  e.start_ns = m->start, e.end_ns = m->end, e.stream = m->streamId;
}

TraceEvent event_of(const CUpti_Activity* record) {
  TraceEvent e;
  switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      e.name = readable_kernel_name(k->name);
      e.kind = e.name.rfind("nccl", 0) == 0 ? TraceEvent::Kind::Communication
                                            : TraceEvent::Kind::Compute;
      e.start_ns = k->start, e.end_ns = k->end, e.stream = k->streamId;
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      e.name = copy_kind_name(m->copyKind);
      // A copy between two GPUs is a collective's transfer (the copy-engine
      // tp collectives, parallel.tp_copy_engine), so it counts with NCCL's.
      e.kind = m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_PTOP ? TraceEvent::Kind::Communication
                                                              : TraceEvent::Kind::Copy;
      take_span(m, e);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY2: {
      // Copies between two GPUs arrive as their own kind (with MEMCPY
      // enabled); read as a memset, they would show as 10 MB "memsets".
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpyPtoP4*>(record);
      e.name = "memcpy PtoP";
      e.kind = TraceEvent::Kind::Communication;
      take_span(m, e);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      e.name = "memset";
      e.kind = TraceEvent::Kind::Copy;
      take_span(m, e);
      break;
    }
    default:  // a kind not asked for: named, without times (clipped out of the window)
      e.name = "CUPTI activity kind " + std::to_string(int(record->kind));
      e.kind = TraceEvent::Kind::Copy;
  }
  return e;
}

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size,
                               std::size_t* max_records) {
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  MESH_VERIFY(*buffer, "CUPTI trace: out of host memory");
  *size = kBufferBytes;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, std::uint32_t, std::uint8_t* buffer, std::size_t,
                               std::size_t valid) {
  // CUPTI may call this from its own thread while the tracer is stopping.
  const std::lock_guard<std::mutex> lock(recording_mutex);
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS)
    if (recording_tracer) recording_tracer->add(event_of(record));
  std::size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
  MESH_VERIFY(dropped == 0, "CUPTI trace dropped " << dropped << " records");
  std::free(buffer);
}

}  // namespace

bool GpuTracer::available() { return true; }
GpuTracer::GpuTracer() = default;
GpuTracer::~GpuTracer() {
  if (recording_) stop();
}

void GpuTracer::start() {
  CUDA_CHECK(cudaDeviceSynchronize());
  {
    const std::lock_guard<std::mutex> lock(recording_mutex);
    MESH_VERIFY(recording_tracer == nullptr, "GpuTracer: another tracer is recording");
    recording_tracer = this;
  }
  recording_ = true;
  CUPTI_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
  for (CUpti_ActivityKind kind : kKinds) CUPTI_CHECK(cuptiActivityEnable(kind));
  CUPTI_CHECK(cuptiGetTimestamp(&begin_ns_));
}

void GpuTracer::stop() {
  CUDA_CHECK(cudaDeviceSynchronize());
  CUPTI_CHECK(cuptiGetTimestamp(&end_ns_));
  // Deliver everything recorded so far before disabling the kinds (a record
  // still being completed when its kind is disabled can be lost: a test saw
  // the window's last copy go missing), then flush what remains.
  CUPTI_CHECK(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  for (CUpti_ActivityKind kind : kKinds) CUPTI_CHECK(cuptiActivityDisable(kind));
  CUPTI_CHECK(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  const std::lock_guard<std::mutex> lock(recording_mutex);
  recording_tracer = nullptr;
  recording_ = false;
}

#else  // no CUPTI in this build

bool GpuTracer::available() { return false; }
GpuTracer::GpuTracer() {
  MESH_REQUIRE(false, "logging.profile needs a CUDA build with CUPTI (libcupti)");
}
GpuTracer::~GpuTracer() = default;
void GpuTracer::start() {}
void GpuTracer::stop() {}

#endif

}  // namespace meshtron
