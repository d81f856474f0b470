#include "io/sharded_ckpt.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/error.h"

namespace rlhf::io {

namespace fs = std::filesystem;

std::string shard_dir(const std::string& index_path) {
  const fs::path p(index_path);
  return (p.parent_path() / (p.stem().string() + "_shards")).string();
}

std::string shard_file_name(int rank, int n_ranks) {
  return fmt::format("rank-{:05d}-of-{:05d}.h5", rank, n_ranks);
}

bool is_sharded_checkpoint(const CheckpointReader& r) {
  return r.exists("/shards") && r.has_attr("/shards", "ranks");
}

uint32_t file_crc32(const std::string& path, int64_t* bytes) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  RLHF_CHECK(f != nullptr, "{}: cannot open for reading", path);
  std::vector<unsigned char> buf(size_t(8) << 20);
  uLong crc = crc32(0L, Z_NULL, 0);
  int64_t total = 0;
  while (true) {
    const size_t n = std::fread(buf.data(), 1, buf.size(), f);
    if (n > 0) crc = crc32_z(crc, buf.data(), n);
    total += int64_t(n);
    if (n < buf.size()) break;
  }
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  RLHF_CHECK(!failed, "{}: read error after {} bytes", path, total);
  if (bytes) *bytes = total;
  return uint32_t(crc);
}

void write_shard_index(CheckpointWriter& w, const nlohmann::json& index) {
  // The index can pass an attribute's 64 KiB (a unit range per rank per unit): a dataset of bytes.
  const std::string text = index.dump();
  w.create_group("/shards");
  w.write_int_attr("/shards", "ranks", index.at("ranks").get<int64_t>());
  w.write_dataset<uint8_t>("/shards/index", reinterpret_cast<const uint8_t*>(text.data()),
                           {int64_t(text.size())});
}

nlohmann::json read_shard_index(const CheckpointReader& r) {
  RLHF_CHECK(r.exists("/shards/index"), "{}: no /shards/index: not a sharded checkpoint", r.path());
  const std::vector<uint8_t> text = r.read_dataset_vector<uint8_t>("/shards/index");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    RLHF_FAIL("{}: /shards/index is not valid JSON ({})", r.path(), e.what());
  }
  RLHF_CHECK(j.is_object() && j.contains("ranks") && j.contains("files") && j.contains("groups"),
             "{}: /shards/index lacks ranks, files or groups", r.path());
  const int64_t n = j["ranks"].get<int64_t>();
  RLHF_CHECK(n >= 1 && j["files"].is_array() && int64_t(j["files"].size()) == n &&
                 n == r.read_int_attr("/shards", "ranks"),
             "{}: /shards/index lists {} files for {} ranks", r.path(), j["files"].size(), n);
  return j;
}

void write_tensor_piece(CheckpointWriter& w, const std::string& dataset, const float* data,
                        int64_t start, int64_t count) {
  w.write_dataset<float>(dataset, data, {count});
  w.write_int_attr(dataset, "start", start);
}

ShardSet::ShardSet(const CheckpointReader& index)
    : index_path_(index.path()), dir_(shard_dir(index.path())), index_(read_shard_index(index)) {
  ranks_ = index_["ranks"].get<int>();
  shards_.resize(size_t(ranks_));
}

ShardSet::~ShardSet() = default;

const CheckpointReader& ShardSet::shard(int r) const {
  auto& s = shards_[size_t(r)];
  if (!s) {
    const std::string name = index_["files"][size_t(r)].at("name").get<std::string>();
    s = std::make_unique<CheckpointReader>((fs::path(dir_) / name).string());
  }
  return *s;
}

bool ShardSet::tensor_shape(const std::string& group, const std::string& name,
                            std::vector<int64_t>* shape) const {
  const nlohmann::json& g = index_["groups"];
  if (!g.contains(group) || !g[group].contains("tensors") || !g[group]["tensors"].contains(name))
    return false;
  *shape = g[group]["tensors"][name].get<std::vector<int64_t>>();
  return true;
}

void ShardSet::read_range(const std::string& dataset, int64_t begin, int64_t count,
                          float* out) const {
  int64_t covered = 0;
  for (int r = 0; r < ranks_ && covered < count; ++r) {
    const CheckpointReader& s = shard(r);
    if (!s.exists(dataset)) continue;
    const int64_t start = s.read_int_attr(dataset, "start");
    const std::vector<int64_t> shape = s.shape(dataset);
    RLHF_CHECK(shape.size() == 1, "{}: piece {} is not 1-D", s.path(), dataset);
    const int64_t lo = std::max(begin, start), hi = std::min(begin + count, start + shape[0]);
    if (lo >= hi) continue;
    s.read_float_range(dataset, lo - start, hi - lo, out + (lo - begin));
    covered += hi - lo;
  }
  RLHF_CHECK(covered == count,
             "{}: elements [{}, {}) of {} are not all in its shards (found {})\nhint: a shard "
             "file of {} is missing or from another checkpoint",
             index_path_, begin, begin + count, dataset, covered, dir_);
}

int64_t ShardSet::verify() const {
  int64_t total = 0;
  for (int r = 0; r < ranks_; ++r) {
    const nlohmann::json& f = index_["files"][size_t(r)];
    const std::string path = (fs::path(dir_) / f.at("name").get<std::string>()).string();
    std::error_code ec;
    RLHF_CHECK(fs::is_regular_file(path, ec), "{}: shard {} is missing", index_path_, path);
    int64_t bytes = 0;
    const uint32_t crc = file_crc32(path, &bytes);
    RLHF_CHECK(bytes == f.at("bytes").get<int64_t>(),
               "{}: shard {} has {} bytes, the index says {}", index_path_, path, bytes,
               f.at("bytes").get<int64_t>());
    RLHF_CHECK(crc == f.at("crc32").get<uint32_t>(),
               "{}: shard {} fails its CRC-32 ({:08x}, the index says {:08x})", index_path_, path,
               crc, f.at("crc32").get<uint32_t>());
    shard(r);  // opens as HDF5
    total += bytes;
  }
  return total;
}

}  // namespace rlhf::io
