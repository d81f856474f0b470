// RoPE on the GPU against the CPU op, both pairing styles, forward and backward (the inverse
// rotation), with the same fp32 tables; also in place (out aliasing x) and the round trip
// backward(forward(x)) ≈ x. The packed-QKV split and merge (qkv_rope_split_cuda,
// qkv_rope_merge_backward_cuda) against the CPU rotation of each part and bit-exactly against
// rope_forward_cuda / rope_backward_cuda on the unpacked parts.
#include "model/ops/rope.h"

#include "tests/ops/cuda_test_util.h"

using namespace rlhf;

#ifdef RLHF_CUDA
namespace {

void check_rope_cuda(int64_t N, int64_t H, int64_t D, model::RopeStyle style, double theta) {
  const std::string name = fmt::format("rope_cuda(N={},H={},D={},style={},theta={:g})", N, H, D,
                                       model::to_string(style), theta);
  const int64_t max_pos = 4096;
  std::vector<float> cos(max_pos * D / 2), sin(max_pos * D / 2);
  model::rope_tables_cpu(cos.data(), sin.data(), max_pos, D, theta);
  auto pos = test::random_tokens(N, max_pos, 1);
  pos[0] = 0;
  if (N > 1) pos[N - 1] = static_cast<int32_t>(max_pos - 1);
  const auto x = test::random_bf16_values(N * H * D, 2);
  const auto dout = test::random_bf16_values(N * H * D, 3);
  std::vector<float> out_ref(N * H * D), dx_ref(N * H * D);
  model::rope_forward_cpu(out_ref.data(), x.data(), pos.data(), cos.data(), sin.data(), N, H, D,
                          style);
  model::rope_backward_cpu(dx_ref.data(), dout.data(), pos.data(), cos.data(), sin.data(), N, H, D,
                           style);

  test::TestStream s;
  test::DeviceBuffer<float> d_cos(cos), d_sin(sin);
  test::DeviceBuffer<int32_t> d_pos(pos);
  test::DeviceBuffer<test::bf16> d_x(test::to_bf16(x)), d_out(N * H * D),
      d_dout(test::to_bf16(dout)), d_dx(N * H * D), d_inplace(test::to_bf16(x));
  model::rope_forward_cuda(d_out.get(), d_x.get(), d_pos.get(), d_cos.get(), d_sin.get(), N, H, D,
                           style, s.get());
  model::rope_backward_cuda(d_dx.get(), d_dout.get(), d_pos.get(), d_cos.get(), d_sin.get(), N, H,
                            D, style, s.get());
  model::rope_forward_cuda(d_inplace.get(), d_inplace.get(), d_pos.get(), d_cos.get(), d_sin.get(),
                           N, H, D, style, s.get());
  s.sync();
  const auto out = test::download_f32(d_out);
  test::check_nmse(name + " out", out, out_ref, test::kNmseBf16Out);
  test::check_nmse(name + " dx", test::download_f32(d_dx), dx_ref, test::kNmseBf16Out);
  const auto inplace = test::download_f32(d_inplace);
  CHECK(test::compare_arrays(inplace.data(), out.data(), N * H * D).max_abs_err == 0.0);
  // Round trip: Rᵀ·R = I, up to two bf16 roundings.
  model::rope_backward_cuda(d_inplace.get(), d_inplace.get(), d_pos.get(), d_cos.get(), d_sin.get(),
                            N, H, D, style, s.get());
  s.sync();
  test::check_nmse(name + " backward(forward(x))", test::download_f32(d_inplace), x,
                   2 * test::kNmseBf16Out);
  test::check_guards(name, d_cos, d_sin, d_pos, d_x, d_out, d_dout, d_dx, d_inplace);
}

// Packs q (N, H, D), k, v (N, Hkv, D) into rows [q | k | v] of (N, (H + 2·Hkv)·D).
std::vector<float> pack_qkv(const std::vector<float>& q, const std::vector<float>& k,
                            const std::vector<float>& v, int64_t N, int64_t H, int64_t Hkv,
                            int64_t D) {
  std::vector<float> out;
  for (int64_t n = 0; n < N; ++n) {
    out.insert(out.end(), q.begin() + n * H * D, q.begin() + (n + 1) * H * D);
    out.insert(out.end(), k.begin() + n * Hkv * D, k.begin() + (n + 1) * Hkv * D);
    out.insert(out.end(), v.begin() + n * Hkv * D, v.begin() + (n + 1) * Hkv * D);
  }
  return out;
}

void check_qkv_rope_cuda(int64_t N, int64_t H, int64_t Hkv, int64_t D, model::RopeStyle style) {
  const std::string name = fmt::format("qkv_rope_cuda(N={},H={},Hkv={},D={},style={})", N, H, Hkv,
                                       D, model::to_string(style));
  const int64_t max_pos = 512, Q = N * H * D, KV = N * Hkv * D;
  std::vector<float> cos(max_pos * D / 2), sin(max_pos * D / 2);
  model::rope_tables_cpu(cos.data(), sin.data(), max_pos, D, 1e4);
  const auto pos = test::random_tokens(N, max_pos, 4);
  const auto q = test::random_bf16_values(Q, 5), k = test::random_bf16_values(KV, 6),
             v = test::random_bf16_values(KV, 7);
  const auto dq = test::random_bf16_values(Q, 8), dk = test::random_bf16_values(KV, 9),
             dv = test::random_bf16_values(KV, 10);
  // CPU: rotate each part; the packed gradient is [Rᵀ·dq | Rᵀ·dk | dv].
  std::vector<float> q_ref(Q), k_ref(KV), dq_ref(Q), dk_ref(KV);
  model::rope_forward_cpu(q_ref.data(), q.data(), pos.data(), cos.data(), sin.data(), N, H, D,
                          style);
  model::rope_forward_cpu(k_ref.data(), k.data(), pos.data(), cos.data(), sin.data(), N, Hkv, D,
                          style);
  model::rope_backward_cpu(dq_ref.data(), dq.data(), pos.data(), cos.data(), sin.data(), N, H, D,
                           style);
  model::rope_backward_cpu(dk_ref.data(), dk.data(), pos.data(), cos.data(), sin.data(), N, Hkv, D,
                           style);
  const auto dqkv_ref = pack_qkv(dq_ref, dk_ref, dv, N, H, Hkv, D);

  test::TestStream s;
  test::DeviceBuffer<float> d_cos(cos), d_sin(sin);
  test::DeviceBuffer<int32_t> d_pos(pos);
  test::DeviceBuffer<test::bf16> d_qkv(test::to_bf16(pack_qkv(q, k, v, N, H, Hkv, D))), d_q(Q),
      d_k(KV), d_v(KV), d_dq(test::to_bf16(dq)), d_dk(test::to_bf16(dk)), d_dv(test::to_bf16(dv)),
      d_dqkv(Q + 2 * KV), d_q1(test::to_bf16(q)), d_k1(test::to_bf16(k)), d_dq1(test::to_bf16(dq)),
      d_dk1(test::to_bf16(dk));
  model::qkv_rope_split_cuda(d_q.get(), d_k.get(), d_v.get(), d_qkv.get(), d_pos.get(), d_cos.get(),
                             d_sin.get(), N, H, Hkv, D, style, s.get());
  model::qkv_rope_merge_backward_cuda(d_dqkv.get(), d_dq.get(), d_dk.get(), d_dv.get(), d_pos.get(),
                                      d_cos.get(), d_sin.get(), N, H, Hkv, D, style, s.get());
  // The unfused path on the same parts.
  for (auto [x, heads] : {std::pair{d_q1.get(), H}, std::pair{d_k1.get(), Hkv}})
    model::rope_forward_cuda(x, x, d_pos.get(), d_cos.get(), d_sin.get(), N, heads, D, style,
                             s.get());
  for (auto [x, heads] : {std::pair{d_dq1.get(), H}, std::pair{d_dk1.get(), Hkv}})
    model::rope_backward_cuda(x, x, d_pos.get(), d_cos.get(), d_sin.get(), N, heads, D, style,
                              s.get());
  s.sync();
  test::check_nmse(name + " q", test::download_f32(d_q), q_ref, test::kNmseBf16Out);
  test::check_nmse(name + " k", test::download_f32(d_k), k_ref, test::kNmseBf16Out);
  CHECK(test::download_f32(d_v) == v);  // copied
  test::check_nmse(name + " dqkv", test::download_f32(d_dqkv), dqkv_ref, test::kNmseBf16Out);
  // Bit-identical to the unfused rotations.
  CHECK(test::download_f32(d_q) == test::download_f32(d_q1));
  CHECK(test::download_f32(d_k) == test::download_f32(d_k1));
  CHECK(test::download_f32(d_dqkv) ==
        pack_qkv(test::download_f32(d_dq1), test::download_f32(d_dk1), dv, N, H, Hkv, D));
  test::check_guards(name, d_cos, d_sin, d_pos, d_qkv, d_q, d_k, d_v, d_dq, d_dk, d_dv, d_dqkv);

  // The split writing the paged cache too (the engine's decode): the caches equal those
  // kv_cache_write_cuda fills from the split's k and v, bit for bit; q, k, v unchanged. Each row
  // is a sequence of its own (table_stride 2) at its position, blocks of 4 positions.
  const int64_t bs = 4, blocks = N * 2;
  std::vector<int32_t> table(size_t(N * 2));
  for (int64_t n = 0; n < N; ++n) {  // the block holding pos[n], then an unused one
    table[size_t(2 * n)] = int32_t(n);
    table[size_t(2 * n + 1)] = int32_t(N + n);
  }
  std::vector<int32_t> pos_in_block(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) pos_in_block[size_t(n)] = pos[size_t(n)] % int32_t(bs);
  test::DeviceBuffer<int32_t> d_table(table), d_pib(pos_in_block);
  const int64_t cache_elems = blocks * Hkv * bs * D;
  test::DeviceBuffer<test::bf16> kc(cache_elems), vc(cache_elems), kc2(cache_elems),
      vc2(cache_elems), q2(Q), k2(KV), v2(KV);
  for (auto* c : {&kc, &vc, &kc2, &vc2})
    CUDA_CHECK(cudaMemsetAsync(c->get(), 0, size_t(cache_elems) * 2, s.get()));
  // Positions inside block 0 of each row's table (pos % bs), so every slot exists.
  const model::KvCacheWrite cache{kc.get(), vc.get(), d_table.get(), 2, bs};
  model::qkv_rope_split_cuda(q2.get(), k2.get(), v2.get(), d_qkv.get(), d_pib.get(), d_cos.get(),
                             d_sin.get(), N, H, Hkv, D, style, s.get(), &cache);
  model::qkv_rope_split_cuda(d_q.get(), d_k.get(), d_v.get(), d_qkv.get(), d_pib.get(), d_cos.get(),
                             d_sin.get(), N, H, Hkv, D, style, s.get());
  model::kv_cache_write_cuda(kc2.get(), vc2.get(), d_k.get(), d_v.get(), d_table.get(), 2,
                             d_pib.get(), N, Hkv, D, bs, s.get());
  s.sync();
  CHECK(test::download_f32(q2) == test::download_f32(d_q));
  CHECK(test::download_f32(k2) == test::download_f32(d_k));
  CHECK(test::download_f32(v2) == test::download_f32(d_v));
  CHECK(test::download_f32(kc) == test::download_f32(kc2));
  CHECK(test::download_f32(vc) == test::download_f32(vc2));
  test::check_guards(name + " cache", kc, vc, kc2, vc2, q2, k2, v2, d_table, d_pib);
}

}  // namespace
#endif

TEST_CASE("rope cuda: packed QKV split and merge") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  for (auto style : {model::RopeStyle::kInterleaved, model::RopeStyle::kRotateHalf}) {
    check_qkv_rope_cuda(37, 9, 3, 64, style);   // SmolLM-135M heads (GQA 3:1), odd N
    check_qkv_rope_cuda(16, 4, 4, 48, style);   // MHA
    check_qkv_rope_cuda(5, 32, 8, 128, style);  // Llama-3-8B heads
    check_qkv_rope_cuda(1, 1, 1, 2, style);     // one pair per head
  }
  test::TestStream s;
  CHECK_THROWS_WITH(
      model::qkv_rope_split_cuda(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 4,
                                 2, 1, 7, model::RopeStyle::kRotateHalf, s.get()),
      doctest::Contains("head_dim must be even"));
  CHECK_THROWS_WITH(model::qkv_rope_merge_backward_cuda(nullptr, nullptr, nullptr, nullptr, nullptr,
                                                        nullptr, nullptr, 4, 2, 0, 8,
                                                        model::RopeStyle::kRotateHalf, s.get()),
                    doctest::Contains("Hkv > 0"));
#endif
}

TEST_CASE("rope cuda vs cpu") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  for (auto style : {model::RopeStyle::kInterleaved, model::RopeStyle::kRotateHalf}) {
    check_rope_cuda(64, 6, 48, style, 1e4);   // stories15M
    check_rope_cuda(100, 9, 64, style, 1e5);  // SmolLM-135M
    check_rope_cuda(7, 4, 16, style, 1e4);    // odd N
    check_rope_cuda(1, 1, 2, style, 5e5);     // one pair
    check_rope_cuda(13, 3, 128, style, 5e5);  // D = 128
  }
#endif
}
