// GPT-2 byte-level BPE tokenizer (the tokenizer of GPT-2, GPT-3 r50k and of
// Megatron-LM's `--tokenizer-type GPT2BPETokenizer`).
//
//   auto tok = Gpt2Tokenizer::from_openai("data/encoder.json", "data/vocab.bpe");
//   std::vector<int32_t> ids = tok.encode("Hello world");   // {15496, 995}
//   std::string text = tok.decode(ids);                     // "Hello world"
//
// Encoding, in three steps:
//  1. Invalid UTF-8 is replaced by U+FFFD (see below).
//  2. The text is split into pre-tokens ("words") by GPT-2's regex
//       's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//     run through PCRE2 in UTF + UCP mode. \s is spelled out as the
//     ECMAScript white-space set (tab, LF, VT, FF, CR, U+0020, U+00A0,
//     U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000, U+FEFF)
//     so that the split equals that of the reference JavaScript encoder
//     (npm gpt-3-encoder); PCRE2's own UCP \s leaves out U+FEFF.
//     \p{L} and \p{N} come from PCRE2's Unicode tables (Unicode 14 in PCRE2
//     10.42); characters assigned in later Unicode versions may split
//     differently from an encoder built on newer tables.
//  3. Each word's UTF-8 bytes start as one token per byte and are merged by
//     the BPE merge rules, lowest rank first, exactly as OpenAI's encoder.py.
//     "<|endoftext|>" inside the text is ordinary text (it is not mapped to
//     eod_id()); append eod_id() yourself between documents.
//
// Invalid UTF-8 (choice): each maximal ill-formed subsequence is replaced by
// one U+FFFD before step 2, following the WHATWG Encoding Standard (the
// "U+FFFD substitution of maximal subparts" of Unicode chapter 3). That is
// what the reference JavaScript encoder sees when node reads a file as UTF-8
// (and what Python's bytes.decode(errors="replace") produces), so a file
// with stray bytes tokenizes identically in both. decode() therefore returns
// the replaced text for such input, not the original bytes.
//
// Merge semantics follow OpenAI's encoder.py (and tiktoken): pairs are
// compared exactly. gpt-3-encoder instead keys its merge table by the joined
// string "first,second", so for 11 GPT-2 merges whose tokens hold a comma a
// different pair with the same joined string (("\",", "\"") for ("\"", ",\""))
// would also match. No input has been found where this changes the ids (the
// Brown corpus, tests/tokenizer/hard_strings.txt, random bytes and all 66,429
// strings of up to 5 characters from  " , ' [ ] } ) .  and space agree with
// the reference); the exact rule is pinned by a test on a small vocabulary.
//
// Hugging Face tokenizer.json (from_tokenizer_json, GPT-NeoX, Llama 3 and
// StarCoder style) uses the same byte alphabet, merge ranks and PCRE2 split,
// with these additions, each as the `tokenizers` library and transformers.js
// apply them:
//  - added_tokens are matched literally (leftmost, longest first) before
//    anything else and emitted as their ids; the text between them is
//    encoded as above, each piece on its own;
//  - pre_tokenizer ByteLevel: GPT-2's regex (use_regex) or the whole piece
//    as one word, after a leading space when add_prefix_space is set and the
//    piece does not start with one; or Sequence [Split(Regex, Isolated),
//    ByteLevel(use_regex = false)]: the Split regex instead of GPT-2's, the
//    text between its matches kept as words too;
//  - model.ignore_merges: a word that is itself in the vocabulary is one id.
// Anything else (a normalizer, another model or pre-tokenizer, byte
// fallback, dropout...) is rejected with a UserError naming the field.
//
// Not thread-safe: encode() reuses a regex match buffer and fills a cache of
// word -> ids. Use one Gpt2Tokenizer per thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "data/tokenizer.hpp"

namespace meshtron::data {

/// GPT-2's bytes_to_unicode(): the printable code point that stands for each
/// byte in encoder.json / vocab.bpe. Bytes '!'..'~', 0xA1..0xAC and
/// 0xAE..0xFF stand for themselves; the other 68 map to U+0100, U+0101, ...
/// in byte order (so the space 0x20 is U+0120 'Ġ').
std::array<char32_t, 256> bytes_to_unicode();

/// `text` with every maximal ill-formed UTF-8 subsequence replaced by U+FFFD
/// (EF BF BD), per the WHATWG decoder. Valid input is returned unchanged.
std::string replace_invalid_utf8(std::string_view text);

/// True if `text` is well-formed UTF-8 (no surrogates, no overlongs, <= U+10FFFF).
bool is_valid_utf8(std::string_view text);

/// GPT-2's pre-tokenizer regex, compiled once (JIT where PCRE2 has it).
/// `pattern` (a tokenizer.json Split regex, written for JavaScript /
/// Oniguruma) in PCRE2 syntax: \\s and \\S become the white-space set of the
/// Rust tokenizers (ECMAScript's without U+FEFF), and Llama 3's (?i:'s|'t|...) its explicit
/// [sS] spelling, as transformers.js rewrites it (so that no Unicode case
/// folding such as U+017F -> 's' applies). Throws UserError on \\S inside [].
std::string split_regex_to_pcre2(std::string_view pattern);

/// A pre-tokenizer regex (GPT-2's by default) compiled once (JIT where PCRE2
/// has it). Text between matches is a word too (HF Split "Isolated"); GPT-2's
/// regex matches every character, so it leaves no such text.
class Gpt2Pretokenizer {
 public:
  Gpt2Pretokenizer();
  /// A PCRE2 pattern (UTF + UCP); throws UserError if it does not compile.
  explicit Gpt2Pretokenizer(const std::string& pattern);
  ~Gpt2Pretokenizer();
  Gpt2Pretokenizer(Gpt2Pretokenizer&&) noexcept;
  Gpt2Pretokenizer& operator=(Gpt2Pretokenizer&&) noexcept;

  /// Calls on_word(std::string_view) for each pre-token of `utf8`, in order.
  /// `utf8` must be valid UTF-8 (it is not checked again here).
  template <class OnWord>
  void for_each_word(std::string_view utf8, OnWord&& on_word);

  /// The pre-tokens of `utf8` (views into it); for tests and tools.
  std::vector<std::string_view> split(std::string_view utf8);

  /// Whether PCRE2 compiled the regex to machine code (else it interprets).
  bool jit_compiled() const;

 private:
  /// Next match at or after `start`; false when there is none.
  bool next_match(std::string_view utf8, std::size_t start, std::size_t& begin,
                  std::size_t& end);

  struct Regex;
  std::unique_ptr<Regex> regex_;  // Owned.
};

class Gpt2Tokenizer final : public Tokenizer {
 public:
  /// OpenAI layout: encoder.json (token -> id) and vocab.bpe (merges, with a
  /// "#version" first line). Throws UserError naming the file if it is
  /// missing or malformed.
  static Gpt2Tokenizer from_openai(const std::string& encoder_json_path,
                                   const std::string& vocab_bpe_path);
  /// Hugging Face layout: vocab.json and merges.txt (same contents).
  static Gpt2Tokenizer from_huggingface(const std::string& vocab_json_path,
                                        const std::string& merges_txt_path);
  /// Hugging Face tokenizer.json of a byte-level BPE model (see the top of
  /// this file). eod_id() is the first of the added tokens <|endoftext|>,
  /// <|end_of_text|>, </s>, <eos>, or -1 when there is none of them.
  static Gpt2Tokenizer from_tokenizer_json(const std::string& path);

  ~Gpt2Tokenizer() override;
  Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept;
  Gpt2Tokenizer& operator=(Gpt2Tokenizer&&) noexcept;

  /// Appends the ids of `text` (arbitrary bytes; invalid UTF-8 becomes U+FFFD).
  void encode_append(std::string_view text, std::vector<int32_t>& ids) override;

  /// Concatenated bytes of the tokens. Throws UserError on an id outside
  /// [0, vocab_size()). A slice of ids may end inside a UTF-8 character; the
  /// bytes are returned as they are.
  std::string decode(std::span<const int32_t> ids) const override;
  /// The bytes of one token.
  const std::string& token_bytes(int32_t id) const;

  /// Number of ids (50257 for GPT-2), before any padding for tensor parallelism.
  int32_t vocab_size() const override { return static_cast<int32_t>(id_to_bytes_.size()); }
  /// Id of "<|endoftext|>" (50256 for GPT-2), the document separator; -1
  /// for a tokenizer.json without one.
  int32_t eod_id() const override { return eod_id_; }
  /// GPT-2 starts documents with no token.
  int32_t bos_id() const override { return -1; }
  /// "gpt2" (encoder.json + vocab.bpe, or vocab.json + merges.txt) or "hf".
  std::string name() const override { return name_; }

  /// Words currently cached. The cache (word -> ids, words up to 256 bytes)
  /// is emptied whenever it would grow past the limit (default 2^20 words,
  /// roughly 100 MB); the cache never changes the ids, only the speed.
  std::size_t cache_size() const;
  void clear_cache();
  void set_cache_limit(std::size_t max_words);

 private:
  struct MergeTable;
  struct WordCache;

  Gpt2Tokenizer();
  static Gpt2Tokenizer load(const std::string& vocab_path,
                            const std::string& merges_path);
  void load_vocab(const std::string& path);
  void load_merges(const std::string& path);
  /// Token ids from a JSON object of token (byte alphabet) -> id in [0, size);
  /// `where` names the source in errors.
  void set_vocab(const nlohmann::json& vocab, std::size_t size, const std::string& where);
  using IdOfBytes = std::unordered_map<std::string, int32_t>;
  /// Token id by token bytes (the first id of bytes that occur twice).
  static IdOfBytes index_by_bytes(const std::vector<std::string>& tokens);
  /// Registers merge `left right` with the next rank; false if one of the
  /// three tokens is not in `id_of_bytes`.
  bool add_merge(std::string_view left, std::string_view right, const IdOfBytes& id_of_bytes);
  // tokenizer.json sections (gpt2_tokenizer_json.cpp).
  void set_json_model(const nlohmann::json& model, std::size_t size, const std::string& where);
  void set_json_pre_tokenizer(const nlohmann::json& pre, const std::string& where);
  void set_json_added_tokens(const nlohmann::json& added, const std::string& where);
  /// Sets ignore_merges: a word that is a token of `id_of_bytes` is one id.
  void keep_whole_words(const IdOfBytes& id_of_bytes);
  /// Encodes text that holds no added token (one piece between them).
  void encode_piece(std::string_view text, std::vector<int32_t>& ids);
  /// Appends the BPE ids of one pre-token (its UTF-8 bytes).
  void encode_word(std::string_view word, std::vector<int32_t>& ids);
  void bpe(std::string_view word, std::vector<int32_t>& ids);

  std::vector<std::string> id_to_bytes_;
  std::array<int32_t, 256> byte_to_id_{};
  int32_t eod_id_ = -1;
  std::string name_ = "gpt2";
  std::unique_ptr<MergeTable> merges_;  // Owned.
  std::unique_ptr<WordCache> cache_;    // Owned.
  std::size_t cache_limit_ = std::size_t{1} << 20;
  Gpt2Pretokenizer pretokenizer_;
  int32_t merge_count_ = 0;

  // tokenizer.json options; the defaults are GPT-2's behaviour.
  struct AddedToken {
    std::string content;
    int32_t id;
  };
  std::vector<AddedToken> added_tokens_;  // longest first
  bool split_words_ = true;               // false: ByteLevel(use_regex = false) alone
  bool add_prefix_space_ = false;
  /// Word bytes -> id of every vocabulary token, when ignore_merges is set.
  std::unique_ptr<WordCache> whole_words_;  // Owned; null unless ignore_merges.

  // Scratch buffers of bpe(), kept to avoid an allocation per word.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  struct Candidate {
    int32_t rank;
    int32_t left;   // symbol indices (= byte offsets of the symbols' starts)
    int32_t right;
    int32_t left_id;
    int32_t right_id;
    int32_t merged_id;
  };
  bool push_candidate(int32_t left, std::vector<Candidate>& into) const;
  bool still_adjacent(const Candidate& c) const;
  void apply_merge(const Candidate& c);
  std::vector<Symbol> symbols_;
  std::vector<Candidate> heap_;
  std::vector<Candidate> next_round_;
};

// ------------------------------------------------------------ inline impl ---

template <class OnWord>
void Gpt2Pretokenizer::for_each_word(std::string_view utf8, OnWord&& on_word) {
  std::size_t pos = 0, begin = 0, end = 0;
  while (pos < utf8.size() && next_match(utf8, pos, begin, end)) {
    if (begin > pos) on_word(utf8.substr(pos, begin - pos));
    on_word(utf8.substr(begin, end - begin));
    pos = end;
  }
  if (pos < utf8.size()) on_word(utf8.substr(pos));
}

}  // namespace meshtron::data
