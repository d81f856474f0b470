// Teacher-forced scoring (`rlhf score`): the log-probabilities a model gives a known response after
// a prompt, and the perplexity of a plain text. No sampling, no engine: one forward of the training
// Transformer per sequence (or per window), in float32, on this rank's full copy of the model.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/local_provider.h"
#include "model/transformer.h"

namespace rlhf::rl {

/// A model held whole in this process (model::LocalParams) with its forward. Not thread-safe.
class Scorer {
 public:
  /// Allocates the parameters of `layout` (LM head); fill them through unit_buffers().
  explicit Scorer(const model::ParamLayout& layout);

  /// One buffer per unit of the layout (numel floats each), for io::load_model_weights.
  std::vector<float*> unit_buffers();

  /// log p(response[j] | prompt, response[:j]) for every response token, nats, float64 sums of a
  /// float32 forward: out has response.size() entries. prompt must hold at least one token (the
  /// first response token needs a context); prompt.size() + response.size() must not exceed the
  /// model's max_position_embeddings. Throws rlhf::Error otherwise or for an id outside the
  /// vocabulary.
  std::vector<double> response_logprobs(std::span<const int32_t> prompt,
                                        std::span<const int32_t> response);

  /// Log-probabilities of the tokens of a long text, scored in windows of at most `window` tokens
  /// as Hugging Face's strided perplexity does: a window starts every `stride` tokens, sees up to
  /// `window` tokens of context and scores only the tokens after the previous window's end (the
  /// first token of a window has no context in it and is never scored). With stride < window every
  /// token but ids[0] is scored (ids.size() - 1 values); with stride == window each window's first
  /// token is skipped. Needs 1 <= stride <= window, 2 <= window <= max_position_embeddings;
  /// throws rlhf::Error otherwise.
  std::vector<double> text_logprobs(std::span<const int32_t> ids, int64_t window, int64_t stride);

  const model::ParamLayout& layout() const { return params_.layout(); }

  /// Score in bf16 (model::Transformer::set_bf16; throws rlhf::Error without oneDNN) or fp32.
  void set_bf16(bool on) { net_.set_bf16(on); }

 private:
  // lp of targets within one sequence: lp[t] = log p(tokens[t+1] | tokens[..t]) for t in
  // [from, tokens.size() - 1); returns those values.
  std::vector<double> forward(std::span<const int32_t> tokens, int64_t from);

  model::LocalParams<float> params_;
  model::Transformer<float> net_;
};

/// Mean negative log-likelihood (nats per token) of `logprobs`; 0 for none.
double mean_nll(std::span<const double> logprobs);

}  // namespace rlhf::rl
