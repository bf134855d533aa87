// Beam search with the semantics of transformers' BeamSearchScorer
// (generation/beam_search.py) for one prompt:
//
//   * each step the 2K best (beam, token) continuations of the K beams by
//     running score + log softmax are taken, best first; a stop token among
//     the first K ends that beam's hypothesis (without the token, scored
//     over its generated length including it), one past the first K is
//     skipped; the first K other continuations are the next beams;
//   * a hypothesis scores sum log p / generated_length^length_penalty; the
//     K best are kept;
//   * a prompt is done once K hypotheses are kept and either early_stopping,
//     or the best running beam, scored at the current length, cannot beat
//     the worst kept one (transformers' early_stopping = False heuristic,
//     _check_early_stop_heuristic; "never" is not offered);
//   * at max_new_tokens the running beams join the hypotheses; the result
//     is the best, with its stop token appended when it ended on one.
#pragma once

#include <cstdint>
#include <unordered_set>
#include <vector>

#include "generate/generator.hpp"
#include "generate/sampler.hpp"

namespace meshtron::generate {

struct Hypothesis {
  double score = 0;
  std::vector<std::int32_t> ids;
  std::vector<double> logprobs;
  bool stopped = false;  ///< ended on a stop token (appended to ids)
};

/// transformers' BeamHypotheses: the num_beams best finished hypotheses.
class BeamHypotheses {
 public:
  BeamHypotheses(int num_beams, double length_penalty, bool early_stopping)
      : num_beams_(num_beams), length_penalty_(length_penalty), early_stopping_(early_stopping) {}
  /// Offers a hypothesis of summed log-probability `sum_logprobs` and
  /// `generated_length` generated tokens.
  void add(Hypothesis h, double sum_logprobs, int generated_length);
  /// Whether no continuation can enter any more: `best_sum_logprobs` is the
  /// best running beam's, `generated_length` the current length.
  bool is_done(double best_sum_logprobs, int generated_length) const;
  /// The best kept hypothesis (the last added among equal scores).
  const Hypothesis& best() const;
  std::size_t size() const { return beams_.size(); }

 private:
  int num_beams_;
  double length_penalty_;
  bool early_stopping_;
  double worst_score_ = 1e9;
  std::vector<Hypothesis> beams_;
};

/// One prompt's search: its running beams and finished hypotheses.
struct BeamGroup {
  std::vector<Hypothesis> running;  ///< ids and logprobs so far; score = summed log p
  BeamHypotheses finished;
  bool done = false;
  /// A prompt's search before its first step: one running beam (the
  /// prompt itself), as transformers starts beams 1.. at -1e9.
  BeamGroup(int num_beams, double length_penalty, bool early_stopping)
      : running{Hypothesis{}}, finished(num_beams, length_penalty, early_stopping) {}
};

/// How many candidates a step takes per prompt: transformers' max(2, 1 +
/// stop ids) x num_beams, so that num_beams of them always continue.
int beam_candidate_count(int num_beams, std::size_t stop_ids);

/// transformers' BeamSearchScorer.process for one prompt: the next beams
/// from this step's candidates (best first), finished hypotheses on the way;
/// `generated_length` counts this step's token. Returns the source beam of
/// each next beam.
std::vector<int> advance_beams(BeamGroup& g, const std::vector<BeamCandidate>& candidates,
                               const std::unordered_set<std::int32_t>& stop_ids, int beams,
                               int generated_length);

/// transformers' BeamSearchScorer.finalize: the running beams of a search
/// that was not done join its hypotheses; the best one.
const Hypothesis& best_hypothesis(BeamGroup& g);

/// Slot (sequence) of beam k of prompt i: each prompt's `beams` beams side by side.
inline index_t beam_slot(std::size_t i, int k, int beams) { return index_t(i) * beams + k; }

/// The results of a finished search of `batch` (groups[i] is batch[i]'s):
/// each prompt's best hypothesis, its tokens given to `on_token` in order.
std::vector<Result> beam_results(std::vector<BeamGroup>& groups, const std::vector<Request>& batch,
                                 const TokenCallback& on_token);

}  // namespace meshtron::generate
