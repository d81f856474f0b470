#include "app/runtime.h"

#include <nlohmann/json.hpp>

#include <mpi.h>
#include <omp.h>

#include <cblas.h>

#include <sys/resource.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "core/cuda_check.h"
#include "core/error.h"
#include "core/log.h"
#include "io/hdf5_ckpt.h"
#include "io/model_config_file.h"
#include "io/tokenizer_hdf5.h"
#include "model/init.h"
#include "model/ops/attention.h"
#include "parallel/mpi_check.h"
#include "parallel/zero3.h"

#ifdef RLHF_CUDA
#include "core/device_memory.h"
#include "parallel/device_store.h"
#endif

namespace rlhf::app {

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

std::string ModelSource::describe() const {
  if (checkpoint.empty()) return "random init";
  if (format == "hdf5") return "checkpoint " + checkpoint;
  return pretrained ? pretrained->detail + " " + checkpoint : format + " " + checkpoint;
}

ModelSource resolve_model_source(const ModelArgs& args, model::HeadKind want_head) {
  namespace fs = std::filesystem;
  ModelSource src;
  src.head = want_head;
  if (!args.model_config.empty()) {
    RLHF_CHECK(fs::exists(args.model_config), "--model_config {}: no such file", args.model_config);
    src.config = io::load_model_config_file(args.model_config);
    if (!args.tokenizer.empty()) src.tokenizer = io::make_tokenizer(args.tokenizer);
    return src;
  }
  // A folder is our checkpoint folder (model.h5) unless it is a Hugging Face folder.
  std::string path = args.pretrain;
  if (fs::is_directory(path) &&
      (fs::exists(fs::path(path) / "model.h5") || !fs::exists(fs::path(path) / "config.json")))
    path = (fs::path(path) / "model.h5").string();
  RLHF_CHECK(fs::exists(path), "--pretrain {}: no such file{}", args.pretrain,
             path != args.pretrain ? " (looked for " + path + ")" : "");
  auto m = std::make_shared<io::PretrainedModel>(open_pretrained_arg(path, args.tokenizer));
  // An LM supplies the trunk of a value/reward model; a reward model initialises a critic whole
  // (OpenRLHF's default: the critic starts from --reward_pretrain; both heads are score.weight).
  RLHF_CHECK(m->head == want_head ||
                 (want_head != model::HeadKind::kLM && m->head == model::HeadKind::kLM) ||
                 (want_head == model::HeadKind::kValue && m->head == model::HeadKind::kReward),
             "--pretrain {}: the checkpoint has a '{}' head, this command needs '{}'", path,
             model::to_string(m->head), model::to_string(want_head));
  src.config = m->config;
  src.checkpoint = m->path;
  src.format = m->format;
  src.tokenizer = m->tokenizer;
  src.pretrained = std::move(m);
  src.head = want_head;
  return src;
}

io::PretrainedModel open_pretrained_arg(const std::string& pretrain, const std::string& tokenizer) {
  try {
    return io::open_pretrained(pretrain, tokenizer);
  } catch (const Error& e) {
    throw Error(fmt::format("--pretrain {}: {}", pretrain, e.what()), e.where());
  }
}

std::shared_ptr<const io::Tokenizer> model_tokenizer(const ModelSource& src) {
  std::shared_ptr<const io::Tokenizer> tok = src.tokenizer;
  if (!tok) tok = io::make_tokenizer("byte");
  RLHF_CHECK(tok->vocab_size() <= src.config.vocab_size,
             "the tokenizer {} has {} tokens but the model's vocab_size is {}\nhint: set "
             "vocab_size >= {} in the model config, or give the model's own tokenizer with "
             "--tokenizer",
             tok->name(), tok->vocab_size(), src.config.vocab_size, tok->vocab_size());
  return tok;
}

void initialize_weights(parallel::ParamStore& store, const ModelSource& src, uint64_t seed) {
  const model::ParamLayout& layout = store.layout();
  const io::PretrainedModel* m = src.pretrained.get();
  std::vector<float> full;
  for (int u = 0; u < layout.num_units(); ++u) {
    const model::UnitLayout& unit = layout.unit(u);
    full.assign(static_cast<size_t>(unit.numel_padded), 0.0f);
    // A pretrained LM supplies the trunk of a value/reward model; its new head is random.
    // A reward model's score head starts a critic's value head (same shape and name).
    const bool same_head =
        m && (m->head == layout.head() ||
              (layout.head() == model::HeadKind::kValue && m->head == model::HeadKind::kReward));
    const bool from_ckpt = m && (unit.kind != model::UnitKind::kHead || same_head);
    if (from_ckpt) {
      io::load_pretrained_unit(*m, layout, u, full.data());
    } else {
      model::init_unit_params(full.data(), unit, seed);
      if (m && unit.kind == model::UnitKind::kHead) {
        // Keep the pretrained final norm; only score.weight is new.
        const auto& norm = unit.at("model.norm.weight");
        m->tensors->read_checked("model.norm.weight", full.data() + norm.offset, norm.shape);
      }
    }
    store.load_unit(u, full.data());
  }
}

void load_model_weights(const ModelSource& src, const model::ParamLayout& layout,
                        const std::vector<float*>& unit_buffers) {
  RLHF_CHECK(src.pretrained != nullptr, "no pretrained model to load weights from");
  RLHF_CHECK(static_cast<int>(unit_buffers.size()) == layout.num_units(),
             "load_model_weights: {} unit buffers for {} units", unit_buffers.size(),
             layout.num_units());
  const io::PretrainedModel& m = *src.pretrained;
  RLHF_CHECK(m.config.to_json() == layout.config().to_json() && m.head == layout.head(),
             "{}: the model's config or head differs from the one being loaded", m.path);
  for (int u = 0; u < layout.num_units(); ++u)
    io::load_pretrained_unit(m, layout, u, unit_buffers[static_cast<size_t>(u)]);
}

uint64_t save_model(parallel::ParamStore& store, const std::string& path, int rank,
                    const io::Tokenizer* tokenizer) {
  const model::ParamLayout& layout = store.layout();
  std::vector<std::vector<float>> units(static_cast<size_t>(layout.num_units()));
  std::vector<const float*> ptrs;
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the real elements' bytes, in unit order
  for (int u = 0; u < layout.num_units(); ++u) {
    units[size_t(u)].resize(static_cast<size_t>(layout.unit(u).numel_padded));
    store.gather_unit(u, units[size_t(u)].data());
    ptrs.push_back(units[size_t(u)].data());
    for (const model::TensorInfo& t : layout.unit(u).tensors) {
      const auto* b = reinterpret_cast<const unsigned char*>(units[size_t(u)].data() + t.offset);
      for (size_t i = 0; i < size_t(t.numel) * sizeof(float); ++i)
        h = (h ^ b[i]) * 1099511628211ull;
    }
  }
  if (rank != 0) return h;
  io::CheckpointWriter w(path);
  io::write_model_hdf5(w, layout, ptrs);
  if (tokenizer != nullptr) io::write_tokenizer_hdf5(w, *tokenizer);
  w.commit();
  LOG0_INFO("saved {} | weights fingerprint {:016x}", path, h);
  return h;
}

std::unique_ptr<parallel::Topology> setup_topology(const ParallelArgs& args, int tensor_parallel,
                                                   int* threads) {
  parallel::TopologyOptions topt;
  topt.ranks_per_node = parallel::resolve_ranks_per_node(args.ranks_per_node);
  topt.gen_ranks_per_node = args.gen_ranks_per_node;
  topt.tensor_parallel = tensor_parallel;
  auto topo = std::make_unique<parallel::Topology>(MPI_COMM_WORLD, topt);
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
  const int t = configure_threads(args.threads);
  if (threads != nullptr) *threads = t;
  return topo;
}

TrainRuntime setup_train_runtime(const ParallelArgs& args, int tensor_parallel,
                                 bool needs_generation) {
  TrainRuntime rt;
  RLHF_CHECK(needs_generation || args.gen_ranks_per_node == 0,
             "--gen_ranks_per_node {}: this command only trains, so generation ranks would idle\n"
             "hint: use --gen_ranks_per_node 0",
             args.gen_ranks_per_node);
  rt.topology = setup_topology(args, tensor_parallel, &rt.threads);
  const parallel::CommKind kind = parallel::comm_kind_from_name(args.comm_backend);
  // make_comm is collective over train_comm's members only; ranks outside get nullptr.
  rt.train_comm = parallel::make_comm(rt.topology->train_comm(), "train_comm", kind);

  rt.device = setup_device(args, *rt.topology, &rt.cuda_device);
  if (rt.device == Device::kCuda) {
    rt.device_comm = parallel::make_comm(rt.topology->train_comm(), "train_comm_nccl",
                                         parallel::CommKind::kNccl, {}, args.nccl_timeout);
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

Device setup_device(const ParallelArgs& args, const parallel::Topology& topo, int* cuda_device) {
  const Device device = resolve_device(args.device);
  const MPI_Comm world = topo.world();
  int cuda = device == Device::kCuda ? 1 : 0, lo = 0, hi = 0;
  MPI_CHECK(MPI_Allreduce(&cuda, &lo, 1, MPI_INT, MPI_MIN, world));
  MPI_CHECK(MPI_Allreduce(&cuda, &hi, 1, MPI_INT, MPI_MAX, world));
  RLHF_CHECK(lo == hi,
             "--device {}: some ranks found a GPU and others did not\nhint: give every rank a "
             "GPU (srun --gpus-per-task=1), or run with --device cpu",
             args.device);
  if (cuda_device != nullptr) *cuda_device = -1;
  if (device == Device::kCpu) {
    LOG0_INFO("device: cpu");
    return device;
  }
#ifdef RLHF_CUDA
  const int dev = select_node_local_cuda_device(world);
  if (cuda_device != nullptr) *cuda_device = dev;
  model::set_attention_impl(args.attn_implementation == "cudnn" ? model::AttentionImpl::kCudnn
                                                                : model::AttentionImpl::kFlash);
  LOG0_INFO("device: cuda, one GPU per rank (rank 0: device {}, {})", dev, cuda_device_summary());
#endif
  return device;
}

rollout::EngineOptions engine_options(const GenerationArgs& gen, Device device,
                                      parallel::Comm* tp_comm, int32_t eos_token_id) {
  rollout::EngineOptions o;
  o.tp_comm = tp_comm;
  o.kv_cache_bytes = gen.gen_kv_cache_mb * (int64_t(1) << 20);
  o.max_batch = gen.gen_max_num_seqs;
  o.eos_token_id = eos_token_id;
  o.cuda = device == Device::kCuda;
  o.gpu_memory_utilization = gen.vllm_gpu_memory_utilization;
  o.cuda_graphs = !gen.enforce_eager;
  return o;
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

std::unique_ptr<parallel::TrainModel> make_train_model(const model::ParamLayout& layout,
                                                       TrainRuntime& rt, const ZeroArgs& z,
                                                       bool frozen) {
  RLHF_ASSERT(rt.train_comm != nullptr);
  const bool checkpointing = z.gradient_checkpointing && !frozen;
  if (rt.device == Device::kCuda) {
#ifdef RLHF_CUDA
    RLHF_CHECK(z.zero_stage == 3,
               "--zero_stage {} with --device cuda: the GPU path shards with ZeRO-3 (--zero_stage "
               "3); the replicated ZeRO-0 baseline runs on the CPU only",
               z.zero_stage);
    parallel::DeviceStoreOptions o;
    o.adam_offload = z.adam_offload && !frozen;
    o.frozen = frozen;
    o.keep_params_for_backward = z.zero_keep_params;
    return parallel::make_cuda_train_model(
        std::make_unique<parallel::DeviceZero3Store>(layout, rt.device_comm.get(), o),
        checkpointing);
#endif
  }
  std::unique_ptr<parallel::ParamStore> store;
  if (frozen) {
    parallel::Zero3Options f;
    f.frozen = true;
    store = std::make_unique<parallel::Zero3Store>(layout, *rt.train_comm, f);
  } else {
    store = make_param_store(layout, *rt.train_comm, z);
  }
  return parallel::make_cpu_train_model(std::move(store), checkpointing);
}

std::unique_ptr<parallel::ParamStore> make_param_store(const model::ParamLayout& layout,
                                                       parallel::Comm& comm, const ZeroArgs& z) {
  if (z.zero_stage == 0) {
    RLHF_CHECK(!z.adam_offload, "--adam_offload needs --zero_stage 3");
    if (comm.size() == 1) return std::make_unique<parallel::LocalParamStore>(layout);
    return std::make_unique<parallel::ReplicatedStore>(layout, comm);
  }
  if (comm.size() == 1 && !z.adam_offload)
    return std::make_unique<parallel::LocalParamStore>(layout);  // nothing to shard
  parallel::Zero3Options o;
  o.adam_offload = z.adam_offload;
  o.keep_params_for_backward = z.zero_keep_params;
  return std::make_unique<parallel::Zero3Store>(layout, comm, o);
}

int64_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

void log_memory(const parallel::ParamStore& store, int64_t activation_bytes, parallel::Comm& comm) {
  const auto m = store.memory();
  int64_t v[6] = {m.params_bytes, m.grads_bytes,    m.optimizer_bytes,
                  m.gather_bytes, activation_bytes, peak_rss_bytes()};
  int64_t mx[6];
  comm.all_reduce(v, mx, 6, parallel::ReduceOp::kMax);
  LOG0_INFO(
      "memory per rank (max over {} ranks): params {} | grads {} | optimizer {}{} | gather "
      "buffers {} | activations {} | peak RSS {}",
      comm.size(), format_bytes(double(mx[0])), format_bytes(double(mx[1])),
      format_bytes(double(mx[2])), m.optimizer_on_host ? " (host)" : "",
      format_bytes(double(mx[3])), format_bytes(double(mx[4])), format_bytes(double(mx[5])));
}

optim::AdamWConfig make_adamw(const OptimArgs& args, double lr) {
  optim::AdamWConfig adam;
  adam.lr = lr;
  adam.beta1 = args.adam_betas[0];
  adam.beta2 = args.adam_betas[1];
  adam.weight_decay = args.l2;
  adam.validate("--adam_betas/--l2");
  return adam;
}

int64_t EpochOrder::at(int64_t pos) {
  const int64_t e = pos / n_;
  if (e != epoch_) {
    epoch_ = e;
    order_.resize(static_cast<size_t>(n_));
    std::iota(order_.begin(), order_.end(), 0);
    std::mt19937_64 rng(seed_ * 1000003ull + static_cast<uint64_t>(e));
    std::shuffle(order_.begin(), order_.end(), rng);
  }
  return order_[static_cast<size_t>(pos % n_)];
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (bytes >= 1024.0 && i < 4) {
    bytes /= 1024.0;
    ++i;
  }
  return fmt::format("{:.1f} {}", bytes, units[i]);
}

}  // namespace rlhf::app
