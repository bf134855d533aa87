#include "plan/search.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "common/error.hpp"
#include "config/model_spec_from_deck.hpp"
#include "train/schedule.hpp"

namespace meshtron::plan {

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int k = 1; k <= n; ++k)
    if (n % k == 0) out.push_back(k);
  return out;
}

/// `c` validated for `gpus` ranks and runnable by its schedule; false where
/// the trainer would stop with a UserError.
bool accepted(RunConfig& c, int gpus) {
  try {
    c.validate(gpus);
    const int mbs = micro_batches_per_step(c);
    schedule_tasks(
        {c.parallel.schedule, c.parallel.pipeline_parallel, c.parallel.virtual_stages, mbs}, 0);
    return true;
  } catch (const UserError&) {
    return false;
  }
}

/// T5 over pp > 1 stages: every encoder-decoder split [1, pp) (validate
/// keeps those that divide both stacks evenly); else none (0).
std::vector<int> split_ranks(const RunConfig& base, int pp) {
  if (base.model.arch != "t5" || pp == 1) return {0};
  std::vector<int> out;
  for (int split = 1; split < pp; ++split) out.push_back(split);
  return out;
}

double peak_of(const std::vector<RankMemory>& ranks) {
  double peak = 0;
  for (const RankMemory& r : ranks) peak = std::max(peak, r.peak());
  return peak;
}

}  // namespace

std::string layout_name(const RunConfig& c) {
  std::ostringstream os;
  os << "tp " << c.parallel.tensor_parallel << " pp " << c.parallel.pipeline_parallel << " dp "
     << c.parallel.data_parallel << " v " << c.parallel.virtual_stages << " mb "
     << c.training.micro_batch_size << " recompute " << c.training.recompute << " sp "
     << (c.parallel.sequence_parallel ? "on" : "off");
  if (c.parallel.pipeline_split_rank > 0) os << " split " << c.parallel.pipeline_split_rank;
  return os.str();
}

std::vector<Candidate> search_layouts(const RunConfig& base, int vocab_size, int gpus,
                                      double memory_bytes, const Rates& rates, int gpus_per_node) {
  const int global =
      base.training.global_batch_size > 0
          ? base.training.global_batch_size
          : base.training.micro_batch_size * std::max(base.parallel.data_parallel, 1);
  std::vector<Candidate> out;
  for (int tp : divisors(gpus))
    for (int pp : divisors(gpus / tp))
      for (int v : divisors(base.model.num_layers))
        for (int split : split_ranks(base, pp))
          for (int mb : divisors(global))
            for (const char* recompute : {"none", "selective", "full"})
              for (bool sp : {false, true}) {
                if ((pp == 1 && v > 1) || (tp == 1 && sp)) continue;
                RunConfig c = base;
                c.parallel.pipeline_split_rank = split;
                c.parallel.tensor_parallel = tp;
                c.parallel.pipeline_parallel = pp;
                c.parallel.data_parallel = gpus / (tp * pp);
                c.parallel.virtual_stages = v;
                c.parallel.schedule = v > 1    ? "interleaved"
                                      : pp > 1 ? "1f1b"
                                               : base.parallel.schedule;
                c.parallel.sequence_parallel = sp;
                c.parallel.sequence_parallel_keep_gathered =
                    sp && base.parallel.sequence_parallel_keep_gathered;
                c.parallel.pipeline_layers = "";
                c.training.micro_batch_size = mb;
                c.training.global_batch_size = global;
                c.training.recompute = recompute;
                if (!accepted(c, gpus)) continue;
                Candidate k;
                k.config = c;
                k.model = model_spec_from_deck(c, vocab_size, tp);
                k.peak_bytes = peak_of(plan_memory(c, k.model));
                k.fits = k.peak_bytes <= memory_bytes;
                k.step = estimate_step(c, k.model, rates, gpus_per_node);
                out.push_back(std::move(k));
              }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    if (a.fits != b.fits) return a.fits;
    if (!a.fits) return a.peak_bytes < b.peak_bytes;  // none fits: the closest first
    // Steps within 0.5 % of each other are a tie the smaller peak breaks.
    if (std::abs(a.step.step_s - b.step.step_s) > 0.005 * b.step.step_s)
      return a.step.step_s < b.step.step_s;
    return a.peak_bytes < b.peak_bytes;
  });
  return out;
}

std::string why_better(const Candidate& best, const Candidate& next) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1);
  const auto pct = [](double a, double b) { return 100.0 * (b - a) / std::max(b, 1e-30); };
  if (best.fits && !next.fits)
    os << "   - it fits in memory (" << best.peak_bytes / (1 << 30) << " GiB); the next needs "
       << next.peak_bytes / (1 << 30) << " GiB\n";
  if (best.step.step_s < 0.995 * next.step.step_s)
    os << "   - " << pct(best.step.step_s, next.step.step_s) << " % shorter step ("
       << 1e3 * best.step.step_s << " ms against " << 1e3 * next.step.step_s << " ms)\n";
  else
    os << "   - the same step time within 0.5 % (" << 1e3 * best.step.step_s << " ms); peak "
       << best.peak_bytes / (1 << 20) << " MiB against " << next.peak_bytes / (1 << 20) << " MiB\n";
  if (best.step.bubble < next.step.bubble)
    os << "   - fewer pipeline bubbles: " << 100 * best.step.bubble << " % against "
       << 100 * next.step.bubble << " %\n";
  if (best.step.tp_s < next.step.tp_s)
    os << "   - less tp traffic: " << 1e3 * best.step.tp_s << " ms against " << 1e3 * next.step.tp_s
       << " ms per step\n";
  if (best.step.dp_s < next.step.dp_s)
    os << "   - less exposed dp traffic: " << 1e3 * best.step.dp_s << " ms against "
       << 1e3 * next.step.dp_s << " ms\n";
  if (best.step.compute_s < next.step.compute_s)
    os << "   - less compute per rank (recompute " << best.config.training.recompute << " against "
       << next.config.training.recompute << "): " << 1e3 * best.step.compute_s << " ms against "
       << 1e3 * next.step.compute_s << " ms\n";
  return os.str();
}

}  // namespace meshtron::plan
