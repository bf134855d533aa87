#include "data/sentence_splitter.hpp"

#include <algorithm>
#include <array>
#include <cctype>

namespace meshtron::data {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_terminal(char c) { return c == '.' || c == '!' || c == '?'; }

/// Length of the closing quote or bracket at `at` (curly quotes are 3 UTF-8 bytes), 0 if none.
std::size_t closer_length(std::string_view text, std::size_t at) {
  const char c = text[at];
  if (c == '"' || c == '\'' || c == ')' || c == ']' || c == '}') return 1;
  const std::string_view rest = text.substr(at, 3);
  return rest == "\u201D" || rest == "\u2019" ? 3 : 0;
}

/// Whether a sentence may start at `at`: upper-case ASCII, a digit, an
/// opening quote or bracket, or any non-ASCII character.
bool may_start_sentence(char c) {
  const auto u = static_cast<unsigned char>(c);
  return std::isupper(u) || std::isdigit(u) || c == '"' || c == '\'' || c == '(' || c == '[' ||
         u >= 0x80;
}

/// Words that end in '.' without ending a sentence (compared lowercased,
/// without the final '.').
constexpr std::array<std::string_view, 40> kAbbreviations = {
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "vs", "etc", "e.g", "i.e", "cf",
    "u.s", "u.k", "u.n", "inc", "ltd", "co", "corp", "no", "nos", "fig", "figs", "vol", "pp",
    "gen", "col", "lt", "sgt", "capt", "rev", "gov", "sen", "rep", "jan", "feb", "aug", "sept"};

/// Whether the '.' at `dot` ends an abbreviation or an initial.
bool ends_abbreviation(std::string_view text, std::size_t dot) {
  std::size_t start = dot;
  while (start > 0 && !is_space(text[start - 1]) && text[start - 1] != '(' && text[start - 1] != '"')
    --start;
  const std::string_view word = text.substr(start, dot - start);
  if (word.size() == 1 && std::isupper(static_cast<unsigned char>(word[0]))) return true;
  std::string lower(word);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  return std::find(kAbbreviations.begin(), kAbbreviations.end(), lower) != kAbbreviations.end();
}

/// End (exclusive) of the sentence whose terminal run starts at `at`, or 0
/// when the run does not end a sentence.
std::size_t sentence_end_after(std::string_view text, std::size_t at) {
  std::size_t end = at;
  while (end < text.size() && is_terminal(text[end])) ++end;
  const bool single_dot = end == at + 1 && text[at] == '.';
  while (end < text.size()) {
    const std::size_t n = closer_length(text, end);
    if (n == 0) break;
    end += n;
  }
  std::size_t next = end;
  while (next < text.size() && is_space(text[next])) ++next;
  if (next == end || next == text.size() || !may_start_sentence(text[next])) return 0;
  if (single_dot && ends_abbreviation(text, at)) return 0;
  return end;
}

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

std::vector<std::string> split_sentences(std::string_view text) {
  std::vector<std::string> sentences;
  std::size_t start = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (!is_terminal(text[i])) continue;
    const std::size_t end = sentence_end_after(text, i);
    if (end == 0) {
      while (i + 1 < text.size() && is_terminal(text[i + 1])) ++i;  // past the run
      continue;
    }
    if (const std::string_view s = trimmed(text.substr(start, end - start)); !s.empty())
      sentences.emplace_back(s);
    start = end;
    i = end - 1;
  }
  if (const std::string_view s = trimmed(text.substr(start)); !s.empty()) sentences.emplace_back(s);
  return sentences;
}

}  // namespace meshtron::data
