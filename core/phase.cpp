#include "core/phase.h"

#include <algorithm>
#include <cstring>
#include <mutex>

namespace rlhf {

namespace {
std::mutex& phase_mutex() {
  static std::mutex* m = new std::mutex();  // never destroyed: used until the end of main
  return *m;
}
std::string& phase_text() {
  static std::string* s = new std::string();
  return *s;
}
// The phase as a fixed C string, for copy_phase_signal_safe.
char g_phase_c[256] = {};
}  // namespace

void set_phase(const std::string& phase) {
  std::lock_guard<std::mutex> lock(phase_mutex());
  phase_text() = phase;
  const size_t n = std::min(phase.size(), sizeof(g_phase_c) - 1);
  std::memcpy(g_phase_c, phase.data(), n);
  g_phase_c[n] = '\0';
}

void copy_phase_signal_safe(char* out, size_t n) {
  if (n == 0) return;
  size_t i = 0;
  for (; i + 1 < n && i + 1 < sizeof(g_phase_c) && g_phase_c[i] != '\0'; ++i) out[i] = g_phase_c[i];
  out[i] = '\0';
}

std::string current_phase() {
  std::lock_guard<std::mutex> lock(phase_mutex());
  return phase_text();
}

}  // namespace rlhf
