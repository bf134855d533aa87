// The deck's model against the one a checkpoint was written for: a deck
// that differs is a one-line error naming the first architecture key that
// differs, before any tensor is read (the tensors' shapes alone would name
// a tensor, not the key to fix).
#include <sstream>

#include "app/commands.hpp"
#include "common/error.hpp"

namespace meshtron::app {

namespace {

/// One architecture key as both decks resolve it.
struct ModelKey {
  const char* name;
  std::string deck, checkpoint;
};

template <class T>
std::string text(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

/// The keys that decide the weights' shapes and meaning. Dropouts, the
/// sequence length (up to max_position_embeddings) and the initialisation
/// may differ: fine-tuning changes them. The vocabulary is compared when
/// both decks state it (otherwise the tensors' shapes still are).
std::vector<ModelKey> architecture(const ModelSection& d, const ModelSection& k) {
  std::vector<ModelKey> keys = {
      {"model.arch", d.arch, k.arch},
      {"model.num_layers", text(d.num_layers), text(k.num_layers)},
      {"model.hidden_size", text(d.hidden_size), text(k.hidden_size)},
      {"model.num_attention_heads", text(d.num_attention_heads), text(k.num_attention_heads)},
      {"model.ffn_hidden_size", text(d.ffn()), text(k.ffn())},
      {"model.max_position_embeddings", text(d.max_positions()), text(k.max_positions())},
      {"model.layernorm_epsilon", text(d.layernorm_epsilon), text(k.layernorm_epsilon)},
      {"model.normalization", d.normalization, k.normalization},
      {"model.position_embedding_type", d.position_embedding_type, k.position_embedding_type},
      {"model.num_query_groups", text(d.query_groups()), text(k.query_groups())},
      {"model.kv_channels", text(d.head_dim()), text(k.head_dim())},
      {"model.rotary_percent", text(d.rotary_percent), text(k.rotary_percent)},
      {"model.rotary_base", text(d.rotary_base), text(k.rotary_base)},
      {"model.rotary_interleaved", text(d.rotary_interleaved), text(k.rotary_interleaved)},
      {"model.activation", d.activation, k.activation},
      {"model.add_bias_linear", text(d.add_bias_linear), text(k.add_bias_linear)},
      {"model.untie_embeddings_and_output_weights",
       text(d.untie_embeddings_and_output_weights), text(k.untie_embeddings_and_output_weights)},
      {"model.parallel_residual", text(d.parallel_residual), text(k.parallel_residual)},
      {"model.embedding_norm", text(d.embedding_norm), text(k.embedding_norm)},
      {"model.decoder_num_layers", text(d.decoder_layers()), text(k.decoder_layers())},
      {"model.relative_attention_num_buckets", text(d.relative_attention_num_buckets),
       text(k.relative_attention_num_buckets)},
      {"model.relative_attention_max_distance", text(d.relative_attention_max_distance),
       text(k.relative_attention_max_distance)}};
  if (d.vocab_size > 0 && k.vocab_size > 0)
    keys.push_back({"model.vocab_size", text(d.vocab_size), text(k.vocab_size)});
  return keys;
}

}  // namespace

void require_same_model(const RunConfig& deck, const std::string& checkpoint_deck_text,
                        const std::string& checkpoint_path) {
  if (checkpoint_deck_text.empty()) return;  // nothing to compare with: shapes decide
  const RunConfig written =
      RunConfig::from_text(checkpoint_deck_text, {}, checkpoint_path + " (its deck)");
  for (const ModelKey& key : architecture(deck.model, written.model))
    MESH_REQUIRE(key.deck == key.checkpoint,
                 "the deck's model does not match checkpoint '"
                     << checkpoint_path << "': " << key.name << " = " << key.deck
                     << " in the deck, " << key.checkpoint
                     << " in the checkpoint (start from the checkpoint's model deck)");
}

}  // namespace meshtron::app
