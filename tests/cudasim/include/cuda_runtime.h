/* tests/cudasim/include/cuda_runtime.h — the simulator's CUDA: the runtime API
 * (cuda_runtime_api.h) and, for C++, the device side that lets .cu files run
 * on the CPU unchanged: kernel qualifiers, dim3 and the built-in indices, the
 * launch (FSDP_LAUNCH, the one way a kernel is launched), __syncthreads,
 * shared memory (FSDP_SHARED, FSDP_DYNAMIC_SHARED), warp shuffles and votes,
 * atomics, __ldg and the math intrinsics the kernels use.
 *
 * How a kernel runs: the launch is queued on its stream, whose worker thread
 * runs the blocks one after the other; a block's threads are cooperative
 * fibers on that worker (a fiber runs threads one after the other until one
 * has to wait, at a barrier or a warp operation, and then another fiber takes
 * the next thread). So:
 * - __syncthreads releases only when every thread of the block has reached
 *   the same __syncthreads; a thread that exits, or waits at another barrier,
 *   while others wait is reported (the kernel's name, geometry, the barrier's
 *   file:line and a thread that never came) instead of hanging.
 * - a shuffle, vote or __syncwarp completes only when every lane of its mask
 *   has arrived with the same mask; a lane that never arrives, a mask naming a
 *   lane past the block, a lane outside its own mask, or a shuffle reading a
 *   lane outside the mask is reported.
 * - refused at launch, as an H100 (sm_90) refuses them, with
 *   cudaErrorInvalidConfiguration from cudaGetLastError and a stderr line
 *   naming the kernel and the geometry: more than 1024 threads per block,
 *   block dims past (1024, 1024, 64), grid dims past (2^31-1, 65535, 65535)
 *   or a zero dimension.
 * - dynamic shared memory past the kernel's limit on the launch's device is
 *   refused at launch with cudaErrorInvalidValue, as CUDA refuses it: 48 KiB
 *   unless cudaFuncSetAttribute(kernel,
 *   cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) raised it on that
 *   device (the opt-in), which refuses more than 227 KiB
 *   (cudaDevAttrMaxSharedMemoryPerBlockOptin, 232448). Static + dynamic past
 *   48 KiB without the opt-in, or past 227 KiB with it, is a fault
 *   (cudaErrorInvalidValue) when the block declares the static variable that
 *   crosses the line: a GPU refuses such a launch or opt-in, but the
 *   simulator learns a kernel's static shared memory only as it runs.
 * - shared memory is declared with FSDP_SHARED (a bare __shared__ does not
 *   compile here): each block gets fresh memory, aligned as its type asks (at
 *   least 16 bytes, at most 64), filled with 0xff bytes (NaN as float and
 *   bf16), so reading it before writing shows; every variable sits
 *   between canaries checked at each barrier and at the end of the block (an
 *   out-of-bounds write is reported with the variable's name) and, under
 *   AddressSanitizer, poisoned redzones (an out-of-bounds read is caught too);
 *   UBSan's bounds check catches an index past an inner dimension.
 * - device memory comes from the host heap (ASan sees every out-of-bounds
 *   kernel access), filled with 0xff bytes as cudaMalloc does not zero it.
 * - __ldg and vector types check alignment (a misaligned float4 load is a
 *   cudaErrorMisalignedAddress; UBSan's alignment check also covers plain
 *   dereferences of the aligned vector types).
 * - a fault inside a kernel is sticky, as on a GPU: the kernel stops, later
 *   work on the device is skipped and every later call returns the error.
 * - streams are asynchronous (a worker thread each; events, waits, host
 *   functions and the legacy default stream's implicit ordering honoured), so
 *   a missing cudaStreamWaitEvent is a real race, seen by ThreadSanitizer
 *   (fiber switches are annotated for ASan and TSan) or by a wrong result.
 *
 * What the simulator cannot judge (only a GPU can):
 * - timing, occupancy, register pressure, tensor-core and memory throughput;
 *   cudaEventElapsedTime measures the CPU.
 * - the memory model between blocks or kernels that run at the same time:
 *   blocks of a launch run one after the other in index order, so code that
 *   relies on another block's progress or on an inter-block order that is not
 *   guaranteed can pass here; threads within a warp do not run in lockstep
 *   either, so only the ordering that the sync primitives give is exercised.
 * - intra-block races on shared or global memory without a barrier: fibers
 *   switch only at sync points, so such code runs in one fixed order.
 * - cp.async: the model copies at once, and commit_group/wait_group do
 *   nothing, so a read of shared memory before its wait_group (or before the
 *   barrier that makes another thread's copy visible) passes here.
 * - floating point: expf, sqrtf and friends are the host libm's, and the host
 *   compiler decides fma contraction; results agree with a GPU's to rounding.
 * - kernel access to host memory that is neither pinned nor managed (a fault
 *   on most GPUs) and host access to device memory (a crash there) both
 *   succeed here; static shared memory past 48 KiB is left to nvcc, which
 *   refuses it at compile time; __launch_bounds__ is not enforced.
 * - cuBLAS and NCCL are reference implementations (tests/cudasim/cublas,
 *   tests/cudasim/nccl), not the libraries' algorithms; mma.sync
 *   (cudasim_ptx.h) is a model of the instruction's fragment layouts, not of
 *   the tensor cores' rounding. */
#ifndef FSDP_CUDASIM_CUDA_RUNTIME_H
#define FSDP_CUDASIM_CUDA_RUNTIME_H

#include "cuda_runtime_api.h"

#ifdef __cplusplus
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cmath>
#include <functional>
#include <type_traits>

/* ---- qualifiers ---- */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
/* Shared memory must be declared with FSDP_SHARED / FSDP_DYNAMIC_SHARED, which
 * give each block fresh, bounds-checked memory; a bare __shared__ would be
 * memory shared by every block on the thread, unchecked. */
#define __shared__ _Pragma("GCC error \"cudasim: declare shared memory with FSDP_SHARED(type, name, dims) or FSDP_DYNAMIC_SHARED(type, name) (src/backend/cuda/cuda_internal.cuh)\"")

/* ---- geometry and vector types ---- */

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

/* Aligned as on the GPU: a misaligned load of one is a fault there. */
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(16) double2 { double x, y; };

constexpr int warpSize = 32;

namespace fsdp_sim {

/* What a running thread sees; set by the executor on every switch. */
struct thread_view {
  uint3 thread_idx, block_idx;
  dim3 block_dim, grid_dim;
};
extern thread_local const thread_view *current __attribute__((tls_model("initial-exec")));

inline const uint3 &thread_idx() { return current->thread_idx; }
inline const uint3 &block_idx() { return current->block_idx; }
inline const dim3 &block_dim() { return current->block_dim; }
inline const dim3 &grid_dim() { return current->grid_dim; }

/* Reports a fault of the running kernel (sticky `err`, a stderr line with the
 * kernel, its geometry, this thread and the message) and abandons the launch. */
[[noreturn]] void fault(cudaError_t err, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

void syncthreads(const char *file, int line);

enum warp_op { WARP_SHFL, WARP_SHFL_UP, WARP_SHFL_DOWN, WARP_SHFL_XOR, WARP_SYNC, WARP_BALLOT,
               WARP_ANY, WARP_ALL };
/* Rendezvous of the mask's lanes; returns this lane's result (the value read,
 * or the vote). */
unsigned long long warp_collective(warp_op op, unsigned mask, unsigned long long value, int arg,
                                   int width, const char *file, int line);

struct shared_site {
  const char *name, *file;
  int line;
  size_t size, align;
};
void *shared_var(const shared_site *site);
void *dynamic_shared(size_t align, const char *file, int line);

/* Queues the kernel body `body` (run once per thread) of the kernel `func`
 * on `stream`; an invalid configuration is refused here (cudaGetLastError),
 * as a launch is. */
void launch_kernel(const char *name, const void *func, const char *file, int line, dim3 grid,
                   dim3 block, size_t shared_bytes, cudaStream_t stream,
                   std::function<void()> body);

template <typename T> unsigned long long to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                "cudasim: a warp shuffle moves at most 8 bytes");
  unsigned long long u = 0;
  memcpy(&u, &v, sizeof v);
  return u;
}
template <typename T> T from_bits(unsigned long long u) {
  T v;
  memcpy(&v, &u, sizeof v);
  return v;
}

} // namespace fsdp_sim

#define threadIdx (::fsdp_sim::thread_idx())
#define blockIdx (::fsdp_sim::block_idx())
#define blockDim (::fsdp_sim::block_dim())
#define gridDim (::fsdp_sim::grid_dim())

/* The launch: `kernel<<<grid, block, shmem, stream>>>(args...)` under nvcc.
 * The arguments are copied at the launch, as CUDA copies them. */
#define FSDP_LAUNCH(kernel, grid, block, shmem, stream, ...)                               \
  ::fsdp_sim::launch_kernel(#kernel, reinterpret_cast<const void *>(kernel), __FILE__,       \
                            __LINE__, (grid), (block), (shmem), (stream),                    \
                            [=]() { kernel(__VA_ARGS__); })

/* cudaFuncSetAttribute(kernel, attr, value), as the toolkit's C++ overload. */
template <typename T> cudaError_t cudaFuncSetAttribute(T *entry, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void *>(entry), attr, value);
}

/* `__shared__ T name dims;` under nvcc: one per block, checked here. */
#define FSDP_SHARED(T, name, dims)                                                          \
  static const ::fsdp_sim::shared_site name##_site_ = {#name, __FILE__, __LINE__,           \
                                                       sizeof(T dims), alignof(T)};         \
  T(&name) dims = *static_cast<T(*) dims>(::fsdp_sim::shared_var(&name##_site_))
/* `extern __shared__ T name[];` under nvcc: the launch's dynamic bytes. */
#define FSDP_DYNAMIC_SHARED(T, name)                                                        \
  T *name = static_cast<T *>(::fsdp_sim::dynamic_shared(alignof(T), __FILE__, __LINE__))

/* ---- synchronisation ---- */

inline void __syncthreads(const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::fsdp_sim::syncthreads(file, line);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, const char *file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
  ::fsdp_sim::warp_collective(::fsdp_sim::WARP_SYNC, mask, 0, 0, 32, file, line);
}

template <typename T>
T __shfl_sync(unsigned mask, T var, int src, int width = 32, const char *file = __builtin_FILE(),
              int line = __builtin_LINE()) {
  return ::fsdp_sim::from_bits<T>(::fsdp_sim::warp_collective(
      ::fsdp_sim::WARP_SHFL, mask, ::fsdp_sim::to_bits(var), src, width, file, line));
}
template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32,
                 const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::fsdp_sim::from_bits<T>(::fsdp_sim::warp_collective(
      ::fsdp_sim::WARP_SHFL_UP, mask, ::fsdp_sim::to_bits(var), (int)delta, width, file, line));
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32,
                   const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::fsdp_sim::from_bits<T>(::fsdp_sim::warp_collective(
      ::fsdp_sim::WARP_SHFL_DOWN, mask, ::fsdp_sim::to_bits(var), (int)delta, width, file, line));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32,
                  const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::fsdp_sim::from_bits<T>(::fsdp_sim::warp_collective(
      ::fsdp_sim::WARP_SHFL_XOR, mask, ::fsdp_sim::to_bits(var), lane_mask, width, file, line));
}
inline unsigned __ballot_sync(unsigned mask, int pred, const char *file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  return (unsigned)::fsdp_sim::warp_collective(::fsdp_sim::WARP_BALLOT, mask, pred != 0, 0, 32,
                                               file, line);
}
inline int __any_sync(unsigned mask, int pred, const char *file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
  return (int)::fsdp_sim::warp_collective(::fsdp_sim::WARP_ANY, mask, pred != 0, 0, 32, file,
                                          line);
}
inline int __all_sync(unsigned mask, int pred, const char *file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
  return (int)::fsdp_sim::warp_collective(::fsdp_sim::WARP_ALL, mask, pred != 0, 0, 32, file,
                                          line);
}

/* ---- loads ---- */

template <typename T>
T __ldg(const T *p, const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  if (reinterpret_cast<uintptr_t>(p) % alignof(T))
    ::fsdp_sim::fault(cudaErrorMisalignedAddress, file, line,
                      "misaligned __ldg of %zu bytes at %p (needs %zu-byte alignment)", sizeof(T),
                      (const void *)p, alignof(T));
  return *p;
}

/* ---- atomics: real ones (kernels on several streams run at once) ---- */

template <typename T> T atomicAdd(T *p, T v) {
  if constexpr (std::is_floating_point<T>::value) {
    T old, next;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    do
      next = old + v;
    while (!__atomic_compare_exchange(p, &old, &next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
  } else {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
  }
}
template <typename T> T atomicSub(T *p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); }
template <typename T> T atomicExch(T *p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
template <typename T> T atomicCAS(T *p, T cmp, T v) {
  __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return cmp;
}
template <typename T> T atomicMax(T *p, T v) {
  T old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED,
                                                 __ATOMIC_RELAXED)) {
  }
  return old;
}
template <typename T> T atomicMin(T *p, T v) {
  T old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (v < old && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED,
                                                 __ATOMIC_RELAXED)) {
  }
  return old;
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

/* ---- bit casts and math intrinsics (host libm; see the header comment) ---- */

inline unsigned __float_as_uint(float x) { unsigned u; memcpy(&u, &x, 4); return u; }
inline float __uint_as_float(unsigned u) { float x; memcpy(&x, &u, 4); return x; }
inline int __float_as_int(float x) { int u; memcpy(&u, &x, 4); return u; }
inline float __int_as_float(int u) { float x; memcpy(&x, &u, 4); return x; }
inline long long __double_as_longlong(double x) { long long u; memcpy(&u, &x, 8); return u; }
inline double __longlong_as_double(long long u) { double x; memcpy(&x, &u, 8); return x; }
/* Each rounds once: volatile keeps the host compiler from fusing them. */
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __ffs(int x) { return __builtin_ffs(x); }

#endif /* __cplusplus */
#endif
