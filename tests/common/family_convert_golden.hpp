// meshtron convert on the golden model of a Hugging Face decoder family
// (validation/<family>-golden{,-sharded}, made by
// validation/make_<family>_golden.py): Hugging Face -> checkpoint -> Hugging
// Face gives the original tensors bit for bit, from the whole model and from
// its shards. A family's test derives a fixture naming its folder and checks
// its own config.json fields and model.deck keys.
// The golden folders are generated, not optional: without them these tests
// fail and say how to make them.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>

#include "app/commands.hpp"
#include "common/golden_tokens.hpp"
#include "io/checkpoint.hpp"
#include "io/hf/hf_weights.hpp"

namespace meshtron::golden {

/// Every tensor of `a` equals the one of `b` of the same name bit for bit.
inline void expect_same_tensors(const io::HfWeights& a, const io::HfWeights& b) {
  ASSERT_EQ(a.names(), b.names());
  for (const std::string& name : a.names()) {
    const Tensor x = a.load(name), y = b.load(name);
    ASSERT_EQ(x.shape(), y.shape()) << name;
    ASSERT_EQ(x.dtype(), y.dtype()) << name;
    EXPECT_EQ(std::memcmp(x.raw(), y.raw(), x.bytes()), 0) << name << " differs";
  }
}

class FamilyConvertGolden : public ::testing::Test {
 protected:
  /// "gpt-neox" for validation/gpt-neox-golden and make_gpt_neox_golden.py.
  virtual std::string family() const = 0;

  void SetUp() override {
    dir = std::filesystem::temp_directory_path() /
          ("meshtron_" + family() + "_golden_" + std::to_string(getpid()));
    std::filesystem::remove_all(dir);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }

  std::string golden() const { return golden_folder(family()); }
  std::string golden_sharded() const { return golden() + "-sharded"; }
  /// The Hugging Face folder the round trip exported.
  std::string exported() const { return (dir / "hf").string(); }
  /// The checkpoint file the round trip wrote.
  std::string checkpoint() const { return (dir / "ckpt" / io::checkpoint_file_name(0)).string(); }

  /// convert --from hf `model` --to CKPT, then --to hf exported().
  void round_trip(const std::string& model) {
    EXPECT_EQ(app::run_convert({"--from", "hf", model, "--to", (dir / "ckpt").string()}), 0);
    EXPECT_EQ(app::run_convert({"--from", checkpoint(), "--to", "hf", exported()}), 0);
  }

  /// The whole golden model's round trip gives its tensors bit for bit.
  void round_trip_golden() {
    ASSERT_TRUE(std::filesystem::exists(golden() + "/model.safetensors"))
        << golden() << ": " << how_to_make_golden(family());
    round_trip(golden());
    expect_same_tensors(io::HfWeights(golden()), io::HfWeights(exported()));
  }

  /// The sharded golden model's round trip gives the whole model's tensors.
  void expect_sharded_golden_loads_as_the_whole_one() {
    ASSERT_TRUE(std::filesystem::exists(golden_sharded() + "/model.safetensors.index.json"))
        << golden_sharded() << ": " << how_to_make_golden(family());
    round_trip(golden_sharded());
    expect_same_tensors(io::HfWeights(golden()), io::HfWeights(exported()));
  }

  /// The checkpoint's model.deck holds every one of `keys`.
  void expect_deck_holds(std::initializer_list<const char*> keys) const {
    std::ifstream deck(dir / "ckpt" / "model.deck");
    const std::string text((std::istreambuf_iterator<char>(deck)), {});
    for (const char* key : keys)
      EXPECT_NE(text.find(key), std::string::npos) << key << " not in\n" << text;
  }

  std::filesystem::path dir;
};

}  // namespace meshtron::golden
