#include "generate/completions.hpp"

#include <algorithm>
#include <sstream>

namespace meshtron::generate {

using nlohmann::json;

namespace {

[[noreturn]] void bad(const std::string& message) { throw BadRequest(message); }

/// OpenAI's fields that meshtron accepts only at their neutral value.
bool neutral_extra(const std::string& key, const json& v, int n) {
  if (v.is_null()) return true;
  if (key == "presence_penalty" || key == "frequency_penalty") return v.is_number() && v == 0;
  if (key == "best_of") return v.is_number_integer() && v.get<long long>() == n;
  if (key == "logit_bias") return v.is_object() && v.empty();
  if (key == "suffix") return v.is_string() && v.get<std::string>().empty();
  return v.is_string();  // model, user: any name
}

const json* field(const json& body, const char* key) {
  const auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

long long integer(const json& body, const char* key, long long lo, long long hi, long long def) {
  const json* v = field(body, key);
  if (!v) return def;
  if (!v->is_number_integer()) bad(std::string("'") + key + "' must be an integer");
  const long long x = v->is_number_unsigned() && v->get<unsigned long long>() > 1ull << 62
                          ? hi + 1 : v->get<long long>();
  if (x < lo || x > hi)
    bad(std::string("'") + key + "' = " + v->dump() + " is not in [" + std::to_string(lo) + ", " +
        std::to_string(hi) + "]");
  return x;
}

double number(const json& body, const char* key, double lo, bool lo_open, double hi, double def) {
  const json* v = field(body, key);
  if (!v) return def;
  if (!v->is_number()) bad(std::string("'") + key + "' must be a number");
  const double x = v->get<double>();
  if (!(lo_open ? x > lo : x >= lo) || !(x <= hi)) {
    std::ostringstream os;
    os << "'" << key << "' = " << v->dump() << " is not in " << (lo_open ? "(" : "[") << lo
       << ", " << hi << "]";
    bad(os.str());
  }
  return x;
}

bool boolean(const json& body, const char* key) {
  const json* v = field(body, key);
  if (!v) return false;
  if (!v->is_boolean()) bad(std::string("'") + key + "' must be true or false");
  return v->get<bool>();
}

std::vector<std::int32_t> id_prompt(const json& ids, int vocab) {
  std::vector<std::int32_t> out;
  for (const json& v : ids) {
    if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() >= vocab)
      bad("'prompt': token id " + v.dump() + " is not in [0, " + std::to_string(vocab) + ")");
    out.push_back(v.get<std::int32_t>());
  }
  return out;
}

std::vector<std::int32_t> text_prompt(const json& text, const CompletionLimits& limits) {
  if (!limits.encode)
    bad("'prompt': text needs the run's tokenizer (data.tokenizer and its files); send token ids");
  return limits.encode(text.get<std::string>());
}

/// string | [string, ...] | [id, ...] | [[id, ...], ...]
std::vector<std::vector<std::int32_t>> prompts(const json& body, const CompletionLimits& limits) {
  const json* p = field(body, "prompt");
  if (!p) bad("'prompt' is required");
  if (p->is_string()) return {text_prompt(*p, limits)};
  if (!p->is_array() || p->empty()) bad("'prompt' must be a string, a list of strings or token ids");
  const auto all = [&](auto pred) { return std::all_of(p->begin(), p->end(), pred); };
  if (all([](const json& v) { return v.is_number(); })) return {id_prompt(*p, limits.vocab)};
  std::vector<std::vector<std::int32_t>> out;
  if (all([](const json& v) { return v.is_string(); })) {
    for (const json& t : *p) out.push_back(text_prompt(t, limits));
  } else if (all([](const json& v) { return v.is_array(); })) {
    for (const json& ids : *p) out.push_back(id_prompt(ids, limits.vocab));
  } else {
    bad("'prompt' must be a string, a list of strings, a list of token ids or a list of lists");
  }
  return out;
}

std::vector<std::string> stop_strings(const json& body) {
  const json* s = field(body, "stop");
  if (!s) return {};
  std::vector<std::string> out;
  const json list = s->is_array() ? *s : json::array({*s});
  if (list.size() > 4) bad("'stop' holds at most 4 strings");
  for (const json& v : list) {
    if (!v.is_string() || v.get<std::string>().empty())
      bad("'stop' must be a non-empty string or a list of them");
    out.push_back(v.get<std::string>());
  }
  return out;
}

void require_known_fields(const json& body, int n) {
  static const char* kFields[] = {"prompt", "max_tokens", "temperature", "top_p", "top_k", "n",
                                  "stop", "seed", "logprobs", "echo", "stream"};
  static const char* kNeutral[] = {"model", "user", "presence_penalty", "frequency_penalty",
                                   "best_of", "logit_bias", "suffix"};
  for (const auto& [key, value] : body.items()) {
    if (std::find(std::begin(kFields), std::end(kFields), key) != std::end(kFields)) continue;
    if (std::find(std::begin(kNeutral), std::end(kNeutral), key) == std::end(kNeutral))
      bad("unrecognized request argument supplied: '" + key + "'");
    if (!neutral_extra(key, value, n)) bad("'" + key + "' = " + value.dump() + " is not supported");
  }
}

void require_fit(const CompletionRequest& r, const CompletionLimits& limits) {
  if (int(r.prompts.size()) > limits.max_prompts)
    bad("'prompt' holds " + std::to_string(r.prompts.size()) + " prompts; at most " +
        std::to_string(limits.max_prompts) + " (serve.max_prompts)");
  if (!r.stop.empty() && !limits.encode) bad("'stop' strings need the run's tokenizer");
  for (const auto& p : r.prompts) {
    if (p.empty()) bad("'prompt': an empty prompt");
    if (limits.prompt_context > 0) {
      if (std::int64_t(p.size()) > limits.prompt_context)
        bad("this model's encoder takes at most " + std::to_string(limits.prompt_context) +
            " tokens, however your prompt has " + std::to_string(p.size()));
      if (r.max_tokens > limits.context)  // the default 16 is not checked on parsing
        bad("this model's decoder gives at most " + std::to_string(limits.context) +
            " tokens, however you requested " + std::to_string(r.max_tokens));
      continue;
    }
    if (std::int64_t(p.size()) + r.max_tokens > limits.context)
      bad("this model's maximum context length is " + std::to_string(limits.context) +
          " tokens, however you requested " + std::to_string(p.size() + std::size_t(r.max_tokens)) +
          " tokens (" + std::to_string(p.size()) + " in your prompt; " +
          std::to_string(r.max_tokens) + " for the completion)");
  }
}

}  // namespace

void DecoderCompletions::set_positions(CompletionLimits& l) const {
  l.context = g_.context_length();
  l.prompt_context = 0;
}

std::vector<Result> DecoderCompletions::generate(const std::vector<Request>& batch,
                                                 const GenerateParams& p,
                                                 const TokenCallback& on_token) {
  return g_.generate(batch, p, on_token);
}

void T5Completions::set_positions(CompletionLimits& l) const {
  l.context = decoder_positions_;
  l.prompt_context = encoder_positions_;
}

std::vector<Result> T5Completions::generate(const std::vector<Request>& batch,
                                            const GenerateParams& p,
                                            const TokenCallback& on_token) {
  return g_.generate(batch, p, on_token);
}

CompletionRequest parse_completion_request(const std::string& body_text,
                                           const CompletionLimits& limits) {
  const json body = json::parse(body_text, nullptr, false);
  if (body.is_discarded()) bad("the body is not valid JSON");
  if (!body.is_object()) bad("the body must be a JSON object");
  CompletionRequest r;
  r.n = int(integer(body, "n", 1, limits.max_n, 1));
  require_known_fields(body, r.n);
  r.max_tokens = int(integer(body, "max_tokens", 1, limits.context, 16));
  r.temperature = number(body, "temperature", 0, false, 2, 1);
  r.top_p = number(body, "top_p", 0, true, 1, 1);
  r.top_k = int(integer(body, "top_k", 0, limits.vocab, 0));
  r.seed = std::uint64_t(integer(body, "seed", 0, std::int64_t(1) << 62, std::int64_t(limits.seed)));
  if (field(body, "logprobs")) r.logprobs = int(integer(body, "logprobs", 0, 5, 0));
  if (boolean(body, "echo")) bad("'echo' = true is not supported");
  r.stream = boolean(body, "stream");
  r.stop = stop_strings(body);
  r.prompts = prompts(body, limits);
  require_fit(r, limits);
  return r;
}

json to_json(const CompletionRequest& r) {
  json j = {{"prompts", r.prompts}, {"max_tokens", r.max_tokens}, {"temperature", r.temperature},
            {"top_p", r.top_p},     {"top_k", r.top_k},           {"n", r.n},
            {"stop", r.stop},       {"seed", r.seed},             {"stream", r.stream}};
  j["logprobs"] = r.logprobs ? json(*r.logprobs) : json();
  return j;
}

CompletionRequest completion_request_from_json(const json& j) {
  CompletionRequest r;
  r.prompts = j.at("prompts").get<std::vector<std::vector<std::int32_t>>>();
  r.max_tokens = j.at("max_tokens");
  r.temperature = j.at("temperature");
  r.top_p = j.at("top_p");
  r.top_k = j.at("top_k");
  r.n = j.at("n");
  r.stop = j.at("stop").get<std::vector<std::string>>();
  r.seed = j.at("seed");
  r.stream = j.at("stream");
  if (!j.at("logprobs").is_null()) r.logprobs = j.at("logprobs").get<int>();
  return r;
}

std::vector<Request> completion_batch(const CompletionRequest& r) {
  std::vector<Request> batch;
  for (std::size_t i = 0; i < r.prompts.size(); ++i)
    for (int c = 0; c < r.n; ++c) batch.push_back({std::int64_t(i) * r.n + c, r.prompts[i]});
  return batch;
}

GenerateParams completion_params(const CompletionRequest& r, GenerateParams base) {
  base.decoding = r.temperature == 0 ? Decoding::Greedy : Decoding::Sample;
  base.max_new_tokens = r.max_tokens;
  if (r.temperature > 0) base.temperature = r.temperature;
  base.top_k = r.top_k;
  base.top_p = r.top_p;
  base.seed = r.seed;
  base.num_beams = 1;
  base.stop_when = {};
  return base;
}

std::string cut_at_stop(const std::string& text, const std::vector<std::string>& stop) {
  std::size_t cut = text.size();
  for (const auto& s : stop) cut = std::min(cut, text.find(s));
  return text.substr(0, cut);
}

namespace {

/// The start of an unfinished UTF-8 character at the end of text[0, end),
/// or `end` when the last character is whole.
std::size_t whole_utf8_end(const std::string& text, std::size_t end) {
  std::size_t lead = end;
  for (int back = 0; back < 4 && lead > 0; ++back) {
    const auto c = static_cast<unsigned char>(text[lead - 1]);
    --lead;
    if ((c & 0xC0) != 0x80) {  // a lead byte (or ASCII): how long its character is
      const std::size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      return lead + len > end ? lead : end;
    }
  }
  return end;
}

}  // namespace

std::string StreamText::next(const std::string& text) {
  std::size_t cut = cut_at_stop(text, stop_).size();
  if (cut == text.size())
    for (const auto& s : stop_)  // a tail that may still grow into s
      for (std::size_t k = std::min(s.size() - 1, text.size()); k > 0; --k)
        if (text.compare(text.size() - k, k, s, 0, k) == 0) {
          cut = std::min(cut, text.size() - k);
          break;
        }
  cut = whole_utf8_end(text, cut);
  if (cut <= sent_) return "";
  std::string out = text.substr(sent_, cut - sent_);
  sent_ = cut;
  return out;
}

std::string StreamText::finish(const std::string& text) {
  const std::string all = cut_at_stop(text, stop_);
  std::string out = all.size() > sent_ ? all.substr(sent_) : "";
  sent_ = std::max(sent_, all.size());
  return out;
}

namespace {

json logprobs_json(const Result& r, const ChoiceText& t) {
  std::vector<std::size_t> offsets;
  std::size_t at = 0;
  for (const auto& tok : t.tokens) {
    offsets.push_back(at);
    at += tok.size();
  }
  std::vector<double> lp(r.logprobs.begin(), r.logprobs.begin() + long(t.tokens.size()));
  return {{"tokens", t.tokens}, {"token_logprobs", lp}, {"top_logprobs", nullptr},
          {"text_offset", offsets}};
}

json header_json(const CompletionHeader& h) {
  return {{"id", h.id}, {"object", "text_completion"}, {"created", h.created}, {"model", h.model}};
}

}  // namespace

json completion_response(const CompletionHeader& h, const CompletionRequest& r,
                         const std::vector<Result>& results, const std::vector<ChoiceText>& texts) {
  json out = header_json(h);
  out["choices"] = json::array();
  std::size_t completion_tokens = 0, prompt_tokens = 0;
  for (const auto& p : r.prompts) prompt_tokens += p.size();
  for (std::size_t i = 0; i < results.size(); ++i) {
    completion_tokens += results[i].ids.size();
    out["choices"].push_back({{"text", texts[i].text},
                              {"index", results[i].index},
                              {"logprobs", r.logprobs ? logprobs_json(results[i], texts[i]) : json()},
                              {"finish_reason", results[i].finish_reason}});
  }
  out["usage"] = {{"prompt_tokens", prompt_tokens},
                  {"completion_tokens", completion_tokens},
                  {"total_tokens", prompt_tokens + completion_tokens}};
  return out;
}

std::string completion_chunk(const CompletionHeader& h, std::int64_t index, const std::string& text,
                             const std::string& finish_reason) {
  json out = header_json(h);
  out["choices"] = json::array({{{"text", text},
                                 {"index", index},
                                 {"logprobs", nullptr},
                                 {"finish_reason", finish_reason.empty() ? json() : json(finish_reason)}}});
  return "data: " + out.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

json error_body(const std::string& message, const std::string& type) {
  return {{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}}}};
}

}  // namespace meshtron::generate
