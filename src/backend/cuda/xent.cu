/* src/backend/cuda/xent.cu — softmax cross-entropy fused with its gradient, one
 * 512-thread block per row (fp32 and bf16 logits, rows ld apart: GPT-2's
 * head): the row max and the exponential sum in one pass (online softmax, the
 * sum in double as on the CPU), the loss in double, then the gradient written
 * over the logits (16-byte packs, a scalar tail past the last whole pack).
 *
 * Where the gradient pass reads the row: a bf16 row whose gradient is written
 * is staged. The block copies it into dynamic shared memory (cp.async, every
 * 16-byte pack of its row in flight at once where rows are whole packs; 2-byte
 * copies otherwise), and both passes read it there, so HBM sees each element
 * read once and written once. A row is staged only where two blocks fit an SM
 * (__launch_bounds__ holds the registers to 32, four 512-thread blocks an SM,
 * as the unstaged rows run): GPT-2's row is 98 KiB, two fit an sm_90 SM's
 * 228 KiB. Every other row (fp32 logits, a bf16 row past half an SM's shared
 * memory such as Llama-3's 128256) is read from global memory by both passes;
 * at GPT-2's width 4 blocks per SM x 132 SMs keep about 53 MB of rows in
 * flight, past an H200's 50 MB L2, so the second read probably reaches HBM
 * too. A pass without the gradient reads
 * the row once, unstaged. xent_row_bytes is the rule that picks, in one place.
 *
 * HBM bytes per GPT-2 124M step (16 x 1024 rows of 50257 bf16 logits,
 * 1.65 GB a pass; 8 B of loss a row besides): 3.29 GB read and written, plus
 * up to 1.65 GB for the second read, before staging (4.94 GB if it all
 * misses L2); 3.29 GB with it. The time is unmeasured on a GPU.
 *
 * Both paths give the same bits: each thread owns the same columns (the
 * same block size), does the same arithmetic on them in the same order, and
 * the block reductions are the same. */
#include <float.h>

#include <mutex>
#include <vector>

#include "backend/cuda/mma.cuh"

#define XENT_BLOCK 512
/* The block reductions' scratch at the front of the dynamic shared memory
 * (32 doubles, then 32 floats), then the staged row, 16-byte aligned. */
#define XENT_SCRATCH (32 * sizeof(double) + 32 * sizeof(float))

/* Calls f(j, x[j]) for every j < V of a row, reading whole packs of W
 * (x 16-byte aligned when W > 1) and the V % W left one at a time; a thread
 * sees the same columns in every call. */
template <int W, typename T, typename F>
__device__ __forceinline__ void row_scan(const T *x, int V, F f) {
  const int full = V / W * W;
  for (int j = threadIdx.x * W; j < full; j += blockDim.x * W) {
    float v[W];
    vload<W>(v, x + j);
    for (int i = 0; i < W; ++i) f(j + i, v[i]);
  }
  for (int j = full + threadIdx.x; j < V; j += blockDim.x) f(j, load(x + j));
}

/* row[0..V) = x[0..V) (bf16, row in shared memory), each thread copying the
 * columns row_scan gives it, so it can read them back once its own copies
 * have landed (cp_async_wait), with no barrier. */
template <int W>
__device__ __forceinline__ void row_stage(bf16 *row, const bf16 *x, int V) {
  const int full = V / W * W;
  for (int j = threadIdx.x * W; j < full; j += blockDim.x * W) {
    if constexpr (W > 1)
      cp_async16(row + j, x + j, true);
    else
      row[j] = x[j];
  }
  for (int j = full + threadIdx.x; j < V; j += blockDim.x) row[j] = x[j];
  cp_async_commit();
  cp_async_wait<0>();
}

/* dlogits may be logits (in place): nothing is read through the read-only
 * cache, the target logit is read before the barrier that precedes the
 * writes, and each thread writes only the columns it read. Rows are ld apart
 * in both. STAGE: the row is read once, into shared memory (bf16 only). */
template <int W, typename T, bool STAGE>
__global__ void __launch_bounds__(XENT_BLOCK, 4)
    xent_kernel(T *dlogits, double *losses, const T *logits, const int *targets, int B, int V,
                int ld, float scale) {
  FSDP_DYNAMIC_SHARED(int4, smem);
  double *dshared = reinterpret_cast<double *>(smem);
  float *fshared = reinterpret_cast<float *>(dshared + 32);
  T *row_copy = reinterpret_cast<T *>(fshared + 32);
  for (size_t row = blockIdx.x; row < (size_t)B; row += gridDim.x) {
    const T *x = logits + row * (size_t)ld;
    T *d = dlogits ? dlogits + row * (size_t)ld : nullptr;
    const int target = targets[row];
    /* Uniform across the block: every thread takes the same branch. */
    if (target < 0 || target >= V) {
      if (d)
        for (int j = threadIdx.x; j < V; j += blockDim.x) store(d + j, NAN);
      if (losses && threadIdx.x == 0) losses[row] = NAN;
      continue;
    }
    /* Where both passes read the row. */
    const T *src = x;
    if constexpr (STAGE) {
      row_stage<W>(row_copy, x, V);
      src = row_copy;
    }
    /* One pass for the max and the sum (online softmax): each thread keeps
     * its running max m and its sum relative to it, rescaled in double when
     * the max grows; the block then rescales every thread's sum to the row's
     * max. m starts at -FLT_MAX, not -inf, so that a thread whose columns are
     * all -inf (or that has none) adds exp(-inf) = 0, never exp(-inf + inf). */
    float m = -FLT_MAX;
    double part = 0.0;
    row_scan<W>(src, V, [&](int, float v) {
      if (v > m) {
        part *= exp((double)m - (double)v);
        m = v;
      }
      part += expf(v - m);
    });
    const float mx = block_max(m, fshared);
    const double sum = block_sum(part * exp((double)m - (double)mx), dshared);
    if (losses && threadIdx.x == 0)
      losses[row] = (double)mx + log(sum) - (double)load(src + target);
    /* The target logit is read before it is overwritten (in place), or before
     * the next row's copy replaces it (staged). */
    __syncthreads();
    if (!d) continue;
    /* The CPU rounds e * k to float before subtracting scale at the target;
     * __fmul_rn keeps nvcc from fusing the two into one fma. */
    const float k = (float)(scale / sum);
    const int full = V / W * W;
    for (int j = threadIdx.x * W; j < full; j += blockDim.x * W) {
      float v[W];
      vload<W>(v, src + j);
      for (int i = 0; i < W; ++i) {
        const float p = __fmul_rn(expf(v[i] - mx), k);
        v[i] = j + i == target ? p - scale : p;
      }
      vstore<W>(d + j, v);
    }
    for (int j = full + threadIdx.x; j < V; j += blockDim.x) {
      const float p = __fmul_rn(expf(load(src + j) - mx), k);
      store(d + j, j == target ? p - scale : p);
    }
  }
}

/* The rule: the bytes of a row staged in shared memory (0: both passes read
 * global memory). A bf16 row whose gradient is written is staged when it
 * fits beside the scratch within the device's budget per block. */
static size_t xent_row_bytes(fsdp_dtype_t dt, int V, int grad, int budget) {
  const size_t row = ((size_t)V * sizeof(bf16) + 15) / 16 * 16;
  return dt == FSDP_BF16 && grad && V > 0 && XENT_SCRATCH + row <= (size_t)budget ? row : 0;
}

/* The current device's budget of dynamic shared memory per block: the opt-in
 * maximum per block, or less, so that two blocks fit an SM (half its shared
 * memory less the runtime's reservation per block; one 512-thread block per
 * SM would leave it three quarters idle). The staged kernels are opted in to
 * it the first time (cudaFuncSetAttribute, once per kernel and device; a
 * launch past 48 KiB without it fails). */
static fsdp_status_t xent_device_optin(int *optin) {
  static std::mutex lock;
  static std::vector<std::pair<int, int>> devices; /* (device, opt-in bytes) */
  int device;
  CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> guard(lock);
  for (const auto &d : devices)
    if (d.first == device) {
      *optin = d.second;
      return FSDP_SUCCESS;
    }
  int bytes, per_sm, reserved;
  CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device));
  bytes = bytes < per_sm / 2 - reserved ? bytes : per_sm / 2 - reserved;
  CUDA_CHECK(cudaFuncSetAttribute(xent_kernel<pack_width<bf16>(), bf16, true>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  CUDA_CHECK(cudaFuncSetAttribute(xent_kernel<1, bf16, true>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  devices.push_back({device, bytes});
  *optin = bytes;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_cuda_xent_staged_bytes(const fsdp_xent_args_t *a, size_t *bytes) {
  int optin = 0;
  FSDP_TRY(xent_device_optin(&optin));
  *bytes = xent_row_bytes(a->dt, a->V, a->grad, optin);
  return FSDP_SUCCESS;
}

/* Packs when both buffers' rows start 16-byte aligned. */
template <int W, typename T>
static void xent_launch(size_t staged, T *dlogits, double *losses, const T *logits,
                        const int *targets, int B, int V, int ld, float scale, cudaStream_t s) {
  if constexpr (std::is_same<T, bf16>::value)
    if (staged) {
      FSDP_LAUNCH((xent_kernel<W, T, true>), fsdp_grid((size_t)B, 1), XENT_BLOCK,
                  XENT_SCRATCH + staged, s, dlogits, losses, logits, targets, B, V, ld, scale);
      return;
    }
  FSDP_LAUNCH((xent_kernel<W, T, false>), fsdp_grid((size_t)B, 1), XENT_BLOCK, XENT_SCRATCH, s,
              dlogits, losses, logits, targets, B, V, ld, scale);
}

template <typename T>
static fsdp_status_t xent(size_t staged, T *dlogits, double *losses, const T *logits,
                          const int *targets, int B, int V, int ld, float scale, cudaStream_t s) {
  constexpr int W = pack_width<T>();
  if (ld % W == 0 && aligned16(dlogits) && aligned16(logits))
    xent_launch<W>(staged, dlogits, losses, logits, targets, B, V, ld, scale, s);
  else
    xent_launch<1>(staged, dlogits, losses, logits, targets, B, V, ld, scale, s);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_cuda_xent(const fsdp_xent_args_t *a, fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("xent", a->dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    if (a->B <= 0 || a->V <= 0) return FSDP_SUCCESS;
    size_t staged;
    FSDP_TRY(fsdp_cuda_xent_staged_bytes(a, &staged));
    S *logits = as<S>(a->logits);
    return xent(staged, a->grad ? logits : nullptr, a->losses, logits, a->targets, a->B, a->V,
                a->ld, a->scale, s);
  });
}
