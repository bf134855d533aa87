#include "app/sft_rows.hpp"

#include <iostream>

#include "app/commands.hpp"
#include "app/generation_model.hpp"
#include "common/error.hpp"
#include "data/json_line.hpp"

namespace meshtron::app {

namespace {

/// The names of a row shape's two fields: text fields, then id fields.
struct RowShape {
  const char *context, *target, *context_ids, *target_ids;
};
constexpr RowShape kDecoderShape{"prompt", "completion", "prompt_ids", "completion_ids"};
constexpr RowShape kT5Shape{"input", "target", "input_ids", "target_ids"};

std::string shapes_of(bool t5) {
  return t5 ? R"({"input": "...", "target": "..."} or {"input_ids": [...], "target_ids": [...]})"
            : R"({"prompt": "...", "completion": "..."}, {"text": "..."} or )"
              R"({"prompt_ids": [...], "completion_ids": [...]})";
}

class RowReader {
 public:
  RowReader(const nlohmann::json& row, std::string where, bool t5, data::Tokenizer* tok,
            int vocab)
      : row_(row), where_(std::move(where)), t5_(t5), tok_(tok), vocab_(vocab) {}

  SftExample read() const {
    const RowShape& f = t5_ ? kT5Shape : kDecoderShape;
    const bool text_pair = has(f.context) || has(f.target);
    const bool text = !t5_ && has("text");
    const bool ids = has(f.context_ids) || has(f.target_ids);
    MESH_REQUIRE(int(text_pair) + int(text) + int(ids) == 1,
                 where_ << ": a row is " << shapes_of(t5_));
    SftExample x;
    if (text) {
      x.target = text_ids(string_field("text"), /*ends_with_eod=*/false);
      x.target.push_back(tok_->eod_id());
    } else if (text_pair) {
      // Decoder: BOS + prompt, then completion + EOD; T5: each + </s>.
      x.context = text_ids(string_field(f.context), t5_);
      x.target = text_ids(string_field(f.target), true);
    } else {
      x.context = id_field(f.context_ids);
      x.target = id_field(f.target_ids);
    }
    for (const auto* part : {&x.context, &x.target})
      for (std::int32_t id : *part)
        MESH_REQUIRE(id >= 0 && id < vocab_, where_ << ": token id " << id
                                                    << " is outside the model's vocabulary [0, "
                                                    << vocab_ << ")");
    return x;
  }

 private:
  bool has(const char* key) const { return row_.contains(key); }
  std::string string_field(const char* key) const {
    MESH_REQUIRE(has(key) && row_[key].is_string(),
                 where_ << ": \"" << key << "\" must be a string (a row is " << shapes_of(t5_)
                        << ")");
    return row_[key].get<std::string>();
  }
  std::vector<std::int32_t> text_ids(const std::string& text, bool ends_with_eod) const {
    MESH_REQUIRE(tok_, where_ << ": a text row needs the run's tokenizer (data.tokenizer and "
                                 "its files)");
    return text_prompt_ids(*tok_, text,
                           ends_with_eod ? PromptForm::EncoderInput : PromptForm::Continuation);
  }
  std::vector<std::int32_t> id_field(const char* key) const {
    MESH_REQUIRE(has(key) && row_[key].is_array(),
                 where_ << ": \"" << key << "\" must be an array of token ids");
    std::vector<std::int32_t> ids(row_[key].size());
    const std::string why =
        data::read_int_field(row_, {key, 0, vocab_, false, true}, ids.size(), ids);
    MESH_REQUIRE(why.empty(), where_ << ": " << why);
    return ids;
  }

  const nlohmann::json& row_;
  std::string where_;
  bool t5_;
  data::Tokenizer* tok_;
  int vocab_;
};

}  // namespace

std::vector<SftExample> read_sft_rows(const std::string& path, const std::string& key, bool t5,
                                      data::Tokenizer* tokenizer, int vocab) {
  std::vector<SftExample> rows;
  data::for_each_json_line(path, key, [&](const nlohmann::json& row, const std::string& where,
                                          long n) {
    MESH_REQUIRE(row.is_object(), where << ": a row is " << shapes_of(t5));
    rows.push_back(RowReader(row, where, t5, tokenizer, vocab).read());
    rows.back().line = n;
  });
  MESH_REQUIRE(!rows.empty(), key << ": no row in '" << path << "'");
  return rows;
}

std::shared_ptr<const SftSamples> sft_samples(const RunConfig& c, const std::string& path,
                                              const std::string& key, int vocab, bool report) {
  const bool t5 = c.model.arch == "t5";
  const auto tokenizer = run_tokenizer(c);
  auto samples = std::make_shared<const SftSamples>(
      read_sft_rows(path, key, t5, tokenizer.get(), vocab), c.model.seq_length,
      t5 ? c.model.decoder_seq_length : 0, path);
  if (report)
    std::cout << " > " << key << " " << path << ": " << samples->size() << " rows, "
              << samples->truncated() << " cut to "
              << (t5 ? "model.seq_length / decoder_seq_length" : "model.seq_length + 1")
              << std::endl;
  return samples;
}

std::unique_ptr<DataSource> make_jsonl_data(const RunConfig& c, const DataLayout& layout,
                                            int vocab, bool report) {
  auto train = sft_samples(c, c.data.path, "data.path", vocab, report);
  auto valid = c.data.valid_path.empty()
                   ? nullptr
                   : sft_samples(c, c.data.valid_path, "data.valid_path", vocab, report);
  return make_sft_data(layout, vocab, std::move(train), std::move(valid));
}

}  // namespace meshtron::app
