#include "data/tokenizer.hpp"

#include <filesystem>

#include "common/error.hpp"
#include "data/gpt2_tokenizer.hpp"
#include "data/sentencepiece_tokenizer.hpp"

namespace meshtron::data {

std::string canonical_tokenizer_type(std::string_view type) {
  if (type == "gpt2" || type == "GPT2" || type == "GPT2BPETokenizer") return "gpt2";
  if (type == "hf") return "hf";
  if (type == "sentencepiece" || type == "Llama2Tokenizer") return "sentencepiece";
  return "";
}

bool tokenizer_files_exist(const TokenizerFiles& files) {
  namespace fs = std::filesystem;
  const std::string type = canonical_tokenizer_type(files.type);
  if (type == "hf") return fs::exists(files.tokenizer_file);
  if (type == "sentencepiece") return fs::exists(files.tokenizer_model);
  return fs::exists(files.vocab_file) && fs::exists(files.merge_file);
}

std::unique_ptr<Tokenizer> load_tokenizer(const TokenizerFiles& files) {
  const std::string type = canonical_tokenizer_type(files.type);
  MESH_REQUIRE(files.type != "SentencePieceTokenizer",
               "tokenizer SentencePieceTokenizer (Megatron's, with <CLS> <SEP> <EOD> <MASK> "
               "appended to the vocabulary) is not supported; sentencepiece (Llama2Tokenizer) "
               "reads the same tokenizer.model");
  MESH_REQUIRE(!type.empty(), "unknown tokenizer '" << files.type
                                  << "' (supported: gpt2, hf, sentencepiece)");
  if (type == "hf")
    return std::make_unique<Gpt2Tokenizer>(Gpt2Tokenizer::from_tokenizer_json(files.tokenizer_file));
  if (type == "sentencepiece")
    return std::make_unique<SentencePieceTokenizer>(files.tokenizer_model);
  return std::make_unique<Gpt2Tokenizer>(Gpt2Tokenizer::from_openai(files.vocab_file, files.merge_file));
}

}  // namespace meshtron::data
