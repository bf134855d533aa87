// The golden T5ForConditionalGeneration models (validation/t5-golden/v1_0:
// ReLU, tied; v1_1: gated-gelu, untied, 3 decoder layers over 2 encoder
// layers; made by validation/make_t5_golden.py with transformers) through
// meshtron's Hugging Face import and T5Model in fp32, on one rank or tp 2
// (the world is the tp group): logits and loss within 1e-5 of
// transformers', every gradient within 1e-4 (norm-wise per tensor: max
// |ours - theirs| / max |theirs| over this rank's shard), and on one rank
// the export of the loaded model, and `meshtron convert` to a checkpoint and
// back, bit-equal to the golden folder's tensors.
//
// Each rank's expected gradient shard is transformers' gradients imported
// through the same table and shard map as the weights (written as a model
// folder of their own), so the comparison is element by element in
// meshtron's layout.
//
// Run: ctest -R validation_t5_golden --output-on-failure
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "app/commands.hpp"
#include "common/golden_tokens.hpp"
#include "io/hf/hf_weights.hpp"
#include "io/hf/t5.hpp"
#include "io/hf/t5_config.hpp"
#include "io/safetensors.hpp"
#include "model/t5_model.hpp"
#include "parallel/communicator.hpp"

namespace meshtron::golden {
namespace {

namespace fs = std::filesystem;

class T5Golden : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir = golden_folder("t5") + "/" + GetParam();
    ASSERT_TRUE(fs::exists(dir + "/golden.safetensors"))
        << dir << ": golden model absent: on a machine with torch and transformers run\n"
        << "  python3 validation/make_t5_golden.py --out validation/t5-golden";
    golden = std::make_unique<io::SafetensorsFile>(dir + "/golden.safetensors");
    const Tensor enc = golden->load("input_ids"), dec = golden->load("decoder_input_ids");
    b = enc.dim(0);
    s_enc = enc.dim(1);
    s_dec = dec.dim(1);
    spec = io::model_spec_from_hf(io::read_hf_t5_config(dir), 1, tp_size());
    ctx.seq_length = s_enc;
    ctx.micro_batch = b;
    ctx.global_batch = b;
    model = std::make_unique<T5Model>(spec, ctx, DType::F32, 1);
    io::import_hf_t5(dir, spec, model->parameters(), tp_rank(), tp_size());
    batch.encoder_ids = sb_rows(enc);
    batch.encoder_mask = golden->load("attention_mask");
    batch.decoder_ids = sb_rows(dec);
    batch.labels = sb_rows(golden->load("labels"));
  }

  int tp_rank() const { return ctx.tp.rank(); }
  int tp_size() const { return ctx.tp.size(); }

  /// [b, s] (HF) -> [s*b] rows in [s, b] order.
  Tensor sb_rows(const Tensor& bs) const {
    const index_t s = bs.dim(1);
    Tensor out = Tensor::empty({s * b}, DType::I32);
    for (index_t i = 0; i < b; ++i)
      for (index_t j = 0; j < s; ++j)
        out.data<std::int32_t>()[j * b + i] = bs.data<std::int32_t>()[i * s + j];
    return out;
  }

  /// Transformers' gradient of every parameter as this rank's shard, in
  /// meshtron's layout: golden.safetensors' grad.<name> written as a model
  /// folder and imported like the weights.
  std::vector<Parameter> expected_gradients() {
    const fs::path scratch = fs::temp_directory_path() /
                             ("meshtron_t5_golden_" + std::to_string(getpid()));
    fs::create_directories(scratch);
    std::vector<std::pair<std::string, Tensor>> grads;
    for (const auto& e : golden->entries())
      if (e.name.rfind("grad.", 0) == 0) grads.push_back({e.name.substr(5), golden->load(e.name)});
    io::write_hf_weights(scratch.string(), grads);
    std::vector<Parameter> out;
    for (Parameter* p : model->parameters()) {
      out.push_back(*p);
      out.back().value = Tensor::zeros(p->value.shape(), p->value.dtype());
    }
    ParameterList list;
    for (Parameter& p : out) list.push_back(&p);
    io::import_hf_t5(scratch.string(), spec, list, tp_rank(), tp_size());
    fs::remove_all(scratch);
    n_golden_gradients = grads.size();
    return out;
  }

  std::string dir;
  MpiCommunicator world{MPI_COMM_WORLD};
  TensorParallelGroup tp{world};
  LayerContext ctx{tp};
  ModelSpec spec;
  index_t b = 0, s_enc = 0, s_dec = 0;
  T5Batch batch;
  std::unique_ptr<T5Model> model;
  std::unique_ptr<io::SafetensorsFile> golden;
  std::size_t n_golden_gradients = 0;
};

TEST_P(T5Golden, LogitsAndLossMatchTransformers) {
  T5Model::Cache cache;
  const double loss = model->forward(batch, ctx, cache);
  const double expected = golden->load("loss", DType::F32).to_doubles()[0];
  EXPECT_LE(std::fabs(loss - expected) / expected, 1e-5) << loss << " vs " << expected;
  // This rank's vocabulary columns [s_dec*b rows in [s, b] order, V_pad/tp]
  // against transformers' [b, s_dec, V].
  const Tensor logits = T5Model::logits(cache).to_host();
  const index_t v = spec.vocab_size, local = logits.dim(1), first = tp_rank() * local;
  ASSERT_EQ(local * tp_size(), spec.padded_vocab_size);
  const std::vector<double> all = logits.to_doubles();
  const std::vector<double> theirs = golden->load("logits", DType::F32).to_doubles();
  std::vector<double> ours, want;
  for (index_t i = 0; i < b; ++i)
    for (index_t t = 0; t < s_dec; ++t)
      for (index_t c = 0; c < local && first + c < v; ++c) {
        ours.push_back(all[std::size_t((t * b + i) * local + c)]);
        want.push_back(theirs[std::size_t((i * s_dec + t) * v + first + c)]);
      }
  ASSERT_FALSE(ours.empty());
  EXPECT_LE(rel_error(ours, want), 1e-5);
}

TEST_P(T5Golden, EveryGradientMatchesTransformers) {
  T5Model::Cache cache;
  for (Parameter* p : model->parameters()) p->grad.fill(0.0);
  model->forward(batch, ctx, cache);
  model->backward(ctx, cache);
  const std::vector<Parameter> expected = expected_gradients();
  const ParameterList params = model->parameters();
  ASSERT_EQ(params.size(), expected.size());
  std::size_t hf_tensors = 0;
  for (std::size_t k = 0; k < params.size(); ++k) {
    const std::vector<double> ours = params[k]->grad.to_host().to_doubles();
    const std::vector<double> want = expected[k].value.to_doubles();
    ASSERT_EQ(ours.size(), want.size()) << params[k]->name;
    EXPECT_LE(rel_error(ours, want), 1e-4) << params[k]->name;
    hf_tensors += io::t5_mapping_of(params[k]->name, is_gated(spec.block.mlp.activation))
                      .hf_names.size();
  }
  // Every gradient transformers wrote was compared (its names are the table's).
  EXPECT_EQ(hf_tensors, n_golden_gradients);
}

TEST_P(T5Golden, ExportIsTheGoldenFolderBitForBit) {
  if (tp_size() > 1) GTEST_SKIP() << "the export is of a 1-rank model";
  const io::HfWeights theirs(dir);
  std::size_t compared = 0;
  for (const auto& [name, tensor] : io::hf_t5_tensors(spec, model->parameters())) {
    const Tensor t = theirs.load(io::t5_stored_name(name, theirs));
    ASSERT_EQ(t.bytes(), tensor.bytes()) << name;
    EXPECT_EQ(std::memcmp(t.raw(), tensor.raw(), t.bytes()), 0) << name;
    ++compared;
  }
  EXPECT_GT(compared, 30u);
}

TEST_P(T5Golden, ConvertThroughACheckpointIsBitForBit) {
  if (tp_size() > 1) GTEST_SKIP() << "meshtron convert runs on one rank";
  const fs::path scratch =
      fs::temp_directory_path() / ("meshtron_t5_convert_" + std::to_string(getpid()));
  fs::remove_all(scratch);
  app::run_convert({"--from", "hf", dir, "--to", (scratch / "ckpt").string()});
  app::run_convert({"--from", (scratch / "ckpt" / "iter_0000000.h5").string(), "--to", "hf",
                    (scratch / "hf").string()});
  const io::HfWeights theirs(dir), back((scratch / "hf").string());
  std::size_t compared = 0;
  for (const std::string& name : back.names()) {
    const Tensor t = theirs.load(io::t5_stored_name(name, theirs)), ours = back.load(name);
    ASSERT_EQ(t.bytes(), ours.bytes()) << name;
    EXPECT_EQ(std::memcmp(t.raw(), ours.raw(), t.bytes()), 0) << name;
    ++compared;
  }
  EXPECT_EQ(compared, io::hf_t5_tensors(spec, model->parameters()).size());
  fs::remove_all(scratch);
}

INSTANTIATE_TEST_SUITE_P(Models, T5Golden, ::testing::Values("v1_0", "v1_1"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace meshtron::golden
