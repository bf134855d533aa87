#include "data/masking.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.hpp"

namespace meshtron::data {

namespace {

using Word = std::vector<std::int64_t>;  // positions of one candidate word

bool continues_word(std::int32_t token, const SpecialTokens& special) {
  const auto& table = special.word_continuation;
  return token >= 0 && std::size_t(token) < table.size() && table[std::size_t(token)] != 0;
}

/// Step 1: candidate words; [CLS] and [SEP] are never candidates.
std::vector<Word> candidate_words(std::span<const std::int32_t> tokens,
                                  const SpecialTokens& special, bool whole_word) {
  std::vector<Word> words;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::int32_t t = tokens[i];
    if (t == special.cls || t == special.sep) continue;
    if (whole_word && continues_word(t, special) && !words.empty())
      words.back().push_back(std::int64_t(i));
    else
      words.push_back({std::int64_t(i)});
  }
  return words;
}

/// numpy's sum of a float64 array (pairwise: eight partial sums once there
/// are eight or more terms), so the N-gram probabilities round as Megatron's.
double numpy_sum(const std::vector<double>& a) {
  if (a.size() < 8) {
    double s = 0.0;
    for (double v : a) s += v;
    return s;
  }
  double r[8];
  for (std::size_t j = 0; j < 8; ++j) r[j] = a[j];
  std::size_t i = 8;
  for (; i + 8 <= a.size(); i += 8)
    for (std::size_t j = 0; j < 8; ++j) r[j] += a[i + j];
  double s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
  for (; i < a.size(); ++i) s += a[i];
  return s;
}

/// P(N) proportional to 1/N, N = 1..max_ngram, normalised twice as Megatron
/// does (once when built, once when restricted to the candidate's N-grams).
std::vector<double> inverse_ngram_probabilities(std::int32_t max_ngram) {
  std::vector<double> p(static_cast<std::size_t>(max_ngram));
  for (std::size_t k = 0; k < p.size(); ++k) p[k] = 1.0 / double(k + 1);
  for (int pass = 0; pass < 2; ++pass) {
    const double sum = numpy_sum(p);
    for (double& v : p) v /= sum;
  }
  return p;
}

std::int64_t draw_ngram_size(const MaskingConfig& config, const std::vector<double>& probs,
                             NumpyLegacyRandom& rng) {
  if (config.geometric)
    return std::min<std::int64_t>(rng.geometric(config.geometric_p), config.max_ngram);
  return rng.choice(probs) + 1;
}

/// The positions of words [first, first + n), clipped at the last word.
std::vector<std::int64_t> ngram_positions(const std::vector<Word>& words, std::size_t first,
                                          std::int64_t n) {
  std::vector<std::int64_t> positions;
  const std::size_t end = std::min(words.size(), first + std::size_t(n));
  for (std::size_t w = first; w < end; ++w)
    positions.insert(positions.end(), words[w].begin(), words[w].end());
  return positions;
}

/// Step 4: what replaces a chosen token.
std::int32_t replacement(std::int32_t original, const SpecialTokens& special,
                         MaskReplacement policy, NumpyLegacyRandom& rng) {
  if (policy == MaskReplacement::MaskOnly) return special.mask;
  if (rng.uniform() < 0.8) return special.mask;
  if (rng.uniform() >= 0.5) return std::int32_t(rng.randint(0, special.vocab_size));
  return original;
}

}  // namespace

void validate_masking(const MaskingConfig& config, const SpecialTokens& special) {
  MESH_REQUIRE(config.probability > 0.0 && config.probability < 1.0,
               "masking: probability=" << config.probability << " outside (0, 1)");
  MESH_REQUIRE(config.max_ngram >= 1, "masking: max_ngram=" << config.max_ngram
               << " must be at least 1");
  MESH_REQUIRE(!config.geometric || (config.geometric_p > 0.0 && config.geometric_p <= 1.0),
               "masking: geometric_p=" << config.geometric_p << " outside (0, 1]");
  MESH_REQUIRE(special.vocab_size > 0 && special.vocab_size <= (std::int64_t(1) << 31),
               "masking: vocab_size=" << special.vocab_size << " outside [1, 2^31]");
  MESH_REQUIRE(special.mask >= 0 && special.mask < special.vocab_size,
               "masking: the [MASK] id " << special.mask << " is outside the vocabulary of "
               << special.vocab_size);
  MESH_REQUIRE(special.word_continuation.empty() ||
                   std::int64_t(special.word_continuation.size()) >= special.vocab_size,
               "masking: the word-continuation table has " << special.word_continuation.size()
               << " entries for a vocabulary of " << special.vocab_size);
}

MaskedPredictions create_masked_predictions(std::span<const std::int32_t> tokens,
                                            std::int64_t target_length,
                                            const SpecialTokens& special,
                                            const MaskingConfig& config,
                                            NumpyLegacyRandom& rng) {
  const std::vector<Word> words = candidate_words(tokens, special, config.whole_word);
  const double budget = std::min(
      config.probability * double(target_length),
      std::max(1.0, std::nearbyint(double(tokens.size()) * config.probability)));
  const std::vector<double> probs = inverse_ngram_probabilities(config.max_ngram);

  std::vector<std::size_t> order(words.size());
  std::iota(order.begin(), order.end(), std::size_t(0));
  rng.shuffle(order.data(), order.size());

  MaskedPredictions out;
  out.tokens.assign(tokens.begin(), tokens.end());
  std::vector<std::uint8_t> masked(tokens.size(), 0);
  std::vector<std::pair<std::int64_t, std::int32_t>> chosen;  // (position, label)
  for (const std::size_t first : order) {
    if (double(chosen.size()) >= budget) break;
    std::int64_t n = draw_ngram_size(config, probs, rng);
    std::vector<std::int64_t> positions;
    bool fits = false;
    while (!fits && n > 0) {
      positions = ngram_positions(words, first, n--);
      fits = budget >= double(chosen.size() + positions.size());
    }
    if (!fits) continue;
    if (std::any_of(positions.begin(), positions.end(),
                    [&](std::int64_t p) { return masked[std::size_t(p)] != 0; }))
      continue;
    MaskedSpan span;
    for (const std::int64_t p : positions) {
      const std::int32_t original = tokens[std::size_t(p)];
      masked[std::size_t(p)] = 1;
      out.tokens[std::size_t(p)] = replacement(original, special, config.replacement, rng);
      chosen.emplace_back(p, original);
      span.positions.push_back(p);
      span.labels.push_back(original);
    }
    out.spans.push_back(std::move(span));
  }

  std::sort(chosen.begin(), chosen.end());
  for (const auto& [p, label] : chosen) {
    out.positions.push_back(p);
    out.labels.push_back(label);
  }
  std::sort(out.spans.begin(), out.spans.end(), [](const MaskedSpan& a, const MaskedSpan& b) {
    return a.positions.front() < b.positions.front();
  });
  return out;
}

}  // namespace meshtron::data
