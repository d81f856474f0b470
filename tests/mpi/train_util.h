// Shared by the MPI tests: a small model, a deterministic global batch, k training steps on any
// ParamStore, consolidated weights, deterministic init.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#ifdef RLHF_CUDA
#include <cuda_runtime_api.h>
#endif

#include <mpi.h>

#include "core/cuda_check.h"
#include "model/init.h"
#include "model/transformer.h"
#include "parallel/param_store.h"
#include "parallel/train_model.h"
#include "tests/test_util.h"

namespace rlhf::test {

/// Whether every rank of `comm` holds the same 64-bit fingerprint (e.g. results_fingerprint of
/// what a tensor-parallel engine returned on each of its ranks). Collective over comm.
inline bool same_on_all_ranks(uint64_t fp, MPI_Comm comm) {
  uint64_t lo = 0, hi = 0;
  MPI_Allreduce(&fp, &lo, 1, MPI_UINT64_T, MPI_MIN, comm);
  MPI_Allreduce(&fp, &hi, 1, MPI_UINT64_T, MPI_MAX, comm);
  return lo == hi;
}

inline model::ModelConfig small_config(bool tied) {
  model::ModelConfig c;
  c.hidden_size = 32;
  c.intermediate_size = 56;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = 37;  // odd sizes: units are padded
  c.max_position_embeddings = 32;
  c.tie_word_embeddings = tied;
  c.bos_token_id = c.eos_token_id = c.pad_token_id = 0;
  return c;
}

// A global batch of kSeqs sequences of length kT; every rank can build it.
constexpr int64_t kSeqs = 8, kT = 12;
inline std::vector<int32_t> batch_tokens(int step, int64_t V) {
  return test::random_tokens(kSeqs * kT, V, 100 + uint64_t(step));
}

// One micro-batch: forward (lp out) and backward with dlp, accumulating into the store's grads.
using MicroStep = std::function<void(const int32_t* tokens, const int32_t* targets, int64_t micro,
                                     float* lp, const float* dlp)>;

// k optimizer steps of next-token training of the global batch, this rank taking sequences
// [first, first + count) in micro-batches of `micro` sequences. dlp = −1 / (global loss tokens).
inline std::vector<double> train_loop(parallel::ParamStore& store, const MicroStep& micro_step,
                                      const model::ModelConfig& cfg, int steps, int64_t first,
                                      int64_t count, int64_t micro) {
  optim::AdamWConfig adam;
  adam.lr = 3e-3;
  adam.weight_decay = 0.01;
  std::vector<double> norms;
  const float scale = -1.0f / float(kSeqs * (kT - 1));
  for (int s = 0; s < steps; ++s) {
    auto tokens = batch_tokens(s, cfg.vocab_size);
    store.zero_grads();
    for (int64_t m = first; m < first + count; m += micro) {
      std::vector<int32_t> tok(tokens.begin() + m * kT, tokens.begin() + (m + micro) * kT);
      std::vector<int32_t> tgt(tok.size());
      for (int64_t n = 0; n < micro * kT; ++n) tgt[n] = (n % kT == kT - 1) ? -1 : tok[n + 1];
      std::vector<float> lp(tok.size()), dlp(tok.size());
      for (size_t n = 0; n < tok.size(); ++n) dlp[n] = tgt[n] >= 0 ? scale : 0.0f;
      micro_step(tok.data(), tgt.data(), micro, lp.data(), dlp.data());
    }
    norms.push_back(parallel::clip_and_step(store, adam, adam.lr, s + 1, 1.0));
  }
  return norms;
}

// train_loop with the CPU model over the store's provider.
inline std::vector<double> train(parallel::ParamStore& store, const model::ModelConfig& cfg,
                                 int steps, int64_t first, int64_t count, int64_t micro) {
  model::Transformer<float> net(store.layout(), false);
  return train_loop(
      store,
      [&](const int32_t* tok, const int32_t* tgt, int64_t mb, float* lp, const float* dlp) {
        net.forward_lm(store.provider(), tok, tgt, mb, kT, lp, nullptr, true);
        net.backward_lm(store.provider(), dlp, nullptr);
      },
      cfg, steps, first, count, micro);
}

// train_loop with a TrainModel (CPU or GPU).
inline std::vector<double> train(parallel::TrainModel& m, const model::ModelConfig& cfg, int steps,
                                 int64_t first, int64_t count, int64_t micro) {
  return train_loop(
      m.store(),
      [&](const int32_t* tok, const int32_t* tgt, int64_t mb, float* lp, const float* dlp) {
        m.forward_lm(tok, tgt, mb, kT, lp, nullptr, true);
        m.backward_lm(dlp, nullptr);
      },
      cfg, steps, first, count, micro);
}

inline std::vector<std::vector<float>> full_weights(parallel::ParamStore& store) {
  std::vector<std::vector<float>> w;
  for (int u = 0; u < store.layout().num_units(); ++u) {
    w.emplace_back(size_t(store.layout().unit(u).numel));
    store.gather_unit(u, w.back().data());
  }
  return w;
}

// Selects this rank's CUDA device (its node-local rank modulo the devices) when every rank of the
// world can have a device of its own and the build has NCCL; false otherwise (CPU build, no device,
// more ranks on a node than devices), after which the caller skips. Collective over the world.
inline bool select_gpu_per_rank() {
#if defined(RLHF_CUDA) && defined(RLHF_NCCL)
  int ndev = cuda_device_count();
#else
  int ndev = 0;
#endif
  MPI_Allreduce(MPI_IN_PLACE, &ndev, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local = 0, local_size = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
  int fits = ndev > 0 && local_size <= ndev ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &fits, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
#if defined(RLHF_CUDA) && defined(RLHF_NCCL)
  if (fits == 1) CUDA_CHECK(cudaSetDevice(local % ndev));
#endif
  return fits == 1;
}

inline void init_store(parallel::ParamStore& store, uint64_t seed) {
  for (int u = 0; u < store.layout().num_units(); ++u) {
    std::vector<float> full(size_t(store.layout().unit(u).numel));
    model::init_unit_params(full.data(), store.layout().unit(u), seed, 0.1);
    store.load_unit(u, full.data());
  }
}

}  // namespace rlhf::test
