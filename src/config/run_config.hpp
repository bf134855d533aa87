// RunConfig: the typed, validated contents of an input deck.
//
// A deck is an INI file whose sections mirror meshtron's modules:
//   [run] [model] [parallel] [training] [optimizer] [lr_schedule] [data]
//   [checkpoint] [logging] [evaluate]
// Every key is typed, defaulted and documented (`meshtron info --help-deck`
// prints them all, with the range of each float key); unknown keys are
// errors. Several decks may be given: they are read in order, sections merge,
// and a key's value is the one of the last deck that sets it; `--set
// section.key=value` on the command line overrides them all. Parsing and
// validation are deterministic, so every rank reaches the same verdict and
// errors are raised collectively.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/topology.hpp"
#include "parallel/watchdog.hpp"

namespace meshtron {

struct RunSection {
  std::string name = "meshtron";
  std::string device = "cpu";  ///< cpu | cuda
  std::uint64_t seed = 1234;
  std::string output_dir = "runs";
  /// Save and exit after this many minutes of training (0 = no limit), as
  /// Megatron's --exit-duration-in-mins: stops ahead of a batch walltime.
  double exit_duration_mins = 0;
  /// cuda: the first call of each GEMM problem times cuBLASLt's first eight
  /// algorithms and keeps the fastest (as PyTorch's TunableOp). Off by
  /// default: the choice depends on timings, so two runs may differ in the
  /// last bits.
  bool gemm_autotune = false;
};

struct ModelSection {
  std::string arch = "gpt";
  int num_layers = 2;
  int hidden_size = 64;
  int num_attention_heads = 4;
  int ffn_hidden_size = 0;  ///< 0 = 4 * hidden_size
  int seq_length = 64;
  int max_position_embeddings = 0;  ///< 0 = seq_length
  int vocab_size = 0;               ///< 0 = from the tokenizer (GPT-2: 50257)
  int make_vocab_size_divisible_by = 128;
  double hidden_dropout = 0.1;
  double attention_dropout = 0.1;
  /// auto | fused | unfused: the attention core as one fused kernel
  /// (ops::fused_attention_*) or as GEMMs + softmax with [s, s] tensors;
  /// auto = fused where ops::fused_attention_supported (device, bf16/fp16,
  /// head dim 64/128), else unfused.
  std::string attention_backend = "auto";
  double layernorm_epsilon = 1e-5;
  double init_method_std = 0.02;
  // The architecture, named after Megatron-LM's flags; the defaults are
  // GPT-2's. Other values pass validation and are rejected, one line, when
  // the model is built, until its layers compute them.
  std::string normalization = "LayerNorm";                ///< LayerNorm | RMSNorm
  std::string norm_placement = "pre";                     ///< pre | post
  std::string position_embedding_type = "learned_absolute";  ///< learned_absolute | rope | alibi | none
  int num_query_groups = 0;  ///< key/value heads (0 = num_attention_heads)
  int kv_channels = 0;       ///< head dim (0 = hidden_size / num_attention_heads)
  double rotary_percent = 1.0;
  double rotary_base = 10000;
  bool rotary_interleaved = false;
  std::string activation = "gelu_tanh";  ///< gelu | gelu_tanh | relu | swiglu | geglu
  bool add_bias_linear = true;
  bool untie_embeddings_and_output_weights = false;
  bool parallel_residual = false;
  bool embedding_norm = false;  ///< the block's norm after the word embedding (BLOOM)
  int num_token_types = 0;      ///< segment embeddings (arch = bert)
  // arch = t5 (Megatron-LM's names): num_layers and seq_length are the encoder's.
  int decoder_num_layers = 0;   ///< --decoder-num-layers; 0 = num_layers
  int decoder_seq_length = 0;   ///< --decoder-seq-length; arch = t5 needs it
  int relative_attention_num_buckets = 32;    ///< position_embedding_type = relative
  int relative_attention_max_distance = 128;  ///< position_embedding_type = relative

  int decoder_layers() const { return decoder_num_layers > 0 ? decoder_num_layers : num_layers; }

  int ffn() const { return ffn_hidden_size > 0 ? ffn_hidden_size : 4 * hidden_size; }
  int max_positions() const {
    return max_position_embeddings > 0 ? max_position_embeddings : seq_length;
  }
  int query_groups() const { return num_query_groups > 0 ? num_query_groups : num_attention_heads; }
  int head_dim() const { return kv_channels > 0 ? kv_channels : hidden_size / num_attention_heads; }
};

struct ParallelSection {
  int tensor_parallel = 1;
  int pipeline_parallel = 1;
  int data_parallel = 0;  ///< 0 = auto (deck value "auto")
  bool sequence_parallel = false;
  /// Under sequence parallelism, keep the all-gathered input of the
  /// column-parallel layers (qkv, fc1) from the forward for the weight
  /// gradient instead of gathering it again in the backward (Megatron
  /// gathers again): two fewer all-gathers per layer for 2 x s b h
  /// activations per layer more.
  bool sequence_parallel_keep_gathered = false;
  /// Under SP: the row-parallel layers' backward GEMMs by token blocks, the
  /// own block overlapping the dy all-gather (GPT-2 774M, tp 2 on 2x H200:
  /// 65.65 ms per step against 66.65 unsplit, perf/e2e_gpu.py).
  bool split_row_parallel_backward = true;
  /// Under SP: the column-parallel forward GEMMs (qkv, fc1) multiply this
  /// rank's own rows while the input all-gather brings the others', then
  /// the others' (with NCCL slower at 774M tp 2, perf/e2e_gpu.py: NCCL's
  /// kernels take SMs from the GEMM; meant for parallel.tp_copy_engine).
  bool split_column_parallel_forward = false;
  /// The tp group's blocking all-gathers and reduce-scatters (the forward's
  /// under SP), its all-reduces of 1 MB or more (without SP) and its
  /// overlapped all-gathers (the backward's) on the copy engines
  /// (PeerExchange: CUDA IPC, no NCCL kernels, no SMs) instead of NCCL; GPU
  /// path only.
  bool tp_copy_engine = false;
  /// tp_copy_engine: the smallest all-reduce (bytes) it takes; smaller ones
  /// (the vocab-parallel loss statistics) stay on NCCL, whose one kernel
  /// beats four copies, two flag round trips and an add there. Tests set 0
  /// to run their tiny models' sums over the copy engines.
  long tp_copy_engine_min_bytes = 1 << 20;
  /// Domino-style tp overlap: a step's micro-batches run in pairs, the two
  /// forward + backward interleaved on one thread (FiberPair): where one
  /// waits for a tp collective, the other's compute is queued, and the GPU
  /// runs it while the collective is in flight (the collectives then run on
  /// a side stream). Same results, bit for bit, as one micro-batch after the
  /// other; twice the activations alive. pp = 1, >= 2 micro-batches a step.
  bool tp_interleave = false;
  /// Side streams of the interleaved tp collectives: 1 (both jobs' in one
  /// queue), or 2 (the second job's on a communicator, stream and
  /// copy-engine arena of its own, so its collectives need not wait for
  /// the first job's). GPU path; the host's collectives block either way.
  int tp_interleave_streams = 1;
  std::string schedule = "1f1b";  ///< gpipe | 1f1b | interleaved
  int virtual_stages = 1;
  /// model.arch = t5 with pipeline_parallel > 1: the stages [0, split) hold
  /// the encoder, [split, pp) the decoder (Megatron's
  /// --pipeline-model-parallel-split-rank); 0 = half the stages.
  int pipeline_split_rank = 0;
  bool distributed_optimizer = false;
  /// Start each gradient bucket's dp reduce-scatter during the last
  /// backward (Megatron's --overlap-grad-reduce; distributed optimizer only).
  bool overlap_grad_reduce = false;
  /// Start each bucket's parameter all-gather at the end of the optimizer
  /// step and wait for it in the next forward, before the layers that use
  /// it (Megatron's --overlap-param-gather; distributed optimizer only;
  /// buckets of grad_bucket_size).
  bool overlap_param_gather = false;
  /// Elements per bucket under overlap_grad_reduce / overlap_param_gather (Megatron's
  /// --ddp-bucket-size; 40 M).
  long grad_bucket_size = 40000000;
  /// Layers per pipeline stage, e.g. "5,7" for an uneven split of 12 layers
  /// over 2 stages (no virtual stages); "" = uniform (num_layers must then
  /// divide evenly); "balanced" = balanced_stage_layers over the model chunks
  /// with the LM head on the last.
  std::string pipeline_layers;

  /// Layers of each model chunk, first to last: pipeline_parallel x
  /// virtual_stages of them (one per stage without interleaving). Uniform
  /// when pipeline_layers is empty, balanced with the last chunk's head worth
  /// `head_layers` layers when it is "balanced"; valid after
  /// RunConfig::validate.
  std::vector<int> chunk_layers(int num_layers, double head_layers = 0) const;
  /// Model chunks of the pipeline: pipeline_parallel x virtual_stages.
  int model_chunks() const { return pipeline_parallel * virtual_stages; }

  ParallelDegrees degrees() const {
    return {tensor_parallel, pipeline_parallel, data_parallel};
  }

  /// Seconds a rank may wait in one collective, point-to-point transfer or
  /// wait of a non-blocking collective before the watchdog names the group
  /// and the ranks that have not arrived and aborts the job; 0 = off (the
  /// blocking calls, no deadline). Off by default: the watched waits poll
  /// (MPI_Test loop) and take MPI's non-blocking collective algorithms.
  double collective_timeout_s = 0;
  /// Test aid: "RANK:STEP[:GROUP]" makes world rank RANK never arrive at
  /// its first collective (of GROUP) in step STEP; needs the watchdog on.
  std::string debug_skip_collective;
  WatchdogSettings watchdog() const {
    return {collective_timeout_s, SkipHook::parse(debug_skip_collective)};
  }
};

struct TrainingSection {
  int micro_batch_size = 2;
  int global_batch_size = 0;  ///< 0 = micro_batch_size * data_parallel
  int train_iters = 100;
  std::string precision = "fp32";  ///< fp32 | bf16 | fp16
  /// The LM head's logits: "fp32" (the GEMM writes fp32, so the loss sees
  /// unrounded logits) or "compute" (the operands' dtype, bf16 / fp16 under
  /// mixed precision: Megatron-LM's and PyTorch autocast's numerics, the
  /// loss kernels still computing in fp32; half the logits' memory and
  /// traffic). The same under precision = fp32.
  std::string logits_dtype = "fp32";
  /// GPU, fused attention with attention dropout: each step's first
  /// micro-batch has its layers' dropout masks drawn at the start of the
  /// step on a high-priority stream, where they overlap the previous
  /// step's optimizer update, instead of ahead of each layer's attention.
  /// The same bits either way. With cuda_graphs only at one micro-batch
  /// per step (the graph replays every micro-batch).
  bool attention_masks_ahead = true;
  std::string bias_in_weight_gemm = "auto";  ///< auto (on with run.device = cuda) | true | false
  /// Who draws the attention-dropout mask. "meshtron": its counter-based
  /// Philox, the same bits on the host and the GPU, fused or not, on any
  /// tp / dp / pp decomposition. "cudnn": cuDNN's fused attention draws it
  /// with its own generator inside its kernels (as Megatron-LM with
  /// Transformer Engine does): faster, but other bits, and a run's result
  /// then depends on its decomposition (each call's seed mixes the step, the
  /// layer, the sample offset and the first local head). Needs the GPU,
  /// cuDNN and the fused attention (bf16 / fp16, head dim 64 / 128).
  std::string attention_dropout_rng = "meshtron";
  /// Whose fused attention the device path runs (model.attention_backend
  /// auto or fused). "auto": cuDNN's where meshtron is built with cuDNN,
  /// cuDNN loads and it plans the shape, else meshtron's flash kernels (the
  /// choice is made once per shape and printed once). "own": meshtron's
  /// flash kernels always. Attention dropout drawn by meshtron runs its own
  /// kernels either way; training.attention_dropout_rng = cudnn runs cuDNN's.
  std::string fused_attention_kernels = "auto";
  double clip_grad = 1.0;          ///< 0 disables clipping
  std::string recompute = "none";  ///< none | selective | full
  int recompute_num_layers = 0;
  bool check_for_nan = true;
  int max_nan_skips = 10;
  /// cuda: each micro-batch's forward and backward replayed from one CUDA
  /// graph captured at the second step (train/cuda_graph.hpp); pp = 1, tp
  /// on NCCL (not the copy engines), no overlapped dp communication.
  bool cuda_graphs = false;
  int eval_interval = 0;  ///< 0 disables evaluation
  int eval_iters = 10;
};

struct OptimizerSection {
  std::string type = "adamw";
  double lr = 6e-4;
  double min_lr = 6e-5;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

struct LrScheduleSection {
  int warmup_iters = 0;
  std::string decay_style = "cosine";  ///< constant | linear | cosine
  int decay_iters = 0;                 ///< 0 = training.train_iters
};

struct DataSection {
  std::string source = "synthetic";  ///< synthetic | indexed | jsonl
  std::string path;                  ///< indexed dataset prefix (no .bin/.idx); jsonl: the file
  std::string valid_path;            ///< jsonl: the validation rows ("" = none)
  std::string split = "969,30,1";
  std::string tokenizer = "gpt2";
  std::string vocab_file;
  std::string merge_file;
  std::string tokenizer_file;   ///< tokenizer.json, for tokenizer = hf
  std::string tokenizer_model;  ///< tokenizer.model, for tokenizer = sentencepiece
  /// T5's sentinels <extra_id_0> ... (Megatron-LM's --vocab-extra-ids):
  /// the tokenizer's own pieces when it has them, else appended to its
  /// vocabulary (model.arch = t5 only).
  int vocab_extra_ids = 100;
};

struct CheckpointSection {
  std::string save_dir = "checkpoints";
  int save_interval = 0;  ///< 0 = only at the end when save_dir is set
  std::string load;       ///< "" | auto | path
  int keep_last = 3;
  /// Load only the weights of `load` (Megatron's --finetune): a fresh
  /// optimizer, iteration 0, a fresh data order. A checkpoint without
  /// optimizer state (as `convert` writes) is always loaded this way.
  bool finetune = false;
  /// With load = auto: the checkpoint to fine-tune from while save_dir has
  /// none of its own (Megatron's --pretrained-checkpoint), so a requeued
  /// fine-tuning job resumes from its own saves.
  std::string pretrained;
};

struct LoggingSection {
  int log_interval = 1;
  /// Every N steps, greedy continuations of sample_prompts printed (0 = off).
  int sample_interval = 0;
  std::string sample_prompts;  ///< JSONL as generate.prompts ("" = the EOD token)
  int sample_tokens = 32;      ///< tokens per sample (fewer where the context ends)
  std::string metrics_file = "metrics.jsonl";
  std::string progress = "auto";  ///< auto | on | off
  /// Peak TFLOP/s of one rank for MFU; 0 = 989 (H100 dense bf16) on cuda,
  /// 0.08 on cpu (one 2.5 GHz AVX2 core: 2 FMA x 8 lanes x 2 = 32 FLOP/cycle).
  double peak_tflops = 0;
  /// GPU kernel trace (CUPTI) of steps [profile_step_start, profile_step_end):
  /// a Chrome trace per rank in the run folder and a time split per rank.
  bool profile = false;
  int profile_step_start = 3;
  int profile_step_end = 5;
};

/// `meshtron evaluate` (and the test split at the end of `train`): loss and
/// perplexity of checkpoint.load on a split of data.path, or on explicit rows.
struct EvaluateSection {
  std::string split = "valid";  ///< valid | test | all (documents by data.split)
  std::string output;           ///< JSON file of the result ("" = none)
  std::string inputs;           ///< JSONL of {"ids": [...]} rows instead of a split
  int micro_batch_size = 0;     ///< 0 = training.micro_batch_size (resolved by validate)
  /// Samples per forward-only batch over all dp ranks; 0 = as many
  /// micro-batches per dp rank as a training step has (resolved by validate).
  int global_batch_size = 0;
};

/// `meshtron generate`: prompts in, generated tokens out (src/generate/).
struct GenerateSection {
  std::string prompts;  ///< JSONL, one {"text": ...} or {"ids": [...]} a line
  std::string output;   ///< JSONL of the results ("" = print them on rank 0)
  int max_new_tokens = 32;
  std::string decoding = "greedy";  ///< greedy | sample | beam
  double temperature = 1.0;
  int top_k = 0;                    ///< 0 = off
  double top_p = 1.0;               ///< 1 = off
  int num_beams = 4;
  double length_penalty = 1.0;
  bool early_stopping = false;
  /// Comma-separated ids that end a sequence; "eod" = the tokenizer's EOD
  /// id, "" = none.
  std::string stop_ids = "eod";
  /// A JSON array of strings that end a sequence once its text holds one.
  std::string stop = "[]";
  std::uint64_t seed = 1234;
  bool logprobs = false;  ///< per-token log-probabilities in the output
  int batch_size = 8;     ///< prompts decoded together on each dp rank
  /// "auto" | a positive count: the batch's parts in flight at once over
  /// the pipeline stages (auto = min(pp, prompts); 1 = one stage at a time).
  std::string micro_batches = "auto";
};

/// `meshtron serve`: the HTTP server of rank 0 (decoding defaults and stop
/// ids come from [generate]).
struct ServeSection {
  std::string host = "127.0.0.1";  ///< address to bind ("0.0.0.0": every interface)
  int port = 8000;                 ///< 0 = a free port, printed
  int max_n = 8;                   ///< completions per prompt a request may ask for
  int max_prompts = 16;            ///< prompts per request
};

/// A key's value "auto" (0) or a positive integer; anything else is a
/// UserError naming `key`.
int positive_or_auto(const std::string& key, const std::string& text);

struct RunConfig {
  RunSection run;
  ModelSection model;
  ParallelSection parallel;
  TrainingSection training;
  OptimizerSection optimizer;
  LrScheduleSection lr_schedule;
  DataSection data;
  CheckpointSection checkpoint;
  LoggingSection logging;
  EvaluateSection evaluate;
  GenerateSection generate;
  ServeSection serve;

  /// The deck files, in order, joined by spaces.
  std::string deck_path;
  /// The decks as read, for checkpoints: one deck's text as it is; several
  /// decks each after a header line "# --- deck PATH ---" (kDeckHeader),
  /// which from_text reads back as the same decks in the same order.
  std::string deck_text;
  std::vector<std::string> overrides;  ///< "section.key=value" in order

  /// The comment line that starts each deck of a multi-deck deck_text.
  static constexpr const char* kDeckHeader = "# --- deck ";

  /// Parse deck files, later ones overriding earlier ones, then overrides;
  /// throws UserError naming the key, or the file that is missing, not a
  /// regular file or empty.
  static RunConfig from_files(const std::vector<std::string>& paths,
                              const std::vector<std::string>& overrides = {});
  /// from_files of one deck.
  static RunConfig from_file(const std::string& path,
                             const std::vector<std::string>& overrides = {});
  /// Parse deck text (tests, a checkpoint's deck_text); `origin` names it in
  /// messages. Decks after kDeckHeader lines override the ones before.
  static RunConfig from_text(const std::string& text,
                             const std::vector<std::string>& overrides = {},
                             const std::string& origin = "<deck>");

  /// Check each value against its key's range (every float key finite),
  /// then the values against each other and the world size; throws
  /// UserError whose message names every offending value. Resolves "auto"
  /// data_parallel and the derived defaults (global batch, decay iters).
  void validate(int world_size);

  /// The decks and then the --set overrides as one more deck, as
  /// from_text reads them back to this configuration: what a checkpoint
  /// stores, so a resumed run compares its model with the one really built.
  std::string text_with_overrides() const;

  /// The parallel degrees, with T5's pipeline split (the encoder's stages,
  /// then the decoder's) and which stages hold the word table.
  ParallelDegrees degrees() const;

  /// The resolved deck, one "section.key = value" per line, grouped.
  std::string resolved_text() const;
  /// Documentation of every key: name, type, default, meaning.
  static std::string schema_help();
};

/// Layers per pipeline stage (>= 1 each, num_layers in all) that make the
/// slowest stage as fast as it can be, counting each layer as 1 and the
/// last stage's LM head and loss as `head_layers` (head_cost_in_layers): one
/// layer at a time to the stage it leaves cheapest, the earliest on ties.
/// GPT-2 774M on 2 stages: 19,17 (stage costs 19 and 19.89) instead of
/// 18,18 (18 and 20.89). The embedding lookup, a gather, counts as nothing,
/// and so does recomputation: under training.recompute = full a layer costs
/// ~4/3 as much and the head the same, so the head is worth 3/4 as many
/// layers (774M: 2.17, still 19,17).
/// With virtual stages the "stages" are the pp x v model chunks (774M, pp 2,
/// v 2: 10,10,9,7, so ranks of 19 and 17 layers as above).
std::vector<int> balanced_stage_layers(int num_layers, int stages, double head_layers);

}  // namespace meshtron
