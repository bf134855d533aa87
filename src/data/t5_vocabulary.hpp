// T5's special ids over a SentencePiece model, as transformers' T5Tokenizer
// reads them:
//  - sentinels <extra_id_0> ... <extra_id_{n-1}>: the model's own pieces
//    when it has all of them (T5's and mT5's spiece.model), else n ids
//    appended after its vocabulary in T5Tokenizer's order, <extra_id_0> the
//    last id (vocab + n - 1) and <extra_id_{n-1}> the first (vocab);
//  - pad: the model's <pad>, else its <unk> (a model trained without a pad,
//    as validation/sentencepiece-brown, whose <unk> is id 0 like T5's pad);
//    it is also the decoder's first input (transformers' T5:
//    decoder_start_token_id = pad_token_id);
//  - eos: the model's </s>, the last label of every sample.
// Span masking treats every piece as a word: Megatron's masking starts a
// word at every token that does not begin with "##", which no SentencePiece
// piece does.
#pragma once

#include <span>
#include <string>

#include "data/masking.hpp"
#include "data/tokenizer.hpp"

namespace meshtron::data {

/// The ids above for `tokenizer` (a SentencePieceTokenizer) and
/// `extra_ids` sentinels; vocab_size counts the appended sentinels.
/// UserError (one line) for another tokenizer, a model without </s>, no
/// sentinels, or a model with only some of the <extra_id_N> pieces.
SpecialTokens t5_special_tokens(const Tokenizer& tokenizer, int extra_ids);

/// T5Tokenizer's text of `ids`: the tokenizer's decode, each sentinel that
/// lies after its vocabulary spelled "<extra_id_N>" (an added token of
/// transformers' T5Tokenizer, which the SentencePiece model cannot decode).
/// `special`: t5_special_tokens of `tokenizer`.
std::string t5_decode(const Tokenizer& tokenizer, const SpecialTokens& special,
                      std::span<const std::int32_t> ids);

}  // namespace meshtron::data
