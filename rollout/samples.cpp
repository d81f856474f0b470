#include "rollout/samples.h"

#include <algorithm>
#include <cstring>

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
    if (v.empty()) return v;  // memcpy's pointers must not be null, even for 0 bytes
    std::memcpy(v.data(), p, sizeof(T) * v.size());
    p += sizeof(T) * v.size();
    left -= sizeof(T) * v.size();
    return v;
  }
};

}  // namespace

int64_t action_tokens(const Sample& s) {
  if (s.action_mask.empty()) return int64_t(s.response.size());
  int64_t n = 0;
  for (uint8_t m : s.action_mask) n += m != 0;
  return n;
}

namespace {

// The format tag of the multi-turn form (a negative first word; the untagged form starts with
// the sample count).
constexpr int64_t kFormatV2 = -2;
// V3 adds the per-token weight versions and the interrupted flag (partial rollouts).
constexpr int64_t kFormatV3 = -3;

}  // namespace

std::vector<uint8_t> serialize_samples(const std::vector<Sample>& samples) {
  std::vector<uint8_t> b;
  put<int64_t>(b, kFormatV3);
  put<int64_t>(b, int64_t(samples.size()));
  for (const Sample& s : samples) {
    put(b, s.prompt_pos);
    put(b, s.sample_index);
    put<uint8_t>(b, s.stopped ? 1 : 0);
    put_vec(b, s.prompt);
    put_vec(b, s.response);
    put_vec(b, s.gen_logprobs);
    put<uint8_t>(b, uint8_t(s.finish));
    put_vec(b, s.action_mask);
    put<int32_t>(b, s.turns);
    put<uint8_t>(b, s.has_env_reward ? 1 : 0);
    put<double>(b, s.env_reward);
    put_vec(b, s.versions);
    put<uint8_t>(b, s.interrupted ? 1 : 0);
  }
  return b;
}

std::vector<Sample> deserialize_samples(const uint8_t* data, size_t size) {
  Reader r{data, size};
  int64_t n = r.get<int64_t>();
  const bool v3 = n == kFormatV3, v2 = n == kFormatV2 || v3;
  if (v2) n = r.get<int64_t>();
  RLHF_CHECK(n >= 0 && n < (int64_t(1) << 40), "sample buffer malformed");
  std::vector<Sample> out(static_cast<size_t>(n));
  for (Sample& s : out) {
    s.prompt_pos = r.get<int64_t>();
    s.sample_index = r.get<int64_t>();
    s.stopped = r.get<uint8_t>() != 0;
    s.prompt = r.get_vec<int32_t>();
    s.response = r.get_vec<int32_t>();
    s.gen_logprobs = r.get_vec<float>();
    s.finish = s.stopped ? FinishReason::kStop : FinishReason::kLength;
    if (!v2) continue;
    const uint8_t f = r.get<uint8_t>();
    RLHF_CHECK(f <= uint8_t(FinishReason::kMaxTurns), "sample buffer malformed");
    s.finish = FinishReason(f);
    s.action_mask = r.get_vec<uint8_t>();
    RLHF_CHECK(s.action_mask.empty() || s.action_mask.size() == s.response.size(),
               "sample buffer malformed");
    s.turns = r.get<int32_t>();
    s.has_env_reward = r.get<uint8_t>() != 0;
    s.env_reward = r.get<double>();
    if (!v3) continue;
    s.versions = r.get_vec<int32_t>();
    RLHF_CHECK(s.versions.empty() || s.versions.size() == s.response.size(),
               "sample buffer malformed");
    s.interrupted = r.get<uint8_t>() != 0;
  }
  RLHF_CHECK(r.left == 0, "sample buffer has {} trailing bytes", r.left);
  return out;
}

void sort_samples(std::vector<Sample>& samples) {
  std::sort(samples.begin(), samples.end(), [](const Sample& a, const Sample& b) {
    return a.prompt_pos != b.prompt_pos ? a.prompt_pos < b.prompt_pos
                                        : a.sample_index < b.sample_index;
  });
}

std::vector<Sample> gather_samples(const std::vector<Sample>& local, parallel::Comm& comm) {
  const auto parts = comm.all_gather_bytes(serialize_samples(local));
  std::vector<Sample> out;
  for (const auto& bytes : parts) {
    auto part = deserialize_samples(bytes.data(), bytes.size());
    for (Sample& s : part) out.push_back(std::move(s));
  }
  sort_samples(out);
  return out;
}

}  // namespace rlhf::rollout
