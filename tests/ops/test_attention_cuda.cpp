// Causal GQA attention on the GPU (flash-attention style kernels) against the CPU op on identical
// bf16 inputs: forward output, the saved log-sum-exp (against a naive double-precision loop),
// backward dq/dk/dv (fed the GPU's own out and lse, as in training), bitwise determinism of
// backward, and attention_decode over a KV cache against a naive double-precision reference.
// Shapes: stories15M and SmolLM heads, Hkv < H, T = 1, odd T and D, several key/query tiles.
#include "model/ops/attention.h"

#include <cmath>

#include "tests/ops/cuda_test_util.h"

using namespace rlhf;

#ifdef RLHF_CUDA
namespace {

// Backward bound: dq/dk/dv are rounded once to bf16 (≈1.3e-6, see kNmseBf16Out), and Δ_t =
// rowsum(dout ⊙ out) reads the bf16-rounded forward output, which perturbs dS = P ⊙ (dP − Δ) by
// ~2^-9/sqrt(3D) relative: ~1e-7 more. 5e-5 keeps a wide margin; a mask or GQA-mapping error
// gives 1e-2 or more.
constexpr double kNmseAttnBwd = 5e-5;

void check_attention_cuda(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  const std::string name =
      fmt::format("attention_cuda(B={},T={},H={},Hkv={},D={})", B, T, H, Hkv, D);
  const int64_t nq = B * T * H * D, nkv = B * T * Hkv * D;
  const auto q = test::random_bf16_values(nq, 1);
  const auto k = test::random_bf16_values(nkv, 2);
  const auto v = test::random_bf16_values(nkv, 3);
  const auto dout = test::random_bf16_values(nq, 4);
  std::vector<float> out_ref(nq), att(B * H * T * T), dq_ref(nq), dk_ref(nkv), dv_ref(nkv);
  model::attention_forward_cpu(out_ref.data(), att.data(), q.data(), k.data(), v.data(), B, T, H,
                               Hkv, D);
  model::attention_backward_cpu(dq_ref.data(), dk_ref.data(), dv_ref.data(), dout.data(),
                                att.data(), q.data(), k.data(), v.data(), B, T, H, Hkv, D);
  const auto lse_ref = test::naive_attention_lse(q, k, B, T, H, Hkv, D);

  test::TestStream s;
  test::DeviceBuffer<test::bf16> d_q(test::to_bf16(q)), d_k(test::to_bf16(k)),
      d_v(test::to_bf16(v)), d_out(nq), d_dout(test::to_bf16(dout)), d_dq(nq), d_dk(nkv), d_dv(nkv),
      d_dq2(nq), d_dk2(nkv), d_dv2(nkv);
  test::DeviceBuffer<float> d_lse(B * H * T);
  model::attention_forward_cuda(d_out.get(), d_lse.get(), d_q.get(), d_k.get(), d_v.get(), B, T, H,
                                Hkv, D, s.get());
  model::attention_backward_cuda(d_dq.get(), d_dk.get(), d_dv.get(), d_dout.get(), d_out.get(),
                                 d_lse.get(), d_q.get(), d_k.get(), d_v.get(), B, T, H, Hkv, D,
                                 s.get());
  model::attention_backward_cuda(d_dq2.get(), d_dk2.get(), d_dv2.get(), d_dout.get(), d_out.get(),
                                 d_lse.get(), d_q.get(), d_k.get(), d_v.get(), B, T, H, Hkv, D,
                                 s.get());
  s.sync();
  test::check_nmse(name + " out", test::download_f32(d_out), out_ref, test::kNmseBf16Out);
  test::check_nmse(name + " lse", d_lse.download(), lse_ref, test::kNmseF32Out);
  const auto dq = test::download_f32(d_dq), dk = test::download_f32(d_dk),
             dv = test::download_f32(d_dv);
  test::check_nmse(name + " dq", dq, dq_ref, kNmseAttnBwd);
  test::check_nmse(name + " dk", dk, dk_ref, kNmseAttnBwd);
  test::check_nmse(name + " dv", dv, dv_ref, kNmseAttnBwd);
  // No atomics: a second run gives the same bits.
  CHECK(test::compare_arrays(test::download_f32(d_dq2).data(), dq.data(), nq).max_abs_err == 0.0);
  CHECK(test::compare_arrays(test::download_f32(d_dk2).data(), dk.data(), nkv).max_abs_err == 0.0);
  CHECK(test::compare_arrays(test::download_f32(d_dv2).data(), dv.data(), nkv).max_abs_err == 0.0);
  test::check_guards(name, d_q, d_k, d_v, d_out, d_dout, d_dq, d_dk, d_dv, d_dq2, d_dk2, d_dv2,
                     d_lse);
}

// One decoding step: sequence b attends to cache positions s < lens[b]; reference in double.
void check_decode_cuda(int64_t T_max, const std::vector<int32_t>& lens, int64_t H, int64_t Hkv,
                       int64_t D) {
  const int64_t B = static_cast<int64_t>(lens.size());
  const std::string name = fmt::format(
      "attention_decode_cuda(B={},T_max={},lens={},H={},Hkv={},"
      "D={})",
      B, T_max, fmt::join(lens, "/"), H, Hkv, D);
  const int64_t G = H / Hkv;
  const auto q = test::random_bf16_values(B * H * D, 1, -2, 2);
  const auto kc = test::random_bf16_values(B * T_max * Hkv * D, 2, -2, 2);
  const auto vc = test::random_bf16_values(B * T_max * Hkv * D, 3);
  std::vector<float> ref(B * H * D, 0.0f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t len = std::min<int64_t>(lens[b], T_max);
      if (len <= 0) continue;
      std::vector<double> sc(len);
      double m = -INFINITY;
      for (int64_t s = 0; s < len; ++s) {
        double acc = 0;
        for (int64_t d = 0; d < D; ++d)
          acc +=
              double(q[(b * H + h) * D + d]) * double(kc[((b * T_max + s) * Hkv + h / G) * D + d]);
        sc[s] = acc / std::sqrt(double(D));
        m = std::max(m, sc[s]);
      }
      double sum = 0;
      for (auto& x : sc) sum += (x = std::exp(x - m));
      for (int64_t d = 0; d < D; ++d) {
        double o = 0;
        for (int64_t s = 0; s < len; ++s)
          o += sc[s] * double(vc[((b * T_max + s) * Hkv + h / G) * D + d]);
        ref[(b * H + h) * D + d] = static_cast<float>(o / sum);
      }
    }
  const size_t ws_bytes = model::attention_decode_cuda_workspace_bytes(B, H, D, T_max);
  test::TestStream s;
  test::DeviceBuffer<test::bf16> d_q(test::to_bf16(q)), d_k(test::to_bf16(kc)),
      d_v(test::to_bf16(vc)), d_out(B * H * D);
  test::DeviceBuffer<int32_t> d_lens(lens);
  test::DeviceBuffer<float> d_ws(static_cast<int64_t>(ws_bytes / sizeof(float)));
  model::attention_decode_cuda(d_out.get(), d_ws.get(), d_q.get(), d_k.get(), d_v.get(),
                               d_lens.get(), B, T_max, H, Hkv, D, s.get());
  s.sync();
  test::check_nmse(name + " out", test::download_f32(d_out), ref, test::kNmseBf16Out);
  test::check_guards(name, d_q, d_k, d_v, d_out, d_lens, d_ws);
}

}  // namespace
#endif

TEST_CASE("attention cuda vs cpu: forward, lse, backward") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  check_attention_cuda(2, 64, 6, 6, 48);   // stories15M (MHA)
  check_attention_cuda(1, 100, 9, 3, 64);  // SmolLM-135M (GQA 3:1)
  check_attention_cuda(1, 67, 4, 1, 128);  // MQA, D = 128, partial tiles
  check_attention_cuda(1, 257, 2, 1, 64);  // many key and query tiles
  check_attention_cuda(1, 7, 4, 2, 16);    // odd T
  check_attention_cuda(1, 11, 2, 2, 13);   // odd D
  check_attention_cuda(2, 1, 2, 1, 8);     // T = 1
#endif
}

TEST_CASE("attention cuda: decode over a KV cache vs a naive reference") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  check_decode_cuda(300, {1, 257, 300}, 4, 2, 16);  // splits of 256: 1, 2 and 2 used
  check_decode_cuda(1000, {1000, 513}, 9, 3, 64);   // SmolLM heads, 4 splits
  check_decode_cuda(5, {5}, 2, 2, 128);             // D = 128, one short split
  check_decode_cuda(40, {0, 33}, 16, 1, 48);        // len 0 gives zeros; G = 16 (4 per warp)
  check_decode_cuda(2048, {2048}, 32, 8, 64);       // Llama-3.2-1B heads, batch 1
#endif
}
