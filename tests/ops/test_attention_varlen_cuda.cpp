// Packed-row (varlen) attention on the GPU kernels against the CPU varlen op on identical bf16
// inputs: forward output, backward dq/dk/dv (fed the GPU's own out and lse), determinism of the
// backward, and the positions contract (lo_t = t − pos[t]).
#include <vector>

#include "model/ops/attention.h"
#include "tests/ops/cuda_test_util.h"

using namespace rlhf;

TEST_CASE("attention varlen cuda: packed samples match the CPU varlen op") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  // Sample lengths cross the 16-row query tiles, the 32-key tiles and the 32-key dk/dv blocks,
  // and include 1-token samples and a sample that starts mid-tile.
  const std::vector<std::vector<int32_t>> layouts = {{5, 1, 70, 13}, {33, 1, 1, 31, 64}, {17}};
  for (int64_t D : {8, 48})
    for (const auto& len : layouts) {
      const int64_t H = 4, Hkv = 2, n = int64_t(len.size());
      std::vector<int32_t> cu = {0}, pos;
      int64_t att_elems = 0;
      for (int32_t l : len) {
        cu.push_back(cu.back() + l);
        for (int32_t t = 0; t < l; ++t) pos.push_back(t);
        att_elems += H * l * l;
      }
      const int64_t N = cu.back(), nq = N * H * D, nkv = N * Hkv * D;
      const std::string name = fmt::format("varlen D={} samples={}", D, n);
      const auto q = test::random_bf16_values(nq, 1), k = test::random_bf16_values(nkv, 2),
                 v = test::random_bf16_values(nkv, 3), dout = test::random_bf16_values(nq, 4);
      std::vector<float> out_ref(nq), att(att_elems), dq_ref(nq), dk_ref(nkv), dv_ref(nkv);
      model::attention_forward_varlen_cpu(out_ref.data(), att.data(), q.data(), k.data(), v.data(),
                                          cu.data(), n, H, Hkv, D);
      model::attention_backward_varlen_cpu(dq_ref.data(), dk_ref.data(), dv_ref.data(), dout.data(),
                                           att.data(), q.data(), k.data(), v.data(), cu.data(), n,
                                           H, Hkv, D);
      test::TestStream s;
      test::DeviceBuffer<test::bf16> d_q(test::to_bf16(q)), d_k(test::to_bf16(k)),
          d_v(test::to_bf16(v)), d_out(nq), d_dout(test::to_bf16(dout)), d_dq(nq), d_dk(nkv),
          d_dv(nkv), d_dq2(nq), d_dk2(nkv), d_dv2(nkv);
      test::DeviceBuffer<float> d_lse(H * N);
      test::DeviceBuffer<int32_t> d_pos(pos);
      model::attention_forward_varlen_cuda(d_out.get(), d_lse.get(), d_q.get(), d_k.get(),
                                           d_v.get(), d_pos.get(), N, H, Hkv, D, s.get());
      for (auto* g : {&d_dq, &d_dq2}) {
        const bool first = g == &d_dq;
        model::attention_backward_varlen_cuda(g->get(), (first ? d_dk : d_dk2).get(),
                                              (first ? d_dv : d_dv2).get(), d_dout.get(),
                                              d_out.get(), d_lse.get(), d_q.get(), d_k.get(),
                                              d_v.get(), d_pos.get(), N, H, Hkv, D, s.get());
      }
      s.sync();
      // Bounds of tests/ops/test_attention_cuda.cpp: one bf16 rounding of the outputs; backward
      // 5e-5 (a token that sees another sample's keys gives nmse 1e-2 or more).
      test::check_nmse(name + " out", test::download_f32(d_out), out_ref, test::kNmseBf16Out);
      const auto dq = test::download_f32(d_dq), dk = test::download_f32(d_dk),
                 dv = test::download_f32(d_dv);
      test::check_nmse(name + " dq", dq, dq_ref, 5e-5);
      test::check_nmse(name + " dk", dk, dk_ref, 5e-5);
      test::check_nmse(name + " dv", dv, dv_ref, 5e-5);
      CHECK(test::download_f32(d_dq2) == dq);  // no atomics: the same bits
      CHECK(test::download_f32(d_dk2) == dk);
      CHECK(test::download_f32(d_dv2) == dv);
      CHECK(d_out.guards_intact());
      CHECK(d_dk.guards_intact());
    }
#endif
}
