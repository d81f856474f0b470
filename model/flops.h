// FLOP counts for throughput and MFU figures.
#pragma once

#include <cstdint>

#include "model/config.h"

namespace rlhf::model {

/// Parameters that take part in matrix multiplications (projections, MLP, the LM head — counted
/// once even when tied to the embedding; the embedding lookup itself is not a matmul). Norm
/// weights and biases are excluded. GQA is honest: k/v projections are C·Hkv·D each.
int64_t matmul_params(const ModelConfig& c, HeadKind head = HeadKind::kLM);

/// Training FLOPs per token for a sequence of length T: 6·N_matmul + 6·L·H·D·T.
/// The first term is forward (2N) + backward (4N) of the matmuls (Kaplan et al. 2020, §2.1); the
/// second is PaLM's attention term 12·L·H·D·T (Chowdhery et al. 2022, App. B) halved because causal
/// attention computes only the lower triangle (the same as llm.c's 6·L·C·T when H·D = C).
double training_flops_per_token(const ModelConfig& c, int64_t T, HeadKind head = HeadKind::kLM);

/// Forward-only FLOPs per token (one third of the training figure).
double forward_flops_per_token(const ModelConfig& c, int64_t T, HeadKind head = HeadKind::kLM);

}  // namespace rlhf::model
