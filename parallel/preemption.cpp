#include "parallel/preemption.h"

#include <mpi.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstring>

#include "core/phase.h"
#include "parallel/comm.h"

namespace rlhf::parallel {

namespace {

volatile std::sig_atomic_t g_signal = 0;
int g_rank = -1;  // this process's world rank, for the handler's line

// Appends s to buf at *at (bounded by n). Async-signal-safe.
void put(char* buf, size_t n, size_t* at, const char* s) {
  for (; *s != '\0' && *at + 1 < n; ++s) buf[(*at)++] = *s;
}

// One line on stderr, at once (the process may be killed next — by a second signal, or by a
// launcher ending the job after another rank died): which rank, which signal, and the phase it
// was in, so a job ended from outside says what it was doing. Async-signal-safe.
void note_signal(int sig) {
  char line[512], phase[256], num[16];
  size_t at = 0, k = 0;
  int r = g_rank < 0 ? 0 : g_rank;
  do {
    num[k++] = char('0' + r % 10);
    r /= 10;
  } while (r > 0 && k < sizeof(num));
  put(line, sizeof(line), &at, "rlhf rank ");
  while (k > 0 && at + 1 < sizeof(line)) line[at++] = num[--k];
  put(line, sizeof(line), &at, ": ");
  put(line, sizeof(line), &at, signal_name(sig));
  put(line, sizeof(line), &at, " received");
  copy_phase_signal_safe(phase, sizeof(phase));
  if (phase[0] != '\0') {
    put(line, sizeof(line), &at, " during ");
    put(line, sizeof(line), &at, phase);
  }
  put(line, sizeof(line), &at, "\n");
  ssize_t ignored = write(STDERR_FILENO, line, at);
  (void)ignored;
}

void on_signal(int sig) {
  if (g_signal != 0) return;
  g_signal = sig;
  note_signal(sig);
}

void on_fatal_signal(int sig) {
  note_signal(sig);
  signal(sig, SIG_DFL);
  raise(sig);
}

void remember_rank() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
}

}  // namespace

void install_fault_note_handlers() {
  remember_rank();
  for (int sig : {SIGTERM, SIGUSR1}) {
    struct sigaction sa = {};
    sa.sa_handler = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_RESETHAND;
    sigaction(sig, &sa, nullptr);
  }
}

void install_preemption_handlers() {
  remember_rank();
  for (int sig : {SIGTERM, SIGUSR1}) {
    struct sigaction sa = {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    // SA_RESETHAND: the second signal takes the default action (ends the process).
    sa.sa_flags = SA_RESTART | SA_RESETHAND;
    sigaction(sig, &sa, nullptr);
  }
}

int preemption_signal() {
  return int(g_signal);
}

int agree_preemption(Comm& comm) {
  const int32_t mine = int32_t(g_signal);
  int32_t any = 0;
  comm.all_reduce(&mine, &any, 1, DType::kInt32, ReduceOp::kMax);
  return int(any);
}

const char* signal_name(int signal) {
  switch (signal) {
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGINT:
      return "SIGINT";
    default:
      return "a signal";
  }
}

}  // namespace rlhf::parallel
