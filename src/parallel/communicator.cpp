#include "parallel/communicator.hpp"

#include <algorithm>
#include <mutex>

#include "common/error.hpp"

namespace meshtron {

namespace {

// Reduction of 16-bit floats: widen to fp32, combine, round back once.
template <class Half, bool kMax>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const Half* a = static_cast<const Half*>(in);
  Half* b = static_cast<Half*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = float(a[i]), y = float(b[i]);
    b[i] = Half(kMax ? std::max(x, y) : x + y);
  }
}

struct HalfTypes {
  MPI_Datatype bf16_type, fp16_type;
  MPI_Op bf16_sum, bf16_max, fp16_sum, fp16_max;
};

// Created on first use and kept for the life of MPI (freed by MPI_Finalize).
const HalfTypes& half_types() {
  static HalfTypes t = [] {
    HalfTypes h{};
    MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &h.bf16_type));
    MPI_CHECK(MPI_Type_commit(&h.bf16_type));
    MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &h.fp16_type));
    MPI_CHECK(MPI_Type_commit(&h.fp16_type));
    MPI_CHECK(MPI_Op_create(&half_reduce<bf16, false>, 1, &h.bf16_sum));
    MPI_CHECK(MPI_Op_create(&half_reduce<bf16, true>, 1, &h.bf16_max));
    MPI_CHECK(MPI_Op_create(&half_reduce<fp16, false>, 1, &h.fp16_sum));
    MPI_CHECK(MPI_Op_create(&half_reduce<fp16, true>, 1, &h.fp16_max));
    return h;
  }();
  return t;
}

int checked_count(std::size_t count) {
  MESH_VERIFY(count <= std::size_t(std::numeric_limits<int>::max()),
              "message of " << count << " elements exceeds MPI's int count");
  return int(count);
}

}  // namespace

MPI_Datatype mpi_datatype(DType dtype) {
  switch (dtype) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U16: return MPI_UINT16_T;
    case DType::U8: return MPI_UINT8_T;
    case DType::BF16: return half_types().bf16_type;
    case DType::F16: return half_types().fp16_type;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp op, DType dtype) {
  const bool is_max = op == ReduceOp::Max;
  if (dtype == DType::BF16) return is_max ? half_types().bf16_max : half_types().bf16_sum;
  if (dtype == DType::F16) return is_max ? half_types().fp16_max : half_types().fp16_sum;
  return is_max ? MPI_MAX : MPI_SUM;
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm) : comm_(comm) {
  MESH_VERIFY(comm != MPI_COMM_NULL, "MpiCommunicator over MPI_COMM_NULL");
  MPI_CHECK(MPI_Comm_rank(comm, &rank_));
  MPI_CHECK(MPI_Comm_size(comm, &size_));
}

void MpiCommunicator::all_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op) {
  yield_point();
  record(CollectiveKind::AllReduce, count * dtype_size(dtype));
  if (size_ == 1) return;
  if (!dog_) {
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, checked_count(count), mpi_datatype(dtype),
                            mpi_op(op, dtype), comm_));
    return;
  }
  const long n = start_collective();
  MPI_Request r;
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, checked_count(count), mpi_datatype(dtype),
                           mpi_op(op, dtype), comm_, &r));
  watched_wait({&r, 1}, WaitOp::AllReduce, n);
}

void MpiCommunicator::reduce_scatter(const void* send, void* recv, std::size_t recv_count,
                                     DType dtype, ReduceOp op) {
  yield_point();
  record(CollectiveKind::ReduceScatter, recv_count * size_ * dtype_size(dtype));
  if (size_ == 1) {
    if (send != recv) std::memcpy(recv, send, recv_count * dtype_size(dtype));
    return;
  }
  if (!dog_) {
    MPI_CHECK(MPI_Reduce_scatter_block(send, recv, checked_count(recv_count),
                                       mpi_datatype(dtype), mpi_op(op, dtype), comm_));
    return;
  }
  const long n = start_collective();
  MPI_Request r;
  MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, checked_count(recv_count),
                                      mpi_datatype(dtype), mpi_op(op, dtype), comm_, &r));
  watched_wait({&r, 1}, WaitOp::ReduceScatter, n);
}

void MpiCommunicator::all_gather(const void* send, void* recv, std::size_t send_count,
                                 DType dtype) {
  yield_point();
  record(CollectiveKind::AllGather, send_count * size_ * dtype_size(dtype));
  if (size_ == 1) {
    if (send != recv) std::memcpy(recv, send, send_count * dtype_size(dtype));
    return;
  }
  if (!dog_) {
    MPI_CHECK(MPI_Allgather(send, checked_count(send_count), mpi_datatype(dtype), recv,
                            checked_count(send_count), mpi_datatype(dtype), comm_));
    return;
  }
  const long n = start_collective();
  MPI_Request r;
  MPI_CHECK(MPI_Iallgather(send, checked_count(send_count), mpi_datatype(dtype), recv,
                           checked_count(send_count), mpi_datatype(dtype), comm_, &r));
  watched_wait({&r, 1}, WaitOp::AllGather, n);
}

void MpiCommunicator::broadcast(void* buf, std::size_t count, DType dtype, int root) {
  record(CollectiveKind::Broadcast, count * dtype_size(dtype));
  if (size_ == 1) return;
  if (!dog_) {
    MPI_CHECK(MPI_Bcast(buf, checked_count(count), mpi_datatype(dtype), root, comm_));
    return;
  }
  const long n = start_collective();
  MPI_Request r;
  MPI_CHECK(MPI_Ibcast(buf, checked_count(count), mpi_datatype(dtype), root, comm_, &r));
  watched_wait({&r, 1}, WaitOp::Broadcast, n);
}

void MpiCommunicator::barrier() {
  record(CollectiveKind::Barrier, 0);
  if (!dog_ || size_ == 1) {
    MPI_CHECK(MPI_Barrier(comm_));
    return;
  }
  const long n = start_collective();
  MPI_Request r;
  MPI_CHECK(MPI_Ibarrier(comm_, &r));
  watched_wait({&r, 1}, WaitOp::Barrier, n);
}

void MpiCommunicator::send(const void* buf, std::size_t count, DType dtype, int peer,
                           int tag, int /*lane: MPI matches by tag*/) {
  record(CollectiveKind::Send, count * dtype_size(dtype));
  if (!dog_) {
    MPI_CHECK(MPI_Send(buf, checked_count(count), mpi_datatype(dtype), peer, tag, comm_));
    return;
  }
  MPI_Request r;
  MPI_CHECK(MPI_Isend(buf, checked_count(count), mpi_datatype(dtype), peer, tag, comm_, &r));
  watched_wait({&r, 1}, WaitOp::Send, 0, peer);
}

void MpiCommunicator::recv(void* buf, std::size_t count, DType dtype, int peer, int tag,
                           int /*lane*/) {
  record(CollectiveKind::Recv, count * dtype_size(dtype));
  if (!dog_) {
    MPI_CHECK(MPI_Recv(buf, checked_count(count), mpi_datatype(dtype), peer, tag, comm_,
                       MPI_STATUS_IGNORE));
    return;
  }
  MPI_Request r;
  MPI_CHECK(MPI_Irecv(buf, checked_count(count), mpi_datatype(dtype), peer, tag, comm_, &r));
  watched_wait({&r, 1}, WaitOp::Recv, 0, peer);
}

void MpiCommunicator::batch_p2p(std::span<const P2POp> ops) {
  std::size_t bytes = 0;
  std::vector<MPI_Request> requests(ops.size());
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    bytes += op.count * dtype_size(op.dtype);
    if (op.kind == P2POp::Send)
      MPI_CHECK(MPI_Isend(op.buffer, checked_count(op.count), mpi_datatype(op.dtype),
                          op.peer, op.tag, comm_, &requests[i]));
    else
      MPI_CHECK(MPI_Irecv(op.buffer, checked_count(op.count), mpi_datatype(op.dtype),
                          op.peer, op.tag, comm_, &requests[i]));
  }
  record(CollectiveKind::BatchP2P, bytes);
  if (dog_)
    watched_wait(requests, WaitOp::BatchP2P, 0);
  else
    MPI_CHECK(MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE));
}

void MpiCommunicator::watch(CollectiveWatchdog& dog, GroupKind kind) {
  dog_ = &dog;
  kind_ = kind;
  members_ = world_ranks_of(comm_, dog.world());
  MESH_VERIFY(pending_collectives_.empty(), "watch() with non-blocking collectives pending");
}

void MpiCommunicator::watched_wait(std::span<MPI_Request> requests, WaitOp op, long collective,
                                   int peer) {
  dog_->wait(requests, {kind_, op, collective, peer < 0 ? -1 : members_[std::size_t(peer)],
                        members_, members_[std::size_t(rank_)]});
}

}  // namespace meshtron

namespace meshtron {

void MpiCommunicator::isend(const void* buf, std::size_t count, DType dtype, int peer,
                            int tag, int /*lane*/) {
  record(CollectiveKind::Send, count * dtype_size(dtype));
  pending_sends_.emplace_back();
  MPI_CHECK(MPI_Isend(buf, checked_count(count), mpi_datatype(dtype), peer, tag, comm_,
                      &pending_sends_.back()));
}

namespace {

/// Test without blocking; completed requests become MPI_REQUEST_NULL, which
/// Waitall skips.
void test_some(std::vector<MPI_Request>& requests) {
  if (requests.empty()) return;
  std::vector<int> indices(requests.size());
  int done = 0;
  MPI_CHECK(MPI_Testsome(int(requests.size()), requests.data(), &done, indices.data(),
                         MPI_STATUSES_IGNORE));
}

}  // namespace

void MpiCommunicator::progress() {
  test_some(pending_sends_);
  test_some(pending_collectives_);  // Open MPI advances a collective only inside MPI calls
}

void MpiCommunicator::ireduce_scatter(const void* send, void* recv,
                                      std::span<const std::size_t> recv_counts, DType dtype,
                                      ReduceOp op) {
  MESH_VERIFY(int(recv_counts.size()) == size_,
              "ireduce_scatter: " << recv_counts.size() << " counts for " << size_ << " ranks");
  std::size_t total = 0;
  std::vector<int> counts;
  for (std::size_t c : recv_counts) {
    total += c;
    counts.push_back(checked_count(c));
  }
  record(CollectiveKind::ReduceScatter, total * dtype_size(dtype));
  record_nonblocking();
  if (size_ == 1) {
    if (send != recv) std::memcpy(recv, send, total * dtype_size(dtype));
    return;
  }
  if (dog_) pending_numbers_.push_back(start_collective());
  pending_collectives_.emplace_back();
  MPI_CHECK(MPI_Ireduce_scatter(send, recv, counts.data(), mpi_datatype(dtype),
                                mpi_op(op, dtype), comm_, &pending_collectives_.back()));
}

void MpiCommunicator::wait_collectives() {
  yield_point();
  if (pending_collectives_.empty()) return;
  if (dog_)
    watched_wait(pending_collectives_, WaitOp::WaitCollectives, pending_numbers_.back());
  else
    MPI_CHECK(MPI_Waitall(int(pending_collectives_.size()), pending_collectives_.data(),
                          MPI_STATUSES_IGNORE));
  first_ticket_ += long(pending_collectives_.size());
  pending_collectives_.clear();
  pending_numbers_.clear();
}

long MpiCommunicator::iall_gather(const void* send, void* recv,
                                  std::span<const std::size_t> counts, DType dtype) {
  MESH_VERIFY(int(counts.size()) == size_,
              "iall_gather: " << counts.size() << " counts for " << size_ << " ranks");
  std::vector<int> block_counts, displacements;
  int total = 0;
  for (std::size_t c : counts) {
    block_counts.push_back(checked_count(c));
    displacements.push_back(total);
    total = checked_count(std::size_t(total) + c);
  }
  record(CollectiveKind::AllGather, std::size_t(total) * dtype_size(dtype));
  record_nonblocking_gather();
  if (size_ == 1) {
    if (send != recv) std::memcpy(recv, send, std::size_t(total) * dtype_size(dtype));
    return first_ticket_ - 1;  // already complete
  }
  if (dog_) pending_numbers_.push_back(start_collective());
  pending_collectives_.emplace_back();
  MPI_CHECK(MPI_Iallgatherv(send, block_counts[std::size_t(rank_)], mpi_datatype(dtype), recv,
                            block_counts.data(), displacements.data(), mpi_datatype(dtype),
                            comm_, &pending_collectives_.back()));
  return first_ticket_ + long(pending_collectives_.size()) - 1;
}

long MpiCommunicator::iall_reduce(void* buf, std::size_t count, DType dtype, ReduceOp op) {
  record(CollectiveKind::AllReduce, count * dtype_size(dtype));
  record_nonblocking_all_reduce();
  if (size_ == 1) return first_ticket_ - 1;  // already complete
  if (dog_) pending_numbers_.push_back(start_collective());
  pending_collectives_.emplace_back();
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, checked_count(count), mpi_datatype(dtype),
                           mpi_op(op, dtype), comm_, &pending_collectives_.back()));
  return first_ticket_ + long(pending_collectives_.size()) - 1;
}

void MpiCommunicator::wait_collective(long ticket) {
  yield_point();  // before the index: the other job's wait_collectives() may complete this one
  const long index = ticket - first_ticket_;
  if (index < 0 || index >= long(pending_collectives_.size())) return;  // completed
  // A completed request becomes MPI_REQUEST_NULL, which later waits skip.
  MPI_Request& r = pending_collectives_[std::size_t(index)];
  if (dog_)
    watched_wait({&r, 1}, WaitOp::WaitCollective, pending_numbers_[std::size_t(index)]);
  else
    MPI_CHECK(MPI_Wait(&r, MPI_STATUS_IGNORE));
}

void MpiCommunicator::wait_sends() {
  if (pending_sends_.empty()) return;
  if (dog_)
    watched_wait(pending_sends_, WaitOp::WaitSends, 0);
  else
    MPI_CHECK(MPI_Waitall(int(pending_sends_.size()), pending_sends_.data(),
                          MPI_STATUSES_IGNORE));
  pending_sends_.clear();
}

}  // namespace meshtron
