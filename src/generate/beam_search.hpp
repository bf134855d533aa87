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
#include <vector>

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

}  // namespace meshtron::generate
