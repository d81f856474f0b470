// What the process is doing ("RL step 12, log-probs and training"), for messages of errors that
// happen far from the loop that knows it (a GPU out-of-memory inside a kernel wrapper). Set by the
// training loops through parallel::set_watch_context.
#pragma once

#include <cstddef>
#include <string>

namespace rlhf {

/// Sets the current phase. Thread-safe.
void set_phase(const std::string& phase);

/// The current phase; "" before the first set_phase. Thread-safe.
std::string current_phase();

/// Copies the current phase (at most n - 1 bytes, NUL-terminated; longer phases are cut) into
/// out without locks or allocation, for a signal handler. A set_phase running at the same time
/// may leave a mix of the old and new text: good enough for a last message.
void copy_phase_signal_safe(char* out, size_t n);

}  // namespace rlhf
