// meshtron preprocess: text -> Megatron-LM indexed dataset (PREFIX.bin/.idx).
//
//   mpirun -np 4 meshtron preprocess --input data/brown.jsonl
//       --output-prefix data/brown_text_document --tokenizer gpt2
//       --vocab-file data/encoder.json --merge-file data/vocab.bpe --append-eod
//   (one command line)
//
// Steps:
//  1. Every rank parses the options and maps every input file read-only.
//  2. The inputs, concatenated in the order given, are cut into one contiguous
//     byte range per rank. A document belongs to the rank whose range holds
//     its first byte, so every document is read by exactly one rank and the
//     ranks' documents, taken in rank order, are all documents in input order.
//  3. Each rank tokenizes its documents (--workers-per-rank threads, one
//     tokenizer each) and writes them in order to the shard PREFIX.shard<r>.
//  4. Bad input (invalid UTF-8, bad JSON, missing key, non-string value) stops
//     a rank at its first bad document. The ranks then agree on the error
//     with the lowest input position and all throw it, so the job prints one
//     line naming file:line, and the unfinalized shards delete themselves.
//  5. Rank 0 concatenates the shards in rank order (merge_indexed_datasets)
//     and deletes them. The output is therefore byte-identical for any number
//     of ranks and workers. One rank writes PREFIX directly.
//
// A failure to write a shard or the merged output on some rank is made
// collective the same way (the lowest failing rank's message, on all ranks).
//
// Documents are written as Megatron-LM's tools/preprocess_data.py writes them
// (one sequence per document; an empty text gives an empty document with no
// EOD), so its files and ours agree byte for byte. With a tokenizer that
// starts documents with BOS (sentencepiece, as Megatron's Llama2Tokenizer)
// every document, even an empty one, is BOS + its ids [+ EOD].
//
// --split-sentences (Megatron's, which uses NLTK punkt; here the rule-based
// data::split_sentences) writes one sequence per sentence with the document
// boundaries in the .idx: a sentence without ids is dropped, --append-eod
// extends the last sentence, BOS starts every sentence (Megatron tokenizes
// each sentence alone), and a document without ids is an empty document.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "app/commands.hpp"
#include "common/error.hpp"
#include "data/gpt2_tokenizer.hpp"
#include "data/indexed_dataset.hpp"
#include "data/json_line.hpp"
#include "data/sentence_splitter.hpp"
#include "data/tokenizer.hpp"

namespace meshtron::app {
namespace {

namespace fs = std::filesystem;
namespace po = boost::program_options;
using Clock = std::chrono::steady_clock;

constexpr const char* kInputFormatHelp =
    "Input formats (chosen by file name):\n"
    "  *.jsonl, *.json  JSON lines: one JSON object per line, the document is the\n"
    "                   string under --json-key; blank lines are ignored\n"
    "  anything else    plain UTF-8 text: documents are separated by one or more\n"
    "                   blank (empty or white-space only) lines; a document is its\n"
    "                   lines joined by '\\n'\n"
    "Invalid UTF-8, a line that is not a JSON object, a missing key or a value\n"
    "that is not a string stops the run with FILE:LINE. Output is PREFIX.bin and\n"
    "PREFIX.idx (Megatron-LM MMIDIDX, uint16 tokens for GPT-2), identical for any\n"
    "number of ranks and workers.\n";

// ------------------------------------------------------------- options ---

struct PreprocessOptions {
  std::vector<std::string> inputs;
  std::string output_prefix;
  std::string tokenizer;
  std::string vocab_file;
  std::string merge_file;
  std::string tokenizer_file;
  std::string tokenizer_model;
  std::string json_key = "text";
  bool append_eod = false;
  bool split_sentences = false;
  bool overwrite = false;
  int workers_per_rank = 1;
  double log_interval_s = 30.0;
  bool help = false;
};

po::options_description option_table(PreprocessOptions& o) {
  po::options_description d("meshtron preprocess options");
  d.add_options()
      ("input", po::value(&o.inputs)->multitoken(), "input files, read in this order")
      ("output-prefix", po::value(&o.output_prefix), "write PREFIX.bin and PREFIX.idx")
      ("tokenizer", po::value(&o.tokenizer),
       "tokenizer type: gpt2 (alias GPT2BPETokenizer), hf (a tokenizer.json), "
       "sentencepiece (alias Llama2Tokenizer), bert_wordpiece_lowercase (alias "
       "BertWordPieceLowerCase) or bert_wordpiece_cased (alias BertWordPieceCase)")
      ("vocab-file", po::value(&o.vocab_file),
       "encoder.json (or Hugging Face vocab.json); vocab.txt for bert_wordpiece_*")
      ("merge-file", po::value(&o.merge_file), "vocab.bpe (or Hugging Face merges.txt)")
      ("tokenizer-file", po::value(&o.tokenizer_file), "Hugging Face tokenizer.json (for hf)")
      ("tokenizer-model", po::value(&o.tokenizer_model),
       "SentencePiece tokenizer.model (for sentencepiece)")
      ("json-key", po::value(&o.json_key)->default_value("text"), "key of the text in JSON lines")
      ("append-eod", po::bool_switch(&o.append_eod),
       "append the end-of-document token (<|endoftext|>, </s>) to every non-empty document")
      ("split-sentences", po::bool_switch(&o.split_sentences),
       "one sequence per sentence (rule-based English splitter), documents kept in the .idx")
      ("workers-per-rank", po::value(&o.workers_per_rank)->default_value(1),
       "tokenizer threads per MPI rank")
      ("overwrite", po::bool_switch(&o.overwrite), "replace an existing PREFIX.bin/.idx")
      ("log-interval", po::value(&o.log_interval_s)->default_value(30.0),
       "seconds between progress lines when stdout is not a terminal")
      ("help,h", po::bool_switch(&o.help), "print this help");
  return d;
}

std::string usage_text(const po::options_description& table) {
  std::ostringstream out;
  out << "usage: meshtron preprocess --input FILE [FILE ...] --output-prefix P\n"
         "         --tokenizer gpt2 --vocab-file V --merge-file M [--json-key text]\n"
         "         (or --tokenizer hf --tokenizer-file tokenizer.json,\n"
         "          or --tokenizer sentencepiece --tokenizer-model tokenizer.model)\n"
         "         (or --tokenizer bert_wordpiece_lowercase --vocab-file vocab.txt)\n"
         "         [--append-eod] [--split-sentences] [--workers-per-rank 1] [--overwrite]\n\n"
      << table << "\n" << kInputFormatHelp;
  return out.str();
}

data::TokenizerFiles tokenizer_files(const PreprocessOptions& o) {
  return {.type = o.tokenizer,
          .vocab_file = o.vocab_file,
          .merge_file = o.merge_file,
          .tokenizer_file = o.tokenizer_file,
          .tokenizer_model = o.tokenizer_model};
}

/// Checks every option; the messages are identical on every rank.
void validate(const PreprocessOptions& o) {
  MESH_REQUIRE(!o.inputs.empty(), "preprocess: --input FILE [FILE ...] is required");
  MESH_REQUIRE(!o.output_prefix.empty(), "preprocess: --output-prefix is required");
  MESH_REQUIRE(!o.tokenizer.empty(),
               "preprocess: --tokenizer is required (gpt2, hf or sentencepiece)");
  const std::string type = data::canonical_tokenizer_type(o.tokenizer);
  MESH_REQUIRE(!type.empty() || o.tokenizer == "SentencePieceTokenizer",
               "preprocess: unknown --tokenizer '" << o.tokenizer
                                                   << "' (supported: gpt2, hf, sentencepiece, "
                                                      "bert_wordpiece_lowercase, bert_wordpiece_cased)");
  if (type == "hf") {
    MESH_REQUIRE(!o.tokenizer_file.empty(), "preprocess: --tokenizer-file is required for hf");
  } else if (type == "sentencepiece") {
    MESH_REQUIRE(!o.tokenizer_model.empty(),
                 "preprocess: --tokenizer-model is required for sentencepiece");
  } else if (data::is_bert_wordpiece(type)) {
    MESH_REQUIRE(!o.vocab_file.empty(), "preprocess: --vocab-file (vocab.txt) is required for "
                                            << o.tokenizer);
  } else if (type == "gpt2") {
    MESH_REQUIRE(!o.vocab_file.empty(), "preprocess: --vocab-file is required for gpt2");
    MESH_REQUIRE(!o.merge_file.empty(), "preprocess: --merge-file is required for gpt2");
  }
  MESH_REQUIRE(!o.json_key.empty(), "preprocess: --json-key must not be empty");
  MESH_REQUIRE(o.workers_per_rank >= 1 && o.workers_per_rank <= 1024,
               "preprocess: --workers-per-rank must be in [1, 1024], got "
               << o.workers_per_rank);
  MESH_REQUIRE(o.log_interval_s > 0, "preprocess: --log-interval must be positive");
  for (const std::string& input : o.inputs)
    MESH_REQUIRE(fs::is_regular_file(input), "preprocess: input '" << input
                 << "' is not a readable file");
  const fs::path parent = fs::path(o.output_prefix).parent_path();
  MESH_REQUIRE(parent.empty() || fs::is_directory(parent), "preprocess: output folder '"
               << parent.string() << "' does not exist");
}

PreprocessOptions parse_options(const std::vector<std::string>& args) {
  PreprocessOptions o;
  const po::options_description table = option_table(o);
  try {
    po::variables_map vm;
    po::store(po::command_line_parser(args).options(table).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UserError(std::string("preprocess: ") + e.what() +
                    " (run meshtron preprocess --help)");
  }
  if (o.help) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) std::fputs(usage_text(table).c_str(), stdout);
    return o;
  }
  validate(o);
  return o;
}

// ---------------------------------------------------------- MPI helpers ---

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

std::string broadcast_string(std::string text, int root) {
  std::uint64_t size = text.size();
  MPI_CHECK(MPI_Bcast(&size, 1, MPI_UINT64_T, root, MPI_COMM_WORLD));
  text.resize(size);
  MPI_CHECK(MPI_Bcast(text.data(), int(size), MPI_CHAR, root, MPI_COMM_WORLD));
  return text;
}

/// Runs `work` on every rank; if it throws UserError on any rank (a file one
/// rank cannot write), every rank throws the message of the lowest such rank,
/// so that the job still ends with one line and no rank waits for a peer.
template <class Work>
void collectively(Work&& work) {
  std::string error;
  int failed = world_size();
  try {
    work();
  } catch (const UserError& e) {
    error = e.what();
    failed = world_rank();
  }
  int first = 0;
  MPI_CHECK(MPI_Allreduce(&failed, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (first < world_size()) throw UserError(broadcast_string(std::move(error), first));
}

/// Deletes this rank's shard files: explicitly after the merge, or when an
/// error unwinds the command. Disarmed when there are no shards.
class ShardCleanup {
 public:
  ShardCleanup(std::string prefix, bool armed) : prefix_(std::move(prefix)), armed_(armed) {}
  ~ShardCleanup() { remove_now(); }
  void remove_now() {
    if (!armed_) return;
    std::error_code ignored;
    fs::remove(data::bin_file_path(prefix_), ignored);
    fs::remove(data::idx_file_path(prefix_), ignored);
    armed_ = false;
  }
  ShardCleanup(const ShardCleanup&) = delete;
  ShardCleanup& operator=(const ShardCleanup&) = delete;

 private:
  std::string prefix_;
  bool armed_;
};

/// Refuses to replace an existing dataset without --overwrite. Rank 0 looks,
/// so every rank decides alike even where file systems lag.
void check_output_is_free(const PreprocessOptions& o) {
  const std::string bin = data::bin_file_path(o.output_prefix);
  const std::string idx = data::idx_file_path(o.output_prefix);
  int exists = 0;
  if (world_rank() == 0) exists = fs::exists(bin) || fs::exists(idx);
  MPI_CHECK(MPI_Bcast(&exists, 1, MPI_INT, 0, MPI_COMM_WORLD));
  MESH_REQUIRE(!exists || o.overwrite, "preprocess: '" << bin << "' or '" << idx
               << "' already exists (pass --overwrite to replace it)");
}

// -------------------------------------------------------------- inputs ---

struct InputFile {
  std::string path;
  bool json_lines = false;
  data::MappedFile map;
  std::uint64_t base = 0;  ///< Offset of the first byte in the concatenated input.

  std::string_view bytes() const {
    return {reinterpret_cast<const char*>(map.data()), map.size()};
  }
};

bool is_json_lines_path(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  return ext == ".jsonl" || ext == ".json";
}

std::vector<InputFile> map_inputs(const std::vector<std::string>& paths) {
  std::vector<InputFile> files;
  std::uint64_t base = 0;
  for (const std::string& path : paths) {
    InputFile f;
    f.path = path;
    f.json_lines = is_json_lines_path(path);
    f.map = data::MappedFile(path);
    f.base = base;
    base += f.map.size();
    files.push_back(std::move(f));
  }
  return files;
}

std::uint64_t total_bytes(const std::vector<InputFile>& files) {
  return files.empty() ? 0 : files.back().base + files.back().map.size();
}

/// Line number (1-based) of byte `offset` of `bytes`.
std::uint64_t line_number_at(std::string_view bytes, std::size_t offset) {
  return 1 + std::uint64_t(std::count(bytes.begin(), bytes.begin() + offset, '\n'));
}

// ------------------------------------------------------ document scanner ---

/// A document as found in the input, before decoding.
struct RawDocument {
  std::size_t file = 0;
  std::size_t offset = 0;  ///< Of its first byte in the file.
  std::string_view bytes;  ///< The JSON line, or the text itself.
};

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r\f\v") == std::string_view::npos;
}

std::string_view strip_cr(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

std::size_t line_end(std::string_view b, std::size_t start) {
  const std::size_t nl = b.find('\n', start);
  return nl == std::string_view::npos ? b.size() : nl;
}

/// Start of the first line that begins at or after `pos`.
std::size_t line_start_at_or_after(std::string_view b, std::size_t pos) {
  if (pos == 0) return 0;
  const std::size_t nl = b.find('\n', pos - 1);
  return nl == std::string_view::npos ? b.size() : nl + 1;
}

/// Whether the line before the one starting at `start` is blank (true at the
/// file start): decides whether a non-blank line there begins a document.
bool line_before_is_blank(std::string_view b, std::size_t start) {
  if (start == 0) return true;
  const std::size_t prev_end = start - 1;  // the '\n' ending the previous line
  const std::size_t nl = prev_end == 0 ? std::string_view::npos : b.rfind('\n', prev_end - 1);
  const std::size_t prev_start = nl == std::string_view::npos ? 0 : nl + 1;
  return is_blank(b.substr(prev_start, prev_end - prev_start));
}

/// Yields, in input order, the documents whose first byte lies in one rank's
/// byte range [begin, end) of the concatenated inputs.
class DocumentScanner {
 public:
  DocumentScanner(const std::vector<InputFile>& files, std::uint64_t begin, std::uint64_t end)
      : files_(files), begin_(begin), end_(end) {
    seek_file(0);
  }

  bool next(RawDocument& doc) {
    while (file_ < files_.size()) {
      if (files_[file_].json_lines ? next_json_line(doc) : next_text_document(doc)) return true;
      seek_file(file_ + 1);
    }
    return false;
  }

  /// Global offset the scan has reached (for progress).
  std::uint64_t position() const {
    return file_ < files_.size() ? files_[file_].base + pos_ : end_;
  }

 private:
  /// Moves to file `f`, at the first line start inside this rank's range.
  void seek_file(std::size_t f) {
    for (file_ = f; file_ < files_.size(); ++file_) {
      const InputFile& in = files_[file_];
      const std::uint64_t size = in.map.size();
      if (in.base + size <= begin_ || size == 0) continue;
      if (in.base >= end_) { file_ = files_.size(); return; }
      const std::size_t local_begin = begin_ > in.base ? std::size_t(begin_ - in.base) : 0;
      stop_ = std::size_t(std::min<std::uint64_t>(end_ - in.base, size));
      pos_ = line_start_at_or_after(in.bytes(), local_begin);
      prev_blank_ = line_before_is_blank(in.bytes(), pos_);
      return;
    }
  }

  bool next_json_line(RawDocument& doc) {
    const std::string_view b = files_[file_].bytes();
    while (pos_ < stop_) {
      const std::size_t start = pos_, end = line_end(b, start);
      pos_ = end + 1;
      const std::string_view line = b.substr(start, end - start);
      if (is_blank(line)) continue;
      doc = {file_, start, strip_cr(line)};
      return true;
    }
    return false;
  }

  /// A document starts at a non-blank line after a blank one (or at the file
  /// start) and runs to its last non-blank line, even past this rank's range.
  bool next_text_document(RawDocument& doc) {
    const std::string_view b = files_[file_].bytes();
    while (pos_ < stop_) {
      const std::size_t start = pos_, end = line_end(b, start);
      pos_ = end + 1;
      const bool blank = is_blank(b.substr(start, end - start));
      const bool starts_document = !blank && prev_blank_;
      prev_blank_ = blank;
      if (!starts_document) continue;  // a separator, or the tail of another rank's document
      std::size_t doc_end = end;
      while (pos_ < b.size()) {
        const std::size_t next_end = line_end(b, pos_);
        if (is_blank(b.substr(pos_, next_end - pos_))) break;
        doc_end = next_end;
        pos_ = next_end + 1;
      }
      doc = {file_, start, strip_cr(b.substr(start, doc_end - start))};
      return true;
    }
    return false;
  }

  const std::vector<InputFile>& files_;  // Not owned.
  std::uint64_t begin_, end_;
  std::size_t file_ = 0;
  std::size_t pos_ = 0;   ///< Next line start in the current file.
  std::size_t stop_ = 0;  ///< Documents must start before this offset.
  bool prev_blank_ = true;
};

// ------------------------------------------------------------ encoding ---

/// The first bad input a rank saw: where (for ordering and the line number)
/// and what. The message gets its "file:line: " prefix once the ranks agree.
struct InputError {
  std::size_t file = 0;
  std::size_t offset = 0;  ///< Of the offending line in the file.
  std::string what;
};

struct EncodedDocument {
  std::vector<std::int32_t> tokens;
  std::vector<std::int64_t> sentence_lengths;  ///< --split-sentences: one per sequence
  std::optional<InputError> error;
};

/// Offset of the first line of `doc` that is not valid UTF-8.
std::size_t first_invalid_utf8_line(const RawDocument& doc) {
  std::size_t start = 0;
  while (start < doc.bytes.size()) {
    const std::size_t end = line_end(doc.bytes, start);
    if (!data::is_valid_utf8(doc.bytes.substr(start, end - start))) return doc.offset + start;
    start = end + 1;
  }
  return doc.offset;
}

/// The text of a JSON line, or the reason it has none.
std::optional<std::string> text_of_json_line(std::string_view line, const std::string& key,
                                             std::string& why) {
  const std::optional<nlohmann::json> parsed = data::parse_json_line(line, why);
  if (!parsed) return std::nullopt;
  const nlohmann::json& object = *parsed;
  if (!object.is_object()) {
    why = std::string("expected a JSON object, found ") + object.type_name();
    return std::nullopt;
  }
  const auto it = object.find(key);
  if (it == object.end()) {
    why = "no key \"" + key + "\" in the JSON object";
    return std::nullopt;
  }
  if (!it->is_string()) {
    why = "the value of \"" + key + "\" is " + it->type_name() + ", not a string";
    return std::nullopt;
  }
  return it->get<std::string>();
}

/// One sequence per sentence that has ids; the EOD extends the last one.
void encode_sentences(std::string_view text, bool append_eod, data::Tokenizer& tokenizer,
                      EncodedDocument& out) {
  for (const std::string& sentence : data::split_sentences(text)) {
    const std::size_t before = out.tokens.size();
    if (tokenizer.bos_id() >= 0) out.tokens.push_back(tokenizer.bos_id());
    tokenizer.encode_append(sentence, out.tokens);
    if (out.tokens.size() > before) out.sentence_lengths.push_back(std::int64_t(out.tokens.size() - before));
  }
  if (append_eod && !out.tokens.empty()) {
    out.tokens.push_back(tokenizer.eod_id());
    ++out.sentence_lengths.back();
  }
}

EncodedDocument encode_document(const RawDocument& doc, bool json_lines,
                                const PreprocessOptions& o, data::Tokenizer& tokenizer) {
  EncodedDocument out;
  if (!data::is_valid_utf8(doc.bytes)) {
    out.error = InputError{doc.file, first_invalid_utf8_line(doc), "invalid UTF-8"};
    return out;
  }
  std::string_view text = doc.bytes;
  std::string json_text, why;
  if (json_lines) {
    std::optional<std::string> value = text_of_json_line(doc.bytes, o.json_key, why);
    if (!value) {
      out.error = InputError{doc.file, doc.offset, why};
      return out;
    }
    json_text = std::move(*value);
    text = json_text;
  }
  if (o.split_sentences) {
    encode_sentences(text, o.append_eod, tokenizer, out);
    return out;
  }
  if (tokenizer.bos_id() >= 0) out.tokens.push_back(tokenizer.bos_id());
  tokenizer.encode_append(text, out.tokens);
  // As Megatron: a document without ids (an empty text, no BOS) gets no EOD.
  if (o.append_eod && !out.tokens.empty()) out.tokens.push_back(tokenizer.eod_id());
  return out;
}

/// One tokenizer per worker thread (Gpt2Tokenizer is not thread-safe).
/// The first is loaded on the calling thread so that a bad vocabulary file
/// throws its UserError on every rank alike.
std::vector<std::unique_ptr<data::Tokenizer>> load_tokenizers(const PreprocessOptions& o) {
  std::vector<std::unique_ptr<data::Tokenizer>> tokenizers;
  tokenizers.push_back(data::load_tokenizer(tokenizer_files(o)));
  MESH_REQUIRE(!o.append_eod || tokenizers.front()->eod_id() >= 0,
               "preprocess: --append-eod needs an end-of-document token, and '"
                   << (!o.tokenizer_model.empty() ? o.tokenizer_model
                       : !o.tokenizer_file.empty() ? o.tokenizer_file : o.vocab_file)
                   << "' has none (<|endoftext|>, <|end_of_text|>, </s>, <eos>)");
  tokenizers.resize(std::size_t(o.workers_per_rank));
  std::vector<std::thread> threads;
  for (std::size_t w = 1; w < tokenizers.size(); ++w)
    threads.emplace_back([&, w] { tokenizers[w] = data::load_tokenizer(tokenizer_files(o)); });
  for (auto& t : threads) t.join();
  return tokenizers;
}

/// Encodes `batch` into `out` (same order), spreading documents over the
/// workers; documents are independent, so the result does not depend on
/// which worker took which.
void encode_batch(const std::vector<RawDocument>& batch, const std::vector<InputFile>& files,
                  const PreprocessOptions& o,
                  std::vector<std::unique_ptr<data::Tokenizer>>& tokenizers,
                  std::vector<EncodedDocument>& out) {
  out.assign(batch.size(), {});
  std::atomic<std::size_t> next{0};
  auto work = [&](data::Tokenizer& tokenizer) {
    for (std::size_t i = next++; i < batch.size(); i = next++)
      out[i] = encode_document(batch[i], files[batch[i].file].json_lines, o, tokenizer);
  };
  if (tokenizers.size() == 1 || batch.size() == 1) {
    work(*tokenizers.front());
    return;
  }
  std::vector<std::thread> threads;
  for (std::size_t w = 1; w < tokenizers.size(); ++w)
    threads.emplace_back(work, std::ref(*tokenizers[w]));
  work(*tokenizers.front());
  for (auto& t : threads) t.join();
}

// ------------------------------------------------------------ progress ---

struct RankCounts {
  std::uint64_t documents = 0;
  std::uint64_t empty_documents = 0;
  std::uint64_t tokens = 0;
};

/// Rank 0's progress through its own share, extrapolated to the job (the
/// shares are equal in bytes). Redrawn in place on a terminal, else a plain
/// line every --log-interval seconds. (Open MPI gives its ranks a
/// pseudo-terminal even when mpirun's output goes to a file, so under mpirun
/// the line is redrawn in place there too.)
class ProgressLine {
 public:
  ProgressLine(bool enabled, double interval_s, std::uint64_t share_bytes, int ranks)
      : enabled_(enabled), tty_(::isatty(STDOUT_FILENO) == 1),
        interval_s_(tty_ ? 0.5 : interval_s), share_bytes_(share_bytes), ranks_(ranks),
        start_(Clock::now()), last_(start_) {}

  void update(std::uint64_t done_bytes, const RankCounts& counts) {
    if (!enabled_) return;
    const auto now = Clock::now();
    if (std::chrono::duration<double>(now - last_).count() < interval_s_) return;
    last_ = now;
    const double s = std::chrono::duration<double>(now - start_).count();
    const double percent = share_bytes_ ? 100.0 * double(done_bytes) / double(share_bytes_) : 100.0;
    std::printf("%spreprocess: %5.1f%%  %llu documents  %llu tokens  ~%.0f tokens/s  ~%.2f MB/s"
                " (rank 0 x %d ranks)%s",
                tty_ ? "\r\x1b[K" : "", percent, (unsigned long long)counts.documents,
                (unsigned long long)counts.tokens, ranks_ * double(counts.tokens) / s,
                ranks_ * double(done_bytes) / s / 1e6, ranks_, tty_ ? "" : "\n");
    std::fflush(stdout);
    drawn_ = true;
  }

  /// Ends a line redrawn in place so that the summary starts on its own.
  void finish() {
    if (enabled_ && tty_ && drawn_) std::printf("\n");
  }

 private:
  bool enabled_, tty_;
  double interval_s_;
  std::uint64_t share_bytes_;
  int ranks_;
  Clock::time_point start_, last_;
  bool drawn_ = false;
};

// ------------------------------------------------------------ one rank ---

struct RankResult {
  RankCounts counts;
  std::optional<InputError> error;
  double encode_s = 0;
};

/// Tokenizes this rank's documents into `writer` (left unfinalized), stopping
/// at the first bad one.
RankResult encode_share(const std::vector<InputFile>& files, std::uint64_t begin,
                        std::uint64_t end, const PreprocessOptions& o,
                        std::vector<std::unique_ptr<data::Tokenizer>>& tokenizers,
                        data::IndexedDatasetWriter& writer) {
  // Batches of about 1 MB per worker keep threads busy and memory small.
  const std::size_t batch_bytes = std::size_t(1) << 20;
  const auto start = Clock::now();
  RankResult result;
  ProgressLine progress(world_rank() == 0, o.log_interval_s, end - begin, world_size());
  DocumentScanner scanner(files, begin, end);
  std::vector<RawDocument> batch;
  std::vector<EncodedDocument> encoded;
  RawDocument doc;
  bool more = true;
  while (more && !result.error) {
    batch.clear();
    std::size_t bytes = 0;
    while (bytes < batch_bytes * tokenizers.size() && (more = scanner.next(doc))) {
      batch.push_back(doc);
      bytes += doc.bytes.size();
    }
    encode_batch(batch, files, o, tokenizers, encoded);
    for (EncodedDocument& e : encoded) {
      if (e.error) {
        result.error = std::move(e.error);
        break;
      }
      if (e.tokens.empty()) {
        writer.end_document();  // an empty document, as Megatron writes it
        ++result.counts.empty_documents;
      } else if (o.split_sentences) {
        writer.add_document(e.tokens, e.sentence_lengths);
      } else {
        writer.add_document(e.tokens);
      }
      ++result.counts.documents;
      result.counts.tokens += e.tokens.size();
    }
    progress.update(std::min(scanner.position(), end) - begin, result.counts);
  }
  progress.finish();
  result.encode_s = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

/// The error every rank throws: the lowest input position any rank reported.
void throw_first_error_of_any_rank(const std::vector<InputFile>& files,
                                   const std::optional<InputError>& mine) {
  const std::uint64_t none = std::numeric_limits<std::uint64_t>::max();
  const std::uint64_t position = mine ? files[mine->file].base + mine->offset : none;
  std::vector<std::uint64_t> positions(static_cast<std::size_t>(world_size()));
  MPI_CHECK(MPI_Allgather(&position, 1, MPI_UINT64_T, positions.data(), 1, MPI_UINT64_T,
                          MPI_COMM_WORLD));
  const auto lowest = std::min_element(positions.begin(), positions.end());
  if (*lowest == none) return;
  const int owner = int(lowest - positions.begin());
  std::string message;
  if (world_rank() == owner) {
    const InputFile& f = files[mine->file];
    message = MESH_MSG(f.path << ":" << line_number_at(f.bytes(), mine->offset) << ": "
                              << mine->what);
  }
  throw UserError(broadcast_string(std::move(message), owner));
}

std::string shard_prefix(const std::string& prefix, int rank) {
  return prefix + ".shard" + std::to_string(rank);
}

/// Rank 0 concatenates the shards in rank order; every rank learns whether
/// it worked.
void merge_shards(const std::string& prefix, int ranks) {
  collectively([&] {
    if (world_rank() != 0) return;
    std::vector<std::string> shards;
    for (int r = 0; r < ranks; ++r) shards.push_back(shard_prefix(prefix, r));
    data::merge_indexed_datasets(shards, prefix);
  });
}

// ------------------------------------------------------------- summary ---

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void print_summary(const PreprocessOptions& o, const RankCounts& totals, std::uint64_t bytes,
                   double total_s, double load_s, double encode_s, double merge_s,
                   data::TokenDType dtype) {
  const double mb = double(bytes) / 1e6;
  std::printf("preprocess: %llu documents (%llu empty), %llu tokens (%s%s), %.2f MB of input"
              " in %.2f s: %.0f tokens/s, %.2f MB/s on %d rank(s) x %d worker(s)\n",
              (unsigned long long)totals.documents, (unsigned long long)totals.empty_documents,
              (unsigned long long)totals.tokens, data::token_dtype_name(dtype),
              o.append_eod ? ", EOD appended" : "", mb, total_s,
              double(totals.tokens) / total_s, mb / total_s, world_size(), o.workers_per_rank);
  std::printf("preprocess: wrote %s and %s (tokenizer load %.2f s, encode %.2f s, merge %.2f s)\n",
              data::bin_file_path(o.output_prefix).c_str(),
              data::idx_file_path(o.output_prefix).c_str(), load_s, encode_s, merge_s);
  std::fflush(stdout);
}

RankCounts sum_over_ranks(const RankCounts& mine) {
  std::uint64_t local[3] = {mine.documents, mine.empty_documents, mine.tokens};
  std::uint64_t total[3] = {};
  MPI_CHECK(MPI_Allreduce(local, total, 3, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD));
  return {total[0], total[1], total[2]};
}

double max_over_ranks(double mine) {
  double out = 0;
  MPI_CHECK(MPI_Allreduce(&mine, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  return out;
}

}  // namespace

int run_preprocess(const std::vector<std::string>& args) {
  const PreprocessOptions o = parse_options(args);
  if (o.help) return 0;
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  const auto start = Clock::now();
  const int rank = world_rank(), ranks = world_size();

  // 1. Inputs, output check and tokenizers: the same on every rank.
  check_output_is_free(o);
  const std::vector<InputFile> files = map_inputs(o.inputs);
  std::vector<std::unique_ptr<data::Tokenizer>> tokenizers = load_tokenizers(o);
  const double load_s = max_over_ranks(seconds_since(start));
  const data::TokenDType dtype = data::optimal_token_dtype(tokenizers.front()->vocab_size());

  // 2-3. This rank's byte range, tokenized into its shard (or, alone, the output).
  const std::uint64_t bytes = total_bytes(files);
  const std::uint64_t begin = bytes * std::uint64_t(rank) / std::uint64_t(ranks);
  const std::uint64_t end = bytes * std::uint64_t(rank + 1) / std::uint64_t(ranks);
  const std::string my_prefix = ranks == 1 ? o.output_prefix : shard_prefix(o.output_prefix, rank);
  ShardCleanup cleanup(my_prefix, /*armed=*/ranks > 1);
  std::optional<data::IndexedDatasetWriter> writer;
  RankResult result;
  collectively([&] {
    writer.emplace(my_prefix, dtype);
    result = encode_share(files, begin, end, o, tokenizers, *writer);
  });

  // 4. One error for the whole job; the unfinalized writer removes its files.
  throw_first_error_of_any_rank(files, result.error);
  collectively([&] { writer->finalize(); });
  const double encode_s = max_over_ranks(result.encode_s);

  // 5. Shards concatenated in rank order, then deleted.
  const auto merge_start = Clock::now();
  if (ranks > 1) merge_shards(o.output_prefix, ranks);
  cleanup.remove_now();
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));  // no rank returns while shards remain
  const double merge_s = seconds_since(merge_start);

  const RankCounts totals = sum_over_ranks(result.counts);
  if (rank == 0)
    print_summary(o, totals, bytes, seconds_since(start), load_s, encode_s, merge_s, dtype);
  return 0;
}

}  // namespace meshtron::app
