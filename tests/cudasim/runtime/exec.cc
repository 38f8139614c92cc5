/* tests/cudasim/runtime/exec.cc — the kernel executor: a launch's blocks run
 * one after the other on the stream's worker thread, and a block's threads as
 * cooperative fibers on it. A fiber runs threads one after the other until
 * one must wait (a barrier, a warp operation); it then switches straight to
 * a thread whose wait is over, or to another fiber for the next thread, so
 * a kernel without barriers costs one fiber per block and one with them as
 * many as the threads that wait at once. When nothing can run, the scheduler
 * (the worker's own stack) takes over: the block is done, or threads still
 * wait and it is deadlocked: reported, never hung.
 *
 * The context switch is a few lines of x86-64 assembly (swapcontext costs a
 * system call per switch); each switch is announced to AddressSanitizer and
 * ThreadSanitizer so that both follow the fibers' stacks. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <deque>
#include <memory>
#include <vector>

#include "sim_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define SIM_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define SIM_TSAN 1
#endif

#if !defined(__x86_64__)
#error "cudasim: the fiber switch is written for x86-64 only"
#endif

extern "C" void fsdp_sim_swap(void **save_sp, void *next_sp);
extern "C" void fsdp_sim_fiber_start(void);

/* Saves the callee-saved registers on the current stack, stores its pointer
 * in *save_sp and resumes next_sp, which was saved the same way (or laid out
 * by fiber_init). A new fiber enters fsdp_sim_fiber_start with its function
 * in rbx and argument in r12. MXCSR and the x87 control word, callee-saved
 * too, are the worker thread's for all its fibers: device code has no
 * floating-point environment to change (a GPU rounds per instruction), and
 * restoring them (ldmxcsr, fldcw) was 10% of a barrier-heavy kernel's time. */
asm(R"(
  .pushsection .text
  .globl fsdp_sim_swap
  .hidden fsdp_sim_swap
  .type fsdp_sim_swap,@function
fsdp_sim_swap:
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
  .size fsdp_sim_swap,.-fsdp_sim_swap
  .globl fsdp_sim_fiber_start
  .hidden fsdp_sim_fiber_start
  .type fsdp_sim_fiber_start,@function
fsdp_sim_fiber_start:
  movq %r12, %rdi
  callq *%rbx
  ud2
  .size fsdp_sim_fiber_start,.-fsdp_sim_fiber_start
  .popsection
)");

namespace fsdp_sim {

thread_local const thread_view *current __attribute__((tls_model("initial-exec")));

namespace {

const size_t kStack = 256 * 1024; /* kernels' frames are small; sanitizers' less so */
const size_t kGuard = 4096;
const size_t kCanary = 64;       /* bytes each side of a shared variable (no ASan) */
const unsigned char kCanaryByte = 0xa5;

struct fiber {
  void *sp = nullptr;
  char *mem = nullptr; /* guard page, then the stack */
  bool busy = false;   /* running a thread, or waiting with one */
  void *tsan = nullptr;
  void *fake = nullptr; /* ASan's fake stack while switched out */
};

enum lane_state { UNSTARTED, RUNNING, AT_BARRIER, AT_WARP, EXITED };

struct lane {
  thread_view view;
  unsigned linear = 0;
  lane_state st = UNSTARTED;
  const char *file = nullptr; /* where it waits */
  int line = 0;
  fiber *f = nullptr;
};

struct warp_state {
  unsigned arrived = 0, mask = 0;
  warp_op op = WARP_SYNC;
  int width = 32;
  const char *file = nullptr;
  int line = 0;
  unsigned long long val[32], result[32];
  int arg[32];
};

struct shared_block {
  const shared_site *site;
  unsigned char *mem; /* the variable (after the front canary without ASan) */
  size_t size;
};

struct block_state {
  const launch *l = nullptr;
  uint3 idx{0, 0, 0};
  unsigned n = 0, next = 0, exited = 0, at_barrier = 0;
  const char *bar_file = nullptr;
  int bar_line = 0;
  std::vector<lane> lanes;
  std::vector<warp_state> warps;
  std::deque<lane *> ready;
  std::vector<shared_block> shared;
  size_t static_bytes = 0;
  shared_block dynamic{nullptr, nullptr, 0};
  bool dynamic_made = false;
  bool failed = false;
  cudaError_t error = cudaSuccess;
};

struct executor {
  void *sched_sp = nullptr;
  const void *sched_bottom = nullptr;
  size_t sched_size = 0;
  void *sched_tsan = nullptr;
  void *sched_fake = nullptr;
  bool from_sched = false; /* the last switch left the scheduler (see arrived) */
  std::vector<std::unique_ptr<fiber>> fibers;
  std::vector<fiber *> idle; /* the fibers not busy, the last parked on top */
  block_state *blk = nullptr;
  lane *cur = nullptr;
  ~executor();
};

/* This thread's executor (a stream's worker): owned by ex_owner, reached
 * through ex, which the hot paths read several times per warp operation
 * (initial-exec: a load, where a shared object's thread_local otherwise costs
 * a call to __tls_get_addr each time). */
thread_local std::unique_ptr<executor> ex_owner;
thread_local executor *ex __attribute__((tls_model("initial-exec")));

void fiber_main(fiber *f);
void lane_start(block_state *b, lane &t, unsigned i);

/* ---- fibers ---- */

void fiber_init(fiber *f) {
  char *top = f->mem + kGuard + kStack;
#if SIM_ASAN
  /* A stack abandoned by a failed block keeps its frames' poison. */
  ASAN_UNPOISON_MEMORY_REGION(f->mem + kGuard, kStack);
#endif
  uintptr_t after_ret = ((uintptr_t)top - 64) & ~(uintptr_t)15;
  uint64_t *sp = reinterpret_cast<uint64_t *>(after_ret - 56);
  sp[0] = 0, sp[1] = 0, sp[2] = 0;             /* r15 r14 r13 */
  sp[3] = (uint64_t)(uintptr_t)f;              /* r12: the argument */
  sp[4] = (uint64_t)(uintptr_t)&fiber_main;    /* rbx: the function */
  sp[5] = 0;                                   /* rbp */
  sp[6] = (uint64_t)(uintptr_t)&fsdp_sim_fiber_start;
  f->sp = sp;
  f->fake = nullptr;
#if SIM_TSAN
  if (f->tsan) __tsan_destroy_fiber(f->tsan);
  f->tsan = __tsan_create_fiber(0);
#endif
}

fiber *fiber_new() {
  auto f = std::make_unique<fiber>();
  void *m = mmap(nullptr, kGuard + kStack, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) {
    report("cannot map a %zu KiB fiber stack", kStack / 1024);
    abort();
  }
  mprotect(m, kGuard, PROT_NONE); /* overflow faults instead of corrupting */
  f->mem = static_cast<char *>(m);
  fiber_init(f.get());
  ex->fibers.push_back(std::move(f));
  return ex->fibers.back().get();
}

executor::~executor() {
  for (auto &f : fibers) {
#if SIM_TSAN
    if (f->tsan) __tsan_destroy_fiber(f->tsan);
#endif
#if SIM_ASAN
    /* A parked fiber's frames keep their redzones' poison, and ASan leaves
     * shadow as it is at munmap: the next mapping at this address (a
     * communicator's shared segment, a device buffer) would read as a stack. */
    ASAN_UNPOISON_MEMORY_REGION(f->mem + kGuard, kStack);
#endif
    munmap(f->mem, kGuard + kStack);
  }
}

/* Called in a fiber just switched to (fake: its ASan fake stack saved when
 * it left, null on its first entry): ASan learns the stack left behind,
 * which is the scheduler's (the worker thread's own) when the scheduler
 * resumed it, the one yield must name. */
void arrived(void *fake) {
#if SIM_ASAN
  executor *e = ex;
  const void *bottom = nullptr;
  size_t size = 0;
  __sanitizer_finish_switch_fiber(fake, &bottom, &size);
  if (e->from_sched) e->sched_bottom = bottom, e->sched_size = size;
#else
  (void)fake;
#endif
}

/* Scheduler -> fiber. */
void resume(fiber *f) {
  executor *e = ex;
  e->from_sched = true;
#if SIM_ASAN
  __sanitizer_start_switch_fiber(&e->sched_fake, f->mem + kGuard, kStack);
#endif
#if SIM_TSAN
  __tsan_switch_to_fiber(f->tsan, 0);
#endif
  fsdp_sim_swap(&e->sched_sp, f->sp);
#if SIM_ASAN
  __sanitizer_finish_switch_fiber(e->sched_fake, nullptr, nullptr);
#endif
}

/* Fiber -> scheduler; returns when f is switched to again. */
void yield(fiber *f) {
  executor *e = ex;
  e->from_sched = false;
#if SIM_ASAN
  __sanitizer_start_switch_fiber(&f->fake, e->sched_bottom, e->sched_size);
#endif
#if SIM_TSAN
  __tsan_switch_to_fiber(e->sched_tsan, 0);
#endif
  fsdp_sim_swap(&f->sp, e->sched_sp);
  arrived(f->fake);
}

/* Fiber -> fiber, without the scheduler in between (one switch per wait
 * instead of two); returns when from is switched to again. */
void switch_to(fiber *from, fiber *to) {
  ex->from_sched = false;
#if SIM_ASAN
  __sanitizer_start_switch_fiber(&from->fake, to->mem + kGuard, kStack);
#endif
#if SIM_TSAN
  __tsan_switch_to_fiber(to->tsan, 0);
#endif
  fsdp_sim_swap(&from->sp, to->sp);
  arrived(from->fake);
}

fiber *idle_fiber();

/* What runs next in b: the fiber of the thread woken first, else one for the
 * next thread not started; null when neither (the block is over, failed or
 * deadlocked: the scheduler's to say). */
fiber *next_fiber(block_state *b) {
  if (b->failed) return nullptr;
  if (!b->ready.empty()) {
    lane *l = b->ready.front();
    b->ready.pop_front();
    l->st = RUNNING;
    return l->f;
  }
  return b->next < b->n ? idle_fiber() : nullptr;
}

/* Leaves fiber f for whatever runs next in b, or for the scheduler. */
void leave(fiber *f, block_state *b) {
  fiber *next = next_fiber(b);
  if (next)
    switch_to(f, next);
  else
    yield(f);
}

/* A fiber's life: threads of the current block, one after the other, until
 * none is left; then it parks until a thread needs it again. */
void fiber_main(fiber *f) {
  arrived(nullptr);
  for (;;) {
    block_state *b = ex->blk;
    while (!b->failed && b->next < b->n) {
      lane &l = b->lanes[b->next];
      lane_start(b, l, b->next++);
      l.f = f;
      ex->cur = &l;
      current = &l.view;
      b->l->body();
      l.st = EXITED;
      b->exited++;
      ex->cur = nullptr;
      current = nullptr;
    }
    f->busy = false;
    ex->idle.push_back(f);
    leave(f, b);
  }
}

/* The fiber parked last (its stack still in the cache), or a new one: a block
 * of 1024 waiting threads asks for one per thread, so no search. */
fiber *idle_fiber() {
  fiber *f;
  if (!ex->idle.empty()) {
    f = ex->idle.back();
    ex->idle.pop_back();
  } else {
    f = fiber_new();
  }
  f->busy = true;
  return f;
}

/* Puts the running thread to sleep until another wakes it. */
void lane_wait(lane &l) {
  leave(l.f, ex->blk);
  ex->cur = &l;
  current = &l.view;
}

/* ---- reports ---- */

std::string thread_name(const lane &l) {
  char buf[64];
  snprintf(buf, sizeof buf, "(%u,%u,%u)", l.view.thread_idx.x, l.view.thread_idx.y,
           l.view.thread_idx.z);
  return buf;
}

const char *error_name(cudaError_t e) { return cudaGetErrorName(e); }

/* Records b's fault and says where; the first one wins. */
void block_fault(block_state *b, const lane *l, cudaError_t err, const char *file, int line,
                 const char *msg) {
  if (b->failed) return;
  b->failed = true;
  b->error = err;
  report("kernel '%s' (%s) fault in block (%u,%u,%u)%s%s at %s:%d: %s [%s]",
         b->l->name.c_str(), describe(*b->l).c_str(), b->idx.x, b->idx.y, b->idx.z,
         l ? " thread " : "", l ? thread_name(*l).c_str() : "", file ? file : "?", line, msg,
         error_name(err));
}

const char *op_name(warp_op op) {
  static const char *const names[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                                      "__shfl_xor_sync", "__syncwarp", "__ballot_sync",
                                      "__any_sync", "__all_sync"};
  return names[op];
}

/* What lane l is doing, for a deadlock report. */
std::string doing(const block_state *b, const lane &l) {
  char buf[256];
  switch (l.st) {
  case EXITED:
    return "exited";
  case UNSTARTED:
    return "never started";
  case RUNNING:
    return "running";
  case AT_BARRIER:
    snprintf(buf, sizeof buf, "waits at __syncthreads() at %s:%d", l.file, l.line);
    return buf;
  case AT_WARP: {
    const warp_state &w = b->warps[l.linear / 32];
    snprintf(buf, sizeof buf, "waits in %s (mask 0x%08x) at %s:%d", op_name(w.op), w.mask, l.file,
             l.line);
    return buf;
  }
  }
  return "?";
}

/* Nothing can run and threads wait: name a wait and a thread that will never
 * come to it. */
void report_deadlock(block_state *b) {
  char msg[768];
  for (const lane &l : b->lanes) {
    if (l.st == AT_BARRIER) {
      for (const lane &m : b->lanes)
        if (m.st != AT_BARRIER) {
          snprintf(msg, sizeof msg, "__syncthreads() is never passed: %u of %u threads wait "
                   "there; thread %s %s (a barrier every thread of the block must reach)",
                   b->at_barrier, b->n, thread_name(m).c_str(), doing(b, m).c_str());
          return block_fault(b, &l, cudaErrorIllegalInstruction, l.file, l.line, msg);
        }
    }
    if (l.st == AT_WARP) {
      const warp_state &w = b->warps[l.linear / 32];
      for (unsigned k = 0; k < 32; ++k)
        if ((w.mask >> k & 1) && !(w.arrived >> k & 1)) {
          const lane &m = b->lanes[(l.linear & ~31u) + k];
          snprintf(msg, sizeof msg, "%s (mask 0x%08x) never completes: lane %u, thread %s, %s",
                   op_name(w.op), w.mask, k, thread_name(m).c_str(), doing(b, m).c_str());
          return block_fault(b, &l, cudaErrorIllegalInstruction, l.file, l.line, msg);
        }
    }
  }
  block_fault(b, nullptr, cudaErrorLaunchFailure, __FILE__, __LINE__,
              "threads wait but no wait names a missing thread (simulator bug)");
}

/* ---- shared memory ---- */

/* Aligned as the declaration asks (alignof its type; at least 16, as the
 * GPU's shared window is: ldmatrix and cp.async need 16-byte rows). */
unsigned char *shared_alloc(size_t size, size_t align) {
  align = align < 16 ? 16 : align;
#if SIM_ASAN
  /* A heap block of exactly `size`: ASan's redzones catch any overflow. */
  const size_t padded = (size + align - 1) / align * align;
  unsigned char *p = static_cast<unsigned char *>(aligned_alloc(align, padded));
  if (p) ASAN_POISON_MEMORY_REGION(p + size, padded - size);
  if (p) memset(p, 0xff, size);
  return p;
#else
  /* kCanary is a multiple of every alignment allowed (shared_var checks). */
  const size_t total = (size + 2 * kCanary + align - 1) / align * align;
  unsigned char *raw = static_cast<unsigned char *>(aligned_alloc(align, total));
  if (!raw) return nullptr;
  memset(raw, kCanaryByte, kCanary);
  memset(raw + kCanary, 0xff, size);
  memset(raw + kCanary + size, kCanaryByte, kCanary);
  return raw + kCanary;
#endif
}

void shared_free(unsigned char *p, size_t size, size_t align) {
  align = align < 16 ? 16 : align;
  if (!p) return;
#if SIM_ASAN
  ASAN_UNPOISON_MEMORY_REGION(p, (size + align - 1) / align * align);
  free(p);
#else
  (void)size, (void)align;
  free(p - kCanary);
#endif
}

/* Without ASan: an overwritten canary names the variable written out of
 * bounds (checked at every barrier and at the block's end). */
bool canaries_intact(const shared_block &s, size_t *at) {
#if SIM_ASAN
  (void)s, (void)at;
  return true;
#else
  for (size_t i = 0; i < kCanary; ++i) {
    if (s.mem[-(ptrdiff_t)kCanary + (ptrdiff_t)i] != kCanaryByte) return *at = i, false;
    if (s.mem[s.size + i] != kCanaryByte) return *at = kCanary + s.size + i, false;
  }
  return true;
#endif
}

void check_shared(block_state *b, lane *l, const char *file, int line) {
  auto check = [&](const shared_block &s, const char *what) {
    size_t at = 0;
    if (s.mem && !canaries_intact(s, &at)) {
      char msg[512];
      const bool before = at < kCanary;
      snprintf(msg, sizeof msg, "out-of-bounds write to shared memory: %s %s%s%s (%zu bytes) "
               "written %zu bytes %s it", what, s.site ? "'" : "", s.site ? s.site->name : "",
               s.site ? "'" : "", s.size, before ? kCanary - at : at - kCanary - s.size + 1,
               before ? "before" : "past the end of");
      block_fault(b, l, cudaErrorIllegalAddress, s.site ? s.site->file : file,
                  s.site ? s.site->line : line, msg);
    }
  };
  for (const shared_block &s : b->shared) check(s, "variable");
  check(b->dynamic, "the dynamic shared memory");
}

void free_shared(block_state *b) {
  for (shared_block &s : b->shared) shared_free(s.mem, s.size, s.site->align);
  b->shared.clear();
  shared_free(b->dynamic.mem, b->dynamic.size, 16);
  b->dynamic = shared_block{nullptr, nullptr, 0};
}

/* ---- blocks ---- */

/* Lanes and warps are reused from block to block (a launch may have 65536
 * blocks): only what a block changes is reset; a lane's view is filled when
 * it starts. */
void block_setup(block_state *b, const launch &l, uint3 idx) {
  b->l = &l;
  b->idx = idx;
  b->n = l.block.x * l.block.y * l.block.z;
  b->next = b->exited = b->at_barrier = 0;
  b->bar_file = nullptr;
  b->static_bytes = 0;
  b->dynamic_made = false;
  b->ready.clear();
  if (b->lanes.size() != b->n) b->lanes.resize(b->n);
  if (b->warps.size() != (b->n + 31) / 32) b->warps.resize((b->n + 31) / 32);
  for (warp_state &w : b->warps) w.arrived = 0;
}

/* Uninstrumented under TSan: a lane is only ever touched by the fibers of
 * one worker thread, which TSan orders at every switch, and its view's
 * 12-byte fields went through TSan's slow range check, once per simulated
 * thread (30% of engine-np1's time). */
#if SIM_TSAN
__attribute__((no_sanitize("thread")))
#endif
void lane_start(block_state *b, lane &t, unsigned i) {
  const launch &l = *b->l;
  t.linear = i;
  t.st = RUNNING;
  t.view.thread_idx = uint3{i % l.block.x, i / l.block.x % l.block.y, i / (l.block.x * l.block.y)};
  t.view.block_idx = b->idx;
  t.view.block_dim = l.block;
  t.view.grid_dim = l.grid;
}

/* Fibers hand the block to each other (leave); the scheduler takes it back
 * when none can run. */
void run_block(block_state *b) {
  while (b->exited < b->n && !b->failed) {
    fiber *f = next_fiber(b);
    if (!f) {
      report_deadlock(b);
      break;
    }
    resume(f);
  }
  if (!b->failed) check_shared(b, nullptr, b->l->site.c_str(), 0);
  free_shared(b);
}

/* Fibers left mid-kernel by a failed block start afresh. */
void reset_fibers() {
  for (auto &f : ex->fibers)
    if (f->busy) {
      fiber_init(f.get());
      f->busy = false;
      ex->idle.push_back(f.get());
    }
}

void wake(block_state *b, lane &l) { b->ready.push_back(&l); }

} // namespace

/* ---- the launch ---- */

cudaError_t run_launch(const launch &l) {
  if (!ex) {
    ex_owner = std::make_unique<executor>();
    ex = ex_owner.get();
#if SIM_TSAN
    ex->sched_tsan = __tsan_get_current_fiber();
#endif
  }
  block_state b;
  ex->blk = &b;
  cudaError_t err = cudaSuccess;
  for (unsigned z = 0; z < l.grid.z && err == cudaSuccess; ++z)
    for (unsigned y = 0; y < l.grid.y && err == cudaSuccess; ++y)
      for (unsigned x = 0; x < l.grid.x && err == cudaSuccess; ++x) {
        block_setup(&b, l, uint3{x, y, z});
        run_block(&b);
        if (b.failed) err = b.error;
      }
  if (err != cudaSuccess) reset_fibers();
  ex->blk = nullptr;
  ex->cur = nullptr;
  current = nullptr;
  return err;
}

cudaError_t check_launch(const launch &l, std::string *why) {
  char buf[320];
  const unsigned long long threads = (unsigned long long)l.block.x * l.block.y * l.block.z;
  if (!l.grid.x || !l.grid.y || !l.grid.z || !l.block.x || !l.block.y || !l.block.z)
    snprintf(buf, sizeof buf, "a grid or block dimension is 0");
  else if (threads > 1024)
    snprintf(buf, sizeof buf, "%llu threads per block, more than the 1024 an sm_90 block holds",
             threads);
  else if (l.block.x > 1024 || l.block.y > 1024 || l.block.z > 64)
    snprintf(buf, sizeof buf, "block dimensions past (1024, 1024, 64)");
  else if (l.grid.x > 2147483647u || l.grid.y > 65535 || l.grid.z > 65535)
    snprintf(buf, sizeof buf, "grid dimensions past (2^31-1, 65535, 65535)");
  else if (l.shared_bytes <= l.shared_limit)
    return cudaSuccess;
  else {
    /* CUDA refuses this one as an invalid value, not a configuration. */
    snprintf(buf, sizeof buf, "%zu bytes of dynamic shared memory: past the kernel's limit of "
             "%zu on device %d (%zu unless cudaFuncSetAttribute(kernel, "
             "cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) raised it there, up to %zu)",
             l.shared_bytes, l.shared_limit, l.device, kSharedPerBlock, kSharedOptin);
    *why = buf;
    return cudaErrorInvalidValue;
  }
  *why = buf;
  return cudaErrorInvalidConfiguration;
}

/* ---- device-side entry points ---- */

void fault(cudaError_t err, const char *file, int line, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (!ex || !ex->cur) {
    report("%s:%d: %s, outside any kernel thread", file, line, msg);
    abort();
  }
  lane *l = ex->cur;
  block_fault(ex->blk, l, err, file, line, msg);
  l->st = AT_BARRIER; /* never woken: the block is over */
  yield(l->f);
  abort(); /* unreachable: a failed block's fibers are reset, not resumed */
}

static lane *running_lane(const char *what, const char *file, int line) {
  if (!ex || !ex->cur) {
    report("%s:%d: %s called outside a kernel", file, line, what);
    abort();
  }
  return ex->cur;
}

void syncthreads(const char *file, int line) {
  lane *l = running_lane("__syncthreads", file, line);
  block_state *b = ex->blk;
  if (b->at_barrier && (b->bar_line != line || strcmp(b->bar_file, file) != 0))
    fault(cudaErrorIllegalInstruction, file, line,
          "__syncthreads() here while %u threads of the block wait at the one at %s:%d: "
          "threads must reach the same barrier", b->at_barrier, b->bar_file, b->bar_line);
  b->bar_file = file;
  b->bar_line = line;
  if (++b->at_barrier == b->n) {
    b->at_barrier = 0;
    for (lane &m : b->lanes)
      if (m.st == AT_BARRIER) {
        m.st = RUNNING;
        wake(b, m);
      }
    check_shared(b, l, file, line);
    if (b->failed) fault(b->error, file, line, "(reported above)");
    return;
  }
  l->st = AT_BARRIER;
  l->file = file;
  l->line = line;
  lane_wait(*l);
}

/* The result of lane i of a completed warp operation. */
static void warp_result(warp_state &w, unsigned i, const char *file, int line) {
  const unsigned seg = i & ~(unsigned)(w.width - 1), end = seg + (unsigned)w.width;
  unsigned src = i;
  switch (w.op) {
  case WARP_SHFL:
    src = seg + (unsigned)(((w.arg[i] % w.width) + w.width) % w.width);
    break;
  case WARP_SHFL_UP:
    src = (int)i - w.arg[i] >= (int)seg ? i - (unsigned)w.arg[i] : i;
    break;
  case WARP_SHFL_DOWN:
    src = i + (unsigned)w.arg[i] < end ? i + (unsigned)w.arg[i] : i;
    break;
  case WARP_SHFL_XOR:
    src = (i ^ (unsigned)w.arg[i]) >= seg && (i ^ (unsigned)w.arg[i]) < end ? i ^ (unsigned)w.arg[i]
                                                                            : i;
    break;
  case WARP_SYNC:
    w.result[i] = 0;
    return;
  case WARP_BALLOT:
  case WARP_ANY:
  case WARP_ALL: {
    unsigned ballot = 0;
    for (unsigned k = 0; k < 32; ++k)
      if ((w.mask >> k & 1) && w.val[k]) ballot |= 1u << k;
    w.result[i] = w.op == WARP_BALLOT ? ballot : w.op == WARP_ANY ? ballot != 0 : ballot == w.mask;
    return;
  }
  }
  if (!(w.mask >> src & 1))
    fault(cudaErrorIllegalInstruction, file, line,
          "%s: lane %u reads lane %u, which is not in the mask 0x%08x (an undefined value)",
          op_name(w.op), i, src, w.mask);
  w.result[i] = w.val[src];
}

unsigned long long warp_collective(warp_op op, unsigned mask, unsigned long long value, int arg,
                                   int width, const char *file, int line) {
  lane *l = running_lane(op_name(op), file, line);
  block_state *b = ex->blk;
  const unsigned me = l->linear & 31, warp = l->linear / 32;
  const unsigned present = b->n - warp * 32 >= 32 ? 0xffffffffu : (1u << (b->n - warp * 32)) - 1;
  if (!(mask >> me & 1))
    fault(cudaErrorIllegalInstruction, file, line,
          "%s with mask 0x%08x from lane %u, which the mask does not include", op_name(op), mask,
          me);
  if (mask & ~present)
    fault(cudaErrorIllegalInstruction, file, line,
          "%s with mask 0x%08x names lanes past the block's %u threads (warp %u has lanes "
          "0x%08x)", op_name(op), mask, b->n, warp, present);
  if (width < 1 || width > 32 || (width & (width - 1)))
    fault(cudaErrorIllegalInstruction, file, line, "%s width %d is not a power of 2 up to 32",
          op_name(op), width);
  warp_state &w = b->warps[warp];
  if (w.arrived && (w.mask != mask || w.op != op || w.width != width))
    fault(cudaErrorIllegalInstruction, file, line,
          "%s (mask 0x%08x) while lanes 0x%08x of the warp wait in %s (mask 0x%08x) at %s:%d",
          op_name(op), mask, w.arrived, op_name(w.op), w.mask, w.file, w.line);
  if (!w.arrived) {
    w.mask = mask, w.op = op, w.width = width, w.file = file, w.line = line;
  }
  w.val[me] = value;
  w.arg[me] = arg;
  w.arrived |= 1u << me;
  if (w.arrived == mask) {
    for (unsigned k = 0; k < 32; ++k)
      if (mask >> k & 1) warp_result(w, k, file, line);
    w.arrived = 0;
    for (unsigned k = 0; k < 32; ++k) {
      lane &m = b->lanes[warp * 32 + k];
      if ((mask >> k & 1) && k != me && m.st == AT_WARP) {
        m.st = RUNNING;
        wake(b, m);
      }
    }
    return w.result[me];
  }
  l->st = AT_WARP;
  l->file = file;
  l->line = line;
  lane_wait(*l);
  return w.result[me];
}

void *shared_var(const shared_site *site) {
  lane *l = running_lane("shared memory", site->file, site->line);
  block_state *b = ex->blk;
  for (const shared_block &s : b->shared)
    if (s.site == site) return s.mem;
  if (b->static_bytes + site->size > kSharedPerBlock)
    fault(cudaErrorLaunchOutOfResources, site->file, site->line,
          "static shared memory '%s' brings the block to %zu bytes, past sm_90's 48 KiB",
          site->name, b->static_bytes + site->size);
  /* Static beside dynamic: 48 KiB in all without the opt-in, 227 KiB with it. */
  const size_t cap = b->l->shared_limit > kSharedPerBlock ? kSharedOptin : kSharedPerBlock;
  if (b->static_bytes + site->size + b->l->shared_bytes > cap)
    fault(cudaErrorInvalidValue, site->file, site->line,
          "static shared memory '%s' brings the block to %zu bytes with the launch's %zu of "
          "dynamic shared memory, past the %zu a block may have %s", site->name,
          b->static_bytes + site->size + b->l->shared_bytes, b->l->shared_bytes, cap,
          cap == kSharedOptin ? "with the opt-in" : "without the cudaFuncSetAttribute opt-in");
  if (site->align > kCanary)
    fault(cudaErrorMisalignedAddress, site->file, site->line,
          "shared memory '%s' asks for %zu-byte alignment; the simulator gives at most %zu",
          site->name, site->align, kCanary);
  unsigned char *p = shared_alloc(site->size, site->align);
  if (!p) fault(cudaErrorMemoryAllocation, site->file, site->line, "out of host memory");
  (void)l;
  b->shared.push_back(shared_block{site, p, site->size});
  b->static_bytes += site->size;
  return p;
}

void *dynamic_shared(size_t align, const char *file, int line) {
  running_lane("dynamic shared memory", file, line);
  block_state *b = ex->blk;
  if (!b->dynamic_made) {
    b->dynamic = shared_block{nullptr, shared_alloc(b->l->shared_bytes, 16), b->l->shared_bytes};
    b->dynamic_made = true;
    if (!b->dynamic.mem) fault(cudaErrorMemoryAllocation, file, line, "out of host memory");
  }
  if (align > 16)
    fault(cudaErrorMisalignedAddress, file, line,
          "dynamic shared memory is 16-byte aligned; %zu asked", align);
  return b->dynamic.mem;
}

} // namespace fsdp_sim
