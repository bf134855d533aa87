// =============================================================== Embedding ==
//
// Vocab-parallel token embedding: this rank holds rows
// [vocab_begin, vocab_begin + V_local) of the global table.
//   forward:  out[n, :] = table[ids[n] - vocab_begin, :] if the id is in this
//             shard, else 0 (the tp all-reduce then sums the one non-zero row)
//   backward: dtable[ids[n] - vocab_begin, :] += dout[n, :] for ids in the
//             shard. Tokens repeat, so rows collide: the backward runs in
//             parallel over columns h, each work item walking all tokens in
//             order (no atomics, bitwise reproducible).
//
// Learned absolute positions, out [N = batch * S, H]:
//   forward:  out[n, :] += table[n mod S, :]
//   backward: dtable[s, :] += sum_{n mod S = s} dout[n, :]  (parallel over
//             (s, h), summing in double)
#pragma once

#include "kernels/kokkos/common.hpp"

namespace meshtron::kernels {

template <class ExecSpace, class T>
struct EmbeddingForward {
  Vector<const std::int32_t, ExecSpace> ids;
  Matrix<const T, ExecSpace> table;  // [V_local, H]
  kindex vocab_begin;
  Matrix<T, ExecSpace> out;  // [N, H]

  KOKKOS_INLINE_FUNCTION void operator()(kindex n) const {
    const kindex row = kindex(ids(n)) - vocab_begin;
    const bool in_shard = row >= 0 && row < kindex(table.extent(0));
    for (kindex h = 0; h < kindex(out.extent(1)); ++h) out(n, h) = in_shard ? table(row, h) : T(0);
  }
};

template <class ExecSpace, class T>
struct EmbeddingBackward {
  Vector<const std::int32_t, ExecSpace> ids;
  Matrix<const T, ExecSpace> dout;  // [N, H]
  kindex vocab_begin;
  Matrix<T, ExecSpace> dtable;  // [V_local, H]

  KOKKOS_INLINE_FUNCTION void operator()(kindex h) const {
    for (kindex n = 0; n < kindex(ids.extent(0)); ++n) {
      const kindex row = kindex(ids(n)) - vocab_begin;
      if (row >= 0 && row < kindex(dtable.extent(0))) dtable(row, h) += dout(n, h);
    }
  }
};

template <class ExecSpace, class T>
struct PositionEmbeddingForward {
  Matrix<const T, ExecSpace> table;  // [>= S, H]
  kindex seq_len;
  Matrix<T, ExecSpace> out;  // [N, H]

  KOKKOS_INLINE_FUNCTION void operator()(kindex i) const {
    const kindex H = out.extent(1), n = i / H, h = i % H;
    out(n, h) += table(n % seq_len, h);
  }
};

template <class ExecSpace, class T>
struct PositionEmbeddingBackward {
  Matrix<const T, ExecSpace> dout;  // [N, H]
  kindex seq_len;
  Matrix<T, ExecSpace> dtable;  // [>= S, H]

  KOKKOS_INLINE_FUNCTION void operator()(kindex i) const {
    const kindex H = dout.extent(1), s = i / H, h = i % H;
    accum_t sum = 0;
    for (kindex n = s; n < kindex(dout.extent(0)); n += seq_len) sum += dout(n, h);
    dtable(s, h) += T(sum);
  }
};

// ---------------------------------------------------------------- launchers

template <class ExecSpace, class T>
void embedding_forward(const std::int32_t* ids, kindex N, const T* table, kindex V_local, kindex H,
                       kindex vocab_begin, T* out) {
  EmbeddingForward<ExecSpace, T> f{as_vector<ExecSpace>(ids, N),
                                   as_matrix<ExecSpace>(table, V_local, H), vocab_begin,
                                   as_matrix<ExecSpace>(out, N, H)};
  Kokkos::parallel_for("meshtron::embedding_forward", Range<ExecSpace>(0, N), f);
}

template <class ExecSpace, class T>
void embedding_backward(const std::int32_t* ids, kindex N, const T* dout, kindex V_local, kindex H,
                        kindex vocab_begin, T* dtable) {
  EmbeddingBackward<ExecSpace, T> f{as_vector<ExecSpace>(ids, N), as_matrix<ExecSpace>(dout, N, H),
                                    vocab_begin, as_matrix<ExecSpace>(dtable, V_local, H)};
  Kokkos::parallel_for("meshtron::embedding_backward", Range<ExecSpace>(0, H), f);
}

template <class ExecSpace, class T>
void position_embedding_forward(const T* table, kindex table_rows, kindex seq_len, kindex N,
                                kindex H, T* out) {
  PositionEmbeddingForward<ExecSpace, T> f{as_matrix<ExecSpace>(table, table_rows, H), seq_len,
                                           as_matrix<ExecSpace>(out, N, H)};
  Kokkos::parallel_for("meshtron::position_embedding_forward", Range<ExecSpace>(0, N * H), f);
}

template <class ExecSpace, class T>
void position_embedding_backward(const T* dout, kindex N, kindex H, kindex seq_len,
                                 kindex table_rows, T* dtable) {
  PositionEmbeddingBackward<ExecSpace, T> f{as_matrix<ExecSpace>(dout, N, H), seq_len,
                                            as_matrix<ExecSpace>(dtable, table_rows, H)};
  Kokkos::parallel_for("meshtron::position_embedding_backward", Range<ExecSpace>(0, seq_len * H),
                       f);
}

}  // namespace meshtron::kernels
