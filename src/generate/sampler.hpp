// Choosing the next token from vocab-parallel logits: each tp rank holds the
// logits of its vocabulary shard [rows, V_pad/tp] (LmHeadLoss::logits), and
// the choice needs only small tp collectives, never the whole vocabulary on
// one rank.
//
//   greedy   argmax (the lowest id among equal maxima, as torch.argmax):
//            every rank's (max, id) pair is all-gathered.
//   sample   softmax(logits / temperature) restricted by top_k and then
//            top_p (transformers' TopKLogitsWarper then TopPLogitsWarper: a
//            token stays while the mass of the tokens above it is < top_p),
//            drawn by the Gumbel-max trick: argmax of x_i + G_i with G_i =
//            -log(-log U_i) is a draw from softmax(x) over the kept tokens.
//            U_i is Philox4x32-10 keyed by (seed; prompt index, position,
//            token id), never by rank, so every layout draws the same token.
//            With top_k or top_p each rank all-gathers its own candidates
//            (its top_k; or its tokens whose mass above them within the
//            rank is < top_p, a superset of its part of the global nucleus)
//            and every rank runs the same selection on the same list.
//
// Greedy and top_k (up to 1024) read each rank's shard through
// ops::logit_candidates, so device logits stay on the device but for
// [rows, 2 + 2 top_k] values; the other modes and beam search copy the rows
// to the host.
//
// The reported log-probability is the token's under the model's own
// distribution, log softmax(logits) (temperature and filters aside).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/communicator.hpp"
#include "tensor/tensor.hpp"

namespace meshtron::generate {

struct SamplingParams {
  bool greedy = true;
  double temperature = 1.0;
  int top_k = 0;       ///< 0: no top-k filter
  double top_p = 1.0;  ///< 1: no nucleus filter
  std::uint64_t seed = 1234;
};

/// What a draw is keyed by: the prompt's index in the whole request and the
/// absolute position of the token being drawn.
struct DrawKey {
  std::int64_t prompt = 0;
  std::int64_t position = 0;
};

struct TokenChoice {
  std::int32_t id = 0;
  double logprob = 0;
};

/// The uniform (0, 1) variate of token `id` for `key` under `seed`.
double draw_uniform(std::uint64_t seed, const DrawKey& key, std::int64_t id);

/// One token for each row of `logits` [rows, V_local] (this rank's columns
/// [vocab_begin, vocab_begin + V_local); ids >= vocab are padding and never
/// chosen). Collective over `tp`; the same answer on every rank.
std::vector<TokenChoice> choose_tokens(const Tensor& logits, index_t vocab_begin, index_t vocab,
                                       const SamplingParams& params,
                                       const std::vector<DrawKey>& keys, Communicator& tp);

/// Each row's k most probable tokens (k in [1, 1024]) with their
/// log-probabilities under softmax over the whole vocabulary, best first
/// (ties: the lower id): each rank's own best k (shard_best's summary) are
/// all-gathered and merged, never the whole row on one rank. Collective
/// over `tp`; the same on every rank.
std::vector<std::vector<TokenChoice>> top_k_tokens(const Tensor& logits, index_t vocab_begin,
                                                   index_t vocab, int k, Communicator& tp);

/// log softmax of each row over the whole vocabulary, this rank's columns
/// (padding at -inf): [rows][V_local] (beam search scores every token).
std::vector<std::vector<double>> log_softmax_rows(const Tensor& logits, index_t vocab_begin,
                                                  index_t vocab, Communicator& tp);

/// A continuation of a beam: its token and the beam's score plus the
/// token's log-probability.
struct BeamCandidate {
  double score = 0;
  int beam = 0;  ///< index of the beam within its group
  std::int32_t id = 0;
};

/// For each group of rows (a prompt's beams: rows `groups[g]`, beam k the
/// k-th of them, its running score beam_scores[g][k]), the `n` best (beam,
/// token) pairs by score + log softmax, best first (ties: the lower beam,
/// then the lower id). Collective over `tp`; the same on every rank.
std::vector<std::vector<BeamCandidate>> beam_candidates(
    const Tensor& logits, index_t vocab_begin, index_t vocab,
    const std::vector<std::vector<index_t>>& groups,
    const std::vector<std::vector<double>>& beam_scores, int n, Communicator& tp);

}  // namespace meshtron::generate
