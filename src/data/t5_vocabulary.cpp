#include "data/t5_vocabulary.hpp"

#include <algorithm>
#include <string>

#include "common/error.hpp"
#include "data/sentencepiece_tokenizer.hpp"

namespace meshtron::data {

namespace {

std::string extra_id(int k) { return "<extra_id_" + std::to_string(k) + ">"; }

/// The model's own sentinel ids, or none when it has no <extra_id_0>.
std::vector<std::int32_t> own_sentinels(const SentencePieceTokenizer& sp, int extra_ids) {
  std::vector<std::int32_t> ids;
  if (sp.piece_id(extra_id(0)) < 0) return ids;
  for (int k = 0; k < extra_ids; ++k) {
    const std::int32_t id = sp.piece_id(extra_id(k));
    MESH_REQUIRE(id >= 0, "SentencePiece model has <extra_id_0> but not " << extra_id(k)
                              << " of data.vocab_extra_ids = " << extra_ids);
    ids.push_back(id);
  }
  return ids;
}

}  // namespace

SpecialTokens t5_special_tokens(const Tokenizer& tokenizer, int extra_ids) {
  const auto* sp = dynamic_cast<const SentencePieceTokenizer*>(&tokenizer);
  MESH_REQUIRE(sp != nullptr, "model.arch = t5 reads its sentinels and pad from a SentencePiece "
                              "model: data.tokenizer = sentencepiece (got "
                                  << tokenizer.name() << ")");
  MESH_REQUIRE(extra_ids > 0, "model.arch = t5 needs data.vocab_extra_ids > 0 sentinels");
  MESH_REQUIRE(sp->eod_id() >= 0, "model.arch = t5: the SentencePiece model has no </s> (eos)");
  SpecialTokens s;
  s.pad = sp->pad_id() >= 0 ? sp->pad_id() : sp->unk_id();
  MESH_REQUIRE(s.pad >= 0, "model.arch = t5: the SentencePiece model has neither <pad> nor <unk>");
  s.bos = s.pad;
  s.eos = sp->eod_id();
  s.vocab_size = sp->vocab_size();
  s.sentinels = own_sentinels(*sp, extra_ids);
  if (s.sentinels.empty()) {
    s.vocab_size += extra_ids;
    for (int k = 0; k < extra_ids; ++k) s.sentinels.push_back(std::int32_t(s.vocab_size - 1 - k));
  }
  s.mask = s.sentinels.front();  // the masking's [MASK]; T5's encoder writes the sentinels
  return s;
}

std::string t5_decode(const Tokenizer& tokenizer, const SpecialTokens& special,
                      std::span<const std::int32_t> ids) {
  std::string text;
  std::size_t from = 0;  // the first id not yet decoded
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto k = std::find(special.sentinels.begin(), special.sentinels.end(), ids[i]);
    if (ids[i] < tokenizer.vocab_size() || k == special.sentinels.end()) continue;
    text += tokenizer.decode(ids.subspan(from, i - from)) +
            extra_id(int(k - special.sentinels.begin()));
    from = i + 1;
  }
  return text + tokenizer.decode(ids.subspan(from));
}

}  // namespace meshtron::data
