// meshtron evaluate DECK [--set k=v ...]: the loss and perplexity of a
// checkpoint (Megatron's evaluation), on any layout and device.
//
//   mpirun -np 8 meshtron evaluate DECK --set checkpoint.load=auto --set evaluate.split=test
//   meshtron evaluate DECK --set checkpoint.load=ckpt/iter_0000000.h5
//       --set evaluate.inputs=rows.jsonl --set evaluate.output=result.json
//
//   1. read and validate the deck; resolve checkpoint.load (a file, or auto)
//   2. read the rows: evaluate.inputs, or the samples of evaluate.split
//   3. build the model under the deck's layout at the evaluation
//      micro-batch size and load the checkpoint's weights
//   4. score every row once (train/evaluation.hpp); rank 0 prints the
//      result line and writes evaluate.output
//
// model.arch = bert: the whole batches of Megatron's BERT samples (one
// epoch) of evaluate.split, or the rows of evaluate.inputs
// (train/bert_evaluation.hpp), scored for the MLM loss over the labelled
// tokens and the binary head's accuracy. model.arch = t5: the whole batches
// of Megatron's T5 span-corruption samples of evaluate.split, or the rows of
// evaluate.inputs (train/t5_evaluation.hpp, each row's loss too), scored for
// the mean cross-entropy over their labelled decoder tokens. Both run
// through the trainer's evaluation schedule (Trainer::evaluate_heads) on any
// pipeline: the last stage reads its scores from the head's cache, and the
// sums go over the pipeline and dp.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>

#include <nlohmann/json.hpp>

#include "app/commands.hpp"
#include "app/sft_rows.hpp"
#include "config/model_spec_from_deck.hpp"
#include "common/error.hpp"
#include "data/bert_samples.hpp"
#include "data/bert_tokenizer.hpp"
#include "data/t5_samples.hpp"
#include "data/t5_vocabulary.hpp"
#include "io/checkpoint.hpp"
#include "model/bert_model.hpp"
#include "model/t5_model.hpp"
#include "train/bert_evaluation.hpp"
#include "train/t5_evaluation.hpp"
#include "train/evaluation.hpp"
#include "train/trainer.hpp"
#include "train/trainer_checkpoint.hpp"

namespace meshtron::app {

std::string checkpoint_to_load(const RunConfig& c, const std::string& command) {
  const std::string& load = c.checkpoint.load;
  MESH_REQUIRE(!load.empty(), command << " needs checkpoint.load (a checkpoint .h5 file, or auto = "
                              "the latest in checkpoint.save_dir)");
  std::string path = load;
  MESH_REQUIRE(load != "auto" || io::find_latest(c.checkpoint.save_dir, path),
               "checkpoint.load = auto: no checkpoint in checkpoint.save_dir '"
                   << c.checkpoint.save_dir << "'");
  MESH_REQUIRE(std::filesystem::is_regular_file(path),
               "checkpoint.load: no checkpoint file '" << path << "'");
  return path;
}

namespace {

/// The deck with [training]'s batch shape replaced by [evaluate]'s (resolved
/// by validate): the trainer's micro-batch is the evaluation's.
RunConfig with_evaluation_batch(RunConfig c) {
  c.training.micro_batch_size = c.evaluate.micro_batch_size;
  c.training.global_batch_size = c.evaluate.global_batch_size;
  return c;
}

std::unique_ptr<EvalRows> rows_to_score(const RunConfig& c, int vocab) {
  if (c.model.arch == "bert" || c.model.arch == "t5") return nullptr;  // run_bert, run_t5
  if (c.data.source == "jsonl" && c.evaluate.inputs.empty()) return nullptr;  // sft_valid_rows
  if (!c.evaluate.inputs.empty()) return jsonl_rows(c.evaluate.inputs, c.model.seq_length, vocab);
  MESH_REQUIRE(!c.data.path.empty(), "evaluate.split = " << c.evaluate.split
                                         << " needs data.path (or evaluate.inputs)");
  auto rows = split_rows(c, c.evaluate.split, vocab);
  MESH_REQUIRE(rows->size() > 0, "evaluate.split = " << c.evaluate.split << ": data.split "
                                     << c.data.split << " gives it no sample of model.seq_length"
                                     << " + 1 = " << c.model.seq_length + 1 << " tokens of "
                                     << c.data.path);
  return rows;
}

class EvaluateRun {
 public:
  explicit EvaluateRun(RunConfig config)
      : c_(with_evaluation_batch(std::move(config))),
        checkpoint_(checkpoint_to_load(c_, "evaluate")),
        vocab_(resolve_vocab(c_)),
        rows_(rows_to_score(c_, vocab_)),
        rt_(MPI_COMM_WORLD, c_.degrees(),
            c_.run.device == "cuda" ? MemorySpace::Cuda : MemorySpace::Host),
        model_(model_spec_from_deck(c_, vocab_, rt_.topo.tp())),
        trainer_(c_, model_, rt_, compute_dtype(c_)),
        rank0_(rt_.topo.world_rank() == 0) {}

  int run() {
    if (c_.model.arch == "bert") return run_bert();
    if (c_.model.arch == "t5") return run_t5();
    const auto sft = scores_jsonl() ? sft_valid_rows() : nullptr;
    const io::TrainState state = load_trainer_weights(trainer_, checkpoint_);
    const std::string what = c_.evaluate.inputs.empty() ? c_.evaluate.split : "inputs";
    if (rank0_)
      std::cout << "meshtron evaluate " << c_.deck_path << "\n > checkpoint " << checkpoint_
                << " (iteration " << state.iteration << ")\n > "
                << (sft ? sft->size() : rows_->size()) << " rows of "
                << (sft ? c_.data.valid_path + " (their completion tokens scored)"
                    : c_.evaluate.inputs.empty() ? "the " + what + " split of " + c_.data.path
                                                 : c_.evaluate.inputs)
                << ", " << c_.training.global_batch_size << " per batch ("
                << c_.training.micro_batch_size << " per micro-batch) on tp "
                << rt_.topo.tp() << " x pp " << rt_.topo.pp() << " x dp " << rt_.topo.dp()
                << std::endl;
    const DataLayout layout = evaluation_layout();
    const EvalResult r =
        sft ? evaluate_sft(*sft, layout) : evaluate_rows(trainer_, *rows_, layout);
    if (!rank0_) return 0;
    std::cout << r.line() << std::endl;
    if (!c_.evaluate.output.empty()) {
      std::ofstream out(c_.evaluate.output);
      out << r.json(what, checkpoint_) << "\n";
      MESH_VERIFY(out.good(), "cannot write evaluate.output '" << c_.evaluate.output << "'");
    }
    return 0;
  }

 private:
  DataLayout evaluation_layout() const {
    return {c_.model.seq_length, c_.training.micro_batch_size, c_.training.global_batch_size,
            rt_.topo.dp_rank(), rt_.topo.dp(), 0, 0, c_.run.seed, c_.model.decoder_seq_length};
  }

  /// data.source = jsonl without evaluate.inputs: the rows of
  /// data.valid_path, scored on their completion (T5: target) tokens.
  bool scores_jsonl() const { return c_.data.source == "jsonl" && c_.evaluate.inputs.empty(); }
  std::shared_ptr<const SftSamples> sft_valid_rows() const {
    MESH_REQUIRE(c_.evaluate.split == "valid", "evaluate.split = " << c_.evaluate.split
                     << ": data.source = jsonl scores data.valid_path (evaluate.split = valid)");
    MESH_REQUIRE(!c_.data.valid_path.empty(),
                 "evaluate.split = valid on data.source = jsonl needs data.valid_path");
    return sft_samples(c_, c_.data.valid_path, "data.valid_path", vocab_, rank0_);
  }

  /// Every row of `samples` once, the sum and number of the losses of its
  /// scored tokens (their masks: with_loss_mask) over the whole grid.
  EvalResult evaluate_sft(const SftSamples& samples, const DataLayout& layout) {
    EvalResult r;
    r.samples = samples.size();
    for (std::int64_t first = 0; first < r.samples; first += layout.global_batch) {
      std::vector<MicroBatch> batch;
      for (MicroBatch& mb : sft_eval_batch(samples, layout, first))
        batch.push_back(with_loss_mask(std::move(mb)));
      const LossSum s = trainer_.evaluate_sum(batch);
      r.loss_sum += s.sum;
      r.tokens += s.tokens;
    }
    return r;
  }

  int run_t5() {
    return c_.evaluate.inputs.empty() && !scores_jsonl() ? run_t5_split() : run_t5_inputs();
  }

  /// The rows of evaluate.inputs (train/t5_evaluation.hpp), or of
  /// data.valid_path on data.source = jsonl.
  std::vector<data::T5Sample> t5_rows_to_score() const {
    if (!scores_jsonl())
      return t5_jsonl_rows(c_.evaluate.inputs, c_.model.seq_length, c_.model.decoder_seq_length,
                           vocab_);
    const auto samples = sft_valid_rows();
    std::vector<data::T5Sample> rows;
    for (std::int64_t i = 0; i < samples->size(); ++i) rows.push_back(samples->t5_sample(i));
    return rows;
  }

  /// The rows of t5_rows_to_score: the mean cross-entropy over every
  /// labelled decoder token of all rows, and each row's own (null for a row
  /// without a label).
  int run_t5_inputs() {
    const std::vector<data::T5Sample> rows = t5_rows_to_score();
    const std::string what = scores_jsonl() ? "valid" : "inputs";
    const std::string& from = scores_jsonl() ? c_.data.valid_path : c_.evaluate.inputs;
    const io::TrainState state = load_trainer_weights(trainer_, checkpoint_);
    const Topology& topo = rt_.topo;
    const DataLayout layout{c_.model.seq_length, c_.training.micro_batch_size,
                            c_.training.global_batch_size, topo.dp_rank(), topo.dp(), 0, 0,
                            c_.run.seed, c_.model.decoder_seq_length};
    T5RowScores s = score_t5_rows(trainer_, rows, layout);
    for (std::vector<double>* v : {&s.loss_sum, &s.labelled}) {
      rt_.pp.all_reduce(v->data(), v->size(), DType::F64, ReduceOp::Sum);
      rt_.dp.all_reduce(v->data(), v->size(), DType::F64, ReduceOp::Sum);
    }
    if (!rank0_) return 0;
    const double loss_sum = std::accumulate(s.loss_sum.begin(), s.loss_sum.end(), 0.0);
    const double labelled = std::accumulate(s.labelled.begin(), s.labelled.end(), 0.0);
    const double loss = loss_sum / labelled;
    std::cout << "meshtron evaluate " << c_.deck_path << "\n > checkpoint " << checkpoint_
              << " (iteration " << state.iteration << ")\n " << what << " | loss " << loss
              << " | PPL " << std::exp(loss) << " | " << rows.size() << " rows of " << from
              << ", " << std::int64_t(labelled) << " labelled tokens" << std::endl;
    if (!c_.evaluate.output.empty()) {
      const auto number_or_null = [](double v) {
        return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
      };
      nlohmann::ordered_json j;
      j["split"] = what;
      j["checkpoint"] = checkpoint_;
      j["loss"] = number_or_null(loss);
      j["ppl"] = number_or_null(std::exp(loss));
      j["rows"] = rows.size();
      j["labelled_tokens"] = std::int64_t(labelled);
      j["row_losses"] = nlohmann::ordered_json::array();
      for (std::size_t i = 0; i < rows.size(); ++i)
        j["row_losses"].push_back(number_or_null(s.loss_sum[i] / s.labelled[i]));
      std::ofstream out(c_.evaluate.output);
      out << j.dump() << "\n";
      MESH_VERIFY(out.good(), "cannot write evaluate.output '" << c_.evaluate.output << "'");
    }
    return 0;
  }

  /// The mean cross-entropy over every labelled decoder token of the
  /// split's T5 samples (whole batches), as transformers' T5 loss of one
  /// batch holding them all.
  int run_t5_split() {
    MESH_REQUIRE(c_.evaluate.split != "all", "evaluate.split = all: T5 scores valid or test");
    const int split = c_.evaluate.split == "test" ? 2 : 1;
    const auto tokenizer = load_tokenizer(c_.data);
    const auto samples = t5_split_samples(
        c_, split, 0, data::t5_special_tokens(*tokenizer, c_.data.vocab_extra_ids));
    const std::int64_t global = c_.training.global_batch_size;
    const std::int64_t batches = samples ? samples->size() / global : 0;
    MESH_REQUIRE(batches > 0, "evaluate.split = " << c_.evaluate.split << ": data.split "
                                  << c_.data.split << " gives fewer T5 samples than one batch of "
                                  << global);
    const io::TrainState state = load_trainer_weights(trainer_, checkpoint_);
    const Topology& topo = rt_.topo;
    const DataLayout layout{c_.model.seq_length, c_.training.micro_batch_size, global,
                            topo.dp_rank(),       topo.dp(),                    0,
                            0,                    c_.run.seed,                  c_.model.decoder_seq_length};
    double loss_sum = 0, labelled = 0;  // on the last stage
    for (std::int64_t k = 0; k < batches; ++k) {
      const std::vector<MicroBatch> batch = t5_batch(*samples, layout, k * global);
      trainer_.evaluate_heads(batch, [&](int m, const StageCache& cache) {
        const Tensor& targets = batch[std::size_t(m)].targets;
        const auto* labels = targets.data<std::int32_t>();
        const auto n = double(std::count_if(labels, labels + targets.numel(),
                                            [](std::int32_t l) { return l != -100; }));
        loss_sum += static_cast<const T5Model::Cache&>(cache).loss * n;
        labelled += n;
      });
    }
    loss_sum = rt_.dp.all_reduce_scalar(rt_.pp.all_reduce_scalar(loss_sum));
    labelled = rt_.dp.all_reduce_scalar(rt_.pp.all_reduce_scalar(labelled));
    if (!rank0_) return 0;
    const double loss = loss_sum / labelled;
    std::cout << "meshtron evaluate " << c_.deck_path << "\n > checkpoint " << checkpoint_
              << " (iteration " << state.iteration << ")\n " << c_.evaluate.split
              << " split | loss " << loss << " | PPL " << std::exp(loss) << " | "
              << batches * global << " samples (" << batches << " whole batches of "
              << samples->size() << "), " << std::int64_t(labelled) << " labelled tokens"
              << std::endl;
    if (!c_.evaluate.output.empty()) {
      std::ofstream out(c_.evaluate.output);
      out << "{\"split\": \"" << c_.evaluate.split << "\", \"checkpoint\": \"" << checkpoint_
          << "\", \"loss\": " << loss << ", \"samples\": " << batches * global
          << ", \"labelled_tokens\": " << std::int64_t(labelled) << "}\n";
      MESH_VERIFY(out.good(), "cannot write evaluate.output '" << c_.evaluate.output << "'");
    }
    return 0;
  }

  int run_bert() {
    const io::TrainState state = load_trainer_weights(trainer_, checkpoint_);
    const Topology& topo = rt_.topo;
    const DataLayout layout{c_.model.seq_length, c_.training.micro_batch_size,
                            c_.training.global_batch_size, topo.dp_rank(), topo.dp(), 0, 0,
                            c_.run.seed};
    std::string what, detail;  // "valid split", "samples (B whole batches of M)"
    BertModel::Scores sum = c_.evaluate.inputs.empty() ? bert_split_scores(layout, what, detail)
                                                       : bert_input_scores(layout, what, detail);
    for (double* v : {&sum.mlm_loss_sum, &sum.labelled, &sum.binary_correct, &sum.samples})
      *v = rt_.dp.all_reduce_scalar(rt_.pp.all_reduce_scalar(*v));  // the last stage's
    if (!rank0_) return 0;
    const double mlm = sum.mlm_loss_sum / sum.labelled, accuracy = sum.binary_correct / sum.samples;
    std::cout << "meshtron evaluate " << c_.deck_path << "\n > checkpoint " << checkpoint_
              << " (iteration " << state.iteration << ")\n " << what << " | MLM loss " << mlm
              << " | MLM PPL " << std::exp(mlm) << " | binary-head accuracy " << accuracy << " | "
              << std::int64_t(sum.samples) << " " << detail << ", " << std::int64_t(sum.labelled)
              << " masked tokens" << std::endl;
    if (!c_.evaluate.output.empty()) {
      const auto number_or_null = [](double v) {
        return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
      };
      nlohmann::ordered_json j;
      j["split"] = c_.evaluate.inputs.empty() ? c_.evaluate.split : "inputs";
      j["checkpoint"] = checkpoint_;
      j["mlm_loss"] = number_or_null(mlm);
      j["binary_accuracy"] = number_or_null(accuracy);
      j["samples"] = std::int64_t(sum.samples);
      j["masked_tokens"] = std::int64_t(sum.labelled);
      std::ofstream out(c_.evaluate.output);
      out << j.dump() << "\n";
      MESH_VERIFY(out.good(), "cannot write evaluate.output '" << c_.evaluate.output << "'");
    }
    return 0;
  }

  /// The whole batches of Megatron's BERT samples (one epoch) of evaluate.split.
  BertModel::Scores bert_split_scores(const DataLayout& layout, std::string& what,
                                      std::string& detail) {
    MESH_REQUIRE(c_.evaluate.split != "all", "evaluate.split = all: BERT scores valid or test");
    const int split = c_.evaluate.split == "test" ? 2 : 1;
    const auto tokenizer = load_tokenizer(c_.data);
    const auto samples = bert_split_samples(c_, split, 0, data::bert_masking_tokens(*tokenizer));
    const std::int64_t global = c_.training.global_batch_size;
    const std::int64_t batches = samples ? samples->size() / global : 0;
    MESH_REQUIRE(batches > 0, "evaluate.split = " << c_.evaluate.split << ": data.split "
                                  << c_.data.split << " gives fewer BERT samples than one batch of "
                                  << global);
    BertModel::Scores sum;  // on the last stage
    for (std::int64_t k = 0; k < batches; ++k)
      trainer_.evaluate_heads(bert_batch(*samples, layout, k * global),
                              [&](int, const StageCache& cache) {
                                const BertModel::Scores s =
                                    BertModel::scores(static_cast<const BertModel::Cache&>(cache));
                                sum.mlm_loss_sum += s.mlm_loss_sum;
                                sum.labelled += s.labelled;
                                sum.binary_correct += s.binary_correct;
                                sum.samples += s.samples;
                              });
    what = c_.evaluate.split + " split";
    detail = MESH_MSG("samples (" << batches << " whole batches of " << samples->size() << ")");
    return sum;
  }

  /// The rows of evaluate.inputs (train/bert_evaluation.hpp).
  BertModel::Scores bert_input_scores(const DataLayout& layout, std::string& what,
                                      std::string& detail) {
    const auto rows = bert_jsonl_rows(c_.evaluate.inputs, c_.model.seq_length, vocab_,
                                      model_.num_token_types);
    what = "inputs";
    detail = MESH_MSG("next-sentence labels in " << rows.size() << " rows of "
                                                 << c_.evaluate.inputs);
    return score_bert_rows(trainer_, rows, layout);
  }

  RunConfig c_;  ///< the trainer keeps a reference: declared first
  std::string checkpoint_;
  int vocab_;
  std::unique_ptr<EvalRows> rows_;
  ParallelRuntime rt_;
  ModelSpec model_;
  Trainer trainer_;
  bool rank0_;
};

}  // namespace

int run_evaluate(const std::vector<std::string>& args) {
  const DeckArgs parsed = parse_deck_args(args);
  RunConfig config = read_decks(parsed, "evaluate");
  MESH_REQUIRE(parsed.rest.empty(), "evaluate: unknown argument '" << parsed.rest.front() << "'");
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  config.validate(world);
  EvaluateRun run(std::move(config));
  return run.run();
}

}  // namespace meshtron::app
