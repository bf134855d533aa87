// meshtron convert: the Hugging Face models of io::hf_families()
// (GPT2LMHeadModel, GPTBigCodeForCausalLM, LlamaForCausalLM,
// MistralForCausalLM, BloomForCausalLM, GPTNeoXForCausalLM,
// MegatronBertForPreTraining, BertForPreTraining (read too:
// BertForMaskedLM and BertModel, whose missing heads keep their
// initialisation, named in one line), T5ForConditionalGeneration,
// MT5ForConditionalGeneration) <-> meshtron checkpoint.
//
//   meshtron convert --from hf MODEL_DIR --to CKPT_DIR
//       config.json + model.safetensors (or its shards and
//       model.safetensors.index.json) -> CKPT_DIR/iter_0000000.h5 (+ latest)
//       and CKPT_DIR/model.deck, the [model] section of the converted model
//       (also stored in the checkpoint), so that
//       `meshtron train CKPT_DIR/model.deck my-run.deck` fine-tunes it
//       (checkpoint.load = CKPT_DIR/iter_0000000.h5).
//   meshtron convert --from CKPT.h5 --to hf MODEL_DIR
//       -> config.json + model.safetensors (shards + index above 5 GB) that
//       transformers loads unchanged; the family is the first of
//       io::hf_families() that owns the checkpoint's model spec.
//
// Runs on one rank: the whole model is assembled on it (a checkpoint written
// by any decomposition loads into one rank like into any other).
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <set>

#include "app/commands.hpp"
#include "common/error.hpp"
#include "config/model_spec_from_deck.hpp"
#include "io/checkpoint.hpp"
#include "io/hf/hf_family.hpp"
#include "model/bert_model.hpp"
#include "model/gpt_model.hpp"
#include "model/t5_model.hpp"

namespace meshtron::app {

namespace {

struct ConvertArgs {
  std::string from, to;
  bool from_hf = false, to_hf = false;
};

ConvertArgs parse_convert_args(const std::vector<std::string>& args) {
  ConvertArgs c;
  for (std::size_t i = 0; i < args.size(); ++i) {
    auto take = [&](std::string& path, bool& hf) {
      MESH_REQUIRE(i + 1 < args.size(), args[i] << " needs a path");
      if (args[i + 1] == "hf") {
        hf = true;
        ++i;
        MESH_REQUIRE(i + 1 < args.size(), args[i - 1] << " hf needs a folder");
      }
      path = args[++i];
    };
    if (args[i] == "--from") take(c.from, c.from_hf);
    else if (args[i] == "--to") take(c.to, c.to_hf);
    else throw UserError("convert: unknown argument '" + args[i] + "'");
  }
  MESH_REQUIRE(!c.from.empty() && !c.to.empty(),
               "convert: usage: --from hf DIR --to CKPT_DIR | --from CKPT.h5 --to hf DIR");
  MESH_REQUIRE(c.from_hf != c.to_hf, "convert: exactly one side must be 'hf DIR'");
  return c;
}

/// A deck that describes `c` (stored in the checkpoint, read back on export).
std::string deck_for(const ModelSpec& c) {
  return "# written by meshtron convert\n" + model_deck_section(c);
}

/// A 1-rank model (tp = pp = dp = 1) of shape `c`, on the host: a GptModel,
/// a BertModel for model_class BertPretraining, or a T5Model for T5.
struct SingleRankModel {
  explicit SingleRankModel(const ModelSpec& c)
      : self(MPI_COMM_SELF), tp{self}, ctx{tp}, model(make(c, ctx)) {}
  static std::unique_ptr<StageModel> make(const ModelSpec& c, LayerContext& ctx) {
    if (c.model_class == ModelClass::BertPretraining)
      return std::make_unique<BertModel>(c, ctx, DType::F32, 0);
    if (c.model_class == ModelClass::T5) return std::make_unique<T5Model>(c, ctx, DType::F32, 0);
    return std::make_unique<GptModel>(c, StagePlacement::whole_model(c.num_layers), ctx,
                                      DType::F32, 0);
  }
  ParameterList parameters() { return model->parameters(); }
  MpiCommunicator self;
  TensorParallelGroup tp;
  LayerContext ctx;
  std::unique_ptr<StageModel> model;
};

/// One line naming the parameters the folder has no tensor for (a
/// BertForMaskedLM's pooler and binary head, say): they keep BertModel's
/// initialisation, which fine-tuning must then train.
void report_initialised(const std::string& dir, const std::vector<std::string>& names) {
  if (names.empty()) return;
  std::cout << dir << " has no tensors for " << names.size()
            << " parameters, initialised (weights N(0, initializer_range), biases 0, norms 1):";
  for (const std::string& name : names) std::cout << " " << name;
  std::cout << "\n";
}

int hf_to_checkpoint(const ConvertArgs& a) {
  const io::HfFamily& family = io::hf_family_of_folder(a.from);
  const ModelSpec c = family.read_spec(a.from);
  SingleRankModel m(c);
  report_initialised(a.from, family.import_weights(a.from, c, m.parameters()));
  Topology topo(MPI_COMM_SELF, {1, 1, 1});
  std::vector<io::CheckpointTensor> tensors;
  for (Parameter* p : m.parameters()) tensors.push_back({p, nullptr, nullptr});
  io::TrainState state;
  state.deck_text = deck_for(c);
  io::save_checkpoint(a.to, topo, tensors, state, /*keep_last=*/0);
  const std::string deck_path = a.to + "/model.deck";
  std::ofstream deck(deck_path);
  deck << state.deck_text;
  MESH_REQUIRE(deck.flush().good(), "cannot write " << deck_path);
  std::cout << "converted " << a.from << " -> " << a.to << "/"
            << io::checkpoint_file_name(0) << " (" << tensors.size() << " tensors) and "
            << deck_path << "\n";
  return 0;
}

/// The shape of `name` among a checkpoint's tensors; a UserError names the
/// file when it has none.
const Shape& stored_shape(const std::map<std::string, Shape>& shapes, const std::string& name,
                          const std::string& file) {
  const auto it = shapes.find("model/" + name);
  MESH_REQUIRE(it != shapes.end(), file << ": no tensor " << name << " (not a checkpoint of its "
                                        << "deck's model)");
  return it->second;
}

/// A T5 checkpoint's spec `c` (its deck's) with the sizes of its tensors:
/// the layers of each stack, the vocabulary (unpadded: one rank, the stored
/// rows only), d_model, the heads and buckets of the relative-bias table,
/// d_kv, d_ff, and an untied head where output_layer.weight is stored.
ModelSpec t5_sizes_of_checkpoint(ModelSpec c, const std::map<std::string, Shape>& shapes,
                                 const std::string& file) {
  auto layers_of = [&](const std::string& stack) {
    const std::regex re("^model/" + stack + R"(\.layers\.(\d+)\.)");
    std::set<int> layers;
    std::smatch m;
    for (const auto& [path, shape] : shapes)
      if (std::regex_search(path, m, re)) layers.insert(std::stoi(m[1]));
    return int(layers.size());
  };
  c.num_layers = layers_of("encoder");
  c.num_decoder_layers = layers_of("decoder");
  const Shape& word = stored_shape(shapes, "embedding.word.weight", file);
  c.vocab_size = c.padded_vocab_size = int(word[0]);
  c.hidden_size = int(word[1]);
  const Shape& bias = stored_shape(shapes, "encoder.relative_bias.weight", file);
  c.relative_attention_num_buckets = int(bias[0]);
  auto& a = c.block.attention;
  a.num_heads = a.num_query_groups = int(bias[1]);
  a.head_dim = int(stored_shape(shapes, "encoder.layers.0.attention.qkv.weight", file)[1]) /
               (3 * a.num_heads);
  c.block.mlp.ffn_hidden_size =
      int(stored_shape(shapes, "encoder.layers.0.mlp.proj.weight", file)[0]);
  c.tie_word_embeddings = !shapes.count("model/output_layer.weight");
  c.hidden_dropout = c.attention_dropout = 0;
  return c;
}

/// The model shape from the checkpoint's tensors and its deck.
ModelSpec config_of_checkpoint(const io::CheckpointInfo& info) {
  RunConfig deck = RunConfig::from_text(info.state.deck_text, {}, info.path + " (deck)");
  std::map<std::string, Shape> shapes;
  std::set<int> layers;
  static const std::regex layer_re(R"(^model/layers\.(\d+)\.)");
  for (const auto& t : info.tensors) {
    shapes[t.path] = t.shape;
    std::smatch m;
    if (std::regex_search(t.path, m, layer_re)) layers.insert(std::stoi(m[1]));
  }
  if (deck.model.arch == "t5")
    return t5_sizes_of_checkpoint(model_spec_from_deck(deck, 0, 1), shapes, info.path);
  MESH_REQUIRE(shapes.count("model/embedding.word.weight") && !layers.empty(),
               info.path << ": not a model checkpoint (no word embedding or layers)");
  // The architecture from the deck, the sizes from the tensors; the
  // vocabulary unpadded (one rank, the stored rows only).
  ModelSpec c = model_spec_from_deck(deck, /*vocab_size=*/0, /*tp=*/1);
  c.num_layers = int(layers.size());
  c.vocab_size = int(shapes["model/embedding.word.weight"][0]);
  c.padded_vocab_size = c.vocab_size;
  c.hidden_size = int(shapes["model/embedding.word.weight"][1]);
  // Without a learned position table (rotary) the deck's context stands.
  if (shapes.count("model/embedding.position.weight"))
    c.max_positions = int(shapes["model/embedding.position.weight"][0]);
  c.seq_length = c.max_positions;
  if (shapes.count("model/embedding.token_type.weight"))
    c.num_token_types = int(shapes["model/embedding.token_type.weight"][0]);
  // A gated MLP's fc holds the gate and the value side by side.
  c.block.mlp.ffn_hidden_size = int(shapes["model/layers.0.mlp.fc.weight"][1]) /
                                (is_gated(c.block.mlp.activation) ? 2 : 1);
  c.hidden_dropout = c.attention_dropout = 0;
  return c;
}

int checkpoint_to_hf(const ConvertArgs& a) {
  const io::CheckpointInfo info = io::inspect_checkpoint(a.from);
  MESH_REQUIRE(info.checksums_ok(), a.from << ": checksum failure (run meshtron inspect)");
  const ModelSpec c = config_of_checkpoint(info);
  SingleRankModel m(c);
  Topology topo(MPI_COMM_SELF, {1, 1, 1});
  std::vector<io::CheckpointTensor> tensors;
  for (Parameter* p : m.parameters()) tensors.push_back({p, nullptr, nullptr});
  io::TrainState state;
  io::load_checkpoint(a.from, topo, tensors, state, /*load_optimizer=*/false);

  const io::HfFamily& family = io::hf_family_of_spec(c);
  const std::size_t written = family.export_model(a.to, c, m.parameters());
  std::cout << "converted " << a.from << " (iteration " << info.state.iteration << ") -> "
            << a.to << " (" << family.name << ", " << written << " tensors)\n";
  return 0;
}

}  // namespace

int run_convert(const std::vector<std::string>& args) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MESH_REQUIRE(world == 1, "convert runs on one rank (got " << world << ")");
  const ConvertArgs a = parse_convert_args(args);
  return a.from_hf ? hf_to_checkpoint(a) : checkpoint_to_hf(a);
}

}  // namespace meshtron::app
