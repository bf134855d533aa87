// meshtron convert: HF golden model -> meshtron checkpoint -> HF export gives
// the original tensors bit for bit, and the same config.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "app/commands.hpp"
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

TEST(Convert, BadArgumentsAreUserErrors) {
  EXPECT_THROW(app::run_convert({"--from", "hf", "/nonexistent", "--to", "/tmp/x"}), UserError);
  EXPECT_THROW(app::run_convert({"--from", "a.h5", "--to", "b"}), UserError);  // no hf side
  EXPECT_THROW(app::run_convert({"--bogus"}), UserError);
}

}  // namespace
}  // namespace meshtron
