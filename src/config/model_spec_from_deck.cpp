#include "config/model_spec_from_deck.hpp"

#include <sstream>

#include "common/error.hpp"

namespace meshtron {

namespace {

BlockSpec block_spec_from_deck(const ModelSection& m) {
  BlockSpec b;
  b.norm.kind = parse_norm_kind(m.normalization, "model.normalization");
  b.norm.epsilon = m.layernorm_epsilon;
  b.norm.placement = parse_norm_placement(m.norm_placement, "model.norm_placement");
  b.norm.bias = true;  // Megatron-LM's norms keep theirs under add_bias_linear = false
  auto& a = b.attention;
  a.num_heads = m.num_attention_heads;
  a.num_query_groups = m.query_groups();
  a.head_dim = m.head_dim();
  a.position =
      parse_position_embedding(m.position_embedding_type, "model.position_embedding_type");
  a.rotary_percent = m.rotary_percent;
  a.rotary_base = m.rotary_base;
  a.rotary_interleaved = m.rotary_interleaved;
  a.bias = m.add_bias_linear;
  a.backend = m.attention_backend;
  b.mlp.ffn_hidden_size = m.ffn();
  b.mlp.activation = parse_activation(m.activation, "model.activation");
  b.mlp.bias = m.add_bias_linear;
  return b;
}

}  // namespace

ModelSpec model_spec_from_deck(const RunConfig& run, int vocab_size, int tp) {
  const auto& m = run.model;
  ModelSpec c;
  c.num_layers = m.num_layers;
  c.hidden_size = m.hidden_size;
  c.seq_length = m.seq_length;
  c.max_positions = m.max_positions();
  c.vocab_size = m.vocab_size > 0 ? m.vocab_size : vocab_size;
  c.padded_vocab_size = padded_vocab_size(c.vocab_size, m.make_vocab_size_divisible_by, tp);
  c.tie_word_embeddings = !m.untie_embeddings_and_output_weights;
  c.init_std = m.init_method_std;
  c.hidden_dropout = m.hidden_dropout;
  c.attention_dropout = m.attention_dropout;
  c.block = block_spec_from_deck(m);
  c.parallel_residual = m.parallel_residual;
  c.embedding_norm = m.embedding_norm;
  if (m.arch == "bert") {
    c.model_class = ModelClass::BertPretraining;
    c.num_token_types = m.num_token_types;
    c.block.attention.mask = AttentionMask::Padding;
  }
  if (m.arch == "t5") {
    // transformers' T5: T5LayerNorm has no bias, q k^T is not divided by
    // sqrt(d_kv), the encoder's padding keys are masked (the decoder's
    // self-attention is causal inside T5Model).
    c.model_class = ModelClass::T5;
    c.block.norm.bias = false;
    c.block.attention.scale_scores = false;
    c.block.attention.mask = AttentionMask::Padding;
    c.num_decoder_layers = m.decoder_layers();
    c.decoder_seq_length = m.decoder_seq_length;
  }
  c.relative_attention_num_buckets = m.relative_attention_num_buckets;
  c.relative_attention_max_distance = m.relative_attention_max_distance;
  return c;
}

namespace {

/// The keys whose defaults are GPT-2's, where `c` differs from them.
void write_architecture(std::ostream& os, const ModelSpec& c) {
  const auto& n = c.block.norm;
  const auto& a = c.block.attention;
  // model.arch = bert states the padding mask (and the MLM and binary heads);
  // model.arch = t5 T5's norms without bias, its unscaled scores, its padding
  // masks and the decoder; every other family's are the defaults.
  const bool bert = c.model_class == ModelClass::BertPretraining;
  const bool t5 = c.model_class == ModelClass::T5;
  const AttentionMask mask = bert || t5 ? AttentionMask::Padding : AttentionMask::Causal;
  MESH_REQUIRE(n.bias != t5 && a.scale_scores != t5 && a.mask == mask,
               "no deck key states a norm without bias, unscaled scores or an attention mask "
               "other than causal (but model.arch = bert or model.arch = t5 for theirs)");
  if (bert) os << "arch = bert\nnum_token_types = " << c.num_token_types << "\n";
  if (t5)
    os << "arch = t5\ndecoder_num_layers = " << c.num_decoder_layers
       << "\ndecoder_seq_length = " << c.decoder_seq_length
       << "\nrelative_attention_num_buckets = " << c.relative_attention_num_buckets
       << "\nrelative_attention_max_distance = " << c.relative_attention_max_distance << "\n";
  if (n.kind != NormKind::LayerNorm) os << "normalization = " << to_string(n.kind) << "\n";
  if (n.placement != NormPlacement::Pre) os << "norm_placement = " << to_string(n.placement) << "\n";
  if (a.position != PositionEmbedding::LearnedAbsolute)
    os << "position_embedding_type = " << to_string(a.position) << "\n";
  if (a.num_query_groups != a.num_heads) os << "num_query_groups = " << a.num_query_groups << "\n";
  if (a.context_width() != c.hidden_size) os << "kv_channels = " << a.head_dim << "\n";
  if (a.position == PositionEmbedding::Rope)
    os << "rotary_percent = " << a.rotary_percent << "\nrotary_base = " << a.rotary_base
       << "\nrotary_interleaved = " << (a.rotary_interleaved ? "true" : "false") << "\n";
  if (c.block.mlp.activation != Activation::GeluTanh)
    os << "activation = " << to_string(c.block.mlp.activation) << "\n";
  MESH_REQUIRE(a.bias == c.block.mlp.bias,
               "no deck key states biases on the attention but not the MLP, or the reverse");
  if (!a.bias) os << "add_bias_linear = false\n";
  if (!c.tie_word_embeddings) os << "untie_embeddings_and_output_weights = true\n";
  if (c.parallel_residual) os << "parallel_residual = true\n";
  if (c.embedding_norm) os << "embedding_norm = true\n";
}

}  // namespace

std::string model_deck_section(const ModelSpec& c) {
  std::ostringstream os;
  os << "[model]\nnum_layers = " << c.num_layers << "\nhidden_size = " << c.hidden_size
     << "\nnum_attention_heads = " << c.num_heads()
     << "\nffn_hidden_size = " << c.ffn_hidden_size() << "\nseq_length = " << c.seq_length
     << "\nmax_position_embeddings = " << c.max_positions << "\nvocab_size = " << c.vocab_size
     << "\nlayernorm_epsilon = " << c.block.norm.epsilon << "\ninit_method_std = " << c.init_std
     << "\n";
  write_architecture(os, c);
  return os.str();
}

}  // namespace meshtron
