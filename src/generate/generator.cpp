#include "generate/generator.hpp"

#include <algorithm>
#include <deque>
#include <unordered_set>

#include "common/error.hpp"

namespace meshtron::generate {

Decoding decoding_from_string(const std::string& s) {
  if (s == "sample") return Decoding::Sample;
  if (s == "beam") return Decoding::Beam;
  return Decoding::Greedy;
}

Generator::Generator(const std::vector<GptModel*>& chunks, ParallelRuntime& rt, DType dtype)
    : chunks_(chunks), rt_(rt), dtype_(dtype), ctx_{rt.tp_group} {
  MESH_VERIFY(!chunks_.empty(), "Generator: no model chunk");
  ctx_.training = false;
  ctx_.space = rt.space();
}

index_t Generator::context_length() const {
  return chunks_.front()->config().max_positions;
}

index_t Generator::vocab_begin() const {
  return meshtron::vocab_begin(chunks_.front()->config(), rt_.tp_group);
}

bool Generator::last_stage() const { return rt_.topo.pp_rank() == rt_.topo.pp() - 1; }

std::vector<KvCache> Generator::make_cache(index_t slots, index_t capacity) const {
  std::vector<KvCache> kv;
  for (const GptModel* m : chunks_) kv.push_back(m->make_kv_cache(slots, capacity, dtype_, ctx_.space));
  return kv;
}

index_t Generator::cache_bytes(index_t slots, index_t capacity) const {
  // make_cache's tensors: k and v [slots, kv groups / tp, capacity, head_dim] per layer.
  const AttentionSpec& a = chunks_.front()->config().block.attention;
  const index_t per_layer = 2 * slots * (a.num_query_groups / rt_.topo.tp()) * capacity *
                            a.head_dim * index_t(dtype_size(dtype_));
  index_t layers = 0;
  for (const GptModel* m : chunks_) layers += m->placement().num_layers;
  return layers * per_layer;
}

Tensor Generator::forward(const Tensor& ids, const CachedRows& rows, std::vector<KvCache>& kv) {
  MESH_VERIFY(rows.slots.space() == ctx_.space,
              "Generator::forward: CachedRows made in another memory space than the model's");
  const int pp = rt_.topo.pp(), me = rt_.topo.pp_rank();
  const index_t hidden = chunks_.front()->config().hidden_size;
  Tensor x;
  for (int g = 0; g < global_chunks(); ++g) {
    if (g % pp != me) continue;
    const bool first = g == 0, last = g == global_chunks() - 1;
    if (!first && pp > 1) {
      x = Tensor::empty({rows.size(), hidden}, dtype_, ctx_.space);
      rt_.pp.recv(x.raw(), std::size_t(x.numel()), dtype_, (g - 1) % pp);
    }
    x = chunks_[std::size_t(g / pp)]->forward_cached(first ? ids : x, rows, ctx_,
                                                     kv[std::size_t(g / pp)]);
    if (!last && pp > 1) rt_.pp.send(x.raw(), std::size_t(x.numel()), dtype_, (g + 1) % pp);
  }
  return last_stage() ? x : Tensor();
}

Tensor ids_tensor(const std::vector<std::int32_t>& ids) {
  Tensor t = Tensor::empty({index_t(ids.size())}, DType::I32);
  std::copy(ids.begin(), ids.end(), t.data<std::int32_t>());
  return t;
}

void broadcast_candidates(Communicator& pp, int root,
                          std::vector<std::vector<BeamCandidate>>& groups, int n) {
  const std::size_t width = 1 + 3 * std::size_t(n);
  std::vector<double> buf(groups.size() * width, 0.0);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    buf[g * width] = double(groups[g].size());
    for (std::size_t c = 0; c < groups[g].size(); ++c) {
      buf[g * width + 1 + 3 * c] = groups[g][c].score;
      buf[g * width + 2 + 3 * c] = groups[g][c].beam;
      buf[g * width + 3 + 3 * c] = groups[g][c].id;
    }
  }
  pp.broadcast(buf.data(), buf.size(), DType::F64, root);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    groups[g].resize(std::size_t(buf[g * width]));
    for (std::size_t c = 0; c < groups[g].size(); ++c)
      groups[g][c] = {buf[g * width + 1 + 3 * c], int(buf[g * width + 2 + 3 * c]),
                      std::int32_t(buf[g * width + 3 + 3 * c])};
  }
}

namespace {

/// Choices travel as (id, logprob) pairs of doubles.
std::vector<double> pack_choices(const std::vector<TokenChoice>& choices) {
  std::vector<double> buf(2 * choices.size());
  for (std::size_t i = 0; i < choices.size(); ++i) {
    buf[2 * i] = choices[i].id;
    buf[2 * i + 1] = choices[i].logprob;
  }
  return buf;
}

std::vector<TokenChoice> unpack_choices(const std::vector<double>& buf) {
  std::vector<TokenChoice> choices(buf.size() / 2);
  for (std::size_t i = 0; i < choices.size(); ++i)
    choices[i] = {std::int32_t(buf[2 * i]), buf[2 * i + 1]};
  return choices;
}

}  // namespace

void broadcast_choices(Communicator& pp, int root, std::vector<TokenChoice>& choices) {
  std::vector<double> buf = pack_choices(choices);
  pp.broadcast(buf.data(), buf.size(), DType::F64, root);
  choices = unpack_choices(buf);
}

void Generator::share_candidates(std::vector<std::vector<BeamCandidate>>& groups, int n) {
  if (rt_.topo.pp() > 1) broadcast_candidates(rt_.pp, rt_.topo.pp() - 1, groups, n);
}

std::vector<Result> Generator::generate(const std::vector<Request>& batch,
                                        const GenerateParams& p, const TokenCallback& on_token) {
  if (batch.empty()) return {};
  for (const Request& r : batch)
    MESH_REQUIRE(!r.prompt.empty() &&
                     index_t(r.prompt.size()) + p.max_new_tokens <= context_length(),
                 "generate: prompt " << r.index << " has " << r.prompt.size()
                                     << " tokens; with max_new_tokens = " << p.max_new_tokens
                                     << " it needs " << r.prompt.size() + std::size_t(p.max_new_tokens)
                                     << " positions, the model has " << context_length()
                                     << (r.prompt.empty() ? " (an empty prompt)" : ""));
  return p.decoding == Decoding::Beam ? generate_beam(batch, p, on_token)
                                      : generate_sampled(batch, p, on_token);
}

int Generator::micro_batches(std::size_t prompts, const GenerateParams& p) const {
  if (p.decoding == Decoding::Beam) return 1;
  const int wanted = p.micro_batches > 0 ? p.micro_batches : rt_.topo.pp();
  return int(std::min(std::size_t(wanted), std::max<std::size_t>(prompts, 1)));
}

std::vector<TokenChoice> Generator::choose(const Tensor& logits,
                                           const std::vector<std::size_t>& active,
                                           const std::vector<Result>& out,
                                           const SamplingParams& s) {
  std::vector<DrawKey> keys;
  for (std::size_t i : active)
    keys.push_back({out[i].index, std::int64_t(out[i].prompt.size() + out[i].ids.size())});
  return choose_tokens(logits, vocab_begin(), chunks_.front()->config().vocab_size, s, keys, rt_.tp);
}

namespace {

/// Every prompt token of the prompts `which` of the batch, prompt i in slot i.
struct Prefill {
  std::vector<std::int32_t> ids;
  CachedRows rows;
};
Prefill prefill_rows(const std::vector<Request>& batch, const std::vector<std::size_t>& which,
                     MemorySpace space) {
  Prefill out;
  std::vector<index_t> slot, position, logit_rows;
  for (std::size_t i : which) {
    for (std::size_t t = 0; t < batch[i].prompt.size(); ++t) {
      out.ids.push_back(batch[i].prompt[t]);
      slot.push_back(index_t(i));
      position.push_back(index_t(t));
    }
    logit_rows.push_back(index_t(out.ids.size()) - 1);
  }
  out.rows = CachedRows::make(std::move(slot), std::move(position), space);
  out.rows.logit_rows = std::move(logit_rows);
  return out;
}

index_t longest_prompt(const std::vector<Request>& batch) {
  std::size_t n = 0;
  for (const Request& r : batch) n = std::max(n, r.prompt.size());
  return index_t(n);
}

/// A part of the batch decoded as one: its sequences still generating
/// (batch indices, which are also their cache slots: the parts share one
/// cache) and, on the last stage, the choices of its step in flight.
struct MicroBatch {
  std::vector<std::size_t> active;
  std::vector<TokenChoice> choices;
};

/// `parts` runs of consecutive prompts, the first n % parts one longer.
std::vector<MicroBatch> split_batch(std::size_t n, int parts) {
  std::vector<MicroBatch> out(static_cast<std::size_t>(parts));
  std::size_t next = 0;
  for (std::size_t m = 0; m < out.size(); ++m) {
    const std::size_t size = n / out.size() + (m < n % out.size() ? 1 : 0);
    for (std::size_t k = 0; k < size; ++k) out[m].active.push_back(next++);
  }
  return out;
}

/// The last stage's choices on their way to the other stages: sent as soon
/// as they are made (isend: the last stage goes on with the next micro-batch)
/// and received by a stage when it next needs them. Messages of one sender
/// and tag arrive in order, and every stage takes them in the order the last
/// stage posts them (the same task order everywhere). kTag keeps them apart
/// from hidden states (tag 0), which the last stage also sends to stage 0
/// when model chunks are interleaved.
class ChoiceChannel {
 public:
  ChoiceChannel(Communicator& pp, int last) : pp_(pp), last_(last) {}
  /// Last stage: `choices` to every other stage.
  void post(const std::vector<TokenChoice>& choices) {
    if (pp_.size() == 1) return;
    sent_.push_back(pack_choices(choices));
    for (int s = 0; s < pp_.size(); ++s)
      if (s != last_) pp_.isend(sent_.back().data(), sent_.back().size(), DType::F64, s, kTag);
  }
  /// Another stage: the last stage's next `n` choices.
  std::vector<TokenChoice> take(std::size_t n) {
    std::vector<double> buf(2 * n);
    pp_.recv(buf.data(), buf.size(), DType::F64, last_, kTag);
    return unpack_choices(buf);
  }
  /// Completes the sends (their buffers live until then).
  void finish() {
    if (!sent_.empty()) pp_.wait_sends();
    sent_.clear();
  }

 private:
  static constexpr int kTag = 1;
  Communicator& pp_;
  int last_;
  std::deque<std::vector<double>> sent_;  ///< a deque: posted buffers never move
};

/// The rows of a micro-batch's next decode step.
struct StepRows {
  std::vector<std::int32_t> ids;
  std::vector<index_t> slot, position;
};

/// Appends `choices` (one per `active` sequence) to the results, reports
/// each through `on_token` and ends the sequences that stop or reach
/// max_new_tokens; `active` keeps the others, whose next rows it returns.
StepRows advance(const std::vector<TokenChoice>& choices, std::vector<std::size_t>& active,
                 std::vector<Result>& out, const GenerateParams& p,
                 const std::unordered_set<std::int32_t>& stop_ids, const TokenCallback& on_token) {
  StepRows next;
  std::vector<std::size_t> still;
  for (std::size_t a = 0; a < active.size(); ++a) {
    Result& r = out[active[a]];
    r.ids.push_back(choices[a].id);
    r.logprobs.push_back(choices[a].logprob);
    if (on_token) on_token(r.index, choices[a].id, choices[a].logprob);
    if (stop_ids.count(choices[a].id) || (p.stop_when && p.stop_when(r.ids))) {
      r.finish_reason = "stop";
    } else if (int(r.ids.size()) >= p.max_new_tokens) {
      r.finish_reason = "length";
    } else {
      still.push_back(active[a]);
      next.ids.push_back(choices[a].id);
      next.slot.push_back(index_t(active[a]));
      next.position.push_back(index_t(r.prompt.size() + r.ids.size()) - 1);
    }
  }
  active = std::move(still);
  return next;
}

}  // namespace

std::vector<Result> Generator::generate_sampled(const std::vector<Request>& batch,
                                                const GenerateParams& p,
                                                const TokenCallback& on_token) {
  const std::size_t n = batch.size();
  std::vector<KvCache> kv = make_cache(index_t(n), longest_prompt(batch) + p.max_new_tokens);
  const SamplingParams sampling{p.decoding == Decoding::Greedy, p.temperature, p.top_k, p.top_p,
                                p.seed};
  const std::unordered_set<std::int32_t> stop_ids(p.stop_ids.begin(), p.stop_ids.end());
  std::vector<Result> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    out[i].index = batch[i].index;
    out[i].prompt = batch[i].prompt;
  }
  ChoiceChannel channel(rt_.pp, rt_.topo.pp() - 1);
  const auto run_step = [&](MicroBatch& m, const std::vector<std::int32_t>& ids,
                            const CachedRows& rows) {
    const Tensor logits = forward(ids_tensor(ids), rows, kv);
    if (!last_stage()) return;
    m.choices = choose(logits, m.active, out, sampling);
    channel.post(m.choices);
  };
  // Tasks in (step, micro-batch) order on every rank (see the header).
  std::vector<MicroBatch> parts = split_batch(n, micro_batches(n, p));
  for (MicroBatch& m : parts) {
    const Prefill pre = prefill_rows(batch, m.active, ctx_.space);
    run_step(m, pre.ids, pre.rows);
  }
  for (bool running = true; running;) {
    running = false;
    for (MicroBatch& m : parts) {
      if (m.active.empty()) continue;
      const std::vector<TokenChoice> choices =
          last_stage() ? std::move(m.choices) : channel.take(m.active.size());
      StepRows next = advance(choices, m.active, out, p, stop_ids, on_token);
      if (m.active.empty()) continue;
      running = true;
      run_step(m, next.ids,
               CachedRows::make(std::move(next.slot), std::move(next.position), ctx_.space));
    }
  }
  channel.finish();
  return out;
}

}  // namespace meshtron::generate
