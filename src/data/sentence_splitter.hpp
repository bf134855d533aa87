// A rule-based English sentence splitter for `meshtron preprocess
// --split-sentences` (Megatron-LM's preprocess_data.py uses NLTK's punkt
// there; this needs no model):
//
//   split_sentences("Dr. Smith came. He sat (tired). \"Why?\" she asked.")
//     == {"Dr. Smith came.", "He sat (tired).", "\"Why?\" she asked."}
//
// A sentence ends after a run of . ! ? and any closing quotes or brackets
// (" ' ) ] } and the curly quotes) when white space follows and the next
// character is an upper-case ASCII letter, a digit, an opening quote or
// bracket, or a non-ASCII character. A '.' does not end a sentence after a
// common abbreviation (Mr. Mrs. Dr. Prof. St. vs. etc. e.g. i.e. U.S. Inc.
// No. Fig. ...) or a single capital letter (an initial: "J. R. R. Tolkien").
// Sentences are returned without the white space around them.
//
// Not handled: abbreviations outside the list, an abbreviation that really
// ends a sentence ("... in the U.S. The next ..." stays one sentence), a
// sentence that starts in lower case, non-English punctuation (。！？),
// and line breaks, which never split by themselves.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace meshtron::data {

std::vector<std::string> split_sentences(std::string_view text);

}  // namespace meshtron::data
