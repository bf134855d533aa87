// Evaluation of a BERT model (model.arch = bert) on explicit examples
// (evaluate.inputs), scored as transformers' MegatronBertForPreTraining /
// BertForPreTraining scores them:
//
//   MLM loss         the cross-entropy of the prediction logits summed over
//                    every labelled token (label != -100) of every row,
//                    divided by their number (transformers' masked_lm_loss
//                    of one batch holding every row);
//   binary accuracy  argmax of the seq-relationship logits == the row's
//                    next_sentence_label, over the rows that carry one.
//
// A row is one JSON object a line:
//   {"input_ids": [...], "token_type_ids": [...], "attention_mask": [...],
//    "labels": [...], "next_sentence_label": 0 | 1}
// input_ids 1 to model.seq_length ids; token_type_ids (default 0),
// attention_mask (default 1) and labels (default -100) the same length;
// next_sentence_label optional. A row is padded to seq_length with id 0,
// token type 0, attention mask 0 and label -100: keys masked out and
// positions that start at 0 in every row leave its scores as unpadded.
//
// evaluate.output's "samples" are then the rows with a next_sentence_label
// (the accuracy's denominator), "masked_tokens" the labelled tokens (the MLM
// loss's); the accuracy or the MLM loss is null where the rows hold no
// next_sentence_label or no labelled token.
//
// Batching as evaluate_rows (evaluation.hpp): rows [k G, (k + 1) G) make
// batch k, dealt to the dp ranks' micro-batches by DataLayout::sample_offset;
// slots past the last row hold a one-token filler that nothing counts.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/bert_samples.hpp"
#include "model/bert_model.hpp"
#include "train/data_source.hpp"

namespace meshtron {

class Trainer;

struct BertEvalRow {
  data::BertSample sample;     ///< padded to seq_length; is_random = next_sentence_label
  bool has_next_sentence = false;
};

/// The rows of a JSONL file (blank lines skipped). Every rank reads the
/// whole file, so a malformed line, a field of the wrong length or out of
/// range, or a row without a real token is a UserError naming the file and
/// the line.
std::vector<BertEvalRow> bert_jsonl_rows(const std::string& path, std::int64_t seq_length,
                                         int vocab, int num_token_types);

/// The last stage's view of micro-batch rows: `first` is the index in
/// `samples` of the micro-batch's row 0 (rows past the end are fillers).
using BertHeadFn = std::function<void(std::int64_t first, const BertModel::Cache& cache)>;

/// `samples` (each seq_length long) through `trainer`'s evaluation schedule
/// (any pipeline) in whole batches of `layout`, as score_bert_rows batches
/// them; `on_head` on the last stage after each micro-batch's forward.
/// Collective over the pipeline.
void evaluate_bert_samples(Trainer& trainer, const std::vector<data::BertSample>& samples,
                           const DataLayout& layout, const BertHeadFn& on_head);

/// The summed scores of `rows` under `trainer` (a BERT model on any
/// pipeline), this rank's share (0 off the last stage); the caller sums them
/// over the pipeline and dp. `layout` as evaluate_rows takes it. Collective
/// over the pipeline.
BertModel::Scores score_bert_rows(Trainer& trainer, const std::vector<BertEvalRow>& rows,
                                  const DataLayout& layout);

}  // namespace meshtron
