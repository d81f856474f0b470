// Process-level set-up shared by the subcommands: threads per rank, model construction and
// initialisation (random or from a checkpoint).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "app/cli.h"
#include "io/pretrained.h"
#include "io/tokenizer.h"
#include "model/config.h"
#include "model/layout.h"
#include "optim/adamw.h"
#include "parallel/comm.h"
#include "parallel/param_store.h"
#include "parallel/topology.h"
#include "parallel/train_model.h"
#include "rollout/engine.h"

namespace rlhf::app {

/// Sets the OpenMP (and OpenBLAS) thread count of this rank: `threads` if > 0, else the node's
/// hardware threads divided by the ranks on this node (at least 1). Returns the count used.
int configure_threads(int threads);

/// Where a model comes from: a config for random init, or a pretrained model in any supported
/// format (io/pretrained.h), with the tokenizer that came with it.
struct ModelSource {
  model::ModelConfig config;
  model::HeadKind head = model::HeadKind::kLM;
  std::string checkpoint;  ///< the model file/folder weights come from; "" = random init
  std::string format;      ///< "hdf5" | "safetensors" | "llama2c" | "gguf"; "" = random init
  /// The opened model (weights are read lazily by initialize_weights); null for random init.
  std::shared_ptr<const io::PretrainedModel> pretrained;
  /// The model's tokenizer (or --tokenizer's); null when there is none (random init without
  /// --tokenizer, or a llama2.c file with no tokenizer next to it).
  std::shared_ptr<const io::Tokenizer> tokenizer;
  std::string describe() const;
};

/// Resolves --model_config / --pretrain / --tokenizer. --pretrain takes any format of
/// io::open_pretrained; a directory means `<dir>/model.h5` when that exists, else a Hugging Face
/// folder. Throws rlhf::Error naming the flag when the file is missing or unreadable, or when the
/// checkpoint's head is not `want_head` (an LM trunk may start a value or reward model).
ModelSource resolve_model_source(const ModelArgs& args, model::HeadKind want_head);

/// io::open_pretrained(pretrain, tokenizer) with errors prefixed by "--pretrain <path>: ".
io::PretrainedModel open_pretrained_arg(const std::string& pretrain, const std::string& tokenizer);

/// The tokenizer a command uses: the model's own (ModelSource::tokenizer), else the byte tokenizer.
/// Throws rlhf::Error when the tokenizer's vocabulary is larger than the model's vocab_size.
std::shared_ptr<const io::Tokenizer> model_tokenizer(const ModelSource& src);

/// Fills the store's master weights: from the pretrained model (shapes checked) or a deterministic
/// random init with `seed` (the same weights for any rank count). A value/reward model started
/// from an LM keeps the trunk and the final norm and initialises score.weight randomly.
void initialize_weights(parallel::ParamStore& store, const ModelSource& src, uint64_t seed);

/// Fills full (unsharded) unit buffers (unit_buffers[u] has layout.unit(u).numel_padded floats)
/// from a pretrained source of any format, after checking that its config and head equal the
/// layout's (e.g. a generation engine's buffers). Throws rlhf::Error for a random-init source.
void load_model_weights(const ModelSource& src, const model::ParamLayout& layout,
                        const std::vector<float*>& unit_buffers);

/// Writes the store's consolidated model to `path` (HDF5, .tmp + rename) from rank 0; collective.
/// With a tokenizer, its files go under /tokenizer so the checkpoint restores it.
/// Returns (and rank 0 logs) a fingerprint of the weights: FNV-1a 64 over the fp32 bytes of every
/// tensor in layout order — equal fingerprints mean bit-identical weights.
uint64_t save_model(parallel::ParamStore& store, const std::string& path, int rank,
                    const io::Tokenizer* tokenizer = nullptr);

/// Where a command's models train.
enum class Device { kCpu, kCuda };
/// "cpu", "cuda".
const char* device_name(Device d);

/// --device on this rank: "cpu"; "cuda" (throws rlhf::Error when the build has no CUDA or no GPU
/// is visible); "auto": cuda when built with CUDA and a GPU is visible, else cpu.
Device resolve_device(const std::string& flag);

/// Selects this rank's GPU: its local rank on its real (shared-memory) node of `world` modulo the
/// visible GPUs; returns the device. Collective over `world`. Throws rlhf::Error without CUDA.
int select_node_local_cuda_device(MPI_Comm world);

/// Resolves --device on every rank (collective over the world: all ranks must agree; a job where
/// some ranks see a GPU and others do not is refused) and, for cuda, selects each rank's GPU: its
/// local rank on its real node modulo the visible GPUs. *cuda_device gets the device (-1 on cpu).
Device setup_device(const ParallelArgs& args, const parallel::Topology& topo, int* cuda_device);

/// The generation engine's options from the generation flags and the device: --gen_kv_cache_mb
/// (CPU), --vllm_gpu_memory_utilization and --enforce_eager (GPU), --gen_max_num_seqs.
rollout::EngineOptions engine_options(const GenerationArgs& gen, Device device,
                                      parallel::Comm* tp_comm, int32_t eos_token_id);

/// What a training command runs on: the placement of every rank, the training communicator, and
/// the device.
struct TrainRuntime {
  std::unique_ptr<parallel::Topology> topology;
  std::unique_ptr<parallel::Comm> train_comm;  ///< nullptr on ranks that do not train
  /// With --device cuda and more than one training rank: an NCCL communicator over the same
  /// ranks as train_comm, for the device buffers of ZeRO-3 (train_comm keeps the host-side
  /// collectives). nullptr otherwise.
  std::unique_ptr<parallel::Comm> device_comm;
  Device device = Device::kCpu;
  int cuda_device = -1;  ///< the CUDA device of this rank (cuda only)
  int threads = 1;
  int rank() const { return topology->rank(); }
};

/// Builds the topology (collective over MPI_COMM_WORLD; refuses placements that cannot be made,
/// with the reason, on every rank), prints the placement table on rank 0 and sets the thread count
/// (configure_threads(args.threads); the count used goes to *threads when not null). For commands
/// that need no training communicator (`rlhf generate`).
std::unique_ptr<parallel::Topology> setup_topology(const ParallelArgs& args, int tensor_parallel,
                                                   int* threads = nullptr);

/// Builds the topology (collective over MPI_COMM_WORLD; refuses placements that cannot be made,
/// with the reason), prints the placement table on rank 0, sets the thread count, and makes
/// train_comm with --comm_backend. Resolves --device on every rank (all ranks must agree; a job
/// where some ranks see a GPU and others do not is refused); with cuda, selects the GPU of each
/// rank (its local rank on its real node, modulo the visible GPUs) and makes device_comm.
/// `needs_generation` = false refuses --gen_ranks_per_node > 0 (a command that only trains would
/// leave those ranks idle).
TrainRuntime setup_train_runtime(const ParallelArgs& args, int tensor_parallel,
                                 bool needs_generation);

/// The training state for --zero_stage: ZeRO-3 shards (with --adam_offload, --zero_keep_params),
/// or ZeRO-0 replicas (all-reduced gradients), or whole local buffers on a single rank.
/// `layout` must be padded for train_comm's size. Throws rlhf::Error for --adam_offload with
/// --zero_stage 0.
std::unique_ptr<parallel::ParamStore> make_param_store(const model::ParamLayout& layout,
                                                       parallel::Comm& comm, const ZeroArgs& z);

/// The model a training command trains (or scores with, frozen) on rt's device: on the CPU the
/// store of make_param_store (frozen: a weights-only ZeRO-3 store) with Transformer<float>; on
/// the GPU a DeviceZero3Store over rt.device_comm with TransformerCuda. `layout` must be padded
/// for train_comm's size. Call on training ranks only.
std::unique_ptr<parallel::TrainModel> make_train_model(const model::ParamLayout& layout,
                                                       TrainRuntime& rt, const ZeroArgs& z,
                                                       bool frozen = false);

/// Logs this rank's memory (rank 0 prints the max over ranks of each part): params, grads,
/// optimizer, gather buffers, activations and the process's peak resident size.
void log_memory(const parallel::ParamStore& store, int64_t activation_bytes, parallel::Comm& comm);

/// Peak resident set size of this process in bytes (getrusage).
int64_t peak_rss_bytes();

/// AdamW hyper-parameters from --learning_rate (or `lr`), --adam_betas, --l2 (validated).
optim::AdamWConfig make_adamw(const OptimArgs& args, double lr);

/// The shuffled sample order of each epoch: a permutation of [0, n) drawn from (seed, epoch), the
/// same on every rank and for every rank count (OpenRLHF's DistributedSampler with shuffle).
class EpochOrder {
 public:
  EpochOrder(int64_t n, uint64_t seed) : n_(n), seed_(seed) {}
  /// The index at global position `pos` (pos / n is the epoch).
  int64_t at(int64_t pos);

 private:
  int64_t n_;
  uint64_t seed_;
  int64_t epoch_ = -1;
  std::vector<int64_t> order_;
};

/// "12.3 MiB"-style byte count.
std::string format_bytes(double bytes);

}  // namespace rlhf::app
