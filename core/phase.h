// What the process is doing ("RL step 12, log-probs and training"), for messages of errors that
// happen far from the loop that knows it (a GPU out-of-memory inside a kernel wrapper). Set by the
// training loops through parallel::set_watch_context.
#pragma once

#include <string>

namespace rlhf {

/// Sets the current phase. Thread-safe.
void set_phase(const std::string& phase);

/// The current phase; "" before the first set_phase. Thread-safe.
std::string current_phase();

}  // namespace rlhf
