/* tests/cudasim/runtime/test_sim.cc — the simulator's own tests: what it
 * computes (barriers, shared memory, shuffles, votes, atomics, streams,
 * events) and what it refuses (each refusal the header lists), each checked
 * by the error code AND the stderr line naming the fault, so that the test
 * fails if the simulator stopped catching the thing.
 *
 * Faults are sticky per device, as on a GPU: each faulting case runs on a
 * device of its own (FSDP_SIM_DEVICES=32 is set before the first call). Cases
 * that end the process (AddressSanitizer, ThreadSanitizer, the driver check)
 * run in a child: this program re-executed with --child <case>. */
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <cudasim_ptx.h>

#include "../sim_test.h"

extern char **environ;

static std::string self;

/* ---- stderr capture: the simulator's report lines ---- */

struct capture {
  int saved = -1;
  FILE *tmp = nullptr;
  void begin() {
    fflush(stderr);
    tmp = tmpfile();
    saved = dup(2);
    dup2(fileno(tmp), 2);
  }
  std::string end() {
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    std::string s;
    rewind(tmp);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, tmp)) > 0) s.append(buf, n);
    fclose(tmp);
    fputs(s.c_str(), stderr); /* still shown, for the log */
    return s;
  }
};

static bool has(const std::string &s, const char *what) { return s.find(what) != std::string::npos; }

/* ---- kernels ---- */

__global__ void reverse_kernel(int *out, const int *in) {
  FSDP_SHARED(int, tile, [256]);
  const unsigned t = threadIdx.x;
  tile[t] = in[blockIdx.x * blockDim.x + t];
  __syncthreads();
  out[blockIdx.x * blockDim.x + t] = tile[blockDim.x - 1 - t];
}

__global__ void warp_kernel(int *sum, int *up, int *down, unsigned *ballot, int *any_all) {
  const int lane = threadIdx.x & 31;
  int x = lane + 1;
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  sum[threadIdx.x] = x;
  up[threadIdx.x] = __shfl_up_sync(0xffffffffu, lane, 1);
  down[threadIdx.x] = __shfl_down_sync(0xffffffffu, lane, 4, 8);
  ballot[threadIdx.x] = __ballot_sync(0xffffffffu, lane % 3 == 0);
  any_all[threadIdx.x] = __any_sync(0xffffffffu, lane == 7) * 2 + __all_sync(0xffffffffu, lane < 40);
}

__global__ void atomic_kernel(float *acc, unsigned *count) {
  atomicAdd(acc, 0.5f);
  atomicAdd(count, 1u);
}

__global__ void dynamic_kernel(float *out, int n) {
  FSDP_DYNAMIC_SHARED(float, buf);
  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = (float)i;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0;
    for (int i = 0; i < n; ++i) s += buf[i];
    *out = s;
  }
}

/* Every float of the launch's dynamic shared memory written by one thread and
 * read back by another (the mirrored index); *bad += the values not found. */
__global__ void fill_dynamic_kernel(int *bad, int n) {
  FSDP_DYNAMIC_SHARED(float, buf);
  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = (float)i;
  __syncthreads();
  int wrong = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) wrong += buf[n - 1 - i] != (float)(n - 1 - i);
  if (wrong) atomicAdd(bad, wrong);
}

/* 4 KiB of static shared memory beside the launch's dynamic bytes. */
__global__ void static_and_dynamic_kernel(int *p) {
  FSDP_SHARED(float, fixed, [1024]);
  FSDP_DYNAMIC_SHARED(float, buf);
  fixed[threadIdx.x] = buf[threadIdx.x] = 1.0f;
  p[threadIdx.x] = (int)fixed[threadIdx.x];
}

__global__ void noop_kernel(int *p) {
  if (p && threadIdx.x == 0 && blockIdx.x == 0) *p = 1;
}

/* One thread leaves before the barrier the others wait at. */
__global__ void divergent_barrier_kernel(int *p) {
  if (threadIdx.x == 5) return;
  __syncthreads();
  p[threadIdx.x] = 1;
}

__global__ void two_barriers_kernel(int *p) {
  if (threadIdx.x < 16)
    __syncthreads();
  else
    __syncthreads();
  p[threadIdx.x] = 1;
}

__global__ void shuffle_lane_missing_kernel(float *p) {
  if (threadIdx.x == 3) return;
  p[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

/* 48 threads: the second warp has 16 lanes, and the full mask names 16 more. */
__global__ void shuffle_partial_warp_kernel(float *p) {
  p[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

/* The out-of-bounds write is the point: the compiler may see it too. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
__global__ void shared_oob_kernel(float *out, int at) {
  FSDP_SHARED(float, small, [32]);
  small[threadIdx.x] = 1.0f;
  __syncthreads();
  if (threadIdx.x == 0) small[at] = 2.0f; /* at = 32: one past the end */
  __syncthreads();
  out[threadIdx.x] = small[threadIdx.x];
}
#pragma GCC diagnostic pop

__global__ void misaligned_kernel(float4 *out, const float *in) {
  out[0] = __ldg(reinterpret_cast<const float4 *>(in + 1));
}

__global__ void write_kernel(int *buf, int n, int value) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = value;
}

__global__ void copy_kernel(int *out, const int *in, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = in[i];
}

/* A shared variable aligned as its type asks (32 bytes here). */
struct alignas(32) wide_tile {
  float x[8];
};
__global__ void shared_align_kernel(int *misaligned) {
  FSDP_SHARED(char, pad, [3]);
  FSDP_SHARED(wide_tile, tile, [2]);
  pad[threadIdx.x % 3] = 0;
  if (reinterpret_cast<uintptr_t>(&tile[0]) % 32) *misaligned = 1;
}

/* ---- the PTX model (cudasim_ptx.h) ----
 * The fragment layouts written out here from the PTX ISA's tables, apart from
 * the model's own code: lane l, g = l / 4, t = l % 4. */
namespace ptx = fsdp_sim::ptx;

/* A (16 x 16) register i of lane l: element (row, col) of its low half. */
__device__ static void a_at(int l, int i, int *row, int *col) {
  *row = l / 4 + (i % 2) * 8, *col = (l % 4) * 2 + (i / 2) * 8;
}

/* d = a b + c: A (16 x 16) and B (16 x 8) from row-major bf16 bits, C and D
 * (16 x 8) row-major floats; each lane builds its registers from the layout. */
__global__ void ptx_mma_kernel(float *d, const uint16_t *a, const uint16_t *b, const float *c) {
  const int l = threadIdx.x, g = l / 4, t = l % 4;
  uint32_t ra[4], rb[2];
  float rc[4], rd[4];
  for (int i = 0; i < 4; ++i) {
    int row, col;
    a_at(l, i, &row, &col);
    ra[i] = a[row * 16 + col] | (uint32_t)a[row * 16 + col + 1] << 16;
  }
  for (int i = 0; i < 2; ++i) { /* B (k, n): k = 2t + 8i (+1), n = g */
    const int k = 2 * t + 8 * i;
    rb[i] = b[k * 8 + g] | (uint32_t)b[(k + 1) * 8 + g] << 16;
  }
  for (int i = 0; i < 4; ++i) rc[i] = c[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
  ptx::mma_m16n8k16_bf16(rd, ra, rb, rc, __FILE__, __LINE__);
  for (int i = 0; i < 4; ++i) d[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = rd[i];
}

/* ldmatrix x4 of a 16 x 16 tile (shared, rows 24 elements apart) in A's
 * order (lane l points at row l % 16, column 8 (l / 16)), plain or .trans;
 * each lane's 4 registers out. */
__global__ void ptx_ldmatrix_kernel(uint32_t *out, const uint16_t *x, int trans) {
  FSDP_SHARED(uint16_t, tile, [16][24]);
  const int l = threadIdx.x;
  for (int i = l; i < 16 * 24; i += 32) tile[i / 24][i % 24] = x[i];
  __syncwarp();
  uint32_t r[4];
  ptx::ldmatrix_x4(r, &tile[l % 16][(l / 16) * 8], trans != 0, __FILE__, __LINE__);
  for (int i = 0; i < 4; ++i) out[l * 4 + i] = r[i];
}

__global__ void ptx_ldmatrix_misaligned_kernel(int *p) {
  FSDP_SHARED(uint16_t, tile, [16][24]);
  (void)p;
  uint32_t r[4];
  ptx::ldmatrix_x4(r, &tile[threadIdx.x % 16][1], false, __FILE__, __LINE__);
}

/* cp.async of 16 bytes and of none (zeros), of 4 bytes and of none, then
 * misaligned ones. */
__global__ void ptx_cp_async_kernel(uint32_t *out, const uint32_t *in) {
  FSDP_SHARED(uint32_t, buf, [12]);
  if (threadIdx.x == 0) {
    buf[10] = buf[11] = 7; /* past the 4-byte copies: left as written */
    ptx::cp_async16(&buf[0], in, 16, __FILE__, __LINE__);
  }
  if (threadIdx.x == 1) ptx::cp_async16(&buf[4], in, 0, __FILE__, __LINE__);
  if (threadIdx.x == 2) ptx::cp_async4(&buf[8], &in[2], 4, __FILE__, __LINE__);
  if (threadIdx.x == 3) ptx::cp_async4(&buf[9], &in[2], 0, __FILE__, __LINE__);
  __syncthreads();
  out[threadIdx.x] = buf[threadIdx.x];
}

__global__ void ptx_cp_async_misaligned_kernel(int *p) {
  FSDP_SHARED(uint32_t, buf, [8]);
  ptx::cp_async16(&buf[1], p, 16, __FILE__, __LINE__);
}

__global__ void ptx_cp_async4_misaligned_kernel(int *p) {
  FSDP_SHARED(uint32_t, buf, [8]);
  ptx::cp_async4(reinterpret_cast<char *>(&buf[1]) + 2, p, 4, __FILE__, __LINE__);
}

/* ---- helpers ---- */

template <typename T> static T *dev(size_t n) {
  void *p = nullptr;
  CHECK(cudaMalloc(&p, n * sizeof(T)) == cudaSuccess, "cudaMalloc");
  return static_cast<T *>(p);
}

template <typename T> static std::vector<T> back(const T *d, size_t n) {
  std::vector<T> h(n);
  CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess, "copy");
  return h;
}

static int next_device = 1; /* device 0 stays clean for the passing cases */
static void fresh_device() {
  cudaSetDevice(next_device++);
  cudaGetLastError(); /* the previous case's error, read */
}

/* ---- what the simulator computes ---- */

static void test_barrier_and_shared() {
  std::vector<int> h(512);
  for (int i = 0; i < 512; ++i) h[i] = i;
  int *in = dev<int>(512), *out = dev<int>(512);
  cudaMemcpy(in, h.data(), 512 * sizeof(int), cudaMemcpyHostToDevice);
  FSDP_LAUNCH(reverse_kernel, 2, 256, 0, nullptr, out, in);
  CHECK(cudaGetLastError() == cudaSuccess, "launch");
  std::vector<int> r = back(out, 512);
  int bad = 0;
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 256; ++t) bad += r[b * 256 + t] != b * 256 + 255 - t;
  CHECK(bad == 0, "%d elements not reversed through shared memory", bad);
  cudaFree(in), cudaFree(out);
}

static void test_warp_ops() {
  int *sum = dev<int>(64), *up = dev<int>(64), *down = dev<int>(64), *aa = dev<int>(64);
  unsigned *ballot = dev<unsigned>(64);
  FSDP_LAUNCH(warp_kernel, 1, 64, 0, nullptr, sum, up, down, ballot, aa);
  std::vector<int> s = back(sum, 64), u = back(up, 64), d = back(down, 64), a = back(aa, 64);
  std::vector<unsigned> b = back(ballot, 64);
  unsigned want_ballot = 0;
  for (int l = 0; l < 32; l += 3) want_ballot |= 1u << l;
  for (int t = 0; t < 64; ++t) {
    const int lane = t & 31;
    CHECK(s[t] == 528, "thread %d: xor-shuffle sum %d, not 528", t, s[t]);
    CHECK(u[t] == (lane ? lane - 1 : 0), "thread %d: shfl_up gave %d", t, u[t]);
    CHECK(d[t] == ((lane & 7) + 4 < 8 ? lane + 4 : lane), "thread %d: shfl_down width 8 gave %d",
           t, d[t]);
    CHECK(b[t] == want_ballot, "thread %d: ballot 0x%08x", t, b[t]);
    CHECK(a[t] == 3, "thread %d: any/all gave %d", t, a[t]);
  }
  cudaFree(sum), cudaFree(up), cudaFree(down), cudaFree(aa), cudaFree(ballot);
}

static void test_atomics_dynamic_shared() {
  float *acc = dev<float>(1);
  unsigned *count = dev<unsigned>(1);
  cudaMemset(acc, 0, 4);
  cudaMemset(count, 0, 4);
  FSDP_LAUNCH(atomic_kernel, 100, 128, 0, nullptr, acc, count);
  CHECK(back(acc, 1)[0] == 6400.0f, "atomicAdd float: %g", back(acc, 1)[0]);
  CHECK(back(count, 1)[0] == 12800u, "atomicAdd unsigned: %u", back(count, 1)[0]);
  float *out = dev<float>(1);
  FSDP_LAUNCH(dynamic_kernel, 1, 64, 1000 * sizeof(float), nullptr, out, 1000);
  CHECK(back(out, 1)[0] == 499500.0f, "dynamic shared sum %g", back(out, 1)[0]);
  cudaFree(acc), cudaFree(count), cudaFree(out);
}

static void test_memory() {
  size_t free0, total;
  CHECK(cudaMemGetInfo(&free0, &total) == cudaSuccess, "cudaMemGetInfo");
  unsigned char *p = dev<unsigned char>(1000);
  size_t free1;
  cudaMemGetInfo(&free1, &total);
  CHECK(free0 - free1 == 1000, "1000 bytes allocated, %zu accounted", free0 - free1);
  std::vector<unsigned char> h = back(p, 1000);
  CHECK(h[0] == 0xff && h[999] == 0xff, "fresh device memory is not 0xff-filled");
  cudaPointerAttributes a;
  CHECK(cudaPointerGetAttributes(&a, p + 10) == cudaSuccess && a.type == cudaMemoryTypeDevice,
         "device pointer not recognised");
  int x;
  CHECK(cudaPointerGetAttributes(&a, &x) == cudaSuccess && a.type == cudaMemoryTypeUnregistered,
         "host pointer not unregistered");
  capture c;
  c.begin();
  const cudaError_t e = cudaMemcpy(p + 900, &x, 200, cudaMemcpyHostToDevice);
  std::string msg = c.end();
  CHECK(e == cudaErrorInvalidValue && has(msg, "past its allocation"),
         "a copy past the allocation: %s", cudaGetErrorName(e));
  cudaGetLastError();
  void *big = nullptr;
  CHECK(cudaMalloc(&big, total) == cudaErrorMemoryAllocation, "more than the device holds");
  cudaGetLastError();
  cudaFree(p);
}

static void test_events() {
  cudaStream_t s;
  cudaEvent_t a, b;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  CHECK(cudaEventQuery(a) == cudaSuccess, "a never-recorded event is complete");
  cudaEventRecord(a, s);
  FSDP_LAUNCH(noop_kernel, 1000, 256, 0, s, (int *)nullptr);
  cudaEventRecord(b, s);
  CHECK(cudaEventSynchronize(b) == cudaSuccess, "cudaEventSynchronize");
  float ms = -1;
  CHECK(cudaEventElapsedTime(&ms, a, b) == cudaSuccess && ms >= 0, "elapsed %g", ms);
  cudaEvent_t nt;
  cudaEventCreateWithFlags(&nt, cudaEventDisableTiming);
  cudaEventRecord(nt, s);
  cudaStreamSynchronize(s);
  capture c;
  c.begin();
  const cudaError_t e = cudaEventElapsedTime(&ms, a, nt);
  c.end();
  CHECK(e == cudaErrorInvalidResourceHandle, "timing a DisableTiming event: %s",
         cudaGetErrorName(e));
  cudaGetLastError();
  cudaEventDestroy(a), cudaEventDestroy(b), cudaEventDestroy(nt);
  cudaStreamDestroy(s);
}

/* ---- streams: a missing wait is a real race ---- */

struct gate {
  std::atomic<int> open{0};
};
static void wait_gate(void *g) {
  while (!static_cast<gate *>(g)->open.load()) usleep(100);
}

/* Stream a writes 7s after a gate the host opens last; stream b copies the
 * buffer. With cudaStreamWaitEvent b sees the 7s; without it b runs first and
 * sees the old 1s: the simulator's streams do not order what the code does
 * not order. */
static void race_case(bool with_wait, std::vector<int> *seen) {
  const int n = 4096;
  cudaStream_t a, b;
  cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
  int *buf = dev<int>(n), *out = dev<int>(n);
  FSDP_LAUNCH(write_kernel, 1, 256, 0, nullptr, buf, n, 1);
  cudaDeviceSynchronize();
  gate g;
  cudaEvent_t written;
  cudaEventCreateWithFlags(&written, cudaEventDisableTiming);
  cudaLaunchHostFunc(a, wait_gate, &g);
  FSDP_LAUNCH(write_kernel, 1, 256, 0, a, buf, n, 7);
  cudaEventRecord(written, a);
  if (with_wait) cudaStreamWaitEvent(b, written, 0);
  FSDP_LAUNCH(copy_kernel, 1, 256, 0, b, out, buf, n);
  if (!with_wait) cudaStreamSynchronize(b); /* b is done before a may start */
  g.open = 1;
  cudaDeviceSynchronize();
  *seen = back(out, n);
  cudaEventDestroy(written);
  cudaStreamDestroy(a), cudaStreamDestroy(b);
  cudaFree(buf), cudaFree(out);
}

static void test_stream_race() {
  std::vector<int> seen;
  race_case(true, &seen);
  CHECK(seen[0] == 7 && seen[4095] == 7, "with the wait b saw %d", seen[0]);
  race_case(false, &seen);
  CHECK(seen[0] == 1 && seen[4095] == 1,
         "without cudaStreamWaitEvent b saw %d: the streams were ordered anyway", seen[0]);
}

static std::atomic<int> host_fn_result{-1};
static void host_fn_calls_cuda(void *) {
  void *p = nullptr;
  host_fn_result = cudaMalloc(&p, 16);
}

static void test_host_function_rules() {
  capture c;
  c.begin();
  cudaLaunchHostFunc(nullptr, host_fn_calls_cuda, nullptr);
  cudaDeviceSynchronize();
  std::string msg = c.end();
  CHECK(host_fn_result == cudaErrorNotPermitted && has(msg, "inside a host function"),
         "cudaMalloc in a host function gave %d", host_fn_result.load());
}

/* ---- what the simulator refuses ---- */

static void expect_refused(dim3 grid, dim3 block, size_t shmem, const char *why) {
  capture c;
  c.begin();
  FSDP_LAUNCH(noop_kernel, grid, block, shmem, nullptr, (int *)nullptr);
  const cudaError_t e = cudaGetLastError();
  std::string msg = c.end();
  CHECK(e == cudaErrorInvalidConfiguration, "grid (%u,%u,%u) block (%u,%u,%u): %s", grid.x,
         grid.y, grid.z, block.x, block.y, block.z, cudaGetErrorName(e));
  CHECK(has(msg, "noop_kernel") && has(msg, why), "the refusal says: %s", msg.c_str());
  CHECK(cudaGetLastError() == cudaSuccess, "a refused launch is not sticky");
}

static void test_launch_limits() {
  expect_refused(1, 1025, 0, "1025 threads per block");
  expect_refused(1, dim3(1, 1, 65), 0, "block dimensions past");
  expect_refused(dim3(1, 65536), 32, 0, "grid dimensions past");
  expect_refused(0, 32, 0, "is 0");
  FSDP_LAUNCH(noop_kernel, dim3(2, 65535, 1), dim3(1024, 1, 1), 48 * 1024, nullptr, (int *)nullptr);
  CHECK(cudaGetLastError() == cudaSuccess, "the largest legal launch is refused");
}

/* Dynamic shared memory past 48 KiB needs the opt-in, per kernel and device,
 * up to 227 KiB; a launch past the kernel's limit is an invalid value (as
 * CUDA says: cupy/cupy#2118, NVIDIA/numba-cuda-mlir#143), not sticky. */
static cudaError_t launch_fill(size_t bytes, int *bad, std::string *msg) {
  capture c;
  c.begin();
  FSDP_LAUNCH(fill_dynamic_kernel, 2, 256, bytes, nullptr, bad, (int)(bytes / sizeof(float)));
  const cudaError_t e = cudaGetLastError();
  *msg = c.end();
  return e;
}

static void test_dynamic_shared_optin() {
  int optin = 0, plain = 0;
  CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0) ==
            cudaSuccess && optin == 232448, "the opt-in maximum is %d, not 232448", optin);
  CHECK(cudaDeviceGetAttribute(&plain, cudaDevAttrMaxSharedMemoryPerBlock, 0) == cudaSuccess &&
            plain == 49152, "shared memory per block without the opt-in is %d", plain);
  int per_sm = 0, reserved = 0;
  CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0) ==
            cudaSuccess && per_sm == 233472, "shared memory per SM is %d, not 233472", per_sm);
  CHECK(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, 0) ==
            cudaSuccess && reserved == 1024, "the reservation per block is %d, not 1024", reserved);
  int *bad = dev<int>(1);
  const size_t kib64 = 64 * 1024;
  std::string msg;
  cudaError_t e = launch_fill(kib64, bad, &msg);
  CHECK(e == cudaErrorInvalidValue, "64 KiB without the opt-in: %s", cudaGetErrorName(e));
  CHECK(has(msg, "fill_dynamic_kernel") && has(msg, "cudaFuncAttributeMaxDynamicSharedMemorySize"),
        "the refusal says: %s", msg.c_str());
  CHECK(cudaGetLastError() == cudaSuccess, "a refused launch is not sticky");
  for (size_t bytes : {kib64, (size_t)optin}) {
    e = cudaFuncSetAttribute(fill_dynamic_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)bytes);
    CHECK(e == cudaSuccess, "opting in to %zu bytes: %s", bytes, cudaGetErrorName(e));
    cudaMemset(bad, 0, sizeof(int));
    e = launch_fill(bytes, bad, &msg);
    CHECK(e == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess,
          "%zu bytes with the opt-in: %s", bytes, cudaGetErrorName(e));
    CHECK(back(bad, 1)[0] == 0, "%d of %zu shared floats read back wrong", back(bad, 1)[0],
          bytes / sizeof(float));
  }
  e = launch_fill((size_t)optin + 16, bad, &msg);
  CHECK(e == cudaErrorInvalidValue, "past the opted-in limit: %s", cudaGetErrorName(e));
  /* The opt-in is the device's: another one still has 48 KiB for the kernel. */
  fresh_device();
  e = launch_fill(kib64, bad, &msg);
  CHECK(e == cudaErrorInvalidValue && has(msg, "limit of 49152"),
        "64 KiB on a device without the opt-in: %s", cudaGetErrorName(e));
  cudaSetDevice(0);
  capture c;
  c.begin();
  e = cudaFuncSetAttribute(fill_dynamic_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           optin + 1);
  msg = c.end();
  CHECK(e == cudaErrorInvalidValue && has(msg, "232449") && has(msg, "232448"),
        "an opt-in past the maximum: %s: %s", cudaGetErrorName(e), msg.c_str());
  CHECK(cudaGetLastError() == cudaErrorInvalidValue && cudaGetLastError() == cudaSuccess,
        "the refused opt-in is the last error, once");
  e = launch_fill((size_t)optin, bad, &msg);
  CHECK(e == cudaSuccess, "the refused opt-in changed the limit: %s", cudaGetErrorName(e));
  CHECK(cudaFuncSetAttribute(nullptr, cudaFuncAttributeMaxDynamicSharedMemorySize, 1024) ==
            cudaErrorInvalidDeviceFunction, "a NULL kernel");
  cudaGetLastError();
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "device 0 after the opt-in tests");
  cudaFree(bad);
}

/* A fault inside a kernel: the launch succeeds (cudaGetLastError may
 * already return the sticky err when the kernel faulted before it is asked,
 * as on a GPU), the next synchronising call returns err, and stderr names the
 * kernel, thread and reason. */
static void expect_fault(void (*launch)(int *), cudaError_t err, const char *kernel,
                         const char *what) {
  fresh_device();
  int *p = dev<int>(1024);
  capture c;
  c.begin();
  launch(p);
  const cudaError_t launched = cudaGetLastError();
  const cudaError_t e = cudaDeviceSynchronize();
  std::string msg = c.end();
  CHECK(launched == cudaSuccess || launched == err, "%s: the launch itself failed: %s", kernel,
        cudaGetErrorName(launched));
  CHECK(e == err, "%s: synchronize gave %s, not %s", kernel, cudaGetErrorName(e),
         cudaGetErrorName(err));
  CHECK(has(msg, kernel) && has(msg, what), "%s: the report lacks '%s': %s", kernel, what,
         msg.c_str());
  void *q = nullptr;
  CHECK(cudaMalloc(&q, 16) == err, "%s: the fault is not sticky", kernel);
  CHECK(cudaFree(p) == err, "%s: cudaFree after the fault", kernel);
}

static void test_faults() {
  expect_fault([](int *p) { FSDP_LAUNCH(divergent_barrier_kernel, 1, 64, 0, nullptr, p); },
               cudaErrorIllegalInstruction, "divergent_barrier_kernel", "thread (5,0,0) exited");
  expect_fault([](int *p) { FSDP_LAUNCH(two_barriers_kernel, 1, 64, 0, nullptr, p); },
               cudaErrorIllegalInstruction, "two_barriers_kernel", "threads must reach the same");
  expect_fault([](int *p) { FSDP_LAUNCH(shuffle_lane_missing_kernel, 1, 32, 0, nullptr, (float *)p); },
               cudaErrorIllegalInstruction, "shuffle_lane_missing_kernel",
               "lane 3, thread (3,0,0), exited");
  expect_fault([](int *p) { FSDP_LAUNCH(shuffle_partial_warp_kernel, 1, 48, 0, nullptr, (float *)p); },
               cudaErrorIllegalInstruction, "shuffle_partial_warp_kernel", "past the block's 48");
  expect_fault([](int *p) { FSDP_LAUNCH(misaligned_kernel, 1, 1, 0, nullptr, (float4 *)p, (float *)p); },
               cudaErrorMisalignedAddress, "misaligned_kernel", "misaligned __ldg");
  expect_fault([](int *p) { FSDP_LAUNCH(static_and_dynamic_kernel, 1, 32, 48 * 1024, nullptr, p); },
               cudaErrorInvalidValue, "static_and_dynamic_kernel", "without the cudaFuncSetAttribute");
  expect_fault([](int *p) {
                 cudaFuncSetAttribute(static_and_dynamic_kernel,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024);
                 FSDP_LAUNCH(static_and_dynamic_kernel, 1, 32, 227 * 1024, nullptr, p);
               },
               cudaErrorInvalidValue, "static_and_dynamic_kernel", "past the 232448");
  /* Device 0 is untouched by all of these. */
  cudaSetDevice(0);
  void *q = nullptr;
  CHECK(cudaMalloc(&q, 16) == cudaSuccess, "a fault on another device reached device 0");
  cudaFree(q);
}

/* ---- shared memory alignment ---- */

static void test_shared_alignment() {
  int *flag = dev<int>(1);
  cudaMemset(flag, 0, 4);
  FSDP_LAUNCH(shared_align_kernel, 1, 32, 0, nullptr, flag);
  CHECK(back(flag, 1)[0] == 0, "an alignas(32) shared variable is not 32-byte aligned");
  cudaFree(flag);
}

/* ---- the PTX model ---- */

/* mma.m16n8k16 against a scalar product, bit for bit (values k / 8, small:
 * every product and sum exact in fp32), on operands whose every element
 * differs, so a transposed or shifted fragment shows; then random values
 * against a double product to fp32 rounding. */
static float bf16_float(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static void ptx_mma_case(bool exact) {
  std::vector<uint16_t> ha(256), hb(128);
  std::vector<float> A(256), Bm(128), hc(128);
  unsigned rng = 12345;
  auto next = [&]() { return (rng = rng * 1664525u + 1013904223u) >> 8; };
  for (int i = 0; i < 256; ++i) {
    A[i] = exact ? (float)((int)(i * 37 % 23) - 11) / 8 : (float)(next() % 2001) / 1000.0f - 1.0f;
    ha[i] = bf16_of(A[i]), A[i] = bf16_float(ha[i]);
  }
  for (int i = 0; i < 128; ++i) {
    Bm[i] = exact ? (float)((int)(i * 29 % 19) - 9) / 8 : (float)(next() % 2001) / 1000.0f - 1.0f;
    hb[i] = bf16_of(Bm[i]), Bm[i] = bf16_float(hb[i]);
    hc[i] = exact ? (float)(i % 13) / 4 : (float)(next() % 2001) / 1000.0f - 1.0f;
  }
  uint16_t *a = dev<uint16_t>(256), *b = dev<uint16_t>(128);
  float *c = dev<float>(128), *d = dev<float>(128);
  cudaMemcpy(a, ha.data(), 512, cudaMemcpyHostToDevice);
  cudaMemcpy(b, hb.data(), 256, cudaMemcpyHostToDevice);
  cudaMemcpy(c, hc.data(), 512, cudaMemcpyHostToDevice);
  FSDP_LAUNCH(ptx_mma_kernel, 1, 32, 0, nullptr, d, a, b, c);
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "ptx_mma_kernel");
  std::vector<float> got = back(d, 128);
  int wrong = 0;
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      double want = hc[i * 8 + j], mag = fabs(want);
      for (int k = 0; k < 16; ++k) {
        const double ab = (double)A[i * 16 + k] * Bm[k * 8 + j];
        want += ab, mag += fabs(ab);
      }
      const double e = fabs(got[i * 8 + j] - want);
      wrong += exact ? got[i * 8 + j] != (float)want : !(e <= 16 * 0x1p-24 * mag);
    }
  CHECK(wrong == 0, "mma.m16n8k16 (%s values): %d of 128 elements wrong",
        exact ? "exact" : "random", wrong);
  cudaFree(a), cudaFree(b), cudaFree(c), cudaFree(d);
}

/* Each lane's ldmatrix registers against the layout: plain, A's fragment
 * a[i] of the tile; .trans, that of the tile's transpose. */
static void ptx_ldmatrix_case(bool trans) {
  std::vector<uint16_t> hx(16 * 24, 0xffff);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) hx[r * 24 + c] = (uint16_t)(r * 16 + c);
  uint16_t *x = dev<uint16_t>(hx.size());
  uint32_t *out = dev<uint32_t>(128);
  cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice);
  FSDP_LAUNCH(ptx_ldmatrix_kernel, 1, 32, 0, nullptr, out, x, trans ? 1 : 0);
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "ptx_ldmatrix_kernel");
  std::vector<uint32_t> got = back(out, 128);
  int wrong = 0;
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < 4; ++i) {
      /* matrix i is the 8 x 8 block at (8 (i % 2), 8 (i / 2)); register i
       * holds its (g, 2t..2t+1), or with .trans its (2t..2t+1, g) */
      const int r0 = 8 * (i % 2), c0 = 8 * (i / 2);
      const int lo = trans ? (r0 + 2 * t) * 16 + c0 + g : (r0 + g) * 16 + c0 + 2 * t;
      const int hi = trans ? lo + 16 : lo + 1;
      wrong += got[l * 4 + i] != ((uint32_t)lo | (uint32_t)hi << 16);
    }
  }
  CHECK(wrong == 0, "ldmatrix.x4%s: %d of 128 registers wrong", trans ? ".trans" : "", wrong);
  cudaFree(x), cudaFree(out);
}

static void test_ptx() {
  ptx_mma_case(true);
  ptx_mma_case(false);
  ptx_ldmatrix_case(false);
  ptx_ldmatrix_case(true);
  std::vector<uint32_t> hin = {1, 2, 3, 4};
  uint32_t *in = dev<uint32_t>(4), *out = dev<uint32_t>(12);
  cudaMemcpy(in, hin.data(), 16, cudaMemcpyHostToDevice);
  FSDP_LAUNCH(ptx_cp_async_kernel, 1, 12, 0, nullptr, out, in);
  std::vector<uint32_t> got = back(out, 12);
  CHECK(got[0] == 1 && got[3] == 4 && got[4] == 0 && got[7] == 0,
        "cp.async: copied %u..%u, zero-filled %u..%u", got[0], got[3], got[4], got[7]);
  CHECK(got[8] == 3 && got[9] == 0 && got[10] == 7 && got[11] == 7,
        "cp.async of 4 bytes: copied %u (3 expected), zero-filled %u, neighbours %u %u (7)",
        got[8], got[9], got[10], got[11]);
  cudaFree(in), cudaFree(out);
  expect_fault([](int *p) { FSDP_LAUNCH(ptx_ldmatrix_misaligned_kernel, 1, 32, 0, nullptr, p); },
               cudaErrorMisalignedAddress, "ptx_ldmatrix_misaligned_kernel",
               "must be 16-byte aligned");
  expect_fault([](int *p) { FSDP_LAUNCH(ptx_cp_async_misaligned_kernel, 1, 32, 0, nullptr, p); },
               cudaErrorMisalignedAddress, "ptx_cp_async_misaligned_kernel",
               "both must be 16-byte aligned");
  expect_fault([](int *p) { FSDP_LAUNCH(ptx_cp_async4_misaligned_kernel, 1, 32, 0, nullptr, p); },
               cudaErrorMisalignedAddress, "ptx_cp_async4_misaligned_kernel",
               "both must be 4-byte aligned");
}

/* ---- children: cases that end the process ---- */

static int child_shared_oob() {
  float *out = dev<float>(32);
  FSDP_LAUNCH(shared_oob_kernel, 1, 32, 0, nullptr, out, 32);
  const cudaError_t e = cudaDeviceSynchronize();
  printf("child: synchronize gave %s\n", cudaGetErrorName(e));
  return e == cudaSuccess ? 0 : 3;
}

/* write_kernel over n + 1 ints of an allocation of n: one past its end. */
static int child_device_oob() {
  const int n = 1000;
  int *buf = dev<int>(n);
  FSDP_LAUNCH(write_kernel, 1, 256, 0, nullptr, buf, n + 1, 7);
  cudaDeviceSynchronize();
  const cudaError_t e = cudaFree(buf);
  printf("child: cudaFree gave %s\n", cudaGetErrorName(e));
  return 0;
}

static int child_driver() {
  int n = -1;
  const cudaError_t e = cudaGetDeviceCount(&n);
  fprintf(stderr, "child: cudaGetDeviceCount: %s (%s)\n", cudaGetErrorName(e),
          cudaGetErrorString(e));
  return e == cudaErrorInsufficientDriver ? 3 : 0;
}

/* Without the wait, two streams touch one buffer: ThreadSanitizer's report. */
static int child_tsan_race() {
  const int n = 1 << 16;
  cudaStream_t a, b;
  cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
  int *buf = dev<int>(n), *out = dev<int>(n);
  cudaDeviceSynchronize();
  FSDP_LAUNCH(write_kernel, 4, 256, 0, a, buf, n, 7);
  FSDP_LAUNCH(copy_kernel, 4, 256, 0, b, out, buf, n);
  cudaDeviceSynchronize();
  return 0;
}

/* Runs this program with --child name (and env) and returns its exit status
 * and output. */
static int run_child(const char *name, const char *env, std::string *out) {
  char path[] = "/tmp/cudasim-child-XXXXXX";
  const int fd = mkstemp(path);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fd, 1);
  posix_spawn_file_actions_adddup2(&fa, fd, 2);
  std::vector<char *> envp;
  for (char **e = environ; *e; ++e) envp.push_back(*e);
  std::string extra = env ? env : "";
  if (env) envp.push_back(&extra[0]);
  envp.push_back(nullptr);
  char *argv[] = {&self[0], (char *)"--child", (char *)name, nullptr};
  pid_t pid;
  int status = -1;
  if (posix_spawn(&pid, self.c_str(), &fa, nullptr, argv, envp.data()) == 0)
    waitpid(pid, &status, 0);
  posix_spawn_file_actions_destroy(&fa);
  out->clear();
  lseek(fd, 0, SEEK_SET);
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) out->append(buf, (size_t)n);
  close(fd);
  unlink(path);
  fprintf(stderr, "--- child %s:\n%s---\n", name, out->c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void test_children() {
  std::string out;
  int rc = run_child("shared_oob", nullptr, &out);
  /* UBSan (bounds) or ASan stop the child at the write; without them the
   * canary is reported at the next barrier. */
  CHECK(rc != 0 && (has(out, "heap-buffer-overflow") || has(out, "out of bounds for type") ||
                     (has(out, "out-of-bounds write to shared memory") && has(out, "'small'"))),
         "an out-of-bounds shared write went unseen (exit %d)", rc);
  rc = run_child("device_oob", nullptr, &out);
  /* ASan stops the child at the write; without it the guard zone after the
   * allocation shows it when cudaFree releases it. */
  CHECK(rc != 0 && (has(out, "heap-buffer-overflow") ||
                     (has(out, "out-of-bounds write to device memory") &&
                      has(out, "4000 bytes") && has(out, "offset 4000, past the end"))),
         "an out-of-bounds device write went unseen (exit %d)", rc);
  rc = run_child("driver", "FSDP_SIM_DRIVER=old", &out);
  CHECK(rc == 3 && has(out, "insufficient"), "an old driver was not reported (exit %d)", rc);
#if defined(__SANITIZE_THREAD__)
  rc = run_child("tsan_race", nullptr, &out);
  CHECK(rc != 0 && has(out, "data race"), "TSan did not see the unordered streams (exit %d)", rc);
#endif
}

int main(int argc, char **argv) {
  setenv("FSDP_SIM_DEVICES", "32", 1);
  self = argv[0];
  if (argc == 3 && !strcmp(argv[1], "--child")) {
    if (!strcmp(argv[2], "shared_oob")) return child_shared_oob();
    if (!strcmp(argv[2], "device_oob")) return child_device_oob();
    if (!strcmp(argv[2], "driver")) return child_driver();
    if (!strcmp(argv[2], "tsan_race")) return child_tsan_race();
    return 2;
  }
  test_barrier_and_shared();
  test_warp_ops();
  test_atomics_dynamic_shared();
  test_memory();
  test_events();
  test_stream_race();
  test_host_function_rules();
  test_launch_limits();
  test_dynamic_shared_optin();
  test_faults();
  test_shared_alignment();
  test_ptx();
  test_children();
  printf("test_sim: %d checks, %d failed\n", checks, failures);
  return failures ? 1 : 0;
}
