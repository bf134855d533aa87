#include "generate/t5_generator.hpp"

#include <algorithm>
#include <unordered_set>

#include "common/error.hpp"
#include "generate/beam_search.hpp"
#include "model/kv_cache.hpp"
#include "ops/ops.hpp"

namespace meshtron::generate {

namespace {

index_t longest_prompt(const std::vector<Request>& batch) {
  std::size_t n = 0;
  for (const Request& r : batch) n = std::max(n, r.prompt.size());
  return index_t(n);
}

/// The prompts as encoder rows int32 [s * b] ([s, b] order), right-padded
/// with `pad`, and their mask int32 [b, s].
struct EncoderInput {
  Tensor ids, mask;
};
EncoderInput encoder_input(const std::vector<Request>& batch, std::int32_t pad) {
  const index_t b = index_t(batch.size()), s = longest_prompt(batch);
  EncoderInput in{Tensor::empty({s * b}, DType::I32), Tensor::zeros({b, s}, DType::I32)};
  for (index_t i = 0; i < b; ++i) {
    const std::vector<std::int32_t>& prompt = batch[std::size_t(i)].prompt;
    for (index_t t = 0; t < s; ++t) {
      const bool real = t < index_t(prompt.size());
      in.ids.data<std::int32_t>()[t * b + i] = real ? prompt[std::size_t(t)] : pad;
      in.mask.data<std::int32_t>()[i * s + t] = real ? 1 : 0;
    }
  }
  return in;
}

/// Each sample's rows repeated `copies` times: rows [s * b, h] -> [s * b * copies, h]
/// (row t * b * copies + i * copies + k = row t * b + i), one gather.
Tensor repeat_samples(const Tensor& rows, index_t b, int copies, MemorySpace space) {
  const index_t s = rows.dim(0) / b, bc = b * copies;
  Tensor source = Tensor::empty({s * bc}, DType::I32);
  for (index_t t = 0; t < s; ++t)
    for (index_t j = 0; j < bc; ++j) source.data<std::int32_t>()[t * bc + j] = std::int32_t(t * b + j / copies);
  Tensor out = Tensor::empty({s * bc, rows.dim(1)}, rows.dtype(), rows.space());
  ops::embedding_forward(in_space(source, space), rows, 0, out);
  return out;
}

/// mask [b, s] -> [b * copies, s], sample i's row for each of its copies.
Tensor repeat_mask(const Tensor& mask, int copies) {
  const index_t b = mask.dim(0), s = mask.dim(1);
  Tensor out = Tensor::empty({b * copies, s}, DType::I32);
  for (index_t j = 0; j < b * copies; ++j)
    std::copy_n(mask.data<std::int32_t>() + (j / copies) * s, s,
                out.data<std::int32_t>() + j * s);
  return out;
}

LayerContext generation_context(const LayerContext& base, index_t b) {
  LayerContext ctx = base;
  ctx.training = false;
  ctx.sequence_parallel = false;
  ctx.recompute = Recompute::None;
  ctx.micro_batch = ctx.global_batch = b;
  return ctx;
}

}  // namespace

// ------------------------------------------------------------ T5Decoding ---

T5Decoding::T5Decoding(const T5Model& model, const std::vector<Request>& batch, int copies,
                       index_t capacity, std::int32_t pad_id, const LayerContext& ctx,
                       const T5Pipeline& pipeline)
    : model_(model),
      ctx_(generation_context(ctx, index_t(batch.size()) * copies)),
      pipeline_(pipeline) {
  MESH_VERIFY(!batch.empty() && copies >= 1 && capacity >= 1,
              "T5Decoding: a batch, at least one copy and one position");
  const index_t b = index_t(batch.size());
  const EncoderInput in = encoder_input(batch, pad_id);
  LayerContext encode_ctx = generation_context(ctx, b);
  encode_ctx.seq_length = longest_prompt(batch);
  Tensor memory = encoder_output(in.ids, in.mask, encode_ctx);
  if (!pipeline_.decodes()) return;
  Tensor mask = in.mask;
  if (copies > 1) {
    memory = repeat_samples(memory, b, copies, ctx_.space);
    mask = repeat_mask(in.mask, copies);
  }
  state_ = model_.start_decoding(memory, mask, capacity, ctx_);
}

Tensor T5Decoding::encoder_output(const Tensor& ids, const Tensor& mask,
                                  LayerContext& ctx) const {
  if (!pipeline_.comm) return model_.encode(ids, mask, ctx);
  Communicator& pp = *pipeline_.comm;
  const int me = pipeline_.stage(), last_encoder = pipeline_.split - 1;
  const auto received = [&](int from) {
    Tensor x = Tensor::empty({ids.numel(), model_.spec().hidden_size}, pipeline_.dtype, ctx.space);
    pp.recv(x.raw(), std::size_t(x.numel()), pipeline_.dtype, from);
    return x;
  };
  if (pipeline_.decodes()) return received(last_encoder);
  const Tensor x = model_.encode(me == 0 ? ids : received(me - 1), mask, ctx);
  MESH_VERIFY(x.dtype() == pipeline_.dtype, "T5Decoding: the encoder's rows are not in the "
                                            "pipeline's activation dtype");
  // The next encoder stage, or (the encoder output) every decoder stage:
  // each one's cross-attentions read it.
  const int end = me == last_encoder ? pipeline_.stages() : me + 2;
  for (int to = me + 1; to < end; ++to)
    pp.send(x.raw(), std::size_t(x.numel()), pipeline_.dtype, to);
  return Tensor();
}

Tensor T5Decoding::step(const std::vector<std::int32_t>& ids) {
  MESH_VERIFY(index_t(ids.size()) == sequences(),
              "T5Decoding::step: " << ids.size() << " ids for " << sequences() << " sequences");
  if (!pipeline_.comm) return model_.decode_step(ids_tensor(ids), ctx_, state_);
  if (!pipeline_.decodes()) {  // an encoder stage keeps the position only (the draws key by it)
    ++state_.position;
    return Tensor();
  }
  Communicator& pp = *pipeline_.comm;
  const int me = pipeline_.stage();
  Tensor x = ids_tensor(ids);
  if (me > pipeline_.split) {
    x = Tensor::empty({sequences(), model_.spec().hidden_size}, pipeline_.dtype, ctx_.space);
    pp.recv(x.raw(), std::size_t(x.numel()), pipeline_.dtype, me - 1);
  }
  const Tensor y = model_.decode_step(x, ctx_, state_);
  if (pipeline_.last()) return y;
  MESH_VERIFY(y.dtype() == pipeline_.dtype, "T5Decoding: the decoder's rows are not in the "
                                            "pipeline's activation dtype");
  pp.send(y.raw(), std::size_t(y.numel()), pipeline_.dtype, me + 1);
  return Tensor();
}

void T5Decoding::reorder(const std::vector<index_t>& to, const std::vector<index_t>& from) {
  if (state_.self.empty()) return;  // an encoder stage: no decoder caches
  // The self caches [sequences * heads_local, capacity, d] are sequence-major:
  // one KvCache slot per sequence.
  KvCache slots;
  for (T5Attention::KeyValues& kv : state_.self)
    slots.layers.push_back({kv.k.reshape({sequences(), kv.k.numel() / sequences()}),
                            kv.v.reshape({sequences(), kv.v.numel() / sequences()})});
  slots.reorder(to, from);
}

// ----------------------------------------------------------- T5Generator ---

T5Generator::T5Generator(const T5Model& model, TensorParallelGroup& tp, MemorySpace space,
                         std::int32_t decoder_start_id, std::int32_t pad_id,
                         const T5Pipeline& pipeline)
    : model_(model), ctx_{tp}, start_id_(decoder_start_id), pad_id_(pad_id), pipeline_(pipeline) {
  ctx_.space = space;
  ctx_.training = false;
  MESH_VERIFY(pipeline_.comm ? pipeline_.encodes() == !model_.encoder.blocks.empty() &&
                                   pipeline_.decodes() == !model_.decoder.blocks.empty()
                             : !model_.encoder.blocks.empty() && !model_.decoder.blocks.empty(),
              "T5Generator: stage " << pipeline_.stage() << " of split " << pipeline_.split
                                    << " does not hold the stack it runs");
}

void T5Generator::share_choices(std::vector<TokenChoice>& choices) const {
  if (pipeline_.comm) broadcast_choices(*pipeline_.comm, pipeline_.stages() - 1, choices);
}

void T5Generator::share_candidates(std::vector<std::vector<BeamCandidate>>& groups, int n) const {
  if (pipeline_.comm) broadcast_candidates(*pipeline_.comm, pipeline_.stages() - 1, groups, n);
}

index_t T5Generator::vocab_begin() const { return meshtron::vocab_begin(model_.spec(), ctx_.tp); }

index_t T5Generator::cache_bytes(index_t sequences, index_t capacity, index_t encoder_length,
                                 DType dtype) const {
  // Per decoder layer: self k and v [sequences * heads/tp, capacity, d_kv],
  // cross k and v [sequences * heads/tp, encoder_length, d_kv].
  const ModelSpec& s = model_.spec();
  const index_t heads = s.block.attention.num_heads / ctx_.tp.size();
  const auto layers = index_t(model_.decoder.blocks.size());
  return layers * 2 * sequences * heads * (capacity + encoder_length) * s.head_dim() *
         index_t(dtype_size(dtype));
}

std::vector<Result> T5Generator::generate(const std::vector<Request>& batch,
                                          const GenerateParams& p, const TokenCallback& on_token) {
  if (batch.empty()) return {};
  MESH_REQUIRE(p.max_new_tokens >= 1,
               "generate: max_new_tokens = " << p.max_new_tokens << " must be at least 1");
  for (const Request& r : batch)
    MESH_REQUIRE(!r.prompt.empty(), "generate: prompt " << r.index << " is empty (T5 encodes it)");
  for (const Request& r : batch)
    for (std::int32_t id : r.prompt)
      MESH_REQUIRE(id >= 0 && id < model_.spec().vocab_size,
                   "generate: prompt " << r.index << " holds token " << id
                                       << ", outside the vocabulary [0, "
                                       << model_.spec().vocab_size << ")");
  if (p.decoding != Decoding::Beam) return generate_sampled(batch, p, on_token);
  const int wanted = beam_candidate_count(p.num_beams, p.stop_ids.size());
  MESH_REQUIRE(model_.spec().vocab_size >= wanted,
               "generate: num_beams = " << p.num_beams << " takes " << wanted
                                        << " candidates a step; the vocabulary has "
                                        << model_.spec().vocab_size);
  return generate_beam(batch, p, on_token);
}

std::vector<Result> T5Generator::generate_sampled(const std::vector<Request>& batch,
                                                  const GenerateParams& p,
                                                  const TokenCallback& on_token) {
  const std::size_t n = batch.size();
  T5Decoding decoding(model_, batch, 1, p.max_new_tokens, pad_id_, ctx_, pipeline_);
  const SamplingParams sampling{p.decoding == Decoding::Greedy, p.temperature, p.top_k, p.top_p,
                                p.seed};
  const std::unordered_set<std::int32_t> stop_ids(p.stop_ids.begin(), p.stop_ids.end());
  std::vector<Result> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = {batch[i].index, batch[i].prompt, {}, {}, ""};
  std::vector<std::int32_t> ids(n, start_id_);
  std::size_t running = n;
  while (running > 0) {
    const Tensor logits = decoding.step(ids);
    std::vector<DrawKey> keys;  // the drawn token sits at the next decoder position
    for (std::size_t i = 0; i < n; ++i) keys.push_back({batch[i].index, decoding.position()});
    std::vector<TokenChoice> choices(n);
    if (pipeline_.last())
      choices = choose_tokens(logits, vocab_begin(), model_.spec().vocab_size, sampling, keys,
                              ctx_.tp.comm);
    share_choices(choices);
    for (std::size_t i = 0; i < n; ++i) {
      Result& r = out[i];
      if (!r.finish_reason.empty()) continue;
      r.ids.push_back(choices[i].id);
      r.logprobs.push_back(choices[i].logprob);
      if (on_token) on_token(r.index, choices[i].id, choices[i].logprob);
      if (stop_ids.count(choices[i].id) || (p.stop_when && p.stop_when(r.ids)))
        r.finish_reason = "stop";
      else if (int(r.ids.size()) >= p.max_new_tokens)
        r.finish_reason = "length";
      ids[i] = r.finish_reason.empty() ? choices[i].id : pad_id_;
      if (!r.finish_reason.empty()) --running;
    }
  }
  return out;
}

std::vector<Result> T5Generator::generate_beam(const std::vector<Request>& batch,
                                               const GenerateParams& p,
                                               const TokenCallback& on_token) {
  const int K = p.num_beams;
  const std::size_t n = batch.size();
  T5Decoding decoding(model_, batch, K, p.max_new_tokens, pad_id_, ctx_, pipeline_);
  const std::unordered_set<std::int32_t> stop_ids(p.stop_ids.begin(), p.stop_ids.end());
  const int wanted = beam_candidate_count(K, stop_ids.size());
  std::vector<BeamGroup> groups(n, BeamGroup(K, p.length_penalty, p.early_stopping));
  std::vector<std::int32_t> ids(n * std::size_t(K), start_id_);
  std::vector<std::size_t> active(n);  // prompts still searching
  for (std::size_t i = 0; i < n; ++i) active[i] = i;

  for (int length = 1; !active.empty(); ++length) {
    const Tensor logits = decoding.step(ids);
    // Rows of the active prompts' running beams (the first step: beam 0 only).
    std::vector<std::vector<index_t>> rows(active.size());
    std::vector<std::vector<double>> scores(active.size());
    for (std::size_t a = 0; a < active.size(); ++a)
      for (std::size_t k = 0; k < groups[active[a]].running.size(); ++k) {
        rows[a].push_back(beam_slot(active[a], int(k), K));
        scores[a].push_back(groups[active[a]].running[k].score);
      }
    std::vector<std::vector<BeamCandidate>> candidates(active.size());
    if (pipeline_.last())
      candidates = beam_candidates(logits, vocab_begin(), model_.spec().vocab_size, rows, scores,
                                   wanted, ctx_.tp.comm);
    share_candidates(candidates, wanted);
    std::vector<std::size_t> next;
    std::vector<index_t> to, from;
    for (std::size_t a = 0; a < active.size(); ++a) {
      const std::size_t i = active[a];
      const std::vector<int> sources = advance_beams(groups[i], candidates[a], stop_ids, K, length);
      const bool searching = !groups[i].done && length < p.max_new_tokens;
      MESH_VERIFY(!searching || int(sources.size()) == K,
                  "T5Generator: " << sources.size() << " continuing beams of " << K);
      for (int k = 0; k < K; ++k)
        ids[std::size_t(beam_slot(i, k, K))] =
            searching ? groups[i].running[std::size_t(k)].ids.back() : pad_id_;
      if (!searching) continue;
      next.push_back(i);
      for (int k = 0; k < K; ++k) {
        to.push_back(beam_slot(i, k, K));
        from.push_back(beam_slot(i, sources[std::size_t(k)], K));
      }
    }
    active = std::move(next);
    if (!active.empty()) decoding.reorder(to, from);
  }

  return beam_results(groups, batch, on_token);
}

}  // namespace meshtron::generate
