// The emulator's execution engine: the threads of a block as fibers, barriers, warp exchanges,
// and the grid loop (see emu.h for the model).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/cuda_emu/emu.h"
#include "tests/cuda_emu/runtime.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace rlhf::emu {
namespace {

struct Fiber;
struct BlockRun;

}  // namespace
}  // namespace rlhf::emu

// --- context switch --------------------------------------------------------------------------
#if defined(__x86_64__)
// rlhf_emu_switch(void** save_sp, void* load_sp): pushes the callee-saved registers on the
// current stack, stores the stack pointer to *save_sp, switches to load_sp and pops the same frame
// from there. (The MXCSR and x87 control words are not switched: kernels do not change them.) A new
// fiber's stack is prepared with such a frame whose return address is rlhf_emu_trampoline, which
// calls rlhf_emu_fiber_main(r12).
extern "C" void rlhf_emu_switch(void** save_sp, void* load_sp);
extern "C" void rlhf_emu_trampoline();
asm(R"(
  .text
  .globl rlhf_emu_switch
  .type rlhf_emu_switch, @function
rlhf_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size rlhf_emu_switch, .-rlhf_emu_switch

  .globl rlhf_emu_trampoline
  .type rlhf_emu_trampoline, @function
rlhf_emu_trampoline:
  movq %r12, %rdi
  call rlhf_emu_fiber_main@PLT
  ud2
  .size rlhf_emu_trampoline, .-rlhf_emu_trampoline
  .section .note.GNU-stack,"",@progbits
  .text
)");
#endif

namespace rlhf::emu {
namespace {

constexpr size_t kStackBytes = size_t{128} << 10;  // per emulated thread (locals of one kernel)
constexpr int kWarpLanes = 32;

enum class Wait { kNone, kBlock, kWarp };
enum class WarpOp { kNone, kShuffle, kBallot, kSync };

struct Fiber {
  void* sp = nullptr;  // saved stack pointer while suspended
#if !defined(__x86_64__)
  ucontext_t uc;
#endif
  ThreadIndex index;
  int linear = 0, warp = 0, lane = 0;
  Wait wait = Wait::kNone;
  uint64_t wait_gen = 0;
  unsigned warp_ops = 0;  // warp exchanges done (selects the double-buffered slot)
  bool done = false;
  char* stack = nullptr;
};

struct WarpState {
  int lanes = 0;  // threads of the block in this warp
  int live = 0;   // not yet exited
  int arrived = 0;
  uint64_t gen = 0;
  WarpOp op = WarpOp::kNone;  // the operation the arrived lanes are doing
  uint64_t slots[2][kWarpLanes] = {};
};

struct BlockRun {
  const LaunchConfig* cfg = nullptr;
  void (*body)(void*) = nullptr;
  void* arg = nullptr;
  std::vector<Fiber> fibers;
  std::vector<WarpState> warps;
  int live = 0, arrived = 0;
  uint64_t gen = 0;
  int step = 1;  // schedule order: +1 first-to-last, -1 last-to-first
  Fiber* current = nullptr;
  void* scheduler_sp = nullptr;
#if !defined(__x86_64__)
  ucontext_t scheduler_uc;
#endif
  std::string error;  // set by a fiber; the scheduler throws it
};

// Fiber stacks (each with a guard page below it) outlive the OS threads that use them: a stream's
// worker thread takes stacks from this process-wide pool and gives them back when it ends, so
// creating and destroying streams neither leaks mappings (the kernel's map count is limited) nor
// faults fresh pages in again.
struct StackPool {
  std::mutex mu;
  std::vector<char*> free;
};
StackPool& stack_pool() {
  static StackPool* p = new StackPool();  // never destroyed: threads may end after main's statics
  return *p;
}

// The stacks one OS thread holds, returned to the pool when the thread ends.
struct ThreadStacks {
  std::vector<char*> stacks;
  ~ThreadStacks() {
    StackPool& pool = stack_pool();
    std::lock_guard<std::mutex> lock(pool.mu);
    pool.free.insert(pool.free.end(), stacks.begin(), stacks.end());
  }
};

// Per OS thread: the block being run, its fiber stacks, the dynamic shared memory.
thread_local BlockRun* tl_block = nullptr;
thread_local ThreadStacks tl_stacks;
thread_local std::vector<unsigned char> tl_smem;

char* stack_for(size_t i) {
  std::vector<char*>& mine = tl_stacks.stacks;
  while (mine.size() <= i) {
    {
      StackPool& pool = stack_pool();
      std::lock_guard<std::mutex> lock(pool.mu);
      if (!pool.free.empty()) {
        mine.push_back(pool.free.back());
        pool.free.pop_back();
        continue;
      }
    }
    // A guard page below each stack turns an overflow into a fault instead of corruption.
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* p = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("CUDA emulator: cannot map a fiber stack");
    mprotect(p, page, PROT_NONE);
    mine.push_back(static_cast<char*>(p) + page);
  }
  return mine[i];
}

[[noreturn]] void fiber_exit(Fiber& f);

// True when f can be resumed now: not finished, and the barrier it waits at (if any) is open.
bool runnable(const BlockRun& b, const Fiber& f) {
  if (f.done) return false;
  if (f.wait == Wait::kBlock) return f.wait_gen != b.gen;
  if (f.wait == Wait::kWarp) return f.wait_gen != b.warps[static_cast<size_t>(f.warp)].gen;
  return true;
}

// Switches from the running fiber `from` (nullptr: the scheduler) to `to`.
void switch_fiber(Fiber* from, Fiber& to) {
  BlockRun& b = *tl_block;
  to.wait = Wait::kNone;
  b.current = &to;
  tl_index = &to.index;
#if defined(__x86_64__)
  rlhf_emu_switch(from != nullptr ? &from->sp : &b.scheduler_sp, to.sp);
#else
  swapcontext(from != nullptr ? &from->uc : &b.scheduler_uc, &to.uc);
#endif
}

// The running fiber f cannot go on (it waits at a barrier, has finished or failed): runs the next
// runnable fiber of the block after f in schedule order (round-robin, wrapping), switching to it
// directly; when none can run (the block is done, deadlocked or failed), returns to the scheduler.
void yield_from(Fiber& f) {
  BlockRun& b = *tl_block;
  if (b.error.empty()) {
    const int n = static_cast<int>(b.fibers.size());
    int i = f.linear;
    for (int k = 1; k < n; ++k) {
      i += b.step;
      if (i == n)
        i = 0;
      else if (i < 0)
        i = n - 1;
      Fiber& g = b.fibers[static_cast<size_t>(i)];
      if (runnable(b, g)) {
        switch_fiber(&f, g);
        return;  // resumed
      }
    }
  }
  b.current = nullptr;
  tl_index = nullptr;
#if defined(__x86_64__)
  rlhf_emu_switch(&f.sp, b.scheduler_sp);
#else
  swapcontext(&f.uc, &b.scheduler_uc);
#endif
}

// Records a misuse found inside a fiber and parks the fiber for good: the scheduler sees the error
// after the switch and abandons the block.
[[noreturn]] void fiber_fail(const std::string& what) {
  BlockRun& b = *tl_block;
  Fiber& f = *b.current;
  if (b.error.empty())
    b.error = "thread (" + std::to_string(f.index.thread_idx.x) + "," +
              std::to_string(f.index.thread_idx.y) + "," + std::to_string(f.index.thread_idx.z) +
              "): " + what;
  f.done = true;
  yield_from(f);
  std::abort();  // never resumed
}

}  // namespace
}  // namespace rlhf::emu

// The first frame of every fiber: runs the kernel body for this thread, then retires it.
extern "C" [[noreturn]] void rlhf_emu_fiber_main(rlhf::emu::Fiber* f) {
  using namespace rlhf::emu;
  BlockRun& b = *tl_block;
  try {
    b.body(b.arg);
  } catch (const std::exception& e) {
    fiber_fail(std::string("exception in device code: ") + e.what());
  } catch (...) {
    fiber_fail("exception in device code");
  }
  fiber_exit(*f);
}

namespace rlhf::emu {
namespace {

#if !defined(__x86_64__)
void ucontext_entry(unsigned lo, unsigned hi) {
  const uintptr_t p = (static_cast<uintptr_t>(hi) << 32) | lo;
  rlhf_emu_fiber_main(reinterpret_cast<Fiber*>(p));
}
#endif

[[noreturn]] void fiber_exit(Fiber& f) {
  BlockRun& b = *tl_block;
  WarpState& w = b.warps[static_cast<size_t>(f.warp)];
  // __syncthreads must be reached by every thread of the block (CUDA C++ Programming Guide); a
  // GPU may let exited threads out of the count, or hang. Either way it is a bug here.
  if (b.arrived > 0)
    fiber_fail(
        "exited while other threads of the block wait at __syncthreads (a barrier in "
        "divergent code)");
  f.done = true;
  --b.live;
  --w.live;
  // A warp exchange that is waiting for this lane can never complete: the scheduler reports it.
  yield_from(f);
  std::abort();  // never resumed
}

// The mask of every lane of f's warp (warps at the end of a block may be partial).
unsigned warp_mask(const BlockRun& b, const Fiber& f) {
  const int lanes = b.warps[static_cast<size_t>(f.warp)].lanes;
  return lanes == kWarpLanes ? 0xffffffffu : ((1u << lanes) - 1u);
}

// Arrives at f's warp barrier for operation op and waits until every lane has arrived.
void warp_barrier(Fiber& f, WarpOp op, unsigned mask) {
  BlockRun& b = *tl_block;
  WarpState& w = b.warps[static_cast<size_t>(f.warp)];
  if (mask != warp_mask(b, f))
    fiber_fail("warp operation with mask " + std::to_string(mask) +
               ": the emulator supports only full-warp masks");
  if (w.live != w.lanes) fiber_fail("warp operation after a lane of the warp has exited");
  if (w.arrived > 0 && w.op != op)
    fiber_fail("lanes of one warp are in different warp operations (divergent shuffle/vote)");
  w.op = op;
  if (++w.arrived == w.live) {  // the last lane opens the barrier
    w.arrived = 0;
    w.op = WarpOp::kNone;
    ++w.gen;
    return;
  }
  f.wait = Wait::kWarp;
  f.wait_gen = w.gen;
  yield_from(f);
}

Fiber& current_fiber(const char* what) {
  if (tl_block == nullptr || tl_block->current == nullptr)
    throw std::runtime_error(std::string("CUDA emulator: ") + what + " called outside a kernel");
  return *tl_block->current;
}

std::string block_name(const LaunchConfig& cfg, const uint3& bi) {
  return std::string("kernel ") + cfg.name + " block (" + std::to_string(bi.x) + "," +
         std::to_string(bi.y) + "," + std::to_string(bi.z) + ")";
}

// Runs one block to completion (or failure).
void run_block(BlockRun& b, const uint3& block_idx) {
  const dim3 bd = b.cfg->block;
  const int n = static_cast<int>(bd.x * bd.y * bd.z);
  const int nwarps = (n + kWarpLanes - 1) / kWarpLanes;
  b.fibers.assign(static_cast<size_t>(n), Fiber{});
  b.warps.assign(static_cast<size_t>(nwarps), WarpState{});
  b.live = n;
  b.arrived = 0;
  b.gen = 0;
  b.error.clear();
  if (!tl_smem.empty()) std::memset(tl_smem.data(), 0xFF, tl_smem.size());
  for (int i = 0; i < n; ++i) {
    Fiber& f = b.fibers[static_cast<size_t>(i)];
    f.linear = i;
    f.warp = i / kWarpLanes;
    f.lane = i % kWarpLanes;
    f.index.thread_idx =
        make_uint3(static_cast<unsigned>(i) % bd.x, (static_cast<unsigned>(i) / bd.x) % bd.y,
                   static_cast<unsigned>(i) / (bd.x * bd.y));
    f.index.block_idx = block_idx;
    f.index.block_dim = bd;
    f.index.grid_dim = b.cfg->grid;
    f.stack = stack_for(static_cast<size_t>(i));
    ++b.warps[static_cast<size_t>(f.warp)].lanes;
#if defined(__x86_64__)
    // Initial frame (see rlhf_emu_switch): r15..r12, rbx, rbp, return address. After the `ret`
    // the stack pointer is the 16-byte aligned top, as the trampoline's call expects.
    auto* top = reinterpret_cast<uint64_t*>(f.stack + kStackBytes);
    uint64_t* sp = top - 7;
    sp[0] = 0;                                                 // r15
    sp[1] = 0;                                                 // r14
    sp[2] = 0;                                                 // r13
    sp[3] = reinterpret_cast<uint64_t>(&f);                    // r12: the fiber
    sp[4] = 0;                                                 // rbx
    sp[5] = 0;                                                 // rbp
    sp[6] = reinterpret_cast<uint64_t>(&rlhf_emu_trampoline);  // return address
    f.sp = sp;
#else
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = f.stack;
    f.uc.uc_stack.ss_size = kStackBytes;
    f.uc.uc_link = nullptr;
    const auto p = reinterpret_cast<uintptr_t>(&f);
    makecontext(&f.uc, reinterpret_cast<void (*)()>(&ucontext_entry), 2,
                static_cast<unsigned>(p & 0xffffffffu), static_cast<unsigned>(p >> 32));
#endif
  }
  for (WarpState& w : b.warps) w.live = w.lanes;

  // The fibers hand control to each other (yield_from); control comes back here when none can
  // run: the block is done, has failed, or is deadlocked.
  b.step = schedule_reversed() ? -1 : 1;
  switch_fiber(nullptr, b.fibers[b.step < 0 ? static_cast<size_t>(n - 1) : 0]);
  if (!b.error.empty())
    throw std::runtime_error("CUDA emulator: " + block_name(*b.cfg, block_idx) + ", " + b.error);
  int at_block = 0, at_warp = 0;
  for (const Fiber& f : b.fibers) {
    if (f.done) continue;
    (f.wait == Wait::kBlock ? at_block : at_warp)++;
  }
  if (at_block + at_warp == 0) return;
  throw std::runtime_error(
      "CUDA emulator: " + block_name(*b.cfg, block_idx) + ": deadlock: " +
      std::to_string(at_block) + " threads wait at __syncthreads and " + std::to_string(at_warp) +
      " at a warp operation that can never complete (a barrier inside divergent code, or a "
      "warp operation after a lane exited)");
}

}  // namespace

// --- device-side entry points ----------------------------------------------------------------

void syncthreads() {
  Fiber& f = current_fiber("__syncthreads");
  BlockRun& b = *tl_block;
  if (b.live != static_cast<int>(b.fibers.size()))
    fiber_fail(
        "__syncthreads after other threads of the block have exited (a barrier in "
        "divergent code)");
  if (++b.arrived == b.live) {  // the last thread opens the barrier
    b.arrived = 0;
    ++b.gen;
    return;
  }
  f.wait = Wait::kBlock;
  f.wait_gen = b.gen;
  yield_from(f);
}

void syncwarp(unsigned mask) {
  Fiber& f = current_fiber("__syncwarp");
  warp_barrier(f, WarpOp::kSync, mask);
}

uint64_t shuffle_raw(unsigned mask, uint64_t value, ShuffleKind kind, int arg, int width) {
  Fiber& f = current_fiber("__shfl_sync");
  BlockRun& b = *tl_block;
  if (width <= 0 || width > kWarpLanes || (width & (width - 1)) != 0)
    fiber_fail("shuffle width " + std::to_string(width) + " is not a power of two <= 32");
  WarpState& w = b.warps[static_cast<size_t>(f.warp)];
  const int slot = static_cast<int>(f.warp_ops++ & 1u);
  w.slots[slot][f.lane] = value;
  warp_barrier(f, WarpOp::kShuffle, mask);
  // PTX shfl.sync semantics within segments of `width` lanes: an out-of-segment source returns
  // the lane's own value (down/up), an index wraps modulo width.
  const int seg = f.lane & ~(width - 1), pos = f.lane - seg;
  int src = f.lane;
  switch (kind) {
    case ShuffleKind::kIndex:
      src = seg + (arg & (width - 1));
      break;
    case ShuffleKind::kXor:
      src = seg + ((pos ^ arg) & (width - 1));
      break;
    case ShuffleKind::kDown:
      src = pos + arg < width ? f.lane + arg : f.lane;
      break;
    case ShuffleKind::kUp:
      src = pos - arg >= 0 ? f.lane - arg : f.lane;
      break;
  }
  if (src >= w.lanes) src = f.lane;  // a lane that does not exist in a partial warp
  return w.slots[slot][src];
}

unsigned ballot(unsigned mask, bool pred) {
  Fiber& f = current_fiber("__ballot_sync");
  BlockRun& b = *tl_block;
  WarpState& w = b.warps[static_cast<size_t>(f.warp)];
  const int slot = static_cast<int>(f.warp_ops++ & 1u);
  w.slots[slot][f.lane] = pred ? 1 : 0;
  warp_barrier(f, WarpOp::kBallot, mask);
  unsigned bits = 0;
  for (int i = 0; i < w.lanes; ++i)
    if (w.slots[slot][i] != 0) bits |= 1u << i;
  return bits;
}

void* dynamic_shared() {
  current_fiber("dynamic shared memory");
  return tl_smem.data();
}

void run_grid(const LaunchConfig& cfg, void (*body)(void*), void* arg) {
  if (tl_block != nullptr)
    throw std::runtime_error(std::string("CUDA emulator: kernel ") + cfg.name +
                             " launched from device code");
  // Poisoned per block (run_block); 16-byte aligned (malloc), never empty.
  tl_smem.assign(cfg.smem + 256, 0xFF);
  BlockRun b;
  b.cfg = &cfg;
  b.body = body;
  b.arg = arg;
  tl_block = &b;
  struct Reset {
    ~Reset() {
      tl_block = nullptr;
      tl_index = nullptr;
    }
  } reset;
  for (unsigned z = 0; z < cfg.grid.z; ++z)
    for (unsigned y = 0; y < cfg.grid.y; ++y)
      for (unsigned x = 0; x < cfg.grid.x; ++x) run_block(b, make_uint3(x, y, z));
  count_launch();
}

}  // namespace rlhf::emu
