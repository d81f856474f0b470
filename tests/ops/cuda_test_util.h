// Helpers for the CUDA-vs-CPU op tests (docs/design.md, "Conventions: ops"; ggml's test-backend-ops
// habits): guarded device buffers (sentinel regions before and after every allocation, checked
// after the op), bf16 host conversions, and an nmse gate that prints the worst element llm.c-style.
//
// The test cases are always compiled and registered; their bodies are under #ifdef RLHF_CUDA and
// start with RLHF_SKIP_WITHOUT_CUDA_DEVICE(), so CI without a GPU reports them as skipped.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "tests/test_util.h"

/// Ends the current test case with MESSAGE("skipped: no CUDA device") when no device is usable
/// (always the case when built without CUDA).
#define RLHF_SKIP_WITHOUT_CUDA_DEVICE()     \
  do {                                      \
    if (::rlhf::cuda_device_count() == 0) { \
      MESSAGE("skipped: no CUDA device");   \
      return;                               \
    }                                       \
  } while (0)

#ifdef RLHF_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "model/config.h"
#include "model/local_provider.h"

namespace rlhf::test {

using bf16 = __nv_bfloat16;

/// Host fp32 -> bf16 (round to nearest even) and back.
inline bf16 to_bf16(float x) {
  return __float2bfloat16_rn(x);
}
inline float to_f32(bf16 x) {
  return __bfloat162float(x);
}
inline std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = to_bf16(v[i]);
  return r;
}
inline std::vector<float> to_f32(const std::vector<bf16>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = to_f32(v[i]);
  return r;
}
/// Rounds every element to the nearest bf16 (in place) and returns it: the CPU reference then
/// sees exactly the values the GPU reads.
inline std::vector<float> round_bf16(std::vector<float> v) {
  for (auto& x : v) x = to_f32(to_bf16(x));
  return v;
}
/// Uniform random values in [lo, hi), rounded to bf16.
inline std::vector<float> random_bf16_values(int64_t n, uint64_t seed, double lo = -1.0,
                                             double hi = 1.0) {
  return round_bf16(random_vec<float>(n, seed, lo, hi));
}

/// A stream created for one test (the ops take explicit streams; the default stream is not used).
class TestStream {
 public:
  TestStream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~TestStream() { (void)cudaStreamDestroy(s_); }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  cudaStream_t get() const { return s_; }
  void sync() const { CUDA_CHECK(cudaStreamSynchronize(s_)); }

 private:
  cudaStream_t s_ = nullptr;
};

/// A device array of n elements of T with kGuardBytes of sentinel bytes (0xA5) before and after
/// it. The interior starts filled with 0xFF bytes (NaN for bf16 and fp32), so an output element
/// that an op forgets to write shows up as NaN. guards_intact() re-reads both guards.
/// upload(), download() and guards_intact() first wait for all device work
/// (cudaDeviceSynchronize): their cudaMemcpy runs on the legacy default stream, which does not
/// wait for the non-blocking streams the ops under test run on.
template <typename T>
class DeviceBuffer {
 public:
  static constexpr size_t kGuardBytes = 1024;  // keeps the interior 256-byte aligned
  static constexpr unsigned char kSentinel = 0xA5;

  explicit DeviceBuffer(int64_t n) : n_(n) {
    const size_t bytes = 2 * kGuardBytes + static_cast<size_t>(n) * sizeof(T);
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    base_ = static_cast<unsigned char*>(p);
    CUDA_CHECK(cudaMemset(base_, kSentinel, kGuardBytes));
    CUDA_CHECK(cudaMemset(base_ + kGuardBytes, 0xFF, static_cast<size_t>(n) * sizeof(T)));
    CUDA_CHECK(cudaMemset(base_ + kGuardBytes + static_cast<size_t>(n) * sizeof(T), kSentinel,
                          kGuardBytes));
  }
  explicit DeviceBuffer(const std::vector<T>& host)
      : DeviceBuffer(static_cast<int64_t>(host.size())) {
    upload(host);
  }
  ~DeviceBuffer() { (void)cudaFree(base_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() { return reinterpret_cast<T*>(base_ + kGuardBytes); }
  const T* get() const { return reinterpret_cast<const T*>(base_ + kGuardBytes); }
  int64_t size() const { return n_; }

  void upload(const std::vector<T>& host) {
    REQUIRE(static_cast<int64_t>(host.size()) == n_);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(static_cast<size_t>(n_));
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(host.data(), get(), host.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  /// True if both guard regions still hold the sentinel.
  bool guards_intact() const {
    std::vector<unsigned char> g(kGuardBytes);
    CUDA_CHECK(cudaDeviceSynchronize());
    for (size_t off : {size_t{0}, kGuardBytes + static_cast<size_t>(n_) * sizeof(T)}) {
      CUDA_CHECK(cudaMemcpy(g.data(), base_ + off, kGuardBytes, cudaMemcpyDeviceToHost));
      for (unsigned char c : g)
        if (c != kSentinel) return false;
    }
    return true;
  }

 private:
  unsigned char* base_ = nullptr;
  int64_t n_ = 0;
};

/// Download as fp32 (bf16 widened exactly).
inline std::vector<float> download_f32(const DeviceBuffer<bf16>& b) {
  return to_f32(b.download());
}
inline std::vector<float> download_f32(const DeviceBuffer<float>& b) {
  return b.download();
}

/// Gate of one CUDA output against its CPU reference: both finite, nmse <= bound. Always prints
/// the comparison (worst element, llm.c style) so that a GPU run records the numbers.
inline void check_nmse(const std::string& what, const std::vector<float>& calc,
                       const std::vector<float>& ref, double bound) {
  REQUIRE(calc.size() == ref.size());
  const ArrayCompare c = compare_arrays(calc.data(), ref.data(), static_cast<int64_t>(ref.size()));
  bool ref_finite = true;
  for (float x : ref) ref_finite = ref_finite && std::isfinite(x);
  MESSAGE(c.summary(what) << fmt::format(" (bound {:.1e})", bound));
  CHECK_MESSAGE(ref_finite, what << ": the CPU reference is not finite");
  CHECK_MESSAGE(c.finite, what << ": non-finite values in the CUDA result");
  CHECK_MESSAGE(c.nmse <= bound, what << ": nmse " << c.nmse << " above " << bound);
}

/// Checks the guards of every buffer passed.
template <typename... Bufs>
void check_guards(const std::string& what, const Bufs&... bufs) {
  const bool ok = (bufs.guards_intact() && ...);
  CHECK_MESSAGE(ok, what << ": a sentinel guard region around a device buffer was overwritten");
}

/// The small Llama shape of the GPU model tests: hidden 64, FFN 176, 2 layers, H query and Hkv
/// KV heads, V tokens, 64 positions, special token ids 0.
inline model::ModelConfig small_gpu_config(int64_t H = 4, int64_t Hkv = 2, int64_t V = 256) {
  model::ModelConfig c;
  c.hidden_size = 64;
  c.intermediate_size = 176;
  c.num_hidden_layers = 2;
  c.num_attention_heads = H;
  c.num_key_value_heads = Hkv;
  c.vocab_size = V;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-5;
  c.bos_token_id = c.eos_token_id = c.pad_token_id = 0;
  return c;
}

/// Rounds every parameter of P to the nearest bf16 value, so a CPU (fp32) model and a GPU (bf16)
/// model compute with the same weights.
inline void round_params_bf16(model::LocalParams<float>& P) {
  for (int u = 0; u < P.layout().num_units(); ++u) {
    float* p = P.params(u);
    for (int64_t i = 0; i < P.layout().unit(u).numel; ++i) p[i] = to_f32(to_bf16(p[i]));
  }
}

// nmse bounds shared by the op tests. The CPU reference runs in fp32 on exactly the bf16 values
// the GPU reads, so the difference is the GPU's own rounding:
//  - kNmseBf16Out: outputs rounded once to bf16. Relative rounding error is uniform in ±2^-9, so
//    the expected nmse is (2^-9)²/3 ≈ 1.3e-6; fp32 differences (order of sums, expf vs the CPU's
//    exp) add ~1e-12. 2e-5 leaves 15× margin; a wrong term or index gives 1e-3 or more.
//  - kNmseF32Out: fp32 outputs (statistics, parameter gradients, optimizer state): only summation
//    order and libm differ, relative ~1e-6 at worst (K up to a few thousand), nmse ~1e-12.
inline constexpr double kNmseBf16Out = 2e-5;
inline constexpr double kNmseF32Out = 1e-8;

/// The causal GQA attention's log-sum-exp reference, in double: lse[b, h, t] =
/// log Σ_{s≤t} exp(q_t·k_s / sqrt(D)) for q (B, T, H, D), k (B, T, Hkv, D); query head h reads
/// KV head h / (H / Hkv). (B, H, T) fp32.
inline std::vector<float> naive_attention_lse(const std::vector<float>& q,
                                              const std::vector<float>& k, int64_t B, int64_t T,
                                              int64_t H, int64_t Hkv, int64_t D) {
  std::vector<float> lse(B * H * T);
  const int64_t G = H / Hkv;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> sc(t + 1);
        double m = -INFINITY;
        for (int64_t s = 0; s <= t; ++s) {
          double acc = 0;
          for (int64_t d = 0; d < D; ++d)
            acc += double(q[((b * T + t) * H + h) * D + d]) *
                   double(k[((b * T + s) * Hkv + h / G) * D + d]);
          sc[s] = acc / std::sqrt(double(D));
          m = std::max(m, sc[s]);
        }
        double sum = 0;
        for (double x : sc) sum += std::exp(x - m);
        lse[(b * H + h) * T + t] = static_cast<float>(m + std::log(sum));
      }
  return lse;
}

}  // namespace rlhf::test
#endif  // RLHF_CUDA
