// Embedding: exact lookup, out-of-range ids throw naming id and position, backward vs central
// finite differences in double, backward with repeated tokens vs a naive loop, and a backward
// that does not depend on the thread count.
#include "model/ops/embedding.h"

#include <omp.h>

#include <algorithm>
#include <string>
#include <tuple>

#include "core/error.h"
#include "tests/test_util.h"

using namespace rlhf;

namespace {

struct ThreadCountGuard {
  int saved = omp_get_max_threads();
  ~ThreadCountGuard() { omp_set_num_threads(saved); }
};

// Tokens with forced repeats: every third position reuses token tokens[0].
std::vector<int32_t> tokens_with_repeats(int64_t N, int64_t V, uint64_t seed) {
  auto t = test::random_tokens(N, V, seed);
  for (int64_t n = 3; n < N; n += 3) t[n] = t[0];
  return t;
}

void check_embedding_fd(int64_t N, int64_t C, int64_t V) {
  const std::string name = fmt::format("embedding(N={},C={},V={})", N, C, V);
  auto tokens = tokens_with_repeats(N, V, 1);
  auto wte = test::random_vec<double>(V * C, 2);
  auto r = test::random_vec<double>(N * C, 3);  // loss = Σ out ⊙ r, so dout = r
  std::vector<double> out(N * C);
  auto loss = [&]() {
    model::embedding_forward_cpu(out.data(), tokens.data(), wte.data(), N, C, V);
    return test::dot(out.data(), r.data(), N * C);
  };
  loss();
  std::vector<double> dwte(V * C, 0.5);  // parameter gradient accumulates
  model::embedding_backward_cpu(dwte.data(), r.data(), tokens.data(), N, C, V);
  for (auto& v : dwte) v -= 0.5;
  // FD on the rows the tokens select (up to 8 of them, the repeated token first). Rows no token
  // selects must get exactly zero: checked exactly rather than by FD, where round-off noise
  // against an exact 0 would read as a 100% asymmetry.
  std::vector<int32_t> rows;
  for (int32_t t : tokens)
    if (std::find(rows.begin(), rows.end(), t) == rows.end()) rows.push_back(t);
  for (size_t k = 0; k < std::min<size_t>(rows.size(), 8); ++k) {
    const int64_t t = rows[k];
    auto g = test::fd_check(loss, wte.data() + t * C, dwte.data() + t * C, C);
    RLHF_CHECK_GRAD(g, name + fmt::format(" dwte row {} (token used {} times)", t,
                                          std::count(tokens.begin(), tokens.end(), t)));
  }
  int64_t nonzero_untouched = 0;
  for (int64_t v = 0; v < V; ++v)
    if (std::find(rows.begin(), rows.end(), v) == rows.end())
      for (int64_t c = 0; c < C; ++c) nonzero_untouched += dwte[v * C + c] != 0.0;
  INFO(name);
  CHECK(nonzero_untouched == 0);
}

}  // namespace

TEST_CASE("embedding backward vs finite differences") {
  check_embedding_fd(48, 288, 512);  // stories15M width, small vocab
  check_embedding_fd(7, 13, 11);     // odd
  check_embedding_fd(1, 5, 3);       // one token
}

TEST_CASE("embedding forward: exact lookup") {
  for (auto [N, C, V] :
       {std::tuple<int64_t, int64_t, int64_t>{40, 288, 512}, {7, 13, 11}, {1, 5, 2}}) {
    INFO(fmt::format("embedding(N={},C={},V={})", N, C, V));
    auto tokens = tokens_with_repeats(N, V, 4);
    tokens[N - 1] = static_cast<int32_t>(V - 1);  // the last row of the table is reachable
    auto wte = test::random_vec<float>(V * C, 5);
    std::vector<float> out(N * C, -1.0f);
    model::embedding_forward_cpu(out.data(), tokens.data(), wte.data(), N, C, V);
    bool exact = true;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) exact &= out[n * C + c] == wte[tokens[n] * C + c];
    CHECK(exact);
  }
}

TEST_CASE("embedding: out-of-range token ids throw, naming the id and the position") {
  const int64_t N = 6, C = 5, V = 11;
  auto wte = test::random_vec<float>(V * C, 6);
  std::vector<float> out(N * C), dout(N * C, 1.0f), dwte(V * C, 0.0f);
  for (int32_t bad : {11, -1, 1000}) {
    std::vector<int32_t> tokens = {0, 3, 10, 2, bad, 1};
    INFO("bad id " << bad);
    bool threw = false;
    try {
      model::embedding_forward_cpu(out.data(), tokens.data(), wte.data(), N, C, V);
    } catch (const rlhf::Error& e) {
      threw = true;
      const std::string msg = e.what();
      INFO(msg);
      CHECK(msg.find(fmt::format("token id {} at position 4", bad)) != std::string::npos);
      CHECK(msg.find("[0, 11)") != std::string::npos);
    }
    CHECK(threw);
    // backward rejects it too, before touching dwte
    CHECK_THROWS_AS(model::embedding_backward_cpu(dwte.data(), dout.data(), tokens.data(), N, C, V),
                    rlhf::Error);
    bool untouched = true;
    for (float v : dwte) untouched &= v == 0.0f;
    CHECK(untouched);
  }
}

TEST_CASE("embedding backward: repeated tokens vs naive loop, independent of thread count") {
  // N·C above the kernel's OpenMP threshold so several threads really run; C not a multiple of
  // the 16-float cache line.
  const int64_t N = 200, C = 291, V = 37;
  auto tokens = tokens_with_repeats(N, V, 7);
  auto dout = test::random_vec<float>(N * C, 8, -10, 10);
  auto dwte0 = test::random_vec<float>(V * C, 9);
  // Naive: tokens in order, in float, the order the contract promises.
  std::vector<float> ref = dwte0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) ref[tokens[n] * C + c] += dout[n * C + c];
  ThreadCountGuard guard;
  for (int threads : {1, 2, 3, 7, 64}) {
    INFO("embedding(N=200,C=291,V=37) threads=" << threads);
    omp_set_num_threads(threads);
    std::vector<float> dwte = dwte0;
    model::embedding_backward_cpu(dwte.data(), dout.data(), tokens.data(), N, C, V);
    CHECK(dwte == ref);  // bitwise
  }
}
