// Process-level set-up shared by every command: the placement of the ranks (topology), the
// thread count, the training communicator, and the device each rank trains on.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "parallel/comm.h"
#include "parallel/topology.h"

namespace rlhf::parallel {

/// Placement and device choices, as plain values (OpenRLHF/vLLM flag names in the comments).
struct RuntimeOptions {
  int ranks_per_node = 0;             ///< --ranks_per_node (0 = detect; env RLHF_RANKS_PER_NODE)
  int gen_ranks_per_node = 0;         ///< --gen_ranks_per_node (0 = colocated)
  int threads = 0;                    ///< --threads (0 = cores / ranks on the node)
  std::string comm_backend = "auto";  ///< --comm_backend: auto | mpi | shm
  std::string device = "auto";        ///< --device: auto | cpu | cuda
  double comm_timeout = 1800;         ///< --comm_timeout: CPU collective watchdog (s, 0 = none)
  double nccl_timeout = 1800;         ///< --nccl_timeout (s, 0 = none)
  std::string attn_implementation = "flash";  ///< --attn_implementation: flash|cudnn|onednn|auto
  int tensor_parallel = 1;  ///< --vllm_tensor_parallel_size: ranks per generation engine
  /// --param_dtype resolved to bf16 for the CPU (app::cpu_bf16): CPU models compute in bf16
  bool bf16 = false;
};

/// Sets the OpenMP (and OpenBLAS) thread count of this rank: `threads` if > 0, else the node's
/// hardware threads divided by the ranks on this node (at least 1). Returns the count used.
int configure_threads(int threads);

/// Where a command's models run.
enum class Device { kCpu, kCuda };
/// "cpu", "cuda".
const char* device_name(Device d);

/// --device on this rank: "cpu"; "cuda" (throws rlhf::Error when the build has no CUDA or no GPU
/// is visible); "auto": cuda when built with CUDA and a GPU is visible, else cpu.
Device resolve_device(const std::string& flag);

/// Selects this rank's GPU: its local rank on its real (shared-memory) node of `world` modulo the
/// visible GPUs; returns the device. Collective over `world`. Throws rlhf::Error without CUDA.
int select_node_local_cuda_device(MPI_Comm world);

/// --attn_implementation's value in rlhf's terms: Hugging Face's names, as OpenRLHF scripts pass
/// them, mapped to what serves them here (flash_attention_2, flash_attention_3, sdpa: "auto", the
/// fastest fused attention that runs; eager: "flash", this project's own deterministic kernels);
/// rlhf's own names unchanged.
std::string attention_implementation_name(const std::string& flag);

/// --attn_implementation for every GPU attention of this process (model::set_attention_impl),
/// logged on rank 0: "cudnn" (cuDNN's fused attention where it serves the shape, the flash kernels
/// elsewhere), "auto" (cudnn where model::attention_cudnn_runtime_version() says cuDNN's fused
/// attention runs on this GPU, else flash), anything else "flash". Call after the GPU is
/// selected. No-op in a build without CUDA.
void use_attention_implementation(const std::string& name);

/// --attn_implementation for the CPU bf16 compute mode's attention (model::set_cpu_attention_bf16):
/// "onednn" = attention's products as bf16 oneDNN GEMMs (model/ops/attention_bf16.h); "auto" =
/// the same where this CPU's bf16 GEMMs beat fp32 ones (CpuBf16::kFaster: AMX, or AVX512-BF16 off
/// Intel) and the build has oneDNN; anything else = the fp32 kernels on the bf16-rounded q, k, v.
/// Logged on rank 0 when bf16 (the models compute in bf16 on the CPU). Throws rlhf::Error for
/// "onednn" without oneDNN.
void use_cpu_attention_implementation(const std::string& name, bool bf16);

/// Tokens a padded training micro-batch's length is rounded up to a multiple of while cuDNN's
/// attention is in use: cuDNN builds (compiles) a plan per (B, T), and RL micro-batches would
/// otherwise bring a new T at nearly every step. Right-padding is exact (causal attention: no real
/// position sees a pad; pads carry no loss), and costs at most 63 tokens a row.
inline constexpr int64_t kCudnnPadMultiple = 64;

/// The multiple (>= 1) the trainers round a padded micro-batch's T up to on `device`:
/// kCudnnPadMultiple while cuDNN attention is selected and can run, else 1.
int64_t training_pad_multiple(Device device);

/// Resolves opts.device on every rank (collective over the world: all ranks must agree; a job
/// where some ranks see a GPU and others do not is refused) and, for cuda, selects each rank's GPU
/// and the attention implementation. *cuda_device gets the device (-1 on cpu).
Device setup_device(const RuntimeOptions& opts, const Topology& topo, int* cuda_device);

/// Builds the topology (collective over MPI_COMM_WORLD; refuses placements that cannot be made,
/// with the reason, on every rank), prints the placement table on rank 0 and sets the thread count
/// (the count used goes to *threads when not null).
std::unique_ptr<Topology> setup_topology(const RuntimeOptions& opts, int* threads = nullptr);

/// What a training command runs on: the placement of every rank, the training communicator, and
/// the device.
struct TrainRuntime {
  std::unique_ptr<Topology> topology;
  std::unique_ptr<Comm> train_comm;  ///< nullptr on ranks that do not train
  /// With --device cuda and more than one training rank: an NCCL communicator over the same
  /// ranks as train_comm, for the device buffers of ZeRO-3 (train_comm keeps the host-side
  /// collectives). nullptr otherwise.
  std::unique_ptr<Comm> device_comm;
  Device device = Device::kCpu;
  int cuda_device = -1;  ///< the CUDA device of this rank (cuda only)
  int threads = 1;
  /// CPU models compute in bf16 (RuntimeOptions::bf16 on a CPU run; model/layer_bf16.h)
  bool bf16 = false;
  int rank() const { return topology->rank(); }
};

/// setup_topology, then train_comm (opts.comm_backend) and the device (setup_device; with cuda,
/// device_comm too). `needs_generation` = false refuses gen_ranks_per_node > 0 (a command that
/// only trains would leave those ranks idle). Collective over MPI_COMM_WORLD.
TrainRuntime setup_train_runtime(const RuntimeOptions& opts, bool needs_generation);

}  // namespace rlhf::parallel
