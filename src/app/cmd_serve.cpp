// meshtron serve DECK... [--set k=v ...]: an OpenAI-compatible completions
// server for checkpoint.load on any tp x pp x dp layout (src/generate/): a
// decoder-only model continues the prompt; T5 (model.arch = t5) encodes
// the prompt and answers with its decoder's output.
//
//   mpirun -np 2 meshtron serve input_decks/gpt-tiny.deck --set checkpoint.load=auto
//       --set parallel.tensor_parallel=2 --set serve.port=8000
//   curl -s localhost:8000/v1/completions -d '{"prompt": "Once", "max_tokens": 20}'
//
//   1. read and validate the deck; build the model and load the weights
//      (as generate does, app/generation_model.hpp)
//   2. rank 0 listens (serve.host:serve.port) on HTTP threads that parse and
//      validate each request (a bad one: 4xx, nothing reaches the others)
//   3. rank 0's main thread takes one request at a time and broadcasts it;
//      every rank runs the same CompletionModel call (dp replicas repeat it)
//   4. SIGTERM or SIGINT on rank 0: it stops listening and broadcasts the
//      end; every rank returns 0
#include <unistd.h>

#include <atomic>
#include <ctime>
#include <iostream>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "app/commands.hpp"
#include "app/generation_model.hpp"
#include "common/error.hpp"
#include "generate/completion_server.hpp"
#include "generate/completions.hpp"
#include "train/stop_request.hpp"

namespace meshtron::app {

namespace {

using generate::CompletionRequest;
using nlohmann::json;

/// Rank 0's `message` on every rank ("" = stop serving). The ranks wait for
/// it in a polled non-blocking broadcast: an idle server does not spin a
/// core per rank, and no collective timeout applies between requests.
std::string broadcast_message(const std::string& message, bool root) {
  std::uint64_t size = message.size();
  MPI_Request request;
  MPI_CHECK(MPI_Ibcast(&size, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD, &request));
  for (int done = 0;;) {
    MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::string text = root ? message : std::string(size, '\0');
  if (size > 0) MPI_CHECK(MPI_Bcast(text.data(), int(size), MPI_CHAR, 0, MPI_COMM_WORLD));
  return text;
}

class ServeRun {
 public:
  explicit ServeRun(RunConfig config)
      : c_(for_generation(std::move(config))),
        checkpoint_(checkpoint_to_load(c_, "serve")),
        vocab_(resolve_vocab(c_)),
        tokenizer_(run_tokenizer(c_)),
        decode_(text_decode(c_, tokenizer_.get())),
        base_(generate_params(c_.generate, tokenizer_.get(), decode_, vocab_,
                              t5() ? t5_generation_ids(c_, nullptr).eos : -1)),
        model_(c_, vocab_),
        rank0_(model_.runtime().topo.world_rank() == 0) {}

  int run() {
    const io::TrainState state = model_.load(checkpoint_, tokenizer_.get());
    completions_ = completion_model();
    StopRequest stop(0);  // every rank: a signal to the whole job must not kill the followers
    if (rank0_) serve(state.iteration, stop);
    else follow();
    return 0;
  }

 private:
  void serve(long iteration, const StopRequest& stop) {
    generate::CompletionServer server(
        [this](const std::string& body) { return generate::parse_completion_request(body, limits()); },
        health(iteration));
    const int port = server.start(c_.serve.host, c_.serve.port);
    print_banner(iteration, port);
    std::string why;
    while ((why = stop.received()).empty()) {
      const auto job = server.next_job(std::chrono::milliseconds(50));
      if (!job) continue;
      broadcast_message(generate::to_json(job->request()).dump(), true);
      answer(job->request(), job.get());
    }
    server.stop();
    broadcast_message("", true);
    std::cout << " > " << why << ": stopped serving" << std::endl;
  }

  void follow() {
    for (std::string m; !(m = broadcast_message("", false)).empty();)
      answer(generate::completion_request_from_json(json::parse(m)), nullptr);
  }

  bool t5() const { return c_.model.arch == "t5"; }

  /// T5: a prompt fills at most the encoder's seq_length, a completion the
  /// decoder's (relative positions would take more; the caches would grow).
  std::unique_ptr<generate::CompletionModel> completion_model() {
    if (generate::T5Generator* g = model_.t5_generator())
      return std::make_unique<generate::T5Completions>(*g, c_.model.seq_length,
                                                       c_.model.decoder_seq_length);
    return std::make_unique<generate::DecoderCompletions>(model_.generator("serve"));
  }

  generate::CompletionLimits limits() {
    generate::CompletionLimits l;
    completions_->set_positions(l);
    l.vocab = vocab_;
    l.max_n = c_.serve.max_n;
    l.max_prompts = c_.serve.max_prompts;
    l.seed = c_.generate.seed;
    if (tokenizer_)
      l.encode = [this](const std::string& text) {
        std::lock_guard lock(tokenizer_mutex_);
        return text_prompt_ids(*tokenizer_, text,
                               t5() ? PromptForm::EncoderInput : PromptForm::Continuation);
      };
    return l;
  }

  /// The tokenizer is shared by the HTTP threads (encode) and the engine.
  std::string decode(const std::vector<std::int32_t>& ids) {
    if (!decode_) return "";
    std::lock_guard lock(tokenizer_mutex_);
    return decode_(ids);
  }

  /// The ids a choice's text shows: without the stop id that ended it.
  std::vector<std::int32_t> text_ids(const generate::Result& r) const {
    std::vector<std::int32_t> ids = r.ids;
    if (r.finish_reason == "stop" && !ids.empty() &&
        std::count(base_.stop_ids.begin(), base_.stop_ids.end(), ids.back()))
      ids.pop_back();
    return ids;
  }

  /// Runs `r` on every rank; on rank 0 answers `job` (streamed or whole).
  void answer(const CompletionRequest& r, generate::CompletionJob* job) {
    generate::GenerateParams params = generate::completion_params(r, base_);
    params.stop_when = stop_strings_predicate(
        [this](const std::vector<std::int32_t>& ids) { return decode(ids); }, r.stop);
    const generate::CompletionHeader header{"cmpl-" + std::to_string(++requests_),
                                            std::int64_t(std::time(nullptr)), c_.run.name};
    const auto batch = generate::completion_batch(r);
    std::vector<generate::StreamText> streams(batch.size(), generate::StreamText(r.stop));
    std::vector<std::vector<std::int32_t>> so_far(batch.size());
    generate::TokenCallback on_token;
    if (job && r.stream)
      on_token = [&](std::int64_t index, std::int32_t id, double) {
        if (std::count(base_.stop_ids.begin(), base_.stop_ids.end(), id)) return;
        auto& ids = so_far[std::size_t(index)];
        ids.push_back(id);
        const std::string piece = streams[std::size_t(index)].next(decode(ids));
        if (!piece.empty()) job->push(generate::completion_chunk(header, index, piece, ""));
      };
    const auto results = completions_->generate(batch, params, on_token);
    if (!job) return;
    std::vector<generate::ChoiceText> texts;
    for (const auto& res : results) {
      generate::ChoiceText t{decode(text_ids(res)), {}};
      for (const std::int32_t id : res.ids) t.tokens.push_back(decode({id}));
      texts.push_back(std::move(t));
    }
    if (!r.stream) {
      for (auto& t : texts) t.text = generate::cut_at_stop(t.text, r.stop);
      return job->finish(200, generate::completion_response(header, r, results, texts)
                                  .dump(-1, ' ', false, json::error_handler_t::replace));
    }
    std::string tail;
    for (std::size_t i = 0; i < results.size(); ++i)
      tail += generate::completion_chunk(header, results[i].index, streams[i].finish(texts[i].text),
                                         results[i].finish_reason);
    job->finish(200, tail + "data: [DONE]\n\n");
  }

  json health(long iteration) {
    const Topology& t = model_.runtime().topo;
    const generate::CompletionLimits l = limits();
    json h = {{"status", "ok"},
              {"model", c_.run.name},
              {"arch", c_.model.arch},
              {"checkpoint", checkpoint_},
              {"iteration", iteration},
              {"context_length", l.context},
              {"vocab_size", vocab_},
              {"tokenizer", tokenizer_ ? json(tokenizer_->name()) : json()},
              {"layout", {{"tensor_parallel", t.tp()}, {"pipeline_parallel", t.pp()},
                          {"data_parallel", t.dp()}, {"world", t.world_size()}}}};
    if (l.prompt_context > 0) h["encoder_length"] = l.prompt_context;
    return h;
  }

  void print_banner(long iteration, int port) {
    const Topology& t = model_.runtime().topo;
    std::cout << "meshtron serve " << c_.deck_path << "\n > checkpoint " << checkpoint_
              << " (iteration " << iteration << ") on tp " << t.tp() << " x pp " << t.pp()
              << " x dp " << t.dp() << "\n > listening on http://" << c_.serve.host << ":" << port
              << " (POST /v1/completions, GET /health); SIGTERM or SIGINT to rank 0 (pid "
              << ::getpid() << ") stops every rank" << std::endl;
  }

  RunConfig c_;  ///< the model keeps a reference: declared first
  std::string checkpoint_;
  int vocab_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  TextDecode decode_;  ///< through tokenizer_
  std::mutex tokenizer_mutex_;
  generate::GenerateParams base_;
  GenerationModel model_;
  std::unique_ptr<generate::CompletionModel> completions_;  ///< made by run() after the weights
  bool rank0_;
  long requests_ = 0;
};

}  // namespace

int run_serve(const std::vector<std::string>& args) {
  const DeckArgs parsed = parse_deck_args(args);
  RunConfig config = read_decks(parsed, "serve");
  MESH_REQUIRE(parsed.rest.empty(), "serve: unknown argument '" << parsed.rest.front() << "'");
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  config.validate(world);
  ServeRun run(std::move(config));
  return run.run();
}

}  // namespace meshtron::app
