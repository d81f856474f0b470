// tests/test_guard.h: a test binary ends with a failure, never hangs. Each case runs this very
// binary (/proc/self/exe) on one hostile case and checks its exit status and message:
//  - an exception escaping a std::thread (std::terminate): status 3, the case and the exception
//    named;
//  - an exception escaping an OpenMP parallel region: the same;
//  - a case that blocks forever, with RLHF_TEST_CASE_TIMEOUT=1: status 4, the case named.
// The hostile cases do nothing unless RLHF_TEST_GUARD_HOSTILE names them.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

namespace {

bool hostile(const char* which) {
  const char* v = std::getenv("RLHF_TEST_GUARD_HOSTILE");
  return v != nullptr && std::string(v) == which;
}

struct Outcome {
  int status = -1;
  std::string output;
};

// Runs this binary on test case `name` with `env` prepended (as "A=1 B=2"), under `timeout 60`.
Outcome run_self(const std::string& name, const std::string& env) {
  const std::string cmd = "env " + env + " timeout 60 /proc/" + std::to_string(getpid()) +
                          "/exe -tc='" + name + "' 2>&1";
  Outcome o;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) o.output.append(buf.data(), n);
  const int st = pclose(p);
  o.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return o;
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("test guard hostile: throw from a thread") {
  if (!hostile("thread")) return;
  std::thread([] { throw std::runtime_error("thrown in a thread"); }).join();
}

TEST_CASE("test guard hostile: throw from an OpenMP region") {
  if (!hostile("omp")) return;
#pragma omp parallel num_threads(2)
  { throw std::runtime_error("thrown in an OpenMP region"); }
}

TEST_CASE("test guard hostile: block forever") {
  if (!hostile("block")) return;
  std::mutex mu;
  std::condition_variable cv;
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [] { return false; });
}

TEST_CASE("test guard: an exception escaping a thread or OpenMP region fails the binary") {
  const Outcome t =
      run_self("test guard hostile: throw from a thread", "RLHF_TEST_GUARD_HOSTILE=thread");
  CHECK(t.status == 3);
  CHECK(has(t.output, "std::terminate in test case \"test guard hostile: throw from a thread"));
  CHECK(has(t.output, "thrown in a thread"));
  const Outcome o = run_self("test guard hostile: throw from an OpenMP region",
                             "RLHF_TEST_GUARD_HOSTILE=omp OMP_NUM_THREADS=2");
  CHECK(o.status == 3);
  CHECK(has(o.output, "thrown in an OpenMP region"));
}

TEST_CASE("test guard: a test case past RLHF_TEST_CASE_TIMEOUT fails the binary") {
  const Outcome b = run_self("test guard hostile: block forever",
                             "RLHF_TEST_GUARD_HOSTILE=block RLHF_TEST_CASE_TIMEOUT=1");
  CHECK(b.status == 4);
  CHECK(has(b.output, "test case \"test guard hostile: block forever"));
  CHECK(has(b.output, "RLHF_TEST_CASE_TIMEOUT"));
}
