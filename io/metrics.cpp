#include "io/metrics.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

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
}

}  // namespace rlhf::io
