// The one interface every tokenizer of meshtron implements, and the one
// factory that builds any of them from its type and files.
//
//   auto tok = load_tokenizer({.type = "sentencepiece", .tokenizer_model = "tokenizer.model"});
//   std::vector<int32_t> doc;
//   if (tok->bos_id() >= 0) doc.push_back(tok->bos_id());   // Llama 2: <s>
//   tok->encode_append("Hello world", doc);
//   doc.push_back(tok->eod_id());                           // --append-eod
//   tok->decode(doc) == "Hello world"
//
// Types (and the Megatron-LM --tokenizer-type spellings accepted for them):
//   gpt2           GPT-2 byte BPE from vocab_file + merge_file (GPT2BPETokenizer)
//   hf             a Hugging Face tokenizer.json of byte-level BPE (tokenizer_file)
//   sentencepiece  a SentencePiece model (tokenizer_model) used as Llama 2 and
//                  Mistral use theirs: <s> starts every document, </s> is the
//                  EOD (Llama2Tokenizer)
//   bert_wordpiece_lowercase, bert_wordpiece_cased
//                  BERT's WordPiece from a vocab.txt (vocab_file), lowercased
//                  and accents stripped or not (BertWordPieceLowerCase,
//                  BertWordPieceCase); data/bert_tokenizer.hpp
// Megatron's SentencePieceTokenizer is refused rather than aliased: it gives
// other ids (no <s>, and <CLS> <SEP> <EOD> <MASK> appended past the model's
// vocabulary, for BERT and T5).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace meshtron::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// Appends the ids of `text` (no BOS and no EOD: those are the caller's).
  virtual void encode_append(std::string_view text, std::vector<int32_t>& ids) = 0;
  /// The ids of `text`, as encode_append.
  std::vector<int32_t> encode(std::string_view text) {
    std::vector<int32_t> ids;
    encode_append(text, ids);
    return ids;
  }
  /// The text of `ids`; BOS and EOD ids decode to nothing for SentencePiece.
  /// Throws UserError on an id outside [0, vocab_size()).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;

  /// Number of ids, before any padding for tensor parallelism.
  virtual int32_t vocab_size() const = 0;
  /// The id that ends a document (--append-eod), -1 when there is none.
  virtual int32_t eod_id() const = 0;
  /// The id that starts every document and prompt, -1 when none is used.
  virtual int32_t bos_id() const = 0;
  /// The type it was loaded as (a canonical_tokenizer_type).
  virtual std::string name() const = 0;
};

/// A tokenizer's type and files, as the deck's data section and preprocess's
/// options name them; only the files of `type` are read.
struct TokenizerFiles {
  std::string type;
  std::string vocab_file;       ///< gpt2: encoder.json / vocab.json; bert_*: vocab.txt
  std::string merge_file;       ///< gpt2: vocab.bpe / merges.txt
  std::string tokenizer_file;   ///< hf: tokenizer.json
  std::string tokenizer_model;  ///< sentencepiece: tokenizer.model
};

/// "gpt2", "hf", "sentencepiece", "bert_wordpiece_lowercase" or
/// "bert_wordpiece_cased" for a type or its Megatron-LM alias; "" for an
/// unknown one.
std::string canonical_tokenizer_type(std::string_view type);
/// Whether `type` (or its alias) is one of the two BERT WordPiece types.
bool is_bert_wordpiece(std::string_view type);
/// Whether the files that `type` reads are all on disk.
bool tokenizer_files_exist(const TokenizerFiles& files);

/// Loads the tokenizer; UserError (one line naming the file) when a file is
/// missing or malformed, or the type unknown.
std::unique_ptr<Tokenizer> load_tokenizer(const TokenizerFiles& files);

}  // namespace meshtron::data
