// Residual add: forward exact vs a + b (also in place), backward accumulates into both branches
// (either may be skipped), and backward vs central finite differences in double.
#include "model/ops/residual.h"

#include "tests/test_util.h"

using namespace rlhf;

namespace {

void check_residual_fd(int64_t n) {
  const std::string name = fmt::format("residual(n={})", n);
  auto a = test::random_vec<double>(n, 1);
  auto b = test::random_vec<double>(n, 2);
  auto r = test::random_vec<double>(n, 3);  // loss = Σ out ⊙ r, so dout = r
  std::vector<double> out(n);
  auto loss = [&]() {
    model::residual_forward_cpu(out.data(), a.data(), b.data(), n);
    return test::dot(out.data(), r.data(), n);
  };
  loss();
  std::vector<double> da(n, 0.25), db(n, -0.5);  // residual-stream gradients accumulate
  model::residual_backward_cpu(da.data(), db.data(), r.data(), n);
  for (auto& v : da) v -= 0.25;
  for (auto& v : db) v += 0.5;
  auto ga = test::fd_check(loss, a.data(), da.data(), n);
  auto gb = test::fd_check(loss, b.data(), db.data(), n);
  RLHF_CHECK_GRAD(ga, name + " da");
  RLHF_CHECK_GRAD(gb, name + " db");
}

}  // namespace

TEST_CASE("residual backward vs finite differences") {
  check_residual_fd(32 * 288);  // stories15M: 32 rows of C = 288
  check_residual_fd(7 * 13);    // odd
  check_residual_fd(1);
}

TEST_CASE("residual forward and backward: exact, in place, accumulate, skip") {
  for (int64_t n : {int64_t(64 * 288), int64_t(5 * 7 * 11 * 13), int64_t(1)}) {
    INFO(fmt::format("residual(n={})", n));
    auto a = test::random_vec<float>(n, 4);
    auto b = test::random_vec<float>(n, 5);
    std::vector<float> out(n), ref(n);
    for (int64_t i = 0; i < n; ++i) ref[i] = a[i] + b[i];
    model::residual_forward_cpu(out.data(), a.data(), b.data(), n);
    CHECK(out == ref);
    std::vector<float> ina = a, inb = b;  // out aliasing a, then b
    model::residual_forward_cpu(ina.data(), ina.data(), b.data(), n);
    model::residual_forward_cpu(inb.data(), a.data(), inb.data(), n);
    CHECK(ina == ref);
    CHECK(inb == ref);

    auto dout = test::random_vec<float>(n, 6);
    auto da0 = test::random_vec<float>(n, 7);
    auto db0 = test::random_vec<float>(n, 8);
    std::vector<float> da = da0, db = db0, da_ref(n), db_ref(n);
    for (int64_t i = 0; i < n; ++i) {
      da_ref[i] = da0[i] + dout[i];
      db_ref[i] = db0[i] + dout[i];
    }
    model::residual_backward_cpu(da.data(), db.data(), dout.data(), n);
    CHECK(da == da_ref);
    CHECK(db == db_ref);
    std::vector<float> only_a = da0, only_b = db0;
    model::residual_backward_cpu<float>(only_a.data(), nullptr, dout.data(), n);
    model::residual_backward_cpu<float>(nullptr, only_b.data(), dout.data(), n);
    CHECK(only_a == da_ref);
    CHECK(only_b == db_ref);
  }
}
