#include "data/sentencepiece_tokenizer.hpp"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <filesystem>

#include "common/error.hpp"

namespace meshtron::data {

namespace {

/// A library status as one line.
std::string one_line(const sentencepiece::util::Status& status) {
  std::string text = status.ToString();
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path)
    : path_(model_path), processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  MESH_REQUIRE(std::filesystem::is_regular_file(model_path),
               "cannot open SentencePiece model '" << model_path << "'");
  const sentencepiece::util::Status status = processor_->Load(model_path);
  // A file that is not a model fails to parse with an internal message that
  // names the library's source line; the user needs only the file's name.
  MESH_REQUIRE(status.ok(), "'" << model_path << "' is not a SentencePiece model ("
                                << (status.code() == sentencepiece::util::StatusCode::kInternal
                                        ? std::string("cannot parse it")
                                        : one_line(status))
                                << ")");
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

void SentencePieceTokenizer::encode_append(std::string_view text, std::vector<int32_t>& ids) {
  std::vector<int> encoded;
  const sentencepiece::util::Status status = processor_->Encode(text, &encoded);
  MESH_REQUIRE(status.ok(), "SentencePiece model '" << path_ << "': " << one_line(status));
  ids.insert(ids.end(), encoded.begin(), encoded.end());
}

std::string SentencePieceTokenizer::decode(std::span<const int32_t> ids) const {
  const int32_t size = vocab_size();
  for (const int32_t id : ids)
    MESH_REQUIRE(id >= 0 && id < size, "token id " << id << " is outside the vocabulary [0, "
                                                   << size << ") of '" << path_ << "'");
  std::string text;
  const sentencepiece::util::Status status =
      processor_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  MESH_REQUIRE(status.ok(), "SentencePiece model '" << path_ << "': " << one_line(status));
  return text;
}

int32_t SentencePieceTokenizer::vocab_size() const { return processor_->GetPieceSize(); }
int32_t SentencePieceTokenizer::eod_id() const { return processor_->eos_id(); }
int32_t SentencePieceTokenizer::bos_id() const { return processor_->bos_id(); }
int32_t SentencePieceTokenizer::pad_id() const { return processor_->pad_id(); }
int32_t SentencePieceTokenizer::unk_id() const { return processor_->unk_id(); }

int32_t SentencePieceTokenizer::piece_id(const std::string& piece) const {
  // PieceToId answers <unk>'s id for an unknown piece.
  const int id = processor_->PieceToId(piece);
  return processor_->IdToPiece(id) == piece ? id : -1;
}

}  // namespace meshtron::data
