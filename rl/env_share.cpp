#include "rl/env_share.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <thread>
#include <type_traits>

#include "core/error.h"
#include "parallel/mpi_check.h"
#include "parallel/watchdog.h"

namespace rlhf::rl {

namespace {

// Appends trivially copyable values and arrays to a byte vector.
struct Writer {
  std::vector<uint8_t>& out;
  void append(const void* p, size_t n) {
    if (n == 0) return;
    const size_t at = out.size();
    out.resize(at + n);
    std::memcpy(out.data() + at, p, n);
  }
  template <typename T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    append(&v, sizeof(T));
  }
  template <typename T>
  void put_array(const T* data, size_t n) {
    static_assert(std::is_trivially_copyable_v<T>);
    put(int64_t(n));
    append(data, n * sizeof(T));
  }
};

// Reads what Writer wrote, checking every length against the bytes left.
struct Reader {
  const std::vector<uint8_t>& in;
  size_t at = 0;
  void need(size_t n) const {
    RLHF_CHECK(n <= in.size() - at,
               "internal error: the environment's answers from TP rank 0 are cut short ({} bytes "
               "at offset {} of {})",
               n, at, in.size());
  }
  template <typename T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, in.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  template <typename T>
  std::vector<T> get_array() {
    const int64_t n = get<int64_t>();
    RLHF_CHECK(n >= 0, "internal error: a negative length ({}) in the environment's answers", n);
    need(size_t(n) * sizeof(T));
    std::vector<T> v(static_cast<size_t>(n));
    if (n > 0) std::memcpy(v.data(), in.data() + at, size_t(n) * sizeof(T));
    at += size_t(n) * sizeof(T);
    return v;
  }
};

// MPI_Ibcast from rank 0, completed by polling: a short spin, then sleeps of growing length
// (up to 1 ms), under a WatchScope that names the wait and rank 0.
void watched_bcast(void* buf, int count, MPI_Comm comm, const std::string& comm_name) {
  const parallel::WatchScope watch("broadcast of the environment's answers from TP rank 0",
                                   comm_name);
  if (parallel::comm_rank(comm) != 0) parallel::set_watch_peer(parallel::world_ranks_of(comm)[0]);
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_CHECK(MPI_Ibcast(buf, count, MPI_BYTE, 0, comm, &req));
  auto pause = std::chrono::microseconds(20);
  for (int polls = 0;; ++polls) {
    int flag = 0;
    MPI_CHECK(MPI_Test(&req, &flag, MPI_STATUS_IGNORE));
    if (flag != 0) return;
    if (polls < 100) continue;  // the answer is usually there at once (a builtin environment)
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

}  // namespace

std::vector<uint8_t> encode_turn_answers(const SharedTurnAnswers& a) {
  std::vector<uint8_t> out;
  Writer w{out};
  w.put_array(a.error.data(), a.error.size());
  w.put_array(a.keys.data(), a.keys.size());
  w.put(int64_t(a.answers.size()));
  for (const TurnAnswer& t : a.answers) {
    w.put_array(t.observation.data(), t.observation.size());
    w.put(uint8_t(t.done));
    w.put(uint8_t(t.reward.has_value()));
    w.put(t.reward.value_or(0.0));
  }
  return out;
}

SharedTurnAnswers decode_turn_answers(const std::vector<uint8_t>& bytes) {
  Reader r{bytes};
  SharedTurnAnswers a;
  const std::vector<char> error = r.get_array<char>();
  a.error.assign(error.begin(), error.end());
  a.keys = r.get_array<int64_t>();
  const int64_t n = r.get<int64_t>();
  // Each answer takes at least 18 bytes: a bound before reserving.
  RLHF_CHECK(n >= 0 && size_t(n) <= bytes.size() / 18,
             "internal error: {} answers in {} bytes from TP rank 0", n, bytes.size());
  a.answers.resize(size_t(n));
  for (TurnAnswer& t : a.answers) {
    t.observation = r.get_array<int32_t>();
    t.done = r.get<uint8_t>() != 0;
    const bool has_reward = r.get<uint8_t>() != 0;
    const double reward = r.get<double>();
    if (has_reward) t.reward = reward;
  }
  RLHF_CHECK(r.at == bytes.size(),
             "internal error: {} bytes left over after the environment's answers from TP rank 0",
             bytes.size() - r.at);
  return a;
}

void share_turn_answers(MPI_Comm comm, const std::string& comm_name, SharedTurnAnswers& a) {
  const bool root = parallel::comm_rank(comm) == 0;
  std::vector<uint8_t> bytes;
  if (root) bytes = encode_turn_answers(a);
  int64_t size = int64_t(bytes.size());
  watched_bcast(&size, int(sizeof(size)), comm, comm_name);
  RLHF_CHECK(size >= 0 && size <= INT_MAX,
             "the environment's answers for one engine step take {} bytes, over MPI's 2 GiB "
             "message limit",
             size);
  if (!root) bytes.resize(size_t(size));
  watched_bcast(bytes.data(), int(size), comm, comm_name);
  if (!root) a = decode_turn_answers(bytes);
}

}  // namespace rlhf::rl
