// BertModel on one rank, fp64: finite differences of the whole model's loss
// against its backward on a few elements of every parameter; padding keys
// that change nothing for the real tokens; selective and full recompute
// bit-equal to none; bad batches as one-line errors;
// the Hugging Face MegatronBertForPreTraining and BertForPreTraining round
// trips, bit-exact; a BertForMaskedLM file's missing heads named and left at
// their initialisation; unsupported BertConfig values as one-line errors.
//
// Run: ctest -R model_bert --output-on-failure   (from the build folder)
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "common/expect_user_error.hpp"
#include "io/hf/hf_family.hpp"
#include "io/hf/hf_weights.hpp"
#include "io/hf/megatron_bert.hpp"
#include "parallel/communicator.hpp"
#include "tests/model/bert_fixture.hpp"
#include "tests/model/recompute_check.hpp"

namespace meshtron::bert_test {
namespace {

namespace fs = std::filesystem;
using testing_util::expect_user_error;

struct OneRank {
  MpiCommunicator self{MPI_COMM_SELF};
  TensorParallelGroup tp{self};
  LayerContext ctx = context(tp);
};

/// MegatronBert's layout (false) and Google BERT's (true: post-norm blocks).
class BertLayouts : public ::testing::TestWithParam<bool> {};

TEST_P(BertLayouts, GradientsMatchFiniteDifferences) {
  OneRank r;
  BertModel model(tiny_spec(1, GetParam()), r.ctx, DType::F64, 5);
  const BertBatch batch = tiny_batch();
  loss_and_grads(model, batch, r.ctx);
  const auto objective = [&] {
    BertModel::Cache cache;
    return model.forward(batch, r.ctx, cache);
  };
  int checked = 0;
  for (Parameter* p : model.parameters()) {
    const Tensor analytic = p->grad.clone();
    const index_t n = p->value.numel();
    double scale = 1e-8;
    for (index_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs(element_as_double(analytic, i)));
    // First, middle and last elements, and the largest gradient's.
    index_t largest = 0;
    for (index_t i = 0; i < n; ++i)
      if (std::fabs(element_as_double(analytic, i)) == scale) largest = i;
    for (index_t i : {index_t(0), n / 2, n - 1, largest}) {
      const double v = element_as_double(p->value, i), h = 1e-6;
      set_element_from_double(p->value, i, v + h);
      const double up = objective();
      set_element_from_double(p->value, i, v - h);
      const double down = objective();
      set_element_from_double(p->value, i, v);
      const double numeric = (up - down) / (2 * h);
      EXPECT_LE(std::fabs(numeric - element_as_double(analytic, i)), 1e-6 * scale)
          << p->name << "[" << i << "] numeric " << numeric << " analytic "
          << element_as_double(analytic, i);
      ++checked;
    }
    EXPECT_GT(scale, 1e-8) << p->name << " has no gradient";
  }
  EXPECT_GE(checked, 4 * 30);
  // Google's layout: the embedding norm, and no final norm.
  const ParameterList params = model.parameters();
  const auto has = [&](const std::string& name) {
    return std::any_of(params.begin(), params.end(), [&](Parameter* p) { return p->name == name; });
  };
  EXPECT_EQ(has("embedding.norm.weight"), GetParam());
  EXPECT_EQ(has("final_norm.weight"), !GetParam());
}

TEST(BertModel, PaddingKeysChangeNothingForRealTokens) {
  OneRank r;
  BertModel model(tiny_spec(), r.ctx, DType::F64, 5);
  BertBatch batch = tiny_batch();
  BertModel::Cache a, b;
  const double loss = model.forward(batch, r.ctx, a);
  for (index_t j : {4, 5}) batch.tokens.data<std::int32_t>()[j * kBatch + 1] = 13;  // padding ids
  EXPECT_EQ(model.forward(batch, r.ctx, b), loss);
  const Tensor la = BertModel::prediction_logits(a), lb = BertModel::prediction_logits(b);
  const index_t v = la.dim(1);
  for (index_t row = 0; row < kSeq * kBatch; ++row) {
    const bool padding = row % kBatch == 1 && row / kBatch >= 4;
    const bool same = std::memcmp(la.data<double>() + row * v, lb.data<double>() + row * v,
                                  std::size_t(v) * sizeof(double)) == 0;
    EXPECT_EQ(same, !padding) << "row " << row;  // a padding row's own token does change it
  }
  // The mask is what hides them: a real key there moves the loss.
  batch.padding_mask.data<std::int32_t>()[kSeq + 4] = 1;
  BertModel::Cache c;
  EXPECT_NE(model.forward(batch, r.ctx, c), loss);
}

TEST_P(BertLayouts, RecomputeGivesTheSameLossAndGradients) {
  // Selective recompute rebuilds the masked probabilities in the backward
  // (from ctx's mask), full recompute each block's forward: both bit-equal.
  OneRank r;
  BertModel model(tiny_spec(1, GetParam()), r.ctx, DType::F64, 5);
  const BertBatch batch = tiny_batch();
  testing_util::expect_recompute_bit_equal([&] { return loss_and_grads(model, batch, r.ctx); },
                                           model.parameters(), r.ctx);
}

INSTANTIATE_TEST_SUITE_P(Layout, BertLayouts, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "google" : "megatron"; });

TEST(BertModel, PostNormDiffersFromPreNorm) {
  // The same weights (post-norm has no final norm, the embedding norm is
  // the identity at initialisation): the placement alone moves the loss.
  OneRank r;
  ModelSpec post = tiny_spec();
  post.block.norm.placement = NormPlacement::Post;
  BertModel pre_model(tiny_spec(), r.ctx, DType::F64, 5), post_model(post, r.ctx, DType::F64, 5);
  const BertBatch batch = tiny_batch();
  BertModel::Cache a, b;
  EXPECT_NE(pre_model.forward(batch, r.ctx, a), post_model.forward(batch, r.ctx, b));
}

TEST(BertModel, BadBatchesAreOneLineErrors) {
  OneRank r;
  BertModel model(tiny_spec(), r.ctx, DType::F64, 5);
  BertModel::Cache cache;
  BertBatch wrong_mask = tiny_batch();
  wrong_mask.padding_mask = ints({kSeq, kBatch}, std::vector<std::int32_t>(kSeq * kBatch, 1));
  expect_user_error([&] { model.forward(wrong_mask, r.ctx, cache); },
                    {"padding_mask must be int32 [b = 2, s = 6]", "[6, 2]"});
  BertBatch wrong_label = tiny_batch();
  wrong_label.labels.data<std::int32_t>()[3] = kVocab;
  expect_user_error([&] { model.forward(wrong_label, r.ctx, cache); },
                    {"label 30 is neither -100 nor in [0, 30)"});
  BertBatch wrong_type = tiny_batch();
  wrong_type.token_types.data<std::int32_t>()[0] = 2;
  expect_user_error([&] { model.forward(wrong_type, r.ctx, cache); }, {"token type 2"});
  BertBatch wrong_class = tiny_batch();
  wrong_class.next_sentence.data<std::int32_t>()[1] = 2;
  expect_user_error([&] { model.forward(wrong_class, r.ctx, cache); },
                    {"next_sentence label 2 is not 0 or 1"});
  ModelSpec gpt = tiny_spec();
  gpt.model_class = ModelClass::CausalLm;
  expect_user_error([&] { BertModel m(gpt, r.ctx, DType::F64, 1); }, {"not BERT"});
  ModelSpec untied = tiny_spec();
  untied.tie_word_embeddings = false;
  expect_user_error([&] { BertModel m(untied, r.ctx, DType::F64, 1); },
                    {"untie_embeddings_and_output_weights must be false"});
}

/// A fresh folder under the temporary directory, removed by its destructor.
struct TempDir {
  explicit TempDir(const std::string& tag)
      : path(fs::temp_directory_path() / ("meshtron_" + tag + "_" + std::to_string(getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path path;
};

/// Exports a random model of `spec` as `family_name`, reads it back into
/// another model: every parameter bit-equal. Returns the tensors written.
std::size_t expect_round_trip(const ModelSpec& spec, const std::string& family_name,
                              const fs::path& dir, LayerContext& ctx) {
  BertModel written(spec, ctx, DType::F32, 7);
  const io::HfFamily& family = io::hf_family_of_spec(spec);
  EXPECT_EQ(family.name, family_name);
  const std::size_t count = family.export_model(dir.string(), spec, written.parameters());
  const io::HfFamily& read = io::hf_family_of_folder(dir.string());
  EXPECT_EQ(read.name, family_name);
  const ModelSpec back = read.read_spec(dir.string());
  EXPECT_EQ(back.block.norm.placement, spec.block.norm.placement);
  EXPECT_EQ(back.embedding_norm, spec.embedding_norm);
  BertModel loaded(back, ctx, DType::F32, 99);
  read.import_weights(dir.string(), back, loaded.parameters());
  const ParameterList a = written.parameters(), b = loaded.parameters();
  EXPECT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    EXPECT_EQ(a[i]->name, b[i]->name);
    EXPECT_EQ(std::memcmp(a[i]->value.raw(), b[i]->value.raw(), a[i]->value.bytes()), 0)
        << a[i]->name;
  }
  return count;
}

TEST(BertModel, GoogleBertRoundTripIsBitExact) {
  OneRank r;
  ModelSpec spec = tiny_spec(1, true);
  spec.padded_vocab_size = spec.vocab_size;  // one rank, as convert builds it
  const TempDir dir("google_bert");
  // embeddings (3 tables + their norm), layers (16 each: no final norm), heads
  EXPECT_EQ(expect_round_trip(spec, "bert", dir.path, r.ctx), 3 + 2 + 2 * 16 + 2 + 4 + 1 + 2);
  const std::string config = [&] {
    std::ifstream in(dir.path / "config.json");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  EXPECT_NE(config.find("\"BertForPreTraining\""), std::string::npos);
  EXPECT_NE(config.find("\"model_type\": \"bert\""), std::string::npos);
  const io::HfWeights weights(dir.path.string());
  for (const char* name : {"bert.embeddings.LayerNorm.weight",
                           "bert.encoder.layer.1.attention.output.LayerNorm.bias",
                           "bert.encoder.layer.1.output.LayerNorm.weight"})
    EXPECT_TRUE(weights.contains(name)) << name;
  EXPECT_FALSE(weights.contains("bert.encoder.ln.weight"));
}

/// The Google BERT tensors of `params` (a model of `spec`) but those whose
/// name starts with one of `dropped` (a BertForMaskedLM or BertModel file).
void write_google_bert_without(const ModelSpec& spec, const ParameterList& params,
                               const fs::path& dir, const std::vector<std::string>& dropped) {
  std::vector<std::pair<std::string, Tensor>> kept;
  for (auto& [name, tensor] : io::hf_megatron_bert_tensors(spec, params))
    if (std::none_of(dropped.begin(), dropped.end(),
                     [&](const std::string& d) { return name.rfind(d, 0) == 0; }))
      kept.push_back({name, tensor});
  io::write_hf_weights(dir.string(), kept);
  io::write_hf_megatron_bert_config((dir / "config.json").string(),
                                    io::hf_megatron_bert_config_from_spec(spec));
}

TEST(BertModel, MissingGoogleHeadsAreNamedAndKeepTheirInitialisation) {
  OneRank r;
  ModelSpec spec = tiny_spec(1, true);
  spec.padded_vocab_size = spec.vocab_size;
  BertModel source(spec, r.ctx, DType::F32, 7);
  const TempDir dir("bert_masked_lm");
  // BertForMaskedLM: no pooler, no next-sentence head.
  write_google_bert_without(spec, source.parameters(), dir.path,
                            {"bert.pooler.", "cls.seq_relationship."});
  const io::HfFamily& family = io::hf_family_of_folder(dir.path.string());
  BertModel loaded(spec, r.ctx, DType::F32, 99), fresh(spec, r.ctx, DType::F32, 99);
  const std::vector<std::string> names =
      family.import_weights(dir.path.string(), spec, loaded.parameters());
  const std::set<std::string> initialised(names.begin(), names.end());
  EXPECT_EQ(initialised, (std::set<std::string>{"pooler.weight", "pooler.bias",
                                                "binary_head.weight", "binary_head.bias"}));
  const ParameterList got = loaded.parameters(), from_file = source.parameters(),
                      from_init = fresh.parameters();
  for (std::size_t i = 0; i < got.size(); ++i) {
    const Parameter& expected = initialised.count(got[i]->name) ? *from_init[i] : *from_file[i];
    EXPECT_EQ(std::memcmp(got[i]->value.raw(), expected.value.raw(), got[i]->value.bytes()), 0)
        << got[i]->name;
  }
  // A complete BertForPreTraining file initialises nothing.
  const TempDir full("bert_pretraining");
  write_google_bert_without(spec, source.parameters(), full.path, {});
  EXPECT_TRUE(family.import_weights(full.path.string(), spec, loaded.parameters()).empty());
}

TEST(BertModel, UnsupportedBertConfigsAreOneLineErrors) {
  OneRank r;
  ModelSpec spec = tiny_spec(1, true);
  spec.padded_vocab_size = spec.vocab_size;
  BertModel model(spec, r.ctx, DType::F32, 7);
  const TempDir dir("bad_bert");
  io::hf_family_of_spec(spec).export_model(dir.path.string(), spec, model.parameters());
  const fs::path config = dir.path / "config.json";
  std::ifstream in(config);
  const std::string good(std::istreambuf_iterator<char>(in), {});
  const auto with = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const std::size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    std::ofstream(config) << text.replace(at, from.size(), to);
  };
  with("\"absolute\"", "\"relative_key\"");
  expect_user_error([&] { io::hf_family_of_folder(dir.path.string()).read_spec(dir.path.string()); },
                    {"position_embedding_type", "absolute"});
  with("\"gelu\"", "\"relu\"");
  expect_user_error([&] { io::hf_family_of_folder(dir.path.string()).read_spec(dir.path.string()); },
                    {"hidden_act"});
  // A post-norm BERT without the embedding norm is neither layout.
  ModelSpec neither = spec;
  neither.embedding_norm = false;
  BertModel odd(neither, r.ctx, DType::F32, 7);
  expect_user_error(
      [&] { io::hf_family_of_spec(neither).export_model(dir.path.string(), neither, odd.parameters()); },
      {"BertForPreTraining config: the model is not its layout"});
}

TEST(BertModel, HuggingFaceRoundTripIsBitExact) {
  OneRank r;
  ModelSpec spec = tiny_spec();
  spec.padded_vocab_size = spec.vocab_size;  // one rank, as convert builds it
  BertModel written(spec, r.ctx, DType::F32, 7);
  const fs::path dir = fs::temp_directory_path() / ("meshtron_bert_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const io::HfFamily& family = io::hf_family_of_spec(spec);
  ASSERT_EQ(family.name, "megatron_bert");
  const std::size_t count = family.export_model(dir.string(), spec, written.parameters());
  EXPECT_EQ(count, 3 + 2 * 16 + 2 + 2 + 4 + 1 + 2);  // embeddings, layers, heads

  const io::HfFamily& read = io::hf_family_of_folder(dir.string());
  ASSERT_EQ(read.name, "megatron_bert");
  const ModelSpec back = read.read_spec(dir.string());
  EXPECT_EQ(back.model_class, ModelClass::BertPretraining);
  EXPECT_EQ(back.num_token_types, 2);
  EXPECT_EQ(back.block.attention.mask, AttentionMask::Padding);
  EXPECT_EQ(back.block.norm.epsilon, spec.block.norm.epsilon);
  BertModel loaded(back, r.ctx, DType::F32, 99);
  read.import_weights(dir.string(), back, loaded.parameters());
  const ParameterList a = written.parameters(), b = loaded.parameters();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i]->name, b[i]->name);
    EXPECT_EQ(std::memcmp(a[i]->value.raw(), b[i]->value.raw(), a[i]->value.bytes()), 0)
        << a[i]->name;
  }
  // q, k and v apart in the file: the query of layer 0 is the first third of qkv's columns.
  const io::HfWeights weights(dir.string());
  const Tensor query = weights.load("bert.encoder.layer.0.attention.self.query.weight");
  const Tensor& qkv = a[5]->value;  // after the 3 tables and layers.0.ln_1.{weight,bias}
  ASSERT_EQ(a[5]->name, "layers.0.attention.qkv.weight");
  EXPECT_EQ(query.data<float>()[1], qkv.data<float>()[1 * qkv.dim(1)]);  // [out 0, in 1]
  EXPECT_FALSE(weights.contains("cls.predictions.decoder.weight"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace meshtron::bert_test
