// The completions protocol without a server (generate/completions.hpp):
// request validation, stop strings cut as OpenAI does, stream pieces that
// join to the whole text.
#include <gtest/gtest.h>

#include "generate/completions.hpp"

using namespace meshtron::generate;

namespace {

CompletionLimits limits() {
  CompletionLimits l;
  l.context = 32;
  l.vocab = 100;
  l.max_n = 4;
  l.max_prompts = 2;
  l.seed = 5;
  return l;
}

void expect_bad(const std::string& body, const std::string& words) {
  try {
    parse_completion_request(body, limits());
    ADD_FAILURE() << "accepted " << body;
  } catch (const BadRequest& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Completions, ParsesTokenPromptsAndDefaults) {
  const auto r = parse_completion_request(R"({"prompt": [[1, 2], [3]], "n": 2, "model": "x"})", limits());
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.max_tokens, 16);
  EXPECT_EQ(r.seed, 5u);
  const auto batch = completion_batch(r);
  ASSERT_EQ(batch.size(), 4u);
  EXPECT_EQ(batch[3].index, 3);
  EXPECT_EQ(batch[3].prompt, std::vector<std::int32_t>{3});
  const auto back = completion_request_from_json(to_json(r));
  EXPECT_EQ(back.prompts, r.prompts);
  EXPECT_EQ(back.n, 2);
}

TEST(Completions, RejectsBadRequests) {
  expect_bad("{\"prompt\": ", "not valid JSON");
  expect_bad(R"({"prompt": "text"})", "tokenizer");
  expect_bad(R"({"prompt": [1, 100]})", "token id 100");
  expect_bad(R"({"prompt": [1], "max_tokens": 0})", "'max_tokens' = 0");
  expect_bad(R"({"prompt": [1], "max_tokens": 32})", "maximum context length is 32");
  expect_bad(R"({"prompt": [1], "n": 5})", "'n' = 5");
  expect_bad(R"({"prompt": [1], "temperature": "hot"})", "must be a number");
  expect_bad(R"({"prompt": [1], "echo": true})", "echo");
  expect_bad(R"({"prompt": [1], "colour": 1})", "unrecognized request argument");
  expect_bad(R"({"prompt": [[1], [2], [3]]})", "at most 2");
}

// T5: the prompt fills the encoder's positions, max_tokens the decoder's;
// the two do not add up.
TEST(Completions, EncoderDecoderBoundsPromptAndCompletionApart) {
  CompletionLimits l = limits();
  l.context = 8;
  l.prompt_context = 16;
  const std::vector<std::int32_t> sixteen(16, 7);
  const auto r = parse_completion_request(
      nlohmann::json{{"prompt", sixteen}, {"max_tokens", 8}}.dump(), l);
  EXPECT_EQ(r.prompts.front().size(), 16u);
  const auto bad = [&](const nlohmann::json& body, const std::string& words) {
    try {
      parse_completion_request(body.dump(), l);
      ADD_FAILURE() << "accepted " << body.dump();
    } catch (const BadRequest& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  bad({{"prompt", std::vector<std::int32_t>(17, 7)}, {"max_tokens", 1}},
      "encoder takes at most 16 tokens, however your prompt has 17");
  bad({{"prompt", sixteen}, {"max_tokens", 9}}, "'max_tokens' = 9 is not in [1, 8]");
  bad({{"prompt", sixteen}}, "decoder gives at most 8 tokens, however you requested 16");
}

TEST(Completions, StopStringsAreCut) {
  EXPECT_EQ(cut_at_stop("one. two\n", {"\n", "."}), "one");
  EXPECT_EQ(cut_at_stop("one", {"x"}), "one");
}

TEST(Completions, StreamHoldsBackStopPrefixesAndPartialCharacters) {
  StreamText s({"END"});
  std::string sent = s.next("ab");
  EXPECT_EQ(sent, "ab");
  EXPECT_EQ(s.next("abcE"), "c");        // "E" may start END
  EXPECT_EQ(s.next("abcEN"), "");        // still may
  EXPECT_EQ(s.next("abcENx"), "ENx");    // it did not
  EXPECT_EQ(s.next("abcENx\xC3"), "");   // half of "é"
  EXPECT_EQ(s.next("abcENx\xC3\xA9" "END tail"), "\xC3\xA9");
  EXPECT_EQ(s.finish("abcENx\xC3\xA9" "END tail"), "");
  StreamText t({});
  EXPECT_EQ(t.next("hi"), "hi");
  EXPECT_EQ(t.finish("hi there"), " there");
}
