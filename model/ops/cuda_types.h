// Types that the CUDA declarations in the op headers need (model/ops/<op>.h, `#ifdef RLHF_CUDA`):
// bf16 (= __nv_bfloat16, the storage type of activations and weights on the device) and
// cudaStream_t. Includes nothing when built without CUDA.
#pragma once

#ifdef RLHF_CUDA
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace rlhf::model {
/// bfloat16 storage on the device (1 sign, 8 exponent, 7 mantissa bits); math is done in fp32.
using bf16 = __nv_bfloat16;
}  // namespace rlhf::model
#endif
