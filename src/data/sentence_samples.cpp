#include "data/sentence_samples.hpp"

#include <cmath>
#include <random>
#include <utility>

#include "common/error.hpp"

namespace meshtron::data {

namespace {

/// Megatron's LONG_SENTENCE_LEN: multi-sentence documents with a longer
/// sentence are left out.
constexpr std::int32_t kLongSentence = 512;

void check_options(const IndexedDataset& data, const SentenceRunOptions& o) {
  MESH_REQUIRE(o.first_document >= 0 && o.first_document <= o.end_document &&
                   o.end_document <= data.num_documents(),
               "sentence samples: documents [" << o.first_document << ", " << o.end_document
               << ") outside the " << data.num_documents() << " documents of "
               << data.prefix());
  MESH_REQUIRE(o.max_tokens > 1, "sentence samples: the sequence length leaves "
               << o.max_tokens << " tokens for text; at least 2 are needed");
  MESH_REQUIRE(o.short_seq_prob >= 0.0 && o.short_seq_prob <= 1.0,
               "sentence samples: short_seq_prob=" << o.short_seq_prob << " outside [0, 1]");
  MESH_REQUIRE(o.min_sentences >= 1, "sentence samples: min_sentences=" << o.min_sentences);
}

class TargetLength {
 public:
  TargetLength(const SentenceRunOptions& o, std::mt19937& engine)
      : max_(o.max_tokens), engine_(engine) {
    if (o.short_seq_prob > 0) ratio_ = std::int32_t(std::round(1.0 / o.short_seq_prob));
  }
  std::int32_t draw() {
    if (ratio_ == 0) return max_;
    const std::uint32_t r = std::uint32_t(engine_());
    if (r % std::uint32_t(ratio_) == 0) return std::int32_t(2 + r % std::uint32_t(max_ - 1));
    return max_;
  }

 private:
  std::int32_t ratio_ = 0;
  std::int32_t max_;
  std::mt19937& engine_;  ///< Not owned.
};

bool has_long_sentence(const IndexedDataset& data, std::int64_t first, std::int64_t end) {
  for (std::int64_t s = first; s < end; ++s)
    if (data.sequence_length(s) > kLongSentence) return true;
  return false;
}

/// Appends the runs of one document for one epoch.
void cut_document(const IndexedDataset& data, std::int64_t first, std::int64_t end,
                  std::int32_t min_sentences, TargetLength& target,
                  std::vector<SentenceRun>& runs) {
  std::int64_t remaining = end - first;
  if (remaining < min_sentences) return;
  if (remaining > 1 && has_long_sentence(data, first, end)) return;
  std::int64_t run_start = first, tokens = 0, sentences = 0;
  std::int32_t goal = target.draw();
  for (std::int64_t s = first; s < end; ++s) {
    tokens += data.sequence_length(s);
    ++sentences;
    --remaining;
    const bool full = tokens >= goal && remaining > 1 && sentences >= min_sentences;
    if (full || remaining == 0) {
      runs.push_back({run_start, s + 1, goal});
      run_start = s + 1;
      goal = target.draw();
      tokens = sentences = 0;
    }
  }
}

}  // namespace

std::vector<SentenceRun> build_sentence_runs(const IndexedDataset& data,
                                             const SentenceRunOptions& o) {
  check_options(data, o);
  std::mt19937 engine(o.seed);
  TargetLength target(o, engine);
  std::vector<SentenceRun> runs;
  do {
    const std::size_t before = runs.size();
    for (std::int64_t d = o.first_document; d < o.end_document; ++d) {
      const auto [first, end] = data.document_sequences(d);
      cut_document(data, first, end, o.min_sentences, target, runs);
    }
    MESH_REQUIRE(runs.size() > before,
                 "sentence samples: no document of " << data.prefix() << " in ["
                 << o.first_document << ", " << o.end_document << ") has "
                 << o.min_sentences << " or more sentences of at most " << kLongSentence
                 << " tokens (was it preprocessed with --split-sentences?)");
  } while (std::int64_t(runs.size()) < o.num_samples);

  std::mt19937_64 shuffle_engine(std::uint64_t(o.seed) + 1);
  for (std::size_t i = runs.size(); i-- > 1;) {
    const std::size_t j = std::size_t(shuffle_engine() % std::uint64_t(i + 1));
    std::swap(runs[i], runs[j]);
  }
  return runs;
}

}  // namespace meshtron::data
