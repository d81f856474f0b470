#include "core/memory.h"

#include <sys/resource.h>

#include <cstdio>
#include <cstring>

namespace rlhf {

namespace {

// The value of "<key>:  N kB" in /proc/self/status, in bytes; -1 when absent or unreadable.
int64_t status_kb(const char* key) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  int64_t out = -1;
  const size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, key, n) == 0 && line[n] == ':') {
      long long kb = 0;
      if (std::sscanf(line + n + 1, "%lld", &kb) == 1) out = int64_t(kb) * 1024;
      break;
    }
  }
  std::fclose(f);
  return out;
}

}  // namespace

int64_t peak_rss_bytes() {
  const int64_t hwm = status_kb("VmHWM");
  if (hwm >= 0) return hwm;
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

int64_t rss_bytes() {
  const int64_t v = status_kb("VmRSS");
  return v < 0 ? 0 : v;
}

bool reset_peak_rss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

}  // namespace rlhf
