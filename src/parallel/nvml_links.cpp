// read_gpu_links (interconnect.hpp): NVLink between this node's GPUs through
// NVML.
//
// NVML is opened with dlopen("libnvidia-ml.so.1") at run time, not linked:
// the library ships with the driver, not the toolkit (the toolkit's
// stubs/libnvidia-ml.so only satisfies the linker), so a linked binary would
// not start on a login node or CPU-only machine without the driver, and a
// CPU-only build would need the CUDA toolkit. Opened at run time, one binary
// reads the links where a driver is and says "unknown" elsewhere. The few
// declarations below are NVML's C ABI as nvml.h states it (the versioned
// entry points are stable across drivers); the header itself is not needed,
// and not every toolkit install has it.
#include <dlfcn.h>

#include <cstdlib>
#include <sstream>

#include "parallel/interconnect.hpp"

namespace meshtron {

namespace {

using nvmlReturn_t = int;
constexpr nvmlReturn_t kNvmlSuccess = 0;         // NVML_SUCCESS
using nvmlDevice_t = struct nvmlDevice_st*;
constexpr int kP2pCapsIndexNvlink = 2;           // NVML_P2P_CAPS_INDEX_NVLINK
constexpr int kP2pStatusOk = 0;                  // NVML_P2P_STATUS_OK

struct Nvml {
  void* lib = nullptr;  ///< Owned (dlclose).
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*count)(unsigned*) = nullptr;
  nvmlReturn_t (*handle)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*p2p)(nvmlDevice_t, nvmlDevice_t, int, int*) = nullptr;

  Nvml() {
    lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return;
    bind(init, "nvmlInit_v2");
    bind(shutdown, "nvmlShutdown");
    bind(count, "nvmlDeviceGetCount_v2");
    bind(handle, "nvmlDeviceGetHandleByIndex_v2");
    bind(p2p, "nvmlDeviceGetP2PStatus");
    if (!(init && shutdown && count && handle && p2p) || init() != kNvmlSuccess) {
      dlclose(lib);
      lib = nullptr;
    }
  }
  ~Nvml() {
    if (lib == nullptr) return;
    shutdown();
    dlclose(lib);
  }
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  template <class F>
  void bind(F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(lib, name));
  }
};

/// NVML indices of the GPUs CUDA sees, in CUDA's order: NVML enumerates
/// every GPU whatever CUDA_VISIBLE_DEVICES says. Empty when that list names
/// UUIDs or MIG instances (not mapped here).
std::vector<unsigned> visible_gpus(unsigned nvml_count) {
  std::vector<unsigned> out;
  const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
  if (env == nullptr) {
    for (unsigned g = 0; g < nvml_count; ++g) out.push_back(g);
    return out;
  }
  std::istringstream is(env);
  for (std::string item; std::getline(is, item, ',');) {
    if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos) return {};
    const unsigned g = unsigned(std::stoul(item));
    if (g >= nvml_count) break;  // CUDA stops at the first invalid index too
    out.push_back(g);
  }
  return out;
}

}  // namespace

std::optional<GpuLinks> read_gpu_links() {
  const Nvml nvml;
  unsigned count = 0;
  if (nvml.lib == nullptr || nvml.count(&count) != kNvmlSuccess) return std::nullopt;
  const std::vector<unsigned> gpus = visible_gpus(count);
  if (gpus.empty()) return std::nullopt;
  std::vector<nvmlDevice_t> devices(gpus.size());
  for (std::size_t i = 0; i < gpus.size(); ++i)
    if (nvml.handle(gpus[i], &devices[i]) != kNvmlSuccess) return std::nullopt;
  GpuLinks links = GpuLinks::pcie_only(int(gpus.size()));
  for (int a = 0; a < links.count; ++a)
    for (int b = a + 1; b < links.count; ++b) {
      int status = -1;
      const bool ok = nvml.p2p(devices[a], devices[b], kP2pCapsIndexNvlink, &status) ==
                      kNvmlSuccess;
      links.set_nvlink(a, b, ok && status == kP2pStatusOk);
    }
  return links;
}

}  // namespace meshtron
