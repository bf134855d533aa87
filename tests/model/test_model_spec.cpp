// ModelSpec: GPT-2 by default from the deck and from Hugging Face, the
// architecture keys into the spec and back, every value the layers do not
// build rejected at construction in one line, and the FLOP count of
// grouped-query attention and a gated MLP.
#include <gtest/gtest.h>

#include <functional>

#include "common/expect_user_error.hpp"
#include "common/error.hpp"
#include "config/model_spec_from_deck.hpp"
#include "io/hf/gpt2_config.hpp"
#include "model/gpt_model.hpp"
#include "model/t5_model.hpp"
#include "parallel/communicator.hpp"
#include "train/metrics.hpp"

using namespace meshtron;

namespace {

using testing_util::expect_user_error;

ModelSpec spec_of_deck(const std::string& model_keys, int tp = 1) {
  RunConfig c = RunConfig::from_text("[model]\nnum_layers = 2\nhidden_size = 64\n"
                                     "num_attention_heads = 8\n" + model_keys,
                                     {"parallel.tensor_parallel=" + std::to_string(tp)});
  c.validate(tp);
  return model_spec_from_deck(c, 100, tp);
}

/// Builds the whole model of `spec` on one rank.
void build(const ModelSpec& spec) {
  MpiCommunicator self(MPI_COMM_SELF);
  TensorParallelGroup tp{self};
  LayerContext ctx{tp};
  GptModel model(spec, StagePlacement::whole_model(spec.num_layers), ctx, DType::F32, 1);
}

}  // namespace

TEST(ModelSpec, NamesRoundTripAndUnknownNamesListTheKnownOnes) {
  for (Activation a : {Activation::Gelu, Activation::GeluTanh, Activation::Relu,
                       Activation::Swiglu, Activation::Geglu})
    EXPECT_EQ(parse_activation(to_string(a), "x"), a);
  for (PositionEmbedding p : {PositionEmbedding::LearnedAbsolute, PositionEmbedding::Rope,
                              PositionEmbedding::Alibi, PositionEmbedding::None})
    EXPECT_EQ(parse_position_embedding(to_string(p), "x"), p);
  EXPECT_EQ(parse_norm_kind("RMSNorm", "x"), NormKind::RMSNorm);
  EXPECT_EQ(parse_attention_mask("padding", "x"), AttentionMask::Padding);
  EXPECT_EQ(parse_norm_placement("post", "x"), NormPlacement::Post);
  expect_user_error([] { parse_norm_kind("rmsnorm", "model.normalization"); },
                    {"model.normalization = 'rmsnorm'", "LayerNorm | RMSNorm"});
}

TEST(ModelSpec, DeckDefaultsAreGpt2) {
  const ModelSpec s = spec_of_deck("");
  const ModelSpec gpt2;
  EXPECT_EQ(s.block.norm.kind, NormKind::LayerNorm);
  EXPECT_EQ(s.block.norm.placement, NormPlacement::Pre);
  EXPECT_EQ(s.block.attention.num_query_groups, 8);
  EXPECT_EQ(s.block.attention.head_dim, 8);
  EXPECT_EQ(s.block.attention.position, PositionEmbedding::LearnedAbsolute);
  EXPECT_EQ(s.block.attention.mask, AttentionMask::Causal);
  EXPECT_EQ(s.block.mlp.activation, Activation::GeluTanh);
  EXPECT_EQ(s.block.mlp.ffn_hidden_size, 256);
  EXPECT_TRUE(s.block.attention.bias && s.block.mlp.bias && s.tie_word_embeddings);
  EXPECT_FALSE(s.parallel_residual || s.embedding_norm);
  EXPECT_EQ(s.block.mlp.activation, gpt2.block.mlp.activation);
}

TEST(ModelSpec, HuggingFaceGpt2IsTheDefaultSpec) {
  io::HfGpt2Config hf;
  const ModelSpec s = io::model_spec_from_hf(hf, 1024, 128, 1);
  EXPECT_EQ(s.block.mlp.activation, Activation::GeluTanh);
  EXPECT_EQ(s.block.attention.num_query_groups, 12);
  EXPECT_EQ(s.block.attention.head_dim, 64);
  EXPECT_EQ(s.padded_vocab_size, 50304);
  hf.activation_function = "gelu";  // the erf GeLU
  EXPECT_EQ(io::model_spec_from_hf(hf, 1024, 128, 1).block.mlp.activation, Activation::Gelu);
  hf.activation_function = "silu";
  expect_user_error([&] { io::model_spec_from_hf(hf, 1024, 128, 1); }, {"'silu'"});
}

TEST(ModelSpec, ArchitectureKeysParseAndWriteBack) {
  const ModelSpec s = spec_of_deck(
      "normalization = RMSNorm\nposition_embedding_type = rope\nnum_query_groups = 2\n"
      "kv_channels = 16\nrotary_percent = 0.5\nrotary_base = 500000\nrotary_interleaved = true\n"
      "activation = swiglu\nadd_bias_linear = false\n"
      "untie_embeddings_and_output_weights = true\nparallel_residual = true\n"
      "embedding_norm = true\n", 2);
  const auto& a = s.block.attention;
  EXPECT_EQ(s.block.norm.kind, NormKind::RMSNorm);
  EXPECT_EQ(a.position, PositionEmbedding::Rope);
  EXPECT_EQ(a.num_query_groups, 2);
  EXPECT_EQ(a.head_dim, 16);
  EXPECT_EQ(a.rotary_percent, 0.5);
  EXPECT_EQ(a.rotary_base, 500000);
  EXPECT_TRUE(a.rotary_interleaved);
  EXPECT_EQ(s.block.mlp.activation, Activation::Swiglu);
  EXPECT_FALSE(a.bias || s.block.mlp.bias || s.tie_word_embeddings);
  EXPECT_TRUE(s.parallel_residual && s.embedding_norm);

  RunConfig back = RunConfig::from_text(model_deck_section(s), {"parallel.tensor_parallel=2"});
  back.validate(2);
  const ModelSpec r = model_spec_from_deck(back, 100, 2);
  EXPECT_EQ(r.block.norm.kind, NormKind::RMSNorm);
  EXPECT_EQ(r.block.attention.num_query_groups, 2);
  EXPECT_EQ(r.block.attention.head_dim, 16);
  EXPECT_EQ(r.block.attention.rotary_base, 500000);
  EXPECT_TRUE(r.block.attention.rotary_interleaved);
  EXPECT_EQ(r.block.mlp.activation, Activation::Swiglu);
  EXPECT_FALSE(r.block.mlp.bias || r.tie_word_embeddings);
  EXPECT_TRUE(r.parallel_residual && r.embedding_norm);
}

// model.arch sets its family's keys as defaults; a key in the deck wins.
TEST(ModelSpec, ArchPresetsAreDefaultsThatDeckKeysOverride) {
  const ModelSpec llama = spec_of_deck("arch = llama\n");
  EXPECT_EQ(llama.block.norm.kind, NormKind::RMSNorm);
  EXPECT_EQ(llama.block.attention.position, PositionEmbedding::Rope);
  EXPECT_EQ(llama.block.mlp.activation, Activation::Swiglu);
  EXPECT_FALSE(llama.block.attention.bias || llama.block.mlp.bias || llama.tie_word_embeddings);
  EXPECT_EQ(llama.block.attention.num_query_groups, 8);
  const ModelSpec biased = spec_of_deck("arch = llama\nadd_bias_linear = true\n");
  EXPECT_TRUE(biased.block.attention.bias && biased.block.mlp.bias);
  EXPECT_EQ(biased.block.norm.kind, NormKind::RMSNorm);
  EXPECT_EQ(spec_of_deck("arch = gpt_bigcode\n").block.attention.num_query_groups, 1);
  EXPECT_EQ(spec_of_deck("arch = gpt_bigcode\nnum_query_groups = 2\n")
                .block.attention.num_query_groups, 2);
  EXPECT_EQ(spec_of_deck("arch = gpt\n").block.norm.kind, NormKind::LayerNorm);
  expect_user_error([] { spec_of_deck("arch = llama2\n"); },
                    {"model.arch = 'llama2' is not one of gpt | llama"});
}

// model.arch = bert: Megatron's BertModel, which the trainer builds as a
// BertModel; what it does not build yet is one line.
TEST(ModelSpec, BertArchIsTheEncoderWithTwoTokenTypes) {
  const ModelSpec bert = spec_of_deck("arch = bert\n");
  EXPECT_EQ(bert.model_class, ModelClass::BertPretraining);
  EXPECT_EQ(bert.block.attention.mask, AttentionMask::Padding);
  EXPECT_EQ(bert.block.attention.position, PositionEmbedding::LearnedAbsolute);
  EXPECT_EQ(bert.block.mlp.activation, Activation::Gelu);
  EXPECT_EQ(bert.num_token_types, 2);
  EXPECT_DOUBLE_EQ(bert.block.norm.epsilon, 1e-12);
  EXPECT_EQ(spec_of_deck("arch = bert\nnum_token_types = 3\n").num_token_types, 3);
  EXPECT_EQ(spec_of_deck("").model_class, ModelClass::CausalLm);
  expect_user_error([] { spec_of_deck("num_token_types = 2\n"); },
                    {"model.num_token_types = 2 needs model.arch = bert"});
  expect_user_error([] { spec_of_deck("arch = bert\nnum_token_types = 0\n"); },
                    {"model.arch = bert needs model.num_token_types > 0"});
  expect_user_error(
      [] {
        RunConfig c = RunConfig::from_text(
            "[model]\narch = bert\nnum_layers = 2\nhidden_size = 64\nnum_attention_heads = 8\n",
            {"logging.sample_interval=10"});
        c.validate(1);
      },
      {"model.arch = bert: logging.sample_interval (fill-mask) needs data.tokenizer"});
  // With the WordPiece tokenizer the samples are fill-mask results.
  RunConfig wordpiece = RunConfig::from_text(
      "[model]\narch = bert\nnum_layers = 2\nhidden_size = 64\nnum_attention_heads = 8\n",
      {"logging.sample_interval=10", "data.tokenizer=bert_wordpiece_lowercase",
       "data.vocab_file=vocab.txt"});
  EXPECT_NO_THROW(wordpiece.validate(1));
  // Pipeline and sequence parallelism are built (parallel_bert_decomposition).
  RunConfig parallel = RunConfig::from_text(
      "[model]\narch = bert\nnum_layers = 2\nhidden_size = 64\nnum_attention_heads = 8\n",
      {"parallel.pipeline_parallel=2", "parallel.sequence_parallel=true",
       "parallel.tensor_parallel=2"});
  EXPECT_NO_THROW(parallel.validate(4));
}

// model.arch = t5: transformers' T5 v1.0 (T5Model); the decoder keys as
// Megatron names them, inconsistent values one line each.
TEST(ModelSpec, T5ArchIsTheEncoderDecoderWithRelativeBuckets) {
  const ModelSpec t5 = spec_of_deck("arch = t5\ndecoder_seq_length = 8\n");
  EXPECT_EQ(t5.model_class, ModelClass::T5);
  EXPECT_EQ(t5.block.norm.kind, NormKind::RMSNorm);
  EXPECT_FALSE(t5.block.norm.bias);
  EXPECT_DOUBLE_EQ(t5.block.norm.epsilon, 1e-6);
  EXPECT_EQ(t5.block.attention.position, PositionEmbedding::Relative);
  EXPECT_EQ(t5.block.attention.mask, AttentionMask::Padding);
  EXPECT_FALSE(t5.block.attention.scale_scores);
  EXPECT_FALSE(t5.block.attention.bias);
  EXPECT_FALSE(t5.block.mlp.bias);
  EXPECT_EQ(t5.block.mlp.activation, Activation::Relu);
  EXPECT_TRUE(t5.tie_word_embeddings);
  EXPECT_EQ(t5.num_decoder_layers, 2);  // 0 = num_layers
  EXPECT_EQ(t5.decoder_seq_length, 8);
  EXPECT_EQ(t5.relative_attention_num_buckets, 32);
  EXPECT_EQ(t5.relative_attention_max_distance, 128);
  const ModelSpec v11 = spec_of_deck(
      "arch = t5\ndecoder_seq_length = 8\ndecoder_num_layers = 3\nactivation = geglu_tanh\n"
      "untie_embeddings_and_output_weights = true\nrelative_attention_num_buckets = 16\n"
      "relative_attention_max_distance = 64\n");
  EXPECT_EQ(v11.num_decoder_layers, 3);
  EXPECT_EQ(v11.block.mlp.activation, Activation::GegluTanh);
  EXPECT_FALSE(v11.tie_word_embeddings);
  EXPECT_EQ(v11.relative_attention_num_buckets, 16);
  EXPECT_EQ(v11.relative_attention_max_distance, 64);
  expect_user_error([] { spec_of_deck("arch = t5\n"); },
                    {"model.arch = t5 needs model.decoder_seq_length > 1"});
  expect_user_error([] { spec_of_deck("decoder_seq_length = 8\n"); },
                    {"model.decoder_seq_length = 8 need model.arch = t5"});
  expect_user_error([] { spec_of_deck("decoder_num_layers = 2\n"); },
                    {"model.decoder_num_layers = 2", "need model.arch = t5"});
  expect_user_error(
      [] { spec_of_deck("arch = t5\ndecoder_seq_length = 8\nposition_embedding_type = rope\n"); },
      {"model.arch = t5 needs model.position_embedding_type = relative"});
  expect_user_error(
      [] { spec_of_deck("arch = t5\ndecoder_seq_length = 8\nrelative_attention_num_buckets = 2\n"); },
      {"model.relative_attention_num_buckets = 2 must be at least 4"});
  expect_user_error(
      [] { spec_of_deck("arch = t5\ndecoder_seq_length = 8\nrelative_attention_max_distance = 16\n"); },
      {"model.relative_attention_max_distance = 16 must exceed half"});
  const auto t5_deck = [](const std::string& set) {
    RunConfig c = RunConfig::from_text(
        "[model]\narch = t5\ndecoder_seq_length = 8\nnum_layers = 2\nhidden_size = 64\n"
        "num_attention_heads = 8\n", {set});
    c.validate(2);
  };
  expect_user_error([&] { t5_deck("data.vocab_extra_ids=0"); }, {"model.arch = t5"});
  // Training samples generate with T5Generator (generate_training_samples).
  EXPECT_NO_THROW(t5_deck("logging.sample_interval=10"));
}

// model.arch = t5 over pipeline stages: Megatron's split rank, half the
// stages by default; which stages hold the word table; what is refused.
TEST(ModelSpec, T5PipelineSplit) {
  const auto deck = [](std::vector<std::string> sets, int world) {
    RunConfig c = RunConfig::from_text(
        "[model]\narch = t5\ndecoder_seq_length = 8\nnum_layers = 2\nhidden_size = 64\n"
        "num_attention_heads = 8\n",
        sets);
    c.validate(world);
    return c;
  };
  const ParallelDegrees two = deck({"parallel.pipeline_parallel=2"}, 2).degrees();
  EXPECT_EQ(two.pipeline_split_rank, 1);
  EXPECT_TRUE(two.last_stage_holds_word_table);
  const ParallelDegrees untied =
      deck({"parallel.pipeline_parallel=4", "model.untie_embeddings_and_output_weights=true"}, 4)
          .degrees();
  EXPECT_EQ(untied.pipeline_split_rank, 2);
  EXPECT_FALSE(untied.last_stage_holds_word_table);
  EXPECT_EQ(deck({"parallel.pipeline_parallel=3", "parallel.pipeline_split_rank=1",
                  "model.decoder_num_layers=4"}, 3)
                .degrees()
                .pipeline_split_rank,
            1);
  EXPECT_EQ(deck({}, 1).degrees().pipeline_split_rank, 0);
  expect_user_error(
      [&] { deck({"parallel.pipeline_parallel=4", "parallel.pipeline_split_rank=3"}, 4); },
      {"the encoder's 2 layers over 3 stages and the decoder's 2 over 1",
                     "must both divide evenly"});
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"parallel.pipeline_parallel=2", "parallel.pipeline_split_rank=2"},
       "parallel.pipeline_split_rank = 2 must be in [1, parallel.pipeline_parallel = 2)"},
      {{"parallel.pipeline_parallel=2", "parallel.pipeline_split_rank=-1"}, "must be in [1"},
      {{"parallel.pipeline_split_rank=1"}, "needs parallel.pipeline_parallel > 1"},
      {{"parallel.pipeline_parallel=2", "parallel.schedule=interleaved",
        "parallel.virtual_stages=2", "training.global_batch_size=4"},
       "the interleaved schedule is not built for the encoder-decoder pipeline split"},
      {{"parallel.pipeline_parallel=2", "parallel.pipeline_layers=1,1"},
       "the split is parallel.pipeline_split_rank"}};
  for (const auto& [sets, message] : refused)
    expect_user_error([&] { deck(sets, 4); }, {message});
  expect_user_error(
      [] {
        RunConfig c = RunConfig::from_text("[model]\nnum_layers = 2\n",
                                           {"parallel.pipeline_parallel=2",
                                            "parallel.pipeline_split_rank=1"});
        c.validate(2);
      },
      {"parallel.pipeline_split_rank = 1 needs model.arch = t5"});
}

// What convert stores with a T5 checkpoint reads back as the spec.
TEST(ModelSpec, T5SpecWritesBackAsItsDeck) {
  const ModelSpec s = t5_spec(/*encoder_layers=*/2, /*decoder_layers=*/3, /*d_model=*/32,
                              /*heads=*/4, /*d_kv=*/6, /*d_ff=*/64, Activation::GegluTanh,
                              /*tie_word_embeddings=*/false, /*vocab=*/100,
                              /*encoder_seq_length=*/20, /*decoder_seq_length=*/18,
                              /*buckets=*/8, /*max_distance=*/16, /*eps=*/1e-5);
  RunConfig back = RunConfig::from_text(model_deck_section(s));
  back.validate(1);
  const ModelSpec r = model_spec_from_deck(back, 0, 1);
  EXPECT_EQ(r.model_class, ModelClass::T5);
  EXPECT_EQ(r.num_layers, 2);
  EXPECT_EQ(r.num_decoder_layers, 3);
  EXPECT_EQ(r.seq_length, 20);
  EXPECT_EQ(r.decoder_seq_length, 18);
  EXPECT_EQ(r.vocab_size, 100);
  EXPECT_EQ(r.block.attention.head_dim, 6);
  EXPECT_EQ(r.block.attention.mask, AttentionMask::Padding);
  EXPECT_FALSE(r.block.attention.scale_scores || r.block.norm.bias || r.block.attention.bias);
  EXPECT_EQ(r.block.norm.kind, NormKind::RMSNorm);
  EXPECT_DOUBLE_EQ(r.block.norm.epsilon, 1e-5);
  EXPECT_EQ(r.block.mlp.activation, Activation::GegluTanh);
  EXPECT_EQ(r.block.mlp.ffn_hidden_size, 64);
  EXPECT_FALSE(r.tie_word_embeddings);
  EXPECT_EQ(r.relative_attention_num_buckets, 8);
  EXPECT_EQ(r.relative_attention_max_distance, 16);
  // Without model_class T5 a norm without bias has no key.
  ModelSpec not_t5 = s;
  not_t5.model_class = ModelClass::CausalLm;
  expect_user_error([&] { model_deck_section(not_t5); }, {"model.arch = t5"});
}

TEST(ModelSpec, DeckRejectsBadArchitectureValues) {
  expect_user_error([] { spec_of_deck("normalization = BatchNorm\n"); }, {"model.normalization"});
  expect_user_error([] { spec_of_deck("position_embedding_type = sinusoidal\n"); },
                    {"model.position_embedding_type"});
  expect_user_error([] { spec_of_deck("activation = silu\n"); }, {"model.activation"});
  expect_user_error([] { spec_of_deck("num_query_groups = 3\n"); }, {"model.num_query_groups"});
  expect_user_error([] { spec_of_deck("num_query_groups = 2\n", 4); },
                    {"parallel.tensor_parallel", "model.num_query_groups (2)"});
  expect_user_error([] { spec_of_deck("rotary_percent = 0\n"); }, {"model.rotary_percent"});
  expect_user_error([] { spec_of_deck("rotary_base = -1\n"); }, {"model.rotary_base"});
  expect_user_error([] { spec_of_deck("kv_channels = -4\n"); }, {"model.kv_channels"});
}

TEST(ModelSpec, LayersRejectWhatTheyDoNotBuild) {
  build(spec_of_deck(""));  // GPT-2 builds
  build(spec_of_deck("normalization = RMSNorm\nactivation = swiglu\n"));
  build(spec_of_deck("activation = geglu\n"));
  build(spec_of_deck("untie_embeddings_and_output_weights = true\n"));  // and untied
  build(spec_of_deck("activation = gelu\nparallel_residual = true\n"));  // GPT-NeoX's
  build(spec_of_deck("activation = relu\n"));
  build(spec_of_deck("position_embedding_type = alibi\nembedding_norm = true\n"));  // BLOOM's
  ModelSpec post = spec_of_deck("");
  post.block.norm.placement = NormPlacement::Post;
  build(post);  // post-norm blocks without a final norm (Google BERT's)
  post.parallel_residual = true;
  expect_user_error([&] { build(post); },
                    {"TransformerLayer: a parallel residual with norm placement post"});
  ModelSpec padding = spec_of_deck("");
  padding.block.attention.mask = AttentionMask::Padding;
  build(padding);  // bidirectional over the real keys (BERT's)
  padding.block.attention.backend = "fused";
  build(padding);  // the fused core takes the key mask too
  ModelSpec unmasked = spec_of_deck("");
  unmasked.block.attention.mask = AttentionMask::None;
  expect_user_error([&] { build(unmasked); }, {"Attention: attention mask none"});
  ModelSpec alibi_padding = spec_of_deck("position_embedding_type = alibi\n");
  alibi_padding.block.attention.mask = AttentionMask::Padding;
  expect_user_error([&] { build(alibi_padding); }, {"ALiBi with attention mask padding"});
}

TEST(ModelSpec, LayersBuildRotaryGroupedQueriesAndOwnHeadDim) {
  for (const char* keys : {"position_embedding_type = rope\n", "position_embedding_type = none\n",
                           "num_query_groups = 2\n", "num_query_groups = 1\nkv_channels = 16\n",
                           "position_embedding_type = rope\nrotary_percent = 0.5\n"
                           "rotary_interleaved = true\nnum_query_groups = 2\n",
                           "position_embedding_type = alibi\nembedding_norm = true\n"})
    EXPECT_NO_THROW(build(spec_of_deck(keys))) << keys;
}

TEST(ModelSpec, FlopsCountKvGroupsAndGatedMlp) {
  // GPT-2 124M: Megatron-LM's count, 3 x 2 x (L (4h^2 + 2hf + 2sh) + hV).
  io::HfGpt2Config hf;
  const ModelSpec gpt2 = io::model_spec_from_hf(hf, 1024, 128, 1);
  const double h = 768, f = 3072, s = 1024, L = 12, V = 50304;
  EXPECT_EQ(model_flops_per_token(gpt2), 6 * (L * (4 * h * h + 2 * h * f + 2 * s * h) + h * V));

  // 8 heads of 16 over h = 64, 2 kv groups, swiglu of width 96, untied:
  // qkv 64 x (8 + 4) x 16, proj 128 x 64, core 2 x 16 x 128, MLP 3 x 64 x 96.
  ModelSpec gqa = spec_of_deck("num_query_groups = 2\nkv_channels = 16\nactivation = swiglu\n"
                               "ffn_hidden_size = 96\nseq_length = 16\n"
                               "untie_embeddings_and_output_weights = true\n");
  const double layer = 64 * 12 * 16 + 128 * 64 + 2 * 16 * 128 + 3 * 64 * 96;
  EXPECT_EQ(model_flops_per_token(gqa), 6 * (2 * layer + 64.0 * gqa.padded_vocab_size));
}

TEST(ModelSpec, T5FlopsPerEncoderToken) {
  // t5-base: 12 + 12 layers, h 768, 12 heads of 64 (i = 768), relu f 3072,
  // s_e 512, s_d 128, V 32128. Per sample: encoder layers on 512 tokens,
  // decoder layers on 128 (self-attention over 128 keys, cross-attention
  // q and o per decoder token and its core over 512 keys, k and v of the 512
  // encoder outputs), the head on 128 tokens; per encoder token.
  ModelSpec t5 = t5_spec(12, 12, 768, 12, 64, 3072, Activation::Relu, true, 32128, 512, 128);
  t5.padded_vocab_size = 32128;
  const double h = 768, i = 768, f = 3072, se = 512, sd = 128, V = 32128;
  const auto layer = [&](double s) { return 4 * h * i + 2 * h * f + 2 * s * i; };
  const double sample = se * 12 * layer(se) +
                        12 * (sd * (layer(sd) + 2 * h * i + 2 * se * i) + se * 2 * h * i) +
                        sd * h * V;
  EXPECT_DOUBLE_EQ(model_flops_per_token(t5), 6 * sample / se);
  EXPECT_NE(model_flops_formula(t5), model_flops_formula(spec_of_deck("")));
}
