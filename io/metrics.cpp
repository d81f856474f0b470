#include "io/metrics.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/log.h"

namespace rlhf::io {

MetricsWriter::MetricsWriter(const std::string& dir, bool truncate, const std::string& file) {
  RLHF_CHECK(!dir.empty(), "empty metrics directory");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  RLHF_CHECK(!ec, "cannot create directory {}: {}", dir, ec.message());
  path_ = (std::filesystem::path(dir) / file).string();
  file_ = std::fopen(path_.c_str(), truncate ? "wb" : "ab");
  RLHF_CHECK(file_ != nullptr, "cannot open {}: {}", path_, std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const nlohmann::json& record) {
  RLHF_CHECK(record.is_object(), "{}: a metrics record must be a JSON object, got {}", path_,
             record.type_name());
  // Invalid UTF-8 in strings is replaced (U+FFFD) rather than thrown.
  std::string line = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  line += '\n';
  errno = 0;
  const bool ok =
      std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0;
  RLHF_CHECK(ok, "cannot write {}: {}", path_, std::strerror(errno));
  if (mirror_) mirror_(record);
}

void trim_records(const std::string& dir, const char* file, int64_t last_step) {
  const std::filesystem::path path = std::filesystem::path(dir) / file;
  if (!std::filesystem::exists(path)) return;
  std::ifstream in(path);
  std::string line, kept;
  int64_t dropped = 0;
  while (std::getline(in, line)) {
    const nlohmann::json r = nlohmann::json::parse(line, nullptr, false);
    if (!r.is_discarded() && r.is_object() && r.value("step", int64_t(-1)) <= last_step &&
        r.value("step", int64_t(-1)) >= 0) {
      kept += line + "\n";
    } else {
      ++dropped;
    }
  }
  in.close();
  if (dropped == 0) return;
  const std::string tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kept;
    RLHF_CHECK(out.good(), "cannot write {}", tmp);
  }
  std::filesystem::rename(tmp, path);
  LOG0_INFO("{}: dropped {} records after step {} (the resumed run writes them again)",
            path.string(), dropped, last_step);
}

}  // namespace rlhf::io
