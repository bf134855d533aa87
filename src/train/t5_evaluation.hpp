// Evaluation of a T5 model (model.arch = t5) on explicit examples
// (evaluate.inputs), scored as transformers' T5ForConditionalGeneration
// scores them: the cross-entropy of the decoder's logits summed over every
// labelled token (label != -100) of every row, divided by their number
// (CrossEntropyLoss(ignore_index = -100) of one batch holding every row),
// and each row's own mean over its labelled tokens.
//
// A row is one JSON object a line:
//   {"input_ids": [...], "attention_mask": [...], "labels": [...],
//    "decoder_input_ids": [...]}
// input_ids 1 to model.seq_length ids (the encoder's); attention_mask
// (default 1) the same length, with at least one 1; labels 1 to
// model.decoder_seq_length ids or -100; decoder_input_ids (optional) as
// many ids as labels, by default transformers' shift right of the labels:
// decoder_start_token_id first, then labels[0 .. n-2] with -100 read as
// the pad id (T5Config: decoder_start_token_id = pad_token_id = 0).
//
// A row is padded to the deck's lengths: the encoder with id 0 and mask 0
// (keys masked out, and T5's relative positions do not depend on the
// length, so the real tokens score as unpadded); the decoder with id 0,
// label -100 and decoder mask 0 (causal attention: a real token never sees
// the padding after it).
//
// Batching as evaluate_rows (evaluation.hpp): rows [k G, (k + 1) G) make
// batch k, dealt to the dp ranks' micro-batches by DataLayout::sample_offset;
// slots past the last row hold a one-token filler without labels.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/t5_samples.hpp"
#include "train/data_source.hpp"

namespace meshtron {

class Trainer;

/// T5's decoder_start_token_id and pad id (transformers' T5Config).
constexpr std::int32_t kT5DecoderStartId = 0;

/// The rows of a JSONL file (blank lines skipped), padded to
/// encoder_length / decoder_length. Every rank reads the whole file, so a
/// malformed line, a field of the wrong length or out of range, or a row
/// without a real encoder token is a UserError naming the file, the line
/// and the field.
std::vector<data::T5Sample> t5_jsonl_rows(const std::string& path, std::int64_t encoder_length,
                                          std::int64_t decoder_length, int vocab);

/// Each row's summed cross-entropy over its labelled tokens and their
/// number: this rank's rows filled in on the last pipeline stage, the others
/// 0 (the caller sums them over the pipeline and dp).
struct T5RowScores {
  std::vector<double> loss_sum, labelled;
};

/// The scores of `rows` under `trainer` (a T5 model on any pipeline);
/// `layout` as evaluate_rows takes it, with decoder_seq_length set.
/// Collective over the pipeline.
T5RowScores score_t5_rows(Trainer& trainer, const std::vector<data::T5Sample>& rows,
                          const DataLayout& layout);

}  // namespace meshtron
