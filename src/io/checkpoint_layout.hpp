// Where each rank's shards sit in a checkpoint's global tensors, and the
// collective bookkeeping (which tensors exist on which ranks, agreeing on
// errors). Internal to src/io.
//
// Shard math (ShardSpec in model/parameter.hpp), for split dimension d of a
// tensor with global extent G_d split over T tensor ranks, local extent
// L_d = G_d / T (plus padding for the word table):
//   plain split      rank t holds [t L_d, (t+1) L_d) along d;
//   fused_parts = P  the dimension is P blocks of G_d / P (q | k | v), each
//                    split over T; rank t holds block p's
//                    [p G_d/P + t L_d/P, p G_d/P + (t+1) L_d/P) for every p,
//                    stored locally as [q_t | k_t | v_t]; parts of unequal
//                    widths (Parameter::part_units: q | k | v with grouped keys) are
//                    cut the same way, each in its own width;
//   padded rows      the last `padded_rows` local rows of a dim-0 split lie
//                    beyond the real vocabulary and are not in the file.
// Each fused block p is its own piece: a box in the file matched by an
// equally shaped box of the local buffer. Equal shapes let HDF5 map chunks
// box by box (a single strided selection for all P blocks would have
// different strides in file and memory, and HDF5 1.10 then maps every
// element on its own: ~45 ns per element). Fused tensors are chunked so that
// no chunk straddles two blocks, so the P collective writes of one tensor
// each cover whole chunks.
#pragma once

#include <hdf5.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "io/checkpoint.hpp"

namespace meshtron::io {

/// One tensor of the whole model as the world sees it.
struct GlobalTensor {
  std::string name;
  Shape shape;            ///< global, unpadded
  int first_stage = 0;    ///< lowest pipeline stage holding it (the writer)
  int split_dim = -1;     ///< as the parameter's ShardSpec
  int parts = 1;          ///< fused units along split_dim (Parameter::fused_units)
};

/// Union of every rank's tensors, sorted by name (collective over the world;
/// the same list on every rank). Throws UserError, on every rank alike, if
/// two ranks disagree about a tensor's global shape or fused layout.
std::vector<GlobalTensor> gather_global_tensors(const Topology& topo,
                                                const std::vector<CheckpointTensor>& tensors);

/// A box: `count` elements from `start` in each dimension.
struct Block {
  std::vector<hsize_t> start, count;
};

/// One box of a shard: where it lies in the global tensor and where in the
/// local buffer (same shape).
struct Piece {
  Block file, memory;
};

/// This rank's shard of a parameter: one piece per fused block (one for
/// unfused tensors, none when the rank holds only vocabulary padding).
struct ShardSelection {
  std::vector<Piece> pieces;
  std::vector<hsize_t> local_dims;
  index_t real_elements = 0;
};
ShardSelection shard_selection(const Parameter& p, int tp_rank, int tp_size);

/// Select a piece's file box in a dataset's dataspace; none for null.
void select_in_file(hid_t file_space, const Piece* piece);
/// A dataspace of the local buffer with the piece's memory box selected
/// (for null: a 1-element space selecting none).
hid_t memory_space(const ShardSelection& sel, const Piece* piece);

/// Chunk dims for a tensor: about `budget` elements, whole trailing
/// dimensions first, dimensions cut into near-equal parts (edge chunks are
/// stored full size), and for fused tensors (parts > 1) never straddling two
/// of the blocks along split_dim.
std::vector<hsize_t> chunk_dims(const Shape& shape, index_t budget, int split_dim, int parts);

/// Collective over `comm`: if any rank passes a non-empty message, every
/// rank throws UserError with the message of the lowest such rank.
void raise_if_any(MPI_Comm comm, const std::string& local_error);

/// This process's rank in `comm`.
int comm_rank(MPI_Comm comm);

}  // namespace meshtron::io
