// Shared helpers for the doctest suites: deterministic random fills, finite-difference gradient
// checks in double precision (ggml's test-backend-ops habits), and error summaries.
#pragma once

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <mpi.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace rlhf::test {

/// MPI_Init unless MPI is already initialised: for tests that need a communicator or a benchmark
/// inside the unit-test binary, which runs without mpirun (Open MPI then runs as a singleton).
inline void init_mpi() {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) MPI_Init(nullptr, nullptr);
}

/// Sets the OpenMP thread count for a scope and restores it afterwards.
struct ScopedThreads {
  int saved = omp_get_max_threads();
  explicit ScopedThreads(int n) { omp_set_num_threads(n); }
  ~ScopedThreads() { omp_set_num_threads(saved); }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;
};

/// Uniform values in [lo, hi) from a fixed seed.
template <typename T>
std::vector<T> random_vec(int64_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<T>(d(rng));
  return v;
}

/// Token ids uniform in [0, V).
inline std::vector<int32_t> random_tokens(int64_t n, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> d(0, V - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<int32_t>(d(rng));
  return v;
}

/// Comparison of an analytic gradient with a numeric one.
struct GradCompare {
  double max_abs_err = 0;  ///< max |a − n|
  double max_rel_err = 0;  ///< max |a − n| / max(|a|, |n|, 1e-3)
  double mean_abs_asymm =
      0;               ///< ggml: mean |a − n| / (|a| + |n|) over elements with |a| + |n| > 1e-8
  int64_t worst = -1;  ///< index of the max relative error
  double worst_analytic = 0, worst_numeric = 0;
  int64_t checked = 0;
  std::string summary(const std::string& what) const {
    return fmt::format(
        "{}: checked {} | max abs err {:.3e} | max rel err {:.3e} | mean_abs_asymm "
        "{:.3e} | worst index {} calc={:.10g} ref={:.10g}",
        what, checked, max_abs_err, max_rel_err, mean_abs_asymm, worst, worst_analytic,
        worst_numeric);
  }
};

/// Central finite differences of scalar f() w.r.t. x[i] for up to max_points indices (all if
/// n <= max_points, else a fixed-seed sample), compared against grad[i]. Uses the 4-point stencil
/// (f(x−2h) − 8f(x−h) + 8f(x+h) − f(x+2h)) / 12h when four_point, else the 2-point one.
/// x is restored afterwards.
inline GradCompare fd_check(const std::function<double()>& f, double* x, const double* grad,
                            int64_t n, double h = 1e-5, bool four_point = true,
                            int64_t max_points = 600, uint64_t seed = 7) {
  std::vector<int64_t> idx;
  if (n <= max_points) {
    for (int64_t i = 0; i < n; ++i) idx.push_back(i);
  } else {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int64_t> d(0, n - 1);
    for (int64_t k = 0; k < max_points; ++k) idx.push_back(d(rng));
  }
  GradCompare r;
  double asymm_sum = 0;
  int64_t asymm_n = 0;
  for (int64_t i : idx) {
    const double x0 = x[i];
    auto at = [&](double dx) {
      x[i] = x0 + dx;
      double v = f();
      x[i] = x0;
      return v;
    };
    double num;
    if (four_point)
      num = (at(-2 * h) - 8 * at(-h) + 8 * at(h) - at(2 * h)) / (12 * h);
    else
      num = (at(h) - at(-h)) / (2 * h);
    const double a = grad[i];
    const double abs_err = std::fabs(a - num);
    const double rel = abs_err / std::max({std::fabs(a), std::fabs(num), 1e-3});
    r.max_abs_err = std::max(r.max_abs_err, abs_err);
    if (rel > r.max_rel_err || r.worst < 0) {
      r.max_rel_err = std::max(r.max_rel_err, rel);
      r.worst = i;
      r.worst_analytic = a;
      r.worst_numeric = num;
    }
    // Both below 1e-8: an exact zero gradient against FD round-off (~1e-11); max_rel_err covers it.
    if (std::fabs(a) + std::fabs(num) > 1e-8) {
      asymm_sum += abs_err / (std::fabs(a) + std::fabs(num));
      ++asymm_n;
    }
    ++r.checked;
  }
  r.mean_abs_asymm = asymm_n ? asymm_sum / static_cast<double>(asymm_n) : 0.0;
  return r;
}

/// Element-wise comparison of two arrays (a = computed, b = reference): max abs / rel error and
/// normalised MSE Σ(a−b)² / Σb².
struct ArrayCompare {
  double max_abs_err = 0, max_rel_err = 0, nmse = 0;
  int64_t worst = -1;
  double worst_calc = 0, worst_ref = 0;
  bool finite = true;
  std::string summary(const std::string& what) const {
    return fmt::format(
        "{}: max diff {:.3e}, rel {:.3e}, nmse {:.3e}, calc={:.8g}, ref={:.8g}, "
        "index {}{}",
        what, max_abs_err, max_rel_err, nmse, worst_calc, worst_ref, worst,
        finite ? "" : " (NON-FINITE VALUES)");
  }
};

template <typename A, typename B>
ArrayCompare compare_arrays(const A* a, const B* b, int64_t n, double rel_floor = 1e-6) {
  ArrayCompare r;
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    if (!std::isfinite(x)) r.finite = false;
    const double e = std::fabs(x - y);
    num += e * e;
    den += y * y;
    const double rel = e / std::max(std::fabs(y), rel_floor);
    if (e > r.max_abs_err || r.worst < 0) {
      r.max_abs_err = std::max(r.max_abs_err, e);
      r.worst = i;
      r.worst_calc = x;
      r.worst_ref = y;
    }
    r.max_rel_err = std::max(r.max_rel_err, rel);
  }
  r.nmse = den > 0 ? num / den : num;
  return r;
}

/// Dot product in double: the scalar loss Σ out ⊙ w used to turn an op into f(x) for FD checks.
template <typename T>
double dot(const T* a, const T* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return s;
}

/// The gate for a double-precision FD check (docs/design.md, "Conventions: ops"): ggml's
/// mean_abs_asymm bound, made stricter because we compare in double (1e-6 instead of 1e-4), and a
/// max relative error (floor 1e-3) of 1e-4, which leaves room for FD round-off on losses that sum
/// thousands of terms. A wrong gradient term gives errors of order 1e-2 or more.
#define RLHF_CHECK_GRAD(cmp, what)       \
  do {                                   \
    INFO((cmp).summary(what));           \
    CHECK((cmp).checked > 0);            \
    CHECK((cmp).mean_abs_asymm <= 1e-6); \
    CHECK((cmp).max_rel_err <= 1e-4);    \
  } while (0)

/// Path of the shared real-data folder (../shared/data next to the project), or "" if absent.
std::string shared_data_dir();

/// shared_data_dir() + "/" + rel when that file or folder exists, else "" (the test then reports
/// itself skipped).
inline std::string shared_data_path(const std::string& rel) {
  const std::string root = shared_data_dir();
  if (root.empty() || !std::filesystem::exists(root + "/" + rel)) return "";
  return root + "/" + rel;
}

}  // namespace rlhf::test
