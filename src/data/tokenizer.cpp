#include "data/tokenizer.hpp"

#include <filesystem>

#include "common/error.hpp"
#include "data/bert_tokenizer.hpp"
#include "data/gpt2_tokenizer.hpp"
#include "data/sentencepiece_tokenizer.hpp"

namespace meshtron::data {

std::string canonical_tokenizer_type(std::string_view type) {
  if (type == "gpt2" || type == "GPT2" || type == "GPT2BPETokenizer") return "gpt2";
  if (type == "hf") return "hf";
  if (type == "sentencepiece" || type == "Llama2Tokenizer") return "sentencepiece";
  if (type == "bert_wordpiece_lowercase" || type == "BertWordPieceLowerCase")
    return "bert_wordpiece_lowercase";
  if (type == "bert_wordpiece_cased" || type == "BertWordPieceCase") return "bert_wordpiece_cased";
  return "";
}

bool is_bert_wordpiece(std::string_view type) {
  const std::string canonical = canonical_tokenizer_type(type);
  return canonical == "bert_wordpiece_lowercase" || canonical == "bert_wordpiece_cased";
}

bool tokenizer_files_exist(const TokenizerFiles& files) {
  namespace fs = std::filesystem;
  const std::string type = canonical_tokenizer_type(files.type);
  if (type == "hf") return fs::exists(files.tokenizer_file);
  if (type == "sentencepiece") return fs::exists(files.tokenizer_model);
  if (is_bert_wordpiece(type)) return fs::exists(files.vocab_file);
  return fs::exists(files.vocab_file) && fs::exists(files.merge_file);
}

std::unique_ptr<Tokenizer> load_tokenizer(const TokenizerFiles& files) {
  const std::string type = canonical_tokenizer_type(files.type);
  MESH_REQUIRE(files.type != "SentencePieceTokenizer",
               "tokenizer SentencePieceTokenizer (Megatron's, with <CLS> <SEP> <EOD> <MASK> "
               "appended to the vocabulary) is not supported; sentencepiece (Llama2Tokenizer) "
               "reads the same tokenizer.model");
  MESH_REQUIRE(!type.empty(), "unknown tokenizer '" << files.type
                                  << "' (supported: gpt2, hf, sentencepiece, "
                                     "bert_wordpiece_lowercase, bert_wordpiece_cased)");
  if (type == "hf")
    return std::make_unique<Gpt2Tokenizer>(Gpt2Tokenizer::from_tokenizer_json(files.tokenizer_file));
  if (type == "sentencepiece")
    return std::make_unique<SentencePieceTokenizer>(files.tokenizer_model);
  if (is_bert_wordpiece(type))
    return std::make_unique<BertWordPieceTokenizer>(files.vocab_file,
                                                    type == "bert_wordpiece_lowercase");
  return std::make_unique<Gpt2Tokenizer>(Gpt2Tokenizer::from_openai(files.vocab_file, files.merge_file));
}

}  // namespace meshtron::data
