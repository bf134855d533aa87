// Fused AdamW on the GPU (kernels/cuda/adamw.cu) against the per-tensor path
// it replaces, BIT FOR BIT:
//
//  * ops::MultiTensorAdamW (one launch, compute copies written in the same
//    pass) against ops::adamw_step + ops::cast per tensor, on 50 tensors of
//    odd sizes (1, 7, 1000003, around the 16384-element chunk, ...), weight
//    decay on and off, some without a compute copy, bf16 and fp16 copies,
//    three steps with a new lr each. Every tensor is a view into flat
//    buffers, some at 256-byte-aligned offsets (the packed 16-byte path) and
//    some at odd offsets (head/tail pieces, or the copy misaligned with the
//    master: the unpacked path); the WHOLE flat buffers are compared, so a
//    write outside a tensor, or an element left unwritten (copies start as
//    NaN), shows. The device table is uploaded once for the three steps and
//    again when the list of tensors changes.
//  * ops::adamw_step with a compute copy against adamw_step then cast.
//  * clipping from a norm left on the device against the factor given.
//  * AdamW (replicated) on bf16 parameters against the per-tensor loop, and
//    DistributedAdamW on one rank against AdamW: values, masters, moments.
//
// Run: ctest -R gpu_adamw --output-on-failure   (skips, exit 0, without a GPU)
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/parameter_set.hpp"
#include "ops/cast.hpp"
#include "ops/clip_factor.hpp"
#include "ops/ops.hpp"
#include "parallel/communicator_nccl.hpp"
#include "tensor/device_allocator.hpp"
#include "train/optimizer.hpp"

namespace meshtron {
namespace {

#define REQUIRE_GPU() \
  if (device::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine"

std::mt19937_64& rng() {
  static std::mt19937_64 engine(20261122);
  return engine;
}

/// Random fp32 values in [lo, hi) on the device; every 97th element large
/// (fp16 copies then round some of them to inf, as cast does).
Tensor random_device(index_t n, double lo, double hi, bool some_large = false) {
  Tensor t = Tensor::empty({n}, DType::F32);
  std::uniform_real_distribution<double> dist(lo, hi);
  for (index_t i = 0; i < n; ++i) {
    double x = dist(rng());
    if (some_large && i % 97 == 5) x *= 1e5;
    t.data<float>()[i] = float(x);
  }
  return t.to_device();
}

/// Equal bytes; on failure, the first differing element.
void expect_bitwise_equal(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.bytes(), b.bytes()) << what;
  const Tensor ha = a.to_host(), hb = b.to_host();
  if (std::memcmp(ha.raw(), hb.raw(), ha.bytes()) == 0) return;
  const std::vector<double> da = ha.to_doubles(), db = hb.to_doubles();
  std::size_t i = 0;
  while (i < da.size() && std::memcmp(&da[i], &db[i], sizeof(double)) == 0) ++i;
  ADD_FAILURE() << what << ": differ first at element " << i << " of " << da.size() << ": "
                << (i < da.size() ? da[i] : 0) << " vs " << (i < db.size() ? db[i] : 0);
}

/// Flat device buffers holding every tensor's param, grad, m, v and copy.
struct FlatState {
  Tensor param, grad, m, v, copy;
  FlatState clone() const { return {param.clone(), grad.clone(), m.clone(), v.clone(), copy.clone()}; }
};

/// Where tensor i lives in the flat buffers.
struct Slot {
  index_t offset, copy_offset, n;
  bool decay, has_copy;
};

const std::vector<index_t> kSizes = {
    1,     7,     1000003, 2,     3,     4,     5,      8,      15,     16,
    17,    31,    33,      63,    64,    65,    127,    255,    256,    257,
    768,   1023,  1024,    1025,  2304,  3072,  4099,   16383,  16384,  16385,
    16387, 16388, 32767,   32768, 32771, 49153, 65536,  65537,  100003, 131071,
    3,     9,     11,      13,    4095,  8193,  262147, 1,      6,      1000};

/// The slots: even tensors at 64-element (256-byte) offsets, odd ones at odd
/// offsets; every 5th tensor's copy shifted by one element against its
/// master (so only the unpacked path can serve it); every 7th without a
/// copy; weight decay on every other tensor.
std::vector<Slot> make_slots(index_t& total) {
  std::vector<Slot> slots;
  total = 0;
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    index_t offset = (total + 63) / 64 * 64 + 64;  // a gap, to catch stray writes
    if (i % 2 == 1) offset += index_t(1 + i % 3);
    const index_t copy_offset = offset + (i % 5 == 4 ? 1 : 0);
    slots.push_back({offset, copy_offset, kSizes[i], i % 2 == 0, i % 7 != 3});
    total = copy_offset + kSizes[i];
  }
  total += 64;
  return slots;
}

Tensor view(const Tensor& flat, index_t offset, index_t n) {
  return flat.slice_rows(offset, offset + n);
}

std::vector<ops::AdamWTensor> tensors_of(const FlatState& s, const std::vector<Slot>& slots) {
  std::vector<ops::AdamWTensor> out;
  for (const Slot& k : slots)
    out.push_back({view(s.param, k.offset, k.n), view(s.grad, k.offset, k.n),
                   view(s.m, k.offset, k.n), view(s.v, k.offset, k.n),
                   k.has_copy ? view(s.copy, k.copy_offset, k.n) : Tensor(), k.decay});
  return out;
}

/// Today's path: adamw_step then cast, tensor by tensor.
void per_tensor_step(const FlatState& s, const std::vector<Slot>& slots,
                     const ops::AdamWParams& hp) {
  for (ops::AdamWTensor& t : tensors_of(s, slots)) {
    ops::AdamWParams one = hp;
    one.weight_decay = t.decay ? hp.weight_decay : 0.0;
    ops::adamw_step(t.param, t.grad, t.m, t.v, one);
    if (t.compute_copy.defined()) ops::cast(t.param, t.compute_copy);
  }
}

void expect_same_state(const FlatState& got, const FlatState& want, const std::string& what) {
  expect_bitwise_equal(got.param, want.param, what + " master");
  expect_bitwise_equal(got.m, want.m, what + " m");
  expect_bitwise_equal(got.v, want.v, what + " v");
  expect_bitwise_equal(got.copy, want.copy, what + " compute copy");
  expect_bitwise_equal(got.grad, want.grad, what + " grad (read only)");
}

FlatState random_state(index_t total, DType copy_dtype) {
  FlatState s{random_device(total, -1, 1, /*some_large=*/true), random_device(total, -1, 1),
              random_device(total, -0.1, 0.1), random_device(total, 0, 0.01),
              Tensor::empty({total}, copy_dtype, MemorySpace::Cuda)};
  s.copy.fill(std::nan(""));
  return s;
}

TEST(GpuAdamW, MultiTensorWithCopiesEqualsPerTensorAdamWAndCastBitwise) {
  REQUIRE_GPU();
  index_t total = 0;
  const std::vector<Slot> slots = make_slots(total);
  ASSERT_EQ(slots.size(), 50u);
  for (DType copy_dtype : {DType::BF16, DType::F16}) {
    const std::string name(dtype_name(copy_dtype));
    FlatState fused = random_state(total, copy_dtype);
    FlatState reference = fused.clone();
    ops::MultiTensorAdamW update;
    ops::AdamWParams hp;
    hp.beta2 = 0.95, hp.weight_decay = 0.1;
    const double lrs[] = {1e-3, 3e-3, 6e-4};
    for (hp.step = 1; hp.step <= 3; ++hp.step) {
      hp.lr = lrs[hp.step - 1];
      if (hp.step > 1) {  // fresh gradients in the same buffers, the same in both
        fused.grad.copy_from(random_device(total, -1, 1));
        reference.grad.copy_from(fused.grad);
      }
      update.step(tensors_of(fused, slots), hp);
      per_tensor_step(reference, slots, hp);
      expect_same_state(fused, reference, name + " step " + std::to_string(hp.step));
    }
    // Only the lr and the step changed: the table went up once.
    EXPECT_EQ(update.table_uploads(), 1) << name << ": uploaded though only the lr changed";
    // A shorter list, then a changed weight decay: uploaded again each time.
    const std::vector<Slot> some(slots.begin() + 10, slots.begin() + 30);
    ++hp.step;
    update.step(tensors_of(fused, some), hp);
    per_tensor_step(reference, some, hp);
    EXPECT_EQ(update.table_uploads(), 2) << name;
    expect_same_state(fused, reference, name + " subset step");
    hp.weight_decay = 0.01, ++hp.step;
    update.step(tensors_of(fused, some), hp);
    per_tensor_step(reference, some, hp);
    EXPECT_EQ(update.table_uploads(), 3) << name;
    expect_same_state(fused, reference, name + " new weight decay");
  }
}

// Gradient clipping rides in the update (AdamWParams::grad_scale): one
// multi-tensor step with grad_scale must equal ops::scale of every gradient
// followed by the plain step, bit for bit, and leave the gradients as they were.
TEST(GpuAdamW, GradScaleEqualsScalingTheGradientsFirstBitwise) {
  if (device::cuda_device_count() == 0) GTEST_SKIP() << "no GPU";
  for (const double grad_scale : {0.37, 1.0 / 3.0, 2.5}) {
    std::vector<Tensor> p, g, m, v, copy;
    for (index_t n : {index_t(1), index_t(7), index_t(1000003), index_t(16385)}) {
      p.push_back(random_device(n, -1, 1));
      g.push_back(random_device(n, -2, 2, /*some_large=*/true));
      m.push_back(random_device(n, -0.1, 0.1));
      v.push_back(random_device(n, 0, 0.01));
      copy.push_back(Tensor::empty({n}, DType::BF16, MemorySpace::Cuda));
    }
    auto clone_all = [](const std::vector<Tensor>& ts) {
      std::vector<Tensor> out;
      for (const Tensor& t : ts) out.push_back(t.clone());
      return out;
    };
    std::vector<Tensor> p2 = clone_all(p), g2 = clone_all(g), m2 = clone_all(m),
                        v2 = clone_all(v), copy2 = clone_all(copy);
    const std::vector<Tensor> g_before = clone_all(g);
    ops::AdamWParams hp;
    hp.lr = 3e-4, hp.weight_decay = 0.1, hp.step = 4;
    std::vector<ops::AdamWTensor> fused, plain;
    for (std::size_t i = 0; i < p.size(); ++i) {
      fused.push_back({p[i], g[i], m[i], v[i], copy[i], i % 2 == 0});
      ops::scale(g2[i], grad_scale);
      plain.push_back({p2[i], g2[i], m2[i], v2[i], copy2[i], i % 2 == 0});
    }
    ops::MultiTensorAdamW a, b;
    ops::AdamWParams scaled = hp;
    scaled.grad_scale = grad_scale;
    a.step(fused, scaled);
    b.step(plain, hp);
    for (std::size_t i = 0; i < p.size(); ++i) {
      const std::string what = "tensor " + std::to_string(i) + " scale " + std::to_string(grad_scale);
      expect_bitwise_equal(p[i], p2[i], what + " param");
      expect_bitwise_equal(m[i], m2[i], what + " m");
      expect_bitwise_equal(v[i], v2[i], what + " v");
      expect_bitwise_equal(copy[i], copy2[i], what + " copy");
      expect_bitwise_equal(g[i], g_before[i], what + " grad untouched");
    }
  }
}

// Clipping from the norm on the device (AdamWParams::grad_sum_of_squares,
// the sum written by ops::sum_of_squares_into and read by the host through a
// StreamMark): the kernels derive the factor as the host does, so the update
// equals the one with that factor given, bit for bit; a non-finite norm
// under skip_nonfinite leaves everything as it was. Multi-tensor and single-
// tensor launches both.
TEST(GpuAdamW, ClipFromTheNormOnTheDeviceEqualsTheFactorFromTheHostBitwise) {
  REQUIRE_GPU();
  std::vector<Tensor> g_list;
  for (index_t n : {index_t(7), index_t(1000003), index_t(16385)})
    g_list.push_back(random_device(n, -2, 2, /*some_large=*/true));
  Tensor sum = Tensor::zeros({1}, DType::F64, MemorySpace::Cuda);
  ops::sum_of_squares_into(g_list, sum);
  device::StreamMark mark;
  mark.record();
  const double squares = sum.to_doubles_at(mark)[0];
  EXPECT_EQ(squares, ops::sum_of_squares(g_list)) << "sum_of_squares_into vs the host read";
  ASSERT_GT(std::sqrt(squares), 1.0) << "the test needs a norm above the clip";

  for (const double poison : {0.0, std::nan(""), HUGE_VAL}) {
    if (poison != 0.0) sum.fill(poison);
    const bool finite = poison == 0.0;
    std::vector<Tensor> p, m, v, copy, p2, m2, v2, copy2, p0;
    std::vector<ops::AdamWTensor> fused, given;
    for (std::size_t i = 0; i < g_list.size(); ++i) {
      const index_t n = g_list[i].numel();
      p.push_back(random_device(n, -1, 1)), m.push_back(random_device(n, -0.1, 0.1));
      v.push_back(random_device(n, 0, 0.01));
      copy.push_back(Tensor::zeros({n}, DType::BF16, MemorySpace::Cuda));
      p2.push_back(p.back().clone()), m2.push_back(m.back().clone());
      v2.push_back(v.back().clone()), copy2.push_back(copy.back().clone());
      p0.push_back(p.back().clone());
      fused.push_back({p[i], g_list[i], m[i], v[i], copy[i], i % 2 == 0});
      given.push_back({p2[i], g_list[i], m2[i], v2[i], copy2[i], i % 2 == 0});
    }
    ops::AdamWParams hp;
    hp.lr = 3e-4, hp.weight_decay = 0.1, hp.step = 4;
    ops::AdamWParams from_norm = hp;
    from_norm.grad_sum_of_squares = &sum;
    from_norm.clip_grad = 1.0;
    from_norm.skip_nonfinite = true;
    ops::MultiTensorAdamW a, b;
    // All but the last tensor in one launch, the last by the single-tensor kernel.
    a.step(std::vector<ops::AdamWTensor>(fused.begin(), fused.end() - 1), from_norm);
    ops::adamw_step(p.back(), g_list.back(), m.back(), v.back(), from_norm, &copy.back());
    const std::string what = finite ? "finite norm" : "poisoned norm " + std::to_string(poison);
    if (!finite) {
      for (std::size_t i = 0; i < p.size(); ++i)
        expect_bitwise_equal(p[i], p0[i], what + " tensor " + std::to_string(i) + " unchanged");
      continue;
    }
    ops::AdamWParams scaled = hp;
    scaled.grad_scale = ops::clip_factor(std::sqrt(squares), 1.0);
    b.step(given, scaled);
    for (std::size_t i = 0; i < p.size(); ++i) {
      const std::string at = what + " tensor " + std::to_string(i);
      expect_bitwise_equal(p[i], p2[i], at + " param");
      expect_bitwise_equal(m[i], m2[i], at + " m");
      expect_bitwise_equal(v[i], v2[i], at + " v");
      expect_bitwise_equal(copy[i], copy2[i], at + " copy");
    }
  }
}

TEST(GpuAdamW, SingleTensorStepWithCopyEqualsStepThenCastBitwise) {
  REQUIRE_GPU();
  for (DType copy_dtype : {DType::BF16, DType::F16})
    for (index_t n : {index_t(1), index_t(7), index_t(1000003)})
      for (index_t shift : {index_t(0), index_t(3)}) {  // a view at an odd offset too
        const std::string what = std::string(dtype_name(copy_dtype)) + " n=" +
                                 std::to_string(n) + " shift=" + std::to_string(shift);
        FlatState a = random_state(n + shift, copy_dtype);
        FlatState b = a.clone();
        ops::AdamWParams hp;
        hp.lr = 2e-3, hp.weight_decay = 0.1, hp.step = 4;
        Tensor pa = view(a.param, shift, n), ma = view(a.m, shift, n), va = view(a.v, shift, n),
               ca = view(a.copy, shift, n);
        ops::adamw_step(pa, view(a.grad, shift, n), ma, va, hp, &ca);
        Tensor pb = view(b.param, shift, n), mb = view(b.m, shift, n), vb = view(b.v, shift, n),
               cb = view(b.copy, shift, n);
        ops::adamw_step(pb, view(b.grad, shift, n), mb, vb, hp);
        ops::cast(pb, cb);
        expect_same_state(a, b, what);
      }
}

// ------------------------------------------------------------ optimizers

using Model = testing_util::ParameterSet;

/// Five bf16 parameters (two without weight decay), identical for a given seed.
Model make_model() {
  Model model;
  const std::vector<std::pair<index_t, bool>> shapes = {
      {4099, true}, {64, false}, {16385, true}, {7, false}, {1000, true}};
  std::mt19937_64 local(7);
  std::uniform_real_distribution<double> dist(-1, 1);
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    Parameter p;
    p.name = "p" + std::to_string(i);
    p.global_shape = {shapes[i].first};
    Tensor host = Tensor::empty({shapes[i].first});
    for (index_t j = 0; j < host.numel(); ++j) host.data<float>()[j] = float(dist(local));
    p.value = host.to(DType::BF16).to_device();
    p.grad = Tensor::zeros({shapes[i].first}, DType::F32, MemorySpace::Cuda);
    p.weight_decay = shapes[i].second;
    model.params.push_back(std::move(p));
  }
  return model;
}

void set_grads(Model& model, int step) {
  std::mt19937_64 local(100 + step);
  std::uniform_real_distribution<double> dist(-0.5, 0.5);
  for (Parameter& p : model.params) {
    Tensor host = Tensor::empty(p.grad.shape());
    for (index_t j = 0; j < host.numel(); ++j) host.data<float>()[j] = float(dist(local));
    p.grad.copy_from(host);
  }
}

TEST(GpuAdamW, OptimizersStepLikeThePerTensorLoopBitwise) {
  REQUIRE_GPU();
  NcclCommunicator tp(MPI_COMM_SELF), dp(MPI_COMM_SELF), model_comm(MPI_COMM_SELF);
  OptimizerGroups groups{tp, dp, model_comm, nullptr};
  const AdamWConfig config{0.9, 0.95, 1e-8, 0.1, /*clip_grad=*/0.0};  // no clip: same norm path
  Model replicated = make_model(), distributed = make_model(), manual = make_model();
  AdamW adam(replicated.list(), config, nullptr);
  DistributedAdamW dist_adam(distributed.list(), config, nullptr, dp);
  std::vector<Tensor> master, m, v;
  for (Parameter& p : manual.params) {
    master.push_back(p.value.to(DType::F32));
    m.push_back(Tensor::zeros(p.value.shape(), DType::F32, MemorySpace::Cuda));
    v.push_back(Tensor::zeros(p.value.shape(), DType::F32, MemorySpace::Cuda));
  }
  const double lrs[] = {1e-2, 5e-3, 2e-3};
  for (int step = 1; step <= 3; ++step) {
    set_grads(replicated, step);
    set_grads(distributed, step);
    set_grads(manual, step);
    adam.step(lrs[step - 1], groups, true);
    dist_adam.step(lrs[step - 1], groups, true);
    for (std::size_t i = 0; i < manual.params.size(); ++i) {
      ops::AdamWParams hp;
      hp.lr = lrs[step - 1], hp.beta1 = 0.9, hp.beta2 = 0.95, hp.eps = 1e-8, hp.step = step;
      hp.weight_decay = manual.params[i].weight_decay ? 0.1 : 0.0;
      ops::adamw_step(master[i], manual.params[i].grad, m[i], v[i], hp);
      ops::cast(master[i], manual.params[i].value);
    }
    for (std::size_t i = 0; i < manual.params.size(); ++i) {
      const std::string what = "step " + std::to_string(step) + " " + manual.params[i].name;
      expect_bitwise_equal(replicated.params[i].value, manual.params[i].value, "AdamW " + what);
      expect_bitwise_equal(distributed.params[i].value, manual.params[i].value,
                           "DistributedAdamW " + what);
    }
  }
  std::vector<Tensor> m_got, v_got, master_got;
  for (Optimizer* opt : {static_cast<Optimizer*>(&adam), static_cast<Optimizer*>(&dist_adam)}) {
    opt->full_state(m_got, v_got, master_got, groups);
    ASSERT_EQ(master_got.size(), master.size());
    for (std::size_t i = 0; i < master.size(); ++i) {
      expect_bitwise_equal(master_got[i].reshape({master[i].numel()}), master[i], "final master");
      expect_bitwise_equal(m_got[i].reshape({m[i].numel()}), m[i], "final m");
      expect_bitwise_equal(v_got[i].reshape({v[i].numel()}), v[i], "final v");
    }
  }
}

}  // namespace
}  // namespace meshtron
