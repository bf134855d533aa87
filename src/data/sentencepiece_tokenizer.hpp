// A SentencePiece model (Llama 2's, Mistral's tokenizer.model) through
// libsentencepiece, used as Megatron-LM's Llama2Tokenizer uses it: ids are
// those of SentencePieceProcessor::Encode, <s> starts every document
// (bos_id()) and </s> ends it (eod_id()).
//
//   SentencePieceTokenizer tok("validation/sentencepiece-brown/tokenizer.model");
//   tok.encode("Hello world");  // the ids of `spm_encode --output_format=id`
//
// decode() gives the text back for a model with identity normalization (as
// Llama 2's): Encode keeps every byte (byte fallback for pieces not in the
// vocabulary) and the one dummy-prefix space it adds is removed again.
// Invalid UTF-8 is encoded as U+FFFD per bad byte, as the library does.
#pragma once

#include <memory>

#include "data/tokenizer.hpp"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace meshtron::data {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  /// Loads `model_path`; UserError (one line) if it is missing or not a
  /// SentencePiece model.
  explicit SentencePieceTokenizer(const std::string& model_path);
  ~SentencePieceTokenizer() override;

  void encode_append(std::string_view text, std::vector<int32_t>& ids) override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override;
  /// The model's </s> (-1 when it has none).
  int32_t eod_id() const override;
  /// The model's <s> (-1 when it has none).
  int32_t bos_id() const override;
  std::string name() const override { return "sentencepiece"; }
  /// The id of `piece` (as the model spells it, e.g. "<extra_id_0>"), or -1
  /// when the model has no such piece.
  int32_t piece_id(const std::string& piece) const;
  /// The model's <pad> (-1 when it has none) and <unk> (-1 when none).
  int32_t pad_id() const;
  int32_t unk_id() const;

 private:
  std::string path_;  ///< for messages
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;  // Owned.
};

}  // namespace meshtron::data
