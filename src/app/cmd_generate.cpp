// meshtron generate DECK [--set k=v ...]: text from a checkpoint, with a
// key/value cache, on any tp x pp x dp layout (src/generate/).
//
//   meshtron generate input_decks/gpt-tiny.deck --set checkpoint.load=auto
//       --set generate.prompts=prompts.jsonl --set generate.output=out.jsonl
//   mpirun -np 4 meshtron generate DECK --set parallel.tensor_parallel=2
//       --set parallel.pipeline_parallel=2 --set generate.decoding=sample
//
//   1. read and validate the deck; resolve checkpoint.load as evaluate does
//   2. read the prompts (every rank, the whole file): {"text": ...} through
//      the run's tokenizer, or {"ids": [...]}
//   3. build the model under the deck's layout and load the weights
//   4. each dp rank decodes prompts i with i % dp == its dp rank, in batches
//      of generate.batch_size; rank 0 writes the results in prompt order.
//      BERT (model.arch = bert): the fill-mask of each prompt instead
//      (app/fill_mask.hpp), its [MASK] tokens' top generate.top_k
#include <chrono>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "app/commands.hpp"
#include "app/fill_mask.hpp"
#include "app/generation_model.hpp"
#include "common/error.hpp"
#include "data/bert_tokenizer.hpp"
#include "data/json_line.hpp"
#include "generate/generator.hpp"

namespace meshtron::app {

std::unique_ptr<data::Tokenizer> run_tokenizer(const RunConfig& c) {
  // GPT-2's files are optional (a deck on synthetic data names none, and
  // its prompts are ids); the other types name their file by being chosen.
  if (c.data.tokenizer == "gpt2" && (c.data.vocab_file.empty() || c.data.merge_file.empty()))
    return nullptr;
  return load_tokenizer(c.data);
}

namespace {

std::vector<std::int32_t> prompt_ids(const nlohmann::json& j, data::Tokenizer* tok,
                                     const std::string& where, int vocab, PromptForm form) {
  MESH_REQUIRE(j.is_object() && (j.contains("text") != j.contains("ids")),
               where << ": a prompt is {\"text\": \"...\"} or {\"ids\": [...]}");
  std::vector<std::int32_t> ids;
  if (j.contains("text")) {
    MESH_REQUIRE(j["text"].is_string(), where << ": \"text\" must be a string");
    MESH_REQUIRE(tok, where << ": a text prompt needs the run's tokenizer (data.vocab_file and "
                                "data.merge_file, or data.tokenizer = hf)");
    ids = text_prompt_ids(*tok, j["text"].get<std::string>(), form);
  } else {
    MESH_REQUIRE(j["ids"].is_array(), where << ": \"ids\" must be an array of token ids");
    for (const auto& v : j["ids"]) {
      MESH_REQUIRE(v.is_number_integer() && v.get<long long>() >= 0 && v.get<long long>() < vocab,
                   where << ": id " << v.dump() << " is not in [0, " << vocab << ")");
      ids.push_back(v.get<std::int32_t>());
    }
  }
  MESH_REQUIRE(!ids.empty(), where << ": an empty prompt");
  return ids;
}

std::string result_json(const generate::Result& r, const TextDecode& decode, bool logprobs) {
  nlohmann::json j;
  j["index"] = r.index;
  j["prompt_ids"] = r.prompt;
  j["ids"] = r.ids;
  if (decode) j["text"] = decode(r.ids);
  j["finish_reason"] = r.finish_reason;
  if (logprobs) j["logprobs"] = r.logprobs;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::vector<std::vector<std::int32_t>> prompts_of(const RunConfig& c, data::Tokenizer* tok,
                                                  int vocab) {
  MESH_REQUIRE(!c.generate.prompts.empty(),
               "generate needs generate.prompts (a JSONL file of prompts)");
  return read_prompt_file(c.generate.prompts, "generate.prompts", tok, vocab, prompt_form(c));
}

class GenerateRun {
 public:
  explicit GenerateRun(RunConfig config)
      : c_(for_generation(std::move(config))),
        checkpoint_(checkpoint_to_load(c_, "generate")),
        vocab_(resolve_vocab(c_)),
        tokenizer_(run_tokenizer(c_)),
        decode_(text_decode(c_, tokenizer_.get())),
        prompts_(prompts_of(c_, tokenizer_.get(), vocab_)),
        params_(generate_params(c_.generate, tokenizer_.get(), decode_, vocab_,
                                c_.model.arch == "t5" ? t5_generation_ids(c_, nullptr).eos : -1)),
        model_(c_, vocab_),
        rt_(model_.runtime()),
        rank0_(rt_.topo.world_rank() == 0) {}

  int run() {
    if (c_.model.arch == "bert") return fill_masks();
    const io::TrainState state = model_.load(checkpoint_, tokenizer_.get());
    const auto mine = my_requests();
    if (generate::T5Generator* t5 = model_.t5_generator()) {
      // Relative positions: an encoder input of any length.
      print_banner(state.iteration, t5_cache_mib(*t5, mine));
      return decode(mine, [t5](const std::vector<generate::Request>& batch,
                               const generate::GenerateParams& p) { return t5->generate(batch, p); });
    }
    generate::Generator& generator = model_.generator();
    require_prompts_fit(generator.context_length());
    print_banner(state.iteration, gpt_cache_mib(generator, mine));
    print_micro_batches(generator, mine);
    return decode(mine, [&generator](const std::vector<generate::Request>& batch,
                                     const generate::GenerateParams& p) {
      return generator.generate(batch, p);
    });
  }

 private:
  using Generate = std::function<std::vector<generate::Result>(
      const std::vector<generate::Request>&, const generate::GenerateParams&)>;

  /// This rank's prompts in batches of generate.batch_size; rank 0 writes every result.
  int decode(const std::vector<generate::Request>& mine, const Generate& generate) {
    std::vector<std::string> lines;
    for (std::size_t b = 0; b < mine.size(); b += std::size_t(c_.generate.batch_size)) {
      const std::vector<generate::Request> batch(
          mine.begin() + long(b),
          mine.begin() + long(std::min(mine.size(), b + std::size_t(c_.generate.batch_size))));
      const auto start = std::chrono::steady_clock::now();
      const auto results = generate(batch, params_);
      print_batch_time(b / std::size_t(c_.generate.batch_size) + 1, results,
                       std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      for (const auto& r : results)
        lines.push_back(result_json(r, decode_, c_.generate.logprobs));
    }
    write(in_prompt_order(gather_lines(lines, rt_.dp)));
    return 0;
  }

  /// BERT: every prompt's fill-mask (app/fill_mask.hpp); rank 0 writes them.
  int fill_masks() {
    MESH_REQUIRE(tokenizer_, "generate: fill-mask needs the run's WordPiece tokenizer "
                             "(data.tokenizer = bert_wordpiece_lowercase or bert_wordpiece_cased)");
    const std::int32_t mask = data::bert_special_ids(*tokenizer_).mask;
    const int top_k = fill_mask_top_k(c_.generate);
    require_fill_mask_prompts(prompts_, mask, c_.model.seq_length, "generate.prompts");
    const io::TrainState state = model_.load(checkpoint_, tokenizer_.get());
    if (rank0_)
      std::cout << "meshtron generate " << c_.deck_path << "\n > checkpoint " << checkpoint_
                << " (iteration " << state.iteration << ")\n > " << prompts_.size()
                << " prompts of " << c_.generate.prompts << ", fill-mask top " << top_k
                << " on tp " << rt_.topo.tp() << " x pp " << rt_.topo.pp() << " x dp "
                << rt_.topo.dp() << std::endl;
    std::vector<std::string> lines;
    for (const FillMaskResult& r : fill_mask(model_.trainer(), c_, prompts_, mask, top_k))
      lines.push_back(fill_mask_json(r, *tokenizer_)
                          .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    write(lines);
    return 0;
  }

  /// Every rank checks every prompt (a prompt only some dp ranks decode
  /// would stop them alone).
  void require_prompts_fit(index_t positions) const {
    for (std::size_t i = 0; i < prompts_.size(); ++i)
      MESH_REQUIRE(index_t(prompts_[i].size()) + c_.generate.max_new_tokens <= positions,
                   "generate.prompts: prompt " << i << " has " << prompts_[i].size()
                       << " tokens; with generate.max_new_tokens = " << c_.generate.max_new_tokens
                       << " it needs " << prompts_[i].size() + std::size_t(c_.generate.max_new_tokens)
                       << " positions, the model has " << positions);
  }

  std::vector<generate::Request> my_requests() const {
    std::vector<generate::Request> out;
    for (std::size_t i = std::size_t(rt_.topo.dp_rank()); i < prompts_.size();
         i += std::size_t(rt_.topo.dp()))
      out.push_back({std::int64_t(i), prompts_[i]});
    return out;
  }

  struct CacheSize {
    double mib;
    index_t sequences, positions;
  };
  index_t longest_prompt() const {
    std::size_t longest = 0;
    for (const auto& p : prompts_) longest = std::max(longest, p.size());
    return index_t(longest);
  }
  /// Sequences of one batch of this rank (prompts x beams).
  index_t batch_sequences(const std::vector<generate::Request>& mine) const {
    const index_t beams = params_.decoding == generate::Decoding::Beam ? c_.generate.num_beams : 1;
    return index_t(std::min<std::size_t>(mine.size(), std::size_t(c_.generate.batch_size))) * beams;
  }
  CacheSize gpt_cache_mib(const generate::Generator& g,
                          const std::vector<generate::Request>& mine) const {
    const index_t slots = batch_sequences(mine);
    const index_t capacity = longest_prompt() + c_.generate.max_new_tokens;
    return {double(g.cache_bytes(slots, capacity)) / (1024.0 * 1024.0), slots, capacity};
  }
  /// T5: the decoder's self caches and the cross-attention keys and values.
  CacheSize t5_cache_mib(const generate::T5Generator& g,
                         const std::vector<generate::Request>& mine) const {
    const index_t sequences = batch_sequences(mine), capacity = c_.generate.max_new_tokens;
    return {double(g.cache_bytes(sequences, capacity, longest_prompt(), compute_dtype(c_))) /
                (1024.0 * 1024.0),
            sequences, capacity};
  }

  void print_banner(long iteration, const CacheSize& cache) const {
    if (!rank0_) return;
    std::cout << "meshtron generate " << c_.deck_path << "\n > checkpoint " << checkpoint_
              << " (iteration " << iteration << ")\n > " << prompts_.size() << " prompts of "
              << c_.generate.prompts << ", " << c_.generate.decoding << ", max_new_tokens "
              << c_.generate.max_new_tokens << " on tp " << rt_.topo.tp() << " x pp "
              << rt_.topo.pp() << " x dp " << rt_.topo.dp() << "\n > KV cache: " << cache.mib
              << " MiB on this rank (" << cache.sequences << " sequences x " << cache.positions
              << " positions, its layers and kv heads"
              << (c_.model.arch == "t5" ? "; the encoder's cross-attention keys and values" : "")
              << ")" << std::endl;
  }

  /// How many parts of a batch decode at once over the pipeline stages.
  void print_micro_batches(const generate::Generator& g,
                           const std::vector<generate::Request>& mine) const {
    if (!rank0_) return;
    const std::size_t prompts = std::min(mine.size(), std::size_t(c_.generate.batch_size));
    const int parts = g.micro_batches(prompts, params_);
    std::cout << " > pipeline: " << parts << (parts == 1 ? " micro-batch" : " micro-batches")
              << " of a batch of " << prompts << " prompts in flight over pp "
              << rt_.topo.pp() << " (generate.micro_batches = " << c_.generate.micro_batches
              << (params_.decoding == generate::Decoding::Beam ? "; beam search: 1" : "") << ")"
              << std::endl;
  }

  /// Rank 0's batches (perf/bench_generate.py reads these lines): the
  /// tokens come back to the host each step, so the wall time is the GPU's.
  void print_batch_time(std::size_t batch, const std::vector<generate::Result>& results,
                        double seconds) const {
    if (!rank0_) return;
    std::size_t tokens = 0;
    for (const auto& r : results) tokens += r.ids.size();
    std::cout << " > batch " << batch << ": " << results.size() << " prompts, " << tokens
              << " new tokens in " << seconds << " s (" << double(tokens) / seconds
              << " tokens/s)" << std::endl;
  }

  std::vector<std::string> in_prompt_order(std::vector<std::string> lines) const {
    std::vector<std::string> ordered(prompts_.size());
    for (auto& l : lines) {
      const auto j = nlohmann::json::parse(l);
      ordered[j["index"].get<std::size_t>()] = std::move(l);
    }
    return ordered;
  }

  void write(const std::vector<std::string>& lines) const {
    if (!rank0_) return;
    if (c_.generate.output.empty()) {
      for (const auto& l : lines) std::cout << l << "\n";
      std::cout << std::flush;
      return;
    }
    std::ofstream out(c_.generate.output);
    for (const auto& l : lines) out << l << "\n";
    MESH_VERIFY(out.good(), "cannot write generate.output '" << c_.generate.output << "'");
    std::cout << " > " << lines.size() << " generations written to " << c_.generate.output
              << std::endl;
  }

  RunConfig c_;  ///< the trainer keeps a reference: declared first
  std::string checkpoint_;
  int vocab_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  TextDecode decode_;
  std::vector<std::vector<std::int32_t>> prompts_;
  generate::GenerateParams params_;
  GenerationModel model_;
  ParallelRuntime& rt_;
  bool rank0_;
};

}  // namespace

std::vector<std::vector<std::int32_t>> read_prompt_file(const std::string& path,
                                                        const std::string& key,
                                                        data::Tokenizer* tok, int vocab,
                                                        PromptForm form) {
  std::vector<std::vector<std::int32_t>> prompts;
  data::for_each_json_line(path, key, [&](const nlohmann::json& j, const std::string& where,
                                          long) {
    prompts.push_back(prompt_ids(j, tok, where, vocab, form));
  });
  MESH_REQUIRE(!prompts.empty(), key << ": no prompt in '" << path << "'");
  return prompts;
}

int run_generate(const std::vector<std::string>& args) {
  const DeckArgs parsed = parse_deck_args(args);
  RunConfig config = read_decks(parsed, "generate");
  MESH_REQUIRE(parsed.rest.empty(), "generate: unknown argument '" << parsed.rest.front() << "'");
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  config.validate(world);
  GenerateRun run(std::move(config));
  return run.run();
}

}  // namespace meshtron::app
