#include "generate/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/error.hpp"
#include "kernels/kokkos/dropout.hpp"
#include "ops/ops.hpp"

namespace meshtron::generate {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
/// Most candidates per row taken from ops::logit_candidates (its device
/// kernel's bound); a larger top_k reads whole rows on the host.
constexpr int kMaxShardCandidates = 1024;

/// A scored token: (value, id), ordered by value then lower id first.
struct Scored {
  double value = kNegInf;
  double id = -1;  // a double so that pairs travel in one F64 all-gather
};
bool before(const Scored& a, const Scored& b) {
  return a.value > b.value || (a.value == b.value && a.id >= 0 && (b.id < 0 || a.id < b.id));
}

/// `logits` as the row loops below read them: fp32 or fp64 on the host (a
/// copy of device or 16-bit logits).
Tensor host_logits(const Tensor& logits) {
  const Tensor host = logits.is_host() ? logits : logits.to_host();
  return host.dtype() == DType::F32 || host.dtype() == DType::F64 ? host : host.to(DType::F32);
}

/// Row r of this rank's logits in double, padding columns at -inf.
std::vector<double> local_row(const Tensor& logits, index_t r, index_t vocab_begin, index_t vocab) {
  const index_t cols = logits.dim(1);
  std::vector<double> row(std::size_t(cols), kNegInf);
  const index_t real = std::clamp<index_t>(vocab - vocab_begin, 0, cols);
  for (index_t c = 0; c < real; ++c)
    row[std::size_t(c)] = logits.dtype() == DType::F64 ? logits.data<double>()[r * cols + c]
                                                       : double(logits.data<float>()[r * cols + c]);
  return row;
}

/// The best entry of each rank's list of `per_rank` for every row, gathered:
/// [rank][row][per_rank] -> every rank's lists of row r back to back.
std::vector<std::vector<Scored>> gather_lists(const std::vector<std::vector<Scored>>& mine,
                                              Communicator& tp) {
  const std::size_t rows = mine.size();
  double longest = 0;
  for (const auto& l : mine) longest = std::max(longest, double(l.size()));
  tp.all_reduce(&longest, 1, DType::F64, ReduceOp::Max);
  const std::size_t width = std::size_t(longest), p = std::size_t(tp.size());
  std::vector<Scored> send(rows * width), recv(rows * width * p);
  for (std::size_t r = 0; r < rows; ++r) std::copy(mine[r].begin(), mine[r].end(), &send[r * width]);
  tp.all_gather(send.data(), recv.data(), send.size() * 2, DType::F64);
  std::vector<std::vector<Scored>> out(rows);
  for (std::size_t q = 0; q < p; ++q)
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t i = 0; i < width; ++i) {
        const Scored& s = recv[(q * rows + r) * width + i];
        if (s.id >= 0) out[r].push_back(s);
      }
  for (auto& l : out) std::sort(l.begin(), l.end(), before);
  return out;
}

/// log of the sum over the vocabulary of exp(row), per row (two all-reduces).
std::vector<double> log_sum_exp(const std::vector<std::vector<double>>& rows, Communicator& tp) {
  std::vector<double> max(rows.size(), kNegInf), sum(rows.size(), 0.0);
  for (std::size_t r = 0; r < rows.size(); ++r)
    for (double x : rows[r]) max[r] = std::max(max[r], x);
  tp.all_reduce(max.data(), max.size(), DType::F64, ReduceOp::Max);
  for (std::size_t r = 0; r < rows.size(); ++r)
    for (double x : rows[r]) sum[r] += std::exp(x - max[r]);
  tp.all_reduce(sum.data(), sum.size(), DType::F64, ReduceOp::Sum);
  for (std::size_t r = 0; r < rows.size(); ++r) max[r] += std::log(sum[r]);
  return max;
}

std::vector<Scored> sorted_scores(const std::vector<double>& row, index_t vocab_begin) {
  std::vector<Scored> s;
  for (std::size_t c = 0; c < row.size(); ++c)
    if (row[c] > kNegInf) s.push_back({row[c], double(vocab_begin + index_t(c))});
  std::sort(s.begin(), s.end(), before);
  return s;
}

/// Leading entries of `sorted` whose probability mass above them (under
/// exp(value - log_z)) is below top_p.
std::size_t nucleus_size(const std::vector<Scored>& sorted, double log_z, double top_p) {
  double above = 0;
  std::size_t n = 0;
  while (n < sorted.size() && (n == 0 || above < top_p)) above += std::exp(sorted[n++].value - log_z);
  return n;
}

double gumbel(double u) { return -std::log(-std::log(u)); }

/// transformers' TopKLogitsWarper then TopPLogitsWarper on the ranks'
/// merged candidates (scaled log-probabilities, best first).
void keep_top_k_then_top_p(std::vector<Scored>& l, const SamplingParams& p) {
  l.resize(std::min(l.size(), std::size_t(p.top_k)));
  if (l.empty() || p.top_p >= 1) return;
  double m = l.front().value, sum = 0;
  for (const Scored& s : l) sum += std::exp(s.value - m);
  l.resize(nucleus_size(l, m + std::log(sum), p.top_p));
}

/// This rank's n best tokens of each row as (log-probability, id), best
/// first, from ops::logit_candidates (device logits stay on the device; the
/// log-normaliser takes two all-reduces of one value per row).
std::vector<std::vector<Scored>> shard_best(const Tensor& logits, index_t vocab_begin,
                                            index_t vocab, int n, Communicator& tp) {
  const std::size_t rows = std::size_t(logits.dim(0)), width = 2 + 2 * std::size_t(n);
  const index_t real = std::clamp<index_t>(vocab - vocab_begin, 0, logits.dim(1));
  const Tensor summary = ops::logit_candidates(logits, real, n);
  const double* s = summary.data<double>();
  std::vector<double> log_z(rows), sum(rows);
  for (std::size_t r = 0; r < rows; ++r) log_z[r] = s[r * width];
  tp.all_reduce(log_z.data(), rows, DType::F64, ReduceOp::Max);
  for (std::size_t r = 0; r < rows; ++r) {
    const double mine = s[r * width];
    sum[r] = mine == kNegInf ? 0.0 : s[r * width + 1] * std::exp(mine - log_z[r]);
  }
  tp.all_reduce(sum.data(), rows, DType::F64, ReduceOp::Sum);
  std::vector<std::vector<Scored>> out(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    const double lz = log_z[r] + std::log(sum[r]);
    for (std::size_t k = 0; k < std::size_t(n); ++k) {
      const double id = s[r * width + 3 + 2 * k];
      if (id >= 0) out[r].push_back({s[r * width + 2 + 2 * k] - lz, double(vocab_begin) + id});
    }
  }
  return out;
}

/// Candidates of each row (scaled logits) that survive top_k then top_p,
/// the same list on every rank.
std::vector<std::vector<Scored>> filtered_candidates(const std::vector<std::vector<double>>& scaled,
                                                     index_t vocab_begin,
                                                     const SamplingParams& p, Communicator& tp) {
  std::vector<double> log_z;
  if (p.top_k == 0) log_z = log_sum_exp(scaled, tp);
  std::vector<std::vector<Scored>> mine(scaled.size());
  for (std::size_t r = 0; r < scaled.size(); ++r) {
    mine[r] = sorted_scores(scaled[r], vocab_begin);
    const std::size_t keep =
        p.top_k > 0 ? std::min(mine[r].size(), std::size_t(p.top_k))
                    : nucleus_size(mine[r], log_z[r], p.top_p);
    mine[r].resize(keep);
  }
  auto all = gather_lists(mine, tp);
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (p.top_k > 0)
      keep_top_k_then_top_p(all[r], p);
    else
      all[r].resize(nucleus_size(all[r], log_z[r], p.top_p));
  }
  return all;
}

Scored gumbel_best(const std::vector<Scored>& candidates, const SamplingParams& p,
                   const DrawKey& key) {
  Scored best;
  for (const Scored& s : candidates) {
    const Scored perturbed{s.value + gumbel(draw_uniform(p.seed, key, std::int64_t(s.id))), s.id};
    if (before(perturbed, best)) best = perturbed;
  }
  return best;
}

/// The winner of each row over the ranks' local winners.
std::vector<Scored> best_over_tp(const std::vector<Scored>& local, Communicator& tp) {
  std::vector<std::vector<Scored>> lists(local.size());
  for (std::size_t r = 0; r < local.size(); ++r) lists[r] = {local[r]};
  auto all = gather_lists(lists, tp);
  std::vector<Scored> out(local.size());
  for (std::size_t r = 0; r < local.size(); ++r) out[r] = all[r].front();
  return out;
}

}  // namespace

std::vector<std::vector<BeamCandidate>> beam_candidates(
    const Tensor& logits, index_t vocab_begin, index_t vocab,
    const std::vector<std::vector<index_t>>& groups,
    const std::vector<std::vector<double>>& beam_scores, int n, Communicator& tp) {
  const auto logprobs = log_softmax_rows(logits, vocab_begin, vocab, tp);
  // A pair travels as (score, beam * vocab + id): one order for both ties.
  std::vector<std::vector<Scored>> mine(groups.size());
  for (std::size_t g = 0; g < groups.size(); ++g) {
    for (std::size_t k = 0; k < groups[g].size(); ++k) {
      const auto& row = logprobs[std::size_t(groups[g][k])];
      for (std::size_t c = 0; c < row.size(); ++c)
        if (row[c] > kNegInf)
          mine[g].push_back({beam_scores[g][k] + row[c],
                             double(index_t(k) * vocab + vocab_begin + index_t(c))});
    }
    const std::size_t keep = std::min(mine[g].size(), std::size_t(n));
    std::partial_sort(mine[g].begin(), mine[g].begin() + long(keep), mine[g].end(), before);
    mine[g].resize(keep);
  }
  const auto all = gather_lists(mine, tp);
  std::vector<std::vector<BeamCandidate>> out(groups.size());
  for (std::size_t g = 0; g < groups.size(); ++g)
    for (std::size_t i = 0; i < std::min(all[g].size(), std::size_t(n)); ++i) {
      const auto flat = index_t(all[g][i].id);
      out[g].push_back({all[g][i].value, int(flat / vocab), std::int32_t(flat % vocab)});
    }
  return out;
}

double draw_uniform(std::uint64_t seed, const DrawKey& key, std::int64_t id) {
  const auto lo = [](std::int64_t v) { return std::uint32_t(std::uint64_t(v)); };
  const auto hi = [](std::int64_t v) { return std::uint32_t(std::uint64_t(v) >> 32); };
  const kernels::Philox4x32Block counter{
      {lo(key.position), lo(key.prompt), lo(id), hi(key.prompt) ^ (hi(id) << 16) ^ hi(key.position)}};
  const auto r = kernels::philox4x32_10(counter, std::uint32_t(seed), std::uint32_t(seed >> 32));
  // 53 random bits, shifted half a step off 0: strictly inside (0, 1).
  const std::uint64_t bits = (std::uint64_t(r.w[0]) << 21) ^ (std::uint64_t(r.w[1]) >> 11);
  return (double(bits & ((std::uint64_t(1) << 53) - 1)) + 0.5) * 0x1.0p-53;
}

std::vector<std::vector<double>> log_softmax_rows(const Tensor& logits, index_t vocab_begin,
                                                  index_t vocab, Communicator& tp) {
  const Tensor host = host_logits(logits);
  std::vector<std::vector<double>> rows(std::size_t(host.dim(0)));
  for (std::size_t r = 0; r < rows.size(); ++r)
    rows[r] = local_row(host, index_t(r), vocab_begin, vocab);
  const std::vector<double> log_z = log_sum_exp(rows, tp);
  for (std::size_t r = 0; r < rows.size(); ++r)
    for (double& x : rows[r]) x -= log_z[r];
  return rows;
}

namespace {

/// Greedy and top-k choices from each rank's best n tokens (shard_best).
std::vector<TokenChoice> choose_from_shard_best(const Tensor& logits, index_t vocab_begin,
                                                index_t vocab, const SamplingParams& p,
                                                const std::vector<DrawKey>& keys,
                                                Communicator& tp) {
  const auto mine = shard_best(logits, vocab_begin, vocab, p.greedy ? 1 : p.top_k, tp);
  const std::size_t rows = mine.size();
  std::vector<Scored> chosen(rows);
  if (p.greedy) {
    std::vector<Scored> local(rows);
    for (std::size_t r = 0; r < rows; ++r)
      if (!mine[r].empty()) local[r] = mine[r].front();
    chosen = best_over_tp(local, tp);
  } else {
    std::vector<std::vector<Scored>> scaled(mine);
    for (auto& row : scaled)
      for (Scored& s : row) s.value /= p.temperature;
    auto all = gather_lists(scaled, tp);
    for (std::size_t r = 0; r < rows; ++r) {
      keep_top_k_then_top_p(all[r], p);
      chosen[r] = gumbel_best(all[r], p, keys[r]);
    }
  }
  // The chosen token's log-probability from the rank that holds it (the
  // winner is among its holder's own best n).
  std::vector<double> lp(rows, 0.0);
  for (std::size_t r = 0; r < rows; ++r)
    for (const Scored& s : mine[r])
      if (s.id == chosen[r].id) lp[r] = s.value;
  tp.all_reduce(lp.data(), rows, DType::F64, ReduceOp::Sum);
  std::vector<TokenChoice> out(rows);
  for (std::size_t r = 0; r < rows; ++r) out[r] = {std::int32_t(chosen[r].id), lp[r]};
  return out;
}

/// Sampling without top_k (plain, or top-p alone) or with a top_k above
/// kMaxShardCandidates: whole rows on the host.
std::vector<TokenChoice> choose_from_rows(const Tensor& logits, index_t vocab_begin, index_t vocab,
                                          const SamplingParams& p,
                                          const std::vector<DrawKey>& keys, Communicator& tp) {
  const auto logprobs = log_softmax_rows(logits, vocab_begin, vocab, tp);
  const std::size_t rows = logprobs.size();
  std::vector<Scored> chosen(rows);
  std::vector<std::vector<double>> scaled(logprobs);
  for (auto& row : scaled)
    for (double& x : row) x /= p.temperature;
  if (p.top_k > 0 || p.top_p < 1) {
    const auto candidates = filtered_candidates(scaled, vocab_begin, p, tp);
    for (std::size_t r = 0; r < rows; ++r) chosen[r] = gumbel_best(candidates[r], p, keys[r]);
  } else {
    std::vector<Scored> local(rows);
    for (std::size_t r = 0; r < rows; ++r)
      local[r] = gumbel_best(sorted_scores(scaled[r], vocab_begin), p, keys[r]);
    chosen = best_over_tp(local, tp);
  }
  // The chosen token's log-probability from the rank that holds it.
  std::vector<double> lp(rows, 0.0);
  for (std::size_t r = 0; r < rows; ++r) {
    const auto id = index_t(chosen[r].id);
    if (id >= vocab_begin && id < vocab_begin + logits.dim(1))
      lp[r] = logprobs[r][std::size_t(id - vocab_begin)];
  }
  tp.all_reduce(lp.data(), rows, DType::F64, ReduceOp::Sum);
  std::vector<TokenChoice> out(rows);
  for (std::size_t r = 0; r < rows; ++r) out[r] = {std::int32_t(chosen[r].id), lp[r]};
  return out;
}

}  // namespace

std::vector<std::vector<TokenChoice>> top_k_tokens(const Tensor& logits, index_t vocab_begin,
                                                   index_t vocab, int k, Communicator& tp) {
  MESH_VERIFY(k >= 1 && k <= kMaxShardCandidates,
              "top_k_tokens: k = " << k << " outside [1, " << kMaxShardCandidates << "]");
  const auto all = gather_lists(shard_best(logits, vocab_begin, vocab, k, tp), tp);
  std::vector<std::vector<TokenChoice>> out(all.size());
  for (std::size_t r = 0; r < all.size(); ++r)
    for (std::size_t i = 0; i < std::min(all[r].size(), std::size_t(k)); ++i)
      out[r].push_back({std::int32_t(all[r][i].id), all[r][i].value});
  return out;
}

std::vector<TokenChoice> choose_tokens(const Tensor& logits, index_t vocab_begin, index_t vocab,
                                       const SamplingParams& p, const std::vector<DrawKey>& keys,
                                       Communicator& tp) {
  MESH_VERIFY(logits.rank() == 2 && keys.size() == std::size_t(logits.dim(0)),
              "choose_tokens: logits [rows, vocab shard] and one key per row");
  if (p.greedy || (p.top_k > 0 && p.top_k <= kMaxShardCandidates))
    return choose_from_shard_best(logits, vocab_begin, vocab, p, keys, tp);
  return choose_from_rows(host_logits(logits), vocab_begin, vocab, p, keys, tp);
}

}  // namespace meshtron::generate
