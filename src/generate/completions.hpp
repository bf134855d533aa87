// The OpenAI completions protocol of `meshtron serve` (POST /v1/completions):
// a request body parsed and validated into a CompletionRequest, the
// serialised form rank 0 broadcasts, and the response objects (whole, or
// server-sent-event chunks for stream = true). No HTTP and no MPI here.
//
//   {"prompt": "Hello" | ["a", "b"] | [15496, 11] | [[1, 2], [3]],
//    "max_tokens": 16, "temperature": 1, "top_p": 1, "top_k": 0, "n": 1,
//    "stop": "\n" | ["\n", "."], "seed": 1234, "logprobs": 0, "stream": false}
//
// Choice i * n + j is the j-th completion of prompt i; it is also the
// sampler's prompt index, so a seeded request gives the same text on every
// layout and every call.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "generate/generator.hpp"
#include "generate/t5_generator.hpp"

namespace meshtron::generate {

/// A request the server answers with 400 and an invalid_request_error.
struct BadRequest : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// What a request may ask for.
struct CompletionLimits {
  /// Positions of the model: prompt + max_tokens for a decoder-only model;
  /// max_tokens alone for an encoder-decoder one (prompt_context > 0).
  std::int64_t context = 0;
  /// Encoder-decoder: a prompt's most tokens (the encoder's input); 0: the
  /// prompt shares `context` with the completion.
  std::int64_t prompt_context = 0;
  int vocab = 0;             ///< ids of a token-id prompt lie in [0, vocab)
  int max_n = 1;             ///< completions per prompt
  int max_prompts = 1;       ///< prompts per request
  std::uint64_t seed = 0;    ///< the seed of a request that names none
  /// A text prompt's ids; empty: the run has no tokenizer (ids only).
  std::function<std::vector<std::int32_t>(const std::string&)> encode;
};

struct CompletionRequest {
  std::vector<std::vector<std::int32_t>> prompts;
  int max_tokens = 16;  ///< OpenAI's default
  double temperature = 1.0;  ///< 0 = greedy
  double top_p = 1.0;
  int top_k = 0;  ///< an extension of OpenAI's fields; 0 = off
  int n = 1;
  std::vector<std::string> stop;
  std::uint64_t seed = 0;
  std::optional<int> logprobs;  ///< set: each token's log-probability in the answer
  bool stream = false;
};

/// The model a server answers with, the one place the completions reach a
/// generator: a decoder-only Generator (the completion continues the
/// prompt) or T5's (the prompt is the encoder's input, the completion the
/// decoder's output, without the prompt).
class CompletionModel {
 public:
  virtual ~CompletionModel() = default;
  /// `l` with the positions a request may use (context, prompt_context).
  virtual void set_positions(CompletionLimits& l) const = 0;
  /// Collective over the replica; every rank passes the same batch and
  /// gets the same results.
  virtual std::vector<Result> generate(const std::vector<Request>& batch, const GenerateParams& p,
                                       const TokenCallback& on_token) = 0;
};

class DecoderCompletions final : public CompletionModel {
 public:
  explicit DecoderCompletions(Generator& g) : g_(g) {}
  void set_positions(CompletionLimits& l) const override;
  std::vector<Result> generate(const std::vector<Request>& batch, const GenerateParams& p,
                               const TokenCallback& on_token) override;

 private:
  Generator& g_;  ///< Not owned.
};

class T5Completions final : public CompletionModel {
 public:
  /// `encoder_positions`: a prompt's most tokens (the encoder's
  /// seq_length); `decoder_positions`: max_tokens' bound (the decoder's).
  T5Completions(T5Generator& g, index_t encoder_positions, index_t decoder_positions)
      : g_(g), encoder_positions_(encoder_positions), decoder_positions_(decoder_positions) {}
  void set_positions(CompletionLimits& l) const override;
  std::vector<Result> generate(const std::vector<Request>& batch, const GenerateParams& p,
                               const TokenCallback& on_token) override;

 private:
  T5Generator& g_;  ///< Not owned.
  index_t encoder_positions_, decoder_positions_;
};

/// The request of an HTTP body; BadRequest names the first offending field.
CompletionRequest parse_completion_request(const std::string& body, const CompletionLimits& limits);
/// The serialised request (what rank 0 broadcasts) and back.
nlohmann::json to_json(const CompletionRequest& r);
CompletionRequest completion_request_from_json(const nlohmann::json& j);

/// The Generator's batch: choice i * n + j is prompt i.
std::vector<Request> completion_batch(const CompletionRequest& r);
/// `base` (the deck's stop ids) with the request's decoding settings; stop
/// strings are the caller's (they need the tokenizer).
GenerateParams completion_params(const CompletionRequest& r, GenerateParams base);

/// `text` up to the first occurrence of any of `stop` (OpenAI strips it).
std::string cut_at_stop(const std::string& text, const std::vector<std::string>& stop);

/// The text a stream may send so far: holds back a tail that could still
/// become a stop string, and an unfinished UTF-8 character.
class StreamText {
 public:
  explicit StreamText(std::vector<std::string> stop) : stop_(std::move(stop)) {}
  /// The new text to send, given the whole text generated so far.
  std::string next(const std::string& text);
  /// The rest of the final text (cut at a stop string).
  std::string finish(const std::string& text);

 private:
  std::vector<std::string> stop_;
  std::size_t sent_ = 0;
};

/// The id, creation time and model name every object of a response shares.
struct CompletionHeader {
  std::string id;
  std::int64_t created = 0;
  std::string model;
};
/// A choice's text and tokens as the answer shows them.
struct ChoiceText {
  std::string text;
  std::vector<std::string> tokens;  ///< one string per generated id (logprobs)
};

/// {"id", "object": "text_completion", "created", "model", "choices", "usage"}.
nlohmann::json completion_response(const CompletionHeader& h, const CompletionRequest& r,
                                   const std::vector<Result>& results,
                                   const std::vector<ChoiceText>& texts);
/// One server-sent-event chunk: "data: {...}\n\n" with one choice's text;
/// `finish_reason` empty: null.
std::string completion_chunk(const CompletionHeader& h, std::int64_t index,
                             const std::string& text, const std::string& finish_reason);
/// {"error": {"message", "type": "invalid_request_error" | ..., "param": null, "code": null}}.
nlohmann::json error_body(const std::string& message,
                          const std::string& type = "invalid_request_error");

}  // namespace meshtron::generate
