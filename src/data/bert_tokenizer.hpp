// BERT's WordPiece tokenizer, as Megatron-LM's BertWordPieceLowerCase /
// BertWordPieceCase (Google's tokenization.py, FullBertTokenizer) and
// transformers' BertTokenizer cut text:
//
//   1. basic tokenizer: drop NUL, U+FFFD and control characters (category
//      C* except \t \n \r), turn white space (Zs, Zl, Zp, \t \n \r) into
//      spaces, put spaces around CJK ideographs, split on spaces; the
//      lowercase variant then lowercases each word, decomposes it (NFD) and
//      drops the nonspacing marks (Mn: accents); every word is then split
//      before and after each punctuation character (the ASCII ranges
//      !-/ :-@ [-` {-~ and Unicode P*);
//   2. WordPiece: each piece, if at most 100 code points, is cut greedily
//      into the longest prefix in the vocabulary, then the longest "##"
//      continuation, and so on; a piece that cannot be cut, or a longer one,
//      is the single id of [UNK].
//
//   BertWordPieceTokenizer tok("data/bert-base-uncased-vocab.txt", /*lower_case=*/true);
//   tok.encode("Hello, World!");   // [7592, 1010, 2088, 999]
//   bert_special_ids(tok).cls      // 101
//
// Text is plain text: "[CLS]" written in a document is five pieces, not the
// [CLS] id (as Megatron's tokenizer; transformers' BertTokenizer would keep
// it whole). transformers' slow BertTokenizer composes the text (NFC) first;
// Megatron's tokenizer and the fast (Rust, JavaScript) ones do not, and
// neither does this one: ids differ only for decomposed accents in the cased
// variant.
//
// As Megatron's tokenizer, [BOS] and [EOS] are appended to the vocabulary
// when the file lacks them (vocab_size() is 30524 for bert-base-uncased's
// 30522 lines), and [EOS] is the end-of-document id (--append-eod).
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "data/masking.hpp"
#include "data/tokenizer.hpp"

namespace meshtron::data {

/// The ids of BERT's special tokens, the sample builder's one source for them.
struct BertSpecialIds {
  int32_t cls = -1;   ///< [CLS], first token of every sample
  int32_t sep = -1;   ///< [SEP], after each segment
  int32_t mask = -1;  ///< [MASK], the masked-LM replacement
  int32_t pad = -1;   ///< [PAD], padding up to seq_length
  int32_t unk = -1;   ///< [UNK], a word WordPiece cannot cut
  int32_t bos = -1;   ///< [BOS], appended by Megatron when missing
  int32_t eos = -1;   ///< [EOS], appended by Megatron when missing; the EOD id
};

class BertWordPieceTokenizer final : public Tokenizer {
 public:
  /// Reads `vocab_path` (one token per line, its id the line number from 0).
  /// UserError (one line naming the file) when it is missing, empty, not
  /// UTF-8, has an empty or repeated line, or lacks [UNK] [CLS] [SEP]
  /// [MASK] or [PAD].
  BertWordPieceTokenizer(const std::string& vocab_path, bool lower_case);

  void encode_append(std::string_view text, std::vector<int32_t>& ids) override;
  /// The tokens joined by spaces, "##" continuations glued to the piece
  /// before (Megatron's decode): lowercasing, accents and the spaces around
  /// punctuation are not restored.
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return int32_t(tokens_.size()); }
  /// [EOS], as Megatron's BERT tokenizers.
  int32_t eod_id() const override { return special_.eos; }
  /// -1: Megatron starts no document with [BOS]; samples start with [CLS].
  int32_t bos_id() const override { return -1; }
  std::string name() const override {
    return lower_case_ ? "bert_wordpiece_lowercase" : "bert_wordpiece_cased";
  }

  const BertSpecialIds& special_ids() const { return special_; }
  /// Whether token `id` continues the word before it (a "##" piece).
  bool continues_word(int32_t id) const;
  /// The basic tokenizer's words (step 1), exposed for tests.
  std::vector<std::string> basic_tokens(std::string_view text) const;

 private:
  void wordpiece_append(const std::string& word, std::vector<int32_t>& ids) const;
  int32_t required_id(const std::string& token) const;
  int32_t id_or_append(const std::string& token);

  std::string path_;  ///< for messages
  bool lower_case_;
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t> ids_;
  BertSpecialIds special_;
};

/// The special ids of `tokenizer`; UserError when it is not a BERT WordPiece
/// tokenizer (data.tokenizer must be bert_wordpiece_lowercase or _cased).
const BertSpecialIds& bert_special_ids(const Tokenizer& tokenizer);

/// What the BERT sample builder needs of `tokenizer` (bert_special_ids'
/// UserError otherwise): its special ids, vocabulary and "##" pieces
/// (whole-word masking).
SpecialTokens bert_masking_tokens(const Tokenizer& tokenizer);

}  // namespace meshtron::data
