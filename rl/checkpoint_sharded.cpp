#include "rl/checkpoint_sharded.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "parallel/failure_injection.h"
#include "parallel/shard_layout.h"
#include "parallel/zero3.h"

namespace rlhf::rl {

namespace fs = std::filesystem;

namespace {

// This rank's element range [begin, end) of unit u for n ranks (ShardLayout's, without padding).
std::pair<int64_t, int64_t> unit_range(const parallel::ShardLayout& sl, int u, int rank) {
  const int64_t numel = sl.layout().unit(u).numel;
  const int64_t off = sl.shard_offset(u, rank);
  return {std::min(off, numel), std::min(off + sl.shard_numel(u), numel)};
}

// Writes the pieces of `unit`'s tensors inside [begin, end); `data` points at element `begin`.
void write_pieces(io::CheckpointWriter& w, const std::string& prefix, const model::UnitLayout& unit,
                  const float* data, int64_t begin, int64_t end) {
  for (const model::TensorInfo& t : unit.tensors) {
    const int64_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
    if (lo < hi)
      io::write_tensor_piece(w, prefix + t.name, data + (lo - begin), lo - t.offset, hi - lo);
  }
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

ShardedCheckpointWriter::ShardedCheckpointWriter(const std::string& index_path,
                                                 parallel::Comm& comm)
    : index_path_(index_path), dir_(io::shard_dir(index_path)), comm_(comm) {
  const std::string tmp = dir_ + ".tmp";
  if (comm_.rank() == 0) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp, ec);
    RLHF_CHECK(!ec, "cannot create the shard folder {}: {}", tmp, ec.message());
  }
  comm_.barrier();
  file_ = std::make_unique<io::CheckpointWriter>(
      (fs::path(tmp) / io::shard_file_name(comm_.rank(), comm_.size())).string());
}

ShardedCheckpointWriter::~ShardedCheckpointWriter() = default;

void ShardedCheckpointWriter::write_slot(const CheckpointSlot& s) {
  RLHF_CHECK(file_ != nullptr, "{}: the shard writer is already finished", index_path_);
  parallel::ParamStore& st = *s.store;
  const model::ParamLayout& layout = st.layout();
  const int n = comm_.size(), rank = comm_.rank();
  const parallel::ShardLayout sl(layout, n);
  auto* z3 = dynamic_cast<parallel::Zero3Store*>(s.store);
  const std::string g = "/" + s.group + "/", og = "/optimizer/" + s.group + "/";
  nlohmann::json tensors = nlohmann::json::object(), units = nlohmann::json::array();
  std::vector<float> full, m, v;
  for (int u = 0; u < layout.num_units(); ++u) {
    const model::UnitLayout& unit = layout.unit(u);
    const auto [begin, end] = unit_range(sl, u, rank);
    const float *p = nullptr, *pm = nullptr, *pv = nullptr;  // each at element `begin`
    if (st.replicated()) {  // every rank holds the unit: write ShardLayout's slice of it
      full.resize(size_t(unit.numel));
      st.gather_unit(u, full.data());
      p = full.data() + begin;
    } else {
      const parallel::UnitShard us = st.unit_shard(u);
      RLHF_CHECK(us.offset == sl.shard_offset(u, rank) && us.count == sl.shard_numel(u),
                 "internal error: {} unit {}: the store's shard [{}, +{}) is not ShardLayout's for "
                 "{} ranks",
                 s.group, unit.name, us.offset, us.count, n);
      p = us.data;
    }
    if (s.optimizer) {
      if (z3 != nullptr) {
        pm = z3->shard_m(u);
        pv = z3->shard_v(u);
      } else {  // local for replicated stores, a gather for device shards (every rank calls it)
        m.resize(size_t(unit.numel));
        v.resize(size_t(unit.numel));
        st.gather_moments(u, m.data(), v.data());
        pm = m.data() + begin;
        pv = v.data() + begin;
      }
    }
    write_pieces(*file_, g, unit, p, begin, end);
    if (s.optimizer) {
      write_pieces(*file_, og + "m/", unit, pm, begin, end);
      write_pieces(*file_, og + "v/", unit, pv, begin, end);
    }
    nlohmann::json ranges = nlohmann::json::array();
    for (int q = 0; q < n; ++q) {
      const auto [b, e] = unit_range(sl, u, q);
      ranges.push_back({b, e - b});
    }
    units.push_back({{"name", unit.name}, {"numel", unit.numel}, {"ranges", ranges}});
    for (const model::TensorInfo& t : unit.tensors) tensors[t.name] = t.shape;
    // A kill in the middle of the write (tests: RLHF_INJECT_FAILURE=checkpoint_write:<rank>).
    if (u == 0) parallel::maybe_inject_failure("checkpoint_write", rank);
  }
  groups_[s.group] = {{"tensors", tensors}, {"units", units}, {"optimizer", s.optimizer}};
}

nlohmann::json ShardedCheckpointWriter::finish() {
  RLHF_CHECK(file_ != nullptr, "{}: the shard writer is already finished", index_path_);
  const int n = comm_.size(), rank = comm_.rank();
  const std::string mine = file_->path();
  file_->commit();
  file_.reset();
  int64_t bytes = 0;
  const uint32_t crc = io::file_crc32(mine, &bytes);
  std::vector<int64_t> local(size_t(2 * n), 0), all(local.size(), 0);
  local[size_t(2 * rank)] = bytes;
  local[size_t(2 * rank + 1)] = int64_t(crc);
  comm_.all_reduce(local.data(), all.data(), int64_t(local.size()));
  if (rank == 0) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
    fs::rename(dir_ + ".tmp", dir_, ec);
    RLHF_CHECK(!ec, "cannot rename {}.tmp to {}: {}", dir_, dir_, ec.message());
    const fs::path parent = fs::path(dir_).parent_path();
    fsync_dir(parent.empty() ? "." : parent.string());
    // Leftovers of writes killed before their rename (never part of a committed checkpoint).
    std::vector<fs::path> stale;
    for (const auto& e : fs::directory_iterator(parent.empty() ? "." : parent, ec)) {
      const std::string name = e.path().filename().string();
      if (name.size() > 11 && name.compare(name.size() - 11, 11, "_shards.tmp") == 0)
        stale.push_back(e.path());
    }
    for (const fs::path& p : stale) fs::remove_all(p, ec);
  }
  nlohmann::json files = nlohmann::json::array();
  for (int q = 0; q < n; ++q)
    files.push_back({{"name", io::shard_file_name(q, n)},
                     {"bytes", all[size_t(2 * q)]},
                     {"crc32", uint32_t(all[size_t(2 * q + 1)])}});
  return {{"ranks", n}, {"files", files}, {"groups", groups_}};
}

void load_sharded_slot(const io::ShardSet& shards, const CheckpointSlot& s) {
  parallel::ParamStore& st = *s.store;
  const model::ParamLayout& layout = st.layout();
  const std::string g = "/" + s.group + "/", og = "/optimizer/" + s.group + "/";
  const nlohmann::json& groups = shards.index()["groups"];
  RLHF_CHECK(groups.contains(s.group), "{}: the shards hold no {} group", shards.index_path(),
             s.group);
  RLHF_CHECK(!s.optimizer || groups[s.group].value("optimizer", false),
             "{}: the shards hold no optimizer moments for {}", shards.index_path(), s.group);
  std::vector<float> full, m, v;
  for (int u = 0; u < layout.num_units(); ++u) {
    const model::UnitLayout& unit = layout.unit(u);
    int64_t begin = 0, end = unit.numel;  // the range this rank's store keeps
    if (!st.replicated()) {
      const parallel::UnitShard us = st.unit_shard(u);
      begin = std::min(us.offset, unit.numel);
      end = std::min(us.offset + us.count, unit.numel);
    }
    // Only [begin, end) is read; the rest of the full-size buffers stays zero (load_unit and
    // load_moments of a sharded store read their own range only).
    full.assign(size_t(unit.numel), 0.0f);
    if (s.optimizer) {
      m.assign(size_t(unit.numel), 0.0f);
      v.assign(size_t(unit.numel), 0.0f);
    }
    for (const model::TensorInfo& t : unit.tensors) {
      const int64_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
      if (lo >= hi) continue;
      shards.read_range(g + t.name, lo - t.offset, hi - lo, full.data() + lo);
      if (!s.optimizer) continue;
      shards.read_range(og + "m/" + t.name, lo - t.offset, hi - lo, m.data() + lo);
      shards.read_range(og + "v/" + t.name, lo - t.offset, hi - lo, v.data() + lo);
    }
    st.load_unit(u, full.data());
    if (s.optimizer) st.load_moments(u, m.data(), v.data());
  }
}

}  // namespace rlhf::rl
