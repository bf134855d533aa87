// meshtron info DECK... [--set k=v ...]: resolve and validate the decks,
// build the topology, and print both on rank 0.
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "app/commands.hpp"
#include "common/error.hpp"
#include "config/model_spec_from_deck.hpp"
#include "data/t5_vocabulary.hpp"
#include "parallel/interconnect.hpp"
#include "parallel/topology.hpp"
#include "train/metrics.hpp"

namespace meshtron::app {

data::TokenizerFiles tokenizer_files(const DataSection& d) {
  return {.type = d.tokenizer,
          .vocab_file = d.vocab_file,
          .merge_file = d.merge_file,
          .tokenizer_file = d.tokenizer_file,
          .tokenizer_model = d.tokenizer_model};
}

std::unique_ptr<data::Tokenizer> load_tokenizer(const DataSection& d) {
  return data::load_tokenizer(tokenizer_files(d));
}

int resolve_vocab(const RunConfig& c) {
  if (c.model.vocab_size > 0) return c.model.vocab_size;
  // GPT-2 named without its files (synthetic data): its published size.
  if (c.data.tokenizer == "gpt2" && (c.data.vocab_file.empty() || c.data.merge_file.empty()))
    return kGpt2VocabSize;
  const auto tokenizer = load_tokenizer(c.data);
  // T5's sentinels may lie after the tokenizer's vocabulary (t5_vocabulary.hpp).
  if (c.model.arch == "t5")
    return int(data::t5_special_tokens(*tokenizer, c.data.vocab_extra_ids).vocab_size);
  return tokenizer->vocab_size();
}

DType compute_dtype(const RunConfig& c) {
  if (c.training.precision == "bf16") return DType::BF16;
  if (c.training.precision == "fp16") return DType::F16;
  return DType::F32;
}

std::string pipeline_split_line(const RunConfig& c, const ModelSpec& model) {
  if (c.parallel.model_chunks() < 2) return "";
  if (model.model_class == ModelClass::T5) {
    const int pp = c.parallel.pipeline_parallel, split = c.degrees().pipeline_split_rank;
    std::ostringstream os;
    os << " > T5 pipeline split: encoder stages 0-" << split - 1 << " ("
       << model.num_layers / split << " layers each), decoder stages " << split << "-" << pp - 1
       << " (" << model.num_decoder_layers / (pp - split) << " layers each)\n";
    return os.str();
  }
  const double head = head_cost_in_layers(model);
  const std::vector<int> layers = c.parallel.chunk_layers(model.num_layers, head);
  std::ostringstream os;
  os << " > layers per pipeline chunk:";
  for (std::size_t i = 0; i < layers.size(); ++i) os << (i ? "," : " ") << layers[i];
  const std::string& named = c.parallel.pipeline_layers;
  os << " (" << (named.empty() ? "uniform" : named == "balanced" ? "balanced" : "named")
     << "; the last also runs the LM head, worth " << std::fixed << std::setprecision(2)
     << head << " layers)\n";
  return os.str();
}

DeckArgs parse_deck_args(const std::vector<std::string>& args) {
  DeckArgs out;
  bool other_flag_seen = false;  // after it, a bare argument may be that flag's value
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--set") {
      MESH_REQUIRE(i + 1 < args.size(), "--set needs section.key=value");
      out.overrides.push_back(args[++i]);
    } else if (a.rfind("--set=", 0) == 0) {
      out.overrides.push_back(a.substr(6));
    } else if (a.rfind("--", 0) != 0 && !other_flag_seen) {
      out.decks.push_back(a);
    } else {
      other_flag_seen = true;
      out.rest.push_back(a);
    }
  }
  return out;
}

RunConfig read_decks(const DeckArgs& args, const std::string& command) {
  MESH_REQUIRE(!args.decks.empty(), command << ": missing DECK argument");
  return RunConfig::from_files(args.decks, args.overrides);
}

int run_info(const std::vector<std::string>& args) {
  const DeckArgs parsed = parse_deck_args(args);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  for (const auto& r : parsed.rest) {
    if (r == "--help-deck") {
      if (rank == 0) std::cout << RunConfig::schema_help();
      return 0;
    }
    throw UserError("info: unknown argument '" + r + "'");
  }
  RunConfig config = read_decks(parsed, "info");
  config.validate(world);
  Topology topo(MPI_COMM_WORLD, config.degrees());
  // Rank 0's node stands for every node (GpuLinks); on the GPU path its GPU
  // count gives the map's gpu column, as the trainer assigns them.
  const std::optional<GpuLinks> links = rank == 0 ? read_gpu_links() : std::nullopt;
  int gpus = config.run.device == "cuda" && links ? links->count : 0;
  MPI_Bcast(&gpus, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const auto rows = gather_rank_map(topo, gpus);
  // The split depends on the vocabulary: the deck's, else the tokenizer's
  // where its files are already there, else GPT-2's (info needs no data).
  std::string split;
  if (config.parallel.model_chunks() > 1) {
    const bool tokenizer_here = data::tokenizer_files_exist(tokenizer_files(config.data));
    const int vocab =
        config.model.vocab_size > 0 || tokenizer_here ? resolve_vocab(config) : kGpt2VocabSize;
    split = pipeline_split_line(
        config, model_spec_from_deck(config, vocab, config.parallel.tensor_parallel));
  }
  if (rank == 0) {
    std::cout << "deck " << config.deck_path << " (resolved):\n"
              << config.resolved_text() << "\n"
              << "topology: world=" << topo.world_size() << " tp=" << topo.tp()
              << " pp=" << topo.pp() << " dp=" << topo.dp() << "\n"
              << split << format_rank_map(rows) << describe_gpu_links(links) << "\n";
    for (const std::string& line : tp_placement_warnings(rows, links)) std::cout << line << "\n";
  }
  return 0;
}

}  // namespace meshtron::app
