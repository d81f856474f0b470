// Host-side rules of the cuDNN attention (model/ops/cuda/attention_cudnn.cpp), apart from cuDNN
// and the device so that they are unit-tested on the CPU (tests/ops/test_attention_cudnn_rules.cpp)
// and shared with attention_cudnn_unavailable.cpp: argument validation, and which problems are
// offered to cuDNN at all before it is asked to build a graph.
#pragma once

#include <cstdint>

#include "core/error.h"

namespace rlhf::model::cudnn_attention {

/// Throws rlhf::Error naming `op` when a dimension is <= 0, H % Hkv != 0 or B·T·H·D does not fit
/// comfortably in int64 (the same checks as attention_forward_cuda).
inline void check_problem(const char* op, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  RLHF_CHECK(B > 0 && T > 0 && H > 0 && Hkv > 0 && D > 0,
             "{}: all dimensions must be > 0, got B={} T={} H={} Hkv={} D={}", op, B, T, H, Hkv, D);
  RLHF_CHECK(H % Hkv == 0,
             "{}: num_attention_heads H={} is not a multiple of num_key_value_heads Hkv={}", op, H,
             Hkv);
  RLHF_CHECK(B * T * H * D < (int64_t{1} << 62), "{}: sizes too large (B={} T={} H={} D={})", op, B,
             T, H, D);
}

/// Head dims cuDNN's fused bf16 attention takes on every supported device (cudnn-frontend's SDPA
/// checks for d_qk = d_v: a multiple of 8, at most 128). Larger ones exist only on some
/// architectures and cuDNN versions; the flash kernels serve those.
inline bool head_dim_supported(int64_t D) {
  return D > 0 && D % 8 == 0 && D <= 128;
}

/// A valid problem (check_problem would pass) worth asking cuDNN to build graphs for: head dim as
/// above and more than one position (T = 1 is a single dot product per head, which the flash
/// kernels do at no cost, and cuDNN's backward does not take s_q = s_kv = 1). Sequence lengths
/// that are not a multiple of 128 are offered: cudnn-frontend pads them itself where the cuDNN
/// at run time needs it (backward before cuDNN 9.15.1: a padding mask with the true length).
inline bool problem_offered(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  return B > 0 && T > 1 && H > 0 && Hkv > 0 && H % Hkv == 0 && head_dim_supported(D);
}

/// True when the cuDNN found at run time (cudnnGetVersion(), e.g. 91400 for 9.14.0) can run
/// graphs built against the headers of major version `compiled_major`: the same major, 9 or
/// later, and not 9.10.0/9.10.1 (cudnn-frontend refuses bf16 fused attention there, known bugs).
inline bool runtime_version_supported(int64_t version, int64_t compiled_major) {
  if (version < 90000 || version / 10000 != compiled_major) return false;
  return version != 91000 && version != 91001;
}

}  // namespace rlhf::model::cudnn_attention
