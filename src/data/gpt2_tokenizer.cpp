// GPT-2 byte-level BPE tokenizer; see gpt2_tokenizer.hpp for the contract.
#include "data/gpt2_tokenizer.hpp"

#include <pcre2.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "common/error.hpp"

namespace meshtron::data {

// ================================================================ UTF-8 ===

namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

/// Length of the well-formed UTF-8 sequence starting at s[i], or 0 if the
/// bytes there are ill-formed; `bad_length` then receives the length of the
/// maximal ill-formed subpart (always >= 1), per Unicode table 3-7.
std::size_t utf8_sequence_length(std::string_view s, std::size_t i,
                                 std::size_t& bad_length) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  std::size_t continuation = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    continuation = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    continuation = 2;
    if (lead == 0xE0) lo = 0xA0;  // no overlongs
    if (lead == 0xED) hi = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    continuation = 3;
    if (lead == 0xF0) lo = 0x90;  // no overlongs
    if (lead == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    bad_length = 1;
    return 0;
  }
  for (std::size_t k = 1; k <= continuation; ++k) {
    const bool in_range = i + k < s.size() && byte(i + k) >= lo && byte(i + k) <= hi;
    if (!in_range) {
      bad_length = k;  // the lead and the valid continuations so far
      return 0;
    }
    lo = 0x80;
    hi = 0xBF;
  }
  return continuation + 1;
}

/// Code points of a valid UTF-8 string.
std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  for (std::size_t i = 0; i < s.size();) {
    const auto lead = static_cast<unsigned char>(s[i]);
    const std::size_t len = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
    char32_t cp = len == 1 ? lead : lead & (0x7F >> len);
    for (std::size_t k = 1; k < len && i + k < s.size(); ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out += cp;
    i += len;
  }
  return out;
}

}  // namespace

bool is_valid_utf8(std::string_view text) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t len = utf8_sequence_length(text, i, bad);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::string replace_invalid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t len = utf8_sequence_length(text, i, bad);
    if (len > 0) {
      out.append(text.substr(i, len));
      i += len;
    } else {
      out.append(kReplacementChar);
      i += bad;
    }
  }
  return out;
}

std::array<char32_t, 256> bytes_to_unicode() {
  // Printable Latin-1 bytes stand for themselves; the rest (controls, space,
  // DEL, NBSP, soft hyphen...) get U+0100.. so every token is visible text.
  const auto stands_for_itself = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  std::array<char32_t, 256> map{};
  char32_t next_extra = 0x100;
  for (int b = 0; b < 256; ++b)
    map[b] = stands_for_itself(b) ? static_cast<char32_t>(b) : next_extra++;
  return map;
}

// ========================================================= pre-tokenizer ===

namespace {

// ECMAScript's \s (WhiteSpace + LineTerminator), which the reference
// JavaScript encoder uses; written out because PCRE2's UCP \s differs.
#define MESH_GPT2_SPACE \
  "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}\\x{FEFF}"

constexpr const char kGpt2Pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+"
    "| ?[^" MESH_GPT2_SPACE "\\p{L}\\p{N}]+"
    "|[" MESH_GPT2_SPACE "]+(?![^" MESH_GPT2_SPACE "])"
    "|[" MESH_GPT2_SPACE "]+";

// A tokenizer.json Split regex's \s as the Rust tokenizers (Oniguruma)
// read it, which transformers runs: ECMAScript's set without U+FEFF, a
// format character (Cf) that JavaScript alone counts as space
// (tokenizer_golden: " \uFEFF!" is one pre-token for tokenizers 0.23).
constexpr const char kTokenizerJsonSpace[] =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

#undef MESH_GPT2_SPACE

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof buffer);
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

std::string split_regex_to_pcre2(std::string_view pattern) {
  // transformers.js spells Llama 3's case-insensitive contractions out.
  constexpr std::string_view kCaseless = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
  constexpr std::string_view kExplicit = "(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))";
  std::string out;
  bool in_class = false;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (!in_class && pattern.substr(i).starts_with(kCaseless)) {
      out += kExplicit;
      i += kCaseless.size() - 1;
    } else if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[++i];
      MESH_REQUIRE(!(next == 'S' && in_class),
                   "tokenizer.json Split regex: \\S inside [...] is not supported");
      if (next == 's') {
        out += in_class ? std::string(kTokenizerJsonSpace)
                        : "[" + std::string(kTokenizerJsonSpace) + "]";
      } else if (next == 'S') {
        out += "[^" + std::string(kTokenizerJsonSpace) + "]";
      } else {
        out += '\\';
        out += next;
      }
    } else {
      if (pattern[i] == '[') in_class = true;
      if (pattern[i] == ']' && in_class) in_class = false;
      out += pattern[i];
    }
  }
  return out;
}

struct Gpt2Pretokenizer::Regex {
  pcre2_code* code = nullptr;              // Owned.
  pcre2_match_data* match_data = nullptr;  // Owned; reused by every match.

  explicit Regex(const std::string& pattern) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                         PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    MESH_REQUIRE(code != nullptr, "cannot compile the pre-tokenizer regex '"
                                      << pattern << "' at offset " << offset << ": "
                                      << pcre2_message(error));
    // JIT is an optimisation only: without it (an unsupported CPU or a PCRE2
    // built without JIT) pcre2_match interprets the same pattern.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    match_data = pcre2_match_data_create_from_pattern(code, nullptr);
    MESH_VERIFY(match_data != nullptr, "out of memory creating PCRE2 match data");
  }
  ~Regex() {
    pcre2_match_data_free(match_data);
    pcre2_code_free(code);
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
};

Gpt2Pretokenizer::Gpt2Pretokenizer() : Gpt2Pretokenizer(kGpt2Pattern) {}
Gpt2Pretokenizer::Gpt2Pretokenizer(const std::string& pattern)
    : regex_(std::make_unique<Regex>(pattern)) {}
Gpt2Pretokenizer::~Gpt2Pretokenizer() = default;
Gpt2Pretokenizer::Gpt2Pretokenizer(Gpt2Pretokenizer&&) noexcept = default;
Gpt2Pretokenizer& Gpt2Pretokenizer::operator=(Gpt2Pretokenizer&&) noexcept = default;

bool Gpt2Pretokenizer::next_match(std::string_view utf8, std::size_t start,
                                  std::size_t& begin, std::size_t& end) {
  const int rc = pcre2_match(regex_->code, reinterpret_cast<PCRE2_SPTR>(utf8.data()),
                             utf8.size(), start, PCRE2_NO_UTF_CHECK, regex_->match_data,
                             nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  MESH_VERIFY(rc > 0, "GPT-2 pre-tokenizer regex failed at byte " << start << ": "
                                                                 << pcre2_message(rc));
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(regex_->match_data);
  begin = ovector[0];
  end = ovector[1];
  // Every alternative consumes at least one character, so `end` advances.
  MESH_VERIFY(end > begin, "GPT-2 pre-tokenizer matched an empty word at byte " << begin);
  return true;
}

bool Gpt2Pretokenizer::jit_compiled() const {
  std::size_t jit_size = 0;
  return pcre2_pattern_info(regex_->code, PCRE2_INFO_JITSIZE, &jit_size) == 0 && jit_size > 0;
}

std::vector<std::string_view> Gpt2Pretokenizer::split(std::string_view utf8) {
  std::vector<std::string_view> words;
  for_each_word(utf8, [&](std::string_view w) { words.push_back(w); });
  return words;
}

// ============================================================= tokenizer ===

struct Gpt2Tokenizer::MergeTable {
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  static uint64_t key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  std::unordered_map<uint64_t, Merge> by_pair;
};

struct Gpt2Tokenizer::WordCache {
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> ids_of_word;
};

Gpt2Tokenizer::Gpt2Tokenizer()
    : merges_(std::make_unique<MergeTable>()), cache_(std::make_unique<WordCache>()) {}
Gpt2Tokenizer::~Gpt2Tokenizer() = default;
Gpt2Tokenizer::Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept = default;
Gpt2Tokenizer& Gpt2Tokenizer::operator=(Gpt2Tokenizer&&) noexcept = default;

Gpt2Tokenizer Gpt2Tokenizer::from_openai(const std::string& encoder_json_path,
                                         const std::string& vocab_bpe_path) {
  return load(encoder_json_path, vocab_bpe_path);
}

Gpt2Tokenizer Gpt2Tokenizer::from_huggingface(const std::string& vocab_json_path,
                                              const std::string& merges_txt_path) {
  // Hugging Face's vocab.json / merges.txt for GPT-2 are the same files as
  // OpenAI's encoder.json / vocab.bpe under other names.
  return load(vocab_json_path, merges_txt_path);
}

namespace {

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  MESH_REQUIRE(in.good(), "cannot open GPT-2 " << what << " file '" << path << "'");
  std::ostringstream contents;
  contents << in.rdbuf();
  MESH_REQUIRE(!in.bad(), "cannot read GPT-2 " << what << " file '" << path << "'");
  return std::move(contents).str();
}

/// Raw bytes of a token written in the bytes_to_unicode alphabet, or false
/// if it has a character outside that alphabet.
bool token_to_bytes(std::string_view token, std::string& bytes) {
  static const auto unicode_to_byte = [] {
    std::unordered_map<char32_t, char> inverse;
    const auto map = bytes_to_unicode();
    for (int b = 0; b < 256; ++b) inverse[map[b]] = static_cast<char>(b);
    return inverse;
  }();
  bytes.clear();
  for (char32_t cp : decode_utf8(token)) {
    const auto it = unicode_to_byte.find(cp);
    if (it == unicode_to_byte.end()) return false;
    bytes += it->second;
  }
  return true;
}

}  // namespace

Gpt2Tokenizer::IdOfBytes Gpt2Tokenizer::index_by_bytes(const std::vector<std::string>& tokens) {
  IdOfBytes id_of_bytes;
  id_of_bytes.reserve(tokens.size());
  for (std::size_t id = 0; id < tokens.size(); ++id)
    id_of_bytes.emplace(tokens[id], static_cast<int32_t>(id));
  return id_of_bytes;
}

Gpt2Tokenizer Gpt2Tokenizer::load(const std::string& vocab_path,
                                  const std::string& merges_path) {
  Gpt2Tokenizer tokenizer;
  tokenizer.load_vocab(vocab_path);
  tokenizer.load_merges(merges_path);
  return tokenizer;
}

void Gpt2Tokenizer::load_vocab(const std::string& path) {
  const std::string text = read_file(path, "vocabulary");
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    MESH_REQUIRE(false, "GPT-2 vocabulary file '" << path << "' is not valid JSON: " << e.what());
  }
  MESH_REQUIRE(vocab.is_object() && !vocab.empty(),
               "GPT-2 vocabulary file '" << path << "' is not a JSON object of token -> id");
  set_vocab(vocab, vocab.size(), "GPT-2 vocabulary file '" + path + "'");
  const IdOfBytes id_of_bytes = index_by_bytes(id_to_bytes_);
  const auto eod = id_of_bytes.find("<|endoftext|>");
  MESH_REQUIRE(eod != id_of_bytes.end(),
               "GPT-2 vocabulary file '" << path << "' has no <|endoftext|> token");
  eod_id_ = eod->second;
}

void Gpt2Tokenizer::set_vocab(const nlohmann::json& vocab, std::size_t size,
                              const std::string& where) {
  id_to_bytes_.assign(size, std::string());
  std::vector<bool> seen(size, false);
  std::string bytes;
  for (const auto& [token, id_json] : vocab.items()) {
    MESH_REQUIRE(id_json.is_number_integer() && id_json.get<int64_t>() >= 0 &&
                     id_json.get<int64_t>() < static_cast<int64_t>(size),
                 where << ": token '" << token << "' has id "
                                           << id_json.dump() << ", expected 0.." << size - 1);
    const auto id = id_json.get<int32_t>();
    MESH_REQUIRE(!seen[id], where << ": id " << id
                                                      << " is used twice");
    MESH_REQUIRE(token_to_bytes(token, bytes),
                 where << ": token '" << token
                                           << "' is not in GPT-2's byte alphabet");
    seen[id] = true;
    id_to_bytes_[id] = bytes;
  }
  const auto id_of_bytes = index_by_bytes(id_to_bytes_);
  for (int b = 0; b < 256; ++b) {
    const auto it = id_of_bytes.find(std::string(1, static_cast<char>(b)));
    MESH_REQUIRE(it != id_of_bytes.end(), where << " has no token for byte " << b);
    byte_to_id_[b] = it->second;
  }
}

bool Gpt2Tokenizer::add_merge(std::string_view left, std::string_view right,
                              const IdOfBytes& id_of_bytes) {
  const auto id_of = [&](const std::string& bytes) {
    const auto it = id_of_bytes.find(bytes);
    return it == id_of_bytes.end() ? -1 : it->second;
  };
  std::string left_bytes, right_bytes;
  const bool in_alphabet = token_to_bytes(left, left_bytes) && token_to_bytes(right, right_bytes);
  const int32_t left_id = id_of(left_bytes), right_id = id_of(right_bytes);
  const int32_t merged_id = id_of(left_bytes + right_bytes);
  if (!in_alphabet || left_id < 0 || right_id < 0 || merged_id < 0) return false;
  // A repeated pair takes its later rank, as dict(zip(merges, ranks)) does.
  merges_->by_pair[MergeTable::key(left_id, right_id)] = {merge_count_++, merged_id};
  return true;
}

void Gpt2Tokenizer::load_merges(const std::string& path) {
  const IdOfBytes id_of_bytes = index_by_bytes(id_to_bytes_);
  std::istringstream lines(read_file(path, "merges"));
  std::string line, left, right, extra;
  for (int line_number = 1; std::getline(lines, line); ++line_number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_number == 1 && line.starts_with("#version"))) continue;
    std::istringstream fields(line);
    const bool two_fields = (fields >> left >> right) && !(fields >> extra);
    MESH_REQUIRE(two_fields, "GPT-2 merges file '" << path << "' line " << line_number
                                                   << ": expected two tokens, got '" << line
                                                   << "'");
    MESH_REQUIRE(add_merge(left, right, id_of_bytes),
                 "GPT-2 merges file '" << path << "' line " << line_number << ": merge '" << line
                                       << "' uses a token that is not in the vocabulary");
  }
  MESH_REQUIRE(merge_count_ > 0, "GPT-2 merges file '" << path << "' has no merges");
}

void Gpt2Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& ids) {
  std::string replaced;
  if (!is_valid_utf8(text)) {
    replaced = replace_invalid_utf8(text);
    text = replaced;
  }
  std::size_t piece_start = 0;
  for (std::size_t i = 0; i < text.size() && !added_tokens_.empty(); ++i) {
    const auto found = std::find_if(added_tokens_.begin(), added_tokens_.end(),
                                    [&](const AddedToken& t) {
                                      return text.substr(i).starts_with(t.content);
                                    });
    if (found == added_tokens_.end()) continue;
    encode_piece(text.substr(piece_start, i - piece_start), ids);
    ids.push_back(found->id);
    i += found->content.size() - 1;
    piece_start = i + 1;
  }
  encode_piece(text.substr(piece_start), ids);
}

void Gpt2Tokenizer::keep_whole_words(const IdOfBytes& id_of_bytes) {
  whole_words_ = std::make_unique<WordCache>();
  for (const auto& [bytes, id] : id_of_bytes)
    if (!bytes.empty()) whole_words_->ids_of_word.emplace(bytes, std::vector<int32_t>{id});
}

void Gpt2Tokenizer::encode_piece(std::string_view text, std::vector<int32_t>& ids) {
  if (text.empty()) return;
  std::string prefixed;
  if (add_prefix_space_ && text.front() != ' ') {
    prefixed.reserve(text.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(text);
    text = prefixed;
  }
  if (!split_words_) return encode_word(text, ids);
  pretokenizer_.for_each_word(text, [&](std::string_view word) { encode_word(word, ids); });
}

void Gpt2Tokenizer::encode_word(std::string_view word, std::vector<int32_t>& ids) {
  if (whole_words_) {
    const auto& vocab = whole_words_->ids_of_word;
    if (const auto hit = vocab.find(word); hit != vocab.end()) {
      ids.push_back(hit->second.front());
      return;
    }
  }
  if (word.size() == 1) {
    ids.push_back(byte_to_id_[static_cast<unsigned char>(word[0])]);
    return;
  }
  auto& cache = cache_->ids_of_word;
  if (const auto hit = cache.find(word); hit != cache.end()) {
    ids.insert(ids.end(), hit->second.begin(), hit->second.end());
    return;
  }
  const std::size_t first = ids.size();
  bpe(word, ids);
  // Very long words (runs of spaces, dashes) are rare and would bloat the cache.
  constexpr std::size_t kLongestCachedWord = 256;
  if (word.size() > kLongestCachedWord || cache_limit_ == 0) return;
  if (cache.size() >= cache_limit_) cache.clear();
  cache.emplace(std::string(word), std::vector<int32_t>(ids.begin() + first, ids.end()));
}

// BPE as in OpenAI's encoder.py: in rounds, take the lowest-ranked adjacent
// pair and merge every non-overlapping occurrence of it from left to right.
// Done in O(n log n) with a heap of candidate pairs ordered by (rank, left
// position) and a linked list of symbols: a round pops all candidates of its
// rank in position order; pairs created by a merge wait for the next round,
// so that a low-ranked new pair cannot jump ahead of the current round.
namespace {
struct LaterCandidate {  // heap order: smallest (rank, left) on top
  template <class C>
  bool operator()(const C& a, const C& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  }
};
}  // namespace

bool Gpt2Tokenizer::push_candidate(int32_t left, std::vector<Candidate>& into) const {
  const int32_t right = symbols_[left].next;
  if (right < 0) return false;
  const int32_t left_id = symbols_[left].id, right_id = symbols_[right].id;
  const auto it = merges_->by_pair.find(MergeTable::key(left_id, right_id));
  if (it == merges_->by_pair.end()) return false;
  into.push_back({it->second.rank, left, right, left_id, right_id, it->second.merged_id});
  return true;
}

bool Gpt2Tokenizer::still_adjacent(const Candidate& c) const {
  // Merged symbols get a new (longer) id and absorbed ones id -1, so equal
  // ids and links mean neither side has changed since the pair was queued.
  return symbols_[c.left].id == c.left_id && symbols_[c.left].next == c.right &&
         symbols_[c.right].id == c.right_id;
}

void Gpt2Tokenizer::apply_merge(const Candidate& c) {
  Symbol& left = symbols_[c.left];
  left.id = c.merged_id;
  left.next = symbols_[c.right].next;
  if (left.next >= 0) symbols_[left.next].prev = c.left;
  symbols_[c.right].id = -1;
}

void Gpt2Tokenizer::bpe(std::string_view word, std::vector<int32_t>& ids) {
  const auto n = static_cast<int32_t>(word.size());
  symbols_.resize(n);
  for (int32_t i = 0; i < n; ++i)
    symbols_[i] = {byte_to_id_[static_cast<unsigned char>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
  heap_.clear();
  next_round_.clear();
  for (int32_t i = 0; i + 1 < n; ++i) push_candidate(i, heap_);
  std::make_heap(heap_.begin(), heap_.end(), LaterCandidate{});

  int32_t round_rank = -1;
  while (true) {
    if (heap_.empty() || heap_.front().rank != round_rank) {  // round over
      for (const Candidate& c : next_round_) {
        heap_.push_back(c);
        std::push_heap(heap_.begin(), heap_.end(), LaterCandidate{});
      }
      next_round_.clear();
      if (heap_.empty()) break;
      round_rank = heap_.front().rank;
    }
    std::pop_heap(heap_.begin(), heap_.end(), LaterCandidate{});
    const Candidate c = heap_.back();
    heap_.pop_back();
    if (!still_adjacent(c)) continue;
    apply_merge(c);
    if (symbols_[c.left].prev >= 0) push_candidate(symbols_[c.left].prev, next_round_);
    push_candidate(c.left, next_round_);
  }
  for (int32_t i = 0; i >= 0; i = symbols_[i].next) ids.push_back(symbols_[i].id);
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (int32_t id : ids) text += token_bytes(id);
  return text;
}

const std::string& Gpt2Tokenizer::token_bytes(int32_t id) const {
  MESH_REQUIRE(id >= 0 && id < vocab_size(),
               "GPT-2 token id " << id << " is outside the vocabulary [0, " << vocab_size() << ")");
  return id_to_bytes_[id];
}

std::size_t Gpt2Tokenizer::cache_size() const { return cache_->ids_of_word.size(); }
void Gpt2Tokenizer::clear_cache() { cache_->ids_of_word.clear(); }

void Gpt2Tokenizer::set_cache_limit(std::size_t max_words) {
  cache_limit_ = max_words;
  if (cache_size() > cache_limit_) clear_cache();
}

}  // namespace meshtron::data
