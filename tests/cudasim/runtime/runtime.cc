/* tests/cudasim/runtime/runtime.cc — the simulated CUDA runtime: devices,
 * memory, streams, events and errors (the API of cuda_runtime_api.h).
 *
 * Streams: each is a worker thread running its queue in order (kernels,
 * copies, memsets, host functions, event records, waits). A wait blocks the
 * worker until the awaited stream has completed the op the event named when
 * cudaStreamWaitEvent was called, so ordering comes only from what the code
 * asked for. The legacy default stream (NULL) of each device waits for all
 * work already queued on the device's blocking streams, and they for its work.
 *
 * Memory: device and pinned allocations come from the host heap (AddressSanitizer
 * sees every out-of-bounds access), are filled with 0xff bytes (NaN as float
 * and bf16: reading memory nobody wrote shows), and are tracked for
 * cudaPointerGetAttributes and cudaMemGetInfo against a configurable size.
 * Without ASan (the optimised build of scripts/sim-test.sh that runs the
 * production shapes) each allocation sits between two guard zones of 0xff
 * bytes (guard_bytes: an eighth of its size, 64 KiB to 4 MiB): a read past
 * either end gives NaN, and a write there aborts with a report when the
 * allocation is freed.
 *
 * Errors: a refusal (bad argument, bad configuration) is returned and kept as
 * the thread's last error until cudaGetLastError; a fault inside a kernel is
 * sticky for its device, as on a GPU. Calls that CUDA forbids inside a host
 * function (cudaLaunchHostFunc) are refused there with cudaErrorNotPermitted. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "sim_internal.h"

namespace fsdp_sim {

void report(const char *fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "cudasim: %s\n", buf);
}

std::string describe(const launch &l) {
  char buf[256];
  snprintf(buf, sizeof buf, "launched at %s, grid (%u,%u,%u), block (%u,%u,%u), %zu bytes of "
           "dynamic shared memory", l.site.c_str(), l.grid.x, l.grid.y, l.grid.z, l.block.x,
           l.block.y, l.block.z, l.shared_bytes);
  return buf;
}

} // namespace fsdp_sim

using namespace fsdp_sim;

namespace {

const unsigned kStreamMagic = 0x57e4a11u, kEventMagic = 0xe7e47u;

struct op {
  enum kind { WORK, DEVICE_WORK, HOST, RECORD, WAIT } k;
  std::function<cudaError_t()> run; /* WORK, DEVICE_WORK, HOST */
  CUstream_st *target = nullptr;    /* WAIT: wait until target completed seq */
  uint64_t seq = 0;                 /* WAIT: target's op; RECORD: this op */
  CUevent_st *event = nullptr;      /* RECORD */
};

double now_s() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

} // namespace

struct CUstream_st {
  unsigned magic = kStreamMagic;
  int device = 0;
  unsigned flags = 0;
  int priority = 0;
  bool legacy = false;
  bool destroyed = false;
  std::mutex mu;
  std::condition_variable work_cv, done_cv;
  std::deque<op> queue;
  uint64_t enqueued = 0, completed = 0;
  bool stopping = false;
  std::thread worker;
};

struct CUevent_st {
  unsigned magic = kEventMagic;
  int device = 0;
  unsigned flags = 0;
  std::mutex mu;
  CUstream_st *stream = nullptr; /* the last record: (stream, seq) */
  uint64_t seq = 0;
  double time = 0.0;
  bool timed = false; /* the last record's op has run */
  std::atomic<int> refs{1}; /* the handle, and each queued record */
};

namespace {

struct device_state {
  std::mutex mu;                     /* streams, legacy */
  std::vector<CUstream_st *> streams; /* live, the legacy one included */
  CUstream_st *legacy = nullptr;
  std::atomic<int> sticky{cudaSuccess};
  size_t used = 0; /* guarded by mem_mu */
  std::mutex func_mu;
  std::map<const void *, size_t> dynamic_limit; /* the kernels opted in, and to how much */
};

struct allocation {
  size_t size;
  int device; /* -1: pinned host memory */
};

struct config {
  int devices = 4;
  size_t memory = (size_t)80 << 30;
  bool old_driver = false;
  bool broken_driver = false;
};

config cfg;
std::once_flag cfg_once;
device_state *devs; /* cfg.devices of them, never freed (workers may outlive main) */
/* Never destroyed: workers and late frees may run during exit, and the
 * destroyed streams must stay reachable (not leaks) until the end. */
std::mutex &mem_mu = *new std::mutex;
std::map<uintptr_t, allocation> &allocs = *new std::map<uintptr_t, allocation>;
std::mutex &graveyard_mu = *new std::mutex;
std::vector<CUstream_st *> &graveyard = *new std::vector<CUstream_st *>; /* events may name them */

thread_local int cur_device = 0;
thread_local cudaError_t last_error = cudaSuccess;
thread_local bool in_host_fn = false;

size_t parse_size(const char *s, size_t dflt) {
  if (!s || !*s) return dflt;
  char *end = nullptr;
  double v = strtod(s, &end);
  const char u = end ? *end : 0;
  const double k = u == 'K' || u == 'k' ? 1024.0 : u == 'M' || u == 'm' ? 1048576.0
                   : u == 'G' || u == 'g'                              ? 1073741824.0 : 1.0;
  if (v <= 0) return dflt;
  return (size_t)(v * k);
}

void read_config() {
  const char *d = getenv("FSDP_SIM_DEVICES");
  if (d && *d) cfg.devices = atoi(d) < 0 ? 0 : atoi(d);
  cfg.memory = parse_size(getenv("FSDP_SIM_DEVICE_MEM"), cfg.memory);
  const char *drv = getenv("FSDP_SIM_DRIVER");
  cfg.old_driver = drv && !strcmp(drv, "old");
  cfg.broken_driver = drv && !strcmp(drv, "broken");
  devs = new device_state[cfg.devices > 0 ? cfg.devices : 1];
}

cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess && e != cudaErrorNotReady) last_error = e;
  return e;
}

/* A refusal with a line saying why. */
cudaError_t refuse(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
cudaError_t refuse(cudaError_t e, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  report("%s [%s]", buf, cudaGetErrorName(e));
  return fail(e);
}

/* QUERY: allowed anywhere; WORK_CALL: not in host functions, and refused
 * after a fault; CLEANUP: not in host functions, but done after a fault too
 * (so that a failed program can still release its memory). */
enum gate { QUERY, WORK_CALL, CLEANUP };

/* Every entry point starts here: configuration, the driver, the device, host
 * functions (WORK_CALL is forbidden there) and the sticky error. */
cudaError_t enter(const char *name, gate g) {
  std::call_once(cfg_once, read_config);
  if (cfg.old_driver) return fail(cudaErrorInsufficientDriver);
  if (cfg.broken_driver) return fail(cudaErrorInitializationError);
  if (cfg.devices == 0) return fail(cudaErrorNoDevice);
  if (g != QUERY && in_host_fn)
    return refuse(cudaErrorNotPermitted, "%s called inside a host function "
                  "(cudaLaunchHostFunc): CUDA forbids CUDA calls there", name);
  if (g == WORK_CALL) {
    const int s = devs[cur_device].sticky.load();
    if (s != cudaSuccess) return fail((cudaError_t)s);
  }
  return cudaSuccess;
}

#define ENTER(g)                                             \
  do {                                                       \
    const cudaError_t enter_err_ = enter(__func__, g);       \
    if (enter_err_ != cudaSuccess) return enter_err_;        \
  } while (0)

/* ---- workers ---- */

void wait_for(CUstream_st *s, uint64_t seq) {
  std::unique_lock<std::mutex> g(s->mu);
  s->done_cv.wait(g, [&] { return s->completed >= seq; });
}

void run_op(CUstream_st *s, op &o) {
  device_state &d = devs[s->device];
  switch (o.k) {
  case op::WAIT:
    wait_for(o.target, o.seq);
    break;
  case op::RECORD: {
    CUevent_st *e = o.event;
    {
      std::lock_guard<std::mutex> g(e->mu);
      if (e->stream == s && e->seq == o.seq) e->time = now_s(), e->timed = true;
    }
    if (--e->refs == 0) delete e;
    break;
  }
  case op::HOST:
    in_host_fn = true;
    o.run();
    in_host_fn = false;
    break;
  case op::DEVICE_WORK:
    /* After a fault the device does nothing more, as a GPU's context. */
    if (d.sticky.load() == cudaSuccess) {
      const cudaError_t e = o.run();
      if (e != cudaSuccess) {
        int expected = cudaSuccess;
        d.sticky.compare_exchange_strong(expected, e);
      }
    }
    break;
  case op::WORK:
    o.run();
    break;
  }
}

void worker_main(CUstream_st *s) {
  cur_device = s->device;
  std::unique_lock<std::mutex> g(s->mu);
  for (;;) {
    s->work_cv.wait(g, [&] { return !s->queue.empty() || s->stopping; });
    if (s->queue.empty()) return;
    op o = std::move(s->queue.front());
    s->queue.pop_front();
    g.unlock();
    run_op(s, o);
    o = op{};
    g.lock();
    s->completed++;
    s->done_cv.notify_all();
  }
}

CUstream_st *stream_new(int device, unsigned flags, int priority, bool legacy) {
  CUstream_st *s = new CUstream_st;
  s->device = device;
  s->flags = flags;
  s->priority = priority;
  s->legacy = legacy;
  s->worker = std::thread(worker_main, s);
  device_state &d = devs[device];
  std::lock_guard<std::mutex> g(d.mu);
  d.streams.push_back(s);
  if (legacy) d.legacy = s;
  return s;
}

CUstream_st *legacy_stream(int device) {
  device_state &d = devs[device];
  {
    std::lock_guard<std::mutex> g(d.mu);
    if (d.legacy) return d.legacy;
  }
  static std::mutex make_mu;
  std::lock_guard<std::mutex> g(make_mu);
  {
    std::lock_guard<std::mutex> g2(d.mu);
    if (d.legacy) return d.legacy;
  }
  return stream_new(device, 0, 0, true);
}

/* The stream a handle names (NULL: the legacy stream of the current device). */
cudaError_t resolve(cudaStream_t h, CUstream_st **out) {
  if (!h) return *out = legacy_stream(cur_device), cudaSuccess;
  if (h->magic != kStreamMagic)
    return refuse(cudaErrorInvalidResourceHandle, "%p is not a stream", (void *)h);
  if (h->destroyed)
    return refuse(cudaErrorInvalidResourceHandle, "stream %p used after cudaStreamDestroy",
                  (void *)h);
  *out = h;
  return cudaSuccess;
}

/* Queues o on s after the implicit waits of the legacy default stream;
 * returns o's sequence number. */
uint64_t enqueue(CUstream_st *s, op o) {
  std::vector<std::pair<CUstream_st *, uint64_t>> waits;
  if (!(s->flags & cudaStreamNonBlocking)) {
    device_state &d = devs[s->device];
    std::vector<CUstream_st *> others;
    {
      std::lock_guard<std::mutex> g(d.mu);
      for (CUstream_st *t : d.streams)
        if (t != s && !(t->flags & cudaStreamNonBlocking) && (s->legacy || t->legacy))
          others.push_back(t);
    }
    for (CUstream_st *t : others) {
      std::lock_guard<std::mutex> g(t->mu);
      if (t->enqueued > t->completed) waits.push_back({t, t->enqueued});
    }
  }
  std::lock_guard<std::mutex> g(s->mu);
  for (auto &w : waits) {
    op wait;
    wait.k = op::WAIT;
    wait.target = w.first;
    wait.seq = w.second;
    s->queue.push_back(std::move(wait));
    s->enqueued++;
  }
  if (o.k == op::RECORD) o.seq = s->enqueued + 1;
  s->queue.push_back(std::move(o));
  const uint64_t seq = ++s->enqueued;
  s->work_cv.notify_one();
  return seq;
}

/* Waits (host) until s has run everything queued so far. */
void drain(CUstream_st *s) {
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> g(s->mu);
    seq = s->enqueued;
  }
  wait_for(s, seq);
}

void drain_device(int device) {
  device_state &d = devs[device];
  std::vector<CUstream_st *> all;
  {
    std::lock_guard<std::mutex> g(d.mu);
    all = d.streams;
  }
  for (CUstream_st *s : all) drain(s);
}

/* ---- memory ---- */

/* The allocation containing [p, p+n), if any. */
bool find_alloc(const void *p, size_t n, allocation *out, uintptr_t *base) {
  std::lock_guard<std::mutex> g(mem_mu);
  auto it = allocs.upper_bound((uintptr_t)p);
  if (it == allocs.begin()) return false;
  --it;
  if ((uintptr_t)p >= it->first + (it->second.size ? it->second.size : 1)) return false;
  if (out) *out = it->second;
  if (base) *base = it->first;
  (void)n;
  return true;
}

bool is_device(const void *p) {
  allocation a;
  return find_alloc(p, 0, &a, nullptr) && a.device >= 0;
}

/* A device range must lie inside its allocation. */
cudaError_t check_range(const char *call, const char *what, const void *p, size_t n) {
  allocation a;
  uintptr_t base;
  if (!find_alloc(p, n, &a, &base) || a.device < 0) return cudaSuccess;
  if ((uintptr_t)p + n > base + a.size)
    return refuse(cudaErrorInvalidValue, "%s: %s range [%p, +%zu) runs %zu bytes past its "
                  "allocation of %zu bytes", call, what, p, n,
                  (size_t)((uintptr_t)p + n - base - a.size), a.size);
  return cudaSuccess;
}

#if defined(__SANITIZE_ADDRESS__)
size_t guard_bytes(size_t) { return 0; } /* ASan's redzones do better */
#else
size_t guard_bytes(size_t size) {
  const size_t g = size / 8 < ((size_t)64 << 10) ? (size_t)64 << 10
                   : size / 8 > ((size_t)4 << 20) ? (size_t)4 << 20 : size / 8;
  return (g + 255) & ~(size_t)255; /* keeps the allocation 256-byte aligned */
}
#endif

/* Aborts, naming the allocation, when a byte of a guard zone changed. */
void check_guards(const unsigned char *m, size_t size, int device) {
  const size_t g = guard_bytes(size);
  for (size_t i = 0; i < g; ++i) {
    const bool before = m[-(ptrdiff_t)g + (ptrdiff_t)i] != 0xff, after = m[size + i] != 0xff;
    if (before || after) {
      report("out-of-bounds write to %s memory: the allocation of %zu bytes at %p was written "
             "at offset %td, %s it (found when it was freed)", device >= 0 ? "device" : "pinned host",
             size, (const void *)m, before ? -(ptrdiff_t)(g - i) : (ptrdiff_t)(size + i),
             before ? "before" : "past the end of");
      abort();
    }
  }
}

cudaError_t alloc(void **p, size_t size, int device) {
  if (!p) return refuse(cudaErrorInvalidValue, "allocation: NULL result pointer");
  *p = nullptr;
  if (size == 0) return cudaSuccess;
  {
    std::lock_guard<std::mutex> g(mem_mu);
    if (device >= 0 && devs[device].used + size > cfg.memory) return fail(cudaErrorMemoryAllocation);
    if (device >= 0) devs[device].used += size;
  }
  void *base = nullptr;
  const size_t guard = guard_bytes(size);
  if (posix_memalign(&base, 256, size + 2 * guard) != 0) {
    std::lock_guard<std::mutex> g(mem_mu);
    if (device >= 0) devs[device].used -= size;
    return fail(cudaErrorMemoryAllocation);
  }
  memset(base, 0xff, size + 2 * guard); /* cudaMalloc does not zero */
  void *m = (unsigned char *)base + guard;
  std::lock_guard<std::mutex> g(mem_mu);
  allocs[(uintptr_t)m] = allocation{size, device};
  *p = m;
  return cudaSuccess;
}

cudaError_t release(void *p, bool device, const char *call) {
  if (!p) return cudaSuccess;
  allocation a;
  {
    std::lock_guard<std::mutex> g(mem_mu);
    auto it = allocs.find((uintptr_t)p);
    if (it == allocs.end() || (it->second.device >= 0) != device)
      return refuse(cudaErrorInvalidValue, "%s(%p): not the start of a %s allocation", call, p,
                    device ? "device" : "pinned host");
    a = it->second;
  }
  /* cudaFree waits for the device: work still using p finishes first. */
  if (device)
    drain_device(a.device);
  else
    for (int d = 0; d < cfg.devices; ++d) drain_device(d);
  std::lock_guard<std::mutex> g(mem_mu);
  allocs.erase((uintptr_t)p);
  if (device) devs[a.device].used -= a.size;
  check_guards((const unsigned char *)p, a.size, a.device);
  free((unsigned char *)p - guard_bytes(a.size));
  return cudaSuccess;
}

enum cudaMemcpyKind infer_kind(void *dst, const void *src) {
  const bool d = is_device(dst), s = is_device(src);
  return d && s ? cudaMemcpyDeviceToDevice : d ? cudaMemcpyHostToDevice
                                         : s ? cudaMemcpyDeviceToHost
                                             : cudaMemcpyHostToHost;
}

/* An explicit kind must match the pointers (the simulator's UVA knows them). */
cudaError_t check_copy(const char *call, void *dst, const void *src, size_t n,
                       enum cudaMemcpyKind kind, enum cudaMemcpyKind *actual) {
  if (!dst || !src) return refuse(cudaErrorInvalidValue, "%s: NULL pointer", call);
  if ((unsigned)kind > cudaMemcpyDefault)
    return refuse(cudaErrorInvalidMemcpyDirection, "%s: kind %d", call, (int)kind);
  *actual = infer_kind(dst, src);
  if (kind != cudaMemcpyDefault && kind != *actual) {
    static const char *const names[] = {"HostToHost", "HostToDevice", "DeviceToHost",
                                        "DeviceToDevice", "Default"};
    return refuse(cudaErrorInvalidValue, "%s: kind cudaMemcpy%s, but the pointers make it "
                  "cudaMemcpy%s (dst %p, src %p)", call, names[kind], names[*actual], dst, src);
  }
  cudaError_t e = check_range(call, "destination", dst, n);
  return e != cudaSuccess ? e : check_range(call, "source", src, n);
}

op copy_op(void *dst, const void *src, size_t n) {
  op o;
  o.k = op::DEVICE_WORK;
  o.run = [dst, src, n] {
    memmove(dst, src, n);
    return cudaSuccess;
  };
  return o;
}

cudaError_t stream_of_device(CUstream_st *s, const char *call) {
  if (s->device != cur_device)
    return refuse(cudaErrorInvalidResourceHandle, "%s on a stream of device %d while device %d "
                  "is current", call, s->device, cur_device);
  return cudaSuccess;
}

} // namespace

/* ---- launches (exec.cc runs them) ---- */

namespace fsdp_sim {

cudaError_t enqueue_launch(launch *l, cudaStream_t stream) {
  std::unique_ptr<launch> owned(l);
  ENTER(WORK_CALL);
  {
    device_state &d = devs[l->device];
    std::lock_guard<std::mutex> g(d.func_mu);
    auto it = d.dynamic_limit.find(l->func);
    l->shared_limit = it == d.dynamic_limit.end() ? kSharedPerBlock : it->second;
  }
  std::string why;
  if (cudaError_t e = check_launch(*l, &why))
    return refuse(e, "kernel '%s' (%s) refused: %s", l->name.c_str(), describe(*l).c_str(),
                  why.c_str());
  CUstream_st *s = nullptr;
  if (cudaError_t e = resolve(stream, &s)) return e;
  char call[256];
  snprintf(call, sizeof call, "launch of kernel '%s' at %s", l->name.c_str(), l->site.c_str());
  if (cudaError_t e = stream_of_device(s, call)) return e;
  l->device = s->device;
  std::shared_ptr<launch> shared(owned.release());
  op o;
  o.k = op::DEVICE_WORK;
  o.run = [shared] { return run_launch(*shared); };
  enqueue(s, std::move(o));
  return cudaSuccess;
}

void launch_kernel(const char *name, const void *func, const char *file, int line, dim3 grid,
                   dim3 block, size_t shared_bytes, cudaStream_t stream,
                   std::function<void()> body) {
  launch *l = new launch;
  l->name = name;
  l->func = func;
  l->site = std::string(file) + ":" + std::to_string(line);
  l->grid = grid;
  l->block = block;
  l->shared_bytes = shared_bytes;
  l->device = cur_device;
  l->body = std::move(body);
  enqueue_launch(l, stream);
}

} // namespace fsdp_sim

/* ---- the API ---- */

extern "C" {

cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  if (e == cudaSuccess && devs && cfg.devices > 0) e = (cudaError_t)devs[cur_device].sticky.load();
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  if (last_error == cudaSuccess && devs && cfg.devices > 0)
    return (cudaError_t)devs[cur_device].sticky.load();
  return last_error;
}

const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
#define NAME(x) \
  case x:       \
    return #x;
    NAME(cudaSuccess) NAME(cudaErrorInvalidValue) NAME(cudaErrorMemoryAllocation)
    NAME(cudaErrorInitializationError) NAME(cudaErrorInvalidConfiguration)
    NAME(cudaErrorInvalidMemcpyDirection) NAME(cudaErrorInsufficientDriver)
    NAME(cudaErrorInvalidDeviceFunction) NAME(cudaErrorNoDevice) NAME(cudaErrorInvalidDevice)
    NAME(cudaErrorInvalidResourceHandle)
    NAME(cudaErrorNotReady) NAME(cudaErrorIllegalAddress) NAME(cudaErrorLaunchOutOfResources)
    NAME(cudaErrorIllegalInstruction) NAME(cudaErrorMisalignedAddress)
    NAME(cudaErrorLaunchFailure) NAME(cudaErrorNotPermitted) NAME(cudaErrorUnknown)
#undef NAME
  }
  return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInitializationError: return "initialization error";
  case cudaErrorInvalidConfiguration: return "invalid configuration argument";
  case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
  case cudaErrorInsufficientDriver:
    return "CUDA driver version is insufficient for CUDA runtime version";
  case cudaErrorInvalidDeviceFunction: return "invalid device function";
  case cudaErrorNoDevice: return "no CUDA-capable device is detected";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorInvalidResourceHandle: return "invalid resource handle";
  case cudaErrorNotReady: return "device not ready";
  case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
  case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
  case cudaErrorIllegalInstruction: return "an illegal instruction was encountered";
  case cudaErrorMisalignedAddress: return "misaligned address";
  case cudaErrorLaunchFailure: return "unspecified launch failure";
  case cudaErrorNotPermitted: return "operation not permitted";
  case cudaErrorUnknown: return "unknown error";
  }
  return "unrecognized error code";
}

cudaError_t cudaGetDeviceCount(int *count) {
  if (!count) return fail(cudaErrorInvalidValue);
  *count = 0;
  ENTER(QUERY);
  *count = cfg.devices;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  ENTER(QUERY);
  if (device < 0 || device >= cfg.devices) return fail(cudaErrorInvalidDevice);
  cur_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
  ENTER(QUERY);
  if (!device) return fail(cudaErrorInvalidValue);
  *device = cur_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device) {
  ENTER(QUERY);
  if (!p) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= cfg.devices) return fail(cudaErrorInvalidDevice);
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "cudasim H100 (simulated sm_90, device %d)", device);
  p->totalGlobalMem = cfg.memory;
  p->sharedMemPerBlock = kSharedPerBlock;
  p->sharedMemPerBlockOptin = kSharedOptin;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
  p->major = 9, p->minor = 0;
  p->multiProcessorCount = 132;
  p->maxThreadsPerMultiProcessor = 2048;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
  ENTER(QUERY);
  if (!value) return refuse(cudaErrorInvalidValue, "cudaDeviceGetAttribute: NULL value");
  if (device < 0 || device >= cfg.devices) return fail(cudaErrorInvalidDevice);
  switch (attr) {
  case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)kSharedPerBlock; return cudaSuccess;
  case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess; /* p->major */
  case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)kSharedOptin; return cudaSuccess;
  case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = 233472; return cudaSuccess;
  case cudaDevAttrReservedSharedMemoryPerBlock: *value = 1024; return cudaSuccess;
  }
  return refuse(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute %d is not modelled "
                "by the simulator (tests/cudasim/include/cuda_runtime_api.h lists those it "
                "answers)", (int)attr);
}

/* The opt-in: per kernel and device, as CUDA keeps a function's attributes
 * per context. */
cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
  ENTER(WORK_CALL);
  if (!func) return refuse(cudaErrorInvalidDeviceFunction, "cudaFuncSetAttribute: NULL function");
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
    return refuse(cudaErrorInvalidValue, "cudaFuncSetAttribute: attribute %d is not modelled "
                  "by the simulator", (int)attr);
  if (value < 0 || (size_t)value > kSharedOptin)
    return refuse(cudaErrorInvalidValue, "cudaFuncSetAttribute: %d bytes of dynamic shared "
                  "memory asked, past the %zu an sm_90 block may opt in to "
                  "(cudaDevAttrMaxSharedMemoryPerBlockOptin)", value, kSharedOptin);
  device_state &d = devs[cur_device];
  std::lock_guard<std::mutex> g(d.func_mu);
  d.dynamic_limit[func] = (size_t)value;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  ENTER(WORK_CALL);
  drain_device(cur_device);
  return fail((cudaError_t)devs[cur_device].sticky.load());
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
  ENTER(QUERY);
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v) {
  if (!v) return fail(cudaErrorInvalidValue);
  std::call_once(cfg_once, read_config);
  *v = cfg.old_driver ? 11080 : CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v) {
  if (!v) return fail(cudaErrorInvalidValue);
  *v = CUDART_VERSION;
  return cudaSuccess;
}

/* ---- memory ---- */

cudaError_t cudaMalloc(void **p, size_t size) {
  ENTER(WORK_CALL);
  return alloc(p, size, cur_device);
}

cudaError_t cudaFree(void *p) {
  ENTER(CLEANUP);
  const cudaError_t e = release(p, true, "cudaFree");
  return e != cudaSuccess ? e : fail((cudaError_t)devs[cur_device].sticky.load());
}

cudaError_t cudaHostAlloc(void **p, size_t size, unsigned flags) {
  ENTER(WORK_CALL);
  if (flags & ~0x7u) return refuse(cudaErrorInvalidValue, "cudaHostAlloc: flags 0x%x", flags);
  return alloc(p, size, -1);
}

cudaError_t cudaMallocHost(void **p, size_t size) { return cudaHostAlloc(p, size, 0); }

cudaError_t cudaFreeHost(void *p) {
  ENTER(CLEANUP);
  return release(p, false, "cudaFreeHost");
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total) {
  ENTER(WORK_CALL);
  std::lock_guard<std::mutex> g(mem_mu);
  if (free_b) *free_b = cfg.memory - devs[cur_device].used;
  if (total) *total = cfg.memory;
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
  ENTER(QUERY);
  if (!a) return fail(cudaErrorInvalidValue);
  allocation al;
  memset(a, 0, sizeof *a);
  a->device = -2;
  if (p && find_alloc(p, 0, &al, nullptr)) {
    a->type = al.device >= 0 ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
    a->device = al.device >= 0 ? al.device : cur_device;
    a->devicePointer = const_cast<void *>(p);
    a->hostPointer = al.device >= 0 ? nullptr : const_cast<void *>(p);
  } else {
    a->type = cudaMemoryTypeUnregistered;
    a->hostPointer = const_cast<void *>(p);
  }
  return cudaSuccess;
}

/* Synchronous with the host for copies that touch host memory; a copy
 * between device buffers only queues, as CUDA documents. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
  ENTER(WORK_CALL);
  if (n == 0) return cudaSuccess;
  enum cudaMemcpyKind k;
  if (cudaError_t e = check_copy("cudaMemcpy", dst, src, n, kind, &k)) return e;
  CUstream_st *s = legacy_stream(cur_device);
  enqueue(s, copy_op(dst, src, n));
  if (k != cudaMemcpyDeviceToDevice) drain(s);
  return fail((cudaError_t)devs[cur_device].sticky.load());
}

/* Pageable host memory as a source is staged at the call (the host may reuse
 * it at once, as with CUDA); everything else is read and written when the
 * stream reaches the copy. */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  ENTER(WORK_CALL);
  CUstream_st *s = nullptr;
  if (cudaError_t e = resolve(stream, &s)) return e;
  if (n == 0) return cudaSuccess;
  enum cudaMemcpyKind k;
  if (cudaError_t e = check_copy("cudaMemcpyAsync", dst, src, n, kind, &k)) return e;
  allocation a;
  if (k == cudaMemcpyHostToDevice && !find_alloc(src, n, &a, nullptr)) {
    std::shared_ptr<std::vector<unsigned char>> staged(
        new std::vector<unsigned char>((const unsigned char *)src, (const unsigned char *)src + n));
    op o;
    o.k = op::DEVICE_WORK;
    o.run = [dst, staged] {
      memcpy(dst, staged->data(), staged->size());
      return cudaSuccess;
    };
    enqueue(s, std::move(o));
    return cudaSuccess;
  }
  enqueue(s, copy_op(dst, src, n));
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t stream) {
  ENTER(WORK_CALL);
  CUstream_st *s = nullptr;
  if (cudaError_t e = resolve(stream, &s)) return e;
  if (n == 0) return cudaSuccess;
  if (!p) return refuse(cudaErrorInvalidValue, "cudaMemset: NULL pointer");
  if (!find_alloc(p, n, nullptr, nullptr))
    return refuse(cudaErrorInvalidValue, "cudaMemset on %p, which is neither device nor pinned "
                  "memory", p);
  if (cudaError_t e = check_range("cudaMemset", "destination", p, n)) return e;
  op o;
  o.k = op::DEVICE_WORK;
  o.run = [p, value, n] {
    memset(p, value, n);
    return cudaSuccess;
  };
  enqueue(s, std::move(o));
  return cudaSuccess;
}

/* On the legacy stream: asynchronous for device memory, as CUDA documents. */
cudaError_t cudaMemset(void *p, int value, size_t n) {
  cudaError_t e = cudaMemsetAsync(p, value, n, nullptr);
  if (e == cudaSuccess && n && !is_device(p)) drain(legacy_stream(cur_device));
  return e;
}

/* ---- streams ---- */

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *ps, unsigned flags, int priority) {
  ENTER(WORK_CALL);
  if (!ps) return refuse(cudaErrorInvalidValue, "cudaStreamCreate: NULL result pointer");
  if (flags & ~cudaStreamNonBlocking)
    return refuse(cudaErrorInvalidValue, "cudaStreamCreate: flags 0x%x", flags);
  priority = priority > 0 ? 0 : priority < -5 ? -5 : priority; /* clamped, as CUDA does */
  *ps = stream_new(cur_device, flags, priority, false);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *ps, unsigned flags) {
  return cudaStreamCreateWithPriority(ps, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t *ps) { return cudaStreamCreateWithPriority(ps, 0, 0); }

/* Waits for the stream's work, then stops its worker. The struct stays (an
 * event may still name it; a later use of the handle is reported). */
cudaError_t cudaStreamDestroy(cudaStream_t h) {
  ENTER(CLEANUP);
  if (!h) return refuse(cudaErrorInvalidResourceHandle, "cudaStreamDestroy(NULL)");
  CUstream_st *s = nullptr;
  if (cudaError_t e = resolve(h, &s)) return e;
  drain(s);
  {
    std::lock_guard<std::mutex> g(s->mu);
    s->stopping = true;
    s->destroyed = true;
    s->work_cv.notify_one();
  }
  s->worker.join();
  device_state &d = devs[s->device];
  {
    std::lock_guard<std::mutex> g(d.mu);
    for (size_t i = 0; i < d.streams.size(); ++i)
      if (d.streams[i] == s) d.streams.erase(d.streams.begin() + (long)i);
  }
  std::lock_guard<std::mutex> g(graveyard_mu);
  graveyard.push_back(s);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t h) {
  ENTER(WORK_CALL);
  CUstream_st *s = nullptr;
  if (cudaError_t e = resolve(h, &s)) return e;
  if (s->legacy) {
    /* The legacy stream's synchronize waits for the blocking streams too. */
    op mark;
    mark.k = op::WORK;
    mark.run = [] { return cudaSuccess; };
    enqueue(s, std::move(mark));
  }
  drain(s);
  return fail((cudaError_t)devs[s->device].sticky.load());
}

cudaError_t cudaStreamQuery(cudaStream_t h) {
  ENTER(WORK_CALL);
  CUstream_st *s = nullptr;
  if (cudaError_t e = resolve(h, &s)) return e;
  std::lock_guard<std::mutex> g(s->mu);
  return s->completed == s->enqueued ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamGetPriority(cudaStream_t h, int *priority) {
  ENTER(QUERY);
  CUstream_st *s = nullptr;
  if (cudaError_t e = resolve(h, &s)) return e;
  if (priority) *priority = s->priority;
  return cudaSuccess;
}

cudaError_t cudaStreamGetFlags(cudaStream_t h, unsigned *flags) {
  ENTER(QUERY);
  CUstream_st *s = nullptr;
  if (cudaError_t e = resolve(h, &s)) return e;
  if (flags) *flags = s->flags;
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t h, cudaHostFn_t fn, void *data) {
  ENTER(WORK_CALL);
  CUstream_st *s = nullptr;
  if (cudaError_t e = resolve(h, &s)) return e;
  if (!fn) return refuse(cudaErrorInvalidValue, "cudaLaunchHostFunc: NULL function");
  op o;
  o.k = op::HOST;
  o.run = [fn, data] {
    fn(data);
    return cudaSuccess;
  };
  enqueue(s, std::move(o));
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t h, cudaEvent_t ev, unsigned flags) {
  ENTER(WORK_CALL);
  CUstream_st *s = nullptr;
  if (cudaError_t e = resolve(h, &s)) return e;
  if (!ev || ev->magic != kEventMagic)
    return refuse(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: %p is not an event",
                  (void *)ev);
  if (flags) return refuse(cudaErrorInvalidValue, "cudaStreamWaitEvent: flags 0x%x", flags);
  op o;
  o.k = op::WAIT;
  {
    std::lock_guard<std::mutex> g(ev->mu);
    if (!ev->stream) return cudaSuccess; /* never recorded: nothing to wait for */
    o.target = ev->stream;
    o.seq = ev->seq;
  }
  if (o.target == s) return cudaSuccess; /* in order already */
  enqueue(s, std::move(o));
  return cudaSuccess;
}

/* ---- events ---- */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *pe, unsigned flags) {
  ENTER(WORK_CALL);
  if (!pe) return refuse(cudaErrorInvalidValue, "cudaEventCreate: NULL result pointer");
  if (flags & ~0x7u) return refuse(cudaErrorInvalidValue, "cudaEventCreate: flags 0x%x", flags);
  CUevent_st *e = new CUevent_st;
  e->device = cur_device;
  e->flags = flags;
  *pe = e;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *pe) { return cudaEventCreateWithFlags(pe, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  ENTER(QUERY);
  if (!e || e->magic != kEventMagic)
    return refuse(cudaErrorInvalidResourceHandle, "cudaEventDestroy: %p is not an event",
                  (void *)e);
  if (--e->refs == 0) {
    e->magic = 0;
    delete e;
  }
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t h) {
  ENTER(WORK_CALL);
  if (!e || e->magic != kEventMagic)
    return refuse(cudaErrorInvalidResourceHandle, "cudaEventRecord: %p is not an event",
                  (void *)e);
  CUstream_st *s = nullptr;
  if (cudaError_t err = resolve(h, &s)) return err;
  if (s->device != e->device)
    return refuse(cudaErrorInvalidResourceHandle, "cudaEventRecord: event of device %d on a "
                  "stream of device %d", e->device, s->device);
  std::lock_guard<std::mutex> g(e->mu);
  op o;
  o.k = op::RECORD;
  o.event = e;
  e->refs++;
  e->seq = enqueue(s, std::move(o));
  e->stream = s;
  e->timed = false;
  return cudaSuccess;
}

static cudaError_t event_target(cudaEvent_t e, CUstream_st **s, uint64_t *seq) {
  if (!e || e->magic != kEventMagic)
    return refuse(cudaErrorInvalidResourceHandle, "%p is not an event", (void *)e);
  std::lock_guard<std::mutex> g(e->mu);
  *s = e->stream;
  *seq = e->seq;
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  ENTER(WORK_CALL);
  CUstream_st *s = nullptr;
  uint64_t seq = 0;
  if (cudaError_t err = event_target(e, &s, &seq)) return err;
  if (!s) return cudaSuccess;
  std::lock_guard<std::mutex> g(s->mu);
  return s->completed >= seq ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  ENTER(WORK_CALL);
  CUstream_st *s = nullptr;
  uint64_t seq = 0;
  if (cudaError_t err = event_target(e, &s, &seq)) return err;
  if (s) wait_for(s, seq);
  return fail((cudaError_t)devs[e->device].sticky.load());
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
  ENTER(WORK_CALL);
  if (!ms) return refuse(cudaErrorInvalidValue, "cudaEventElapsedTime: NULL result");
  double t[2];
  cudaEvent_t ev[2] = {a, b};
  for (int i = 0; i < 2; ++i) {
    CUstream_st *s = nullptr;
    uint64_t seq = 0;
    if (cudaError_t err = event_target(ev[i], &s, &seq)) return err;
    if (ev[i]->flags & cudaEventDisableTiming)
      return refuse(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event was created "
                    "with cudaEventDisableTiming");
    if (!s) return refuse(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event was "
                          "never recorded");
    std::lock_guard<std::mutex> g(ev[i]->mu);
    if (!ev[i]->timed) return fail(cudaErrorNotReady);
    t[i] = ev[i]->time;
  }
  *ms = (float)((t[1] - t[0]) * 1e3);
  return cudaSuccess;
}

} /* extern "C" */
