// bf16 and fp16 mixed precision and activation recomputation on ONE GPU.
//
//  * The HF golden GPT-2 (validation/gpt2-golden) with bf16 values and
//    activations: parameters bf16, gradients fp32 (main_grad), logits and
//    loss fp32; loss within 1e-2 relative of transformers' fp32 loss,
//    every gradient finite and within 0.1 norm-wise of the golden one.
//    Again with bf16 logits (training.logits_dtype = compute), and the
//    tiny GPT trained with them tracks fp32 as below.
//  * AdamW under bf16: fp32 master and moments; the bf16 value is the
//    rounded master after a step.
//  * The tiny GPT (tests/parallel/decomposition.hpp) trained 20 steps in
//    bf16 on one fixed batch: every loss finite, the loss falls by more
//    than 0.2 nats, and it
//    tracks the fp32 run on the GPU to 5e-2 relative.
//  * recompute none / selective / full on the GPU in fp32 (seq 128, micro-
//    batch 4, dropout on, 3 steps): every loss, grad norm and parameter
//    bitwise equal to the none run, and a second none run bitwise equal to
//    the first (run-to-run determinism: no atomics in the step, the
//    embedding backward sums repeated ids in token order); the allocator's
//    peak bytes fall none > selective > full.
//  * exact resume in bf16 and fp16: 6 steps straight against 3 steps, a
//    checkpoint (train/trainer_checkpoint.hpp: fp32 master weights as the
//    parameters), a fresh Trainer loading it, 3 more steps: losses, grad
//    norms, loss scales, 16-bit parameters and fp32 master weights bitwise
//    equal; replicated and distributed optimizer.
//
//  * fp16 with dynamic loss scaling (train/loss_scaler.hpp): the golden
//    GPT-2 in fp16 (loss within 1e-2, gradients within 0.1); the tiny GPT
//    20 steps in fp16 at scale 2^16 (no skips, loss falls, tracks fp32 to
//    5e-2); an initial scale of 2^40 overflows: each overflowing step is
//    skipped with the Adam step untouched and halves the scale, until the
//    steps succeed.
//  * check_for_nan under bf16: a NaN weight's step is skipped by the AdamW
//    kernel (norm on the device), nothing else moves, training continues.
//
// Skips (exit 0) without a GPU (and the golden case without its files).
#include <gtest/gtest.h>
#include <mpi.h>

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>

#include "config/model_spec_from_deck.hpp"
#include "io/hf/gpt2_config.hpp"
#include "io/hf/gpt2.hpp"
#include "io/safetensors.hpp"
#include "model/gpt_model.hpp"
#include "parallel/decomposition.hpp"
#include "tensor/device_allocator.hpp"
#include "train/trainer_checkpoint.hpp"

namespace meshtron {
namespace {

#define REQUIRE_GPU() \
  if (device::cuda_device_count() == 0) GTEST_SKIP() << "no GPU"

const std::string kGolden = std::string(MESHTRON_SOURCE_DIR) + "/validation/gpt2-golden";
constexpr int kBatch = 2, kSeq = 16;

double norm_rel(const std::vector<double>& a, const std::vector<double>& b) {
  return testing::norm_rel_error(a, b);
}

/// The HF golden GPT-2 with `dtype` (bf16 or fp16) values and activations:
/// step-1 loss within 1e-2 relative of transformers' fp32 loss, every
/// gradient finite and within 0.1 norm-wise of the golden one. With
/// `logits_in_compute_dtype` (training.logits_dtype = compute) the LM head
/// writes `dtype` logits instead of fp32 ones.
void check_golden_in(DType dtype, bool logits_in_compute_dtype = false) {
  const std::string name = std::string(dtype == DType::BF16 ? "bf16" : "fp16") +
                           (logits_in_compute_dtype ? " (logits in the compute dtype)" : "");
  io::SafetensorsFile golden(kGolden + "/golden.safetensors");
  MpiCommunicator self(MPI_COMM_SELF);
  TensorParallelGroup tp{self};
  LayerContext ctx{tp};
  ctx.seq_length = kSeq;
  ctx.micro_batch = kBatch;
  ctx.global_batch = kBatch;
  ctx.space = MemorySpace::Cuda;
  ctx.logits_in_compute_dtype = logits_in_compute_dtype;
  const ModelSpec config =
      io::model_spec_from_hf(io::read_hf_gpt2_config(kGolden), kSeq, /*divisible_by=*/128, 1);
  GptModel model(config, StagePlacement::whole_model(config.num_layers), ctx, dtype, 1);
  io::import_hf_gpt2(kGolden, model.parameters(), 0, 1);

  // Golden tokens of step 0 in [s, b] order.
  const Tensor tokens = golden.load("tokens");
  Tensor ids = Tensor::empty({kSeq * kBatch}, DType::I32);
  Tensor targets = Tensor::empty({kSeq * kBatch}, DType::I32);
  for (int b = 0; b < kBatch; ++b)
    for (int s = 0; s < kSeq; ++s) {
      ids.data<std::int32_t>()[s * kBatch + b] = tokens.data<std::int32_t>()[b * (kSeq + 1) + s];
      targets.data<std::int32_t>()[s * kBatch + b] =
          tokens.data<std::int32_t>()[b * (kSeq + 1) + s + 1];
    }
  GptModel::Cache cache;
  Tensor loss = model.forward(ids, targets, ctx, cache);
  ASSERT_EQ(loss.dtype(), DType::F32);
  ASSERT_EQ(cache.head.logits.dtype(), logits_in_compute_dtype ? dtype : DType::F32);
  double mean = 0;
  for (double v : loss.to_doubles()) mean += v / double(loss.numel());
  const double expected = golden.load("losses", DType::F32).to_doubles()[0];
  const double rel = std::fabs(mean - expected) / expected;
  std::printf("%s golden loss %.6f vs transformers fp32 %.6f: relative %.2e\n", name.c_str(), mean,
              expected, rel);
  EXPECT_LE(rel, 1e-2);

  Tensor dloss = Tensor::empty(loss.shape(), DType::F32, MemorySpace::Cuda);
  dloss.fill(1.0 / double(loss.numel()));
  model.backward(dloss, ctx, cache);
  double worst = 0;
  for (Parameter* p : model.parameters()) {
    EXPECT_EQ(p->value.dtype(), dtype) << p->name;
    EXPECT_EQ(p->grad.dtype(), DType::F32) << p->name;
    std::vector<double> ours = p->grad.to_doubles();
    const auto theirs = golden.load("grad." + io::hf_name_of(p->name), DType::F32).to_doubles();
    ours.resize(theirs.size());
    for (double g : ours) ASSERT_TRUE(std::isfinite(g)) << p->name;
    const double e = norm_rel(ours, theirs);
    worst = std::max(worst, e);
    EXPECT_LE(e, 0.1) << p->name;
  }
  std::printf("%s golden gradients: worst norm-wise relative error %.2e\n", name.c_str(), worst);
}

// GptModel::backward reports a parameter's gradient (to the optimizer's
// overlapped reduce) only once it is final: the layernorm backwards leave
// their dgamma / dbeta adds to the next layernorm's kernel
// (ops::LayerNormGradChain), so a layer's ln_1 is reported with the layer
// below it, the first layer's before the embedding. Each gradient, copied
// when reported, must equal its value after the backward, every parameter
// reported once; and at this size (256 tokens: grids of 32 blocks, room for
// the earlier call's columns) some norm must have been held past its layer.
TEST(GpuBf16, BackwardReportsEveryGradientOnceItIsFinal) {
  REQUIRE_GPU();
  MpiCommunicator self(MPI_COMM_SELF);
  TensorParallelGroup tp{self};
  LayerContext ctx{tp};
  ModelSpec config;
  config.num_layers = 3;
  config.seq_length = config.max_positions = 64;
  ctx.seq_length = config.seq_length;
  ctx.micro_batch = ctx.global_batch = 4;
  ctx.space = MemorySpace::Cuda;
  GptModel model(config, StagePlacement::whole_model(config.num_layers), ctx, DType::BF16, 7);
  const index_t tokens = ctx.seq_length * ctx.micro_batch;
  Tensor ids = Tensor::empty({tokens}, DType::I32), targets = ids.clone();
  for (index_t i = 0; i < tokens; ++i) {
    ids.data<std::int32_t>()[i] = std::int32_t((i * 37) % config.vocab_size);
    targets.data<std::int32_t>()[i] = std::int32_t((i * 53 + 1) % config.vocab_size);
  }
  GptModel::Cache cache;
  const Tensor loss = model.forward(ids, targets, ctx, cache);
  Tensor dloss = Tensor::empty(loss.shape(), DType::F32, MemorySpace::Cuda);
  dloss.fill(1.0 / double(loss.numel()));

  std::map<const Parameter*, std::vector<double>> at_report;
  std::map<const Parameter*, int> report_index;
  int reports = 0;
  model.backward(dloss, ctx, cache, [&](const ParameterList& done) {
    for (const Parameter* p : done) {
      EXPECT_EQ(at_report.count(p), 0u) << p->name << " reported twice";
      at_report[p] = p->grad.to_doubles();  // waits for the kernels queued so far
      report_index[p] = reports;
    }
    ++reports;
  });
  EXPECT_EQ(ctx.layernorm_grads, nullptr);
  bool held_past_its_layer = false;
  for (const Parameter* p : model.parameters()) {
    ASSERT_EQ(at_report.count(p), 1u) << p->name << " never reported";
    EXPECT_TRUE(at_report[p] == p->grad.to_doubles()) << p->name << " changed after its report";
    const std::string layer = p->name.substr(0, p->name.find(".ln_1."));
    if (p->name.find(".ln_1.") != std::string::npos)
      for (const Parameter* q : model.parameters())
        if (q->name.rfind(layer + ".mlp.", 0) == 0 && report_index[p] > report_index[q])
          held_past_its_layer = true;
  }
  EXPECT_TRUE(held_past_its_layer) << "no layernorm gradient was held by the chain";
}

TEST(GpuBf16, GoldenGpt2LossWithinOnePercent) {
  REQUIRE_GPU();
  if (!std::filesystem::exists(kGolden + "/golden.safetensors")) GTEST_SKIP() << "no golden files";
  check_golden_in(DType::BF16);
}

TEST(GpuBf16, GoldenGpt2LossWithinOnePercentWithLogitsInBf16) {
  REQUIRE_GPU();
  if (!std::filesystem::exists(kGolden + "/golden.safetensors")) GTEST_SKIP() << "no golden files";
  check_golden_in(DType::BF16, /*logits_in_compute_dtype=*/true);
}

TEST(GpuFp16, GoldenGpt2LossWithinOnePercent) {
  REQUIRE_GPU();
  if (!std::filesystem::exists(kGolden + "/golden.safetensors")) GTEST_SKIP() << "no golden files";
  check_golden_in(DType::F16);
}

TEST(GpuBf16, AdamWStepsFp32MasterAndWritesBf16Copy) {
  REQUIRE_GPU();
  Parameter p;
  p.name = "w";
  p.global_shape = {1000};
  Tensor host = Tensor::empty({1000});
  for (int i = 0; i < 1000; ++i) host.data<float>()[i] = 0.01f * float(i % 17) - 0.08f;
  p.value = host.to(DType::BF16).to_device();
  p.grad = Tensor::zeros({1000}, grad_dtype_for(DType::BF16), MemorySpace::Cuda);
  ASSERT_EQ(p.grad.dtype(), DType::F32);
  MpiCommunicator self(MPI_COMM_SELF), self2(MPI_COMM_SELF);
  OptimizerGroups groups{self, self, self2, nullptr};
  AdamW adam({&p}, {0.9, 0.95, 1e-8, 0.0, 0.0}, nullptr);
  // fp32 master + m + v: 12 bytes per element.
  EXPECT_EQ(adam.state_bytes(), std::size_t(12 * 1000));
  // A step too small for bf16 to see in one update accumulates in the master.
  for (int k = 0; k < 4; ++k) {
    p.grad.fill(1.0);
    adam.step(1e-5, groups, true);
  }
  const auto before = host.to(DType::BF16).to_doubles();
  const auto after = p.value.to_doubles();
  int moved = 0;
  for (int i = 0; i < 1000; ++i) moved += after[i] != before[i];
  // Master moved by 4e-5 everywhere; bf16 (8 bits) of |w| ~ 0.08 resolves
  // ~3e-4, so most bf16 values are unchanged, but those near zero moved.
  EXPECT_GT(moved, 0);
  EXPECT_LT(moved, 1000);
}

/// Trains the tiny GPT on the GPU on one fixed batch (memorisation).
testing::MemorisedRun memorise_run(DType dtype, const std::string& precision, int steps,
                                   const LossScalerConfig& scaler = {},
                                   const std::string& logits_dtype = "fp32") {
  return testing::memorise({"run.device=cuda", "training.precision=" + precision,
                            "training.logits_dtype=" + logits_dtype, "optimizer.lr=1e-2",
                            "optimizer.min_lr=1e-3"},
                           dtype, steps, scaler);
}

std::vector<double> memorise(DType dtype, const std::string& precision, int steps,
                             const std::string& logits_dtype = "fp32") {
  return memorise_run(dtype, precision, steps, {}, logits_dtype).losses();
}

TEST(GpuBf16, TinyGptTrainingLossFallsAndStaysFinite) {
  REQUIRE_GPU();
  const int steps = 20;
  const auto bf16 = memorise(DType::BF16, "bf16", steps);
  const auto fp32 = memorise(DType::F32, "fp32", steps);
  for (int k = 0; k < steps; ++k) {
    EXPECT_TRUE(std::isfinite(bf16[k])) << "step " << k + 1;
    EXPECT_LE(std::fabs(bf16[k] - fp32[k]) / fp32[k], 5e-2) << "step " << k + 1;
    std::printf("step %2d loss bf16 %.5f fp32 %.5f\n", k + 1, bf16[k], fp32[k]);
  }
  EXPECT_LT(bf16.back(), bf16.front() - 0.2);
}

// training.logits_dtype = compute through the deck: bf16 logits change the
// losses (the option reached the LM head) but still track fp32 to 5e-2.
TEST(GpuBf16, TinyGptTrainingWithBf16LogitsTracksFp32) {
  REQUIRE_GPU();
  const int steps = 20;
  const auto narrow = memorise(DType::BF16, "bf16", steps, "compute");
  const auto wide = memorise(DType::BF16, "bf16", steps, "fp32");
  const auto fp32 = memorise(DType::F32, "fp32", steps);
  int differ = 0;
  for (int k = 0; k < steps; ++k) {
    EXPECT_TRUE(std::isfinite(narrow[k])) << "step " << k + 1;
    EXPECT_LE(std::fabs(narrow[k] - fp32[k]) / fp32[k], 5e-2) << "step " << k + 1;
    differ += narrow[k] != wide[k];
    std::printf("step %2d loss bf16 logits %.5f fp32 logits %.5f fp32 %.5f\n", k + 1, narrow[k],
                wide[k], fp32[k]);
  }
  EXPECT_GT(differ, 0);
  EXPECT_LT(narrow.back(), narrow.front() - 0.2);
}

TEST(GpuFp16, TinyGptTrainingWithLossScalingFallsAndStaysFinite) {
  REQUIRE_GPU();
  const int steps = 20;
  const testing::MemorisedRun fp16 = memorise_run(DType::F16, "fp16", steps);
  const auto fp32 = memorise(DType::F32, "fp32", steps);
  const auto losses = fp16.losses();
  for (int k = 0; k < steps; ++k) {
    const StepReport& r = fp16.steps[std::size_t(k)];
    EXPECT_TRUE(std::isfinite(r.loss)) << "step " << k + 1;
    EXPECT_FALSE(r.skipped) << "step " << k + 1;  // 2^16 does not overflow this model
    EXPECT_EQ(r.loss_scale, 65536.0) << "step " << k + 1;  // scaling active throughout
    EXPECT_TRUE(std::isfinite(r.grad_norm)) << "step " << k + 1;
    EXPECT_LE(std::fabs(r.loss - fp32[k]) / fp32[k], 5e-2) << "step " << k + 1;
    std::printf("step %2d loss fp16 %.5f fp32 %.5f (scale %.0f, grad norm %.4f)\n", k + 1,
                r.loss, fp32[k], r.loss_scale, r.grad_norm);
  }
  EXPECT_EQ(fp16.optimizer_steps, steps);
  EXPECT_LT(losses.back(), losses.front() - 0.2);
}

TEST(GpuFp16, HugeInitialScaleOverflowsIsSkippedAndBacksOff) {
  REQUIRE_GPU();
  const int steps = 40;
  LossScalerConfig scaler;
  scaler.initial_scale = std::ldexp(1.0, 40);  // dloss x 2^40 overflows fp16 (max 65504)
  const testing::MemorisedRun run = memorise_run(DType::F16, "fp16", steps, scaler);
  ASSERT_TRUE(run.steps[0].skipped);
  EXPECT_TRUE(run.steps[0].overflow);
  EXPECT_FALSE(std::isfinite(run.steps[0].grad_norm));
  // Every skip halves the scale for the next step and nothing else changes
  // it (the growth interval, 1000, is not reached). The leading skips run
  // down from 2^40; near the threshold a step may still overflow once the
  // weights move (on an H100: 19 skips, good at 2^21, one more skip, then
  // good at 2^20), and the run ends in good steps.
  int leading = 0;
  while (leading < steps && run.steps[std::size_t(leading)].skipped) ++leading;
  int skipped = 0;
  for (int k = 0; k < steps; ++k) {
    const StepReport& r = run.steps[std::size_t(k)];
    skipped += r.skipped;
    EXPECT_EQ(r.overflow, r.skipped) << "step " << k + 1;
    EXPECT_EQ(std::isfinite(r.grad_norm), !r.skipped) << "step " << k + 1;
    EXPECT_TRUE(std::isfinite(r.loss)) << "step " << k + 1;
    if (k == 0) continue;
    const StepReport& prev = run.steps[std::size_t(k - 1)];
    EXPECT_EQ(r.loss_scale, prev.skipped ? prev.loss_scale / 2 : prev.loss_scale)
        << "step " << k + 1;
  }
  std::printf("scale 2^40: %d leading skips, %d skips in all, final scale 2^%d\n", leading,
              skipped, int(std::log2(run.steps.back().loss_scale)));
  EXPECT_GT(leading, 5);
  for (int k = steps - 10; k < steps; ++k)
    EXPECT_FALSE(run.steps[std::size_t(k)].skipped) << "step " << k + 1;
  // Skipped steps leave the Adam step count (and so the weights) alone.
  EXPECT_EQ(run.optimizer_steps, steps - skipped);
  EXPECT_LT(run.steps.back().loss, run.steps[std::size_t(leading)].loss);
}

// check_for_nan on the GPU, where the skip is decided by the AdamW kernel
// from the gradient norm on the device (the host reads the norm and the loss
// only after the update is queued): a NaN weight makes the step's loss and
// norm NaN; the step is reported skipped, no other parameter moves, the Adam
// step count stays, the gradients are cleared; with the weight restored the
// next step counts and moves the parameters.
TEST(GpuBf16, NanLossIsSkippedByTheUpdateKernel) {
  REQUIRE_GPU();
  testing::Layout layout;
  layout.overrides = {"run.device=cuda", "training.precision=bf16", "training.train_iters=3",
                      "training.check_for_nan=true"};
  const RunConfig config = testing::tiny_config(layout, 1, MemorySpace::Cuda);
  ParallelRuntime rt(MPI_COMM_SELF, config.parallel.degrees(), MemorySpace::Cuda);
  const ModelSpec model = model_spec_from_deck(config, 100, 1);
  Trainer trainer(config, model, rt, DType::BF16);
  const DataLayout data{model.seq_length, config.training.micro_batch_size,
                        config.training.global_batch_size, 0, 1, 3, 1, config.run.seed};
  const auto batch = make_synthetic_data(data, 100)->train_step(1);
  ASSERT_FALSE(trainer.train_step(1, batch).skipped);
  ASSERT_EQ(trainer.optimizer().step_count(), 1);

  const ParameterList params = trainer.parameters();
  Parameter& poisoned = *params[2];
  const Tensor saved = poisoned.value.clone();
  std::vector<std::vector<double>> before;
  for (Parameter* p : params) before.push_back(p->value.to_doubles());
  Tensor host = poisoned.value.to_host();
  set_element_from_double(host, 0, std::nan(""));
  poisoned.value.copy_from(host);
  const StepReport bad = trainer.train_step(2, batch);
  EXPECT_TRUE(bad.skipped);
  EXPECT_FALSE(std::isfinite(bad.loss));
  EXPECT_FALSE(std::isfinite(bad.grad_norm));
  EXPECT_EQ(trainer.optimizer().step_count(), 1) << "a skipped step must not count";
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i] == &poisoned) continue;
    EXPECT_EQ(params[i]->value.to_doubles(), before[i]) << params[i]->name << " moved";
    // Cleared: stale (the trainer's deferred zero_grad), so the next step's
    // first writer overwrites the NaN; its finite norm below checks that.
    EXPECT_TRUE(params[i]->grad_stale || ops::sum_of_squares(params[i]->grad) == 0.0)
        << params[i]->name;
  }

  poisoned.value.copy_from(saved);
  const StepReport good = trainer.train_step(3, batch);
  EXPECT_FALSE(good.skipped);
  EXPECT_TRUE(std::isfinite(good.loss));
  EXPECT_TRUE(std::isfinite(good.grad_norm));
  EXPECT_EQ(trainer.optimizer().step_count(), 2);
  EXPECT_NE(params[0]->value.to_doubles(), before[0]) << "the counted step moved nothing";
}

struct RecomputeRun {
  testing::RunResult result;
  std::size_t peak_bytes = 0;
};

RecomputeRun run_recompute(const std::string& mode) {
  testing::Layout layout;
  layout.overrides = {"run.device=cuda", "model.seq_length=128", "training.micro_batch_size=4",
                      "training.recompute=" + mode};
  device::synchronize();
  device::reset_peak();
  RecomputeRun r;
  r.result = testing::train_layout(MPI_COMM_SELF, layout, DType::F32, 3, MemorySpace::Cuda);
  device::synchronize();
  r.peak_bytes = device::allocator_stats().peak_bytes;
  return r;
}

/// Largest norm-wise parameter difference between two runs.
double worst_param_error(const testing::RunResult& a, const testing::RunResult& b) {
  double worst = 0;
  for (const auto& [name, values] : b.params)
    worst = std::max(worst, testing::norm_rel_error(a.params.at(name), values));
  return worst;
}

/// Parameters whose values differ in any bit between two runs.
std::vector<std::string> differing_params(const testing::RunResult& a,
                                          const testing::RunResult& b) {
  std::vector<std::string> out;
  for (const auto& [name, values] : b.params)
    if (a.params.at(name) != values) out.push_back(name);
  return out;
}

/// Llama's attention (rope, 4 heads in 2 kv groups) and block (RMSNorm,
/// SwiGLU, no biases) on the tiny deck.
const std::vector<std::string> kLlamaKeys = {
    "model.num_attention_heads=4", "model.num_query_groups=2",
    "model.position_embedding_type=rope", "model.normalization=RMSNorm",
    "model.activation=swiglu", "model.add_bias_linear=false"};

// The device path (rotary kernel, grouped split of q | k | v, unfused core)
// trains as the host does, in fp32.
TEST(GpuLlama, RotaryGroupedQueriesTrainAsOnTheHost) {
  REQUIRE_GPU();
  testing::Layout host{.overrides = kLlamaKeys}, gpu = host;
  gpu.overrides.push_back("run.device=cuda");
  const auto on_host = testing::train_layout(MPI_COMM_SELF, host, DType::F32, 3);
  const auto on_gpu =
      testing::train_layout(MPI_COMM_SELF, gpu, DType::F32, 3, MemorySpace::Cuda);
  for (std::size_t k = 0; k < on_host.losses.size(); ++k)
    EXPECT_NEAR(on_gpu.losses[k], on_host.losses[k], 1e-4 * on_host.losses[k]) << k;
  EXPECT_LE(worst_param_error(on_gpu, on_host), 1e-3);
}

const std::vector<std::string> kGptNeoxKeys = {
    "model.num_attention_heads=4", "model.position_embedding_type=rope",
    "model.rotary_percent=0.25", "model.activation=gelu", "model.parallel_residual=true",
    "model.untie_embeddings_and_output_weights=true"};

// GPT-NeoX's block on the device (parallel residual with the adds in the
// GEMM epilogues and the dropout kernels, partial rotary, the exact GeLU
// kernel between the MLP's GEMMs) trains as the host does in fp32, and
// without dropout too; in bf16 it memorises a batch as fp32 does (5e-2).
TEST(GpuGptNeox, ParallelResidualTrainsAsOnTheHost) {
  REQUIRE_GPU();
  for (const char* dropout : {"model.hidden_dropout=0.1", "model.hidden_dropout=0"}) {
    SCOPED_TRACE(dropout);
    testing::Layout host{.overrides = kGptNeoxKeys}, gpu = host;
    host.overrides.push_back(dropout);
    gpu.overrides.push_back(dropout);
    gpu.overrides.push_back("run.device=cuda");
    const auto on_host = testing::train_layout(MPI_COMM_SELF, host, DType::F32, 3);
    const auto on_gpu =
        testing::train_layout(MPI_COMM_SELF, gpu, DType::F32, 3, MemorySpace::Cuda);
    for (std::size_t k = 0; k < on_host.losses.size(); ++k)
      EXPECT_NEAR(on_gpu.losses[k], on_host.losses[k], 1e-4 * on_host.losses[k]) << k;
    EXPECT_LE(worst_param_error(on_gpu, on_host), 1e-3);
  }
  const auto memorised = [](DType dtype, const char* precision) {
    std::vector<std::string> keys = kGptNeoxKeys;
    keys.insert(keys.end(), {"run.device=cuda", std::string("training.precision=") + precision,
                             "optimizer.lr=1e-2", "optimizer.min_lr=1e-3"});
    return testing::memorise(keys, dtype, 20).losses();
  };
  const auto bf16 = memorised(DType::BF16, "bf16"), fp32 = memorised(DType::F32, "fp32");
  for (std::size_t k = 0; k < bf16.size(); ++k) {
    EXPECT_TRUE(std::isfinite(bf16[k])) << "step " << k + 1;
    EXPECT_LE(std::fabs(bf16[k] - fp32[k]) / fp32[k], 5e-2) << "step " << k + 1;
  }
  EXPECT_LT(bf16.back(), bf16.front() - 0.2);
}

// Multi-head attention with rope and head dim 64 in bf16: the fused core
// (q and k rotated in the projection's output it reads) against the unfused.
TEST(GpuLlama, RotaryFusedCoreTracksUnfusedInBf16) {
  REQUIRE_GPU();
  std::vector<std::string> keys = {"run.device=cuda", "training.precision=bf16",
                                   "model.hidden_size=128", "model.num_attention_heads=2",
                                   "model.position_embedding_type=rope"};
  testing::Layout fused{.overrides = keys}, unfused = fused;
  fused.overrides.push_back("model.attention_backend=fused");
  unfused.overrides.push_back("model.attention_backend=unfused");
  const auto a = testing::train_layout(MPI_COMM_SELF, fused, DType::BF16, 3, MemorySpace::Cuda);
  const auto b =
      testing::train_layout(MPI_COMM_SELF, unfused, DType::BF16, 3, MemorySpace::Cuda);
  for (std::size_t k = 0; k < a.losses.size(); ++k) {
    EXPECT_TRUE(std::isfinite(a.losses[k])) << k;
    EXPECT_NEAR(a.losses[k], b.losses[k], 2e-2 * b.losses[k]) << k;
  }
}

const std::vector<std::string> kBloomKeys = {"model.num_attention_heads=4",
                                             "model.position_embedding_type=alibi",
                                             "model.embedding_norm=true"};

// The device path (the softmax kernel's ALiBi bias, the embedding norm)
// trains as the host does in fp32.
TEST(GpuBloom, AlibiEmbeddingNormTrainAsOnTheHost) {
  REQUIRE_GPU();
  testing::Layout host{.overrides = kBloomKeys}, gpu = host;
  gpu.overrides.push_back("run.device=cuda");
  const auto on_host = testing::train_layout(MPI_COMM_SELF, host, DType::F32, 3);
  const auto on_gpu =
      testing::train_layout(MPI_COMM_SELF, gpu, DType::F32, 3, MemorySpace::Cuda);
  for (std::size_t k = 0; k < on_host.losses.size(); ++k)
    EXPECT_NEAR(on_gpu.losses[k], on_host.losses[k], 1e-4 * on_host.losses[k]) << k;
  EXPECT_LE(worst_param_error(on_gpu, on_host), 1e-3);
}

// Head dim 64 in bf16: auto takes the fused core with the ALiBi bias, and
// the run stays close to the host's fp32 one.
TEST(GpuBloom, AlibiInBf16TracksTheHost) {
  REQUIRE_GPU();
  std::vector<std::string> keys = {"model.hidden_size=128", "model.num_attention_heads=2"};
  keys.insert(keys.end(), kBloomKeys.begin() + 1, kBloomKeys.end());  // all but the heads
  testing::Layout host{.overrides = keys}, bf16 = host;
  bf16.overrides.insert(bf16.overrides.end(), {"run.device=cuda", "training.precision=bf16"});
  const auto on_host = testing::train_layout(MPI_COMM_SELF, host, DType::F32, 3);
  const auto in_bf16 =
      testing::train_layout(MPI_COMM_SELF, bf16, DType::BF16, 3, MemorySpace::Cuda);
  for (std::size_t k = 0; k < on_host.losses.size(); ++k)
    EXPECT_NEAR(in_bf16.losses[k], on_host.losses[k], 2e-2 * on_host.losses[k]) << k;
}

TEST(GpuRecompute, BitwiseSameAsNoneAndPeakMemoryFalls) {
  REQUIRE_GPU();
  const RecomputeRun none = run_recompute("none");
  const RecomputeRun again = run_recompute("none");  // run-to-run determinism
  const RecomputeRun selective = run_recompute("selective");
  const RecomputeRun full = run_recompute("full");
  const std::pair<const char*, const RecomputeRun*> others[] = {
      {"none again", &again}, {"selective", &selective}, {"full", &full}};
  for (const auto& [name, r] : others) {
    EXPECT_EQ(r->result.losses, none.result.losses) << name;
    EXPECT_EQ(r->result.grad_norms, none.result.grad_norms) << name;
    const auto differ = differing_params(r->result, none.result);
    EXPECT_TRUE(differ.empty()) << name << ": " << differ.size() << " parameters differ, first "
                                << (differ.empty() ? "" : differ[0]) << ", worst norm-wise "
                                << worst_param_error(r->result, none.result);
  }
  std::printf("GPU fp32 losses none %.9f %.9f %.9f\n", none.result.losses[0],
              none.result.losses[1], none.result.losses[2]);
  std::printf("worst parameter norm-wise difference after 3 steps: none vs none %.2e, "
              "selective %.2e, full %.2e\n",
              worst_param_error(again.result, none.result),
              worst_param_error(selective.result, none.result),
              worst_param_error(full.result, none.result));
  std::printf("GPU peak allocator bytes (tiny GPT, seq 128, micro-batch 4, 8 layers): none %zu, "
              "selective %zu, full %zu\n",
              none.peak_bytes, selective.peak_bytes, full.peak_bytes);
  EXPECT_LT(selective.peak_bytes, none.peak_bytes);
  EXPECT_LT(full.peak_bytes, selective.peak_bytes);
}

// ------------------------------------------------------------ exact resume --

struct ResumeRun {
  std::vector<StepReport> steps;
  std::map<std::string, std::vector<double>> values;   ///< 16-bit parameters
  std::map<std::string, std::vector<double>> masters;  ///< the optimizer's fp32 copies
  std::vector<double> saved_master_gap;  ///< per parameter at the save: max |master - value|
};

/// The elements of `t` (a value of `p` or its master) outside the padded
/// vocabulary rows. Those rows are dummies: the checkpoint does not store
/// them and a load zeroes them, while the straight run keeps their random
/// initial values (only weight decay moves them; no real output sees them).
std::vector<double> real_elements(const Parameter& p, const Tensor& t) {
  std::vector<double> out = t.to_doubles();
  if (p.padded_rows > 0) out.resize(out.size() - std::size_t(p.padded_rows * t.numel() / t.dim(0)));
  return out;
}

/// The optimizer's master weights and the parameter values, by name.
void record_parameters(Trainer& trainer, ResumeRun& run) {
  std::vector<Tensor> m, v, master;
  OptimizerGroups groups = trainer.runtime().optimizer_groups();
  trainer.optimizer().full_state(m, v, master, groups);
  const ParameterList params = trainer.parameters();
  ASSERT_EQ(master.size(), params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    run.values[params[i]->name] = real_elements(*params[i], params[i]->value);
    run.masters[params[i]->name] = real_elements(*params[i], master[i]);
  }
}

/// Equal bits, NaN equal to NaN (an fp16 overflow's grad norm).
bool same(double a, double b) { return std::isnan(a) ? std::isnan(b) : a == b; }

/// Trains the tiny GPT on the GPU for `steps` steps in `precision`; with
/// `save_at` > 0 the first Trainer stops there and saves to `dir`, and a new
/// Trainer loads that checkpoint and trains the remaining steps.
ResumeRun resume_run(DType dtype, const std::string& precision, bool distributed, int steps,
                     int save_at, const std::string& dir, const LossScalerConfig& scaler) {
  testing::Layout layout;
  layout.distributed_optimizer = distributed;
  layout.overrides = {"run.device=cuda", "training.precision=" + precision,
                      "training.train_iters=" + std::to_string(steps)};
  RunConfig config = testing::tiny_config(layout, 1);
  ParallelRuntime rt(MPI_COMM_SELF, config.parallel.degrees(), MemorySpace::Cuda);
  const ModelSpec model = model_spec_from_deck(config, 100, 1);
  DataLayout data{model.seq_length, config.training.micro_batch_size,
                  config.training.global_batch_size, 0, 1, steps, 1, config.run.seed};
  auto source = make_synthetic_data(data, 100);
  ResumeRun run;
  auto trainer = std::make_unique<Trainer>(config, model, rt, dtype, scaler);
  for (long step = 1; step <= steps; ++step) {
    run.steps.push_back(trainer->train_step(step, source->train_step(step)));
    if (step != save_at) continue;
    ResumeRun at_save;
    record_parameters(*trainer, at_save);
    for (const auto& [name, master] : at_save.masters) {
      double gap = 0;
      for (std::size_t k = 0; k < master.size(); ++k)
        gap = std::max(gap, std::fabs(master[k] - at_save.values[name][k]));
      run.saved_master_gap.push_back(gap);
    }
    io::TrainState state;
    state.iteration = step;
    save_trainer_checkpoint(*trainer, dir, state, 0);
    trainer = std::make_unique<Trainer>(config, model, rt, dtype, scaler);
    const io::TrainState loaded =
        load_trainer_checkpoint(*trainer, dir + "/" + io::checkpoint_file_name(step));
    EXPECT_EQ(loaded.iteration, step);
    long updates = 0;  // skipped steps leave the Adam step count alone
    for (const StepReport& r : run.steps) updates += !r.skipped;
    EXPECT_EQ(trainer->optimizer().step_count(), updates);
  }
  record_parameters(*trainer, run);
  return run;
}

/// 6 steps straight against 3 + save + load + 3: everything bitwise equal.
void check_exact_resume(DType dtype, const std::string& precision, bool distributed,
                        const LossScalerConfig& scaler = {}) {
  char pattern[] = "/tmp/meshtron_gpu_resume_XXXXXX";
  const std::string dir = mkdtemp(pattern);
  const int steps = 6, save_at = 3;
  const ResumeRun straight = resume_run(dtype, precision, distributed, steps, 0, dir, scaler);
  const ResumeRun resumed = resume_run(dtype, precision, distributed, steps, save_at, dir, scaler);
  std::filesystem::remove_all(dir);
  for (int k = 0; k < steps; ++k) {
    const StepReport &a = straight.steps[std::size_t(k)], &b = resumed.steps[std::size_t(k)];
    EXPECT_EQ(b.loss, a.loss) << precision << " step " << k + 1;
    EXPECT_TRUE(same(b.grad_norm, a.grad_norm))
        << precision << " step " << k + 1 << ": " << b.grad_norm << " vs " << a.grad_norm;
    EXPECT_EQ(b.loss_scale, a.loss_scale) << precision << " step " << k + 1;
    EXPECT_EQ(b.skipped, a.skipped) << precision << " step " << k + 1;
    std::printf("%s%s step %d loss %.9f / resumed %.9f, scale %.0f%s\n", precision.c_str(),
                distributed ? " distopt" : "", k + 1, a.loss, b.loss, b.loss_scale,
                b.skipped ? " (skipped)" : "");
  }
  for (const auto& [name, values] : straight.values) {
    EXPECT_TRUE(resumed.values.at(name) == values) << name << ": 16-bit values differ";
    EXPECT_TRUE(resumed.masters.at(name) == straight.masters.at(name))
        << name << ": fp32 master weights differ";
  }
  // The test has teeth: at the save the masters were not 16-bit numbers, so
  // a checkpoint of the 16-bit values could not have resumed exactly.
  const double gap =
      *std::max_element(resumed.saved_master_gap.begin(), resumed.saved_master_gap.end());
  std::printf("%s: largest |master - 16-bit value| at the save %.3e\n", precision.c_str(), gap);
  EXPECT_GT(gap, 0.0);
}

TEST(GpuBf16, ResumeFromCheckpointIsBitwiseExact) {
  REQUIRE_GPU();
  check_exact_resume(DType::BF16, "bf16", false);
}

TEST(GpuBf16, ResumeFromCheckpointIsBitwiseExactWithDistributedOptimizer) {
  REQUIRE_GPU();
  check_exact_resume(DType::BF16, "bf16", true);
}

TEST(GpuFp16, ResumeFromCheckpointIsBitwiseExactWithLossScale) {
  REQUIRE_GPU();
  // 2^22 overflows this model at first (on an H100 steps 1 and 2 are
  // skipped and the scale falls to 2^20): the saved scale is not the
  // initial one, so the resumed Trainer (built with 2^22) must take it from
  // the file; the skipped steps also leave the Adam step count behind.
  LossScalerConfig scaler;
  scaler.initial_scale = std::ldexp(1.0, 22);
  check_exact_resume(DType::F16, "fp16", false, scaler);
}

}  // namespace
}  // namespace meshtron
