// A golden BERT pre-training model made with transformers, through
// meshtron's BertModel on one rank in fp32: prediction logits,
// seq-relationship logits and the total loss within 1e-5 of transformers',
// every gradient within 1e-4 (norm-wise: max |ours - theirs| / max |theirs|),
// the export of the loaded model bit-equal to the golden folder's tensors.
// One source, one binary per layout; CMake names the folder, its Hugging
// Face family and the script that makes it:
//   validation_bert_golden           validation/bert-golden, megatron_bert
//                                    (MegatronBertForPreTraining, pre-norm)
//   validation_bert_postnorm_golden  validation/bert-postnorm-golden, bert
//                                    (BertForPreTraining, Google's post-norm)
//
// Run: ctest -R 'validation_bert(_postnorm)?_golden' --output-on-failure
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/golden_tokens.hpp"
#include "io/hf/hf_family.hpp"
#include "io/hf/hf_weights.hpp"
#include "io/hf/megatron_bert.hpp"
#include "io/safetensors.hpp"
#include "model/bert_model.hpp"
#include "parallel/communicator.hpp"

namespace meshtron::golden {
namespace {

class BertGolden : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(dir + "/golden.safetensors"))
        << dir << ": golden model absent: on a machine with torch and transformers run\n"
        << "  python3 validation/" MESHTRON_BERT_GOLDEN_SCRIPT
           " --out validation/" MESHTRON_BERT_GOLDEN_FOLDER;
    golden = std::make_unique<io::SafetensorsFile>(dir + "/golden.safetensors");
    const Tensor ids = golden->load("input_ids");
    b = ids.dim(0);
    s = ids.dim(1);
    spec = io::hf_family_of_folder(dir).read_spec(dir);
    ctx.seq_length = s;
    ctx.micro_batch = b;
    ctx.global_batch = b;
    model = std::make_unique<BertModel>(spec, ctx, DType::F32, 1);
    io::hf_family_of_folder(dir).import_weights(dir, spec, model->parameters());
    batch.tokens = sb_rows(ids);
    batch.token_types = sb_rows(golden->load("token_type_ids"));
    batch.labels = sb_rows(golden->load("labels"));
    batch.padding_mask = golden->load("attention_mask");
    batch.next_sentence = golden->load("next_sentence_label");
  }

  /// [b, s] (HF) -> [s*b] rows in [s, b] order.
  Tensor sb_rows(const Tensor& bs) const {
    Tensor out = Tensor::empty({s * b}, DType::I32);
    for (index_t i = 0; i < b; ++i)
      for (index_t j = 0; j < s; ++j)
        out.data<std::int32_t>()[j * b + i] = bs.data<std::int32_t>()[i * s + j];
    return out;
  }

  std::vector<double> golden_values(const std::string& name) {
    return golden->load(name, DType::F32).to_doubles();
  }

  const std::string dir =
      std::string(MESHTRON_SOURCE_DIR) + "/validation/" MESHTRON_BERT_GOLDEN_FOLDER;
  MpiCommunicator self{MPI_COMM_SELF};
  TensorParallelGroup tp{self};
  LayerContext ctx{tp};
  ModelSpec spec;
  index_t b = 0, s = 0;
  BertBatch batch;
  std::unique_ptr<BertModel> model;
  std::unique_ptr<io::SafetensorsFile> golden;
};

TEST_F(BertGolden, FolderIsOfItsFamily) {
  const io::HfFamily& family = io::hf_family_of_folder(dir);
  EXPECT_EQ(family.name, MESHTRON_BERT_GOLDEN_FAMILY);
  EXPECT_TRUE(family.owns(spec));
}

TEST_F(BertGolden, LogitsAndLossMatchTransformers) {
  BertModel::Cache cache;
  const double loss = model->forward(batch, ctx, cache);
  const double expected = golden_values("loss")[0];
  EXPECT_LE(std::fabs(loss - expected) / expected, 1e-5) << loss << " vs " << expected;
  // Our rows [s, b] of V_pad columns against transformers' [b, s, V].
  const Tensor logits = BertModel::prediction_logits(cache);
  const index_t v = spec.vocab_size, v_pad = logits.dim(1);
  const std::vector<double> all = logits.to_doubles();
  std::vector<double> ours;
  for (index_t i = 0; i < b; ++i)
    for (index_t j = 0; j < s; ++j)
      for (index_t c = 0; c < v; ++c) ours.push_back(all[std::size_t((j * b + i) * v_pad + c)]);
  EXPECT_LE(rel_error(ours, golden_values("prediction_logits")), 1e-5);
  EXPECT_LE(rel_error(BertModel::binary_logits(cache).to_doubles(),
                      golden_values("seq_relationship_logits")),
            1e-5);
}

bool is_key_bias(const std::string& hf_name) {
  const std::string suffix = "attention.self.key.bias";
  return hf_name.size() >= suffix.size() &&
         hf_name.compare(hf_name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

TEST_F(BertGolden, EveryGradientMatchesTransformers) {
  BertModel::Cache cache;
  for (Parameter* p : model->parameters()) p->grad.fill(0.0);
  model->forward(batch, ctx, cache);
  model->backward(ctx, cache);
  std::vector<Parameter> as_values;
  for (Parameter* p : model->parameters()) {
    as_values.push_back(*p);
    as_values.back().value = p->grad;
  }
  ParameterList grads;
  for (Parameter& p : as_values) grads.push_back(&p);
  std::size_t compared = 0;
  for (const auto& [name, grad] : io::hf_megatron_bert_tensors(spec, grads)) {
    const std::vector<double> expected = golden_values("grad." + name);
    std::vector<double> ours = grad.to_doubles();
    ASSERT_EQ(ours.size(), expected.size()) << name;
    if (is_key_bias(name)) {
      // q . b_k adds one constant to every score of a row, which the softmax
      // cancels: d loss / d b_k is exactly 0 and both sides hold round-off
      // (transformers: ~3e-9 against ~2e-2 for the query bias).
      EXPECT_LE(max_abs(ours), 1e-7) << name;
      EXPECT_LE(max_abs(expected), 1e-7) << name;
    } else {
      EXPECT_LE(rel_error(ours, expected), 1e-4) << name;
    }
    ++compared;
  }
  EXPECT_EQ(compared, golden->entries().size() - 8);  // all but the inputs, outputs and loss
}

TEST_F(BertGolden, ExportIsTheGoldenFolderBitForBit) {
  const io::HfWeights theirs(dir);
  std::size_t compared = 0;
  for (const auto& [name, tensor] : io::hf_megatron_bert_tensors(spec, model->parameters())) {
    const Tensor t = theirs.load(io::megatron_bert_stored_name(name, theirs));
    ASSERT_EQ(t.bytes(), tensor.bytes()) << name;
    EXPECT_EQ(std::memcmp(t.raw(), tensor.raw(), t.bytes()), 0) << name;
    ++compared;
  }
  EXPECT_GT(compared, 40u);
}

}  // namespace
}  // namespace meshtron::golden
