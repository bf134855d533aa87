#include "config/run_config.hpp"

#include <boost/program_options.hpp>

#include <charconv>
#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <limits>
#include <set>
#include <sstream>
#include <type_traits>

#include "common/error.hpp"
#include "data/tokenizer.hpp"
#include "model/model_spec.hpp"

namespace po = boost::program_options;

namespace meshtron {

namespace {

std::string to_text(const std::string& v) { return v; }
std::string to_text(bool v) { return v ? "true" : "false"; }
std::string to_text(double v) {
  std::ostringstream os;
  os << std::setprecision(10) << v;
  return os.str();
}
template <class T>
std::string to_text(T v) { return std::to_string(v); }

constexpr double kInf = std::numeric_limits<double>::infinity();

/// The values a float key accepts, always finite: no rate, size, probability
/// or threshold of a deck means anything at inf or nan.
struct FloatRange {
  double lo, hi;
  bool lo_open, hi_open;

  bool contains(double v) const {
    return std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  }
  /// "finite", "finite and >= 0", "in [0, 1)".
  std::string text() const {
    if (lo == -kInf && hi == kInf) return "finite";
    if (hi == kInf) return "finite and " + std::string(lo_open ? "> " : ">= ") + to_text(lo);
    return "in " + std::string(lo_open ? "(" : "[") + to_text(lo) + ", " + to_text(hi) +
           (hi_open ? ")" : "]");
  }
};
constexpr FloatRange kFinite{-kInf, kInf, true, true};
constexpr FloatRange kNonNegative{0, kInf, false, true};
constexpr FloatRange kPositive{0, kInf, true, true};
constexpr FloatRange kProbability{0, 1, false, true};  ///< dropouts, Adam's betas

/// Digits only, within T: "-1", "+1", "1.5" and "2^64" are refused.
template <class T>
T parse_unsigned(const std::string& key, const std::string& text) {
  T v{};
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, v);
  MESH_REQUIRE(!text.empty() && error == std::errc{} && stop == end,
               key << " = '" << text << "' is not an integer in [0, "
                   << std::numeric_limits<T>::max() << "]");
  return v;
}

/// Binds deck keys to RunConfig fields: one call per key registers its type,
/// default and documentation with program_options and remembers how to print
/// the resolved value.
class DeckSchema {
 public:
  explicit DeckSchema(RunConfig& c) : options_("input deck keys") { bind(c); }

  const po::options_description& options() const { return options_; }

  std::string resolved_text() const {
    std::ostringstream os;
    std::string section;
    for (const auto& k : keys_) {
      const std::string s = k.name.substr(0, k.name.find('.'));
      if (s != section) os << (section.empty() ? "" : "\n") << "[" << (section = s) << "]\n";
      os << "  " << std::left << std::setw(30) << k.name.substr(s.size() + 1) << " = "
         << k.print() << "\n";
    }
    return os.str();
  }

  std::string help() const {
    std::ostringstream os;
    for (const auto& k : keys_)
      os << std::left << std::setw(40) << k.name << " " << std::setw(7) << k.type
         << " default " << std::setw(12) << k.default_text << " " << k.doc << "\n";
    return os.str();
  }

  /// After program_options has stored the values: the unsigned keys from
  /// their text.
  void read_unsigned_keys() const {
    for (const auto& read : read_unsigned_) read();
  }

  /// Every float key within its range; throws UserError naming the first
  /// that is not.
  void require_floats_in_range() const {
    for (const auto& require : require_in_range_) require();
  }

 private:
  struct Key {
    std::string name, type, default_text, doc;
    std::function<std::string()> print;
  };

  template <class T>
  void key(const std::string& name, T* field, const char* type, const std::string& doc) {
    const T def = *field;
    if constexpr (std::is_unsigned_v<T> && !std::is_same_v<T, bool>) {
      // Read as text: program_options' lexical_cast takes "-1" for an
      // unsigned type and wraps it around to its maximum.
      std::string& text = unsigned_text_.emplace_back(to_text(def));
      options_.add_options()(name.c_str(), po::value<std::string>(&text)->default_value(text),
                             doc.c_str());
      read_unsigned_.push_back([name, field, &text] { *field = parse_unsigned<T>(name, text); });
    } else {
      options_.add_options()(name.c_str(), po::value<T>(field)->default_value(def),
                             doc.c_str());
    }
    keys_.push_back({name, type, to_text(def), doc, [field] { return to_text(*field); }});
  }

  /// A float key, finite and within `range` (checked by
  /// require_floats_in_range, at validation).
  void key(const std::string& name, double* field, const char* type, const std::string& doc,
           FloatRange range = kFinite) {
    key<double>(name, field, type, doc);
    keys_.back().doc += " (" + range.text() + ")";
    require_in_range_.push_back([name, field, range] {
      MESH_REQUIRE(range.contains(*field),
                   name << " = " << to_text(*field) << " must be " << range.text());
    });
  }

  void bind(RunConfig& c);

  po::options_description options_;
  std::vector<Key> keys_;
  std::deque<std::string> unsigned_text_;  ///< deque: the options hold pointers
  std::vector<std::function<void()>> read_unsigned_;
  std::vector<std::function<void()>> require_in_range_;  ///< one per float key

 public:
  std::string data_parallel_text = "auto";
};

void DeckSchema::bind(RunConfig& c) {
  auto& r = c.run;
  key("run.name", &r.name, "string", "run name (run folder under output_dir)");
  key("run.device", &r.device, "string", "cpu | cuda");
  key("run.seed", &r.seed, "uint", "seed of initialisation, dropout and data order");
  key("run.output_dir", &r.output_dir, "string", "folder for run logs and metrics");
  key("run.exit_duration_mins", &r.exit_duration_mins, "float",
      "save a checkpoint and exit after this many minutes of training (0 = no limit)",
      kNonNegative);
  key("run.gemm_autotune", &r.gemm_autotune, "bool",
      "cuda: time cuBLASLt's first 8 algorithms per GEMM problem, keep the fastest "
      "(not bitwise reproducible across runs)");

  auto& m = c.model;
  key("model.arch", &m.arch, "string",
      "model family, the defaults of the architecture keys: gpt (GPT-2) | llama (RMSNorm, rope, "
      "swiglu, no biases, untied head) | gpt_bigcode (num_query_groups = 1) | gpt_neox (rope "
      "on 25 %, parallel_residual, gelu, untied head) | bloom (alibi, embedding_norm) | bert "
      "(bidirectional encoder with a padding mask, MLM + binary heads, gelu, "
      "num_token_types = 2) | t5 (encoder-decoder: RMSNorm without bias, eps 1e-6, relative "
      "position buckets, unscaled scores, padding masks, relu, no biases, tied head); a key set "
      "in a deck or --set wins");
  key("model.num_layers", &m.num_layers, "int", "transformer layers");
  key("model.hidden_size", &m.hidden_size, "int", "hidden size h");
  key("model.num_attention_heads", &m.num_attention_heads, "int", "attention heads");
  key("model.ffn_hidden_size", &m.ffn_hidden_size, "int", "MLP inner size (0 = 4h)");
  key("model.seq_length", &m.seq_length, "int", "sequence length s");
  key("model.max_position_embeddings", &m.max_position_embeddings, "int",
      "learned positions (0 = seq_length)");
  key("model.vocab_size", &m.vocab_size, "int", "vocabulary (0 = tokenizer's)");
  key("model.make_vocab_size_divisible_by", &m.make_vocab_size_divisible_by, "int",
      "pad the vocabulary to a multiple of this x tensor_parallel");
  key("model.hidden_dropout", &m.hidden_dropout, "float", "dropout after attention/MLP",
      kProbability);
  key("model.attention_dropout", &m.attention_dropout, "float", "dropout on attention probs",
      kProbability);
  key("model.attention_backend", &m.attention_backend, "string",
      "auto | fused | unfused attention core (auto = fused where supported)");
  key("model.layernorm_epsilon", &m.layernorm_epsilon, "float", "layernorm epsilon", kPositive);
  key("model.init_method_std", &m.init_method_std, "float", "stddev of weight init", kPositive);
  const auto unbuilt = [](const std::string& values) {
    return "; " + values + " not yet built: rejected at model construction";
  };
  key("model.normalization", &m.normalization, "string",
      "LayerNorm | RMSNorm");
  key("model.norm_placement", &m.norm_placement, "string",
      "pre (norm before each branch, a final norm) | post (norm after each residual add, no "
      "final norm: Google BERT, transformers' BertForPreTraining)");
  key("model.position_embedding_type", &m.position_embedding_type, "string",
      "learned_absolute | rope | alibi | relative (T5) | none");
  key("model.num_query_groups", &m.num_query_groups, "int",
      "key/value heads (grouped-query attention), 0 = num_attention_heads");
  key("model.kv_channels", &m.kv_channels, "int",
      "head dim, 0 = hidden_size / num_attention_heads");
  key("model.rotary_percent", &m.rotary_percent, "float", "share of the head dim rotated by rope",
      FloatRange{0, 1, true, false});
  key("model.rotary_base", &m.rotary_base, "float", "rope's base period", kPositive);
  key("model.rotary_interleaved", &m.rotary_interleaved, "bool",
      "rope rotates interleaved pairs rather than halves");
  key("model.activation", &m.activation, "string",
      "MLP activation: gelu (erf) | gelu_tanh (GPT-2's) | relu | swiglu | geglu | geglu_tanh");
  key("model.add_bias_linear", &m.add_bias_linear, "bool",
      "biases on the linear layers");
  key("model.untie_embeddings_and_output_weights", &m.untie_embeddings_and_output_weights,
      "bool", "LM head with its own weights (output_layer.weight) instead of the word table");
  key("model.parallel_residual", &m.parallel_residual, "bool",
      "attention and MLP on their own norms of the same input, one residual add "
      "(GPT-NeoX's use_parallel_residual)");
  key("model.embedding_norm", &m.embedding_norm, "bool",
      "the block's norm right after the word embedding (BLOOM)");
  key("model.num_token_types", &m.num_token_types, "int",
      "token-type (segment) embeddings; arch = bert only");
  key("model.decoder_num_layers", &m.decoder_num_layers, "int",
      "arch = t5: decoder layers (0 = num_layers, which counts the encoder's)");
  key("model.decoder_seq_length", &m.decoder_seq_length, "int",
      "arch = t5: decoder length (seq_length is the encoder's); arch = t5 needs it");
  key("model.relative_attention_num_buckets", &m.relative_attention_num_buckets, "int",
      "position_embedding_type = relative: T5's relative-position buckets");
  key("model.relative_attention_max_distance", &m.relative_attention_max_distance, "int",
      "position_embedding_type = relative: distance from which all positions share a bucket");

  auto& p = c.parallel;
  key("parallel.tensor_parallel", &p.tensor_parallel, "int", "tensor-parallel degree tp");
  key("parallel.pipeline_parallel", &p.pipeline_parallel, "int", "pipeline stages pp");
  options_.add_options()("parallel.data_parallel",
                         po::value<std::string>(&data_parallel_text)->default_value("auto"),
                         "data-parallel degree dp, or auto = world / (tp * pp)");
  keys_.push_back({"parallel.data_parallel", "int", "auto",
                   "data-parallel degree dp (auto = world / (tp * pp))",
                   [&p] { return std::to_string(p.data_parallel); }});
  key("parallel.sequence_parallel", &p.sequence_parallel, "bool",
      "shard norms/dropout over the sequence on the tp group (needs tp > 1)");
  key("parallel.sequence_parallel_keep_gathered", &p.sequence_parallel_keep_gathered, "bool",
      "keep the gathered input of qkv/fc1 for the backward (2 fewer all-gathers per layer)");
  key("parallel.split_row_parallel_backward", &p.split_row_parallel_backward, "bool",
      "row-parallel backward GEMMs by token blocks, overlapping the dy all-gather (SP; default on)");
  key("parallel.split_column_parallel_forward", &p.split_column_parallel_forward, "bool",
      "column-parallel forward GEMMs on own rows while the input all-gather runs (SP)");
  key("parallel.tp_copy_engine", &p.tp_copy_engine, "bool",
      "tp all-gathers / reduce-scatters / all-reduces on the copy engines (CUDA IPC), not NCCL (GPU)");
  key("parallel.tp_copy_engine_min_bytes", &p.tp_copy_engine_min_bytes, "int",
      "tp_copy_engine: smallest all-reduce (bytes) on the copy engines; smaller ones on NCCL");
  key("parallel.tp_interleave", &p.tp_interleave, "bool",
      "micro-batches in interleaved pairs: one's tp collectives overlap the other's compute");
  key("parallel.tp_interleave_streams", &p.tp_interleave_streams, "int",
      "tp_interleave: 1 side stream for both micro-batches' collectives, or 2 (one each)");
  key("parallel.schedule", &p.schedule, "string", "gpipe | 1f1b | interleaved");
  key("parallel.virtual_stages", &p.virtual_stages, "int",
      "model chunks per pipeline rank (interleaved)");
  key("parallel.pipeline_split_rank", &p.pipeline_split_rank, "int",
      "model.arch = t5: the first decoder stage; stages before it hold the encoder "
      "(Megatron's --pipeline-model-parallel-split-rank; 0 = half the stages)");
  key("parallel.distributed_optimizer", &p.distributed_optimizer, "bool",
      "shard fp32 master weights and Adam states over dp (ZeRO-1)");
  key("parallel.overlap_grad_reduce", &p.overlap_grad_reduce, "bool",
      "reduce-scatter gradient buckets during the last backward (distributed optimizer)");
  key("parallel.overlap_param_gather", &p.overlap_param_gather, "bool",
      "all-gather updated parameter buckets during the next forward (distributed optimizer)");
  key("parallel.grad_bucket_size", &p.grad_bucket_size, "int",
      "elements per bucket (overlap_grad_reduce, overlap_param_gather)");
  key("parallel.collective_timeout_s", &p.collective_timeout_s, "float",
      "abort with a report naming the group and the ranks not arrived when a rank waits "
      "longer than this in one collective or transfer (0 = off)",
      kNonNegative);
  key("parallel.debug_skip_collective", &p.debug_skip_collective, "string",
      "test aid: RANK:STEP[:GROUP] makes that world rank never arrive at its first "
      "collective (on GROUP) of step STEP (needs collective_timeout_s > 0)");
  key("parallel.pipeline_layers", &p.pipeline_layers, "string",
      "layers per pipeline stage, e.g. 5,7 (empty = uniform split; balanced = the last "
      "stage's LM head counted, e.g. 19,17 for GPT-2 774M on 2 stages; with virtual "
      "stages, per model chunk)");

  auto& t = c.training;
  key("training.micro_batch_size", &t.micro_batch_size, "int", "samples per micro-batch");
  key("training.global_batch_size", &t.global_batch_size, "int",
      "samples per step over all dp ranks (0 = micro x dp)");
  key("training.train_iters", &t.train_iters, "int", "optimizer steps");
  key("training.precision", &t.precision, "string", "fp32 | bf16 | fp16");
  key("training.logits_dtype", &t.logits_dtype, "string",
      "fp32 | compute (the LM head's logits in the operands' dtype, as Megatron-LM)");
  key("training.bias_in_weight_gemm", &t.bias_in_weight_gemm, "string",
      "auto | true | false: qkv's and fc's biases in their GEMMs through a ones column after "
      "the layernorm output (no bias epilogue, no bias-gradient kernel); auto = on with "
      "run.device = cuda");
  key("training.attention_masks_ahead", &t.attention_masks_ahead, "bool",
      "cuda: draw the first micro-batch's attention-dropout masks under the previous update");
  key("training.attention_dropout_rng", &t.attention_dropout_rng, "string",
      "meshtron | cudnn (attention dropout drawn inside cuDNN's fused attention: faster, "
      "other bits, not decomposition-invariant)");
  key("training.fused_attention_kernels", &t.fused_attention_kernels, "string",
      "cuda: auto | own (auto = cuDNN's fused attention where it plans the shape, else "
      "meshtron's flash kernels; own = meshtron's always)");
  key("training.clip_grad", &t.clip_grad, "float", "clip global grad norm (0 = off)",
      kNonNegative);
  key("training.recompute", &t.recompute, "string", "none | selective | full");
  key("training.recompute_num_layers", &t.recompute_num_layers, "int",
      "layers recomputed with full (0 = all)");
  key("training.check_for_nan", &t.check_for_nan, "bool", "skip steps with NaN/Inf");
  key("training.cuda_graphs", &t.cuda_graphs, "bool",
      "cuda: replay each micro-batch's forward + backward from one CUDA graph "
      "(pp = 1, tp on NCCL, no overlapped dp communication)");
  key("training.max_nan_skips", &t.max_nan_skips, "int", "abort after this many skips");
  key("training.eval_interval", &t.eval_interval, "int", "evaluate every N steps (0 = off)");
  key("training.eval_iters", &t.eval_iters, "int", "batches per evaluation");

  auto& o = c.optimizer;
  key("optimizer.type", &o.type, "string", "adamw");
  key("optimizer.lr", &o.lr, "float", "peak learning rate", kNonNegative);
  key("optimizer.min_lr", &o.min_lr, "float", "learning rate at the end of decay",
      kNonNegative);
  key("optimizer.beta1", &o.beta1, "float", "Adam beta1", kProbability);
  key("optimizer.beta2", &o.beta2, "float", "Adam beta2", kProbability);
  key("optimizer.eps", &o.eps, "float", "Adam epsilon", kPositive);
  key("optimizer.weight_decay", &o.weight_decay, "float",
      "decoupled weight decay (not on biases and norms)", kNonNegative);

  auto& l = c.lr_schedule;
  key("lr_schedule.warmup_iters", &l.warmup_iters, "int", "linear warmup steps");
  key("lr_schedule.decay_style", &l.decay_style, "string", "constant | linear | cosine");
  key("lr_schedule.decay_iters", &l.decay_iters, "int",
      "step at which lr reaches min_lr (0 = train_iters)");

  auto& d = c.data;
  key("data.source", &d.source, "string", "synthetic | indexed | jsonl (fine-tuning rows)");
  key("data.path", &d.path, "string",
      "indexed dataset prefix (without .bin/.idx); jsonl: the training rows");
  key("data.valid_path", &d.valid_path, "string", "jsonl: the validation rows (\"\" = none)");
  key("data.split", &d.split, "string", "train,valid,test weights by documents");
  key("data.tokenizer", &d.tokenizer, "string",
      "gpt2 | hf | sentencepiece | bert_wordpiece_lowercase | bert_wordpiece_cased");
  key("data.vocab_file", &d.vocab_file, "string",
      "encoder.json / vocab.json (gpt2), vocab.txt (bert_wordpiece_*)");
  key("data.merge_file", &d.merge_file, "string", "vocab.bpe / merges.txt");
  key("data.tokenizer_file", &d.tokenizer_file, "string", "Hugging Face tokenizer.json (hf)");
  key("data.tokenizer_model", &d.tokenizer_model, "string",
      "SentencePiece tokenizer.model (sentencepiece)");
  key("data.vocab_extra_ids", &d.vocab_extra_ids, "int",
      "arch = t5: sentinel ids <extra_id_N> (Megatron's --vocab-extra-ids): the tokenizer's own "
      "pieces, else appended after its vocabulary (<extra_id_0> the last id)");

  auto& k = c.checkpoint;
  key("checkpoint.save_dir", &k.save_dir, "string", "folder of checkpoints");
  key("checkpoint.save_interval", &k.save_interval, "int", "save every N steps (0 = end)");
  key("checkpoint.load", &k.load, "string", "\"\" | auto (latest) | path");
  key("checkpoint.keep_last", &k.keep_last, "int", "checkpoints kept");
  key("checkpoint.finetune", &k.finetune, "bool",
      "load only the weights of checkpoint.load: fresh optimizer, iteration 0, fresh data order");
  key("checkpoint.pretrained", &k.pretrained, "string",
      "with load = auto: fine-tune from this checkpoint while save_dir has none of its own");

  auto& g = c.logging;
  key("logging.log_interval", &g.log_interval, "int", "print a step line every N steps");
  key("logging.sample_interval", &g.sample_interval, "int",
      "every N steps print samples of logging.sample_prompts: greedy continuations (GPT), "
      "decoder outputs (T5), fill-mask (BERT) (0 = off)");
  key("logging.sample_prompts", &g.sample_prompts, "string",
      "JSONL of prompts as generate.prompts (\"\" = built-in: the EOD token, T5's </s>, "
      "three BERT sentences with a [MASK])");
  key("logging.sample_tokens", &g.sample_tokens, "int", "tokens generated per sample");
  key("logging.metrics_file", &g.metrics_file, "string", "JSON lines in the run folder");
  key("logging.progress", &g.progress, "string", "progress bar: auto | on | off");
  key("logging.peak_tflops", &g.peak_tflops, "float",
      "peak TFLOP/s per rank for MFU (0 = 989 on cuda, 0.08 on cpu)", kNonNegative);
  key("logging.profile", &g.profile, "bool",
      "trace the GPU kernels (CUPTI) of steps [profile_step_start, profile_step_end)");
  key("logging.profile_step_start", &g.profile_step_start, "int", "first traced step");
  key("logging.profile_step_end", &g.profile_step_end, "int", "step after the last traced one");

  auto& e = c.evaluate;
  key("evaluate.split", &e.split, "string",
      "meshtron evaluate: valid | test | all documents of data.path (split by data.split)");
  key("evaluate.output", &e.output, "string", "JSON file of the evaluation result (\"\" = none)");
  key("evaluate.inputs", &e.inputs, "string",
      "JSONL rows scored instead of a split: {\"ids\": [...]} (2 to seq_length + 1 ids); "
      "model.arch = bert: {\"input_ids\", \"token_type_ids\", \"attention_mask\", "
      "\"labels\", \"next_sentence_label\"} as transformers takes them");
  key("evaluate.micro_batch_size", &e.micro_batch_size, "int",
      "samples per micro-batch of meshtron evaluate (0 = training.micro_batch_size; the test "
      "split after training uses training's)");
  key("evaluate.global_batch_size", &e.global_batch_size, "int",
      "samples per batch of meshtron evaluate over all dp ranks (0 = as many micro-batches "
      "per dp rank as a training step; the test split after training uses training's)");

  auto& n = c.generate;
  key("generate.prompts", &n.prompts, "string",
      "meshtron generate: JSONL of prompts, {\"text\": ...} or {\"ids\": [...]} a line");
  key("generate.output", &n.output, "string",
      "JSONL of the generations (\"\" = printed by rank 0)");
  key("generate.max_new_tokens", &n.max_new_tokens, "int", "tokens generated per prompt at most");
  key("generate.decoding", &n.decoding, "string", "greedy | sample | beam");
  key("generate.temperature", &n.temperature, "float", "sample: logits divided by it", kPositive);
  key("generate.top_k", &n.top_k, "int", "sample: keep the k likeliest tokens (0 = all); BERT fill-mask: tokens per [MASK] "
      "(0 = 5)");
  key("generate.top_p", &n.top_p, "float",
      "sample: keep the likeliest tokens while the mass above them is < top_p (1 = all)",
      FloatRange{0, 1, true, false});
  key("generate.num_beams", &n.num_beams, "int", "beam: beams per prompt");
  key("generate.length_penalty", &n.length_penalty, "float",
      "beam: a hypothesis scores sum log p / length^length_penalty", kFinite);
  key("generate.early_stopping", &n.early_stopping, "bool",
      "beam: stop a prompt once num_beams hypotheses are done");
  key("generate.stop_ids", &n.stop_ids, "string",
      "comma-separated ids that end a sequence (eod = the tokenizer's; \"\" = none)");
  key("generate.stop", &n.stop, "string",
      "JSON array of strings that end a sequence once its text holds one");
  key("generate.seed", &n.seed, "uint", "sample: seed of the draws (keyed by prompt and position)");
  key("generate.logprobs", &n.logprobs, "bool", "per-token log-probabilities in the output");
  key("generate.batch_size", &n.batch_size, "int", "prompts decoded together on each dp rank");
  key("generate.micro_batches", &n.micro_batches, "string",
      "auto | N: parts of a batch in flight at once over the pipeline stages (auto = "
      "min(pp, prompts); 1 = the stages one after another; beam search: 1)");

  auto& v = c.serve;
  key("serve.host", &v.host, "string",
      "meshtron serve: address rank 0 listens on (0.0.0.0 = every interface)");
  key("serve.port", &v.port, "int", "TCP port in [0, 65535] (0 = a free one, printed)");
  key("serve.max_n", &v.max_n, "int", "completions per prompt a request may ask for (n)");
  key("serve.max_prompts", &v.max_prompts, "int", "prompts one request may hold");
}

/// One deck: where it comes from (messages) and its text.
struct Deck {
  std::string origin, text;
};

/// A deck file's text; a path that is missing or not a regular file (a
/// directory), and a file of only blanks, are user errors.
std::string read_deck_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  MESH_REQUIRE(fs::exists(status), "cannot open input deck '" << path << "': no such file");
  MESH_REQUIRE(fs::is_regular_file(status),
               "cannot open input deck '" << path << "': not a regular file"
                                          << (fs::is_directory(status) ? " (a directory)" : ""));
  std::ifstream in(path);
  MESH_REQUIRE(in.good(), "cannot open input deck '" << path << "'");
  std::ostringstream os;
  os << in.rdbuf();
  MESH_REQUIRE(os.str().find_first_not_of(" \t\r\n") != std::string::npos,
               "input deck '" << path << "' is empty");
  return os.str();
}

/// `text` cut at its RunConfig::kDeckHeader lines into the decks it holds,
/// in order; text before the first header is a deck named `origin`.
std::vector<Deck> split_decks(const std::string& text, const std::string& origin) {
  const std::string header = RunConfig::kDeckHeader;
  const std::string trailer = " ---";
  std::vector<Deck> decks{{origin, ""}};
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(header, 0) != 0) {
      decks.back().text += line + "\n";
      continue;
    }
    std::string name = line.substr(header.size());
    if (name.size() >= trailer.size() &&
        name.compare(name.size() - trailer.size(), trailer.size(), trailer) == 0)
      name.resize(name.size() - trailer.size());
    decks.push_back({name, ""});
  }
  return decks;
}

/// The decks as one text that split_decks cuts back into them.
std::string joined_deck_text(const std::vector<Deck>& decks) {
  std::string out;
  for (const auto& d : decks) {
    out += RunConfig::kDeckHeader + d.origin + " ---\n" + d.text;
    if (!d.text.empty() && d.text.back() != '\n') out += "\n";
  }
  return out;
}

/// "section.key=value" -> a config-file line; rejects malformed overrides.
std::string override_line(const std::string& o) {
  const auto eq = o.find('=');
  MESH_REQUIRE(eq != std::string::npos && o.find('.') < eq,
               "--set expects section.key=value, got '" << o << "'");
  return o + "\n";
}


/// model.arch: each family's architecture keys, applied as defaults after the
/// decks and --set are read, so a key given anywhere wins over its family's
/// value (`model.arch = llama` with `model.add_bias_linear = true` is Llama
/// with biases). "gpt" keeps every key's own default: GPT-2.
struct ArchPreset {
  const char* arch;
  const char* model_keys;  ///< "key = value" lines of [model]
};
constexpr ArchPreset kArchPresets[] = {
    {"gpt", ""},
    // Llama 2/3, Mistral: the kv groups stay num_attention_heads unless set.
    {"llama",
     "normalization = RMSNorm\nposition_embedding_type = rope\nactivation = swiglu\n"
     "add_bias_linear = false\nuntie_embeddings_and_output_weights = true\n"},
    // StarCoder / SantaCoder: GPT-2 with one key/value head.
    {"gpt_bigcode", "num_query_groups = 1\n"},
    // GPT-NeoX / Pythia: rope on a quarter of each head, the attention and
    // the MLP side by side on their own norms, the exact GeLU, untied head.
    {"gpt_neox",
     "position_embedding_type = rope\nrotary_percent = 0.25\nparallel_residual = true\n"
     "activation = gelu\nuntie_embeddings_and_output_weights = true\n"},
    // BLOOM: ALiBi instead of positions, a LayerNorm after the embedding.
    {"bloom", "position_embedding_type = alibi\nembedding_norm = true\n"},
    // Megatron-LM's BertModel (transformers' MegatronBertForPreTraining):
    // learned positions, two segments, the exact GeLU, its LayerNorm
    // epsilon; the padding mask and the MLM + binary heads come with the
    // arch itself (model_spec_from_deck).
    {"bert", "activation = gelu\nnum_token_types = 2\nlayernorm_epsilon = 1e-12\n"},
    // transformers' T5ForConditionalGeneration (T5 v1.0): T5's RMS norm,
    // relative position buckets, ReLU, no biases, tied head; the norms
    // without bias, the unscaled scores, the padding masks and the decoder
    // come with the arch itself (model_spec_from_deck).
    {"t5",
     "normalization = RMSNorm\nlayernorm_epsilon = 1e-6\nposition_embedding_type = relative\n"
     "activation = relu\nadd_bias_linear = false\n"},
};

std::vector<std::string> arch_names() {
  std::vector<std::string> names;
  for (const ArchPreset& p : kArchPresets) names.push_back(p.arch);
  return names;
}

/// Store model.arch's family keys where no deck or override gave one (an
/// unknown arch is left for validate() to name).
void store_arch_preset(po::variables_map& vm, const po::options_description& options) {
  const std::string arch = vm.count("model.arch") ? vm["model.arch"].as<std::string>() : "gpt";
  for (const ArchPreset& p : kArchPresets) {
    if (arch != p.arch) continue;
    std::istringstream keys(std::string("[model]\n") + p.model_keys);
    po::store(po::parse_config_file(keys, options, false), vm);  // replaces defaulted values only
  }
}

/// The values of `decks` (a key's last value wins; each deck is parsed on
/// its own, so a key repeated within one deck stays an error) under
/// `overrides`.
RunConfig parse_decks(const std::vector<Deck>& decks, const std::vector<std::string>& overrides) {
  RunConfig c;
  c.overrides = overrides;
  DeckSchema schema(c);
  po::variables_map vm;
  // store() keeps the first value it sees, so the overrides go in first,
  // then the decks from the last to the first.
  std::string override_text;
  for (const auto& o : overrides) override_text += override_line(o);
  try {
    std::istringstream over(override_text);
    po::store(po::parse_config_file(over, schema.options(), false), vm);
  } catch (const po::error& e) {
    throw UserError(MESH_MSG("--set: " << e.what()));
  }
  for (auto d = decks.rbegin(); d != decks.rend(); ++d) {
    try {
      std::istringstream deck(d->text);
      po::store(po::parse_config_file(deck, schema.options(), false), vm);
    } catch (const po::error& e) {
      throw UserError(MESH_MSG(d->origin << ": " << e.what()));
    }
  }
  store_arch_preset(vm, schema.options());
  try {
    po::notify(vm);
  } catch (const po::error& e) {
    throw UserError(MESH_MSG(decks.back().origin << ": " << e.what()));
  }
  schema.read_unsigned_keys();
  c.parallel.data_parallel = positive_or_auto("parallel.data_parallel", schema.data_parallel_text);
  return c;
}

}  // namespace

int positive_or_auto(const std::string& key, const std::string& text) {
  if (text == "auto") return 0;
  try {
    std::size_t used = 0;
    const int v = std::stoi(text, &used);
    if (used == text.size() && v >= 1) return v;
  } catch (const std::exception&) {
  }
  throw UserError(MESH_MSG(key << " = '" << text << "' is neither a positive integer nor auto"));
}

RunConfig RunConfig::from_text(const std::string& text,
                               const std::vector<std::string>& overrides,
                               const std::string& origin) {
  RunConfig c = parse_decks(split_decks(text, origin), overrides);
  c.deck_path = origin;
  c.deck_text = text;
  return c;
}

std::string RunConfig::text_with_overrides() const {
  if (overrides.empty()) return deck_text;
  std::string text = deck_text;
  if (!text.empty() && text.back() != '\n') text += "\n";
  text += kDeckHeader + std::string("--set ---\n");
  for (const auto& o : overrides) text += override_line(o);
  return text;
}

RunConfig RunConfig::from_files(const std::vector<std::string>& paths,
                                const std::vector<std::string>& overrides) {
  MESH_REQUIRE(!paths.empty(), "no input deck given");
  std::vector<Deck> files, decks;
  for (const auto& path : paths) {
    files.push_back({path, read_deck_file(path)});
    for (auto& d : split_decks(files.back().text, path)) decks.push_back(std::move(d));
  }
  RunConfig c = parse_decks(decks, overrides);
  c.deck_text = files.size() == 1 ? files.front().text : joined_deck_text(files);
  for (const auto& path : paths) c.deck_path += (c.deck_path.empty() ? "" : " ") + path;
  return c;
}

RunConfig RunConfig::from_file(const std::string& path,
                               const std::vector<std::string>& overrides) {
  return from_files({path}, overrides);
}

std::string RunConfig::resolved_text() const {
  RunConfig copy = *this;  // the schema binds to fields; bind to a copy
  DeckSchema schema(copy);
  return schema.resolved_text();
}

std::string RunConfig::schema_help() {
  RunConfig c;
  return DeckSchema(c).help();
}

namespace {

void require_one_of(const std::string& key, const std::string& value,
                    const std::vector<std::string>& allowed) {
  std::string list;
  for (const std::string& a : allowed) {
    if (value == a) return;
    list += (list.empty() ? "" : " | ") + a;
  }
  throw UserError(MESH_MSG(key << " = '" << value << "' is not one of " << list));
}

void require_positive(const std::string& key, long v) {
  MESH_REQUIRE(v >= 1, key << " = " << v << " must be at least 1");
}

/// The counts that no other check bounds below: 0 means "off" or "the
/// default" for most of them, a negative value nothing.
void require_counts_non_negative(const RunConfig& c) {
  const std::pair<const char*, long> counts[] = {
      {"model.ffn_hidden_size", c.model.ffn_hidden_size},
      {"model.max_position_embeddings", c.model.max_position_embeddings},
      {"training.global_batch_size", c.training.global_batch_size},
      {"training.max_nan_skips", c.training.max_nan_skips},
      {"training.eval_interval", c.training.eval_interval},
      {"training.eval_iters", c.training.eval_iters},
      {"lr_schedule.decay_iters", c.lr_schedule.decay_iters},
      {"checkpoint.save_interval", c.checkpoint.save_interval},
      {"logging.sample_interval", c.logging.sample_interval},
      {"logging.profile_step_start", c.logging.profile_step_start},
      {"logging.profile_step_end", c.logging.profile_step_end},
  };
  for (const auto& [key, v] : counts)
    MESH_REQUIRE(v >= 0, key << " = " << v << " is negative");
}

/// The architecture keys: names the spec knows, head counts that divide.
void require_architecture(const ModelSection& m) {
  parse_norm_kind(m.normalization, "model.normalization");
  parse_norm_placement(m.norm_placement, "model.norm_placement");
  parse_position_embedding(m.position_embedding_type, "model.position_embedding_type");
  parse_activation(m.activation, "model.activation");
  MESH_REQUIRE(m.num_query_groups >= 0,
               "model.num_query_groups = " << m.num_query_groups << " is negative");
  MESH_REQUIRE(m.kv_channels >= 0, "model.kv_channels = " << m.kv_channels << " is negative");
  MESH_REQUIRE(m.num_attention_heads % m.query_groups() == 0,
               "model.num_query_groups (" << m.query_groups()
                   << ") does not divide model.num_attention_heads (" << m.num_attention_heads
                   << ")");
}

/// training.cuda_graphs: what a replayed forward + backward cannot do
/// (train/cuda_graph.hpp): the pipeline's host-side message logic, the copy
/// engines' host-side sequence numbers (baked into a graph), hooks into the
/// dp overlap. NCCL's tp collectives are captured like kernels.
void require_capturable(const RunConfig& c) {
  if (!c.training.cuda_graphs) return;
  const std::string needs = "training.cuda_graphs = true needs ";
  MESH_REQUIRE(c.run.device == "cuda", needs << "run.device = cuda");
  MESH_REQUIRE(c.parallel.pipeline_parallel == 1,
               needs << "parallel.pipeline_parallel = 1 (got " << c.parallel.pipeline_parallel
                     << ")");
  MESH_REQUIRE(!c.parallel.tp_copy_engine, needs << "parallel.tp_copy_engine = false");
  MESH_REQUIRE(!c.parallel.tp_interleave, needs << "parallel.tp_interleave = false");
  MESH_REQUIRE(!c.parallel.overlap_grad_reduce && !c.parallel.overlap_param_gather,
               needs << "parallel.overlap_grad_reduce = overlap_param_gather = false");
}

/// data.source = jsonl (train/sft_data.hpp): its files, and what its
/// batches cannot go through.
void require_jsonl_usable(const RunConfig& c) {
  if (c.data.source != "jsonl") return;
  MESH_REQUIRE(!c.data.path.empty(), "data.source = jsonl needs data.path (a JSONL file of rows)");
  MESH_REQUIRE(c.model.arch != "bert",
               "data.source = jsonl: fine-tuning rows are for decoder models and T5, not BERT");
  MESH_REQUIRE(c.training.eval_interval == 0 || !c.data.valid_path.empty(),
               "data.source = jsonl: training.eval_interval = " << c.training.eval_interval
                   << " needs data.valid_path (a JSONL file of validation rows)");
  MESH_REQUIRE(!c.training.cuda_graphs,
               "data.source = jsonl: training.cuda_graphs needs a loss without host reads");
}

/// model.arch = bert: what BertModel does not build yet (docs/bert.md).
void require_bert_buildable(const RunConfig& c) {
  const bool bert = c.model.arch == "bert";
  MESH_REQUIRE(bert || c.model.num_token_types == 0,
               "model.num_token_types = " << c.model.num_token_types << " needs model.arch = bert");
  if (!bert) return;
  MESH_REQUIRE(c.model.num_token_types > 0, "model.arch = bert needs model.num_token_types > 0");
  MESH_REQUIRE(!c.training.cuda_graphs,
               "model.arch = bert: training.cuda_graphs needs a model without host reads");
  MESH_REQUIRE(c.logging.sample_interval == 0 || data::is_bert_wordpiece(c.data.tokenizer),
               "model.arch = bert: logging.sample_interval (fill-mask) needs data.tokenizer = "
               "bert_wordpiece_lowercase or bert_wordpiece_cased ([MASK], [CLS] and [SEP]), got "
                   << c.data.tokenizer);
}

/// model.arch = t5 over pipeline stages: Megatron's split (the encoder's
/// layers evenly over the stages before the split rank, the decoder's over
/// the rest), one model chunk per stage.
void require_t5_pipeline_split(const RunConfig& c) {
  const auto& p = c.parallel;
  const int pp = p.pipeline_parallel, split = c.degrees().pipeline_split_rank;
  if (pp == 1) {
    MESH_REQUIRE(p.pipeline_split_rank == 0, "parallel.pipeline_split_rank = "
                                                 << p.pipeline_split_rank
                                                 << " needs parallel.pipeline_parallel > 1");
    return;
  }
  MESH_REQUIRE(p.pipeline_split_rank >= 0 && split >= 1 && split < pp,
               "parallel.pipeline_split_rank = " << p.pipeline_split_rank
                   << " must be in [1, parallel.pipeline_parallel = " << pp
                   << ") (encoder stages first, then decoder stages; 0 = half)");
  MESH_REQUIRE(p.schedule != "interleaved",
               "model.arch = t5: the interleaved schedule is not built for the encoder-decoder "
               "pipeline split (parallel.schedule = gpipe or 1f1b)");
  MESH_REQUIRE(p.pipeline_layers.empty(),
               "model.arch = t5: parallel.pipeline_layers = "
                   << p.pipeline_layers
                   << " is not read; the split is parallel.pipeline_split_rank");
  const int encoder = c.model.num_layers, decoder = c.model.decoder_num_layers > 0
                                                        ? c.model.decoder_num_layers
                                                        : c.model.num_layers;
  MESH_REQUIRE(encoder % split == 0 && decoder % (pp - split) == 0,
               "model.arch = t5: the encoder's " << encoder << " layers over " << split
                   << " stages and the decoder's " << decoder << " over " << pp - split
                   << " (parallel.pipeline_split_rank = " << split
                   << ") must both divide evenly");
}

/// model.arch = t5: its decoder and relative-position keys, and what
/// T5Model does not build yet (docs/t5.md).
void require_t5_buildable(const RunConfig& c) {
  const auto& m = c.model;
  const bool t5 = m.arch == "t5";
  MESH_REQUIRE(t5 || (m.decoder_num_layers == 0 && m.decoder_seq_length == 0),
               "model.decoder_num_layers = " << m.decoder_num_layers
                   << " and model.decoder_seq_length = " << m.decoder_seq_length
                   << " need model.arch = t5 (0 otherwise)");
  MESH_REQUIRE(m.relative_attention_num_buckets >= 4,
               "model.relative_attention_num_buckets = " << m.relative_attention_num_buckets
                   << " must be at least 4 (T5 halves them by direction, then into exact and "
                      "logarithmic buckets)");
  MESH_REQUIRE(m.relative_attention_max_distance > m.relative_attention_num_buckets / 2,
               "model.relative_attention_max_distance = " << m.relative_attention_max_distance
                   << " must exceed half of model.relative_attention_num_buckets ("
                   << m.relative_attention_num_buckets / 2 << "), where the logarithmic buckets start");
  MESH_REQUIRE(c.data.vocab_extra_ids >= 0,
               "data.vocab_extra_ids = " << c.data.vocab_extra_ids << " is negative");
  MESH_REQUIRE(t5 || c.parallel.pipeline_split_rank == 0,
               "parallel.pipeline_split_rank = " << c.parallel.pipeline_split_rank
                   << " needs model.arch = t5 (the encoder-decoder split)");
  if (!t5) return;
  MESH_REQUIRE(m.decoder_num_layers >= 0,
               "model.decoder_num_layers = " << m.decoder_num_layers << " is negative");
  MESH_REQUIRE(m.decoder_seq_length > 1,
               "model.arch = t5 needs model.decoder_seq_length > 1 (got " << m.decoder_seq_length
                   << "; model.seq_length is the encoder's)");
  MESH_REQUIRE(m.position_embedding_type == "relative",
               "model.arch = t5 needs model.position_embedding_type = relative (got "
                   << m.position_embedding_type << ")");
  MESH_REQUIRE(c.data.vocab_extra_ids > 0,
               "model.arch = t5 needs data.vocab_extra_ids > 0 (the span-corruption sentinels)");
  require_t5_pipeline_split(c);
  MESH_REQUIRE(!c.training.cuda_graphs,
               "model.arch = t5: training.cuda_graphs needs a model without host reads");
}

/// parallel.collective_timeout_s and its test hook.
void require_watchdog_settings(const RunConfig& c, int world_size) {
  const SkipHook skip = SkipHook::parse(c.parallel.debug_skip_collective);
  if (skip.rank < 0) return;
  MESH_REQUIRE(c.parallel.collective_timeout_s > 0,
               "parallel.debug_skip_collective = " << c.parallel.debug_skip_collective
                   << " needs parallel.collective_timeout_s > 0 (the job would hang)");
  MESH_REQUIRE(skip.rank < world_size, "parallel.debug_skip_collective = "
                                           << c.parallel.debug_skip_collective << ": rank "
                                           << skip.rank << " of a world of " << world_size);
}

/// parallel.tp_interleave pairs the micro-batches of a step on one stage.
void require_tp_interleave(const RunConfig& c) {
  MESH_REQUIRE(c.parallel.tp_interleave_streams == 1 || c.parallel.tp_interleave_streams == 2,
               "parallel.tp_interleave_streams = " << c.parallel.tp_interleave_streams
                                                   << " must be 1 or 2");
  MESH_REQUIRE(c.parallel.tp_interleave_streams == 1 || c.parallel.tp_interleave,
               "parallel.tp_interleave_streams = 2 needs parallel.tp_interleave = true");
  if (!c.parallel.tp_interleave) return;
  const std::string needs = "parallel.tp_interleave = true needs ";
  MESH_REQUIRE(c.parallel.pipeline_parallel == 1,
               needs << "parallel.pipeline_parallel = 1 (got " << c.parallel.pipeline_parallel
                     << ")");
  const long per_step = c.training.global_batch_size /
                        (long(c.training.micro_batch_size) * c.parallel.data_parallel);
  MESH_REQUIRE(per_step >= 2, needs << "at least 2 micro-batches per step on each dp rank (got "
                                    << per_step << ": training.global_batch_size = "
                                    << c.training.global_batch_size << ", micro_batch_size = "
                                    << c.training.micro_batch_size << ", data_parallel = "
                                    << c.parallel.data_parallel << ")");
}

/// [evaluate]: the split's name and the batch shape, defaults resolved
/// from [training] (after its global batch is).
void validate_evaluate(RunConfig& c) {
  auto& e = c.evaluate;
  require_one_of("evaluate.split", e.split, {"valid", "test", "all"});
  MESH_REQUIRE(e.micro_batch_size >= 0 && e.global_batch_size >= 0,
               "evaluate.micro_batch_size (" << e.micro_batch_size << ") and global_batch_size ("
                   << e.global_batch_size << ") must be >= 0 (0 = from [training])");
  const int dp = c.parallel.data_parallel;
  if (e.micro_batch_size == 0) e.micro_batch_size = c.training.micro_batch_size;
  if (e.global_batch_size == 0)
    e.global_batch_size = e.micro_batch_size * c.training.global_batch_size /
                          c.training.micro_batch_size;
  MESH_REQUIRE(e.global_batch_size % (e.micro_batch_size * dp) == 0,
               "evaluate.global_batch_size (" << e.global_batch_size
                   << ") is not divisible by evaluate.micro_batch_size (" << e.micro_batch_size
                   << ") x data_parallel (" << dp << ")");
}

}  // namespace

void RunConfig::validate(int world_size) {
  auto& m = model;
  auto& p = parallel;
  auto& t = training;
  DeckSchema(*this).require_floats_in_range();
  require_counts_non_negative(*this);
  require_one_of("run.device", run.device, {"cpu", "cuda"});
  MESH_REQUIRE(!run.gemm_autotune || run.device == "cuda",
               "run.gemm_autotune = true needs run.device = cuda (it tunes cuBLASLt)");
  require_one_of("model.arch", m.arch, arch_names());
  require_one_of("model.attention_backend", m.attention_backend, {"auto", "fused", "unfused"});
  require_positive("model.num_layers", m.num_layers);
  require_positive("model.hidden_size", m.hidden_size);
  require_positive("model.num_attention_heads", m.num_attention_heads);
  require_positive("model.seq_length", m.seq_length);
  require_positive("model.make_vocab_size_divisible_by", m.make_vocab_size_divisible_by);
  MESH_REQUIRE(m.vocab_size >= 0, "model.vocab_size = " << m.vocab_size << " is negative");
  MESH_REQUIRE(m.kv_channels > 0 || m.hidden_size % m.num_attention_heads == 0,
               "model.hidden_size (" << m.hidden_size
                                     << ") is not divisible by model.num_attention_heads ("
                                     << m.num_attention_heads << ")");
  require_architecture(m);
  MESH_REQUIRE(m.seq_length <= m.max_positions(),
               "model.seq_length (" << m.seq_length << ") exceeds model.max_position_embeddings ("
                                    << m.max_positions() << ")");

  require_positive("parallel.tensor_parallel", p.tensor_parallel);
  require_positive("parallel.pipeline_parallel", p.pipeline_parallel);
  MESH_REQUIRE(m.num_attention_heads % p.tensor_parallel == 0,
               "parallel.tensor_parallel (" << p.tensor_parallel
                   << ") does not divide model.num_attention_heads ("
                   << m.num_attention_heads << ")");
  MESH_REQUIRE(m.query_groups() % p.tensor_parallel == 0,
               "parallel.tensor_parallel (" << p.tensor_parallel
                   << ") does not divide model.num_query_groups (" << m.query_groups() << ")");
  MESH_REQUIRE(m.ffn() % p.tensor_parallel == 0,
               "parallel.tensor_parallel (" << p.tensor_parallel
                   << ") does not divide the MLP size (" << m.ffn() << ")");
  MESH_REQUIRE(!p.overlap_grad_reduce || p.distributed_optimizer,
               "parallel.overlap_grad_reduce = true needs parallel.distributed_optimizer = true");
  MESH_REQUIRE(!p.overlap_param_gather || p.distributed_optimizer,
               "parallel.overlap_param_gather = true needs parallel.distributed_optimizer = true");
  MESH_REQUIRE(p.grad_bucket_size > 0,
               "parallel.grad_bucket_size must be positive (got " << p.grad_bucket_size << ")");
  MESH_REQUIRE(!p.sequence_parallel || p.tensor_parallel > 1,
               "parallel.sequence_parallel = true needs parallel.tensor_parallel > 1 (got "
                   << p.tensor_parallel << ")");
  MESH_REQUIRE(!p.sequence_parallel_keep_gathered || p.sequence_parallel,
               "parallel.sequence_parallel_keep_gathered = true needs parallel.sequence_parallel");
  MESH_REQUIRE(p.tp_copy_engine_min_bytes >= 0,
               "parallel.tp_copy_engine_min_bytes must be >= 0, got " << p.tp_copy_engine_min_bytes);
  MESH_REQUIRE(!p.tp_copy_engine || run.device == "cuda",
               "parallel.tp_copy_engine = true needs run.device = cuda (CUDA IPC between GPUs)");
  MESH_REQUIRE(!p.sequence_parallel || m.seq_length % p.tensor_parallel == 0,
               "parallel.sequence_parallel: model.seq_length (" << m.seq_length
                   << ") is not divisible by parallel.tensor_parallel ("
                   << p.tensor_parallel << ")");
  // World-size arithmetic last, so a tp that cannot split the heads is
  // reported as such rather than as a world-size mismatch.
  const ParallelDegrees d = Topology::resolve(p.degrees(), world_size);
  p.data_parallel = d.data_parallel;
  require_one_of("parallel.schedule", p.schedule, {"gpipe", "1f1b", "interleaved"});
  require_positive("parallel.virtual_stages", p.virtual_stages);
  MESH_REQUIRE(p.schedule == "interleaved" || p.virtual_stages == 1,
               "parallel.virtual_stages = " << p.virtual_stages
                   << " needs parallel.schedule = interleaved (got " << p.schedule << ")");
  const int chunks = p.model_chunks();
  if (m.arch == "t5") {
    // The split of each stack: require_t5_buildable.
  } else if (p.pipeline_layers == "balanced") {
    MESH_REQUIRE(m.num_layers >= chunks,
                 "parallel.pipeline_layers = balanced: model.num_layers ("
                     << m.num_layers << ") is fewer than the " << chunks
                     << " model chunks (parallel.pipeline_parallel x virtual_stages)");
  } else if (p.pipeline_layers.empty()) {
    MESH_REQUIRE(m.num_layers % chunks == 0,
                 "model.num_layers (" << m.num_layers << ") is not divisible by "
                     << "parallel.pipeline_parallel (" << p.pipeline_parallel
                     << ") x parallel.virtual_stages (" << p.virtual_stages << ") = " << chunks
                     << "; name an uneven split with parallel.pipeline_layers");
  } else {
    MESH_REQUIRE(p.virtual_stages == 1, "parallel.pipeline_layers = " << p.pipeline_layers
                                            << " cannot be combined with virtual stages");
    const std::vector<int> split = p.chunk_layers(m.num_layers);
    int sum = 0;
    for (int n : split) sum += n;
    MESH_REQUIRE(int(split.size()) == p.pipeline_parallel && sum == m.num_layers,
                 "parallel.pipeline_layers = " << p.pipeline_layers << " names "
                     << split.size() << " stages with " << sum
                     << " layers; need parallel.pipeline_parallel (" << p.pipeline_parallel
                     << ") stages with model.num_layers (" << m.num_layers << ") layers");
  }

  require_positive("training.micro_batch_size", t.micro_batch_size);
  require_positive("training.train_iters", t.train_iters);
  if (t.global_batch_size == 0) t.global_batch_size = t.micro_batch_size * p.data_parallel;
  MESH_REQUIRE(t.global_batch_size % (t.micro_batch_size * p.data_parallel) == 0,
               "training.global_batch_size (" << t.global_batch_size
                   << ") is not divisible by training.micro_batch_size ("
                   << t.micro_batch_size << ") x data_parallel (" << p.data_parallel << ")");
  require_tp_interleave(*this);
  require_watchdog_settings(*this, world_size);
  require_one_of("training.precision", t.precision, {"fp32", "bf16", "fp16"});
  require_one_of("training.logits_dtype", t.logits_dtype, {"fp32", "compute"});
  require_one_of("training.attention_dropout_rng", t.attention_dropout_rng,
                 {"meshtron", "cudnn"});
  require_one_of("training.bias_in_weight_gemm", t.bias_in_weight_gemm, {"auto", "true", "false"});
  require_one_of("training.fused_attention_kernels", t.fused_attention_kernels, {"auto", "own"});
  MESH_REQUIRE(t.fused_attention_kernels == "auto" || run.device == "cuda",
               "training.fused_attention_kernels = " << t.fused_attention_kernels
                   << " needs run.device = cuda (it picks the GPU's fused attention)");
  if (t.attention_dropout_rng == "cudnn") {  // cuDNN's fused attention draws the mask
    const char* needs = "training.attention_dropout_rng = cudnn needs ";
    MESH_REQUIRE(run.device == "cuda",
                 needs << "run.device = cuda (cuDNN draws the mask inside its fused attention)");
    MESH_REQUIRE(t.precision != "fp32",
                 needs << "training.precision = bf16 or fp16 (the fused attention's dtypes)");
    MESH_REQUIRE(model.attention_backend != "unfused",
                 needs << "the fused attention, not model.attention_backend = unfused");
  }
  require_one_of("training.recompute", t.recompute, {"none", "selective", "full"});
  require_capturable(*this);
  require_bert_buildable(*this);
  require_t5_buildable(*this);
  MESH_REQUIRE(t.recompute_num_layers >= 0,
               "training.recompute_num_layers = " << t.recompute_num_layers
                   << " is negative (0 recomputes every layer)");
  MESH_REQUIRE(run.device == "cuda" || t.precision == "fp32",
               "training.precision = " << t.precision
                   << " needs run.device = cuda (the host path computes in fp32)");

  auto& o = optimizer;
  require_one_of("optimizer.type", o.type, {"adamw"});
  MESH_REQUIRE(o.min_lr <= o.lr, "optimizer.min_lr (" << o.min_lr
                                                      << ") must not exceed optimizer.lr ("
                                                      << o.lr << ")");
  require_one_of("lr_schedule.decay_style", lr_schedule.decay_style,
                 {"constant", "linear", "cosine"});
  if (lr_schedule.decay_iters == 0) lr_schedule.decay_iters = t.train_iters;
  MESH_REQUIRE(lr_schedule.warmup_iters >= 0 &&
                   lr_schedule.warmup_iters <= lr_schedule.decay_iters,
               "lr_schedule.warmup_iters (" << lr_schedule.warmup_iters
                   << ") must be in [0, decay_iters = " << lr_schedule.decay_iters << "]");

  require_one_of("data.source", data.source, {"synthetic", "indexed", "jsonl"});
  MESH_REQUIRE(data.source != "indexed" || !data.path.empty(),
               "data.source = indexed needs data.path (the .bin/.idx prefix)");
  require_jsonl_usable(*this);
  require_one_of("data.tokenizer", data.tokenizer,
                 {"gpt2", "hf", "sentencepiece", "bert_wordpiece_lowercase", "bert_wordpiece_cased"});
  MESH_REQUIRE(data.tokenizer != "hf" || !data.tokenizer_file.empty(),
               "data.tokenizer = hf needs data.tokenizer_file (a tokenizer.json)");
  MESH_REQUIRE(data.tokenizer != "sentencepiece" || !data.tokenizer_model.empty(),
               "data.tokenizer = sentencepiece needs data.tokenizer_model (a tokenizer.model)");
  MESH_REQUIRE(!data.tokenizer.starts_with("bert_wordpiece_") || !data.vocab_file.empty(),
               "data.tokenizer = " << data.tokenizer << " needs data.vocab_file (a vocab.txt)");
  MESH_REQUIRE(checkpoint.pretrained.empty() || checkpoint.load == "auto",
               "checkpoint.pretrained = " << checkpoint.pretrained
                   << " needs checkpoint.load = auto (it is the fallback of auto)");
  MESH_REQUIRE(checkpoint.keep_last >= 1,
               "checkpoint.keep_last = " << checkpoint.keep_last << " must be at least 1");
  validate_evaluate(*this);
  require_one_of("generate.decoding", generate.decoding, {"greedy", "sample", "beam"});
  require_positive("generate.max_new_tokens", generate.max_new_tokens);
  require_positive("generate.num_beams", generate.num_beams);
  require_positive("generate.batch_size", generate.batch_size);
  positive_or_auto("generate.micro_batches", generate.micro_batches);
  MESH_REQUIRE(generate.top_k >= 0, "generate.top_k = " << generate.top_k << " is negative");
  MESH_REQUIRE(!serve.host.empty(), "serve.host is empty (127.0.0.1: this host only)");
  MESH_REQUIRE(serve.port >= 0 && serve.port <= 65535,
               "serve.port = " << serve.port << " is not in [0, 65535]");
  require_positive("serve.max_n", serve.max_n);
  require_positive("serve.max_prompts", serve.max_prompts);
  require_positive("logging.log_interval", logging.log_interval);
  require_positive("logging.sample_tokens", logging.sample_tokens);
  require_one_of("logging.progress", logging.progress, {"auto", "on", "off"});
  MESH_REQUIRE(!logging.profile || run.device == "cuda",
               "logging.profile traces GPU kernels: it needs run.device = cuda");
  MESH_REQUIRE(!logging.profile || (logging.profile_step_start >= 1 &&
                                    logging.profile_step_end > logging.profile_step_start),
               "logging.profile_step_start = " << logging.profile_step_start
                   << " and profile_step_end = " << logging.profile_step_end
                   << " must satisfy 1 <= start < end");
  MESH_REQUIRE(!logging.profile || logging.profile_step_end - 1 <= training.train_iters,
               "logging.profile_step_end = " << logging.profile_step_end
                   << " traces past training.train_iters = " << training.train_iters);
}

std::vector<int> balanced_stage_layers(int num_layers, int stages, double head_layers) {
  MESH_REQUIRE(stages >= 1 && num_layers >= stages,
               "cannot split " << num_layers << " layers over " << stages << " pipeline stages");
  std::vector<int> out(std::size_t(stages), 1);
  const auto cost_with_one_more = [&](int s) {
    return out[std::size_t(s)] + 1 + (s == stages - 1 ? head_layers : 0.0);
  };
  for (int left = num_layers - stages; left > 0; --left) {
    int cheapest = 0;
    for (int s = 1; s < stages; ++s)
      if (cost_with_one_more(s) < cost_with_one_more(cheapest)) cheapest = s;
    ++out[std::size_t(cheapest)];
  }
  return out;
}

ParallelDegrees RunConfig::degrees() const {
  ParallelDegrees d = parallel.degrees();
  if (model.arch != "t5" || parallel.pipeline_parallel == 1) return d;
  d.pipeline_split_rank = parallel.pipeline_split_rank > 0 ? parallel.pipeline_split_rank
                                                           : parallel.pipeline_parallel / 2;
  d.last_stage_holds_word_table = !model.untie_embeddings_and_output_weights;
  return d;
}

std::vector<int> ParallelSection::chunk_layers(int num_layers, double head_layers) const {
  const int chunks = model_chunks();
  if (pipeline_layers.empty())
    return std::vector<int>(std::size_t(chunks), num_layers / chunks);
  if (pipeline_layers == "balanced") return balanced_stage_layers(num_layers, chunks, head_layers);
  std::vector<int> out;
  std::stringstream in(pipeline_layers);
  for (std::string item; std::getline(in, item, ',');) {
    std::size_t used = 0;
    int n = -1;
    try {
      n = std::stoi(item, &used);
    } catch (const std::exception&) {
    }
    MESH_REQUIRE(n >= 1 && used == item.size(),
                 "parallel.pipeline_layers = " << pipeline_layers << ": '" << item
                                               << "' is not a positive layer count");
    out.push_back(n);
  }
  return out;
}

}  // namespace meshtron
