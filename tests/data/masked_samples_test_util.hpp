// A synthetic sentence dataset and special ids shared by the BERT / T5
// sample-builder tests: ids 0-5 special, 10-499 word starts, 500-899 word
// continuations ("##" pieces), 900-999 T5 sentinels.
#pragma once

#include <memory>
#include <string>

#include "data/masking.hpp"
#include "data_test_util.hpp"

namespace meshtron::data::testing {

inline constexpr std::int32_t kVocab = 1000;
inline constexpr std::int32_t kFirstWord = 10, kFirstContinuation = 500, kFirstSentinel = 900;

inline SpecialTokens test_special_tokens() {
  SpecialTokens s;
  s.pad = 0;
  s.cls = 1;
  s.sep = 2;
  s.mask = 3;
  s.bos = 4;
  s.eos = 5;
  s.vocab_size = kVocab;
  for (std::int32_t id = kFirstSentinel; id < kVocab; ++id) s.sentinels.push_back(id);
  s.word_continuation.assign(std::size_t(kVocab), 0);
  for (std::int32_t id = kFirstContinuation; id < kFirstSentinel; ++id)
    s.word_continuation[std::size_t(id)] = 1;
  return s;
}

/// 120 documents of 1-8 sentences of 3-40 tokens, ids in [10, 900).
inline Documents sentence_documents() {
  return random_sentence_documents(120, 1, 8, 3, 40, kFirstWord, kFirstSentinel, 5);
}

/// sentence_documents() written at `prefix`.
inline std::shared_ptr<const IndexedDataset> write_sentence_dataset(const std::string& prefix) {
  write_documents(prefix, TokenDType::U16, sentence_documents());
  return std::make_shared<IndexedDataset>(prefix);
}

/// The run's sentences concatenated.
inline std::vector<std::int32_t> run_text(const IndexedDataset& data, std::int64_t first,
                                          std::int64_t end) {
  std::vector<std::int32_t> text;
  for (std::int64_t s = first; s < end; ++s) {
    const auto sentence = data.get_int32(s);
    text.insert(text.end(), sentence.begin(), sentence.end());
  }
  return text;
}

}  // namespace meshtron::data::testing
