// Hugging Face T5 / mT5 interop: config.json both ways (T5's and mT5's
// defaults, the activation's three spellings, the values meshtron does not
// compute rejected in one line), the name table, and a tiny random T5 folder
// written here (v1.0-style ReLU and tied, v1.1-style gated-gelu and untied,
// decoder depth differing from the encoder's, inner width H x d_kv differing
// from d_model) imported into the parameters of T5_DESIGN.md's table, each
// fused part in its columns, and exported back bit for bit; a random
// T5Model (both styles) exported and imported into another bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "app/commands.hpp"
#include "common/convert_test_util.hpp"
#include "common/expect_user_error.hpp"
#include "io/hf/hf_family.hpp"
#include "io/hf/hf_weights.hpp"
#include "io/hf/t5.hpp"
#include "io/hf/t5_config.hpp"
#include "model/t5_model.hpp"
#include "parallel/communicator.hpp"

namespace meshtron {
namespace {

using testing_util::at;
using testing_util::expect_user_error;

// d_model 8, 2 heads of 3 (inner 6), d_ff 5, vocab 11, 4 buckets, 2 encoder
// layers and 1 decoder layer.
constexpr index_t kH = 8, kHeads = 2, kDkv = 3, kInner = kHeads * kDkv, kFf = 5, kVocab = 11,
                  kBuckets = 4;

std::string config_text(bool gated) {
  return std::string(R"({
  "architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
  "vocab_size": 11, "d_model": 8, "d_kv": 3, "d_ff": 5, "num_layers": 2,
  "num_decoder_layers": 1, "num_heads": 2, "relative_attention_num_buckets": 4,
  "relative_attention_max_distance": 16, "layer_norm_epsilon": 1e-6, "dropout_rate": 0.0, )") +
         (gated ? R"("feed_forward_proj": "gated-gelu", "tie_word_embeddings": false})"
                : R"("feed_forward_proj": "relu"})");
}

/// Random tensors of config_text(gated) in transformers' layouts (nn.Linear
/// [out, in]), as save_pretrained writes them (no embed_tokens; lm_head untied only).
std::vector<std::pair<std::string, Tensor>> random_hf_tensors(bool gated) {
  testing_util::RandomTensors t(gated ? 31 : 37);
  std::vector<std::pair<std::string, Tensor>> out = {{"shared.weight", t({kVocab, kH})}};
  auto feed_forward = [&](const std::string& ff) {
    if (gated) {
      out.push_back({ff + "DenseReluDense.wi_0.weight", t({kFf, kH})});
      out.push_back({ff + "DenseReluDense.wi_1.weight", t({kFf, kH})});
    } else {
      out.push_back({ff + "DenseReluDense.wi.weight", t({kFf, kH})});
    }
    out.push_back({ff + "DenseReluDense.wo.weight", t({kH, kFf})});
    out.push_back({ff + "layer_norm.weight", t({kH})});
  };
  auto attention = [&](const std::string& layer, const char* kind, bool with_bias) {
    for (const char* m : {"q", "k", "v"})
      out.push_back({layer + kind + "." + m + ".weight", t({kInner, kH})});
    out.push_back({layer + kind + ".o.weight", t({kH, kInner})});
    if (with_bias)
      out.push_back({layer + kind + ".relative_attention_bias.weight", t({kBuckets, kHeads})});
    out.push_back({layer + "layer_norm.weight", t({kH})});
  };
  for (int i = 0; i < 2; ++i) {
    const std::string b = "encoder.block." + std::to_string(i) + ".";
    attention(b + "layer.0.", "SelfAttention", i == 0);
    feed_forward(b + "layer.1.");
  }
  out.push_back({"encoder.final_layer_norm.weight", t({kH})});
  attention("decoder.block.0.layer.0.", "SelfAttention", true);
  attention("decoder.block.0.layer.1.", "EncDecAttention", false);
  feed_forward("decoder.block.0.layer.2.");
  out.push_back({"decoder.final_layer_norm.weight", t({kH})});
  if (gated) out.push_back({"lm_head.weight", t({kVocab, kH})});
  return out;
}

/// The parameters of a 1-rank T5Model of `c` (T5_DESIGN.md's names and
/// global shapes), zero.
struct T5Params : testing_util::ZeroParams {
  explicit T5Params(const ModelSpec& c) {
    const index_t h = c.hidden_size, inner = index_t(c.num_heads()) * c.head_dim(),
                  ff = c.ffn_hidden_size(), fc = is_gated(c.block.mlp.activation) ? 2 * ff : ff,
                  v = c.vocab_size;
    const Shape bias = {c.relative_attention_num_buckets, c.num_heads()};
    add("embedding.word.weight", {v, h});
    add("encoder.relative_bias.weight", bias);
    for (int i = 0; i < c.num_layers; ++i) {
      const std::string l = "encoder.layers." + std::to_string(i) + ".";
      add(l + "ln_1.weight", {h});
      add(l + "attention.qkv.weight", {h, 3 * inner});
      add(l + "attention.proj.weight", {inner, h});
      add(l + "ln_2.weight", {h});
      add(l + "mlp.fc.weight", {h, fc});
      add(l + "mlp.proj.weight", {ff, h});
    }
    add("encoder.final_norm.weight", {h});
    add("decoder.relative_bias.weight", bias);
    for (int i = 0; i < c.num_decoder_layers; ++i) {
      const std::string l = "decoder.layers." + std::to_string(i) + ".";
      add(l + "ln_1.weight", {h});
      add(l + "self_attention.qkv.weight", {h, 3 * inner});
      add(l + "self_attention.proj.weight", {inner, h});
      add(l + "ln_2.weight", {h});
      add(l + "cross_attention.q.weight", {h, inner});
      add(l + "cross_attention.kv.weight", {h, 2 * inner});
      add(l + "cross_attention.proj.weight", {inner, h});
      add(l + "ln_3.weight", {h});
      add(l + "mlp.fc.weight", {h, fc});
      add(l + "mlp.proj.weight", {ff, h});
    }
    add("decoder.final_norm.weight", {h});
    if (!c.tie_word_embeddings) add("output_layer.weight", {v, h});
  }
};

class T5Io : public testing_util::ScratchFolderTest {
 protected:
  /// Writes the folder `name` of config_text(gated) and its random tensors.
  void write_folder(const std::string& name, bool gated) {
    write_config(name, config_text(gated));
    hf = random_hf_tensors(gated);
    io::write_hf_weights(file(name), hf);
    by_name.clear();
    by_name.insert(hf.begin(), hf.end());
  }
  std::vector<std::pair<std::string, Tensor>> hf;
  std::map<std::string, Tensor> by_name;
};

TEST(T5Mapping, NamesEveryTensorOfTheTable) {
  using io::t5_mapping_of;
  auto names = [](const std::string& n, bool gated = false) {
    return t5_mapping_of(n, gated).hf_names;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(names("embedding.word.weight"), V{"shared.weight"});
  EXPECT_EQ(names("encoder.relative_bias.weight"),
            V{"encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"});
  EXPECT_EQ(names("decoder.relative_bias.weight"),
            V{"decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"});
  EXPECT_EQ(names("encoder.layers.3.attention.qkv.weight"),
            (V{"encoder.block.3.layer.0.SelfAttention.q.weight",
               "encoder.block.3.layer.0.SelfAttention.k.weight",
               "encoder.block.3.layer.0.SelfAttention.v.weight"}));
  EXPECT_EQ(names("encoder.layers.3.ln_2.weight"), V{"encoder.block.3.layer.1.layer_norm.weight"});
  EXPECT_EQ(names("encoder.layers.0.mlp.fc.weight"),
            V{"encoder.block.0.layer.1.DenseReluDense.wi.weight"});
  EXPECT_EQ(names("decoder.layers.12.mlp.fc.weight", true),
            (V{"decoder.block.12.layer.2.DenseReluDense.wi_0.weight",
               "decoder.block.12.layer.2.DenseReluDense.wi_1.weight"}));
  EXPECT_EQ(names("decoder.layers.1.ln_2.weight"), V{"decoder.block.1.layer.1.layer_norm.weight"});
  EXPECT_EQ(names("decoder.layers.1.ln_3.weight"), V{"decoder.block.1.layer.2.layer_norm.weight"});
  EXPECT_EQ(names("decoder.layers.1.cross_attention.kv.weight"),
            (V{"decoder.block.1.layer.1.EncDecAttention.k.weight",
               "decoder.block.1.layer.1.EncDecAttention.v.weight"}));
  EXPECT_EQ(names("decoder.layers.1.self_attention.proj.weight"),
            V{"decoder.block.1.layer.0.SelfAttention.o.weight"});
  EXPECT_EQ(names("decoder.final_norm.weight"), V{"decoder.final_layer_norm.weight"});
  EXPECT_EQ(names("output_layer.weight"), V{"lm_head.weight"});
  EXPECT_TRUE(t5_mapping_of("decoder.layers.0.cross_attention.q.weight", false).transposed);
  EXPECT_FALSE(t5_mapping_of("encoder.relative_bias.weight", false).transposed);
  expect_user_error([] { t5_mapping_of("encoder.layers.0.ln_3.weight", false); },
                    {"encoder.layers.0.ln_3.weight"});
}

TEST_F(T5Io, ConfigMapsToTheT5Spec) {
  write_folder("hf", true);
  const io::HfT5Config hf_config = io::read_hf_t5_config(file("hf"));
  const ModelSpec c = io::model_spec_from_hf(hf_config, 4, 2);
  EXPECT_EQ(c.model_class, ModelClass::T5);
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.num_decoder_layers, 1);
  EXPECT_EQ(c.hidden_size, 8);
  EXPECT_EQ(c.vocab_size, 11);
  EXPECT_EQ(c.padded_vocab_size, 16);
  EXPECT_EQ(c.num_heads(), 2);
  EXPECT_EQ(c.block.attention.num_query_groups, 2);
  EXPECT_EQ(c.head_dim(), 3);
  EXPECT_EQ(c.ffn_hidden_size(), 5);
  EXPECT_EQ(c.relative_attention_num_buckets, 4);
  EXPECT_EQ(c.relative_attention_max_distance, 16);
  EXPECT_EQ(c.block.norm.kind, NormKind::RMSNorm);
  EXPECT_FALSE(c.block.norm.bias);
  EXPECT_DOUBLE_EQ(c.block.norm.epsilon, 1e-6);
  EXPECT_EQ(c.block.attention.position, PositionEmbedding::Relative);
  EXPECT_EQ(c.block.attention.mask, AttentionMask::Padding);
  EXPECT_FALSE(c.block.attention.scale_scores);
  EXPECT_FALSE(c.block.attention.bias || c.block.mlp.bias);
  EXPECT_EQ(c.block.mlp.activation, Activation::GegluTanh);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.seq_length, io::kHfT5SeqLength);
  EXPECT_EQ(c.decoder_seq_length, io::kHfT5SeqLength);

  const io::HfT5Config back = io::hf_t5_config_from_spec(c);
  EXPECT_EQ(back.model_type, "t5");
  EXPECT_EQ(back.feed_forward_proj, "gated-gelu");
  EXPECT_EQ(back.num_decoder_layers, 1);
  EXPECT_EQ(back.d_kv, 3);
  EXPECT_EQ(back.relative_attention_max_distance, 16);
  EXPECT_FALSE(back.tie_word_embeddings);
  expect_user_error([] { io::hf_t5_config_from_spec(ModelSpec{}); }, {"T5", "class"});
  ModelSpec swiglu = c;
  swiglu.block.mlp.activation = Activation::Swiglu;
  expect_user_error([&] { io::hf_t5_config_from_spec(swiglu); }, {"T5", "gated-gelu"});
}

TEST_F(T5Io, ConfigTakesEachModelTypesDefaults) {
  write_config("t5", R"({"model_type": "t5", "num_decoder_layers": null})");
  const io::HfT5Config t5 = io::read_hf_t5_config(file("t5"));
  EXPECT_EQ(t5.vocab_size, 32128);
  EXPECT_EQ(t5.num_layers, 6);
  EXPECT_EQ(t5.num_decoder_layers, 6);
  EXPECT_EQ(t5.d_ff, 2048);
  EXPECT_FALSE(t5.gated());
  EXPECT_TRUE(t5.tie_word_embeddings);
  EXPECT_EQ(t5.eos_token_id, 1);
  write_config("mt5", R"({"model_type": "mt5", "num_layers": 3, "pad_token_id": 0})");
  const io::HfT5Config mt5 = io::read_hf_t5_config(file("mt5"));
  EXPECT_EQ(mt5.vocab_size, 250112);
  EXPECT_EQ(mt5.num_heads, 6);
  EXPECT_EQ(mt5.num_decoder_layers, 3);
  EXPECT_TRUE(mt5.gated());
  EXPECT_FALSE(mt5.tie_word_embeddings);
  // What the writer writes reads back the same, model_type included.
  io::write_hf_t5_config(file("mt5/back.json"), mt5);
  const io::HfT5Config back = io::read_hf_t5_config(file("mt5/back.json"));
  EXPECT_EQ(back.model_type, "mt5");
  EXPECT_EQ(back.num_layers, 3);
  EXPECT_TRUE(back.gated());
  EXPECT_FALSE(back.tie_word_embeddings);
  EXPECT_EQ(back.decoder_start_token_id, 0);
}

TEST_F(T5Io, ConfigRejectsWhatMeshtronDoesNotCompute) {
  const std::pair<const char*, std::vector<std::string>> bad[] = {
      {R"({"model_type": "t5", "feed_forward_proj": "gated-silu"})",
       {"config.json", "feed_forward_proj", "gated-silu"}},
      {R"({"model_type": "t5", "feed_forward_proj": "gelu"})", {"feed_forward_proj", "gelu"}},
      {R"({"model_type": "t5", "feed_forward_proj": "relu", "is_gated_act": true})",
       {"config.json", "is_gated_act", "false"}},
      {R"({"model_type": "mt5", "dense_act_fn": "gelu"})", {"dense_act_fn", "gelu_new"}},
      {R"({"model_type": "t5", "d_kv": 0})", {"d_kv", "positive"}},
      {R"({"model_type": "t5", "eos_token_id": [1, 2]})", {"eos_token_id", "one token id"}},
      {R"({"model_type": "bart"})", {"model_type", "bart", "t5 or mt5"}},
  };
  for (const auto& [text, needles] : bad) {
    write_config("bad", text);
    expect_user_error([&] { io::read_hf_t5_config(file("bad")); }, needles);
  }
}

TEST_F(T5Io, FamilyOfFolderAndSpec) {
  write_folder("hf", false);
  EXPECT_EQ(io::hf_family_of_folder(file("hf")).name, "t5");
  write_config("mt5", R"({"model_type": "mt5"})");
  EXPECT_EQ(io::hf_family_of_folder(file("mt5")).name, "t5");
  write_config("arch", R"({"architectures": ["MT5ForConditionalGeneration"]})");
  EXPECT_EQ(io::hf_family_of_folder(file("arch")).name, "t5");
  const ModelSpec c = io::hf_family_of_folder(file("hf")).read_spec(file("hf"));
  EXPECT_EQ(io::hf_family_of_spec(c).name, "t5");
  EXPECT_NE(io::hf_family_of_spec(ModelSpec{}).name, "t5");
}

/// Imports folder `name` (of config_text(gated)) into T5Params, checks where
/// the fused parts landed, and that the export is the folder's tensors bit for bit.
void expect_round_trip(const std::string& dir, bool gated,
                       const std::map<std::string, Tensor>& by_name) {
  const ModelSpec c = io::hf_family_of_folder(dir).read_spec(dir);
  T5Params params(c);
  io::hf_family_of_folder(dir).import_weights(dir, c, params.list());

  // qkv = [q^T | k^T | v^T]: column inner + j of row r is k[j, r].
  const Tensor& k = by_name.at("encoder.block.1.layer.0.SelfAttention.k.weight");
  const Tensor& qkv = params["encoder.layers.1.attention.qkv.weight"];
  EXPECT_EQ(at(qkv, 5, kInner + 2), at(k, 2, 5));
  // cross kv = [k^T | v^T]: column inner + j is v[j, r].
  const Tensor& v = by_name.at("decoder.block.0.layer.1.EncDecAttention.v.weight");
  EXPECT_EQ(at(params["decoder.layers.0.cross_attention.kv.weight"], 7, kInner + 4), at(v, 4, 7));
  // fc = [wi_0^T | wi_1^T] (gated) or wi^T.
  const Tensor& up = by_name.at(gated ? "decoder.block.0.layer.2.DenseReluDense.wi_1.weight"
                                      : "decoder.block.0.layer.2.DenseReluDense.wi.weight");
  EXPECT_EQ(at(params["decoder.layers.0.mlp.fc.weight"], 3, (gated ? kFf : 0) + 1), at(up, 1, 3));
  const Tensor& bias =
      by_name.at("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight");
  EXPECT_EQ(at(params["decoder.relative_bias.weight"], 3, 1), at(bias, 3, 1));

  const auto back = io::hf_t5_tensors(c, params.list());
  EXPECT_EQ(back.size(), by_name.size());
  for (const auto& [name, t] : back) {
    ASSERT_TRUE(by_name.count(name)) << name;
    const Tensor& src = by_name.at(name);
    ASSERT_EQ(t.shape(), src.shape()) << name;
    EXPECT_EQ(std::memcmp(t.raw(), src.raw(), t.bytes()), 0) << name;
  }
}

TEST_F(T5Io, ReluTiedRoundTripsBitForBit) {
  write_folder("hf", false);
  expect_round_trip(file("hf"), false, by_name);
}

TEST_F(T5Io, GatedUntiedRoundTripsBitForBit) {
  write_folder("hf", true);
  expect_round_trip(file("hf"), true, by_name);
}

TEST_F(T5Io, SharedTableReadFromEmbedTokensAndTiedHeadIgnored) {
  write_config("hf", config_text(false));
  auto tensors = random_hf_tensors(false);
  const Tensor shared = tensors[0].second;
  tensors[0].first = "decoder.embed_tokens.weight";  // no shared.weight in the file
  tensors.push_back({"lm_head.weight", Tensor::zeros({kVocab, kH})});  // tied: not read
  io::write_hf_weights(file("hf"), tensors);
  const ModelSpec c = io::hf_family_of_folder(file("hf")).read_spec(file("hf"));
  T5Params params(c);
  io::import_hf_t5(file("hf"), c, params.list(), 0, 1);
  const Tensor& word = params["embedding.word.weight"];
  EXPECT_EQ(std::memcmp(word.raw(), shared.raw(), shared.bytes()), 0);
  // A gated config over these ReLU tensors: the missing part is named.
  write_config("hf", config_text(true));
  const ModelSpec gated = io::hf_family_of_folder(file("hf")).read_spec(file("hf"));
  T5Params gated_params(gated);
  expect_user_error([&] { io::import_hf_t5(file("hf"), gated, gated_params.list(), 0, 1); },
                    {"DenseReluDense.wi_0.weight"});
}

TEST_F(T5Io, ExportWritesAConfigThatReadsBackAsTheSpec) {
  write_folder("hf", true);
  const io::HfFamily& family = io::hf_family_of_folder(file("hf"));
  const ModelSpec c = family.read_spec(file("hf"));
  T5Params params(c);
  family.import_weights(file("hf"), c, params.list());
  const std::size_t written = family.export_model(file("out"), c, params.list());
  EXPECT_EQ(written, by_name.size());
  const io::HfT5Config back = io::read_hf_t5_config(file("out"));
  EXPECT_EQ(back.model_type, "t5");
  EXPECT_TRUE(back.gated());
  EXPECT_EQ(back.num_decoder_layers, 1);
  const io::HfWeights weights(file("out"));
  EXPECT_TRUE(weights.contains("lm_head.weight"));
  EXPECT_FALSE(weights.contains("encoder.embed_tokens.weight"));
  EXPECT_EQ(weights.names().size(), by_name.size());
}

/// A random 1-rank T5Model of config_text(gated)'s sizes exported to a
/// folder and imported into a T5Model of another seed: every parameter bit
/// for bit, and T5Params names the same tensors.
void expect_model_round_trip(const std::string& dir, bool gated) {
  const ModelSpec c = io::model_spec_from_hf(io::read_hf_t5_config(dir), 1, 1);
  MpiCommunicator self(MPI_COMM_SELF);
  TensorParallelGroup tp{self};
  LayerContext ctx{tp};
  T5Model source(c, ctx, DType::F32, 5), target(c, ctx, DType::F32, 6);
  const io::HfFamily& family = io::hf_family_of_spec(c);
  family.export_model(dir + "/export", c, source.parameters());
  family.import_weights(dir + "/export", c, target.parameters());
  T5Params table(c);
  std::map<std::string, Shape> table_shapes;
  for (const Parameter& p : table.store) table_shapes[p.name] = p.global_shape;
  const ParameterList got = target.parameters(), want = source.parameters();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(got.size(), table.store.size());
  EXPECT_EQ(got.size(), gated ? 28u : 27u);  // the untied head
  for (std::size_t k = 0; k < got.size(); ++k) {
    ASSERT_TRUE(table_shapes.count(got[k]->name)) << got[k]->name;
    EXPECT_EQ(got[k]->global_shape, table_shapes[got[k]->name]) << got[k]->name;
    ASSERT_EQ(got[k]->value.bytes(), want[k]->value.bytes()) << got[k]->name;
    EXPECT_EQ(std::memcmp(got[k]->value.raw(), want[k]->value.raw(), want[k]->value.bytes()), 0)
        << got[k]->name;
  }
}

TEST_F(T5Io, ReluTiedT5ModelRoundTripsBitForBit) {
  write_config("hf", config_text(false));
  expect_model_round_trip(file("hf"), false);
}

TEST_F(T5Io, GatedUntiedT5ModelRoundTripsBitForBit) {
  write_config("hf", config_text(true));
  expect_model_round_trip(file("hf"), true);
}

/// `meshtron convert` from the folder `dir` to a checkpoint in `scratch` and
/// back: the same tensors bit for bit and the same config.
void expect_convert_round_trip(const std::string& dir, const std::map<std::string, Tensor>& by_name,
                               const std::string& scratch) {
  app::run_convert({"--from", "hf", dir, "--to", scratch + "/ckpt"});
  app::run_convert({"--from", scratch + "/ckpt/iter_0000000.h5", "--to", "hf", scratch + "/back"});
  const io::HfWeights back(scratch + "/back");
  EXPECT_EQ(back.names().size(), by_name.size());
  for (const auto& [name, src] : by_name) {
    const Tensor t = back.load(name);
    ASSERT_EQ(t.shape(), src.shape()) << name;
    EXPECT_EQ(std::memcmp(t.raw(), src.raw(), t.bytes()), 0) << name;
  }
  const io::HfT5Config a = io::read_hf_t5_config(dir), b = io::read_hf_t5_config(scratch + "/back");
  EXPECT_EQ(b.num_layers, a.num_layers);
  EXPECT_EQ(b.num_decoder_layers, a.num_decoder_layers);
  EXPECT_EQ(b.d_kv, a.d_kv);
  EXPECT_EQ(b.d_ff, a.d_ff);
  EXPECT_EQ(b.relative_attention_num_buckets, a.relative_attention_num_buckets);
  EXPECT_EQ(b.relative_attention_max_distance, a.relative_attention_max_distance);
  EXPECT_DOUBLE_EQ(b.layer_norm_epsilon, a.layer_norm_epsilon);
  EXPECT_EQ(b.feed_forward_proj, a.feed_forward_proj);
  EXPECT_EQ(b.tie_word_embeddings, a.tie_word_embeddings);
}

TEST_F(T5Io, ConvertRoundTripsReluTiedThroughACheckpoint) {
  write_folder("hf", false);
  expect_convert_round_trip(file("hf"), by_name, dir.string());
}

TEST_F(T5Io, ConvertRoundTripsGatedUntiedThroughACheckpoint) {
  write_folder("hf", true);
  expect_convert_round_trip(file("hf"), by_name, dir.string());
}

}  // namespace
}  // namespace meshtron
