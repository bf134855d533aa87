// The rule-based sentence splitter of preprocess --split-sentences.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/sentence_splitter.hpp"

using meshtron::data::split_sentences;
using Sentences = std::vector<std::string>;

TEST(SentenceSplitter, EndsAtTerminalPunctuationBeforeACapital) {
  EXPECT_EQ(split_sentences("It rained. We stayed in! Did you? 3 left."),
            (Sentences{"It rained.", "We stayed in!", "Did you?", "3 left."}));
  EXPECT_EQ(split_sentences("  One.\n\nTwo.  "), (Sentences{"One.", "Two."}));
  EXPECT_EQ(split_sentences(""), Sentences{});
}

TEST(SentenceSplitter, NotBeforeLowerCaseOrInsideNumbers) {
  EXPECT_EQ(split_sentences("Pi is 3.14 or so. the end"), Sentences{"Pi is 3.14 or so. the end"});
  EXPECT_EQ(split_sentences("Wait... What?! Fine."), (Sentences{"Wait...", "What?!", "Fine."}));
}

TEST(SentenceSplitter, AbbreviationsAndInitialsDoNotEndSentences) {
  EXPECT_EQ(split_sentences("Mr. Brown met Dr. Who, e.g. at St. Paul. J. R. R. Tolkien wrote."),
            (Sentences{"Mr. Brown met Dr. Who, e.g. at St. Paul.", "J. R. R. Tolkien wrote."}));
  EXPECT_EQ(split_sentences("Made in the U.S. Today it is."),
            Sentences{"Made in the U.S. Today it is."});  // documented limitation
}

TEST(SentenceSplitter, ClosingQuotesAndBracketsStayWithTheirSentence) {
  EXPECT_EQ(split_sentences("He said \"Go.\" Then (quietly.) \"Why?\" she asked. \u201CYes.\u201D Ok."),
            (Sentences{"He said \"Go.\"", "Then (quietly.)", "\"Why?\" she asked.",
                       "\u201CYes.\u201D", "Ok."}));
}
