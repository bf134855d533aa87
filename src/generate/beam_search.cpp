// Generator::generate_beam and BeamHypotheses (beam_search.hpp).
#include "generate/beam_search.hpp"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "common/error.hpp"
#include "generate/generator.hpp"

namespace meshtron::generate {

void BeamHypotheses::add(Hypothesis h, double sum_logprobs, int generated_length) {
  h.score = sum_logprobs / std::pow(double(generated_length), length_penalty_);
  if (int(beams_.size()) >= num_beams_ && h.score <= worst_score_) return;
  beams_.push_back(std::move(h));
  if (int(beams_.size()) > num_beams_) {
    // Drop the worst (the first of equal worst ones, as sorted() of
    // (score, index) pairs picks it); the next worst becomes the bar.
    std::vector<std::size_t> order(beams_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return beams_[a].score < beams_[b].score; });
    worst_score_ = beams_[order[1]].score;
    beams_.erase(beams_.begin() + long(order[0]));
  } else {
    worst_score_ = std::min(worst_score_, beams_.back().score);
  }
}

bool BeamHypotheses::is_done(double best_sum_logprobs, int generated_length) const {
  if (int(beams_.size()) < num_beams_) return false;
  if (early_stopping_) return true;
  return worst_score_ >= best_sum_logprobs / std::pow(double(generated_length), length_penalty_);
}

const Hypothesis& BeamHypotheses::best() const {
  MESH_VERIFY(!beams_.empty(), "BeamHypotheses::best of no hypothesis");
  std::size_t best = 0;
  for (std::size_t i = 1; i < beams_.size(); ++i)
    if (beams_[i].score >= beams_[best].score) best = i;  // sorted(...).pop(): the last of equals
  return beams_[best];
}

int beam_candidate_count(int num_beams, std::size_t stop_ids) {
  return std::max<int>(2, 1 + int(stop_ids)) * num_beams;
}

std::vector<int> advance_beams(BeamGroup& g, const std::vector<BeamCandidate>& candidates,
                               const std::unordered_set<std::int32_t>& stop_ids, int beams,
                               int generated_length) {
  std::vector<Hypothesis> next;
  std::vector<int> sources;
  for (std::size_t rank = 0; rank < candidates.size() && int(next.size()) < beams; ++rank) {
    const BeamCandidate& c = candidates[rank];
    const Hypothesis& from = g.running[std::size_t(c.beam)];
    Hypothesis h = from;
    h.ids.push_back(c.id);
    h.logprobs.push_back(c.score - from.score);
    h.score = c.score;
    if (stop_ids.count(c.id)) {
      if (int(rank) >= beams) continue;
      h.stopped = true;
      g.finished.add(std::move(h), c.score, generated_length);
    } else {
      next.push_back(std::move(h));
      sources.push_back(c.beam);
    }
  }
  g.running = std::move(next);
  // transformers' _check_early_stop_heuristic: the best running beam (the
  // step's best continuation that did not stop) against the worst kept.
  const double best = g.running.empty() ? candidates.front().score : g.running.front().score;
  g.done = g.finished.is_done(best, generated_length);
  return sources;
}

const Hypothesis& best_hypothesis(BeamGroup& g) {
  if (!g.done)
    for (Hypothesis& h : g.running) {
      const int length = int(h.ids.size());
      g.finished.add(h, h.score, length);
    }
  g.done = true;
  return g.finished.best();
}

std::vector<Result> beam_results(std::vector<BeamGroup>& groups, const std::vector<Request>& batch,
                                 const TokenCallback& on_token) {
  std::vector<Result> out(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const Hypothesis& best = best_hypothesis(groups[i]);
    out[i] = {batch[i].index, batch[i].prompt, best.ids, best.logprobs,
              best.stopped ? "stop" : "length"};
    if (on_token)
      for (std::size_t t = 0; t < best.ids.size(); ++t)
        on_token(batch[i].index, best.ids[t], best.logprobs[t]);
  }
  return out;
}

std::vector<Result> Generator::generate_beam(const std::vector<Request>& batch,
                                             const GenerateParams& p,
                                             const TokenCallback& on_token) {
  const int K = p.num_beams;
  const std::size_t n = batch.size();
  index_t longest = 0;
  for (const Request& r : batch) longest = std::max(longest, index_t(r.prompt.size()));
  std::vector<KvCache> kv = make_cache(index_t(n) * K, longest + p.max_new_tokens);
  const std::unordered_set<std::int32_t> stop_ids(p.stop_ids.begin(), p.stop_ids.end());
  const index_t vocab = chunks_.front()->config().vocab_size;
  const int wanted = beam_candidate_count(K, stop_ids.size());
  std::vector<BeamGroup> groups(n, BeamGroup(K, p.length_penalty, p.early_stopping));

  // Prefill each prompt into its beam 0 slot; the first step continues beam 0 only.
  std::vector<std::int32_t> ids;
  std::vector<index_t> slot, position, logit_rows;
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t t = 0; t < batch[i].prompt.size(); ++t) {
      ids.push_back(batch[i].prompt[t]);
      slot.push_back(beam_slot(i, 0, K));
      position.push_back(index_t(t));
    }
    logit_rows.push_back(index_t(ids.size()) - 1);
  }
  CachedRows rows = CachedRows::make(std::move(slot), std::move(position), ctx_.space);
  rows.logit_rows = std::move(logit_rows);
  Tensor logits = forward(ids_tensor(ids), rows, kv);
  std::vector<std::size_t> active(n);  // prompts whose beams were this step's rows
  for (std::size_t i = 0; i < n; ++i) active[i] = i;

  for (int length = 1; !active.empty(); ++length) {
    // Rows of this step: each active prompt's running beams, in order.
    std::vector<std::vector<index_t>> row_groups;
    std::vector<std::vector<double>> scores;
    index_t row = 0;
    for (std::size_t i : active) {
      std::vector<index_t> r;
      std::vector<double> s;
      for (const Hypothesis& h : groups[i].running) {
        r.push_back(row++);
        s.push_back(h.score);
      }
      row_groups.push_back(std::move(r));
      scores.push_back(std::move(s));
    }
    std::vector<std::vector<BeamCandidate>> candidates(active.size());
    if (last_stage())
      candidates = beam_candidates(logits, vocab_begin(), vocab, row_groups, scores, wanted, rt_.tp);
    share_candidates(candidates, wanted);

    std::vector<std::size_t> next;
    std::vector<index_t> to, from;
    ids.clear();
    std::vector<index_t> step_slot, step_position;
    for (std::size_t a = 0; a < active.size(); ++a) {
      const std::size_t i = active[a];
      const std::vector<int> sources =
          advance_beams(groups[i], candidates[a], stop_ids, K, length);
      if (groups[i].done || length >= p.max_new_tokens) continue;
      next.push_back(i);
      for (int k = 0; k < K; ++k) {
        to.push_back(beam_slot(i, k, K));
        from.push_back(beam_slot(i, sources[std::size_t(k)], K));
        ids.push_back(groups[i].running[std::size_t(k)].ids.back());
        step_slot.push_back(beam_slot(i, k, K));
        step_position.push_back(index_t(batch[i].prompt.size()) + length - 1);
      }
    }
    active = std::move(next);
    if (active.empty()) break;
    for (KvCache& chunk : kv) chunk.reorder(to, from);
    logits = forward(ids_tensor(ids),
                     CachedRows::make(std::move(step_slot), std::move(step_position), ctx_.space),
                     kv);
  }

  return beam_results(groups, batch, on_token);
}

}  // namespace meshtron::generate
