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
// model's tp group (vocab-parallel logits, small collectives).
//
// Pipeline (T5Pipeline, Megatron's split): the encoder stages encode the
// batch once, each passing its rows [s_enc*b, h] on; the last one sends the
// encoder output (after the final norm) to every decoder stage, which
// computes its blocks' cross-attention keys and values once. Each step runs
// the decoder stages one after another on the step's rows [b*K, h]; the
// last stage chooses the tokens (or the beam candidates) and broadcasts
// them over the pipeline, so every rank holds the same sequences and
// reorders its own caches, as the GPT Generator does.
#pragma once

#include <cstdint>
#include <vector>

#include "generate/generator.hpp"
#include "model/t5_model.hpp"

namespace meshtron::generate {

/// This rank's place in a pipeline of T5 stages: stages [0, split) hold
/// the encoder, [split, stages) the decoder. The default: the whole model
/// on this rank.
struct T5Pipeline {
  Communicator* comm = nullptr;  ///< the pp group; null: one stage. Not owned.
  int split = 0;
  DType dtype = DType::F32;      ///< the activations passed between stages
  int stages() const { return comm ? comm->size() : 1; }
  int stage() const { return comm ? comm->rank() : 0; }
  bool encodes() const { return !comm || stage() < split; }
  bool decodes() const { return !comm || stage() >= split; }
  bool last() const { return stage() == stages() - 1; }
};

/// The decoder side of one batch: encoded once, `copies` decoder sequences
/// per prompt (sequence i * copies + k reads prompt i's encoder output).
class T5Decoding {
 public:
  /// `ctx`: the model's tp group and memory space (copied; the batch
  /// sizes are set here). `model` not owned. Collective over the pipeline
  /// (the encoder stages' rows travel to the decoder stages).
  T5Decoding(const T5Model& model, const std::vector<Request>& batch, int copies,
             index_t capacity, std::int32_t pad_id, const LayerContext& ctx,
             const T5Pipeline& pipeline = {});
  /// Feeds one token per sequence (ids.size() == sequences()) at the next
  /// decoder position; this rank's vocabulary shard of their logits
  /// [sequences, V_pad/tp] on the last stage, an empty tensor on the others.
  /// Collective over tp and the pipeline.
  Tensor step(const std::vector<std::int32_t>& ids);
  /// Sequence to[j]'s self-attention caches become copies of from[j]'s
  /// (every source read before any is written).
  void reorder(const std::vector<index_t>& to, const std::vector<index_t>& from);
  index_t sequences() const { return ctx_.micro_batch; }
  /// Decoder tokens fed so far (the start token included).
  index_t position() const { return state_.position; }

 private:
  /// The encoder output of the batch on a decoder stage (through the
  /// encoder stages under a pipeline); undefined on an encoder stage.
  Tensor encoder_output(const Tensor& ids, const Tensor& mask, LayerContext& ctx) const;

  const T5Model& model_;  ///< Not owned.
  LayerContext ctx_;
  T5Pipeline pipeline_;
  T5Model::DecoderState state_;
};

class T5Generator {
 public:
  /// `model` and `tp` (the model's tp group) not owned. decoder_start_id:
  /// transformers' decoder_start_token_id (T5: the pad id, 0); finished
  /// sequences are fed pad_id.
  T5Generator(const T5Model& model, TensorParallelGroup& tp, MemorySpace space,
              std::int32_t decoder_start_id = 0, std::int32_t pad_id = 0,
              const T5Pipeline& pipeline = {});
  /// Collective over the tp group and the pipeline; every rank passes the
  /// same batch and gets the same results. Result::prompt is the encoder's
  /// input.
  std::vector<Result> generate(const std::vector<Request>& batch, const GenerateParams& params,
                               const TokenCallback& on_token = {});
  /// Bytes of this rank's decoder caches (its stage's decoder blocks) for
  /// `sequences` sequences of `capacity` tokens over an encoder input of
  /// `encoder_length` tokens.
  index_t cache_bytes(index_t sequences, index_t capacity, index_t encoder_length,
                      DType dtype) const;

 private:
  std::vector<Result> generate_sampled(const std::vector<Request>& batch, const GenerateParams& p,
                                       const TokenCallback& on_token);
  std::vector<Result> generate_beam(const std::vector<Request>& batch, const GenerateParams& p,
                                    const TokenCallback& on_token);
  index_t vocab_begin() const;
  /// The last stage's choices (or candidates) become every stage's.
  void share_choices(std::vector<TokenChoice>& choices) const;
  void share_candidates(std::vector<std::vector<BeamCandidate>>& groups, int n) const;

  const T5Model& model_;  ///< Not owned.
  LayerContext ctx_;
  std::int32_t start_id_, pad_id_;
  T5Pipeline pipeline_;
};

}  // namespace meshtron::generate
