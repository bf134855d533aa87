// numpy's legacy RandomState re-implemented (src/data/numpy_random.hpp)
// against numpy's own draws (validation/numpy-random).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "data/numpy_random.hpp"

namespace meshtron::data {
namespace {

nlohmann::json golden() {
  std::ifstream in(std::filesystem::path(MESHTRON_SOURCE_DIR) / "validation" / "numpy-random" /
                   "numpy_random_golden.json");
  return nlohmann::json::parse(in);
}

template <class Draw>
void expect_draws(const nlohmann::json& c, const char* key, Draw draw) {
  NumpyLegacyRandom rng(c["seed"].get<std::uint32_t>());
  for (const auto& expected : c[key]) {
    SCOPED_TRACE(key);
    if (expected.is_number_float())
      EXPECT_EQ(draw(rng), expected.get<double>());  // bit for bit
    else
      EXPECT_EQ(draw(rng), expected.get<std::int64_t>());
  }
}

TEST(NumpyRandom, DrawsEqualNumpyLegacyRandomState) {
  const auto cases = golden()["cases"];
  ASSERT_GE(cases.size(), 5u);
  const double inverse_n[3] = {6.0 / 11.0, 3.0 / 11.0, 2.0 / 11.0};
  for (const auto& c : cases) {
    SCOPED_TRACE(c["seed"].get<std::uint64_t>());
    expect_draws(c, "uniform", [](NumpyLegacyRandom& r) { return r.uniform(); });
    expect_draws(c, "randint_0_30522", [](NumpyLegacyRandom& r) { return r.randint(0, 30522); });
    expect_draws(c, "randint_1_7", [](NumpyLegacyRandom& r) { return r.randint(1, 7); });
    expect_draws(c, "geometric_0.2", [](NumpyLegacyRandom& r) { return r.geometric(0.2); });
    expect_draws(c, "geometric_1/3", [](NumpyLegacyRandom& r) { return r.geometric(1.0 / 3.0); });
    expect_draws(c, "geometric_0.5", [](NumpyLegacyRandom& r) { return r.geometric(0.5); });
    expect_draws(c, "choice_inverse_n3",
                 [&](NumpyLegacyRandom& r) { return r.choice(inverse_n); });
    std::vector<int> items(25);
    std::iota(items.begin(), items.end(), 0);
    NumpyLegacyRandom rng(c["seed"].get<std::uint32_t>());
    rng.shuffle(items.data(), items.size());
    EXPECT_EQ(items, c["shuffle_25"].get<std::vector<int>>());
  }
}

}  // namespace
}  // namespace meshtron::data
