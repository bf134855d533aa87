// fp64 finite-difference gradient checks of every layer and of the whole GPT
// model, on one rank (tp = 1, MpiCommunicator over MPI_COMM_SELF).
//
// For each subject the scalar objective is L = sum(w ⊙ f(x, θ)) with a fixed
// random w (for the model: the mean per-token loss, w = 1/n). The analytic
// gradient is the layer's own backward with dy = w; the numerical one is the
// central difference (L(v + h) - L(v - h)) / 2h, h = 1e-6, taken for every
// element of the input and of every parameter (the largest tensor here has
// 2,048 elements, so nothing is sampled; padded vocabulary rows and unused
// position rows are therefore always among them).
//
// Metric, one number per tensor:
//     max_i |a_i - n_i| / max(max_i |a_i|, max_i |n_i|, 1e-8)  <=  1e-6,
// i.e. every element's error relative to the tensor's largest gradient. A
// purely element-wise relative error cannot be used: some gradients are zero
// in exact arithmetic (the key bias — softmax ignores a per-row shift — and
// padded rows), and there both sides are rounding noise of ~1e-10.
//
// Dropout masks depend only on (seed, step, stream, position), never on the
// values, so with dropout on the objective is still a smooth function of the
// weights and finite differences apply; each dropout test also checks that
// the mask really dropped something.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "model/gpt_model.hpp"
#include "parallel/communicator.hpp"

namespace meshtron {
namespace {

constexpr double kStep = 1e-6;       ///< h of the central difference
constexpr double kTolerance = 1e-6;  ///< on the per-tensor metric above
constexpr index_t kSeq = 6, kBatch = 2, kTokens = kSeq * kBatch;
constexpr index_t kHidden = 16, kFfn = 64;
constexpr int kHeads = 2, kVocab = 50;
const AttentionSpec kAttention = AttentionSpec::multi_head(int(kHidden), kHeads);
const MlpSpec kMlp{.ffn_hidden_size = int(kFfn)};

double dot(const Tensor& a, const Tensor& b) {
  const double* pa = a.data<double>();
  const double* pb = b.data<double>();
  double sum = 0;
  for (index_t i = 0; i < a.numel(); ++i) sum += pa[i] * pb[i];
  return sum;
}

/// A function under test: its output from the current input and parameter
/// values, and one forward + backward with a given dy that returns dx
/// (undefined when there is no differentiable input) and accumulates the
/// parameter gradients.
struct Subject {
  std::function<Tensor()> forward;
  std::function<Tensor(const Tensor& dy)> forward_backward;
  Tensor input;  ///< aliases the tensor `forward` reads; undefined if none
  ParameterList params;
};

struct TensorError {
  std::string name;
  index_t checked = 0;
  double error = 0;  ///< the per-tensor metric of the file comment
};

/// Lets a test corrupt the analytic gradients (dx and Parameter::grad) after
/// the backward, to show that the check notices.
using Tamper = std::function<void(Subject&, Tensor& dx)>;

double central_difference(Tensor& value, index_t i, const std::function<double()>& objective) {
  const double v = element_as_double(value, i);
  set_element_from_double(value, i, v + kStep);
  const double plus = objective();
  set_element_from_double(value, i, v - kStep);
  const double minus = objective();
  set_element_from_double(value, i, v);
  return (plus - minus) / (2 * kStep);
}

TensorError compare(const std::string& name, Tensor& value, const Tensor& analytic,
                    const std::function<double()>& objective) {
  EXPECT_EQ(value.shape(), analytic.shape()) << name;
  double max_diff = 0, scale = 1e-8;
  for (index_t i = 0; i < value.numel(); ++i) {
    const double a = element_as_double(analytic, i);
    const double n = central_difference(value, i, objective);
    max_diff = std::max(max_diff, std::fabs(a - n));
    scale = std::max({scale, std::fabs(a), std::fabs(n)});
  }
  return {name, value.numel(), max_diff / scale};
}

/// Analytic against numerical gradients of the input and every parameter.
std::vector<TensorError> check_gradients(Subject& s, const Tensor& w,
                                         const Tamper& tamper = {}) {
  for (Parameter* p : s.params) p->grad.fill(0.0);
  Tensor dx = s.forward_backward(w.clone());  // a backward must not see w change
  if (tamper) tamper(s, dx);
  const auto objective = [&] { return dot(w, s.forward()); };
  std::vector<TensorError> errors;
  if (s.input.defined()) errors.push_back(compare("input", s.input, dx, objective));
  for (Parameter* p : s.params)
    errors.push_back(compare(p->name, p->value, p->grad, objective));
  return errors;
}

/// One forward + backward of a layer with forward(x, ctx, cache) and
/// backward(dy, ctx, cache), as a Subject of its input x.
template <class Layer>
Subject layer_subject(Layer& layer, LayerContext& ctx, const Tensor& x) {
  Subject s;
  s.input = x;
  layer.collect(s.params);
  s.forward = [&layer, &ctx, x] {
    typename Layer::Cache cache;
    return layer.forward(x, ctx, cache);
  };
  s.forward_backward = [&layer, &ctx, x](const Tensor& dy) {
    typename Layer::Cache cache;
    layer.forward(x, ctx, cache);
    return layer.backward(dy, ctx, cache);
  };
  return s;
}

class GradCheck : public ::testing::Test {
 protected:
  GradCheck() {
    ctx.seq_length = kSeq;
    ctx.micro_batch = kBatch;
    ctx.global_batch = kBatch;
    ctx.training = true;
    ctx.seed = 20261122;
    ctx.step = 3;
  }

  Tensor random(Shape shape, double mean = 0.0, double stddev = 1.0) {
    Tensor t = Tensor::empty(std::move(shape), DType::F64);
    std::normal_distribution<double> dist(mean, stddev);
    double* p = t.data<double>();
    for (index_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
    return t;
  }

  /// Replace the values by random ones well away from initialisation (so
  /// biases are nonzero and nonlinearities leave their linear regime); norm
  /// weights around 1.
  void randomize(const ParameterList& params, double stddev = 0.3) {
    for (Parameter* p : params) {
      const bool norm = p->name.find("ln_") != std::string::npos ||
                        p->name.find("norm") != std::string::npos;
      const bool norm_weight = norm && p->name.ends_with(".weight");
      p->value.copy_from(random(p->value.shape(), norm_weight ? 1.0 : 0.0, stddev));
    }
  }

  Tensor random_ids(int vocab) {
    Tensor ids = Tensor::empty({kTokens}, DType::I32);
    std::uniform_int_distribution<int> dist(0, vocab - 1);
    auto* p = ids.data<std::int32_t>();
    for (index_t i = 0; i < kTokens; ++i) p[i] = dist(rng);
    p[0] = 0;                // the vocabulary's edges
    p[kTokens - 1] = vocab - 1;
    return ids;
  }

  static ModelSpec small_config(double dropout) {
    ModelSpec c;
    c.num_layers = 2;
    c.hidden_size = int(kHidden);
    c.block.attention = AttentionSpec::multi_head(c.hidden_size, kHeads);
    c.block.mlp.ffn_hidden_size = int(kFfn);
    c.seq_length = int(kSeq);
    c.max_positions = int(kSeq);
    c.vocab_size = kVocab;
    c.padded_vocab_size = padded_vocab_size(kVocab, 64, 1);  // 64: 14 padded rows
    c.hidden_dropout = dropout;
    c.attention_dropout = dropout;
    return c;
  }

  /// Runs the check with dy = w, prints one line per tensor and expects each
  /// within tolerance; returns the errors.
  std::vector<TensorError> expect_gradients_match(const std::string& label, Subject& s,
                                                  const Tensor& w) {
    const auto errors = check_gradients(s, w);
    for (const auto& e : errors) {
      std::printf("[gradcheck] %-22s %-34s %5lld elements  max error %.2e\n", label.c_str(),
                  e.name.c_str(), static_cast<long long>(e.checked), e.error);
      EXPECT_LE(e.error, kTolerance) << label << ": " << e.name;
    }
    return errors;
  }

  /// The layer's output must change with ctx.training: dropout is really on.
  void expect_dropout_active(Subject& s) {
    const Tensor train = s.forward();
    ctx.training = false;
    const Tensor eval = s.forward();
    ctx.training = true;
    double diff = 0;
    for (index_t i = 0; i < train.numel(); ++i)
      diff += std::fabs(element_as_double(train, i) - element_as_double(eval, i));
    EXPECT_GT(diff, 1e-3) << "dropout did not change the output";
  }

  MpiCommunicator self{MPI_COMM_SELF};
  TensorParallelGroup tp{self};
  LayerContext ctx{tp};
  std::mt19937_64 rng{12345};
};

TEST_F(GradCheck, LayerNorm) {
  LayerNorm norm("ln_1", kHidden, NormSpec{}, DType::F64, false);
  Tensor x = random({kTokens, kHidden}, 0.5, 2.0);
  Subject s;
  s.input = x;
  norm.collect(s.params);
  randomize(s.params);
  s.forward = [&] {
    LayerNorm::Cache cache;
    return norm.forward(x, cache);
  };
  s.forward_backward = [&](const Tensor& dy) {
    LayerNorm::Cache cache;
    norm.forward(x, cache);
    return norm.backward(dy, cache);
  };
  expect_gradients_match("LayerNorm", s, random({kTokens, kHidden}));
}

TEST_F(GradCheck, ColumnParallelLinear) {
  ColumnParallelLinear linear("column", kHidden, 3 * kHidden, 3, ctx, DType::F64);
  Subject s = layer_subject(linear, ctx, random({kTokens, kHidden}));
  randomize(s.params);
  expect_gradients_match("ColumnParallelLinear", s, random({kTokens, 3 * kHidden}));
}

TEST_F(GradCheck, RowParallelLinear) {
  RowParallelLinear linear("row", kFfn, kHidden, ctx, DType::F64, /*epilogue_rank=*/0);
  Subject s = layer_subject(linear, ctx, random({kTokens, kFfn}));
  randomize(s.params);
  expect_gradients_match("RowParallelLinear", s, random({kTokens, kHidden}));
}

TEST_F(GradCheck, Attention) {
  Attention attention("attention", 0, kHidden, kAttention, 0.0, ctx, DType::F64);
  Subject s = layer_subject(attention, ctx, random({kTokens, kHidden}));
  randomize(s.params);
  expect_gradients_match("Attention", s, random({kTokens, kHidden}));
}

TEST_F(GradCheck, AttentionWithDropout) {
  Attention attention("attention", 0, kHidden, kAttention, 0.3, ctx, DType::F64);
  Subject s = layer_subject(attention, ctx, random({kTokens, kHidden}));
  randomize(s.params);
  expect_dropout_active(s);
  expect_gradients_match("Attention(p=0.3)", s, random({kTokens, kHidden}));
}

/// The attention layer written out from its formula in double precision,
/// for x [s*b, hidden] with rows in [s, b] order: qkv = x Wqkv + bqkv split
/// into q (H heads) | k (G) | v (G), q and k rotated by the token's position
/// in its sequence (the rotary angle in fp32 as transformers and the op),
/// query head h against kv group h / (H/G) (repeat_kv), causal softmax, and
/// out = context Wproj + bproj.
Tensor reference_attention(const Tensor& x, const Attention& layer, const AttentionSpec& a) {
  const index_t H = a.num_heads, G = a.num_query_groups, d = a.head_dim, rows = x.dim(0);
  const index_t hidden = x.dim(1), width = (H + 2 * G) * d, per_group = H / G;
  const double* wq = layer.qkv.weight.value.data<double>();
  const double* bq = a.bias ? layer.qkv.bias.value.data<double>() : nullptr;
  std::vector<double> qkv(std::size_t(rows * width));
  for (index_t t = 0; t < rows; ++t)
    for (index_t c = 0; c < width; ++c) {
      double sum = bq ? bq[c] : 0.0;
      for (index_t i = 0; i < hidden; ++i)
        sum += x.data<double>()[t * hidden + i] * wq[i * width + c];
      qkv[std::size_t(t * width + c)] = sum;
    }
  const auto head = [&](index_t t, index_t column_head) {
    return &qkv[std::size_t(t * width + column_head * d)];
  };
  if (a.position == PositionEmbedding::Rope) {
    const index_t R = ops::rotary_dim_for(d, a.rotary_percent);
    for (index_t t = 0; t < rows; ++t)
      for (index_t hd = 0; hd < H + G; ++hd)  // q heads, then k heads
        for (index_t i = 0; i < R / 2; ++i) {
          const float inv_freq = 1.0f / std::pow(float(a.rotary_base), float(2 * i) / float(R));
          const float angle = float(t / kBatch) * inv_freq;
          const index_t lo = a.rotary_interleaved ? 2 * i : i;
          const index_t hi = a.rotary_interleaved ? 2 * i + 1 : i + R / 2;
          double* v = head(t, hd);
          const double xl = v[lo], xh = v[hi], c = std::cos(double(angle)),
                       sn = std::sin(double(angle));
          v[lo] = xl * c - xh * sn;
          v[hi] = xh * c + xl * sn;
        }
  }
  const index_t s = rows / kBatch;
  std::vector<double> context(std::size_t(rows * H * d), 0.0);
  for (index_t bi = 0; bi < kBatch; ++bi)
    for (index_t h = 0; h < H; ++h) {
      const index_t g = h / per_group;
      for (index_t i = 0; i < s; ++i) {
        std::vector<double> p(std::size_t(i + 1));
        double top = -1e300, total = 0;
        for (index_t j = 0; j <= i; ++j) {
          double dotp = 0;
          for (index_t e = 0; e < d; ++e)
            dotp += head(i * kBatch + bi, h)[e] * head(j * kBatch + bi, H + g)[e];
          p[std::size_t(j)] = dotp / std::sqrt(double(d));
          top = std::max(top, p[std::size_t(j)]);
        }
        for (double& v : p) total += (v = std::exp(v - top));
        for (index_t j = 0; j <= i; ++j)
          for (index_t e = 0; e < d; ++e)
            context[std::size_t((i * kBatch + bi) * H * d + h * d + e)] +=
                p[std::size_t(j)] / total * head(j * kBatch + bi, H + G + g)[e];
      }
    }
  Tensor out = Tensor::empty({rows, hidden}, DType::F64);
  const double* wp = layer.proj.weight.value.data<double>();
  const double* bp = a.bias ? layer.proj.bias.value.data<double>() : nullptr;
  for (index_t t = 0; t < rows; ++t)
    for (index_t c = 0; c < hidden; ++c) {
      double sum = bp ? bp[c] : 0.0;
      for (index_t k = 0; k < H * d; ++k)
        sum += context[std::size_t(t * H * d + k)] * wp[k * hidden + c];
      out.data<double>()[t * hidden + c] = sum;
    }
  return out;
}

/// Rotary positions and grouped queries: the layer's forward equals the
/// reference, and its backward the finite differences of the reference.
class GradCheckRotaryGrouped : public GradCheck {
 protected:
  void check(const std::string& label, const AttentionSpec& spec) {
    Attention attention("attention", 0, kHidden, spec, 0.0, ctx, DType::F64);
    Tensor x = random({kTokens, kHidden});
    Subject s = layer_subject(attention, ctx, x);
    randomize(s.params);
    const Tensor layer_out = s.forward();
    const Tensor reference = reference_attention(x, attention, spec);
    double diff = 0;
    for (index_t i = 0; i < reference.numel(); ++i)
      diff = std::max(diff,
                      std::fabs(element_as_double(layer_out, i) - element_as_double(reference, i)));
    EXPECT_LE(diff, 1e-12) << label << ": forward against the reference";
    s.forward = [&] { return reference_attention(x, attention, spec); };
    expect_gradients_match(label, s, random({kTokens, kHidden}));
  }

  static AttentionSpec spec(int groups, int head_dim, double rotary_percent, bool interleaved) {
    AttentionSpec a = AttentionSpec::multi_head(int(kHidden), 4);
    a.num_query_groups = groups;
    a.head_dim = head_dim;
    a.position = PositionEmbedding::Rope;
    a.rotary_percent = rotary_percent;
    a.rotary_interleaved = interleaved;
    a.rotary_base = 500.0;  // angles of several turns over the 6 positions
    return a;
  }
};

TEST_F(GradCheckRotaryGrouped, MultiHeadHalfSplit) {
  check("rope half-split G=4", spec(4, 4, 1.0, false));
}
TEST_F(GradCheckRotaryGrouped, TwoGroupsInterleavedPartial) {
  check("rope interleaved 1/2 G=2", spec(2, 8, 0.5, true));
}
TEST_F(GradCheckRotaryGrouped, TwoGroupsHalfSplitPartial) {
  check("rope half-split 1/2 G=2", spec(2, 8, 0.5, false));
}
TEST_F(GradCheckRotaryGrouped, MultiQueryInterleaved) {
  check("rope interleaved G=1", spec(1, 4, 1.0, true));
}
TEST_F(GradCheckRotaryGrouped, TwoGroupsWithoutBiases) {
  AttentionSpec a = spec(2, 4, 1.0, false);
  a.bias = false;  // Llama's linears
  check("rope G=2 no bias", a);
}
TEST_F(GradCheckRotaryGrouped, TwoGroupsLearnedPositions) {
  AttentionSpec a = spec(2, 4, 1.0, false);
  a.position = PositionEmbedding::LearnedAbsolute;  // the attention adds none
  check("no rotation G=2", a);
}

TEST_F(GradCheck, Mlp) {
  Mlp mlp("mlp", /*layer=*/0, kHidden, kMlp, ctx, DType::F64);
  Subject s = layer_subject(mlp, ctx, random({kTokens, kHidden}));
  randomize(s.params);
  expect_gradients_match("Mlp", s, random({kTokens, kHidden}));
}

TEST_F(GradCheck, TransformerLayerWithDropout) {
  TransformerLayer layer(1, small_config(0.2), ctx, DType::F64);
  Subject s = layer_subject(layer, ctx, random({kTokens, kHidden}));
  randomize(s.params);
  expect_dropout_active(s);
  expect_gradients_match("TransformerLayer(p=0.2)", s, random({kTokens, kHidden}));
}

TEST_F(GradCheck, EmbeddingWeights) {
  ModelSpec config = small_config(0.2);
  config.max_positions = int(kSeq) + 2;  // two position rows no token uses
  Embedding embedding(config, ctx, DType::F64);
  const Tensor ids = random_ids(kVocab);
  Subject s;
  embedding.collect(s.params);
  randomize(s.params);
  s.forward = [&] {
    Embedding::Cache cache;
    return embedding.forward(ids, ctx, cache);
  };
  s.forward_backward = [&](const Tensor& dy) {
    Embedding::Cache cache;
    embedding.forward(ids, ctx, cache);
    embedding.backward(dy, ctx, cache);
    return Tensor();
  };
  expect_dropout_active(s);
  expect_gradients_match("Embedding(p=0.2)", s, random({kTokens, kHidden}));
}

TEST_F(GradCheck, InitLeavesPaddedVocabularyRowsAtZero) {
  const ModelSpec config = small_config(0.0);
  Parameter word = make_word_embedding(config, ctx, DType::F64);
  ASSERT_EQ(word.padded_rows, 14);
  init_normal(word, 99, 0.02, 0, 1);
  const index_t rows = word.value.dim(0), cols = word.value.dim(1);
  const double* w = word.value.data<double>();
  double real = 0, padded = 0;
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) (r < rows - 14 ? real : padded) += std::abs(w[r * cols + c]);
  EXPECT_GT(real, 0.0);
  EXPECT_EQ(padded, 0.0);  // checkpoints hold real rows only: a restart restores every row
}

TEST_F(GradCheck, LmHeadLoss) {
  const ModelSpec config = small_config(0.0);
  Parameter word = make_word_embedding(config, ctx, DType::F64);
  ASSERT_EQ(word.padded_rows, 14);
  LmHeadLoss head(config, word);
  const Tensor targets = random_ids(kVocab);
  Tensor x = random({kTokens, kHidden});
  Subject s;
  s.input = x;
  s.params = {&word};
  randomize(s.params, 1.0);  // padded rows too: their logits must be ignored
  s.forward = [&] {
    LmHeadLoss::Cache cache;
    return head.forward(x, targets, ctx, cache);
  };
  s.forward_backward = [&](const Tensor& dy) {
    LmHeadLoss::Cache cache;
    head.forward(x, targets, ctx, cache);
    return head.backward(dy, ctx, cache);
  };
  expect_gradients_match("LmHeadLoss", s, random({kTokens}));
}

/// Llama's norm and MLP: RMSNorm, SwiGLU, no MLP biases.
ModelSpec with_llama_norm_and_mlp(ModelSpec c) {
  c.block.norm.kind = NormKind::RMSNorm;
  c.block.norm.epsilon = 1e-5;
  c.block.mlp.activation = Activation::Swiglu;
  c.block.mlp.bias = false;
  return c;
}

/// Element (r, c) of a 2-D fp64 tensor.
double at(const Tensor& t, index_t r, index_t c) { return t.data<double>()[r * t.dim(1) + c]; }

void expect_near_all(const Tensor& got, const std::vector<double>& want, const char* what) {
  const std::vector<double> g = got.to_doubles();
  ASSERT_EQ(g.size(), want.size()) << what;
  for (std::size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], want[i], 1e-12 * (1 + std::fabs(want[i]))) << what << "[" << i << "]";
}

TEST_F(GradCheck, RmsNormMatchesItsFormula) {
  const NormSpec spec{.kind = NormKind::RMSNorm, .epsilon = 1e-5};
  LayerNorm norm("ln_1", kHidden, spec, DType::F64, false);
  ParameterList params;
  norm.collect(params);
  ASSERT_EQ(params.size(), 1u);  // weight only: ln_1.weight
  EXPECT_EQ(params[0]->name, "ln_1.weight");
  randomize(params);
  const Tensor x = random({kTokens, kHidden}, 0.5, 2.0);
  LayerNorm::Cache cache;
  const Tensor y = norm.forward(x, cache);
  std::vector<double> want;
  for (index_t r = 0; r < kTokens; ++r) {
    double sq = 0;
    for (index_t c = 0; c < kHidden; ++c) sq += at(x, r, c) * at(x, r, c);
    const double rstd = 1 / std::sqrt(sq / double(kHidden) + 1e-5);
    for (index_t c = 0; c < kHidden; ++c)
      want.push_back(at(x, r, c) * rstd * norm.weight.value.data<double>()[c]);
  }
  expect_near_all(y, want, "rmsnorm");
}

TEST_F(GradCheck, RmsNorm) {
  LayerNorm norm("ln_1", kHidden, NormSpec{.kind = NormKind::RMSNorm}, DType::F64, false);
  Tensor x = random({kTokens, kHidden}, 0.5, 2.0);
  const Tensor residual_grad = random({kTokens, kHidden});
  Subject s;
  s.input = x;
  norm.collect(s.params);
  randomize(s.params);
  s.forward = [&] {
    LayerNorm::Cache cache;
    return norm.forward(x, cache);
  };
  s.forward_backward = [&](const Tensor& dy) {
    LayerNorm::Cache cache;
    norm.forward(x, cache);
    return norm.backward(dy, cache);
  };
  expect_gradients_match("RMSNorm", s, random({kTokens, kHidden}));
  // The residual gradient is added to dx.
  LayerNorm::Cache cache;
  norm.forward(x, cache);
  const Tensor dy = random({kTokens, kHidden});
  const Tensor plain = norm.backward(dy, cache);
  const Tensor summed = norm.backward(dy, cache, &residual_grad);
  std::vector<double> want = plain.to_doubles();
  const std::vector<double> r = residual_grad.to_doubles();
  for (std::size_t i = 0; i < want.size(); ++i) want[i] += r[i];
  expect_near_all(summed, want, "rmsnorm dx + residual");
}

TEST_F(GradCheck, LayerNormWithoutBias) {
  LayerNorm norm("ln_1", kHidden, NormSpec{.bias = false}, DType::F64, false);
  Tensor x = random({kTokens, kHidden}, 0.5, 2.0);
  Subject s;
  s.input = x;
  norm.collect(s.params);
  ASSERT_EQ(s.params.size(), 1u);
  randomize(s.params);
  s.forward = [&] {
    LayerNorm::Cache cache;
    return norm.forward(x, cache);
  };
  s.forward_backward = [&](const Tensor& dy) {
    LayerNorm::Cache cache;
    norm.forward(x, cache);
    return norm.backward(dy, cache);
  };
  expect_gradients_match("LayerNorm(no bias)", s, random({kTokens, kHidden}));
}

TEST_F(GradCheck, LinearsWithoutBias) {
  ColumnParallelLinear column("column", kHidden, 2 * kFfn, 2, ctx, DType::F64, /*bias=*/false);
  Subject c = layer_subject(column, ctx, random({kTokens, kHidden}));
  ASSERT_EQ(c.params.size(), 1u);
  randomize(c.params);
  expect_gradients_match("ColumnParallel(no bias)", c, random({kTokens, 2 * kFfn}));
  RowParallelLinear row("row", kFfn, kHidden, ctx, DType::F64, 0, /*bias=*/false);
  Subject r = layer_subject(row, ctx, random({kTokens, kFfn}));
  ASSERT_EQ(r.params.size(), 1u);
  randomize(r.params);
  expect_gradients_match("RowParallel(no bias)", r, random({kTokens, kHidden}));
}

/// The SwiGLU MLP's output against fc = [gate | up] computed here:
/// (silu(x G) * (x U)) D.
TEST_F(GradCheck, SwigluMlpMatchesItsFormula) {
  const MlpSpec spec{.ffn_hidden_size = int(kFfn), .activation = Activation::Swiglu,
                     .bias = false};
  Mlp mlp("mlp", 0, kHidden, spec, ctx, DType::F64);
  ParameterList params;
  mlp.collect(params);
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(mlp.fc.weight.global_shape, (Shape{kHidden, 2 * kFfn}));
  EXPECT_EQ(mlp.fc.weight.shard.fused_parts, 2);
  randomize(params);
  const Tensor x = random({kTokens, kHidden});
  Mlp::Cache cache;
  const Tensor y = mlp.forward(x, ctx, cache);
  const Tensor& fc = mlp.fc.weight.value;
  const Tensor& down = mlp.proj.weight.value;
  std::vector<double> want;
  for (index_t r = 0; r < kTokens; ++r) {
    std::vector<double> act(static_cast<std::size_t>(kFfn));
    for (index_t f = 0; f < kFfn; ++f) {
      double gate = 0, up = 0;
      for (index_t k = 0; k < kHidden; ++k) {
        gate += at(x, r, k) * at(fc, k, f);
        up += at(x, r, k) * at(fc, k, kFfn + f);
      }
      act[std::size_t(f)] = gate / (1 + std::exp(-gate)) * up;
    }
    for (index_t c = 0; c < kHidden; ++c) {
      double sum = 0;
      for (index_t f = 0; f < kFfn; ++f) sum += act[std::size_t(f)] * at(down, f, c);
      want.push_back(sum);
    }
  }
  expect_near_all(y, want, "swiglu mlp");
}

TEST_F(GradCheck, SwigluMlp) {
  const MlpSpec spec{.ffn_hidden_size = int(kFfn), .activation = Activation::Swiglu,
                     .bias = false};
  Mlp mlp("mlp", /*layer=*/0, kHidden, spec, ctx, DType::F64);
  Subject s = layer_subject(mlp, ctx, random({kTokens, kHidden}));
  randomize(s.params);
  expect_gradients_match("Mlp(swiglu)", s, random({kTokens, kHidden}));
}

TEST_F(GradCheck, GegluMlpWithBias) {
  const MlpSpec spec{.ffn_hidden_size = int(kFfn), .activation = Activation::Geglu};
  Mlp mlp("mlp", /*layer=*/0, kHidden, spec, ctx, DType::F64);
  Subject s = layer_subject(mlp, ctx, random({kTokens, kHidden}));
  ASSERT_EQ(s.params.size(), 4u);
  randomize(s.params);
  expect_gradients_match("Mlp(geglu)", s, random({kTokens, kHidden}));
}

TEST_F(GradCheck, TransformerLayerWithRmsNormAndSwiglu) {
  TransformerLayer layer(1, with_llama_norm_and_mlp(small_config(0.2)), ctx, DType::F64);
  Subject s = layer_subject(layer, ctx, random({kTokens, kHidden}));
  randomize(s.params);
  expect_dropout_active(s);
  expect_gradients_match("Layer(rmsnorm,swiglu)", s, random({kTokens, kHidden}));
}

/// GPT-NeoX's block: parallel residual, the exact GeLU MLP.
ModelSpec with_neox_block(ModelSpec c) {
  c.parallel_residual = true;
  c.block.mlp.activation = Activation::Gelu;
  return c;
}

TEST_F(GradCheck, ExactGeluAndReluMlps) {
  for (Activation act : {Activation::Gelu, Activation::Relu}) {
    const MlpSpec spec{.ffn_hidden_size = int(kFfn), .activation = act};
    Mlp mlp("mlp", /*layer=*/0, kHidden, spec, ctx, DType::F64);
    Subject s = layer_subject(mlp, ctx, random({kTokens, kHidden}));
    randomize(s.params);
    expect_gradients_match("Mlp(" + to_string(act) + ")", s, random({kTokens, kHidden}));
  }
}

// Without dropout the block's output is x + attention(ln_1 x) + mlp(ln_2 x),
// each branch run here on its own.
TEST_F(GradCheck, ParallelResidualLayerIsTheSumOfItsBranches) {
  TransformerLayer layer(1, with_neox_block(small_config(0.0)), ctx, DType::F64);
  ParameterList params;
  layer.collect(params);
  randomize(params);
  const Tensor x = random({kTokens, kHidden});
  TransformerLayer::Cache cache;
  const Tensor y = layer.forward(x, ctx, cache);
  LayerNorm::Cache c1, c2;
  Attention::Cache ca;
  Mlp::Cache cm;
  const Tensor a = layer.attention.forward(layer.ln_1.forward(x, c1), ctx, ca);
  const Tensor m = layer.mlp.forward(layer.ln_2.forward(x, c2), ctx, cm);
  std::vector<double> want = x.to_doubles();
  const std::vector<double> av = a.to_doubles(), mv = m.to_doubles();
  for (std::size_t i = 0; i < want.size(); ++i) want[i] += av[i] + mv[i];
  expect_near_all(y, want, "parallel residual");
}

TEST_F(GradCheck, ParallelResidualLayerWithDropout) {
  TransformerLayer layer(1, with_neox_block(small_config(0.2)), ctx, DType::F64);
  Subject s = layer_subject(layer, ctx, random({kTokens, kHidden}));
  randomize(s.params);
  expect_dropout_active(s);
  expect_gradients_match("Layer(parallel,gelu)", s, random({kTokens, kHidden}));
}

/// The whole model: 2 layers, h 16, 2 heads, vocab 50 padded to 64, s 6,
/// b 2, all dropouts on, the head tied or untied; objective = the mean
/// per-token loss.
class GptModelGradCheck : public GradCheck {
 protected:
  GptModelGradCheck() : GptModelGradCheck(small_config(0.1)) {}
  explicit GptModelGradCheck(const ModelSpec& spec)
      : model(spec, StagePlacement::whole_model(2), ctx, DType::F64, 7),
        ids(random_ids(kVocab)),
        targets(random_ids(kVocab)) {
    s.params = model.parameters();
    randomize(s.params);
    s.forward = [this] {
      GptModel::Cache cache;
      return model.forward(ids, targets, ctx, cache);
    };
    s.forward_backward = [this](const Tensor& dy) {
      GptModel::Cache cache;
      model.forward(ids, targets, ctx, cache);
      return model.backward(dy, ctx, cache);
    };
    mean_weights = Tensor::empty({kTokens}, DType::F64);
    mean_weights.fill(1.0 / double(kTokens));
  }

  static ModelSpec tied_or_not(ModelSpec c, bool tied) {
    c.tie_word_embeddings = tied;
    return c;
  }

  GptModel model;
  Tensor ids, targets, mean_weights;
  Subject s;
};

class UntiedGptModelGradCheck : public GptModelGradCheck {
 protected:
  UntiedGptModelGradCheck() : GptModelGradCheck(tied_or_not(small_config(0.1), false)) {}
};

TEST_F(GptModelGradCheck, EveryParameter) {
  ASSERT_EQ(model.config().padded_vocab_size, 64);
  expect_dropout_active(s);
  const auto errors = expect_gradients_match("GptModel(p=0.1)", s, mean_weights);
  EXPECT_EQ(errors.size(), 2 + 2 * 12 + 2u);  // embedding, 2 layers, final norm
}

/// RMSNorm (the final norm too), SwiGLU, no MLP biases; attention as GPT-2's.
class LlamaNormMlpModelGradCheck : public GptModelGradCheck {
 protected:
  LlamaNormMlpModelGradCheck() : GptModelGradCheck(with_llama_norm_and_mlp(small_config(0.1))) {}
};

TEST_F(LlamaNormMlpModelGradCheck, EveryParameter) {
  expect_dropout_active(s);
  const auto errors = expect_gradients_match("GptModel(rmsnorm,swiglu)", s, mean_weights);
  EXPECT_EQ(errors.size(), 2 + 2 * 8 + 1u);  // embedding, 2 layers, final norm: no biases
                                              // but the attention's
}

TEST_F(UntiedGptModelGradCheck, EveryParameterWithItsOwnOutputWeight) {
  ASSERT_EQ(model.head_word_weight(), nullptr);
  const auto errors = expect_gradients_match("GptModel(untied)", s, mean_weights);
  ASSERT_EQ(errors.size(), 2 + 2 * 12 + 2 + 1u);  // embedding, 2 layers, final norm, head
  EXPECT_EQ(errors.back().name, "output_layer.weight");
  EXPECT_GT(errors.back().checked, 0);
}

TEST_F(GptModelGradCheck, BackwardAccumulatesIntoGrad) {
  for (Parameter* p : s.params) p->grad.fill(0.0);
  s.forward_backward(mean_weights);
  std::vector<std::vector<double>> once;
  for (Parameter* p : s.params) once.push_back(p->grad.to_doubles());
  s.forward_backward(mean_weights);
  for (std::size_t k = 0; k < s.params.size(); ++k) {
    const auto twice = s.params[k]->grad.to_doubles();
    for (std::size_t i = 0; i < twice.size(); ++i)
      ASSERT_NEAR(twice[i], 2 * once[k][i], 1e-14 * (1 + std::fabs(once[k][i])))
          << s.params[k]->name << "[" << i << "]";
  }
}

/// The check must fail when a backward is wrong. Corrupt the analytic
/// gradients in three ways a buggy backward would: a small error in one
/// element, dx off by a relative 1e-5, and a dropped term (bias gradient).
TEST_F(GradCheck, RejectsWrongGradients) {
  Mlp mlp("mlp", /*layer=*/0, kHidden, kMlp, ctx, DType::F64);
  Subject s = layer_subject(mlp, ctx, random({kTokens, kHidden}));
  randomize(s.params);
  const Tensor w = random({kTokens, kHidden});
  const auto error_of = [](const std::vector<TensorError>& errors, const std::string& name) {
    for (const auto& e : errors)
      if (e.name == name) return e.error;
    ADD_FAILURE() << "no tensor " << name;
    return 0.0;
  };
  const auto max_abs = [](const Tensor& t) {
    double m = 0;
    for (double v : t.to_doubles()) m = std::max(m, std::fabs(v));
    return m;
  };

  auto errors = check_gradients(s, w, [&](Subject&, Tensor&) {
    Tensor& g = mlp.fc.weight.grad;
    set_element_from_double(g, 17, element_as_double(g, 17) + 1e-5 * max_abs(g));
  });
  EXPECT_GT(error_of(errors, "mlp.fc.weight"), kTolerance);
  EXPECT_LE(error_of(errors, "mlp.proj.weight"), kTolerance);

  errors = check_gradients(s, w, [](Subject&, Tensor& dx) { ops::scale(dx, 1 + 1e-5); });
  EXPECT_GT(error_of(errors, "input"), kTolerance);

  errors = check_gradients(s, w, [&](Subject&, Tensor&) { mlp.proj.bias.grad.fill(0.0); });
  EXPECT_GT(error_of(errors, "mlp.proj.bias"), 0.5);
  EXPECT_LE(error_of(errors, "mlp.fc.bias"), kTolerance);
}

/// A backward that is wrong in itself, not corrupted afterwards: attention
/// whose backward recomputes its dropout mask for another step than the
/// forward used (a mask mismatch, the classic dropout bug).
TEST_F(GradCheck, RejectsDropoutMaskMismatch) {
  Attention attention("attention", 0, kHidden, kAttention, 0.3, ctx, DType::F64);
  Subject s = layer_subject(attention, ctx, random({kTokens, kHidden}));
  randomize(s.params);
  const Tensor x = s.input;
  s.forward_backward = [&](const Tensor& dy) {
    Attention::Cache cache;
    attention.forward(x, ctx, cache);
    ++ctx.step;
    Tensor dx = attention.backward(dy, ctx, cache);
    --ctx.step;
    return dx;
  };
  for (const auto& e : check_gradients(s, random({kTokens, kHidden})))
    if (e.name != "attention.proj.weight" && e.name != "attention.proj.bias")
      EXPECT_GT(e.error, 1e-3) << e.name;  // the q and k paths run through the mask
}

}  // namespace
}  // namespace meshtron
