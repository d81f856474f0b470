#include "rollout/experience.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace rlhf::rollout {

namespace {

void put_bytes(std::vector<uint8_t>& b, const void* p, size_t n) {
  if (n == 0) return;
  const size_t at = b.size();
  b.resize(at + n);
  std::memcpy(b.data() + at, p, n);
}
template <typename T>
void put(std::vector<uint8_t>& b, const T& v) {
  put_bytes(b, &v, sizeof(T));
}
template <typename T>
void put_vec(std::vector<uint8_t>& b, const std::vector<T>& v) {
  put<int64_t>(b, int64_t(v.size()));
  put_bytes(b, v.data(), sizeof(T) * v.size());
}

struct Reader {
  const uint8_t* p;
  size_t left;
  template <typename T>
  T get() {
    RLHF_CHECK(left >= sizeof(T), "sample buffer truncated");
    T v;
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    left -= sizeof(T);
    return v;
  }
  template <typename T>
  std::vector<T> get_vec() {
    const int64_t n = get<int64_t>();
    RLHF_CHECK(n >= 0 && uint64_t(n) <= left / sizeof(T), "sample buffer malformed");
    std::vector<T> v(static_cast<size_t>(n));
    std::memcpy(v.data(), p, sizeof(T) * v.size());
    p += sizeof(T) * v.size();
    left -= sizeof(T) * v.size();
    return v;
  }
};

}  // namespace

std::vector<uint8_t> serialize_samples(const std::vector<Sample>& samples) {
  std::vector<uint8_t> b;
  put<int64_t>(b, int64_t(samples.size()));
  for (const Sample& s : samples) {
    put(b, s.prompt_pos);
    put(b, s.sample_index);
    put<uint8_t>(b, s.stopped ? 1 : 0);
    put_vec(b, s.prompt);
    put_vec(b, s.response);
    put_vec(b, s.gen_logprobs);
  }
  return b;
}

std::vector<Sample> deserialize_samples(const uint8_t* data, size_t size) {
  Reader r{data, size};
  const int64_t n = r.get<int64_t>();
  RLHF_CHECK(n >= 0 && n < (int64_t(1) << 40), "sample buffer malformed");
  std::vector<Sample> out(static_cast<size_t>(n));
  for (Sample& s : out) {
    s.prompt_pos = r.get<int64_t>();
    s.sample_index = r.get<int64_t>();
    s.stopped = r.get<uint8_t>() != 0;
    s.prompt = r.get_vec<int32_t>();
    s.response = r.get_vec<int32_t>();
    s.gen_logprobs = r.get_vec<float>();
  }
  RLHF_CHECK(r.left == 0, "sample buffer has {} trailing bytes", r.left);
  return out;
}

std::vector<Sample> allgather_samples(const std::vector<Sample>& local, MPI_Comm comm) {
  int n = 0;
  MPI_Comm_size(comm, &n);
  const std::vector<uint8_t> mine = serialize_samples(local);
  RLHF_CHECK(mine.size() < size_t(std::numeric_limits<int>::max()),
             "a rank generated more than 2 GiB of samples in one step");
  int my = int(mine.size());
  std::vector<int> sizes(static_cast<size_t>(n)), displs(static_cast<size_t>(n));
  MPI_Allgather(&my, 1, MPI_INT, sizes.data(), 1, MPI_INT, comm);
  int64_t total = 0;
  for (int j = 0; j < n; ++j) {
    RLHF_CHECK(total + sizes[size_t(j)] < std::numeric_limits<int>::max(),
               "the samples of one step exceed 2 GiB");
    displs[size_t(j)] = int(total);
    total += sizes[size_t(j)];
  }
  std::vector<uint8_t> all(static_cast<size_t>(total));
  MPI_Allgatherv(mine.data(), my, MPI_BYTE, all.data(), sizes.data(), displs.data(), MPI_BYTE,
                 comm);
  std::vector<Sample> out;
  for (int j = 0; j < n; ++j) {
    auto part = deserialize_samples(all.data() + displs[size_t(j)], size_t(sizes[size_t(j)]));
    for (Sample& s : part) out.push_back(std::move(s));
  }
  std::sort(out.begin(), out.end(), [](const Sample& a, const Sample& b) {
    return a.prompt_pos != b.prompt_pos ? a.prompt_pos < b.prompt_pos
                                        : a.sample_index < b.sample_index;
  });
  return out;
}

int64_t Experience::response_tokens() const {
  int64_t n = 0;
  for (int32_t l : resp_len) n += l;
  return n;
}

}  // namespace rlhf::rollout
