// meshtron train DECK... [--set k=v ...]
//
//   1. read and validate the decks; build the topology and communicators
//   2. build the model stage(s), optimizer and data source of this rank;
//      claim the checkpoint folder (a lock) and check the run folder is
//      writable, before any step
//   3. resume from a checkpoint when checkpoint.load asks for one, or take
//      only its weights (fine-tuning: checkpoint.finetune, or a checkpoint
//      without optimizer state such as `convert` writes)
//   4. train: step lines every log_interval, greedy samples every
//      logging.sample_interval, evaluation every eval_interval,
//      checkpoints every save_interval and at the last step, JSON lines in
//      the run folder; a stop signal or run.exit_duration_mins saves and
//      ends the run after the current step
//   5. final summary, and the loss on the test split when data.split has one
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "app/commands.hpp"
#include "app/sft_rows.hpp"
#include "app/training_samples.hpp"
#include "common/error.hpp"
#include "config/model_spec_from_deck.hpp"
#include "io/checkpoint.hpp"
#include "data/bert_tokenizer.hpp"
#include "data/t5_vocabulary.hpp"
#include "io/save_dir.hpp"
#include "train/evaluation.hpp"
#include "train/gpu_trace.hpp"
#include "train/metrics.hpp"
#include "train/stop_request.hpp"
#include "train/trainer.hpp"
#include "train/trainer_checkpoint.hpp"

namespace meshtron::app {

namespace {

using Clock = std::chrono::steady_clock;

std::unique_ptr<DataSource> make_data(const RunConfig& c, const ParallelRuntime& rt, int vocab) {
  DataLayout layout{c.model.seq_length,
                    c.training.micro_batch_size,
                    c.training.global_batch_size,
                    rt.topo.dp_rank(),
                    rt.topo.dp(),
                    c.training.train_iters,
                    c.training.eval_iters,
                    c.run.seed,
                    c.model.decoder_seq_length};
  if (c.data.source == "jsonl") return make_jsonl_data(c, layout, vocab, rt.topo.world_rank() == 0);
  if (c.model.arch == "t5" && c.data.source != "indexed") return make_synthetic_t5_data(layout, vocab);
  if (c.model.arch == "t5") {
    const auto tokenizer = run_tokenizer(c);
    MESH_REQUIRE(tokenizer, "model.arch = t5 on data.source = indexed needs data.tokenizer = "
                            "sentencepiece");
    return make_indexed_t5_data(c, layout,
                                data::t5_special_tokens(*tokenizer, c.data.vocab_extra_ids));
  }
  if (c.model.arch == "bert" && c.data.source != "indexed")
    return make_synthetic_bert_data(layout, vocab);
  if (c.model.arch == "bert") {
    const auto tokenizer = run_tokenizer(c);
    MESH_REQUIRE(tokenizer, "model.arch = bert on data.source = indexed needs data.tokenizer = "
                            "bert_wordpiece_lowercase or bert_wordpiece_cased");
    return make_indexed_bert_data(c, layout, data::bert_masking_tokens(*tokenizer));
  }
  if (c.data.source == "indexed") return make_indexed_data(c, layout, vocab);
  return make_synthetic_data(layout, vocab);
}

/// "number of parameters on (tensor, pipeline) model parallel rank (t, p): N"
/// for every (t, p), as Megatron prints them (collective).
std::string parameter_table(Trainer& trainer) {
  auto& topo = trainer.runtime().topo;
  double local = 0;
  for (Parameter* p : trainer.parameters()) local += double(p->value.numel());
  std::vector<double> all(std::size_t(topo.world_size()));
  MPI_CHECK(MPI_Allgather(&local, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, topo.world_comm()));
  std::ostringstream os;
  for (int p = 0; p < topo.pp(); ++p)
    for (int t = 0; t < topo.tp(); ++t)
      os << " > number of parameters on (tensor, pipeline) model parallel rank (" << t << ", "
         << p << "): " << std::int64_t(all[std::size_t(topo.rank_of({t, 0, p}))]) << "\n";
  return os.str();
}

class TrainRun {
 public:
  TrainRun(RunConfig config, int world)
      : c_(std::move(config)),
        rt_(MPI_COMM_WORLD, c_.degrees(),
            c_.run.device == "cuda" ? MemorySpace::Cuda : MemorySpace::Host,
            c_.parallel.watchdog()),
        vocab_(resolve_vocab(c_)),
        model_(model_spec_from_deck(c_, vocab_, rt_.topo.tp())),
        trainer_(c_, model_, rt_, compute_dtype(c_)),
        data_(make_data(c_, rt_, vocab_)),
        rank0_(rt_.topo.world_rank() == 0),
        world_(world),
        tracer_(c_.logging.profile ? std::make_unique<GpuTracer>() : nullptr),
        stop_(c_.run.exit_duration_mins),
        samples_(c_.logging.sample_interval > 0
                     ? std::make_unique<TrainingSamples>(c_, trainer_, rt_, vocab_)
                     : nullptr) {}

  int run() {
    print_banner();
    claim_folders();
    long start = resume();
    last_saved_ = start;
    open_metrics();
    ProgressBar bar(c_.logging.progress, c_.training.train_iters);
    const auto run_start = Clock::now();
    bool stopped_early = false;
    for (long step = start + 1; step <= c_.training.train_iters; ++step) {
      if (tracer_ && step == c_.logging.profile_step_start) tracer_->start();
      train_one(step);
      if (tracer_ && step + 1 == c_.logging.profile_step_end) {
        if (rank0_) bar.clear();
        report_trace();
      }
      if (rank0_) bar.update(step);
      if (step % c_.logging.log_interval == 0 || step == c_.training.train_iters) {
        if (rank0_) bar.clear();
        log_step(step);
      }
      if (samples_ && step % c_.logging.sample_interval == 0) {
        if (rank0_) bar.clear();
        samples_->print(step);
      }
      if (c_.training.eval_interval > 0 && step % c_.training.eval_interval == 0) {
        if (rank0_) bar.clear();
        evaluate(step);
      }
      if (c_.checkpoint.save_interval > 0 && step % c_.checkpoint.save_interval == 0)
        save(step);
      last_step_ = step;
      if (const std::string why = stop_.agree(rt_.world); !why.empty()) {
        if (rank0_) bar.clear();
        stop_early(step, why);
        stopped_early = true;
        break;
      }
    }
    save_final();
    summary(std::chrono::duration<double>(Clock::now() - run_start).count(), start);
    // A run stopped early (a walltime ahead) leaves the test split to the run that finishes.
    if (!stopped_early) evaluate_test_split(c_, trainer_, vocab_);
    return 0;
  }

 private:
  void print_banner() {
    const auto rows = gather_rank_map(rt_.topo, rt_.num_gpus());
    const std::string params = parameter_table(trainer_);
    if (!rank0_) return;
    const double peak = peak_tflops();
    std::cout << "meshtron train " << c_.deck_path << "\n"
              << c_.resolved_text() << "\n"
              << format_rank_map(rows)
              << " > " << padded_vocab_message(model_.vocab_size, model_.padded_vocab_size)
              << "\n"
              << params << pipeline_split_line(c_, model_)
              << " > model FLOPs per token F = " << model_flops_formula(model_) << " = "
              << model_flops_per_token(model_) << "; MFU = F x tokens/s/rank / peak, peak = "
              << peak << " TFLOP/s per rank\n";
  }

  double peak_tflops() const {
    if (c_.logging.peak_tflops > 0) return c_.logging.peak_tflops;
    return c_.run.device == "cuda" ? 989.0 : 0.08;
  }

  /// Before step 1: lock the checkpoint folder (a second run on it stops
  /// here) and check that both folders can be written.
  void claim_folders() {
    MPI_Comm world = rt_.topo.world_comm();
    if (!c_.checkpoint.save_dir.empty())
      save_dir_lock_ = std::make_unique<io::SaveDirLock>(world, c_.checkpoint.save_dir);
    io::require_writable_dir(world, run_folder().string(), "run.output_dir");
  }

  std::filesystem::path run_folder() const {
    return std::filesystem::path(c_.run.output_dir) / c_.run.name;
  }

  long resume() {
    std::string path = c_.checkpoint.load;
    if (path.empty()) return 0;
    bool finetune = c_.checkpoint.finetune;
    if (path == "auto" && !io::find_latest(c_.checkpoint.save_dir, path)) {
      if (c_.checkpoint.pretrained.empty()) {
        if (rank0_) std::cout << " > no checkpoint in " << c_.checkpoint.save_dir
                              << ": starting from scratch\n";
        return 0;
      }
      path = c_.checkpoint.pretrained;
      finetune = true;
    }
    const io::CheckpointHeader header = io::read_checkpoint_header(path, rt_.topo.world_comm());
    require_same_model(c_, header.state.deck_text, path);
    if (finetune || !header.has_optimizer_state) {
      load_trainer_weights(trainer_, path);
      if (rank0_) std::cout << " > fine-tuning from " << path << " (iteration "
                            << header.state.iteration << "): its weights, a fresh optimizer, "
                            << "iteration 0\n";
      return 0;
    }
    const io::TrainState state = load_trainer_checkpoint(trainer_, path);
    skipped_ = state.skipped_steps;
    if (rank0_) std::cout << " > resumed from " << path << " at iteration " << state.iteration << "\n";
    return long(state.iteration);
  }

  /// The last step is always saved (when there is a save_dir), whether or
  /// not save_interval divides train_iters.
  void save_final() {
    if (!c_.checkpoint.save_dir.empty() && last_step_ > last_saved_) save(last_step_);
  }

  void stop_early(long step, const std::string& why) {
    save_final();
    if (!rank0_) return;
    std::cout << " > stopping after iteration " << step << " of " << c_.training.train_iters
              << ": " << why;
    if (!c_.checkpoint.save_dir.empty())
      std::cout << "; resume with checkpoint.load = auto from " << c_.checkpoint.save_dir;
    std::cout << std::endl;
  }

  void save(long step) {
    io::TrainState state;
    state.iteration = step;
    state.consumed_samples = std::int64_t(step) * c_.training.global_batch_size;
    state.seed = c_.run.seed;
    state.skipped_steps = skipped_;
    state.deck_text = c_.text_with_overrides();
    save_trainer_checkpoint(trainer_, c_.checkpoint.save_dir, state, c_.checkpoint.keep_last);
    last_saved_ = step;
    if (rank0_) std::cout << " > saved checkpoint " << c_.checkpoint.save_dir << "/"
                          << io::checkpoint_file_name(step) << "\n";
  }

  /// The scale of the next step's backward (1 without an fp16 loss scaler).
  double current_loss_scale() {
    DynamicLossScaler* scaler = trainer_.loss_scaler();
    return scaler ? scaler->scale() : 1.0;
  }

  void open_metrics() {
    if (!rank0_) return;
    const std::filesystem::path dir = run_folder();
    std::filesystem::create_directories(dir);
    metrics_.open(dir / c_.logging.metrics_file, std::ios::app);
    MESH_VERIFY(metrics_.good(), "cannot write " << (dir / c_.logging.metrics_file).string());
    // The layout and sizes behind the metrics, for scaling-report.
    write_text((dir / kResolvedDeckFile).string(), c_.resolved_text());
  }

  void train_one(long step) {
    const auto t0 = Clock::now();
    const double waited0 = waited_so_far();
    const StepReport r = trainer_.train_step(step, data_->train_step(step));
    window_seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
    window_waited_s_ += waited_so_far() - waited0;
    ++window_steps_;
    last_ = r;
    if (r.skipped) {
      ++skipped_;
      // An fp16 overflow is the loss scaler's routine (Megatron counts it as
      // skipped, not as NaN) and does not count towards max_nan_skips.
      if (r.overflow)
        ++overflows_;
      else if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm))
        ++nan_;
    }
    MESH_REQUIRE(skipped_ - overflows_ <= c_.training.max_nan_skips,
                 "training.max_nan_skips (" << c_.training.max_nan_skips
                     << ") exceeded at iteration " << step << ": loss " << r.loss
                     << ", grad norm " << r.grad_norm);
  }

  /// Stops the kernel trace; every rank writes its Chrome trace and kernel
  /// table to the run folder, rank 0 prints each rank's time split.
  void report_trace() {
    tracer_->stop();
    const int steps = c_.logging.profile_step_end - c_.logging.profile_step_start;
    const int rank = rt_.topo.world_rank();
    const TraceSummary s =
        summarize_trace(tracer_->events(), tracer_->begin_ns(), tracer_->end_ns(), steps);
    const std::filesystem::path dir = run_folder();
    std::error_code ignored;  // another rank may create it at the same time
    std::filesystem::create_directories(dir, ignored);
    const std::string stem = (dir / ("trace_rank" + std::to_string(rank))).string();
    write_text(stem + ".json", chrome_trace_json(tracer_->events(), tracer_->begin_ns(), rank));
    std::ostringstream table;
    table << s.line() << "\n" << "ms/step  calls/step  kernel\n";
    for (const KernelTotal& k : s.top)
      table << std::fixed << std::setprecision(3) << k.ms_per_step << "  " << std::setprecision(1)
            << k.calls_per_step << "  " << k.name << "\n";
    write_text(stem + ".txt", table.str());
    tracer_.reset();
    const double mine[] = {s.window_ms, s.busy_ms, s.compute_ms, s.comm_ms, s.exposed_comm_ms, s.idle_ms};
    constexpr int kFields = int(std::size(mine));
    std::vector<double> all(std::size_t(kFields * world_));
    MPI_CHECK(MPI_Gather(mine, kFields, MPI_DOUBLE, all.data(), kFields, MPI_DOUBLE, 0,
                         rt_.topo.world_comm()));
    if (!rank0_) return;
    std::cout << " > GPU trace of steps [" << c_.logging.profile_step_start << ", "
              << c_.logging.profile_step_end << ") in " << dir.string()
              << "/trace_rank*.{json,txt}, per step:\n";
    for (int r = 0; r < world_; ++r) {
      TraceSummary t;
      const double* f = &all[std::size_t(r * kFields)];
      t.window_ms = f[0], t.busy_ms = f[1], t.compute_ms = f[2], t.comm_ms = f[3],
      t.exposed_comm_ms = f[4], t.idle_ms = f[5];
      std::cout << "   rank " << r << ": " << t.line() << "\n";
    }
    std::cout << std::flush;
  }

  static void write_text(const std::string& path, const std::string& text) {
    std::ofstream out(path);
    out << text;
    MESH_VERIFY(out.good(), "cannot write " << path);
  }

  void log_step(long step) {
    StepLine line;
    line.iteration = step;
    line.train_iters = c_.training.train_iters;
    line.consumed_samples = step * c_.training.global_batch_size;
    line.ms_per_step = 1e3 * window_seconds_ / std::max(window_steps_, 1L);
    const double tokens = double(c_.training.global_batch_size) * model_.seq_length;
    line.tokens_per_s_per_rank = tokens / (line.ms_per_step / 1e3) / world_;
    line.tflops_per_rank = line.tokens_per_s_per_rank * model_flops_per_token(model_) / 1e12;
    line.mfu = line.tflops_per_rank / peak_tflops();
    line.lr = last_.lr;
    line.loss = last_.loss;
    line.grad_norm = last_.grad_norm;
    line.loss_scale = current_loss_scale();  // after the step's update, as Megatron logs it
    line.skipped = skipped_;
    line.nan = nan_;
    line.memory_mib = rt_.world.all_reduce_scalar(peak_memory_mib(rt_.space()), ReduceOp::Max);
    line.tensor_memory_mib =
        rt_.world.all_reduce_scalar(peak_tensor_mib(rt_.space()), ReduceOp::Max);
    const std::string spread = step_time_spread(line.ms_per_step, waited_ms_per_step());
    total_seconds_ += window_seconds_;
    window_seconds_ = 0;
    window_waited_s_ = 0;
    window_steps_ = 0;
    if (!rank0_) return;
    std::cout << line.text() << std::endl;
    if (!spread.empty()) std::cout << spread << std::endl;
    metrics_ << line.json() << std::endl;
  }

  /// Under the watchdog: this rank's ms per step of the log window spent
  /// waiting for its peers; NAN without it.
  double waited_ms_per_step() {
    if (!rt_.watchdog()) return NAN;
    return 1e3 * window_waited_s_ / std::max(window_steps_, 1L);
  }

  /// The watchdog's waited seconds so far (0 without it).
  double waited_so_far() { return rt_.watchdog() ? rt_.watchdog()->waited_seconds() : 0.0; }

  /// Stragglers: every rank's ms/step of the log window and, under the
  /// watchdog, the part of it not spent waiting for peers (one all-gather
  /// of two doubles per log line), as rank 0 prints it; "" on one rank.
  std::string step_time_spread(double ms_per_step, double waited_ms) {
    if (world_ == 1) return "";
    const double mine[2] = {ms_per_step, ms_per_step - waited_ms};
    std::vector<double> all(2 * static_cast<std::size_t>(world_));
    rt_.world.all_gather(mine, all.data(), 2, DType::F64);
    std::ostringstream os;
    os << std::fixed << std::setprecision(1) << " > step time over " << world_ << " ranks: "
       << spread_text(all, 0);
    if (!std::isnan(waited_ms)) os << "; less waits for peers: " << spread_text(all, 1);
    return os.str();
  }

  /// "min 61.9 ms (rank 1), max 72.1 ms (rank 3, the slowest), spread 16.4 %"
  /// of the values all[2 r + field].
  std::string spread_text(const std::vector<double>& all, int field) const {
    int lo = 0, hi = 0;
    for (int r = 0; r < world_; ++r) {
      if (all[std::size_t(2 * r + field)] < all[std::size_t(2 * lo + field)]) lo = r;
      if (all[std::size_t(2 * r + field)] > all[std::size_t(2 * hi + field)]) hi = r;
    }
    const double min = all[std::size_t(2 * lo + field)], max = all[std::size_t(2 * hi + field)];
    std::ostringstream os;
    os << std::fixed << std::setprecision(1) << "min " << min << " ms (rank " << lo << "), max "
       << max << " ms (rank " << hi << ", the slowest), spread " << 100.0 * (max - min) / min
       << " %";
    return os.str();
  }

  void evaluate(long step) {
    double sum = 0;
    for (int k = 0; k < c_.training.eval_iters; ++k) sum += trainer_.evaluate(data_->eval_batch(k));
    const double loss = sum / c_.training.eval_iters;
    last_eval_ = loss;
    if (!rank0_) return;
    std::cout << " validation loss at iteration " << step << " | lm loss " << std::fixed
              << std::setprecision(4) << loss << " | lm loss PPL " << std::setprecision(2)
              << std::exp(loss) << std::endl;
    metrics_ << "{\"iteration\": " << step << ", \"eval_loss\": " << std::setprecision(10)
             << loss << ", \"eval_ppl\": " << std::exp(loss) << "}" << std::endl;
  }

  void summary(double seconds, long start) {
    if (!rank0_) return;
    const long steps = c_.training.train_iters - start;
    std::cout << " > done: " << steps << " steps in " << std::fixed << std::setprecision(1)
              << seconds << " s (" << std::setprecision(0)
              << double(steps) * c_.training.global_batch_size * model_.seq_length / seconds
              << " tokens/s over " << world_ << " ranks), final loss " << std::setprecision(4)
              << last_.loss;
    if (!std::isnan(last_eval_)) std::cout << ", last validation loss " << last_eval_;
    std::cout << ", skipped steps " << skipped_ << std::endl;
  }

  RunConfig c_;
  ParallelRuntime rt_;
  int vocab_;
  ModelSpec model_;
  Trainer trainer_;
  std::unique_ptr<DataSource> data_;
  bool rank0_;
  int world_;
  std::ofstream metrics_;
  StepReport last_;
  long skipped_ = 0, nan_ = 0, overflows_ = 0, window_steps_ = 0;
  double window_seconds_ = 0, total_seconds_ = 0, last_eval_ = NAN;
  double window_waited_s_ = 0;  ///< of window_seconds_, in the watchdog's waits
  std::unique_ptr<GpuTracer> tracer_;  ///< set while logging.profile has steps to trace
  StopRequest stop_;
  std::unique_ptr<io::SaveDirLock> save_dir_lock_;  ///< held while the run may save
  long last_step_ = 0, last_saved_ = 0;              ///< iterations done and saved
  std::unique_ptr<TrainingSamples> samples_;         ///< logging.sample_interval > 0 only
};

}  // namespace

int run_train(const std::vector<std::string>& args) {
  const DeckArgs parsed = parse_deck_args(args);
  MESH_REQUIRE(parsed.rest.empty(), "train: unknown argument '" << parsed.rest.front() << "'");
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  RunConfig config = read_decks(parsed, "train");
  config.validate(world);
  TrainRun run(std::move(config), world);
  return run.run();
}

}  // namespace meshtron::app
