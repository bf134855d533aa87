// meshtron convert: HF golden model -> meshtron checkpoint -> HF export gives
// the original tensors bit for bit, and the same config.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "app/commands.hpp"
#include "io/checkpoint.hpp"
#include "io/hf/gpt2_config.hpp"
#include "io/safetensors.hpp"

namespace meshtron {
namespace {

const std::string kGolden = std::string(MESHTRON_SOURCE_DIR) + "/validation/gpt2-golden";

TEST(Convert, HuggingFaceRoundTripIsBitExact) {
  const std::filesystem::path work =
      std::filesystem::temp_directory_path() / ("meshtron_convert_" + std::to_string(getpid()));
  std::filesystem::remove_all(work);
  ASSERT_EQ(app::run_convert({"--from", "hf", kGolden, "--to", (work / "ckpt").string()}), 0);
  ASSERT_EQ(app::run_convert({"--from", (work / "ckpt" / "iter_0000000.h5").string(), "--to",
                              "hf", (work / "hf").string()}),
            0);
  io::SafetensorsFile original(kGolden + "/model.safetensors");
  io::SafetensorsFile exported((work / "hf" / "model.safetensors").string());
  ASSERT_EQ(original.entries().size(), exported.entries().size());
  for (const auto& e : original.entries()) {
    ASSERT_TRUE(exported.contains(e.name)) << e.name;
    const Tensor a = original.load(e.name), b = exported.load(e.name);
    ASSERT_EQ(a.shape(), b.shape()) << e.name;
    ASSERT_EQ(a.dtype(), b.dtype()) << e.name;
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.bytes()), 0) << e.name << " differs";
  }
  const auto c1 = io::read_hf_gpt2_config(kGolden), c2 = io::read_hf_gpt2_config((work / "hf").string());
  EXPECT_EQ(c1.n_layer, c2.n_layer);
  EXPECT_EQ(c1.n_head, c2.n_head);
  EXPECT_EQ(c1.n_embd, c2.n_embd);
  EXPECT_EQ(c1.vocab_size, c2.vocab_size);
  EXPECT_EQ(c1.n_positions, c2.n_positions);
  EXPECT_EQ(c1.mlp_width(), c2.mlp_width());
  EXPECT_DOUBLE_EQ(c1.layer_norm_epsilon, c2.layer_norm_epsilon);
  std::filesystem::remove_all(work);
}

// An untied GPT-2 (the golden model with an lm_head.weight of its own): the
// checkpoint holds it as output_layer.weight in its global unpadded shape,
// and the export writes it back bit for bit.
TEST(Convert, UntiedHeadRoundTripsAsOutputLayerWeight) {
  const std::filesystem::path work = std::filesystem::temp_directory_path() /
                                     ("meshtron_convert_untied_" + std::to_string(getpid()));
  std::filesystem::remove_all(work);
  std::filesystem::create_directories(work / "untied");
  io::HfGpt2Config config = io::read_hf_gpt2_config(kGolden);
  config.tie_word_embeddings = false;
  io::write_hf_gpt2_config((work / "untied" / "config.json").string(), config);
  io::SafetensorsFile original(kGolden + "/model.safetensors");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& e : original.entries()) tensors.push_back({e.name, original.load(e.name)});
  Tensor head = Tensor::empty({config.vocab_size, config.n_embd});
  for (index_t i = 0; i < head.numel(); ++i) head.data<float>()[i] = float(i % 97) / 97.0f - 0.5f;
  tensors.push_back({"lm_head.weight", head});
  const std::string untied = (work / "untied").string();
  io::write_safetensors(untied + "/model.safetensors", tensors);

  const std::string ckpt = (work / "ckpt").string();
  ASSERT_EQ(app::run_convert({"--from", "hf", untied, "--to", ckpt}), 0);
  const io::CheckpointInfo info = io::inspect_checkpoint(ckpt + "/iter_0000000.h5");
  bool stored = false;
  for (const auto& t : info.tensors)
    if (t.path == "model/output_layer.weight")
      stored = t.shape == Shape{config.vocab_size, config.n_embd};
  EXPECT_TRUE(stored) << "no model/output_layer.weight of shape [vocab, hidden]";
  ASSERT_EQ(app::run_convert({"--from", ckpt + "/iter_0000000.h5", "--to", "hf",
                              (work / "hf").string()}),
            0);
  io::SafetensorsFile exported((work / "hf" / "model.safetensors").string());
  ASSERT_TRUE(exported.contains("lm_head.weight"));
  const Tensor back = exported.load("lm_head.weight");
  ASSERT_EQ(back.shape(), head.shape());
  EXPECT_EQ(std::memcmp(back.raw(), head.raw(), head.bytes()), 0);
  EXPECT_EQ(exported.entries().size(), tensors.size());
  EXPECT_FALSE(io::read_hf_gpt2_config((work / "hf").string()).tie_word_embeddings);
  std::filesystem::remove_all(work);
}

TEST(Convert, BadArgumentsAreUserErrors) {
  EXPECT_THROW(app::run_convert({"--from", "hf", "/nonexistent", "--to", "/tmp/x"}), UserError);
  EXPECT_THROW(app::run_convert({"--from", "a.h5", "--to", "b"}), UserError);  // no hf side
  EXPECT_THROW(app::run_convert({"--bogus"}), UserError);
}

}  // namespace
}  // namespace meshtron
