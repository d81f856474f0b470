#include "model/lora.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "model/init.h"
#include "model/ops/linear.h"

namespace rlhf::model {

void LoraConfig::validate() const {
  RLHF_CHECK(rank >= 0, "--lora_rank must be >= 0 (0 = no LoRA), got {}", rank);
  if (rank == 0) return;
  RLHF_CHECK(alpha > 0 && std::isfinite(alpha), "--lora_alpha must be > 0, got {}", alpha);
  RLHF_CHECK(dropout >= 0 && dropout < 1, "--lora_dropout must be in [0, 1), got {}", dropout);
  bool any = false;
  for (bool t : targets) any = any || t;
  RLHF_CHECK(any, "--lora_rank {} needs at least one projection in --target_modules", rank);
}

std::array<bool, kNumProj> parse_target_modules(std::string_view s) {
  std::array<bool, kNumProj> t{};
  if (s == "all-linear") {
    t.fill(true);
    return t;
  }
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const std::string_view name =
        s.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    bool found = false;
    for (const ProjInfo& p : kProjections)
      if (name == p.name) {
        t[size_t(static_cast<int>(p.id))] = true;
        found = true;
      }
    RLHF_CHECK(found,
               "--target_modules: unknown module '{}' (use all-linear or a comma list of "
               "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj)",
               name);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return t;
}

std::string target_modules_string(const std::array<bool, kNumProj>& targets) {
  std::string s;
  for (const ProjInfo& p : kProjections)
    if (targets[size_t(static_cast<int>(p.id))]) {
      if (!s.empty()) s.push_back(',');
      s.append(p.name);
    }
  return s;
}

namespace {
uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// x' = d(x) (N, in): x·mask/(1−p) (PEFT's nn.Dropout in training mode).
template <typename T>
std::vector<T> dropped(const T* x, const LoraProjView<T>& a, int64_t N, int64_t in) {
  std::vector<T> xd(size_t(N * in));
  const T keep_scale = T(1.0 / (1.0 - a.dropout));
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < in; ++i)
      xd[size_t(n * in + i)] =
          lora_dropout_keep(a.key, n, i, in, a.dropout) ? x[n * in + i] * keep_scale : T(0);
  return xd;
}
}  // namespace

bool lora_dropout_keep(uint64_t key, int64_t n, int64_t i, int64_t in, double p) {
  const double u = (double(mix(key ^ mix(uint64_t(n * in + i))) >> 11) + 0.5) * 0x1.0p-53;
  return u >= p;
}

uint64_t lora_dropout_key(uint64_t seed, uint64_t pass, int l, Proj p) {
  return mix(mix(seed ^ 0x44726F70ull) ^
             mix(pass * 0x100000001B3ull + uint64_t(l) * kNumProj + uint64_t(static_cast<int>(p))));
}

uint64_t lora_dropout_pass(const void* adapters, size_t bytes, const int32_t* tokens, int64_t n) {
  uint64_t h = 0x6C6F7261ull;
  const auto* c = static_cast<const unsigned char*>(adapters);
  size_t k = 0;
  for (; k + 8 <= bytes; k += 8) {
    uint64_t w;
    std::memcpy(&w, c + k, 8);
    h = mix(h ^ w);
  }
  for (; k < bytes; ++k) h = mix(h ^ c[k]);
  for (int64_t t = 0; t < n; ++t) h = mix(h ^ uint64_t(uint32_t(tokens[t])));
  return h | 1;
}

LoraLayout::LoraLayout(const LayerSpec& spec, int num_layers, const LoraConfig& cfg) : cfg_(cfg) {
  cfg.validate();
  RLHF_CHECK(cfg.enabled(), "internal error: a LoRA layout needs --lora_rank > 0");
  const int64_t r = cfg.rank;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    TensorInfo t;
    t.name = std::move(name);
    t.shape = std::move(shape);
    t.numel = t.shape[0] * t.shape[1];
    t.offset = (numel_ + kTensorAlignElems - 1) / kTensorAlignElems * kTensorAlignElems;
    numel_ = t.offset + t.numel;
    tensors_.push_back(t);
    return t.offset;
  };
  entries_.resize(size_t(num_layers));
  for (int l = 0; l < num_layers; ++l)
    for (const ProjInfo& p : kProjections) {
      if (!cfg.targets[size_t(static_cast<int>(p.id))]) continue;
      const Projection pr = projection(spec, p.id);
      Entry& e = entries_[size_t(l)][size_t(static_cast<int>(p.id))];
      e.in = pr.in;
      e.out = pr.out;
      // "self_attn.q_proj.weight" -> "model.layers.l.self_attn.q_proj.lora_A.weight"
      std::string stem = "model.layers." + std::to_string(l) + "." + p.weight_name;
      stem.resize(stem.size() - std::string_view(".weight").size());
      e.a = add(stem + ".lora_A.weight", {r, pr.in});
      e.b = add(stem + ".lora_B.weight", {pr.out, r});
    }
  if (cfg.save_score) score_ = add("score.weight", {1, spec.C});
}

std::string LoraLayout::describe() const {
  return fmt::format("LoRA r={} alpha={} on {}: {} adapter parameters{}", cfg_.rank, cfg_.alpha,
                     target_modules_string(cfg_.targets), num_parameters(),
                     score_ >= 0 ? " (the score head's included: it trains fully)" : "");
}

template <typename T>
LoraLayerView<T> lora_layer_view(const LoraLayout& layout, int l, const T* params, T* grads,
                                 uint64_t dropout_pass) {
  LoraLayerView<T> v;
  const double p_drop = dropout_pass > 0 ? layout.config().dropout : 0.0;
  v.scale = T(layout.config().scale());
  for (const ProjInfo& p : kProjections) {
    const LoraLayout::Entry& e = layout.entry(l, p.id);
    if (e.a < 0) continue;
    LoraProjView<T>& a = v.proj[size_t(static_cast<int>(p.id))];
    a.A = params + e.a;
    a.B = params + e.b;
    a.dA = grads ? grads + e.a : nullptr;
    a.dB = grads ? grads + e.b : nullptr;
    a.r = layout.config().rank;
    a.dropout = p_drop;
    if (p_drop > 0) a.key = lora_dropout_key(layout.config().seed, dropout_pass, l, p.id);
  }
  return v;
}

void lora_init(const LoraLayout& layout, float* params, uint64_t seed) {
  const int64_t so = layout.score_offset(), sn = so >= 0 ? layout.tensors().back().numel : 0;
  std::vector<float> score(params + std::max<int64_t>(so, 0),
                           params + std::max<int64_t>(so, 0) + sn);
  std::fill(params, params + layout.numel(), 0.0f);
  std::copy(score.begin(), score.end(), params + std::max<int64_t>(so, 0));  // kept as it was
  for (const TensorInfo& t : layout.tensors()) {
    if (t.name.find(".lora_A.") == std::string::npos) continue;  // B stays zero
    const double bound = 1.0 / std::sqrt(double(t.shape[1]));
    const uint64_t key = fnv1a64(t.name.c_str(), seed ^ 0x4C6F5241ull);
    for (int64_t i = 0; i < t.numel; ++i) {
      const double u = (double(mix(key ^ mix(uint64_t(i))) >> 11) + 0.5) * 0x1.0p-53;  // (0, 1)
      params[t.offset + i] = float((2.0 * u - 1.0) * bound);
    }
  }
}

template <typename T>
void lora_forward_cpu(T* y, const T* x, const LoraProjView<T>& a, T scale, int64_t N, int64_t in,
                      int64_t out) {
  if (a.A == nullptr) return;
  const int64_t r = a.r;
  std::vector<T> xd;
  if (a.dropout > 0) {
    xd = dropped(x, a, N, in);
    x = xd.data();
  }
  std::vector<T> h(size_t(N * r));
  gemm_cpu<T>(false, true, N, r, in, T(1), x, in, a.A, in, T(0), h.data(), r);    // h = x'·Aᵀ
  gemm_cpu<T>(false, true, N, out, r, scale, h.data(), r, a.B, r, T(1), y, out);  // y += s·h·Bᵀ
}

template <typename T>
void lora_backward_cpu(T* dx, const T* dy, const T* x, const LoraProjView<T>& a, T scale, int64_t N,
                       int64_t in, int64_t out) {
  if (a.A == nullptr) return;
  const int64_t r = a.r;
  std::vector<T> xd;
  if (a.dropout > 0) {
    xd = dropped(x, a, N, in);
    x = xd.data();
  }
  std::vector<T> h(size_t(N * r)), g(size_t(N * r));
  // g = scale·dy·B (N, r): the gradient of h = x·Aᵀ.
  gemm_cpu<T>(false, false, N, r, out, scale, dy, out, a.B, r, T(0), g.data(), r);
  if (a.dB != nullptr) {
    gemm_cpu<T>(false, true, N, r, in, T(1), x, in, a.A, in, T(0), h.data(), r);
    gemm_cpu<T>(true, false, out, r, N, scale, dy, out, h.data(), r, T(1), a.dB,
                r);  // dB += s·dyᵀ·h
  }
  if (a.dA != nullptr) gemm_cpu<T>(true, false, r, in, N, T(1), g.data(), r, x, in, T(1), a.dA, in);
  if (dx == nullptr) return;
  if (a.dropout == 0) {
    gemm_cpu<T>(false, false, N, in, r, T(1), g.data(), r, a.A, in, T(1), dx, in);
    return;
  }
  std::vector<T> gx(size_t(N * in));  // d(g·A): the mask and 1/(1−p) of the forward
  gemm_cpu<T>(false, false, N, in, r, T(1), g.data(), r, a.A, in, T(0), gx.data(), in);
  const std::vector<T> back = dropped(gx.data(), a, N, in);
  for (int64_t k = 0; k < N * in; ++k) dx[k] += back[size_t(k)];
}

template <typename T>
void lora_merge_cpu(T* w, const T* A, const T* B, T scale, int64_t r, int64_t in, int64_t out,
                    T sign) {
  // Each element is w[o, i] + (sign·scale)·Σ_k B[o, k]·A[k, i], the sum over k = 0..r−1 in
  // order: a function of its own row of B and column of A, whatever the matrix's shape, so a
  // tensor-parallel slice (rollout/tp_slice.h: some rows of B, or some columns of A) merges to the
  // slice of the merged weight bit for bit. Tiles of kRows rows x kCols columns (each A element
  // loaded once per kRows rows): as fast as BLAS GEMM at r = 16 on the development machine.
  constexpr int64_t kRows = 4, kCols = 256;
  const T s = sign * scale;
#pragma omp parallel for collapse(2) schedule(static) if (out * in > 65536)
  for (int64_t o0 = 0; o0 < out; o0 += kRows)
    for (int64_t i0 = 0; i0 < in; i0 += kCols) {
      const int64_t no = std::min(kRows, out - o0), ni = std::min(kCols, in - i0);
      T acc[kRows][kCols] = {};
      for (int64_t k = 0; k < r; ++k) {
        T b[kRows] = {};
        for (int64_t j = 0; j < no; ++j) b[j] = B[(o0 + j) * r + k];
        const T* a = A + k * in + i0;
        for (int64_t i = 0; i < ni; ++i)
          for (int64_t j = 0; j < kRows; ++j) acc[j][i] += b[j] * a[i];
      }
      for (int64_t j = 0; j < no; ++j) {
        T* wr = w + (o0 + j) * in + i0;
        for (int64_t i = 0; i < ni; ++i) wr[i] += s * acc[j][i];
      }
    }
}

#define RLHF_INSTANTIATE_LORA(T)                                                                 \
  template LoraLayerView<T> lora_layer_view<T>(const LoraLayout&, int, const T*, T*, uint64_t);  \
  template void lora_forward_cpu<T>(T*, const T*, const LoraProjView<T>&, T, int64_t, int64_t,   \
                                    int64_t);                                                    \
  template void lora_backward_cpu<T>(T*, const T*, const T*, const LoraProjView<T>&, T, int64_t, \
                                     int64_t, int64_t);                                          \
  template void lora_merge_cpu<T>(T*, const T*, const T*, T, int64_t, int64_t, int64_t, T);
RLHF_INSTANTIATE_LORA(float)
RLHF_INSTANTIATE_LORA(double)
#undef RLHF_INSTANTIATE_LORA

}  // namespace rlhf::model
