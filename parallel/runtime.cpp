#include "parallel/runtime.h"

#include <omp.h>

#include <cblas.h>

#include <algorithm>
#include <thread>

#include "core/cpu_features.h"
#include "core/cuda_check.h"
#include "core/device_memory.h"
#include "core/error.h"
#include "core/log.h"
#include "model/ops/attention.h"
#include "model/ops/attention_bf16.h"
#include "model/ops/matmul_bf16.h"
#include "parallel/mpi_check.h"
#include "parallel/watchdog.h"

namespace rlhf::parallel {

int configure_threads(int threads) {
  if (threads <= 0) {
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int local = 1;
    MPI_Comm_size(node, &local);
    MPI_Comm_free(&node);
    const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads = std::max(1, hw / local);
  }
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  return threads;
}

std::unique_ptr<Topology> setup_topology(const RuntimeOptions& opts, int* threads) {
  TopologyOptions topt;
  topt.ranks_per_node = resolve_ranks_per_node(opts.ranks_per_node);
  topt.gen_ranks_per_node = opts.gen_ranks_per_node;
  topt.tensor_parallel = opts.tensor_parallel;
  start_comm_watchdog(opts.comm_timeout, comm_rank(MPI_COMM_WORLD));
  publish_watch_peers(MPI_COMM_WORLD);  // lets a firing watchdog name a stopped or dead peer
  auto topo = std::make_unique<Topology>(MPI_COMM_WORLD, topt);
  const std::string table = topo->placement_table();
  if (topo->rank() == 0) {
    LOG0_INFO("placement ({} ranks, {} nodes):", topo->size(), topo->placement().num_nodes());
    std::string line;
    for (char c : table) {
      if (c == '\n') {
        LOG0_INFO("  {}", line);
        line.clear();
      } else {
        line += c;
      }
    }
    if (!line.empty()) LOG0_INFO("  {}", line);
  }
  const int t = configure_threads(opts.threads);
  if (threads != nullptr) *threads = t;
  return topo;
}

TrainRuntime setup_train_runtime(const RuntimeOptions& opts, bool needs_generation) {
  TrainRuntime rt;
  RLHF_CHECK(needs_generation || opts.gen_ranks_per_node == 0,
             "--gen_ranks_per_node {}: this command only trains, so generation ranks would idle\n"
             "hint: use --gen_ranks_per_node 0",
             opts.gen_ranks_per_node);
  rt.topology = setup_topology(opts, &rt.threads);
  const CommKind kind = comm_kind_from_name(opts.comm_backend);
  // make_comm is collective over train_comm's members only; ranks outside get nullptr.
  rt.train_comm = make_comm(rt.topology->train_comm(), "train_comm", kind);

  rt.device = setup_device(opts, *rt.topology, &rt.cuda_device);
  rt.bf16 = opts.bf16 && rt.device == Device::kCpu;
  if (rt.device == Device::kCuda) {
    rt.device_comm = make_comm(rt.topology->train_comm(), "train_comm_nccl", CommKind::kNccl, {},
                               opts.nccl_timeout);
    if (rt.device_comm && rt.device_comm->size() == 1) rt.device_comm.reset();
  }
  return rt;
}

int select_node_local_cuda_device(MPI_Comm world) {
#ifdef RLHF_CUDA
  // The rank's local rank on its real (shared-memory) node, not the simulated node of
  // --ranks_per_node, so that simulated nodes on one host do not share GPUs.
  MPI_Comm shm = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shm));
  int local = 0;
  const int rc = MPI_Comm_rank(shm, &local);
  MPI_Comm_free(&shm);
  MPI_CHECK(rc);
  return select_cuda_device(local);
#else
  (void)world;
  RLHF_FAIL("this build has no CUDA backend");
#endif
}

Device setup_device(const RuntimeOptions& opts, const Topology& topo, int* cuda_device) {
  const Device device = resolve_device(opts.device);
  const MPI_Comm world = topo.world();
  int cuda = device == Device::kCuda ? 1 : 0, lo = 0, hi = 0;
  WatchScope watch("device agreement", "world");
  MPI_CHECK(MPI_Allreduce(&cuda, &lo, 1, MPI_INT, MPI_MIN, world));
  MPI_CHECK(MPI_Allreduce(&cuda, &hi, 1, MPI_INT, MPI_MAX, world));
  RLHF_CHECK(lo == hi,
             "--device {}: some ranks found a GPU and others did not\nhint: give every rank a "
             "GPU (srun --gpus-per-task=1), or run with --device cpu",
             opts.device);
  if (cuda_device != nullptr) *cuda_device = -1;
  if (device == Device::kCpu) {
    LOG0_INFO("device: cpu");
    use_cpu_attention_implementation(opts.attn_implementation, opts.bf16);
    return device;
  }
#ifdef RLHF_CUDA
  const int dev = select_node_local_cuda_device(world);
  if (cuda_device != nullptr) *cuda_device = dev;
  use_attention_implementation(opts.attn_implementation);
  LOG0_INFO("device: cuda, one GPU per rank (rank 0: device {}, {})", dev, cuda_device_summary());
#endif
  return device;
}

std::string attention_implementation_name(const std::string& flag) {
  if (flag == "flash_attention_2" || flag == "flash_attention_3" || flag == "sdpa") return "auto";
  if (flag == "eager") return "flash";
  return flag;
}

namespace {

// The flag as the start-up line shows it: "sdpa = auto" when a Hugging Face name was mapped.
std::string shown_implementation(const std::string& flag, const std::string& name) {
  return flag == name ? flag : fmt::format("{} = {}", flag, name);
}

}  // namespace

void use_attention_implementation(const std::string& flag) {
  const std::string name = attention_implementation_name(flag);
  const std::string shown = shown_implementation(flag, name);
#ifdef RLHF_CUDA
  const int64_t v = model::attention_cudnn_runtime_version();
  const std::string cudnn =
      v > 0 ? fmt::format("cuDNN {}.{}.{}", v / 10000, v / 100 % 100, v % 100) : std::string();
  const bool use_cudnn = name == "cudnn" || (name == "auto" && v > 0);
  model::set_attention_impl(use_cudnn ? model::AttentionImpl::kCudnn
                                      : model::AttentionImpl::kFlash);
  if (use_cudnn && v > 0)
    LOG0_INFO(
        "attention: {} fused attention (--attn_implementation {}) wherever it serves the shape, "
        "the flash kernels elsewhere; padded training micro-batches are rounded up to a multiple "
        "of {} tokens so that few shapes need a plan",
        cudnn, shown, kCudnnPadMultiple);
  else if (use_cudnn)
    LOG0_WARN(
        "attention: --attn_implementation cudnn, but cuDNN's fused attention cannot run here (a "
        "build without cuDNN or cudnn-frontend, or the GPU/cuDNN version); the flash kernels "
        "serve every shape");
  else
    LOG0_INFO("attention: the flash kernels (--attn_implementation {}{})", shown,
              name == "auto" ? ": no cuDNN fused attention in this build or on this GPU" : "");
#else
  (void)name, (void)shown;
#endif
}

void use_cpu_attention_implementation(const std::string& flag, bool bf16) {
  const std::string name = attention_implementation_name(flag);
  const std::string shown = shown_implementation(flag, name);
  const bool faster = cpu_bf16_class(cpu_features()) == CpuBf16::kFaster;
  RLHF_CHECK(name != "onednn" || model::onednn_available(),
             "--attn_implementation onednn: this build has no oneDNN\nhint: --attn_implementation "
             "auto, or install libdnnl-dev (scripts/install-deps.sh) and rebuild");
  const bool on = name == "onednn" || (name == "auto" && faster && model::onednn_available());
  model::set_cpu_attention_bf16(on);
  if (!bf16) return;
  if (on)
    LOG0_INFO("attention: bf16 products through oneDNN (--attn_implementation {})", shown);
  else
    LOG0_INFO("attention: the fp32 kernels on bf16-rounded q, k, v (--attn_implementation {}{})",
              shown, name == "auto" ? ": this CPU's bf16 GEMMs are no faster than fp32 ones" : "");
}

int64_t training_pad_multiple(Device device) {
#ifdef RLHF_CUDA
  if (device == Device::kCuda && model::attention_impl() == model::AttentionImpl::kCudnn &&
      model::attention_cudnn_runtime_version() > 0)
    return kCudnnPadMultiple;
#else
  (void)device;
#endif
  return 1;
}

const char* device_name(Device d) {
  return d == Device::kCuda ? "cuda" : "cpu";
}

Device resolve_device(const std::string& flag) {
  if (flag == "cpu") return Device::kCpu;
  const bool have = cuda_device_count() > 0;
  if (flag == "cuda") {
#ifndef RLHF_CUDA
    RLHF_FAIL(
        "--device cuda: this build has no CUDA backend\nhint: rebuild where the CUDA toolkit is "
        "found (cmake -DRLHF_CUDA=ON), or run with --device cpu");
#endif
    RLHF_CHECK(have,
               "--device cuda: no CUDA device is visible ({})\nhint: check CUDA_VISIBLE_DEVICES "
               "and the job's GPU allocation, or run with --device cpu",
               cuda_device_summary());
    return Device::kCuda;
  }
  RLHF_CHECK(flag == "auto", "--device must be auto, cpu or cuda, got '{}'", flag);
  return have ? Device::kCuda : Device::kCpu;
}

}  // namespace rlhf::parallel
