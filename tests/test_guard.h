// Makes a doctest binary end with a failure instead of hanging. Included once by each test main
// (tests/main.cpp, tests/mpi_main.cpp), after doctest.h with DOCTEST_CONFIG_IMPLEMENT:
//  - std::terminate (an exception escaping a destructor, a thread or an OpenMP region; doctest
//    catches only the ones that reach the test case's own frame) prints the test case and the
//    exception and ends the process at once with _exit(kTerminateExit), skipping doctest's signal
//    handler, atexit handlers and static destructors — the paths that can block (a lock held by the
//    thread that threw, a detached thread, MPI_Finalize waiting for peers);
//  - a test case that runs longer than RLHF_TEST_CASE_TIMEOUT seconds (default 900; 0 = none) is
//    named on stderr and the process ends with _exit(kTimeoutExit).
// Under mpiexec a rank that _exits without MPI_Finalize makes mpiexec end the other ranks.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <typeinfo>

namespace rlhf::test::guard {

inline constexpr int kTerminateExit = 3;  ///< exit status after std::terminate
inline constexpr int kTimeoutExit = 4;    ///< exit status after a test case's timeout

struct State {
  std::mutex mu;
  std::string test_case = "(no test case)";
  std::atomic<int64_t> started_ns{0};  // steady-clock start of the running test case; 0: none
};

inline State& state() {
  static State* s = new State();  // never destroyed: used from terminate and the timer thread
  return *s;
}

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline std::string current_case() {
  std::lock_guard<std::mutex> lock(state().mu);
  return state().test_case;
}

/// The terminate handler: names the test case and the exception, then _exit(kTerminateExit).
[[noreturn]] inline void on_terminate() {
  std::string what = "no active exception";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      what = std::string(typeid(x).name()) + ": " + x.what();
    } catch (...) {
      what = "an exception not derived from std::exception";
    }
  }
  std::fprintf(stderr,
               "\nFATAL: std::terminate in test case \"%s\" (%s)\nThe test binary ends here with "
               "status %d instead of unwinding.\n",
               current_case().c_str(), what.c_str(), kTerminateExit);
  std::fflush(stderr);
  std::fflush(stdout);
  _exit(kTerminateExit);
}

/// Records the running test case for on_terminate and the timer.
struct Listener : doctest::IReporter {
  explicit Listener(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData& tc) override {
    {
      std::lock_guard<std::mutex> lock(state().mu);
      state().test_case = std::string(tc.m_name) + " (" + tc.m_file.c_str() + ")";
    }
    state().started_ns = now_ns();
  }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override { state().started_ns = 0; }
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

/// Installs the terminate handler and starts the timer thread (RLHF_TEST_CASE_TIMEOUT).
inline void install() {
  std::set_terminate(on_terminate);
  double limit = 900;
  if (const char* env = std::getenv("RLHF_TEST_CASE_TIMEOUT")) limit = std::atof(env);
  if (limit <= 0) return;
  std::thread([limit] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      const int64_t t0 = state().started_ns.load();
      if (t0 == 0 || double(now_ns() - t0) * 1e-9 < limit) continue;
      std::fprintf(stderr,
                   "\nFATAL: test case \"%s\" has run for more than %.0f s "
                   "(RLHF_TEST_CASE_TIMEOUT); the test binary ends with status %d\n",
                   current_case().c_str(), limit, kTimeoutExit);
      std::fflush(stderr);
      _exit(kTimeoutExit);
    }
  }).detach();
}

}  // namespace rlhf::test::guard

DOCTEST_REGISTER_LISTENER("rlhf_guard", 0, rlhf::test::guard::Listener);
