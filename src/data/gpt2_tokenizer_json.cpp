// Gpt2Tokenizer::from_tokenizer_json: the byte-level BPE subset of Hugging
// Face's tokenizer.json; see gpt2_tokenizer.hpp for what is supported.
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.hpp"
#include "data/gpt2_tokenizer.hpp"

namespace meshtron::data {

namespace {

nlohmann::json parse_tokenizer_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MESH_REQUIRE(in.good(), "cannot open tokenizer file '" << path << "'");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    MESH_REQUIRE(false, "tokenizer file '" << path << "' is not valid JSON: " << e.what());
  }
  return {};
}

/// `field` of `object`, or null when absent.
const nlohmann::json& field_or_null(const nlohmann::json& object, const char* field) {
  static const nlohmann::json null;
  const auto it = object.find(field);
  return it == object.end() ? null : *it;
}

/// Rejects `object.field` unless it is absent, null or equal to `allowed`.
void require_unset(const nlohmann::json& object, const char* field, const nlohmann::json& allowed,
                   const std::string& where, const std::string& prefix) {
  const nlohmann::json& value = field_or_null(object, field);
  MESH_REQUIRE(value.is_null() || value == allowed,
               where << ": " << prefix << field << " = " << value.dump()
                     << " is not supported (byte-level BPE only)");
}

/// Largest id + 1 over the vocabulary and the added tokens.
std::size_t id_count(const nlohmann::json& vocab, const nlohmann::json& added) {
  int64_t largest = -1;
  for (const auto& [token, id] : vocab.items())
    if (id.is_number_integer()) largest = std::max(largest, id.get<int64_t>());
  for (const auto& token : added)
    if (token.is_object() && field_or_null(token, "id").is_number_integer())
      largest = std::max(largest, token["id"].get<int64_t>());
  return static_cast<std::size_t>(largest + 1);
}

}  // namespace

Gpt2Tokenizer Gpt2Tokenizer::from_tokenizer_json(const std::string& path) {
  const nlohmann::json root = parse_tokenizer_json(path);
  const std::string where = "tokenizer file '" + path + "'";
  MESH_REQUIRE(root.is_object(), where << " is not a JSON object");
  require_unset(root, "normalizer", nullptr, where, "");
  const nlohmann::json& model = field_or_null(root, "model");
  MESH_REQUIRE(model.is_object() && field_or_null(model, "type") == "BPE",
               where << ": model.type = " << field_or_null(model, "type").dump()
                     << " is not supported (BPE only)");
  const nlohmann::json& added = field_or_null(root, "added_tokens");
  MESH_REQUIRE(added.is_null() || added.is_array(), where << ": added_tokens is not an array");
  const nlohmann::json& vocab = field_or_null(model, "vocab");
  MESH_REQUIRE(vocab.is_object() && !vocab.empty(),
               where << ": model.vocab is not a JSON object of token -> id");

  Gpt2Tokenizer tokenizer;
  tokenizer.name_ = "hf";
  tokenizer.set_json_model(model, id_count(vocab, added.is_null() ? nlohmann::json::array() : added),
                           where);
  tokenizer.set_json_pre_tokenizer(field_or_null(root, "pre_tokenizer"), where);
  if (!added.is_null()) tokenizer.set_json_added_tokens(added, where);
  return tokenizer;
}

void Gpt2Tokenizer::set_json_model(const nlohmann::json& model, std::size_t size,
                                   const std::string& where) {
  for (const char* field : {"dropout", "unk_token", "continuing_subword_prefix",
                            "end_of_word_suffix"})
    require_unset(model, field, nullptr, where, "model.");
  require_unset(model, "byte_fallback", false, where, "model.");
  set_vocab(model["vocab"], size, where + " model.vocab");

  const nlohmann::json& merges = field_or_null(model, "merges");
  MESH_REQUIRE(merges.is_array() && !merges.empty(), where << ": model.merges is not a list");
  const IdOfBytes id_of_bytes = index_by_bytes(id_to_bytes_);
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const nlohmann::json& merge = merges[i];
    std::string left, right, extra;
    bool two_tokens = false;
    if (merge.is_string()) {  // "a b"
      std::istringstream fields(merge.get<std::string>());
      two_tokens = (fields >> left >> right) && !(fields >> extra);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {  // ["a", "b"]
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
      two_tokens = true;
    }
    MESH_REQUIRE(two_tokens && add_merge(left, right, id_of_bytes),
                 where << ": model.merges[" << i << "] = " << merge.dump()
                       << " is not two tokens of the vocabulary");
  }
  if (field_or_null(model, "ignore_merges") == true) keep_whole_words(id_of_bytes);
}

void Gpt2Tokenizer::set_json_pre_tokenizer(const nlohmann::json& pre, const std::string& where) {
  const auto type_of = [](const nlohmann::json& p) { return field_or_null(p, "type"); };
  const auto set_byte_level = [&](const nlohmann::json& p) {
    add_prefix_space_ = field_or_null(p, "add_prefix_space") == true;
    split_words_ = field_or_null(p, "use_regex") != false;
  };
  if (pre.is_object() && type_of(pre) == "ByteLevel") return set_byte_level(pre);

  const nlohmann::json& steps = pre.is_object() ? field_or_null(pre, "pretokenizers") : pre;
  const bool split_then_byte_level =
      type_of(pre) == "Sequence" && steps.is_array() && steps.size() == 2 &&
      type_of(steps[0]) == "Split" && type_of(steps[1]) == "ByteLevel" &&
      field_or_null(steps[1], "use_regex") == false;
  MESH_REQUIRE(split_then_byte_level,
               where << ": pre_tokenizer " << pre.dump().substr(0, 200)
                     << " is not supported (ByteLevel, or Sequence [Split, ByteLevel(use_regex: false)])");
  const nlohmann::json& split = steps[0];
  const nlohmann::json& regex = field_or_null(field_or_null(split, "pattern"), "Regex");
  MESH_REQUIRE(regex.is_string(), where << ": pre_tokenizer Split.pattern must be a Regex");
  MESH_REQUIRE(field_or_null(split, "behavior") == "Isolated",
               where << ": pre_tokenizer Split.behavior = " << field_or_null(split, "behavior").dump()
                     << " is not supported (Isolated only)");
  require_unset(split, "invert", false, where, "pre_tokenizer Split.");
  pretokenizer_ = Gpt2Pretokenizer(split_regex_to_pcre2(regex.get<std::string>()));
  set_byte_level(steps[1]);
  split_words_ = true;
}

void Gpt2Tokenizer::set_json_added_tokens(const nlohmann::json& added, const std::string& where) {
  for (const nlohmann::json& token : added) {
    const nlohmann::json& content = field_or_null(token, "content");
    const nlohmann::json& id = field_or_null(token, "id");
    MESH_REQUIRE(content.is_string() && !content.get<std::string>().empty() &&
                     id.is_number_integer() && id.get<int64_t>() >= 0 &&
                     id.get<int64_t>() < vocab_size(),
                 where << ": added_tokens entry " << token.dump() << " needs content and id");
    for (const char* flag : {"lstrip", "rstrip", "single_word"})
      require_unset(token, flag, false, where, "added_tokens " + content.dump() + ".");
    added_tokens_.push_back({content.get<std::string>(), id.get<int32_t>()});
    id_to_bytes_[id.get<int32_t>()] = content.get<std::string>();
  }
  // Longest first, so that of two tokens starting at one place the longer wins.
  std::stable_sort(added_tokens_.begin(), added_tokens_.end(),
                   [](const AddedToken& a, const AddedToken& b) {
                     return a.content.size() > b.content.size();
                   });
  for (const char* eod : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"}) {
    const auto it = std::find_if(added_tokens_.begin(), added_tokens_.end(),
                                 [&](const AddedToken& t) { return t.content == eod; });
    if (it != added_tokens_.end()) {
      eod_id_ = it->id;
      return;
    }
  }
}

}  // namespace meshtron::data
