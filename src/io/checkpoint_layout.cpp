#include "io/checkpoint_layout.hpp"

#include <algorithm>
#include <climits>
#include <map>
#include <sstream>

#include "common/error.hpp"

namespace meshtron::io {

namespace {

/// "stage split_dim parts ndims d0 d1 ... name\n" per tensor (the name last:
/// it is free text).
std::string serialize_tensors(const std::vector<CheckpointTensor>& tensors, int stage) {
  std::ostringstream out;
  for (const CheckpointTensor& t : tensors) {
    const Parameter& p = *t.param;
    MESH_VERIFY(!p.name.empty() && p.name.find_first_of("/\n") == std::string::npos,
                "parameter name '" << p.name << "' cannot name a checkpoint dataset");
    const int parts = p.tp_replicated() ? 1 : p.fused_units();
    out << stage << ' ' << p.shard.split_dim << ' ' << parts << ' ' << p.global_shape.size();
    for (index_t d : p.global_shape) out << ' ' << d;
    out << ' ' << p.name << '\n';
  }
  return out.str();
}

std::string allgather_text(MPI_Comm comm, const std::string& mine) {
  int size = 0;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  const int my_len = int(mine.size());
  std::vector<int> lens(size), offsets(size, 0);
  MPI_CHECK(MPI_Allgather(&my_len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm));
  for (int r = 1; r < size; ++r) offsets[r] = offsets[r - 1] + lens[r - 1];
  std::string all(std::size_t(offsets[size - 1] + lens[size - 1]), '\0');
  MPI_CHECK(MPI_Allgatherv(mine.data(), my_len, MPI_CHAR, all.data(), lens.data(),
                           offsets.data(), MPI_CHAR, comm));
  return all;
}

}  // namespace

std::vector<GlobalTensor> gather_global_tensors(const Topology& topo,
                                                const std::vector<CheckpointTensor>& tensors) {
  const std::string all =
      allgather_text(topo.world_comm(), serialize_tensors(tensors, topo.pp_rank()));
  std::map<std::string, GlobalTensor> by_name;
  std::istringstream in(all);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    GlobalTensor t;
    std::size_t ndims = 0;
    fields >> t.first_stage >> t.split_dim >> t.parts >> ndims;
    t.shape.resize(ndims);
    for (index_t& d : t.shape) fields >> d;
    fields.get();  // the space before the name
    std::getline(fields, t.name);
    auto [it, inserted] = by_name.emplace(t.name, t);
    if (inserted) continue;
    MESH_REQUIRE(it->second.shape == t.shape,
                 "parameter '" << t.name << "' has global shape " << shape_string(t.shape)
                               << " on one rank and " << shape_string(it->second.shape)
                               << " on another");
    MESH_REQUIRE(it->second.split_dim == t.split_dim && it->second.parts == t.parts,
                 "parameter '" << t.name << "' is sharded differently on different ranks");
    it->second.first_stage = std::min(it->second.first_stage, t.first_stage);
  }
  std::vector<GlobalTensor> out;
  out.reserve(by_name.size());
  for (auto& [name, t] : by_name) out.push_back(std::move(t));
  return out;
}

namespace {

/// One box covering `dims` from the origin.
Block whole(const std::vector<hsize_t>& dims) {
  return {std::vector<hsize_t>(dims.size(), 0), dims};
}

}  // namespace

ShardSelection shard_selection(const Parameter& p, int tp_rank, int tp_size) {
  const Shape& local = p.value.shape();
  const Shape& global = p.global_shape;
  ShardSelection sel;
  sel.local_dims.assign(local.begin(), local.end());
  if (p.tp_replicated()) {
    MESH_VERIFY(local == global, "replicated parameter '" << p.name << "' holds "
                                     << shape_string(local) << ", global shape "
                                     << shape_string(global));
    sel.pieces.push_back({whole(sel.local_dims), whole(sel.local_dims)});
    sel.real_elements = shape_numel(global);
    return sel;
  }
  const int d = p.shard.split_dim, parts = p.shard.fused_parts;
  MESH_VERIFY(local.size() == global.size() && d < int(local.size()) && parts >= 1,
              "parameter '" << p.name << "': local " << shape_string(local) << " vs global "
                            << shape_string(global) << ", split_dim " << d);
  for (std::size_t k = 0; k < local.size(); ++k)
    MESH_VERIFY(int(k) == d || local[k] == global[k],
                "parameter '" << p.name << "': local " << shape_string(local)
                              << " differs from global " << shape_string(global)
                              << " outside split_dim " << d);
  const index_t local_d = local[d], global_d = global[d];
  MESH_VERIFY(p.padded_rows == 0 || (d == 0 && parts == 1 && p.padded_rows <= local_d),
              "parameter '" << p.name << "': padded_rows needs split_dim 0 without fused parts");
  const index_t inner = local_d > 0 ? p.value.numel() / local_d : 0;
  sel.real_elements = (local_d - p.padded_rows) * inner;
  if (sel.real_elements == 0) return sel;
  if (parts == 1) {
    const index_t start = tp_rank * local_d, count = local_d - p.padded_rows;
    MESH_VERIFY(start + count <= global_d,
                "parameter '" << p.name << "': shard rows [" << start << ", " << start + count
                              << ") exceed global extent " << global_d);
    Piece piece{whole(sel.local_dims), whole(sel.local_dims)};
    piece.file.start[d] = hsize_t(start);
    piece.file.count[d] = piece.memory.count[d] = hsize_t(count);
    sel.pieces.push_back(piece);
    return sel;
  }
  const int units = p.fused_units();
  MESH_VERIFY(global_d == local_d * tp_size && local_d % units == 0,
              "fused parameter '" << p.name << "': local extent " << local_d << " x tp " << tp_size
                                  << " != global " << global_d << " or not " << units
                                  << " equal units");
  const hsize_t unit_local = hsize_t(local_d / units), unit_global = hsize_t(global_d / units);
  hsize_t first = 0;  // the part's first unit
  for (int part = 0; part < parts; ++part) {
    const hsize_t width = hsize_t(p.units_of_part(part)) * unit_local;
    Piece piece{whole(sel.local_dims), whole(sel.local_dims)};
    piece.file.start[d] = first * unit_global + hsize_t(tp_rank) * width;
    piece.memory.start[d] = first * unit_local;
    piece.file.count[d] = piece.memory.count[d] = width;
    sel.pieces.push_back(piece);
    first += hsize_t(p.units_of_part(part));
  }
  return sel;
}

namespace {

void select(hid_t space, const Block& b) {
  H5_CHECK(H5Sselect_hyperslab(space, H5S_SELECT_SET, b.start.data(), nullptr, b.count.data(),
                               nullptr));
}

}  // namespace

void select_in_file(hid_t file_space, const Piece* piece) {
  if (piece) select(file_space, piece->file);
  else H5_CHECK(H5Sselect_none(file_space));
}

hid_t memory_space(const ShardSelection& sel, const Piece* piece) {
  if (!piece) {
    const hsize_t one = 1;
    const hid_t space = H5_CHECK(H5Screate_simple(1, &one, nullptr));
    H5_CHECK(H5Sselect_none(space));
    return space;
  }
  const hid_t space =
      H5_CHECK(H5Screate_simple(int(sel.local_dims.size()), sel.local_dims.data(), nullptr));
  select(space, piece->memory);
  return space;
}

std::vector<hsize_t> chunk_dims(const Shape& shape, index_t budget, int split_dim, int parts) {
  std::vector<hsize_t> chunk(shape.size(), 1);
  for (std::size_t k = shape.size(); k-- > 0;) {
    const index_t extent = std::max<index_t>(shape[k], 1), limit = std::max<index_t>(budget, 1);
    index_t c = 0;
    if (int(k) == split_dim && parts > 1) {
      // The largest divisor of a block's extent within the budget.
      const index_t unit = extent / parts;
      index_t n = (unit + limit - 1) / limit;
      while (unit % n != 0) ++n;
      c = unit / n;
    } else {
      const index_t pieces = (extent + limit - 1) / limit;
      c = (extent + pieces - 1) / pieces;
    }
    chunk[k] = hsize_t(c);
    budget = std::max<index_t>(1, budget / c);
  }
  return chunk;
}

int comm_rank(MPI_Comm comm) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  return rank;
}

void raise_if_any(MPI_Comm comm, const std::string& local_error) {
  int me = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &me));
  const int mine = local_error.empty() ? INT_MAX : me;
  int first = INT_MAX;
  MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm));
  if (first == INT_MAX) return;
  int len = int(local_error.size());
  MPI_CHECK(MPI_Bcast(&len, 1, MPI_INT, first, comm));
  std::string message = local_error;
  message.resize(std::size_t(len));
  MPI_CHECK(MPI_Bcast(message.data(), len, MPI_CHAR, first, comm));
  throw UserError(message);
}

}  // namespace meshtron::io
