// Forward-only sweeps of TransformerCuda over several micro-batches, unit-major (the GPU side of
// model/transformer_sweep.cpp): each unit is acquired once for all the batches, so a ZeRO-3
// store gathers it once per pass instead of once per micro-batch.
#ifdef RLHF_CUDA
#include <algorithm>

#include "core/cuda_check.h"
#include "core/error.h"
#include "model/layer_params.h"
#include "model/ops/embedding.h"
#include "model/ops/linear.h"
#include "model/ops/logprob.h"
#include "model/transformer_cuda.h"

namespace rlhf::model {

// Checks every batch on the host, uploads all ids and positions at once, sizes the per-batch
// scratch for the largest batch, then embeds every batch into its rows of sweep_res_ and runs
// each layer over every batch (output through res_, copied back into the batch's rows). Per
// batch the kernels and shapes are those of trunk_forward without backward: the same bits.
void TransformerCuda::sweep_trunk(UnitProviderCuda& p,
                                  const std::vector<ForwardBatch<float>>& batches, bool lm) {
  const cudaStream_t s = p.stream();
  sweep_offset_.assign(1, 0);
  size_t largest = 0;
  for (size_t i = 0; i < batches.size(); ++i) {
    const ForwardBatch<float>& b = batches[i];
    RLHF_CHECK(b.B >= 1 && b.seq_len >= 1, "batch must be non-empty, got B={} T={}", b.B,
               b.seq_len);
    set_geometry(b.B, b.seq_len, b.seqs);  // validates the packing and the samples' lengths
    const int64_t N = b.B * b.seq_len;
    check_ids(b.tokens, N, V_, false, "token id");
    if (lm) check_ids(b.targets, N, V_, true, "target");
    sweep_offset_.push_back(sweep_offset_.back() + N);
    if (N > batches[largest].B * batches[largest].seq_len) largest = i;
  }
  const int64_t total = sweep_offset_.back();
  reserve(batches[largest].B, batches[largest].seq_len, false, s, batches[largest].seqs);
  sweep_res_.resize(total * C_, "activations (residual streams of a forward sweep)");
  sweep_tokens_.resize(total);
  sweep_pos_.resize(total);
  if (lm) sweep_targets_.resize(total);
  // Host staging, alive until the sweep's closing synchronisation: tokens, positions, targets.
  sweep_host_ids_.assign(size_t(3 * total), -1);
  for (size_t i = 0; i < batches.size(); ++i) {
    const ForwardBatch<float>& b = batches[i];
    const int64_t off = sweep_offset_[i], N = b.B * b.seq_len;
    std::copy(b.tokens, b.tokens + N, sweep_host_ids_.begin() + off);
    set_segments(b.B, b.seq_len, b.seqs);  // positions restart at 0 per sample
    for (size_t j = 0; j + 1 < cu_.size(); ++j)
      for (int32_t n = cu_[j]; n < cu_[j + 1]; ++n)
        sweep_host_ids_[size_t(total + off + n)] = n - cu_[j];
    if (lm) std::copy(b.targets, b.targets + N, sweep_host_ids_.begin() + 2 * total + off);
  }
  const size_t bytes = size_t(total) * sizeof(int32_t);
  CUDA_CHECK(cudaMemcpyAsync(sweep_tokens_.get(), sweep_host_ids_.data(), bytes,
                             cudaMemcpyHostToDevice, s));
  CUDA_CHECK(cudaMemcpyAsync(sweep_pos_.get(), sweep_host_ids_.data() + total, bytes,
                             cudaMemcpyHostToDevice, s));
  if (lm)
    CUDA_CHECK(cudaMemcpyAsync(sweep_targets_.get(), sweep_host_ids_.data() + 2 * total, bytes,
                               cudaMemcpyHostToDevice, s));
  logits_kept_ = false;
  lora_drop_pass_ = 0;  // evaluation passes: no LoRA dropout
  stream_ = s;
  const int eu = layout_.embedding_unit();
  const bf16* emb = p.acquire_params(eu);
  for (size_t i = 0; i < batches.size(); ++i) {
    sweep_geometry(batches[i]);
    const int64_t off = sweep_offset_[i];
    embedding_forward_cuda(sweep_res_.get() + off * C_, sweep_tokens_.get() + off,
                           emb + layout_.unit(eu).at("embed_tokens.weight").offset, N_, C_, V_, s);
  }
  p.release_params(eu);
  sweep_layers(p, batches, sweep_offset_, sweep_res_.get(), sweep_pos_.get());
}

void TransformerCuda::sweep_outputs(const std::vector<float>& host,
                                    const std::vector<ForwardBatch<float>>& batches) const {
  for (size_t i = 0; i < batches.size(); ++i)
    std::copy(host.begin() + sweep_offset_[i], host.begin() + sweep_offset_[i + 1], batches[i].out);
}

void TransformerCuda::forward_lm_sweep(UnitProviderCuda& p,
                                       const std::vector<ForwardBatch<float>>& batches,
                                       float inv_temperature) {
  check_head(true, "forward_lm_sweep");
  if (batches.empty()) return idle_sweep(p, true);
  const cudaStream_t s = p.stream();
  p.begin_pass(false);
  sweep_trunk(p, batches, true);
  inv_temperature_ = inv_temperature;
  const int64_t total = sweep_offset_.back();
  sweep_lp_.resize(total);
  // One logits buffer for every batch's chunks (resizing mid-sweep would free it under kernels).
  int64_t chunk_max = 1;
  for (const ForwardBatch<float>& b : batches) {
    sweep_geometry(b);
    chunk_max = std::max(chunk_max, logit_chunk_rows());
  }
  logits_.resize(chunk_max * V_, "logits");
  head_forward(p, false, [&](const bf16* hp, const bf16* w) {
    for (size_t i = 0; i < batches.size(); ++i) {
      sweep_geometry(batches[i]);
      const int64_t off = sweep_offset_[i], chunk = logit_chunk_rows();
      final_norm(hp, sweep_res_.get() + off * C_, s);
      for (int64_t r0 = 0; r0 < N_; r0 += chunk) {
        const int64_t rows = std::min(chunk, N_ - r0);
        linear_forward_cuda(logits_.get(), lnf_.get() + r0 * C_, w, nullptr, rows, C_, V_, s);
        logprob_forward_cuda(sweep_lp_.get() + off + r0, lse_.get() + r0, entropy_.get() + r0,
                             logits_.get(), sweep_targets_.get() + off + r0, rows, V_,
                             inv_temperature, s);
      }
    }
  });
  std::vector<float> lp(static_cast<size_t>(total));
  CUDA_CHECK(cudaMemcpyAsync(lp.data(), sweep_lp_.get(), lp.size() * sizeof(float),
                             cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  sweep_outputs(lp, batches);
  entropy_valid_ = false;
}

void TransformerCuda::forward_scalar_sweep(UnitProviderCuda& p,
                                           const std::vector<ForwardBatch<float>>& batches) {
  check_head(false, "forward_scalar_sweep");
  if (batches.empty()) return idle_sweep(p, false);
  const cudaStream_t s = p.stream();
  p.begin_pass(false);
  sweep_trunk(p, batches, false);
  const int64_t total = sweep_offset_.back();
  sweep_values_.resize(total, "values");
  head_forward(p, false, [&](const bf16* hp, const bf16* score) {
    for (size_t i = 0; i < batches.size(); ++i) {
      sweep_geometry(batches[i]);
      const int64_t off = sweep_offset_[i];
      final_norm(hp, sweep_res_.get() + off * C_, s);
      linear_forward_cuda(sweep_values_.get() + off, lnf_.get(), score, nullptr, N_, C_, 1, s);
    }
  });
  std::vector<float> values(static_cast<size_t>(total));
  download_widened(values.data(), sweep_values_.get(), total, s);
  sweep_outputs(values, batches);
}

}  // namespace rlhf::model
#endif  // RLHF_CUDA
