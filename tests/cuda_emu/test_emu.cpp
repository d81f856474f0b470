// Tests of the CUDA emulator itself: that kernels see CUDA's semantics (barriers, dynamic shared
// memory, the shuffle modes, votes, grid-stride loops), that the misuses it promises to catch are
// caught (a divergent barrier, a shuffle after a lane exited, a host pointer passed to a kernel, a
// bad launch configuration, a copy past an allocation, a mis-described GEMM), and that a missing
// __syncthreads shows up as a schedule-dependent result; that streams run asynchronously, in
// order, wait for events, and that a missing wait between two streams shows up as a race.
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "core/cuda_check.h"
#include "tests/cuda_emu/runtime.h"
#include "tests/cuda_emu/selftest_kernels.h"
#include "tests/ops/cuda_test_util.h"

using namespace rlhf;
namespace st = rlhf::emu::selftest;

namespace {

// Restores the schedule order when a test ends.
struct ScheduleGuard {
  bool saved = emu::schedule_reversed();
  ~ScheduleGuard() { emu::set_schedule_reversed(saved); }
};

// Streams created while it lives run synchronously (async = false) or on workers of their own.
// The misuse tests run synchronously so that the failure is thrown to the caller instead of
// becoming the process's sticky error.
struct AsyncStreams {
  bool saved = emu::async_streams();
  explicit AsyncStreams(bool on) { emu::set_async_streams(on); }
  ~AsyncStreams() { emu::set_async_streams(saved); }
};

// A host function that holds its stream until *flag is true.
void CUDART_CB hold_until(void* flag) {
  while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::yield();
}

}  // namespace

TEST_CASE("cuda emulator: block barriers and dynamic shared memory give a block reduction") {
  test::TestStream s;
  ScheduleGuard g;
  const auto in = test::random_vec<float>(1000, 7);
  double ref = 0;
  for (float x : in) ref += x;
  for (bool reversed : {false, true}) {
    emu::set_schedule_reversed(reversed);
    for (int threads : {32, 256, 1024}) {
      test::DeviceBuffer<float> d_in(in), d_out(1);
      st::block_sum(d_out.get(), d_in.get(), 1000, threads, s.get());
      CHECK(d_out.download()[0] == doctest::Approx(ref).epsilon(1e-5));
      test::check_guards("block_sum", d_in, d_out);
    }
  }
}

TEST_CASE("cuda emulator: warp shuffles and ballot follow the PTX modes") {
  test::TestStream s;
  test::DeviceBuffer<int> sums(64);
  st::warp_xor_sum(sums.get(), 64, s.get());
  const auto got = sums.download();
  for (int t = 0; t < 64; ++t) CHECK(got[t] == (t < 32 ? 528 : 1552));  // Σ 1..32, Σ 33..64

  test::DeviceBuffer<int> modes(128);
  st::shuffle_modes(modes.get(), s.get());
  const auto m = modes.download();
  for (int t = 0; t < 32; ++t) {
    CHECK(m[4 * t + 0] == 5);
    CHECK(m[4 * t + 1] == (t + 3 < 32 ? t + 3 : t));
    CHECK(m[4 * t + 2] == (t >= 3 ? t - 3 : t));
    CHECK(m[4 * t + 3] == (t ^ 1));
  }

  test::DeviceBuffer<unsigned> votes(32);
  st::ballot(votes.get(), s.get());
  unsigned expect = 0;
  for (int t = 0; t < 32; t += 3) expect |= 1u << t;
  for (unsigned v : votes.download()) CHECK(v == expect);
}

TEST_CASE("cuda emulator: a missing __syncthreads gives schedule-dependent results") {
  test::TestStream s;
  ScheduleGuard g;
  std::vector<int> results[2];
  for (int r = 0; r < 2; ++r) {
    emu::set_schedule_reversed(r == 1);
    test::DeviceBuffer<int> out(64);
    st::racy_neighbour(out.get(), 64, s.get());
    results[r] = out.download();
  }
  // Last-to-first, thread t reads a value thread t + 1 already wrote; first-to-last, it does not.
  for (int t = 0; t < 63; ++t) CHECK(results[1][t] == t + 2);
  CHECK(results[0] != results[1]);
}

TEST_CASE("cuda emulator: misuses are errors, not hangs or silent corruption") {
  AsyncStreams sync(false);
  test::TestStream s;
  test::DeviceBuffer<int> out(1024);
  CHECK_THROWS_WITH(st::divergent_barrier(out.get(), 64, s.get()),
                    doctest::Contains("divergent code"));
  CHECK_THROWS_WITH(st::shuffle_after_exit(out.get(), s.get()), doctest::Contains("CUDA emulator"));
  std::vector<int> host(64);
  CHECK_THROWS_WITH(st::warp_xor_sum(host.data(), 32, s.get()),
                    doctest::Contains("neither device memory nor pinned"));
  // Pinned host memory is device-accessible.
  int* pinned = nullptr;
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&pinned), 32 * sizeof(int)) == cudaSuccess);
  st::warp_xor_sum(pinned, 32, s.get());
  CHECK(pinned[0] == 528);
  CHECK(cudaFreeHost(pinned) == cudaSuccess);
}

TEST_CASE("cuda emulator: launch configurations are checked as the runtime checks them") {
  AsyncStreams sync(false);
  test::TestStream s;
  test::DeviceBuffer<int> out(1);
  st::launch_config(out.get(), 3, 64, 0, s.get());
  CHECK(out.download()[0] == 192);
  CHECK_THROWS_WITH(st::launch_config(out.get(), 1, 2048, 0, s.get()),
                    doctest::Contains("cudaErrorInvalidConfiguration"));
  CHECK_THROWS_WITH(st::launch_config(out.get(), 0, 32, 0, s.get()),
                    doctest::Contains("cudaErrorInvalidConfiguration"));
  // Above 48 KiB of dynamic shared memory only after opting in.
  CHECK_THROWS_WITH(st::launch_config(out.get(), 1, 32, 64 << 10, s.get()),
                    doctest::Contains("cudaErrorInvalidValue"));
  REQUIRE(cudaFuncSetAttribute(st::launch_config_kernel(),
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               64 << 10) == cudaSuccess);
  st::launch_config(out.get(), 1, 32, 64 << 10, s.get());
  // A grid-stride loop with a capped grid covers every element.
  test::DeviceBuffer<int64_t> idx(10007);
  st::iota(idx.get(), 10007, 5, s.get());
  const auto v = idx.download();
  for (int64_t i = 0; i < 10007; ++i) REQUIRE(v[i] == i);
}

TEST_CASE("cuda emulator: streams run asynchronously, in order, and wait for events") {
  AsyncStreams async(true);
  test::TestStream a, b;
  std::vector<int64_t> want(64);
  std::iota(want.begin(), want.end(), int64_t{0});
  cudaEvent_t ev = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess);

  // b waits for a's event: while a is held, nothing after the hold has run on either stream.
  std::atomic<bool> go{false};
  test::DeviceBuffer<int64_t> x(64), y(64);
  REQUIRE(cudaLaunchHostFunc(a.get(), hold_until, &go) == cudaSuccess);
  st::iota(x.get(), 64, 1, a.get());
  REQUIRE(cudaEventRecord(ev, a.get()) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(b.get(), ev, 0) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(y.get(), x.get(), 64 * sizeof(int64_t), cudaMemcpyDeviceToDevice,
                          b.get()) == cudaSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(cudaStreamQuery(a.get()) == cudaErrorNotReady);
  CHECK(cudaStreamQuery(b.get()) == cudaErrorNotReady);
  CHECK(cudaEventQuery(ev) == cudaErrorNotReady);
  go.store(true);
  b.sync();
  CHECK(cudaEventQuery(ev) == cudaSuccess);
  CHECK(y.download() == want);

  // Without the wait, b copies before a writes: the race shows as the fresh memory's poison.
  std::atomic<bool> go2{false};
  test::DeviceBuffer<int64_t> x2(64), y2(64);
  REQUIRE(cudaLaunchHostFunc(a.get(), hold_until, &go2) == cudaSuccess);
  st::iota(x2.get(), 64, 1, a.get());
  REQUIRE(cudaMemcpyAsync(y2.get(), x2.get(), 64 * sizeof(int64_t), cudaMemcpyDeviceToDevice,
                          b.get()) == cudaSuccess);
  b.sync();
  go2.store(true);
  a.sync();
  CHECK(y2.download() == std::vector<int64_t>(64, -1));  // 0xFF bytes
  CHECK(x2.download() == want);
  CHECK(cudaEventDestroy(ev) == cudaSuccess);
}

TEST_CASE("cuda emulator: streams come and go without running out of fiber stacks") {
  // Each stream's worker runs 1024-thread blocks on 1024 fiber stacks (two kernel mappings each);
  // 100 short-lived streams would need ~200k mappings (above Linux's default vm.max_map_count of
  // 65530) if a worker's stacks were not handed back when it ends.
  AsyncStreams async(true);
  const auto in = test::random_vec<float>(1024, 3);
  double ref = 0;
  for (float x : in) ref += x;
  test::DeviceBuffer<float> d_in(in), d_out(1);
  for (int i = 0; i < 100; ++i) {
    test::TestStream s;
    st::block_sum(d_out.get(), d_in.get(), 1024, 1024, s.get());
    s.sync();
  }
  CHECK(d_out.download()[0] == doctest::Approx(ref).epsilon(1e-5));
}

TEST_CASE("cuda emulator: a kernel that fails on an asynchronous stream leaves a sticky error") {
  AsyncStreams async(true);
  test::TestStream s;
  test::DeviceBuffer<int> out(1024);
  try {
    st::divergent_barrier(out.get(), 64, s.get());  // may see the failure already, or not yet
  } catch (const std::exception&) {
  }
  CHECK(cudaStreamSynchronize(s.get()) == cudaErrorLaunchFailure);
  CHECK(std::string(cudaGetErrorString(cudaErrorLaunchFailure)).find("divergent code") !=
        std::string::npos);
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);  // sticky: reading it does not clear it
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
  CHECK(cudaMemset(out.get(), 0, 4) == cudaErrorLaunchFailure);
  emu::clear_sticky_error();
  CHECK(cudaMemset(out.get(), 0, 4) == cudaSuccess);
}

TEST_CASE("cuda emulator: copies stay inside one allocation of the right kind") {
  void* d = nullptr;
  REQUIRE(cudaMalloc(&d, 16) == cudaSuccess);
  float poisoned = 0;
  REQUIRE(cudaMemcpy(&poisoned, d, 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(std::isnan(poisoned));  // fresh device memory reads as NaN
  std::vector<char> host(32, 1);
  CHECK(cudaMemcpy(d, host.data(), 32, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(d, host.data(), 16, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(host.data(), d, 16, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(d, host.data(), 16, cudaMemcpyHostToDevice) == cudaSuccess);
  CHECK(cudaMemset(static_cast<char*>(d) + 8, 0, 9) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(cudaFree(d) == cudaSuccess);
  CHECK(cudaFree(d) == cudaErrorInvalidValue);
  cudaStream_t st = nullptr;
  REQUIRE(cudaStreamCreate(&st) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(st) == cudaSuccess);
  CHECK(cudaStreamSynchronize(st) == cudaErrorInvalidResourceHandle);
  (void)cudaGetLastError();
}

TEST_CASE("cuda emulator: cuBLASLt computes the described GEMM and refuses a mis-described one") {
  // D (m × n) = op(A)·op(B) + bias, A stored (k × m) transposed, B (k × n), bf16 in, fp32 out;
  // against a direct triple loop.
  const int m = 5, n = 3, k = 7;
  const auto a = test::random_bf16_values(k * m, 1), b = test::random_bf16_values(k * n, 2);
  const auto bias = test::random_bf16_values(m, 3);
  test::DeviceBuffer<test::bf16> da(test::to_bf16(a)), db(test::to_bf16(b)),
      dbias(test::to_bf16(bias));
  test::DeviceBuffer<float> dd(m * n);
  cublasLtHandle_t h = nullptr;
  REQUIRE(cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t op = nullptr;
  REQUIRE(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
  const cublasOperation_t t = CUBLAS_OP_T;
  const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
  const cudaDataType_t bias_type = CUDA_R_16BF;
  const void* bias_ptr = dbias.get();
  REQUIRE(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)) == 0);
  REQUIRE(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)) ==
          0);
  REQUIRE(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                         sizeof(bias_type)) == 0);
  REQUIRE(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr,
                                         sizeof(bias_ptr)) == 0);
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr, bad = nullptr;
  REQUIRE(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, m, k) == 0);
  REQUIRE(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, n, k) == 0);
  REQUIRE(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m) == 0);
  REQUIRE(cublasLtMatrixLayoutCreate(&bad, CUDA_R_16BF, k + 1, n, k + 1) == 0);
  const float alpha = 1, beta = 0;
  CHECK(cublasLtMatmul(h, op, &alpha, da.get(), la, db.get(), lb, &beta, dd.get(), ld, dd.get(), ld,
                       nullptr, nullptr, 0, nullptr) == CUBLAS_STATUS_SUCCESS);
  const auto d = dd.download();
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double ref = bias[i];
      for (int p = 0; p < k; ++p) ref += double(a[i * k + p]) * double(b[j * k + p]);
      CHECK(d[j * m + i] == doctest::Approx(ref).epsilon(1e-5));
    }
  // k of B's layout does not match A's: refused, D untouched.
  CHECK(cublasLtMatmul(h, op, &alpha, da.get(), la, db.get(), bad, &beta, dd.get(), ld, dd.get(),
                       ld, nullptr, nullptr, 0, nullptr) == CUBLAS_STATUS_INVALID_VALUE);
  // An operand in host memory is refused.
  std::vector<test::bf16> host_b(k * n);
  CHECK(cublasLtMatmul(h, op, &alpha, da.get(), la, host_b.data(), lb, &beta, dd.get(), ld,
                       dd.get(), ld, nullptr, nullptr, 0, nullptr) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(dd.download() == d);
  for (auto l : {la, lb, ld, bad}) cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(h);
}

TEST_CASE("cuda emulator: a one-rank NCCL communicator reduces, gathers and broadcasts") {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  REQUIRE(ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess);
  test::TestStream s;
  const auto x = test::random_vec<float>(3000000, 5);  // several 1 MiB chunks
  test::DeviceBuffer<float> a(x), b(3000000);
  CHECK(ncclAllReduce(a.get(), b.get(), x.size(), ncclFloat32, ncclSum, comm, s.get()) ==
        ncclSuccess);
  CHECK(b.download() == x);
  CHECK(ncclReduceScatter(a.get(), b.get(), x.size(), ncclFloat32, ncclMax, comm, s.get()) ==
        ncclSuccess);
  CHECK(b.download() == x);
  std::vector<float> host(10);
  CHECK(ncclAllGather(host.data(), b.get(), 10, ncclFloat32, comm, s.get()) == ncclInvalidArgument);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
}
