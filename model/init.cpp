#include "model/init.h"

#include <cmath>
#include <cstring>

namespace rlhf::model {

uint64_t fnv1a64(const char* s, uint64_t h) {
  for (; *s; ++s) {
    h ^= static_cast<unsigned char>(*s);
    h *= 1099511628211ull;
  }
  return h;
}

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
double to_unit(uint64_t x) {
  return (static_cast<double>(x >> 11) + 0.5) * 0x1.0p-53;
}  // (0,1)
}  // namespace

double counter_normal(uint64_t key, uint64_t index) {
  const uint64_t a = splitmix64(key ^ splitmix64(2 * index));
  const uint64_t b = splitmix64(key ^ splitmix64(2 * index + 1));
  const double u1 = to_unit(a), u2 = to_unit(b);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

template <typename T>
void init_unit_params(T* unit_buffer, const UnitLayout& u, uint64_t seed, double std) {
  std::memset(static_cast<void*>(unit_buffer), 0, sizeof(T) * static_cast<size_t>(u.numel));
  for (const TensorInfo& t : u.tensors) {
    T* p = unit_buffer + t.offset;
    const bool is_norm = t.name.find("norm.weight") != std::string::npos;
    const bool is_bias = t.name.size() >= 4 && t.name.compare(t.name.size() - 4, 4, "bias") == 0;
    if (is_norm) {
      for (int64_t i = 0; i < t.numel; ++i) p[i] = T(1);
    } else if (is_bias) {
      for (int64_t i = 0; i < t.numel; ++i) p[i] = T(0);
    } else {
      const uint64_t key = fnv1a64(t.name.c_str(), seed * 0x9E3779B97F4A7C15ull + 1);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < t.numel; ++i)
        p[i] = static_cast<T>(std * counter_normal(key, static_cast<uint64_t>(i)));
    }
  }
}

template void init_unit_params<float>(float*, const UnitLayout&, uint64_t, double);
template void init_unit_params<double>(double*, const UnitLayout&, uint64_t, double);

}  // namespace rlhf::model
