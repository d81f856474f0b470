// cuDNN fused attention (model/ops/cuda/attention_cudnn.cpp) against the CPU op on identical bf16
// inputs: forward output, the saved lse (against a naive double-precision loop), backward
// dq/dk/dv (fed cuDNN's own out and lse, as in training); the lse contract shared with the
// hand-written kernels (cuDNN forward + hand-written backward, and the reverse); and the
// "cannot serve" contract (false, nothing written). Shapes: SmolLM and Llama-3.2-1B heads, MHA,
// MQA, D in {64, 128}, T not a multiple of 64, T = 1, B > 1.
//
// Where cuDNN cannot serve attention (no device, the CUDA emulator, built without cuDNN or the
// cudnn-frontend headers, cuDNN < 9, compute capability < 8.0), the cases report "skipped: cuDNN
// fused attention unavailable (reason)" and return. Lengths that are not a multiple of 128 are
// served on every cuDNN 9 (before 9.15.1 cudnn-frontend adds a padding mask to the backward).
#include "model/ops/attention.h"

#include <cmath>
#include <string>
#include <vector>

#include "tests/ops/cuda_test_util.h"

#if defined(RLHF_CUDA) && defined(RLHF_CUDNN)
#include <cudnn.h>
#endif

using namespace rlhf;

#ifdef RLHF_CUDA
namespace {

// nmse bounds (see kNmseBf16Out in cuda_test_util.h for the one-rounding baseline, ≈1.3e-6):
//  - out: cuDNN rounds P to bf16 before P·V (the graph's bf16 A operand, tensor cores) and rounds
//    out once more: two roundings, ≈2.6e-6 expected; 4e-5 keeps a 15× margin, while a mask, scale
//    or GQA-mapping error gives 1e-3 or more.
//  - lse: fp32 statistics, but cuDNN's kernels use exp2/log2 hardware approximations and may fold
//    the scale into the exponent; 1e-6 allows absolute errors ~1e-3 on lse ~ 3, while a log2
//    base (lse / ln 2) or a missing scale gives 1e-2 or more.
//  - backward: Pᵀ·dO, dSᵀ·Q and dS·K read bf16-rounded P and dS, and dq/dk/dv are rounded once
//    more (≈4e-6 expected, plus Δ from the bf16 out as in attention_backward_cuda); 1e-4 keeps a
//    20× margin, a mask or head-mapping error gives 1e-2 or more.
constexpr double kNmseCudnnOut = 4e-5;
constexpr double kNmseCudnnLse = 1e-6;
constexpr double kNmseCudnnBwd = 1e-4;

std::string shape_name(const char* op, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  return fmt::format("{}(B={},T={},H={},Hkv={},D={})", op, B, T, H, Hkv, D);
}

// Why attention_cudnn_available answered false, as far as the test can tell from outside.
std::string unavailable_reason(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  if (cuda_device_count() == 0) return "no CUDA device";
#ifndef RLHF_CUDNN
  (void)B, (void)T, (void)H, (void)Hkv, (void)D;
  return "built without cuDNN (RLHF_CUDNN)";
#else
  const size_t version = cudnnGetVersion();
  if (version < 90000) return fmt::format("cuDNN {} at run time, need 9.x", version);
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return "cannot query the device";
  }
  if (major < 8)
    return fmt::format("compute capability {}.x < 8.0: {}", major, cuda_device_summary());
  if (version == 91000 || version == 91001)
    return fmt::format("cuDNN {} (9.10.0/9.10.1 have known fused-attention bugs)", version);
  if (T == 1) return "T = 1 (outside cuDNN's fused-attention support)";
  return fmt::format(
      "cuDNN {} built no plan for {} on {}; RLHF_CUDNN_DEBUG=1 prints the failing call", version,
      shape_name("attention", B, T, H, Hkv, D), cuda_device_summary());
#endif
}

// Random bf16 inputs and the CPU reference results for one shape.
struct Reference {
  std::vector<float> q, k, v, dout;
  std::vector<float> out, lse, dq, dk, dv;
};

Reference make_reference(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  const int64_t nq = B * T * H * D, nkv = B * T * Hkv * D;
  Reference r;
  r.q = test::random_bf16_values(nq, 11);
  r.k = test::random_bf16_values(nkv, 12);
  r.v = test::random_bf16_values(nkv, 13);
  r.dout = test::random_bf16_values(nq, 14);
  r.out.resize(nq);
  r.dq.resize(nq);
  r.dk.resize(nkv);
  r.dv.resize(nkv);
  std::vector<float> att(B * H * T * T);
  model::attention_forward_cpu(r.out.data(), att.data(), r.q.data(), r.k.data(), r.v.data(), B, T,
                               H, Hkv, D);
  model::attention_backward_cpu(r.dq.data(), r.dk.data(), r.dv.data(), r.dout.data(), att.data(),
                                r.q.data(), r.k.data(), r.v.data(), B, T, H, Hkv, D);
  r.lse = test::naive_attention_lse(r.q, r.k, B, T, H, Hkv, D);
  return r;
}

// cuDNN forward and backward against the CPU reference.
void check_cudnn_vs_cpu(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  const std::string name = shape_name("attention_cudnn", B, T, H, Hkv, D);
  if (!model::attention_cudnn_available(B, T, H, Hkv, D)) {
    MESSAGE(name << ": not served by cuDNN here (callers fall back to attention_*_cuda): "
                 << unavailable_reason(B, T, H, Hkv, D));
    return;
  }
  const int64_t nq = B * T * H * D, nkv = B * T * Hkv * D;
  const Reference r = make_reference(B, T, H, Hkv, D);

  test::TestStream s;
  test::DeviceBuffer<test::bf16> d_q(test::to_bf16(r.q)), d_k(test::to_bf16(r.k)),
      d_v(test::to_bf16(r.v)), d_out(nq), d_dout(test::to_bf16(r.dout)), d_dq(nq), d_dk(nkv),
      d_dv(nkv);
  test::DeviceBuffer<float> d_lse(B * H * T);
  REQUIRE(model::attention_forward_cudnn(d_out.get(), d_lse.get(), d_q.get(), d_k.get(), d_v.get(),
                                         B, T, H, Hkv, D, s.get()));
  REQUIRE(model::attention_backward_cudnn(d_dq.get(), d_dk.get(), d_dv.get(), d_dout.get(),
                                          d_out.get(), d_lse.get(), d_q.get(), d_k.get(), d_v.get(),
                                          B, T, H, Hkv, D, s.get()));
  s.sync();
  test::check_nmse(name + " out", test::download_f32(d_out), r.out, kNmseCudnnOut);
  test::check_nmse(name + " lse", d_lse.download(), r.lse, kNmseCudnnLse);
  test::check_nmse(name + " dq", test::download_f32(d_dq), r.dq, kNmseCudnnBwd);
  test::check_nmse(name + " dk", test::download_f32(d_dk), r.dk, kNmseCudnnBwd);
  test::check_nmse(name + " dv", test::download_f32(d_dv), r.dv, kNmseCudnnBwd);
  test::check_guards(name, d_q, d_k, d_v, d_out, d_dout, d_dq, d_dk, d_dv, d_lse);
}

// The lse contract is shared: cuDNN's forward feeds the hand-written backward and the
// hand-written forward feeds cuDNN's backward; both lse must agree directly too.
void check_mixed(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  const std::string name = shape_name("attention_cudnn_mixed", B, T, H, Hkv, D);
  if (!model::attention_cudnn_available(B, T, H, Hkv, D)) {
    MESSAGE(name << ": not served by cuDNN here: " << unavailable_reason(B, T, H, Hkv, D));
    return;
  }
  const int64_t nq = B * T * H * D, nkv = B * T * Hkv * D;
  const Reference r = make_reference(B, T, H, Hkv, D);

  test::TestStream s;
  test::DeviceBuffer<test::bf16> d_q(test::to_bf16(r.q)), d_k(test::to_bf16(r.k)),
      d_v(test::to_bf16(r.v)), d_dout(test::to_bf16(r.dout)), d_out_cudnn(nq), d_out_hand(nq),
      d_dq1(nq), d_dk1(nkv), d_dv1(nkv), d_dq2(nq), d_dk2(nkv), d_dv2(nkv);
  test::DeviceBuffer<float> d_lse_cudnn(B * H * T), d_lse_hand(B * H * T);
  REQUIRE(model::attention_forward_cudnn(d_out_cudnn.get(), d_lse_cudnn.get(), d_q.get(), d_k.get(),
                                         d_v.get(), B, T, H, Hkv, D, s.get()));
  model::attention_forward_cuda(d_out_hand.get(), d_lse_hand.get(), d_q.get(), d_k.get(), d_v.get(),
                                B, T, H, Hkv, D, s.get());
  // cuDNN forward -> hand-written backward.
  model::attention_backward_cuda(d_dq1.get(), d_dk1.get(), d_dv1.get(), d_dout.get(),
                                 d_out_cudnn.get(), d_lse_cudnn.get(), d_q.get(), d_k.get(),
                                 d_v.get(), B, T, H, Hkv, D, s.get());
  // hand-written forward -> cuDNN backward.
  REQUIRE(model::attention_backward_cudnn(d_dq2.get(), d_dk2.get(), d_dv2.get(), d_dout.get(),
                                          d_out_hand.get(), d_lse_hand.get(), d_q.get(), d_k.get(),
                                          d_v.get(), B, T, H, Hkv, D, s.get()));
  s.sync();
  test::check_nmse(name + " lse cudnn vs hand-written", d_lse_cudnn.download(),
                   d_lse_hand.download(), kNmseCudnnLse);
  test::check_nmse(name + " dq (cudnn fwd, hand bwd)", test::download_f32(d_dq1), r.dq,
                   kNmseCudnnBwd);
  test::check_nmse(name + " dk (cudnn fwd, hand bwd)", test::download_f32(d_dk1), r.dk,
                   kNmseCudnnBwd);
  test::check_nmse(name + " dv (cudnn fwd, hand bwd)", test::download_f32(d_dv1), r.dv,
                   kNmseCudnnBwd);
  test::check_nmse(name + " dq (hand fwd, cudnn bwd)", test::download_f32(d_dq2), r.dq,
                   kNmseCudnnBwd);
  test::check_nmse(name + " dk (hand fwd, cudnn bwd)", test::download_f32(d_dk2), r.dk,
                   kNmseCudnnBwd);
  test::check_nmse(name + " dv (hand fwd, cudnn bwd)", test::download_f32(d_dv2), r.dv,
                   kNmseCudnnBwd);
  test::check_guards(name, d_q, d_k, d_v, d_dout, d_out_cudnn, d_out_hand, d_dq1, d_dk1, d_dv1,
                     d_dq2, d_dk2, d_dv2, d_lse_cudnn, d_lse_hand);
}

// True if every element still holds the buffer's initial 0xFF bytes (nothing was written).
template <typename T>
bool untouched(const test::DeviceBuffer<T>& b) {
  const std::vector<T> host = b.download();
  const auto* bytes = reinterpret_cast<const unsigned char*>(host.data());
  for (size_t i = 0; i < host.size() * sizeof(T); ++i)
    if (bytes[i] != 0xFF) return false;
  return true;
}

// A problem cuDNN cannot serve: both directions answer false and write nothing.
void check_refused(const std::string& what, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                   int64_t misalign_elems) {
  const int64_t nq = B * T * H * D, nkv = B * T * Hkv * D;
  test::TestStream s;
  // Inputs are never read (nothing may be launched); their contents do not matter.
  test::DeviceBuffer<test::bf16> d_q(nq + 8), d_k(nkv + 8), d_v(nkv + 8), d_dout(nq + 8), d_out(nq),
      d_dq(nq), d_dk(nkv), d_dv(nkv);
  test::DeviceBuffer<float> d_lse(B * H * T);
  const test::bf16* q = d_q.get() + misalign_elems;
  CHECK_MESSAGE(!model::attention_forward_cudnn(d_out.get(), d_lse.get(), q, d_k.get(), d_v.get(),
                                                B, T, H, Hkv, D, s.get()),
                what << ": forward should answer false");
  CHECK_MESSAGE(!model::attention_backward_cudnn(d_dq.get(), d_dk.get(), d_dv.get(), d_dout.get(),
                                                 d_out.get(), d_lse.get(), q, d_k.get(), d_v.get(),
                                                 B, T, H, Hkv, D, s.get()),
                what << ": backward should answer false");
  s.sync();
  CHECK_MESSAGE((untouched(d_out) && untouched(d_lse) && untouched(d_dq) && untouched(d_dk) &&
                 untouched(d_dv)),
                what << ": an output was written although the call answered false");
  test::check_guards(what, d_q, d_k, d_v, d_dout, d_out, d_dq, d_dk, d_dv, d_lse);
}

}  // namespace

// Reports "skipped: cuDNN fused attention unavailable (reason)" and ends the test case when
// cuDNN cannot serve the given (realistic) shape on this machine.
#define RLHF_SKIP_WITHOUT_CUDNN_ATTENTION(B, T, H, Hkv, D)    \
  do {                                                        \
    if (!model::attention_cudnn_available(B, T, H, Hkv, D)) { \
      MESSAGE("skipped: cuDNN fused attention unavailable ("  \
              << unavailable_reason(B, T, H, Hkv, D) << ")"); \
      return;                                                 \
    }                                                         \
  } while (0)
#endif  // RLHF_CUDA

TEST_CASE("attention cudnn vs cpu: forward, lse, backward") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  RLHF_SKIP_WITHOUT_CUDNN_ATTENTION(1, 256, 32, 8, 64);
  check_cudnn_vs_cpu(1, 100, 9, 3, 64);   // SmolLM-135M heads (GQA 3:1), T not a multiple of 64
  check_cudnn_vs_cpu(1, 256, 32, 8, 64);  // Llama-3.2-1B heads (GQA 4:1)
  check_cudnn_vs_cpu(2, 64, 6, 6, 64);    // MHA, B = 2
  check_cudnn_vs_cpu(1, 67, 4, 1, 128);   // MQA, D = 128, partial tiles
  check_cudnn_vs_cpu(1, 129, 8, 2, 128);  // D = 128, T = 2·64 + 1
  check_cudnn_vs_cpu(3, 7, 4, 2, 64);     // odd T, B = 3
  check_cudnn_vs_cpu(2, 1, 2, 1, 64);     // T = 1: never served (the kernels take it)
#endif
}

TEST_CASE("attention cudnn: lse contract shared with the hand-written kernels") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  RLHF_SKIP_WITHOUT_CUDNN_ATTENTION(1, 256, 9, 3, 64);
  check_mixed(1, 256, 9, 3, 64);  // GQA 3:1, D = 64
  check_mixed(2, 67, 4, 1, 128);  // MQA, D = 128, B = 2, T % 128 != 0
#endif
}

TEST_CASE("attention cudnn: unsupported problems answer false and write nothing") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  // Head dims outside the fused engines' surface (D % 8 != 0, D > 128): refused everywhere.
  CHECK_FALSE(model::attention_cudnn_available(1, 9, 4, 2, 13));
  CHECK_FALSE(model::attention_cudnn_available(1, 9, 4, 2, 136));
  check_refused("attention_cudnn(D=13)", 1, 9, 4, 2, 13, 0);
  check_refused("attention_cudnn(D=136)", 1, 9, 4, 2, 136, 0);
  // One position (cudnn-frontend refuses s_q = s_kv = 1): refused everywhere.
  CHECK_FALSE(model::attention_cudnn_available(2, 1, 2, 1, 64));
  // q not 16-byte aligned (offset by one bf16 element): refused before cuDNN is asked.
  check_refused("attention_cudnn(misaligned q)", 1, 9, 4, 2, 64, 1);
  // Bad dimensions throw, as attention_forward_cuda does.
  CHECK_FALSE(model::attention_cudnn_available(1, 9, 3, 2, 64));
  test::TestStream s;
  test::DeviceBuffer<test::bf16> buf(1024);
  test::DeviceBuffer<float> lse(64);
  CHECK_THROWS_AS(model::attention_forward_cudnn(buf.get(), lse.get(), buf.get(), buf.get(),
                                                 buf.get(), 1, 2, 3, 2, 64, s.get()),
                  rlhf::Error);
  CHECK_THROWS_AS(model::attention_backward_cudnn(buf.get(), buf.get(), buf.get(), buf.get(),
                                                  buf.get(), lse.get(), buf.get(), buf.get(),
                                                  buf.get(), 0, 2, 4, 2, 64, s.get()),
                  rlhf::Error);
#endif
}
