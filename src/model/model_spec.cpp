#include "model/model_spec.hpp"

#include <utility>

#include "common/error.hpp"

namespace meshtron {

namespace {

template <class E, std::size_t N>
using Names = std::pair<E, const char*>[N];

template <class E, std::size_t N>
std::string name_of(E v, const Names<E, N>& names) {
  for (const auto& [value, name] : names)
    if (value == v) return name;
  MESH_VERIFY(false, "enum value without a name");
  return {};
}

template <class E, std::size_t N>
E parse(const std::string& s, const std::string& what, const Names<E, N>& names) {
  std::string list;
  for (const auto& [value, name] : names) {
    if (s == name) return value;
    list += (list.empty() ? "" : " | ") + std::string(name);
  }
  throw UserError(MESH_MSG(what << " = '" << s << "' is not one of " << list));
}

constexpr Names<NormKind, 2> kNormKinds = {{NormKind::LayerNorm, "LayerNorm"},
                                           {NormKind::RMSNorm, "RMSNorm"}};
constexpr Names<NormPlacement, 2> kPlacements = {{NormPlacement::Pre, "pre"},
                                                 {NormPlacement::Post, "post"}};
constexpr Names<AttentionMask, 3> kMasks = {{AttentionMask::Causal, "causal"},
                                            {AttentionMask::Padding, "padding"},
                                            {AttentionMask::None, "none"}};
constexpr Names<PositionEmbedding, 5> kPositions = {
    {PositionEmbedding::LearnedAbsolute, "learned_absolute"},
    {PositionEmbedding::Rope, "rope"},
    {PositionEmbedding::Alibi, "alibi"},
    {PositionEmbedding::Relative, "relative"},
    {PositionEmbedding::None, "none"}};
constexpr Names<Activation, 6> kActivations = {{Activation::Gelu, "gelu"},
                                               {Activation::GeluTanh, "gelu_tanh"},
                                               {Activation::Relu, "relu"},
                                               {Activation::Swiglu, "swiglu"},
                                               {Activation::Geglu, "geglu"},
                                               {Activation::GegluTanh, "geglu_tanh"}};

}  // namespace

std::string to_string(NormKind v) { return name_of(v, kNormKinds); }
std::string to_string(NormPlacement v) { return name_of(v, kPlacements); }
std::string to_string(AttentionMask v) { return name_of(v, kMasks); }
std::string to_string(PositionEmbedding v) { return name_of(v, kPositions); }
std::string to_string(Activation v) { return name_of(v, kActivations); }

NormKind parse_norm_kind(const std::string& s, const std::string& what) {
  return parse(s, what, kNormKinds);
}
NormPlacement parse_norm_placement(const std::string& s, const std::string& what) {
  return parse(s, what, kPlacements);
}
AttentionMask parse_attention_mask(const std::string& s, const std::string& what) {
  return parse(s, what, kMasks);
}
PositionEmbedding parse_position_embedding(const std::string& s, const std::string& what) {
  return parse(s, what, kPositions);
}
Activation parse_activation(const std::string& s, const std::string& what) {
  return parse(s, what, kActivations);
}

AttentionSpec AttentionSpec::multi_head(int hidden, int heads) {
  AttentionSpec a;
  a.num_heads = heads;
  a.num_query_groups = heads;
  a.head_dim = hidden / heads;
  return a;
}

void require_built(bool built, const char* layer, const std::string& setting) {
  MESH_REQUIRE(built, layer << ": " << setting << " is not built yet");
}

int padded_vocab_size(int vocab, int divisible_by, int tp) {
  const int multiple = divisible_by * tp;
  return (vocab + multiple - 1) / multiple * multiple;
}

std::string padded_vocab_message(int vocab, int padded) {
  return MESH_MSG("padded vocab (size: " << vocab << ") with " << padded - vocab
                                         << " dummy tokens (new size: " << padded << ")");
}

}  // namespace meshtron
