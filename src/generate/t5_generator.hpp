// T5Generator: encoder-decoder generation with T5Model, as transformers'
// generate() runs T5ForConditionalGeneration. A request's prompt is the
// encoder's input; its result's ids are the decoder's generated tokens
// (decoder_start_token_id not included).
//
//   1. encode: the prompts right-padded with the pad id to the longest
//      (masked: the encoder's padding mask and the cross-attention's key
//      mask), one encoder forward for the whole batch;
//   2. expand: each prompt's encoder rows repeated for its num_beams
//      decoder sequences (sequence i * num_beams + k), as transformers'
//      _expand_inputs_for_generation repeats encoder_outputs;
//   3. decode: every sequence starts from decoder_start_token_id and feeds
//      one token per step through T5Model::decode_step (a self-attention
//      cache per decoder layer, its relative bias at the row's absolute
//      position; cross-attention keys and values computed once). All
//      sequences step together; a finished one is fed the pad id and its
//      row ignored, as transformers pads finished sequences.
//
// Choosing tokens reuses the GPT generator's pieces: choose_tokens (greedy,
// or sampling keyed by (seed, prompt index, decoder position) where the
// start token is position 0, never by rank) and beam search's
// advance_beams / best_hypothesis with beam_candidates, the self caches
// reordered by source beam between steps. Tensor parallel through the
// model's tp group (vocab-parallel logits, small collectives); the whole
// model on one pipeline stage.
#pragma once

#include <cstdint>
#include <vector>

#include "generate/generator.hpp"
#include "model/t5_model.hpp"

namespace meshtron::generate {

/// The decoder side of one batch: encoded once, `copies` decoder sequences
/// per prompt (sequence i * copies + k reads prompt i's encoder output).
class T5Decoding {
 public:
  /// `ctx`: the model's tp group and memory space (copied; the batch
  /// sizes are set here). `model` not owned.
  T5Decoding(const T5Model& model, const std::vector<Request>& batch, int copies,
             index_t capacity, std::int32_t pad_id, const LayerContext& ctx);
  /// Feeds one token per sequence (ids.size() == sequences()) at the next
  /// decoder position; this rank's vocabulary shard of their logits
  /// [sequences, V_pad/tp]. Collective over tp.
  Tensor step(const std::vector<std::int32_t>& ids);
  /// Sequence to[j]'s self-attention caches become copies of from[j]'s
  /// (every source read before any is written).
  void reorder(const std::vector<index_t>& to, const std::vector<index_t>& from);
  index_t sequences() const { return ctx_.micro_batch; }
  /// Decoder tokens fed so far (the start token included).
  index_t position() const { return state_.position; }

 private:
  const T5Model& model_;  ///< Not owned.
  LayerContext ctx_;
  T5Model::DecoderState state_;
};

class T5Generator {
 public:
  /// `model` and `tp` (the model's tp group) not owned. decoder_start_id:
  /// transformers' decoder_start_token_id (T5: the pad id, 0); finished
  /// sequences are fed pad_id.
  T5Generator(const T5Model& model, TensorParallelGroup& tp, MemorySpace space,
              std::int32_t decoder_start_id = 0, std::int32_t pad_id = 0);
  /// Collective over the tp group; every rank passes the same batch and
  /// gets the same results. Result::prompt is the encoder's input.
  std::vector<Result> generate(const std::vector<Request>& batch, const GenerateParams& params,
                               const TokenCallback& on_token = {});
  /// Bytes of this rank's decoder caches for `sequences` sequences of
  /// `capacity` tokens over an encoder input of `encoder_length` tokens.
  index_t cache_bytes(index_t sequences, index_t capacity, index_t encoder_length,
                      DType dtype) const;

 private:
  std::vector<Result> generate_sampled(const std::vector<Request>& batch, const GenerateParams& p,
                                       const TokenCallback& on_token);
  std::vector<Result> generate_beam(const std::vector<Request>& batch, const GenerateParams& p,
                                    const TokenCallback& on_token);
  index_t vocab_begin() const;

  const T5Model& model_;  ///< Not owned.
  LayerContext ctx_;
  std::int32_t start_id_, pad_id_;
};

}  // namespace meshtron::generate
