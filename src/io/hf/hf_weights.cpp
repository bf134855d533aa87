#include "io/hf/hf_weights.hpp"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "common/error.hpp"
#include "io/hf/hf_json.hpp"

namespace meshtron::io {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

std::string shard_name(std::size_t k, std::size_t n) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k, n);
  return name;
}

}  // namespace

void load_shard(Parameter& p, const Tensor& global, int tp_rank, int tp_size) {
  MESH_REQUIRE(global.shape() == p.global_shape,
               "tensor for '" << p.name << "' has shape " << shape_string(global.shape())
                              << ", the model expects " << shape_string(p.global_shape));
  const Tensor src = global.is_host() ? global : global.to_host();
  const index_t n = src.numel();
  // Gather the shard on the host in the parameter's dtype; one copy to a
  // device parameter.
  Tensor shard = p.value.is_host() ? p.value : Tensor::empty(p.value.shape(), p.value.dtype());
  for_each_global_index(p, tp_rank, tp_size, [&](index_t local, index_t g) {
    set_element_from_double(shard, local, g < n ? element_as_double(src, g) : 0.0);
  });
  if (!p.value.is_host()) p.value.copy_from(shard);
}

HfWeights::HfWeights(const std::string& model_dir) : dir_(model_dir) {
  const fs::path index = fs::path(model_dir) / kIndexFile;
  if (!fs::exists(index)) {
    files_.push_back(std::make_unique<SafetensorsFile>((fs::path(model_dir) / kSingleFile).string()));
    for (const auto& e : files_.back()->entries()) where_[e.name] = files_.back().get();
    return;
  }
  const json j = parse_json_file(index.string());
  MESH_REQUIRE(j.contains("weight_map") && j["weight_map"].is_object(),
               index.string() << ": no weight_map object");
  std::map<std::string, const SafetensorsFile*> opened;
  for (const auto& [name, shard] : j["weight_map"].items()) {
    MESH_REQUIRE(shard.is_string(), index.string() << ": weight_map['" << name
                                                   << "'] is not a file name");
    const std::string file = shard.get<std::string>();
    if (!opened.count(file)) {
      files_.push_back(std::make_unique<SafetensorsFile>((fs::path(model_dir) / file).string()));
      opened[file] = files_.back().get();
    }
    MESH_REQUIRE(opened[file]->contains(name), index.string() << ": tensor '" << name
                                                               << "' is not in " << file);
    where_[name] = opened[file];
  }
}

Tensor HfWeights::load(const std::string& name, const std::string& wanted_for) const {
  const auto it = where_.find(name);
  MESH_REQUIRE(it != where_.end(), dir_ << ": missing tensor '" << name << "'"
                                        << (wanted_for.empty() ? "" : " for " + wanted_for));
  return it->second->load(name);
}

std::vector<std::string> HfWeights::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : where_) out.push_back(name);
  return out;
}

void write_hf_weights(const std::string& model_dir,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      std::uint64_t max_shard_bytes) {
  // save_pretrained's split: tensors in order, a new shard when the next
  // one would overflow a non-empty shard.
  std::vector<std::vector<std::pair<std::string, Tensor>>> shards(1);
  std::uint64_t in_shard = 0, total = 0;
  for (const auto& t : tensors) {
    const std::uint64_t bytes = t.second.bytes();
    if (!shards.back().empty() && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += bytes;
    total += bytes;
  }
  fs::create_directories(model_dir);
  const SafetensorsMetadata metadata{{"format", "pt"}};
  // A folder written before keeps no stale layout: transformers prefers an
  // index over model.safetensors.
  fs::remove(fs::path(model_dir) / kIndexFile);
  if (shards.size() == 1) {
    write_safetensors((fs::path(model_dir) / kSingleFile).string(), shards[0], metadata);
    return;
  }
  fs::remove(fs::path(model_dir) / kSingleFile);
  json weight_map = json::object();
  for (std::size_t k = 0; k < shards.size(); ++k) {
    const std::string file = shard_name(k + 1, shards.size());
    write_safetensors((fs::path(model_dir) / file).string(), shards[k], metadata);
    for (const auto& t : shards[k]) weight_map[t.first] = file;
  }
  write_json_file((fs::path(model_dir) / kIndexFile).string(),
                  {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}});
}

Tensor stacked_rows(const std::vector<Tensor>& parts) {
  Shape shape = parts[0].shape();
  shape[0] = 0;
  std::size_t bytes = 0;
  for (const Tensor& p : parts) {
    shape[0] += p.dim(0);
    bytes += std::size_t(p.bytes());
  }
  Tensor out = Tensor::empty(shape, parts[0].dtype());
  MESH_VERIFY(std::size_t(out.bytes()) == bytes,
              "stacked_rows: parts of one dtype and trailing shape");
  auto* dst = static_cast<char*>(out.raw());
  for (const Tensor& p : parts) {
    std::memcpy(dst, p.raw(), p.bytes());
    dst += p.bytes();
  }
  return out;
}

Tensor transposed(const Tensor& t) {
  MESH_VERIFY(t.rank() == 2 && t.is_host(), "transposed: a host matrix, got "
                                                << shape_string(t.shape()));
  const index_t r = t.dim(0), c = t.dim(1);
  const std::size_t size = dtype_size(t.dtype());
  Tensor out = Tensor::empty({c, r}, t.dtype());
  const auto* src = static_cast<const char*>(t.raw());
  auto* dst = static_cast<char*>(out.raw());
  for (index_t i = 0; i < r; ++i)
    for (index_t j = 0; j < c; ++j)
      std::memcpy(dst + std::size_t(j * r + i) * size, src + std::size_t(i * c + j) * size, size);
  return out;
}

}  // namespace meshtron::io
