// Generator: KV-cached decoding of a batch of prompts on one model replica
// (a tp x pp grid; dp ranks each run their own batches). A request in,
// tokens out, a callback per token: the engine of `meshtron generate`, of
// training's sample lines and of an HTTP handler.
//
//   1. cache: per stage layer, [slots, kv groups / tp, capacity, head_dim]
//      for k and v, sized once from (prompts x beams, longest prompt +
//      max_new_tokens) and reported by cache_bytes();
//   2. prefill: every prompt token of the batch in one forward, each row
//      placed at (its prompt's slot, its position); logits of each prompt's
//      last row only;
//   3. decode: one row per unfinished sequence per step, at the next
//      position, until max_new_tokens, a stop id, or the stop predicate.
//
// Pipeline: stage p receives a step's hidden states from p - 1; the last
// stage chooses the tokens (tp collectives, sampler.hpp). Greedy and sampled
// decoding split the batch into micro-batches (GenerateParams::micro_batches)
// of contiguous prompts, each in its own cache slots, and visit them round
// robin: step k of micro-batch m, then step k of m + 1, ..., then step k + 1
// of m once its tokens have come back. While stage p runs micro-batch m,
// stage p - 1 runs m + 1, so with pp micro-batches every stage is busy. The
// last stage sends each step's choices to every other stage at once
// (isend); a stage receives them when it next needs that micro-batch, so
// every rank of the replica holds the same sequences, and every rank runs
// the same (step, micro-batch) order: each wait is for an earlier task or an
// earlier stage of the same one, so the order cannot deadlock. Beam search
// (beam_search.cpp) keeps the whole batch as one micro-batch and broadcasts
// its candidates over the pipeline each step: pipelining it would need each
// micro-batch's hypotheses, slot reorders and candidates kept apart in the
// same way. Interleaved model chunks are visited in their global order
// within a task.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "generate/sampler.hpp"
#include "model/gpt_model.hpp"
#include "train/runtime.hpp"

namespace meshtron::generate {

enum class Decoding { Greedy, Sample, Beam };
/// "greedy" | "sample" | "beam" (validated by RunConfig).
Decoding decoding_from_string(const std::string& s);

struct GenerateParams {
  Decoding decoding = Decoding::Greedy;
  int max_new_tokens = 32;
  double temperature = 1.0;
  int top_k = 0;
  double top_p = 1.0;
  std::uint64_t seed = 1234;
  int num_beams = 1;
  double length_penalty = 1.0;
  bool early_stopping = false;
  /// Micro-batches of the batch in flight over the pipeline stages; 0 =
  /// auto: min(pp, prompts). Clamped to the number of prompts; beam: 1.
  int micro_batches = 0;
  /// Ids that end a sequence (kept as its last token); the EOD / EOS id.
  std::vector<std::int32_t> stop_ids;
  /// Ends a sequence when true for its generated ids so far (stop strings);
  /// must give the same answer on every rank.
  std::function<bool(const std::vector<std::int32_t>&)> stop_when;
};

struct Request {
  std::int64_t index = 0;  ///< the prompt's index in the whole request (RNG key)
  std::vector<std::int32_t> prompt;
};

struct Result {
  std::int64_t index = 0;
  std::vector<std::int32_t> prompt, ids;
  std::vector<double> logprobs;  ///< log p(id) under the model, per generated id
  std::string finish_reason;     ///< "stop" | "length"
};

/// Called on every rank of the replica as each token is chosen.
using TokenCallback = std::function<void(std::int64_t index, std::int32_t id, double logprob)>;

/// int32 [ids.size()] on the host.
Tensor ids_tensor(const std::vector<std::int32_t>& ids);

/// The pipeline's share of the last stage's decisions: `root`'s choices
/// (every rank passes as many) become every rank's of the group `pp`.
void broadcast_choices(Communicator& pp, int root, std::vector<TokenChoice>& choices);
/// Likewise up to `n` candidates of each group (every rank passes as many groups).
void broadcast_candidates(Communicator& pp, int root,
                          std::vector<std::vector<BeamCandidate>>& groups, int n);

class Generator {
 public:
  /// `chunks`: this rank's model chunks (Trainer::chunks order: chunk c is
  /// global chunk c * pp + pp_rank). Not owned.
  Generator(const std::vector<GptModel*>& chunks, ParallelRuntime& rt, DType dtype);
  /// Collective over the replica (tp x pp); every rank passes the same
  /// batch and gets the same results.
  std::vector<Result> generate(const std::vector<Request>& batch, const GenerateParams& params,
                               const TokenCallback& on_token = {});
  /// Bytes of the cache of this rank for `slots` sequences of `capacity`
  /// tokens.
  index_t cache_bytes(index_t slots, index_t capacity) const;
  /// Positions the model can take (model.max_position_embeddings, else
  /// seq_length).
  index_t context_length() const;
  /// Micro-batches that generate() runs `prompts` prompts in under `params`.
  int micro_batches(std::size_t prompts, const GenerateParams& params) const;

  /// One cached forward through the pipeline: on the last stage this rank's
  /// vocabulary shard of the logits of rows.logit_rows, elsewhere an empty
  /// tensor. Collective over the replica.
  Tensor forward(const Tensor& ids, const CachedRows& rows, std::vector<KvCache>& kv);
  std::vector<KvCache> make_cache(index_t slots, index_t capacity) const;

 private:
  bool last_stage() const;
  /// Last stage: the tokens of the rows of `logits`, one per `active`
  /// sequence of `out` (drawn at its next position).
  std::vector<TokenChoice> choose(const Tensor& logits, const std::vector<std::size_t>& active,
                                  const std::vector<Result>& out, const SamplingParams& s);
  /// Broadcasts up to `n` candidates of each group from the last stage to
  /// every pp rank.
  void share_candidates(std::vector<std::vector<BeamCandidate>>& groups, int n);
  index_t vocab_begin() const;
  std::vector<Result> generate_sampled(const std::vector<Request>& batch, const GenerateParams& p,
                                       const TokenCallback& on_token);
  std::vector<Result> generate_beam(const std::vector<Request>& batch, const GenerateParams& p,
                                    const TokenCallback& on_token);
  int global_chunks() const { return int(chunks_.size()) * rt_.topo.pp(); }

  std::vector<GptModel*> chunks_;  ///< Not owned.
  ParallelRuntime& rt_;
  DType dtype_;
  LayerContext ctx_;
};

}  // namespace meshtron::generate
