#include "core/phase.h"

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
}  // namespace

void set_phase(const std::string& phase) {
  std::lock_guard<std::mutex> lock(phase_mutex());
  phase_text() = phase;
}

std::string current_phase() {
  std::lock_guard<std::mutex> lock(phase_mutex());
  return phase_text();
}

}  // namespace rlhf
