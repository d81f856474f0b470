#include "model/ops/residual.h"

namespace rlhf::model {

template <typename T>
void residual_forward_cpu(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= 32768)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename T>
void residual_backward_cpu(T* da, T* db, const T* dout, int64_t n) {
  if (da != nullptr) {
#pragma omp parallel for simd schedule(static) if (n >= 32768)
    for (int64_t i = 0; i < n; ++i) da[i] += dout[i];
  }
  if (db != nullptr) {
#pragma omp parallel for simd schedule(static) if (n >= 32768)
    for (int64_t i = 0; i < n; ++i) db[i] += dout[i];
  }
}

template void residual_forward_cpu<float>(float*, const float*, const float*, int64_t);
template void residual_forward_cpu<double>(double*, const double*, const double*, int64_t);
template void residual_backward_cpu<float>(float*, float*, const float*, int64_t);
template void residual_backward_cpu<double>(double*, double*, const double*, int64_t);

}  // namespace rlhf::model
