// The embedding ops (ops.hpp: Embedding): vocab-parallel word embedding and
// learned position embedding, forward and backward.
#include <cstdint>

#include "kernels/kokkos/embedding.hpp"
#include "ops/op_checks.hpp"
#include "ops/ops.hpp"

namespace meshtron::ops {

using namespace detail;

// ------------------------------------------------------------- Embedding ---

void embedding_forward(const Tensor& ids, const Tensor& table, index_t vocab_begin, Tensor& out) {
  const char* op = "embedding_forward";
  const Arg ai{"ids", ids}, at{"table", table}, ao{"out", out};
  on_device(op, {ai, at, ao});
  require_index_arg(op, ai);
  const bool device = require_float_args(op, {at, ao});
  MESH_VERIFY(table.rank() == 2, op << ": " << describe(at) << " must be [V_local, H]");
  const index_t N = ids.numel(), V = table.dim(0), H = table.dim(1);
  MESH_VERIFY(out.rank() >= 1 && out.dim(-1) == H && out.numel() == N * H,
              op << ": " << describe(ao) << " must be [" << N << ", " << H << "] for "
                 << describe(ai) << " and " << describe(at));
  if (device) {
    ON_CUDA(cuda::embedding_forward(table.dtype(), ids.data<std::int32_t>(), N, table.raw(), V, H,
                                    vocab_begin, out.raw()));
    return;
  }
  with_float_type(table.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::embedding_forward<Host>(ids.data<std::int32_t>(), N, table.data<T>(), V, H,
                                     vocab_begin, out.data<T>());
  });
}

void embedding_backward(const Tensor& ids, const Tensor& dout, index_t vocab_begin,
                        Tensor& dtable) {
  const char* op = "embedding_backward";
  const Arg ai{"ids", ids}, ad{"dout", dout}, at{"dtable", dtable};
  on_device(op, {ai, ad, at});
  require_index_arg(op, ai);
  const bool device = require_float_args(op, {ad});
  require_grad_args(op, device, ad, {at});
  MESH_VERIFY(dtable.rank() == 2, op << ": " << describe(at) << " must be [V_local, H]");
  const index_t N = ids.numel(), V = dtable.dim(0), H = dtable.dim(1);
  MESH_VERIFY(dout.rank() >= 1 && dout.dim(-1) == H && dout.numel() == N * H,
              op << ": " << describe(ad) << " must be [" << N << ", " << H << "] for "
                 << describe(ai) << " and " << describe(at));
  if (device) {
    ON_CUDA(cuda::embedding_backward(dout.dtype(), dtable.dtype(), ids.data<std::int32_t>(), N,
                                     dout.raw(), V, H, vocab_begin, dtable.raw()));
    return;
  }
  with_float_type(dtable.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::embedding_backward<Host>(ids.data<std::int32_t>(), N, dout.data<T>(), V, H,
                                      vocab_begin, dtable.data<T>());
  });
}

namespace {
/// out [N, H] with N a multiple of seq_len, table [P >= seq_len, H].
/// In the backward `table` is dtable (a gradient: fp32 allowed on the device
/// under bf16 dout) and `out` is dout.
index_t check_position_embedding(const char* op, const Arg& table, index_t seq_len,
                                 const Arg& out, bool table_is_grad) {
  on_device(op, {table, out});
  if (table_is_grad)
    require_grad_args(op, require_float_args(op, {out}), out, {table});
  else
    require_float_args(op, {table, out});
  MESH_VERIFY(table.t.rank() == 2 && seq_len > 0 && table.t.dim(0) >= seq_len,
              op << ": " << describe(table) << " must be [max_positions >= seq_len = " << seq_len
                 << ", H]");
  const index_t N = rows_of(op, out);
  MESH_VERIFY(out.t.dim(-1) == table.t.dim(1) && N % seq_len == 0,
              op << ": " << describe(out) << " must be [batch * " << seq_len << ", "
                 << table.t.dim(1) << "]");
  return N;
}
}  // namespace

void position_embedding_forward(const Tensor& table, index_t seq_len, Tensor& out) {
  const index_t N = check_position_embedding("position_embedding_forward", {"table", table},
                                             seq_len, {"out", out}, false);
  if (!table.is_host()) {
    ON_CUDA(cuda::position_embedding_forward(table.dtype(), table.raw(), seq_len, N, table.dim(1),
                                             out.raw()));
    return;
  }
  with_float_type(table.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::position_embedding_forward<Host>(table.data<T>(), table.dim(0), seq_len, N,
                                              table.dim(1), out.data<T>());
  });
}

void position_embedding_backward(const Tensor& dout, index_t seq_len, Tensor& dtable) {
  const index_t N = check_position_embedding("position_embedding_backward", {"dtable", dtable},
                                             seq_len, {"dout", dout}, true);
  if (!dout.is_host()) {
    ON_CUDA(cuda::position_embedding_backward(dout.dtype(), dtable.dtype(), dout.raw(), N,
                                              dtable.dim(1), seq_len, dtable.raw()));
    return;
  }
  with_float_type(dtable.dtype(), [&](auto zero) {
    using T = decltype(zero);
    kernels::position_embedding_backward<Host>(dout.data<T>(), N, dtable.dim(1), seq_len,
                                               dtable.dim(0), dtable.data<T>());
  });
}

}  // namespace meshtron::ops
