#include "app/generation_model.hpp"

#include <sstream>

#include "app/commands.hpp"
#include "common/error.hpp"
#include "config/model_spec_from_deck.hpp"
#include "data/bert_tokenizer.hpp"
#include "data/json_line.hpp"
#include "data/t5_vocabulary.hpp"

namespace meshtron::app {

RunConfig for_generation(RunConfig c) {
  c.parallel.sequence_parallel = false;
  c.training.recompute = "none";
  return c;
}

GenerationModel::GenerationModel(const RunConfig& c, int vocab)
    : config_(c),
      rt_(MPI_COMM_WORLD, c.degrees(),
          c.run.device == "cuda" ? MemorySpace::Cuda : MemorySpace::Host),
      model_(model_spec_from_deck(c, vocab, rt_.topo.tp())),
      dtype_(compute_dtype(c)),
      trainer_(c, model_, rt_, dtype_) {}

T5GenerationIds t5_generation_ids(const RunConfig& c, const data::Tokenizer* tok) {
  if (!tok) return {};
  const data::SpecialTokens special = data::t5_special_tokens(*tok, c.data.vocab_extra_ids);
  return {special.pad, special.eos};
}

std::unique_ptr<generate::T5Generator> make_t5_generator(const RunConfig& c, Trainer& trainer,
                                                         ParallelRuntime& rt, DType dtype,
                                                         const data::Tokenizer* tok) {
  const auto* t5 = dynamic_cast<const T5Model*>(trainer.chunks().front().get());
  MESH_VERIFY(t5 != nullptr, "make_t5_generator: model.arch = t5 built no T5Model");
  const T5GenerationIds ids = t5_generation_ids(c, tok);
  generate::T5Pipeline pipeline;
  if (rt.topo.pp() > 1) pipeline = {&rt.pp, c.degrees().pipeline_split_rank, dtype};
  return std::make_unique<generate::T5Generator>(*t5, rt.tp_group, rt.space(), ids.pad, ids.pad,
                                                 pipeline);
}

io::TrainState GenerationModel::load(const std::string& checkpoint, const data::Tokenizer* tok) {
  const io::TrainState state = load_trainer_weights(trainer_, checkpoint);
  if (model_.model_class == ModelClass::T5)
    t5_generator_ = make_t5_generator(config_, trainer_, rt_, dtype_, tok);
  else if (model_.model_class != ModelClass::BertPretraining)
    generator_ = std::make_unique<generate::Generator>(trainer_.gpt_chunks(), rt_, dtype_);
  return state;
}

generate::Generator& GenerationModel::generator(const char* what) {
  MESH_REQUIRE(generator_, what << " needs a decoder-only model (model.arch), not T5 or BERT");
  return *generator_;
}

PromptForm prompt_form(const RunConfig& c) {
  if (c.model.arch == "t5") return PromptForm::EncoderInput;
  if (c.model.arch == "bert") return PromptForm::FillMask;
  return PromptForm::Continuation;
}

namespace {

/// [CLS] text [SEP] with each "[MASK]" of the text the [MASK] id (the
/// WordPiece tokenizer reads "[MASK]" as plain text, five pieces).
std::vector<std::int32_t> fill_mask_ids(data::Tokenizer& tok, const std::string& text) {
  static const std::string kMask = "[MASK]";
  const data::BertSpecialIds& special = data::bert_special_ids(tok);
  std::vector<std::int32_t> ids{special.cls};
  std::size_t from = 0;
  for (std::size_t at; (at = text.find(kMask, from)) != std::string::npos; from = at + kMask.size()) {
    tok.encode_append(text.substr(from, at - from), ids);
    ids.push_back(special.mask);
  }
  tok.encode_append(text.substr(from), ids);
  ids.push_back(special.sep);
  return ids;
}

}  // namespace

std::vector<std::int32_t> text_prompt_ids(data::Tokenizer& tok, const std::string& text,
                                          PromptForm form) {
  if (form == PromptForm::FillMask) return fill_mask_ids(tok, text);
  std::vector<std::int32_t> ids;
  if (form == PromptForm::Continuation && tok.bos_id() >= 0)
    ids.push_back(tok.bos_id());  // as preprocess starts documents
  tok.encode_append(text, ids);
  if (form == PromptForm::EncoderInput) ids.push_back(tok.eod_id());
  return ids;
}

std::vector<std::string> gather_lines(const std::vector<std::string>& mine, Communicator& dp) {
  std::string packed;
  for (const auto& l : mine) packed += l + "\n";
  double longest = double(packed.size());
  dp.all_reduce(&longest, 1, DType::F64, ReduceOp::Max);
  std::vector<std::uint8_t> send(std::size_t(longest) + 1, 0), recv(send.size() * std::size_t(dp.size()));
  std::copy(packed.begin(), packed.end(), send.begin());
  dp.all_gather(send.data(), recv.data(), send.size(), DType::U8);
  std::vector<std::string> lines;
  for (int q = 0; q < dp.size(); ++q) {
    std::stringstream in(std::string(reinterpret_cast<const char*>(&recv[std::size_t(q) * send.size()])));
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  return lines;
}

std::vector<std::string> broadcast_lines(const std::vector<std::string>& lines, Communicator& group,
                                         int root) {
  std::string packed;
  for (const auto& l : lines) packed += l + "\n";
  double size = double(packed.size());
  group.broadcast(&size, 1, DType::F64, root);
  packed.resize(std::size_t(size));
  group.broadcast(packed.data(), packed.size(), DType::U8, root);
  std::vector<std::string> out;
  std::stringstream in(packed);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

TextDecode text_decode(const RunConfig& c, const data::Tokenizer* tok) {
  if (!tok) return {};
  if (c.model.arch != "t5")
    return [tok](const std::vector<std::int32_t>& ids) { return tok->decode(ids); };
  return [tok, special = data::t5_special_tokens(*tok, c.data.vocab_extra_ids)](
             const std::vector<std::int32_t>& ids) { return data::t5_decode(*tok, special, ids); };
}

std::function<bool(const std::vector<std::int32_t>&)> stop_strings_predicate(
    std::function<std::string(const std::vector<std::int32_t>&)> decode,
    std::vector<std::string> strings) {
  if (strings.empty()) return {};
  return [decode = std::move(decode), strings = std::move(strings)](
             const std::vector<std::int32_t>& ids) {
    const std::string text = decode(ids);
    for (const auto& s : strings)
      if (text.find(s) != std::string::npos) return true;
    return false;
  };
}

namespace {

std::vector<std::int32_t> parse_stop_ids(const std::string& s, const data::Tokenizer* tok,
                                         int vocab, std::int32_t eod) {
  std::vector<std::int32_t> ids;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (item.empty()) continue;
    if (item == "eod") {
      if (tok) ids.push_back(tok->eod_id());
      else if (eod >= 0) ids.push_back(eod);
      else if (vocab == kGpt2VocabSize) ids.push_back(kGpt2VocabSize - 1);  // <|endoftext|>
      continue;
    }
    std::size_t used = 0;
    long v = -1;
    try {
      v = std::stol(item, &used);
    } catch (const std::exception&) {
    }
    MESH_REQUIRE(used == item.size() && v >= 0 && v < vocab,
                 "generate.stop_ids: '" << item << "' is not eod or an id in [0, " << vocab << ")");
    ids.push_back(std::int32_t(v));
  }
  return ids;
}

std::vector<std::string> parse_stop_strings(const std::string& s) {
  std::string why;
  const auto j = data::parse_json_line(s, why);
  MESH_REQUIRE(j && j->is_array(), "generate.stop = " << s << " is not a JSON array of strings"
                                                      << (j ? "" : ": " + why));
  std::vector<std::string> out;
  for (const auto& v : *j) {
    MESH_REQUIRE(v.is_string() && !v.get<std::string>().empty(),
                 "generate.stop: " << v.dump() << " is not a non-empty string");
    out.push_back(v.get<std::string>());
  }
  return out;
}

}  // namespace

generate::GenerateParams generate_params(const GenerateSection& g, const data::Tokenizer* tok,
                                         const TextDecode& decode, int vocab, std::int32_t eod) {
  generate::GenerateParams p;
  p.decoding = generate::decoding_from_string(g.decoding);
  p.max_new_tokens = g.max_new_tokens;
  p.temperature = g.temperature;
  p.top_k = g.top_k;
  p.top_p = g.top_p;
  p.seed = g.seed;
  p.num_beams = g.num_beams;
  p.length_penalty = g.length_penalty;
  p.early_stopping = g.early_stopping;
  p.micro_batches = positive_or_auto("generate.micro_batches", g.micro_batches);
  p.stop_ids = parse_stop_ids(g.stop_ids, tok, vocab, eod);
  const auto strings = parse_stop_strings(g.stop);
  MESH_REQUIRE(strings.empty() || decode,
               "generate.stop strings need the run's tokenizer (data.vocab_file and "
               "data.merge_file, or data.tokenizer = hf)");
  if (decode) p.stop_when = stop_strings_predicate(decode, strings);
  return p;
}

}  // namespace meshtron::app
