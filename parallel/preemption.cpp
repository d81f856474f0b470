#include "parallel/preemption.h"

#include <csignal>
#include <cstdint>

#include "parallel/comm.h"

namespace rlhf::parallel {

namespace {

volatile std::sig_atomic_t g_signal = 0;

void on_signal(int sig) {
  if (g_signal == 0) g_signal = sig;
}

}  // namespace

void install_preemption_handlers() {
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
