// BERT and T5 samples equal those of Megatron-LM's own sample-building code
// (validation/megatron-samples: same sentences, target length and sample
// index), with meshtron's label convention (-100, not -1, where nothing is
// predicted).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "data/bert_samples.hpp"
#include "data/sentence_samples.hpp"
#include "data/t5_samples.hpp"
#include "masked_samples_test_util.hpp"

namespace meshtron::data {
namespace {

using Ids = std::vector<std::int32_t>;

nlohmann::json golden() {
  std::ifstream in(std::filesystem::path(MESHTRON_SOURCE_DIR) / "validation" /
                   "megatron-samples" / "megatron_samples_golden.json");
  return nlohmann::json::parse(in);
}

/// Megatron's labels with -1 where its loss mask is 0 read as -100.
Ids meshtron_labels(const nlohmann::json& c) {
  Ids labels = c["labels"].get<Ids>();
  const Ids loss = c["loss_mask"].get<Ids>();
  for (std::size_t k = 0; k < labels.size(); ++k)
    if (!loss[k]) labels[k] = kIgnoreLabel;
  return labels;
}

void expect_bert_cases(const nlohmann::json& set) {
  BertSamplesConfig config;
  config.seq_length = set["seq_length"];
  config.seed = set["seed"];
  config.binary_head = set["binary_head"];
  ASSERT_GE(set["cases"].size(), 20u);
  for (const auto& c : set["cases"]) {
    SCOPED_TRACE(c["index"].get<std::int64_t>());
    const BertSample s = make_bert_sample(c["sentences"].get<std::vector<Ids>>(),
                                          c["target_length"], c["index"], config,
                                          testing::test_special_tokens());
    EXPECT_EQ(s.tokens, c["tokens"].get<Ids>());
    EXPECT_EQ(s.token_types, c["token_types"].get<Ids>());
    EXPECT_EQ(s.loss_mask, c["loss_mask"].get<Ids>());
    EXPECT_EQ(s.labels, meshtron_labels(c));
    EXPECT_EQ(s.is_random, c["is_random"].get<int>());
    EXPECT_EQ(int(s.truncated), c["truncated"].get<int>());
  }
}

TEST(MegatronSamplesGolden, BertWithBinaryHeadEqualsMegatron) {
  expect_bert_cases(golden()["bert"]);
}

TEST(MegatronSamplesGolden, BertWithoutBinaryHeadEqualsMegatron) {
  expect_bert_cases(golden()["bert_no_binary_head"]);
}

TEST(MegatronSamplesGolden, T5EqualsMegatron) {
  const auto set = golden()["t5"];
  T5SamplesConfig config;
  config.encoder_seq_length = set["encoder_seq_length"];
  config.decoder_seq_length = set["decoder_seq_length"];
  config.seed = set["seed"];
  config.mean_span_length = set["mean_span_length"];
  ASSERT_GE(set["cases"].size(), 20u);
  for (const auto& c : set["cases"]) {
    SCOPED_TRACE(c["index"].get<std::int64_t>());
    Ids text;
    for (const auto& sentence : c["sentences"]) {
      const Ids ids = sentence.get<Ids>();
      text.insert(text.end(), ids.begin(), ids.end());
    }
    const T5Sample s = make_t5_sample(text, c["target_length"], c["index"], config,
                                      testing::test_special_tokens());
    EXPECT_EQ(s.enc_tokens, c["enc_tokens"].get<Ids>());
    EXPECT_EQ(s.dec_in, c["dec_in"].get<Ids>());
    EXPECT_EQ(s.loss_mask, c["loss_mask"].get<Ids>());
    EXPECT_EQ(s.labels, meshtron_labels(c));
    EXPECT_EQ(s.enc_mask, c["enc_mask"].get<Ids>());
    EXPECT_EQ(s.dec_mask, c["dec_mask"].get<Ids>());
    EXPECT_EQ(int(s.truncated), c["truncated"].get<int>());
  }
}

TEST(MegatronSamplesGolden, SentenceRunsEqualMegatronBuildMapping) {
  const auto set = golden()["mapping"];
  testing::ScratchDir dir("megatron_mapping");
  testing::Documents docs;
  for (const auto& lengths : set["documents"]) {
    docs.emplace_back();
    for (const int n : lengths) docs.back().push_back(Ids(std::size_t(n), 10));
  }
  testing::write_documents(dir / "data", TokenDType::U16, docs);
  const IndexedDataset data(dir / "data");
  ASSERT_GE(set["cases"].size(), 5u);
  for (const auto& c : set["cases"]) {
    SentenceRunOptions options;
    options.first_document = c["first_document"];
    options.end_document = c["end_document"];
    options.num_samples = c["num_samples"];
    options.max_tokens = c["max_tokens"];
    options.short_seq_prob = c["short_seq_prob"];
    options.seed = c["seed"];
    options.min_sentences = c["min_sentences"];
    std::vector<std::vector<std::int64_t>> runs;
    for (const SentenceRun& r : build_sentence_runs(data, options))
      runs.push_back({r.first, r.end, r.target_length});
    EXPECT_EQ(runs, c["runs"].get<std::vector<std::vector<std::int64_t>>>())
        << "seed " << options.seed << ", max_tokens " << options.max_tokens;
  }
}

}  // namespace
}  // namespace meshtron::data
