// safetensors and Hugging Face config I/O: round trips, the on-disk layout
// checked byte by byte against the format's definition, a hand-written file,
// the PyTorch-made golden model, and one error per kind of corrupt file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/expect_user_error.hpp"
#include "io/hf/gpt2_config.hpp"
#include "io/safetensors.hpp"

namespace fs = std::filesystem;
using namespace meshtron;
using namespace meshtron::io;

namespace {

const fs::path kGoldenDir = fs::path(MESHTRON_SOURCE_DIR) / "validation" / "gpt2-golden";

class IoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           (std::string("meshtron_io_") + info->name() + "_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::string le64(std::uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = char((v >> (8 * i)) & 0xff);
  return s;
}

/// A file made by hand: 8-byte length (the header's, unless overridden),
/// header text, data.
void write_raw(const std::string& path, const std::string& header, const std::string& data,
               std::uint64_t length = UINT64_MAX) {
  std::ofstream out(path, std::ios::binary);
  out << le64(length == UINT64_MAX ? header.size() : length) << header << data;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

template <class T>
Tensor make(Shape shape, std::vector<T> values) {
  Tensor t = Tensor::empty(std::move(shape), dtype_v<T>);
  EXPECT_EQ(std::size_t(t.numel()), values.size());
  std::memcpy(t.raw(), values.data(), t.bytes());
  return t;
}

bf16 bf16_bits(std::uint16_t b) {
  bf16 v;
  v.bits = b;
  return v;
}

std::vector<std::pair<std::string, Tensor>> sample_tensors() {
  return {
      {"w.f32", make<float>({2, 3}, {-1.f, -0.5f, 0.f, 0.5f, 1.f, 3.25e-7f})},
      // bf16 bit patterns that a float round trip could disturb: NaN with a
      // payload, -0, the smallest subnormal, +inf, and two ordinary values.
      {"b.bf16", make<bf16>({2, 3}, {bf16_bits(0x7fc1), bf16_bits(0x8000),
                                     bf16_bits(0x0001), bf16_bits(0x7f80),
                                     bf16_bits(0x3f80), bf16_bits(0xc2f7)})},
      {"h.f16", make<fp16>({3}, {fp16(1.5f), fp16(-2.f), fp16(6.1e-5f)})},
      {"d.f64", make<double>({4}, {1.0 / 3, -1e300, 0.0, 2.5})},
      {"i.i32", make<std::int32_t>({2, 2, 2}, {0, -1, 2, -3, 2147483647, -2147483647 - 1, 7, 8})},
      {"l.i64", make<std::int64_t>({3}, {(std::int64_t(1) << 40) + 1, -5, 0})},
      {"u.u16", make<std::uint16_t>({2, 2}, {0, 1, 65535, 300})},
      {"c.u8", make<std::uint8_t>({5}, {0, 1, 128, 254, 255})},
      {"scalar", make<float>({}, {42.f})},
      {"empty", Tensor::empty({0, 4}, DType::F32)},
  };
}

}  // namespace

// ------------------------------------------------------------ round trips

TEST_F(IoTest, RoundTripPreservesNamesDtypesShapesAndBits) {
  const auto tensors = sample_tensors();
  const SafetensorsMetadata meta = {{"format", "pt"}, {"note", "two words"}};
  write_safetensors(file("a.safetensors"), tensors, meta);

  SafetensorsFile f(file("a.safetensors"));
  EXPECT_EQ(f.metadata(), meta);
  ASSERT_EQ(f.entries().size(), tensors.size());
  for (std::size_t i = 1; i < f.entries().size(); ++i)
    EXPECT_LT(f.entries()[i - 1].name, f.entries()[i].name);
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(f.contains(name));
    EXPECT_EQ(f.entry(name).dtype, t.dtype());
    EXPECT_EQ(f.entry(name).shape, t.shape());
    Tensor back = f.load(name);
    EXPECT_EQ(back.dtype(), t.dtype());
    EXPECT_EQ(back.shape(), t.shape());
    EXPECT_EQ(std::memcmp(back.raw(), t.raw(), t.bytes()), 0);
  }
  EXPECT_FALSE(f.contains("missing"));
  EXPECT_EQ(f.load("b.bf16").data<bf16>()[0].bits, 0x7fc1);  // NaN payload kept
}

TEST_F(IoTest, WrittenFileFollowsTheFormatByteForByte) {
  const auto tensors = sample_tensors();
  write_safetensors(file("a.safetensors"), tensors, {{"k", "v"}});
  const std::string bytes = read_all(file("a.safetensors"));
  ASSERT_GE(bytes.size(), 8u);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | std::uint8_t(bytes[i]);
  EXPECT_EQ((8 + n) % 8, 0u) << "data section must start 8-byte aligned";
  const std::string header = bytes.substr(8, n);
  const std::size_t close = header.find_last_of('}');
  EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos)
      << "header padding must be spaces";
  EXPECT_LT(header.size() - close - 1, 8u);

  const auto j = nlohmann::json::parse(header);
  EXPECT_EQ(j["__metadata__"]["k"], "v");
  // Data: contiguous from 0 to the end of the file, no overlap, each tensor
  // aligned to its element size.
  std::map<std::uint64_t, std::uint64_t> spans;  // begin -> end
  const std::map<std::string, std::uint64_t> elem = {
      {"F64", 8}, {"I64", 8}, {"F32", 4}, {"I32", 4}, {"BF16", 2}, {"F16", 2}, {"U16", 2}, {"U8", 1}};
  for (const auto& [key, e] : j.items()) {
    if (key == "__metadata__") continue;
    const auto begin = e["data_offsets"][0].get<std::uint64_t>();
    EXPECT_EQ(begin % elem.at(e["dtype"].get<std::string>()), 0u) << key;
    if (begin == e["data_offsets"][1].get<std::uint64_t>()) continue;  // empty tensor
    EXPECT_TRUE(spans.emplace(begin, e["data_offsets"][1].get<std::uint64_t>()).second) << key;
  }
  std::uint64_t expected_begin = 0;
  for (const auto& [begin, end] : spans) {
    EXPECT_EQ(begin, expected_begin);
    expected_begin = end;
  }
  EXPECT_EQ(bytes.size(), 8 + n + expected_begin);
  EXPECT_EQ(j["b.bf16"]["dtype"], "BF16");
  EXPECT_EQ(j["i.i32"]["shape"], nlohmann::json({2, 2, 2}));
  EXPECT_EQ(j["scalar"]["shape"], nlohmann::json::array());
}

TEST_F(IoTest, ReadsAHandWrittenFile) {
  // Two tensors in reverse name order in the data section, metadata last.
  const std::string header =
      R"({"z":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]},)"
      R"("__metadata__":{"format":"pt"}}   )";
  const std::string data = std::string("\x07\x00\x00\x00\xfe\xff\xff\xff", 8) +
                           std::string("\x80\x3f\x00\xc0", 4);  // bf16 1.0, -2.0
  write_raw(file("h.safetensors"), header, data);

  SafetensorsFile f(file("h.safetensors"));
  ASSERT_EQ(f.entries().size(), 2u);
  EXPECT_EQ(f.entries()[0].name, "a");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.load("z").to_doubles(), (std::vector<double>{7, -2}));
  EXPECT_EQ(f.load("a").shape(), (Shape{1, 2}));
  EXPECT_EQ(f.load("a").to_doubles(), (std::vector<double>{1.0, -2.0}));
  EXPECT_EQ(list_safetensors(file("h.safetensors")).size(), 2u);
}

TEST_F(IoTest, LoadConvertsToTheRequestedDtype) {
  write_safetensors(file("a.safetensors"), sample_tensors());
  SafetensorsFile f(file("a.safetensors"));

  Tensor as_f32 = f.load("w.f32", DType::F32);
  Tensor bf = f.load("w.f32", DType::BF16);
  ASSERT_EQ(bf.dtype(), DType::BF16);
  for (index_t i = 0; i < bf.numel(); ++i)
    EXPECT_EQ(bf.data<bf16>()[i].bits, bf16(as_f32.data<float>()[i]).bits);

  Tensor d = f.load("d.f64", DType::F32);
  EXPECT_EQ(d.data<float>()[0], float(1.0 / 3));

  Tensor dst = Tensor::zeros({2, 3}, DType::F64);
  f.load_into("w.f32", dst);
  EXPECT_EQ(dst.data<double>()[5], double(3.25e-7f));
  Tensor same = Tensor::zeros({2, 3}, DType::F32);
  f.load_into("w.f32", same);
  EXPECT_EQ(same.data<float>()[1], -0.5f);
  Tensor wrong = Tensor::zeros({3, 2}, DType::F32);
  EXPECT_THROW(f.load_into("w.f32", wrong), UserError);
}

TEST_F(IoTest, WriteRejectsDuplicateAndReservedNames) {
  Tensor t = Tensor::zeros({2});
  EXPECT_THROW(write_safetensors(file("d.safetensors"), {{"x", t}, {"x", t}}), UserError);
  EXPECT_THROW(write_safetensors(file("d.safetensors"), {{"__metadata__", t}}), UserError);
  EXPECT_FALSE(fs::exists(file("d.safetensors")));
}

// ---------------------------------------------------------- corrupt files

namespace {
/// Expect UserError whose message names every string in `needles`.
using testing_util::expect_user_error;
const std::string kGoodEntry = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
}  // namespace

TEST_F(IoTest, MissingFileIsAUserError) {
  expect_user_error([&] { SafetensorsFile f(file("nope.safetensors")); },
                    {"nope.safetensors"});
}

TEST_F(IoTest, FileShorterThanTheLengthFieldIsAUserError) {
  std::ofstream(file("s.safetensors"), std::ios::binary) << "abcd";
  expect_user_error([&] { SafetensorsFile f(file("s.safetensors")); },
                    {"s.safetensors", "too short"});
}

TEST_F(IoTest, HeaderLengthBeyondTheFileIsAUserError) {
  write_raw(file("l.safetensors"), kGoodEntry, std::string(8, '\0'), 1u << 20);
  expect_user_error([&] { SafetensorsFile f(file("l.safetensors")); },
                    {"l.safetensors", "header length 1048576"});
}

TEST_F(IoTest, BadJsonIsAUserError) {
  write_raw(file("j.safetensors"), R"({"t":{"dtype":"F32",)", std::string(8, '\0'));
  expect_user_error([&] { SafetensorsFile f(file("j.safetensors")); },
                    {"j.safetensors", "JSON"});
}

TEST_F(IoTest, OffsetsOutOfRangeAreAUserError) {
  write_raw(file("o.safetensors"),
            R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
            std::string(8, '\0'));
  expect_user_error([&] { SafetensorsFile f(file("o.safetensors")); },
                    {"o.safetensors", "'t'", "data_offsets"});
}

TEST_F(IoTest, TruncatedFileIsAUserError) {
  write_safetensors(file("t.safetensors"), sample_tensors());
  fs::resize_file(file("t.safetensors"), fs::file_size(file("t.safetensors")) - 3);
  // The last tensor in the data is the narrowest, "c.u8"; its bytes are cut.
  expect_user_error([&] { SafetensorsFile f(file("t.safetensors")); },
                    {"t.safetensors", "'c.u8'"});
}

TEST_F(IoTest, OffsetsDisagreeingWithShapeAreAUserError) {
  write_raw(file("m.safetensors"),
            R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
            std::string(8, '\0'));
  expect_user_error([&] { SafetensorsFile f(file("m.safetensors")); },
                    {"m.safetensors", "'t'", "needs 12"});
}

TEST_F(IoTest, UnknownDtypeIsAUserError) {
  write_raw(file("u.safetensors"),
            R"({"t":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}})",
            std::string(8, '\0'));
  expect_user_error([&] { SafetensorsFile f(file("u.safetensors")); },
                    {"u.safetensors", "'t'", "F8_E4M3"});
}

TEST_F(IoTest, MissingKeysAndBadMetadataAreUserErrors) {
  write_raw(file("k.safetensors"), R"({"t":{"dtype":"F32","shape":[2]}})", "");
  expect_user_error([&] { SafetensorsFile f(file("k.safetensors")); },
                    {"k.safetensors", "'t'", "data_offsets"});
  write_raw(file("md.safetensors"), R"({"__metadata__":{"a":1}})", "");
  expect_user_error([&] { SafetensorsFile f(file("md.safetensors")); },
                    {"md.safetensors", "__metadata__"});
}

TEST_F(IoTest, UnknownTensorNameIsAUserError) {
  write_raw(file("g.safetensors"), kGoodEntry, std::string(8, '\0'));
  SafetensorsFile f(file("g.safetensors"));
  expect_user_error([&] { f.load("other"); }, {"g.safetensors", "'other'"});
}

// ------------------------------------------------ golden model (PyTorch)

namespace {
/// HF GPT2LMHeadModel parameter names and shapes for the golden config:
/// Conv1D weights are [in, out]; lm_head is tied to wte and not saved.
std::map<std::string, Shape> expected_golden_params() {
  const index_t V = 1000, P = 32, C = 64, layers = 2;
  std::map<std::string, Shape> p = {{"transformer.wte.weight", {V, C}},
                                    {"transformer.wpe.weight", {P, C}},
                                    {"transformer.ln_f.weight", {C}},
                                    {"transformer.ln_f.bias", {C}}};
  for (index_t l = 0; l < layers; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    p[h + "ln_1.weight"] = {C};
    p[h + "ln_1.bias"] = {C};
    p[h + "attn.c_attn.weight"] = {C, 3 * C};
    p[h + "attn.c_attn.bias"] = {3 * C};
    p[h + "attn.c_proj.weight"] = {C, C};
    p[h + "attn.c_proj.bias"] = {C};
    p[h + "ln_2.weight"] = {C};
    p[h + "ln_2.bias"] = {C};
    p[h + "mlp.c_fc.weight"] = {C, 4 * C};
    p[h + "mlp.c_fc.bias"] = {4 * C};
    p[h + "mlp.c_proj.weight"] = {4 * C, C};
    p[h + "mlp.c_proj.bias"] = {C};
  }
  return p;
}

double schedule_lr(int step) {  // the generator's schedule, written out again
  const double max_lr = 1e-3, min_lr = 1e-4;
  const int warmup = 2, decay = 4;
  if (step <= warmup) return max_lr * step / warmup;
  if (step > decay) return min_lr;
  const double r = double(step - warmup) / (decay - warmup);
  return min_lr + 0.5 * (max_lr - min_lr) * (1 + std::cos(M_PI * r));
}
}  // namespace

TEST(IoGolden, ModelSafetensorsHasTheHfGpt2Layout) {
  const fs::path path = kGoldenDir / "model.safetensors";
  if (!fs::exists(path)) GTEST_SKIP() << path << " absent (run validation/make_gpt2_golden.py)";
  SafetensorsFile f(path.string());
  const auto expected = expected_golden_params();
  ASSERT_EQ(f.entries().size(), expected.size());
  for (const auto& e : f.entries()) {
    SCOPED_TRACE(e.name);
    ASSERT_TRUE(expected.count(e.name));
    EXPECT_EQ(e.shape, expected.at(e.name));
    EXPECT_EQ(e.dtype, DType::F32);
  }
  EXPECT_FALSE(f.contains("lm_head.weight"));
  // ln_1 starts at ones, as HF initialises LayerNorm weights.
  for (double v : f.load("transformer.h.0.ln_1.weight").to_doubles()) EXPECT_EQ(v, 1.0);
}

TEST(IoGolden, GoldenSafetensorsHoldsEveryRecordedTensor) {
  const fs::path path = kGoldenDir / "golden.safetensors";
  if (!fs::exists(path)) GTEST_SKIP() << path << " absent (run validation/make_gpt2_golden.py)";
  SafetensorsFile f(path.string());
  EXPECT_TRUE(f.metadata().count("torch_version"));
  EXPECT_TRUE(f.metadata().count("transformers_version"));

  Tensor tokens = f.load("tokens");
  EXPECT_EQ(tokens.dtype(), DType::I32);
  EXPECT_EQ(tokens.shape(), (Shape{3, 2, 17}));
  for (double t : tokens.to_doubles()) EXPECT_TRUE(t >= 0 && t < 1000);
  EXPECT_EQ(f.entry("logits").shape, (Shape{2, 16, 1000}));

  // A random init (std 0.02) gives near-uniform predictions: loss ≈ ln 1000.
  for (double loss : f.load("losses").to_doubles()) EXPECT_NEAR(loss, std::log(1000.0), 0.1);
  const auto lrs = f.load("lrs").to_doubles();
  ASSERT_EQ(lrs.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(lrs[i], schedule_lr(i + 1));
  for (double n : f.load("grad_norms").to_doubles()) EXPECT_GT(n, 0.0);

  for (const auto& [name, shape] : expected_golden_params()) {
    EXPECT_EQ(f.entry("grad." + name).shape, shape) << name;
    EXPECT_EQ(f.entry("final." + name).shape, shape) << name;
  }
}

// ------------------------------------------------------------- HF config

TEST(IoHfConfig, ReadsTheGoldenConfig) {
  const fs::path path = kGoldenDir / "config.json";
  if (!fs::exists(path)) GTEST_SKIP() << path << " absent";
  for (const std::string& p : {path.string(), kGoldenDir.string()}) {
    SCOPED_TRACE(p);
    const HfGpt2Config c = read_hf_gpt2_config(p);
    EXPECT_EQ(c.vocab_size, 1000);
    EXPECT_EQ(c.n_positions, 32);
    EXPECT_EQ(c.n_embd, 64);
    EXPECT_EQ(c.n_layer, 2);
    EXPECT_EQ(c.n_head, 4);
    EXPECT_EQ(c.n_inner, 256);  // null in the file
    EXPECT_DOUBLE_EQ(c.layer_norm_epsilon, 1e-5);
    EXPECT_EQ(c.activation_function, "gelu_new");
    EXPECT_TRUE(c.tie_word_embeddings);
    EXPECT_DOUBLE_EQ(c.initializer_range, 0.02);
  }
}

TEST_F(IoTest, HfConfigRoundTripsAndDefaultsMissingKeys) {
  HfGpt2Config c;
  c.vocab_size = 50304;
  c.n_embd = 96;
  c.n_head = 3;
  c.n_inner = 0;
  c.layer_norm_epsilon = 1e-6;
  c.activation_function = "gelu";
  c.tie_word_embeddings = false;
  write_hf_gpt2_config(file("config.json"), c);
  const HfGpt2Config back = read_hf_gpt2_config(file("config.json"));
  EXPECT_EQ(back.vocab_size, 50304);
  EXPECT_EQ(back.n_embd, 96);
  EXPECT_EQ(back.n_head, 3);
  EXPECT_EQ(back.n_inner, 384);
  EXPECT_EQ(back.n_layer, 12);
  EXPECT_DOUBLE_EQ(back.layer_norm_epsilon, 1e-6);
  EXPECT_EQ(back.activation_function, "gelu");
  EXPECT_FALSE(back.tie_word_embeddings);
  const auto j = nlohmann::json::parse(read_all(file("config.json")));
  EXPECT_EQ(j["model_type"], "gpt2");
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"GPT2LMHeadModel"}));

  std::ofstream(file("min.json")) << R"({"model_type":"gpt2","n_embd":32,"n_head":2})";
  const HfGpt2Config d = read_hf_gpt2_config(file("min.json"));
  EXPECT_EQ(d.vocab_size, 50257);
  EXPECT_EQ(d.n_positions, 1024);
  EXPECT_EQ(d.n_inner, 128);
}

TEST_F(IoTest, HfConfigErrorsNameTheFileAndKey) {
  auto bad = [&](const std::string& text, std::vector<std::string> needles) {
    std::ofstream(file("bad.json")) << text;
    needles.push_back("bad.json");
    expect_user_error([&] { read_hf_gpt2_config(file("bad.json")); }, needles);
  };
  bad(R"({"model_type":"bert"})", {"bert"});
  bad(R"({"n_head":"4"})", {"n_head"});
  bad(R"({"n_layer":0})", {"n_layer"});
  bad(R"({"n_embd":64,"n_head":5})", {"n_embd", "n_head"});
  bad(R"({"n_embd":64,)", {"JSON"});
  expect_user_error([&] { read_hf_gpt2_config(file("absent.json")); }, {"absent.json"});
}
