#include "data/bert_tokenizer.hpp"

#include <utf8proc.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/error.hpp"
#include "data/gpt2_tokenizer.hpp"  // is_valid_utf8

namespace meshtron::data {

namespace {

using CodePoints = std::vector<int32_t>;

/// transformers' BertTokenizer (and WordPiece of the tokenizers library);
/// Megatron's copy of Google's tokenization.py allows 200.
constexpr std::size_t kMaxCharsPerWord = 100;

CodePoints decode_utf8(std::string_view text) {
  CodePoints out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  utf8proc_ssize_t left = utf8proc_ssize_t(text.size());
  while (left > 0) {
    utf8proc_int32_t cp = 0;
    utf8proc_ssize_t n = utf8proc_iterate(p, left, &cp);
    if (n <= 0) {  // an invalid byte reads as U+FFFD, which cleaning drops
      cp = 0xFFFD;
      n = 1;
    }
    out.push_back(cp);
    p += n;
    left -= n;
  }
  return out;
}

std::string encode_utf8(const CodePoints& cps) {
  std::string out;
  utf8proc_uint8_t buffer[4];
  for (const int32_t cp : cps) {
    const utf8proc_ssize_t n = utf8proc_encode_char(cp, buffer);
    out.append(reinterpret_cast<const char*>(buffer), std::size_t(n));
  }
  return out;
}

utf8proc_category_t category(int32_t cp) { return utf8proc_category(cp); }

/// transformers' _is_control: category C* except \t \n \r.
bool is_control(int32_t cp) {
  if (cp == '\t' || cp == '\n' || cp == '\r') return false;
  switch (category(cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CS: return true;
    default: return false;
  }
}

/// _is_whitespace (space, \t \n \r, Zs) plus Zl and Zp, on which the Python
/// tokenizers' str.split() also splits.
bool is_whitespace(int32_t cp) {
  if (cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r') return true;
  const utf8proc_category_t c = category(cp);
  return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

/// The CJK Unified Ideographs blocks of Google's _is_chinese_char (not
/// Hiragana, Katakana or Hangul, which are written with spaces).
bool is_cjk(int32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

/// All non-letter, non-digit ASCII, and Unicode P*.
bool is_punctuation(int32_t cp) {
  if ((cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
      (cp >= 123 && cp <= 126))
    return true;
  switch (category(cp)) {
    case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE: case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO: return true;
    default: return false;
  }
}

// --- lowercasing as Python's str.lower() and JavaScript's toLowerCase() ---
// utf8proc has the simple case mappings; the full ones differ only for
// U+0130 (whose extra U+0307 the accent stripping removes anyway) and for
// the context-dependent final sigma, written out below (Unicode 3.13,
// Final_Sigma).

bool is_cased(int32_t cp) {
  const utf8proc_category_t c = category(cp);
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT ||
         utf8proc_tolower(cp) != cp || utf8proc_toupper(cp) != cp;
}

bool is_case_ignorable(int32_t cp) {
  switch (category(cp)) {
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_SK: return true;
    default: break;
  }
  // Word_Break MidLetter, MidNumLet and Single_Quote.
  switch (cp) {
    case 0x27: case 0x2E: case 0x3A: case 0xB7: case 0x387: case 0x5F4: case 0x2018:
    case 0x2019: case 0x2024: case 0x2027: case 0xFE13: case 0xFE52: case 0xFE55:
    case 0xFF07: case 0xFF0E: case 0xFF1A: return true;
    default: return false;
  }
}

/// Whether the capital sigma at `at` ends a word: a cased letter before it
/// and none after it, case-ignorable characters skipped.
bool is_final_sigma(const CodePoints& word, std::size_t at) {
  bool cased_before = false;
  for (std::size_t i = at; i-- > 0;) {
    if (is_case_ignorable(word[i])) continue;
    cased_before = is_cased(word[i]);
    break;
  }
  if (!cased_before) return false;
  for (std::size_t i = at + 1; i < word.size(); ++i) {
    if (is_case_ignorable(word[i])) continue;
    return !is_cased(word[i]);
  }
  return true;
}

CodePoints lowercase(const CodePoints& word) {
  CodePoints out(word.size());
  for (std::size_t i = 0; i < word.size(); ++i)
    out[i] = word[i] == 0x03A3 && is_final_sigma(word, i) ? 0x03C2 : utf8proc_tolower(word[i]);
  return out;
}

/// NFD, then every nonspacing mark (Mn) dropped.
CodePoints strip_accents(const CodePoints& word) {
  const std::string utf8 = encode_utf8(word);
  utf8proc_uint8_t* decomposed = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(utf8.data()),
                   utf8proc_ssize_t(utf8.size()), &decomposed, UTF8PROC_DECOMPOSE);
  MESH_VERIFY(n >= 0, "utf8proc_map: " << utf8proc_errmsg(n));
  CodePoints out;
  for (const int32_t cp : decode_utf8({reinterpret_cast<const char*>(decomposed), std::size_t(n)}))
    if (category(cp) != UTF8PROC_CATEGORY_MN) out.push_back(cp);
  std::free(decomposed);
  return out;
}

/// Each punctuation character becomes a word of its own.
void split_on_punctuation(const CodePoints& word, std::vector<std::string>& out) {
  CodePoints run;
  for (const int32_t cp : word) {
    if (!is_punctuation(cp)) {
      run.push_back(cp);
      continue;
    }
    if (!run.empty()) out.push_back(encode_utf8(run));
    run.clear();
    out.push_back(encode_utf8({cp}));
  }
  if (!run.empty()) out.push_back(encode_utf8(run));
}

/// Cleaned text cut at white space, CJK ideographs standing alone.
std::vector<CodePoints> whitespace_words(std::string_view text) {
  std::vector<CodePoints> words(1);
  auto cut = [&] {
    if (!words.back().empty()) words.emplace_back();
  };
  for (const int32_t cp : decode_utf8(text)) {
    if (cp == 0 || cp == 0xFFFD || is_control(cp)) continue;
    if (is_whitespace(cp)) {
      cut();
    } else if (is_cjk(cp)) {
      cut();
      words.back().push_back(cp);
      cut();
    } else {
      words.back().push_back(cp);
    }
  }
  if (words.back().empty()) words.pop_back();
  return words;
}

/// Byte offset of each code point of valid UTF-8 `word`, and its size last.
std::vector<std::size_t> code_point_offsets(const std::string& word) {
  std::vector<std::size_t> offsets;
  for (std::size_t i = 0; i < word.size(); ++i)
    if ((static_cast<unsigned char>(word[i]) & 0xC0) != 0x80) offsets.push_back(i);
  offsets.push_back(word.size());
  return offsets;
}

}  // namespace

BertWordPieceTokenizer::BertWordPieceTokenizer(const std::string& vocab_path, bool lower_case)
    : path_(vocab_path), lower_case_(lower_case) {
  std::ifstream in(vocab_path, std::ios::binary);
  MESH_REQUIRE(std::filesystem::is_regular_file(vocab_path) && in,
               "cannot open BERT vocabulary '" << vocab_path << "'");
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    MESH_REQUIRE(!line.empty(), "BERT vocabulary '" << vocab_path << "' line " << number
                                                    << " is empty (one token per line)");
    MESH_REQUIRE(is_valid_utf8(line),
                 "BERT vocabulary '" << vocab_path << "' line " << number << " is not UTF-8");
    const bool inserted = ids_.emplace(line, int32_t(tokens_.size())).second;
    MESH_REQUIRE(inserted, "BERT vocabulary '" << vocab_path << "' line " << number
                                               << " repeats the token '" << line << "'");
    tokens_.push_back(line);
  }
  MESH_REQUIRE(!tokens_.empty(), "BERT vocabulary '" << vocab_path << "' is empty");
  special_.cls = required_id("[CLS]");
  special_.sep = required_id("[SEP]");
  special_.mask = required_id("[MASK]");
  special_.pad = required_id("[PAD]");
  special_.unk = required_id("[UNK]");
  special_.bos = id_or_append("[BOS]");
  special_.eos = id_or_append("[EOS]");
}

int32_t BertWordPieceTokenizer::required_id(const std::string& token) const {
  const auto it = ids_.find(token);
  MESH_REQUIRE(it != ids_.end(), "BERT vocabulary '" << path_ << "' has no " << token
                                                     << " token");
  return it->second;
}

int32_t BertWordPieceTokenizer::id_or_append(const std::string& token) {
  const auto [it, inserted] = ids_.emplace(token, int32_t(tokens_.size()));
  if (inserted) tokens_.push_back(token);
  return it->second;
}

std::vector<std::string> BertWordPieceTokenizer::basic_tokens(std::string_view text) const {
  std::vector<std::string> out;
  for (const CodePoints& word : whitespace_words(text))
    split_on_punctuation(lower_case_ ? strip_accents(lowercase(word)) : word, out);
  return out;
}

void BertWordPieceTokenizer::wordpiece_append(const std::string& word,
                                              std::vector<int32_t>& ids) const {
  const std::vector<std::size_t> at = code_point_offsets(word);
  const std::size_t chars = at.size() - 1;
  if (chars > kMaxCharsPerWord) {
    ids.push_back(special_.unk);
    return;
  }
  const std::size_t first = ids.size();
  for (std::size_t start = 0; start < chars;) {
    std::size_t end = chars;
    int32_t id = -1;
    for (; end > start; --end) {
      const std::string piece =
          (start > 0 ? "##" : "") + word.substr(at[start], at[end] - at[start]);
      if (const auto it = ids_.find(piece); it != ids_.end()) {
        id = it->second;
        break;
      }
    }
    if (id < 0) {  // no piece matches: the whole word is unknown
      ids.resize(first);
      ids.push_back(special_.unk);
      return;
    }
    ids.push_back(id);
    start = end;
  }
}

void BertWordPieceTokenizer::encode_append(std::string_view text, std::vector<int32_t>& ids) {
  for (const std::string& word : basic_tokens(text)) wordpiece_append(word, ids);
}

std::string BertWordPieceTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (const int32_t id : ids) {
    MESH_REQUIRE(id >= 0 && id < vocab_size(), "token id " << id << " is outside the vocabulary [0, "
                                                            << vocab_size() << ") of '" << path_
                                                            << "'");
    const std::string& token = tokens_[std::size_t(id)];
    if (token.starts_with("##")) {
      text += token.substr(2);
    } else {
      if (!text.empty()) text += ' ';
      text += token;
    }
  }
  return text;
}

const BertSpecialIds& bert_special_ids(const Tokenizer& tokenizer) {
  const auto* bert = dynamic_cast<const BertWordPieceTokenizer*>(&tokenizer);
  MESH_REQUIRE(bert != nullptr, "tokenizer '" << tokenizer.name()
                                              << "' has no [CLS] [SEP] [MASK] [PAD]: BERT needs "
                                                 "bert_wordpiece_lowercase or bert_wordpiece_cased");
  return bert->special_ids();
}

bool BertWordPieceTokenizer::continues_word(int32_t id) const {
  return tokens_.at(std::size_t(id)).starts_with("##");
}

SpecialTokens bert_masking_tokens(const Tokenizer& tokenizer) {
  const BertSpecialIds& ids = bert_special_ids(tokenizer);
  const auto& bert = dynamic_cast<const BertWordPieceTokenizer&>(tokenizer);
  SpecialTokens s;
  s.cls = ids.cls;
  s.sep = ids.sep;
  s.mask = ids.mask;
  s.pad = ids.pad;
  s.vocab_size = bert.vocab_size();
  s.word_continuation.resize(std::size_t(s.vocab_size));
  for (int32_t id = 0; id < bert.vocab_size(); ++id)
    s.word_continuation[std::size_t(id)] = bert.continues_word(id) ? 1 : 0;
  return s;
}

}  // namespace meshtron::data
