#include "parallel/topology.hpp"

#include <algorithm>
#include <cstring>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

#include "common/error.hpp"

namespace meshtron {

namespace {
// Grid dimension order for MPI_Cart_create: the last dimension varies fastest
// in MPI's row-major rank numbering, so tp goes last.
constexpr int kDimPP = 0, kDimDP = 1, kDimTP = 2;

MPI_Comm cart_sub(MPI_Comm grid, bool keep_pp, bool keep_dp, bool keep_tp) {
  int remain[3];
  remain[kDimPP] = keep_pp;
  remain[kDimDP] = keep_dp;
  remain[kDimTP] = keep_tp;
  MPI_Comm sub;
  MPI_CHECK(MPI_Cart_sub(grid, remain, &sub));
  return sub;
}

void free_comm(MPI_Comm& c) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (c != MPI_COMM_NULL && !finalized) MPI_Comm_free(&c);
  c = MPI_COMM_NULL;
}
}  // namespace

ParallelDegrees Topology::resolve(const ParallelDegrees& req, int world_size) {
  MESH_REQUIRE(req.tensor_parallel >= 1 && req.pipeline_parallel >= 1 &&
                   req.data_parallel >= 0,
               "parallel degrees must be positive: tensor_parallel="
                   << req.tensor_parallel << ", pipeline_parallel="
                   << req.pipeline_parallel << ", data_parallel="
                   << req.data_parallel);
  ParallelDegrees out = req;
  const int model_parallel = req.tensor_parallel * req.pipeline_parallel;
  if (req.data_parallel == 0) {
    MESH_REQUIRE(world_size % model_parallel == 0,
                 "world size " << world_size << " is not divisible by tensor_parallel ("
                               << req.tensor_parallel << ") x pipeline_parallel ("
                               << req.pipeline_parallel << ") = " << model_parallel
                               << ", so data_parallel = auto has no integer value");
    out.data_parallel = world_size / model_parallel;
  }
  MESH_REQUIRE(model_parallel * out.data_parallel == world_size,
               "world size " << world_size << " != tensor_parallel ("
                             << req.tensor_parallel << ") x pipeline_parallel ("
                             << req.pipeline_parallel << ") x data_parallel ("
                             << out.data_parallel << ") = "
                             << model_parallel * out.data_parallel);
  return out;
}

Topology::Topology(MPI_Comm world, const ParallelDegrees& degrees) : world_(world) {
  MPI_CHECK(MPI_Comm_size(world, &world_size_));
  MPI_CHECK(MPI_Comm_rank(world, &world_rank_));
  const ParallelDegrees d = resolve(degrees, world_size_);
  tp_ = d.tensor_parallel;
  pp_ = d.pipeline_parallel;
  dp_ = d.data_parallel;

  int dims[3], periods[3] = {0, 0, 0};
  dims[kDimPP] = pp_;
  dims[kDimDP] = dp_;
  dims[kDimTP] = tp_;
  // reorder = 0: keep world ranks, so the rank <-> coordinate formula holds
  // and the launcher's placement (tp neighbours on one node) is respected.
  MPI_CHECK(MPI_Cart_create(world, 3, dims, periods, /*reorder=*/0, &grid_));
  int c[3];
  MPI_CHECK(MPI_Cart_coords(grid_, world_rank_, 3, c));
  coord_ = {c[kDimTP], c[kDimDP], c[kDimPP]};
  MESH_VERIFY(coord_ == coord_of(world_rank_),
              "MPI_Cart_coords disagrees with the tp-fastest rank formula");

  tp_comm_ = cart_sub(grid_, false, false, true);
  dp_comm_ = cart_sub(grid_, false, true, false);
  pp_comm_ = cart_sub(grid_, true, false, false);
  mp_comm_ = cart_sub(grid_, true, false, true);

  split_ = degrees.pipeline_split_rank;
  MESH_REQUIRE(split_ == 0 || (split_ > 0 && split_ < pp_),
               "pipeline split rank " << split_ << " must be 0 (none) or in [1, pipeline_parallel = "
                                      << pp_ << ")");
  // Embedding group: the stages of each (tp, dp) pipeline that hold the word
  // table: the first, the last (a tied head) and, under a split, the first
  // decoder stage. With pp = 1 that is the rank alone.
  const int pipeline = coord_.tp + tp_ * coord_.dp;
  const bool in_group = is_first_stage() ||
                        (is_last_stage() && degrees.last_stage_holds_word_table) ||
                        (split_ > 0 && coord_.pp == split_);
  MPI_CHECK(MPI_Comm_split(world, in_group ? pipeline : MPI_UNDEFINED, coord_.pp,
                           &embedding_comm_));
  // Stack groups: the encoder's stages and the decoder's, per pipeline.
  const int stack = coord_.pp < split_ ? 0 : 1;
  MPI_CHECK(MPI_Comm_split(world, split_ > 0 ? pipeline * 2 + stack : MPI_UNDEFINED, coord_.pp,
                           &stack_comm_));

  MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, world_rank_,
                                MPI_INFO_NULL, &node_comm_));
  MPI_CHECK(MPI_Comm_rank(node_comm_, &local_rank_));
  MPI_CHECK(MPI_Comm_size(node_comm_, &local_size_));
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_CHECK(MPI_Get_processor_name(name, &len));
  host_.assign(name, std::size_t(len));
}

Topology::~Topology() {
  for (MPI_Comm* c : {&stack_comm_, &embedding_comm_, &mp_comm_, &pp_comm_, &dp_comm_, &tp_comm_,
                      &node_comm_, &grid_})
    free_comm(*c);
}

GridCoord Topology::coord_of(int r) const {
  return {r % tp_, (r / tp_) % dp_, r / (tp_ * dp_)};
}

int Topology::rank_of(const GridCoord& c) const {
  return c.tp + tp_ * (c.dp + dp_ * c.pp);
}

int Topology::prev_stage_rank() const {
  return is_first_stage() ? -1 : rank_of({coord_.tp, coord_.dp, coord_.pp - 1});
}

int Topology::next_stage_rank() const {
  return is_last_stage() ? -1 : rank_of({coord_.tp, coord_.dp, coord_.pp + 1});
}

int Topology::gpu_for_local_rank(int num_gpus) const {
  if (num_gpus <= 0) return -1;
  return local_rank_ % num_gpus;
}

std::vector<RankMapRow> gather_rank_map(const Topology& topo, int num_gpus) {
  constexpr int kHostLen = 64;
  char host[kHostLen] = {};
  std::strncpy(host, topo.host_name().c_str(), kHostLen - 1);
  std::vector<char> hosts(std::size_t(kHostLen) * topo.world_size());
  MPI_CHECK(MPI_Allgather(host, kHostLen, MPI_CHAR, hosts.data(), kHostLen, MPI_CHAR,
                          topo.world_comm()));
  int mine[2] = {topo.local_rank(), topo.gpu_for_local_rank(num_gpus)};
  std::vector<int> locals(2 * std::size_t(topo.world_size()));
  MPI_CHECK(MPI_Allgather(mine, 2, MPI_INT, locals.data(), 2, MPI_INT,
                          topo.world_comm()));
  std::vector<RankMapRow> rows;
  for (int r = 0; r < topo.world_size(); ++r)
    rows.push_back({r, topo.coord_of(r), std::string(&hosts[std::size_t(r) * kHostLen]),
                    locals[2 * r], locals[2 * r + 1]});
  return rows;
}

int max_hosts_per_tp_group(const std::vector<RankMapRow>& rows) {
  // A tp group is the ranks sharing (dp, pp).
  std::map<std::pair<int, int>, std::set<std::string>> hosts;
  for (const RankMapRow& row : rows) hosts[{row.coord.dp, row.coord.pp}].insert(row.host);
  std::size_t most = 0;
  for (const auto& [group, names] : hosts) most = std::max(most, names.size());
  return int(most);
}

std::string format_rank_map(const std::vector<RankMapRow>& rows) {
  std::ostringstream os;
  os << "rank map (world rank -> tp, dp, pp, host, gpu):\n";
  os << "  rank    tp    dp    pp  host                  gpu\n";
  for (const auto& r : rows) {
    os << "  " << std::setw(4) << r.world_rank << "  " << std::setw(4) << r.coord.tp
       << "  " << std::setw(4) << r.coord.dp << "  " << std::setw(4) << r.coord.pp
       << "  " << std::left << std::setw(20) << r.host << std::right << "  "
       << (r.gpu < 0 ? std::string("cpu") : std::to_string(r.gpu)) << "\n";
  }
  return os.str();
}

}  // namespace meshtron
