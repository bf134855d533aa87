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
#include <vector>

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
class Gpt2Pretokenizer {
 public:
  Gpt2Pretokenizer();
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

class Gpt2Tokenizer {
 public:
  /// OpenAI layout: encoder.json (token -> id) and vocab.bpe (merges, with a
  /// "#version" first line). Throws UserError naming the file if it is
  /// missing or malformed.
  static Gpt2Tokenizer from_openai(const std::string& encoder_json_path,
                                   const std::string& vocab_bpe_path);
  /// Hugging Face layout: vocab.json and merges.txt (same contents).
  static Gpt2Tokenizer from_huggingface(const std::string& vocab_json_path,
                                        const std::string& merges_txt_path);

  ~Gpt2Tokenizer();
  Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept;
  Gpt2Tokenizer& operator=(Gpt2Tokenizer&&) noexcept;

  /// Token ids of `text` (arbitrary bytes; invalid UTF-8 becomes U+FFFD).
  std::vector<int32_t> encode(std::string_view text);
  /// Appends the ids of `text` to `ids` (avoids a copy per document).
  void encode_append(std::string_view text, std::vector<int32_t>& ids);

  /// Concatenated bytes of the tokens. Throws UserError on an id outside
  /// [0, vocab_size()). A slice of ids may end inside a UTF-8 character; the
  /// bytes are returned as they are.
  std::string decode(std::span<const int32_t> ids) const;
  /// The bytes of one token.
  const std::string& token_bytes(int32_t id) const;

  /// Number of ids (50257 for GPT-2), before any padding for tensor parallelism.
  int32_t vocab_size() const { return static_cast<int32_t>(id_to_bytes_.size()); }
  /// Id of "<|endoftext|>" (50256 for GPT-2), the document separator.
  int32_t eod_id() const { return eod_id_; }

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
  /// Appends the BPE ids of one pre-token (its UTF-8 bytes).
  void encode_word(std::string_view word, std::vector<int32_t>& ids);
  void bpe(std::string_view word, std::vector<int32_t>& ids);

  std::vector<std::string> id_to_bytes_;
  std::array<int32_t, 256> byte_to_id_{};
  int32_t eod_id_ = -1;
  std::unique_ptr<MergeTable> merges_;  // Owned.
  std::unique_ptr<WordCache> cache_;    // Owned.
  std::size_t cache_limit_ = std::size_t{1} << 20;
  Gpt2Pretokenizer pretokenizer_;

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
    on_word(utf8.substr(begin, end - begin));
    pos = end;
  }
}

}  // namespace meshtron::data
