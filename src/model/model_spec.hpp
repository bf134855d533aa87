// ModelSpec: the model's architecture and shape as the layers need it, a
// plain struct of sizes and enums. The deck (config/model_spec_from_deck)
// and each Hugging Face config.json (io/hf/) fill one; src/model/ reads it
// and knows neither.
//
// The defaults describe GPT-2: pre-LayerNorm with biases, learned absolute
// positions, causal multi-head attention, the tanh GeLU, biases on every
// linear layer, the LM head tied to the word embedding. A layer rejects, at
// construction, a value it does not compute yet (a one-line UserError), so
// a spec never silently runs as another architecture.
#pragma once

#include <string>

namespace meshtron {

enum class NormKind { LayerNorm, RMSNorm };
enum class NormPlacement { Pre, Post };  ///< before each branch (GPT-2) or after its residual add
enum class AttentionMask { Causal, Padding, None };
/// Relative: T5's learned bias per head and relative-position bucket,
/// added to the attention scores (no position enters the embedding).
enum class PositionEmbedding { LearnedAbsolute, Rope, Alibi, Relative, None };
/// Gelu is the exact erf GeLU; GeluTanh the tanh approximation of GPT-2
/// ("gelu_new"); Swiglu, Geglu and GegluTanh gate one projection by
/// another (GegluTanh: T5 v1.1's and mT5's "gated-gelu", gelu_new).
enum class Activation { Gelu, GeluTanh, Relu, Swiglu, Geglu, GegluTanh };

/// Names as Megatron-LM's flags spell them: "LayerNorm", "RMSNorm";
/// "pre", "post"; "causal", "padding", "none"; "learned_absolute", "rope",
/// "alibi", "none"; "gelu", "gelu_tanh", "relu", "swiglu", "geglu", "geglu_tanh".
std::string to_string(NormKind v);
std::string to_string(NormPlacement v);
std::string to_string(AttentionMask v);
std::string to_string(PositionEmbedding v);
std::string to_string(Activation v);
/// The inverses; `what` names the value in the UserError for an unknown one
/// ("model.normalization = 'Foo' is not one of LayerNorm | RMSNorm").
NormKind parse_norm_kind(const std::string& s, const std::string& what);
NormPlacement parse_norm_placement(const std::string& s, const std::string& what);
AttentionMask parse_attention_mask(const std::string& s, const std::string& what);
PositionEmbedding parse_position_embedding(const std::string& s, const std::string& what);
Activation parse_activation(const std::string& s, const std::string& what);

/// Which model a spec builds: a causal LM (GptModel: the LM head and its
/// next-token loss), BERT's pre-training model (BertModel: the masked-LM
/// head, the pooler and the binary head) or T5's encoder-decoder (T5Model,
/// as transformers' T5ForConditionalGeneration).
enum class ModelClass { CausalLm, BertPretraining, T5 };

/// Whether the MLP's first projection is a gate and a value (3 matrices).
inline bool is_gated(Activation a) {
  return a == Activation::Swiglu || a == Activation::Geglu || a == Activation::GegluTanh;
}

struct NormSpec {
  NormKind kind = NormKind::LayerNorm;
  double epsilon = 1e-5;
  NormPlacement placement = NormPlacement::Pre;
  bool bias = true;
};

struct AttentionSpec {
  int num_heads = 4;
  int num_query_groups = 4;  ///< key/value heads: num_heads for multi-head attention
  int head_dim = 16;         ///< kv_channels
  AttentionMask mask = AttentionMask::Causal;
  PositionEmbedding position = PositionEmbedding::LearnedAbsolute;
  double rotary_percent = 1.0;  ///< share of head_dim rotated (rope)
  double rotary_base = 10000;
  bool rotary_interleaved = false;  ///< rotate (x0, x1) pairs rather than the two halves
  bool bias = true;                 ///< on qkv and the output projection
  /// Scores divided by sqrt(head_dim) before the softmax; T5 does not (its
  /// initialisation absorbs the factor).
  bool scale_scores = true;
  std::string backend = "auto";     ///< auto | fused | unfused (model.attention_backend)

  /// Multi-head attention over `hidden` split into `heads` heads, the rest default.
  static AttentionSpec multi_head(int hidden, int heads);
  /// q, k and v together: (heads + 2 groups) x head_dim columns.
  int qkv_width() const { return (num_heads + 2 * num_query_groups) * head_dim; }
  int context_width() const { return num_heads * head_dim; }
};

struct MlpSpec {
  int ffn_hidden_size = 256;
  Activation activation = Activation::GeluTanh;
  bool bias = true;
};

/// One transformer block: its norms, self-attention and MLP.
struct BlockSpec {
  NormSpec norm;
  AttentionSpec attention;
  MlpSpec mlp;
};

struct ModelSpec {
  int num_layers = 2;
  int hidden_size = 64;
  int seq_length = 16;
  int max_positions = 16;        ///< rows of the learned position table
  int vocab_size = 1000;         ///< real vocabulary
  int padded_vocab_size = 1024;  ///< multiple of divisible_by x tp
  bool tie_word_embeddings = true;  ///< the LM head multiplies by the word table
  double init_std = 0.02;
  double hidden_dropout = 0.0;
  double attention_dropout = 0.0;
  BlockSpec block;
  /// Attention and MLP read the same normed input and add to one residual
  /// (GPT-J, GPT-NeoX) instead of one after the other.
  bool parallel_residual = false;
  bool embedding_norm = false;  ///< a norm right after the embedding (BLOOM)
  ModelClass model_class = ModelClass::CausalLm;
  /// Rows of the token-type (segment) table added to the input embedding
  /// (BERT's type_vocab_size); 0: none.
  int num_token_types = 0;

  // T5 (model_class T5): num_layers and seq_length are the encoder's.
  int num_decoder_layers = 0;
  int decoder_seq_length = 0;
  /// PositionEmbedding::Relative: T5's relative_attention_num_buckets and
  /// relative_attention_max_distance.
  int relative_attention_num_buckets = 32;
  int relative_attention_max_distance = 128;

  int num_heads() const { return block.attention.num_heads; }
  int head_dim() const { return block.attention.head_dim; }
  int ffn_hidden_size() const { return block.mlp.ffn_hidden_size; }
  /// A norm after the last block: pre-norm blocks leave the residual stream
  /// un-normed; post-norm blocks end in their own norm (Google BERT's
  /// encoder has none after it).
  bool has_final_norm() const { return block.norm.placement == NormPlacement::Pre; }
  /// Positions per sample of a stage's per-token loss (stage_model.hpp):
  /// the decoder's for T5, else seq_length.
  int loss_length() const { return model_class == ModelClass::T5 ? decoder_seq_length : seq_length; }
};

/// A layer's check of a spec value at construction: a UserError
/// "<layer>: <setting> is not built yet" unless `built`.
void require_built(bool built, const char* layer, const std::string& setting);

/// Megatron's vocabulary padding: round up to a multiple of divisible_by x tp.
int padded_vocab_size(int vocab, int divisible_by, int tp);
/// "padded vocab (size: 50257) with 175 dummy tokens (new size: 50432)"
std::string padded_vocab_message(int vocab, int padded);

}  // namespace meshtron
