// Placement advice from the rank map and the GPU links (interconnect.hpp);
// the NVML reader is nvml_links.cpp.
#include "parallel/interconnect.hpp"

#include <algorithm>
#include <map>
#include <sstream>

namespace meshtron {

GpuLinks GpuLinks::all_nvlink(int count) {
  return {count, std::vector<char>(std::size_t(count) * count, 1)};
}

GpuLinks GpuLinks::pcie_only(int count) {
  GpuLinks links{count, std::vector<char>(std::size_t(count) * count, 0)};
  for (int g = 0; g < count; ++g) links.set_nvlink(g, g, true);
  return links;
}

bool GpuLinks::nvlink_between(int a, int b) const {
  return nvlink[std::size_t(a) * count + b] != 0;
}

void GpuLinks::set_nvlink(int a, int b, bool on) {
  nvlink[std::size_t(a) * count + b] = on;
  nvlink[std::size_t(b) * count + a] = on;
}

std::string describe_gpu_links(const std::optional<GpuLinks>& links) {
  if (!links) return "GPU interconnect: unknown (no NVML)";
  std::ostringstream os;
  os << "GPU interconnect: " << links->count << (links->count == 1 ? " GPU" : " GPUs");
  std::vector<std::string> pairs;
  int total = 0;
  for (int a = 0; a < links->count; ++a)
    for (int b = a + 1; b < links->count; ++b, ++total)
      if (links->nvlink_between(a, b)) pairs.push_back(std::to_string(a) + "-" + std::to_string(b));
  if (total == 0) return os.str();
  if (int(pairs.size()) == total) return os.str() + ", NVLink between every pair";
  if (pairs.empty()) return os.str() + ", PCIe only (no NVLink)";
  os << ", NVLink between";
  for (std::size_t i = 0; i < pairs.size(); ++i) os << (i ? ", " : " ") << pairs[i];
  os << "; PCIe between the other pairs";
  return os.str();
}

namespace {

std::string rank_set(const std::vector<const RankMapRow*>& group) {
  std::ostringstream os;
  for (std::size_t i = 0; i < group.size(); ++i) os << (i ? "," : "{") << group[i]->world_rank;
  os << "}";
  return os.str();
}

/// The group's hosts in rank order, each once.
std::vector<std::string> hosts_of(const std::vector<const RankMapRow*>& group) {
  std::vector<std::string> hosts;
  for (const RankMapRow* r : group)
    if (std::find(hosts.begin(), hosts.end(), r->host) == hosts.end()) hosts.push_back(r->host);
  return hosts;
}

/// The first two ranks of a one-host group whose (distinct, known) GPUs
/// NVLink does not join; nullptrs when every pair has it.
std::pair<const RankMapRow*, const RankMapRow*> pcie_pair(
    const std::vector<const RankMapRow*>& group, const GpuLinks& links) {
  const auto known = [&](const RankMapRow* r) { return r->gpu >= 0 && r->gpu < links.count; };
  for (std::size_t i = 0; i < group.size(); ++i)
    for (std::size_t j = i + 1; j < group.size(); ++j) {
      const RankMapRow *a = group[i], *b = group[j];
      if (known(a) && known(b) && !links.nvlink_between(a->gpu, b->gpu)) return {a, b};
    }
  return {nullptr, nullptr};
}

/// The warning for one tp group, or "" when it sits on one node's NVLink.
std::string group_warning(const std::vector<const RankMapRow*>& group,
                          const std::optional<GpuLinks>& links) {
  const std::vector<std::string> hosts = hosts_of(group);
  std::ostringstream os;
  if (hosts.size() > 1) {
    os << "warning: tp group " << rank_set(group) << " spans nodes";
    for (std::size_t i = 0; i < hosts.size(); ++i) os << (i ? ", " : " ") << hosts[i];
    os << ": keep tp within a node (NVLink); put pp across nodes";
    return os.str();
  }
  if (!links) return "";
  const auto [a, b] = pcie_pair(group, *links);
  if (a == nullptr) return "";
  os << "warning: tp group " << rank_set(group) << " joins GPUs " << a->gpu << " and " << b->gpu
     << " of " << hosts.front()
     << " over PCIe only (no NVLink): keep tp on NVLink-connected GPUs; put pp or dp "
        "across the others";
  return os.str();
}

}  // namespace

std::vector<std::string> tp_placement_warnings(const std::vector<RankMapRow>& rows,
                                               const std::optional<GpuLinks>& links) {
  // A tp group is the ranks sharing (dp, pp); rows come in world-rank order.
  std::map<std::pair<int, int>, std::vector<const RankMapRow*>> groups;
  for (const RankMapRow& r : rows) groups[{r.coord.pp, r.coord.dp}].push_back(&r);
  // Every dp replica repeats its group's problem: a few lines say it.
  constexpr std::size_t kMostLines = 4;
  std::vector<std::string> lines;
  std::size_t more = 0;
  for (const auto& [key, group] : groups) {
    if (std::string line = group_warning(group, links); line.empty())
      continue;
    else if (lines.size() < kMostLines)
      lines.push_back(line);
    else
      ++more;
  }
  if (more > 0)
    lines.push_back("warning: and " + std::to_string(more) + " more tp groups placed alike");
  return lines;
}

std::vector<RankMapRow> planned_rank_map(int tp, int pp, int dp, int gpus_per_node) {
  std::vector<RankMapRow> rows;
  const int per_node = std::max(gpus_per_node, 1);
  for (int r = 0; r < tp * pp * dp; ++r) {
    const GridCoord c{r % tp, (r / tp) % dp, r / (tp * dp)};
    rows.push_back({r, c, "node" + std::to_string(r / per_node), r % per_node, r % per_node});
  }
  return rows;
}

}  // namespace meshtron
