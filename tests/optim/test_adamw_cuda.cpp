// AdamW on the GPU against the CPU step: several steps (bias correction with t > 1), weight decay
// on and off, grad_scale, the segment form with mixed decay and untouched gaps, and the host-side
// argument checks. The update p_new − p_old is compared separately, because p itself is dominated
// by its old value and would hide a wrong update.
#include "optim/adamw.h"

#include "core/error.h"
#include "tests/ops/cuda_test_util.h"

using namespace rlhf;

#ifdef RLHF_CUDA
namespace {

// Bounds. m, v, p: identical formula and fp32 scalars; only FMA contraction (nvcc contracts
// a·b + c, the CPU build may or may not) differs: relative ~1e-7 per element, nmse ~1e-14.
// The update (≈ lr = 1e-2 per element) is the difference of two O(1) numbers, so its relative
// error is ~1e-7 / 1e-2 = 1e-5: nmse ~1e-10, bound 1e-7.
constexpr double kNmseState = 1e-10;
constexpr double kNmseUpdate = 1e-7;

void check_adamw_cuda(int64_t n, bool decay, float grad_scale, int steps) {
  const std::string name =
      fmt::format("adamw_cuda(n={},decay={},grad_scale={:g})", n, decay, grad_scale);
  optim::AdamWConfig cfg;
  cfg.lr = 1e-2;
  cfg.beta1 = 0.9;
  cfg.beta2 = 0.95;
  cfg.eps = 1e-8;
  cfg.weight_decay = 0.1;
  auto p = test::random_vec<float>(n, 1);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  test::TestStream s;
  test::DeviceBuffer<float> d_p(p), d_m(m), d_v(v), d_g(n);
  for (int step = 1; step <= steps; ++step) {
    const auto g = test::random_vec<float>(n, 100 + step, -3, 3);
    const auto p_old = p;
    optim::adamw_step_cpu(p.data(), m.data(), v.data(), g.data(), n, cfg, cfg.lr, step, decay,
                          grad_scale);
    d_g.upload(g);
    const auto dp_old = d_p.download();
    optim::adamw_step_cuda(d_p.get(), d_m.get(), d_v.get(), d_g.get(), n, cfg, cfg.lr, step, decay,
                           grad_scale, s.get());
    s.sync();
    const auto gp = d_p.download();
    std::vector<float> upd(n), upd_ref(n);
    for (int64_t i = 0; i < n; ++i) {
      upd[i] = gp[i] - dp_old[i];
      upd_ref[i] = p[i] - p_old[i];
    }
    const std::string at = fmt::format("{} step {}", name, step);
    test::check_nmse(at + " p", gp, p, kNmseState);
    test::check_nmse(at + " p update", upd, upd_ref, kNmseUpdate);
    test::check_nmse(at + " m", d_m.download(), m, kNmseState);
    test::check_nmse(at + " v", d_v.download(), v, kNmseState);
  }
  test::check_guards(name, d_p, d_m, d_v, d_g);
}

}  // namespace
#endif

TEST_CASE("adamw cuda vs cpu") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  check_adamw_cuda(1000003, true, 1.0f, 3);  // odd size, several grid-stride rounds
  check_adamw_cuda(4097, false, 0.5f, 3);    // no decay, clip coefficient folded in
  check_adamw_cuda(1, true, 1.0f, 2);
#endif
}

TEST_CASE("adamw cuda: segments with mixed decay leave the gaps untouched") {
  RLHF_SKIP_WITHOUT_CUDA_DEVICE();
#ifdef RLHF_CUDA
  const int64_t n = 1000;
  optim::AdamWConfig cfg;
  cfg.lr = 1e-2;
  cfg.weight_decay = 0.1;
  const std::vector<optim::AdamWSegment> segs = {
      {500, 300, false}, {0, 200, true}, {200, 100, true}};
  auto p = test::random_vec<float>(n, 1);
  const auto g = test::random_vec<float>(n, 2);
  std::vector<float> m(n, 0.1f), v(n, 0.2f);
  test::TestStream s;
  test::DeviceBuffer<float> d_p(p), d_m(m), d_v(v), d_g(g);
  optim::adamw_step_segments_cpu(p.data(), m.data(), v.data(), g.data(), n, segs, cfg, cfg.lr, 4);
  optim::adamw_step_segments_cuda(d_p.get(), d_m.get(), d_v.get(), d_g.get(), n, segs, cfg, cfg.lr,
                                  4, 1.0f, s.get());
  s.sync();
  test::check_nmse("adamw segments p", d_p.download(), p, kNmseState);
  test::check_nmse("adamw segments m", d_m.download(), m, kNmseState);
  test::check_nmse("adamw segments v", d_v.download(), v, kNmseState);
  const auto gm = d_m.download();
  for (int64_t i = 300; i < 500; ++i) REQUIRE(gm[i] == 0.1f);  // the gap [300, 500)
  for (int64_t i = 800; i < n; ++i) REQUIRE(gm[i] == 0.1f);
  const std::vector<optim::AdamWSegment> overlap = {{0, 10, true}, {5, 10, true}};
  CHECK_THROWS_AS(optim::adamw_step_segments_cuda(d_p.get(), d_m.get(), d_v.get(), d_g.get(), n,
                                                  overlap, cfg, cfg.lr, 1, 1.0f, s.get()),
                  rlhf::Error);
  CHECK_THROWS_AS(optim::adamw_step_cuda(d_p.get(), d_m.get(), d_v.get(), d_g.get(), n, cfg, cfg.lr,
                                         0, true, 1.0f, s.get()),
                  rlhf::Error);
  test::check_guards("adamw segments", d_p, d_m, d_v, d_g);
#endif
}
