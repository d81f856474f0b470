// Token sampling for generation: greedy, temperature, top-k, top-p (nucleus), with a counter-based
// random stream per (seed, request, sample, step), so a request's tokens do not depend on which
// other requests share its batch or in which order they were submitted.
#pragma once

#include <cstdint>
#include <vector>

#include "model/ops/cuda_types.h"

namespace rlhf::rollout {

/// How the next token is chosen (OpenRLHF / vLLM names and defaults).
struct SamplingParams {
  double temperature = 1.0;  ///< ≥ 0; logits are divided by it; 0 means greedy
  double top_p = 1.0;        ///< (0, 1]; 1 = off
  int64_t top_k = -1;        ///< -1 or 0 = off; else keep the k most likely tokens
  bool greedy = false;       ///< argmax (lowest id on ties), also implied by temperature 0
  uint64_t seed = 42;        ///< per-request seed of the random stream

  bool is_greedy() const { return greedy || temperature == 0.0; }
  /// Whether top-k or top-p cut the distribution over a vocabulary of V tokens (greedy aside).
  bool truncates(int64_t V) const { return (top_k > 0 && top_k < V) || top_p < 1.0; }
  /// Throws rlhf::Error naming the field when a value is out of range (temperature < 0 or not
  /// finite, top_p outside (0, 1], top_k < -1).
  void validate() const;
};

/// splitmix64's finaliser applied to x + golden gamma: a bijective 64-bit mix.
uint64_t mix64(uint64_t x);

/// The uniform draw in [0, 1) (53 random bits) for token `step` (0 = the first generated token)
/// of sample `sample_index` of request `request_id` under `seed`: a pure function of the four
/// keys (a counter-based generator, Salmon et al. 2011's idea with splitmix64 as the mix).
double counter_uniform(uint64_t seed, uint64_t request_id, uint64_t sample_index, uint64_t step);

/// One sampled token and its log-probability.
struct SampledToken {
  int32_t token = -1;
  /// log softmax(logits / T)[token] over the whole vocabulary (T = temperature, or 1 when
  /// greedy): what the trainer recomputes with inv_temperature = 1/T. Not the log-probability
  /// under the top-k/top-p truncated distribution.
  float logprob = 0;
};

/// Samples rows of logits. Holds scratch space sized for the vocabulary, so use one per thread.
///
/// Sampling distribution (HF transformers' / vLLM's order of warpers): z = logits / T; top-k
/// keeps the k largest z (ties broken by the lower token id, so exactly k); top-p keeps, among
/// those, the shortest prefix in descending order whose probability mass (renormalised over the
/// top-k set) is ≥ top_p — at least one token; the token is then drawn from the renormalised kept
/// set by inverting its CDF at u. Without top-k/top-p the CDF runs over the vocabulary in id order.
/// Greedy: the lowest id among the maxima of the logits.
class Sampler {
 public:
  explicit Sampler(int64_t vocab_size);
  int64_t vocab_size() const { return V_; }

  /// Samples from one row of V logits with the uniform draw u ∈ [0, 1) (ignored when greedy).
  /// Logits must be finite (rlhf::Error otherwise, naming the first bad id).
  SampledToken sample(const float* logits, const SamplingParams& p, double u);

  /// The tokens `sample` may return for these logits and parameters, in descending probability
  /// (the whole vocabulary in id order when neither top-k nor top-p applies; one token when
  /// greedy). For tests and diagnostics.
  std::vector<int32_t> support(const float* logits, const SamplingParams& p);

 private:
  // Fills e_ = exp(z − max z) for z = logits·inv_t, block sums, and returns lse = max z + log Σe.
  double prepare(const float* logits, double inv_t);
  // The kept set in descending order into kept_ (top-k, then top-p); returns its mass Σ e.
  double truncate(const float* logits, const SamplingParams& p);

  int64_t V_;
  std::vector<float> e_;        // (V) exp(z − max z)
  std::vector<double> block_;   // (V / kBlock) sums of e_
  std::vector<int32_t> order_;  // (V) token ids, partially sorted by descending logit
  std::vector<int32_t> kept_;   // the kept set, descending
  double sum_e_ = 0;            // Σ e_ over the vocabulary
};

#ifdef RLHF_CUDA
/// Sampler::sample of B rows on the device, for the parameters that cut nothing
/// (!SamplingParams::truncates) and for greedy: one block per row reads its V bf16 logits (as
/// fp32) twice — max z (and the greedy argmax, lowest id on ties), then Σ exp(z − max z) in
/// blocks of 256 tokens — and one thread inverts the CDF in id order at u[b]·Σ, the host
/// Sampler's walk. Results: token (B) int32 and logprob (B) fp32 = z[token] − lse, device
/// arrays; a row whose logits are not finite (NaN, +inf, all −inf) gets token −1 and logprob NaN.
/// logits: (B, V) bf16 device; inv_temperature: (B) fp32 device, float(1/T), 0 = greedy (z = the
/// logits); u: (B) fp64 device, counter_uniform draws (ignored when greedy). Within exp's last
/// bits of the host Sampler on the same values (expf against exp_fast): the same token unless u
/// falls within ~1e-6 of a CDF boundary, the log-prob within 1e-5. A row's result does not
/// depend on the other rows. Throws rlhf::Error if B < 0, V <= 0, or V > 3,145,728 (the block
/// sums' shared memory).
void sample_rows_cuda(int32_t* token, float* logprob, const model::bf16* logits, int64_t B,
                      int64_t V, const float* inv_temperature, const double* u,
                      cudaStream_t stream);
#endif

}  // namespace rlhf::rollout
