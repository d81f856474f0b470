// This process's resident memory: the peak since start or since the last reset, so that a step's
// own peak can be measured (Linux VmHWM, reset through /proc/self/clear_refs).
#pragma once

#include <cstdint>

namespace rlhf {

/// Peak resident set size in bytes since the process started or since the last successful
/// reset_peak_rss() (Linux /proc/self/status VmHWM); where that file cannot be read, the lifetime
/// peak of getrusage. Never throws.
int64_t peak_rss_bytes();

/// Current resident set size in bytes (/proc/self/status VmRSS; 0 where unreadable). Never throws.
int64_t rss_bytes();

/// Resets the peak to the current resident size (writes "5" to /proc/self/clear_refs, Linux >=
/// 4.0). Returns false where that is not possible (the peak then keeps counting from the start).
bool reset_peak_rss();

}  // namespace rlhf
