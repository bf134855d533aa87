// The tiny models of the generation tests (tests/generate/, tests/gpu/): a
// GPT-2 deck and the lines that turn it into other families, and a replica
// (runtime, model, generator) of one on a communicator, on the host or on
// the GPU.
#pragma once

#include <mpi.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "config/model_spec_from_deck.hpp"
#include "generate/generator.hpp"
#include "train/trainer.hpp"

namespace meshtron::generate_test {

inline const char* kGpt2 = R"(
[model]
num_layers = 4
hidden_size = 32
num_attention_heads = 4
seq_length = 32
vocab_size = 100
make_vocab_size_divisible_by = 8
hidden_dropout = 0.1
attention_dropout = 0.1
[training]
micro_batch_size = 1
global_batch_size = 1
[logging]
progress = off
)";

/// Deck lines that turn kGpt2 into each family.
inline const std::map<std::string, std::vector<std::string>> kFamilies = {
    {"gpt2", {}},
    {"llama",
     {"model.normalization=RMSNorm", "model.position_embedding_type=rope",
      "model.num_query_groups=2", "model.activation=swiglu", "model.ffn_hidden_size=48",
      "model.add_bias_linear=false", "model.untie_embeddings_and_output_weights=true"}},
    {"multi_query", {"model.num_query_groups=1"}},
};

/// A model on `comm` under (tp, pp), its weights from run.seed (the same
/// global model on every layout and device), and its generator.
struct Replica {
  RunConfig config;
  ParallelRuntime rt;
  ModelSpec spec;
  Trainer trainer;
  std::unique_ptr<generate::Generator> generator;

  static RunConfig deck(const std::string& family, int tp, int pp, int world,
                        const std::vector<std::string>& more, MemorySpace space) {
    std::vector<std::string> sets = kFamilies.at(family);
    sets.insert(sets.end(), more.begin(), more.end());
    sets.push_back("parallel.tensor_parallel=" + std::to_string(tp));
    sets.push_back("parallel.pipeline_parallel=" + std::to_string(pp));
    sets.push_back("parallel.data_parallel=" + std::to_string(world / (tp * pp)));
    if (space == MemorySpace::Cuda) sets.push_back("run.device=cuda");
    RunConfig c = RunConfig::from_text(kGpt2, sets);
    c.validate(world);
    return c;
  }
  Replica(MPI_Comm comm, const std::string& family, int tp, int pp, DType dtype,
          const std::vector<std::string>& more = {}, MemorySpace space = MemorySpace::Host)
      : config(deck(family, tp, pp, tp * pp, more, space)),
        rt(comm, config.parallel.degrees(), space),
        spec(model_spec_from_deck(config, config.model.vocab_size, tp)),
        trainer(config, spec, rt, dtype) {
    generator = std::make_unique<generate::Generator>(trainer.gpt_chunks(), rt, dtype);
  }
};

inline std::vector<std::int32_t> some_ids(int n, int salt) {
  std::vector<std::int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(std::int32_t((i * 37 + salt * 11 + 5) % 100));
  return ids;
}

}  // namespace meshtron::generate_test
