/* src/backend/cuda/xent.cu — softmax cross-entropy fused with its gradient, one block
 * per row (fp32 and bf16 logits): the row max and the exponential sum in one
 * read (online softmax, the sum in double as on the CPU), the loss in double
 * (kept in double), and the gradient written over the logits in a second read
 * of the row (16-byte packs, a scalar tail past the last whole pack; GPT-2's
 * head, rows ld apart). The second read mostly comes from L2 (a 50304-wide
 * bf16 row is 98 KiB): HBM sees about one read and one write. */
#include <float.h>

#include "backend/cuda/cuda_internal.cuh"

#define XENT_BLOCK 512

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

/* dlogits may be logits (in place): nothing is read through the read-only
 * cache, the target logit is read before the barrier that precedes the
 * writes, and each thread writes only the columns it read. Rows are ld apart
 * in both. */
template <int W, typename T>
__global__ void __launch_bounds__(XENT_BLOCK) xent_kernel(T *dlogits, double *losses, const T *logits, const int *targets, int B,
                            int V, int ld, float scale) {
  FSDP_SHARED(float, fshared, [32]);
  FSDP_SHARED(double, dshared, [32]);
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
    /* One pass for the max and the sum (online softmax): each thread keeps
     * its running max m and its sum relative to it, rescaled in double when
     * the max grows; the block then rescales every thread's sum to the row's
     * max. m starts at -FLT_MAX, not -inf, so that a thread whose columns are
     * all -inf (or that has none) adds exp(-inf) = 0, never exp(-inf + inf). */
    float m = -FLT_MAX;
    double part = 0.0;
    row_scan<W>(x, V, [&](int, float v) {
      if (v > m) {
        part *= exp((double)m - (double)v);
        m = v;
      }
      part += expf(v - m);
    });
    const float mx = block_max(m, fshared);
    const double sum = block_sum(part * exp((double)m - (double)mx), dshared);
    if (losses && threadIdx.x == 0)
      losses[row] = (double)mx + log(sum) - (double)load(x + target);
    __syncthreads(); /* the target logit is read before it is overwritten */
    if (!d) continue;
    /* The CPU rounds e * k to float before subtracting scale at the target;
     * __fmul_rn keeps nvcc from fusing the two into one fma. */
    const float k = (float)(scale / sum);
    const int full = V / W * W;
    for (int j = threadIdx.x * W; j < full; j += blockDim.x * W) {
      float v[W];
      vload<W>(v, x + j);
      for (int i = 0; i < W; ++i) {
        const float p = __fmul_rn(expf(v[i] - mx), k);
        v[i] = j + i == target ? p - scale : p;
      }
      vstore<W>(d + j, v);
    }
    for (int j = full + threadIdx.x; j < V; j += blockDim.x) {
      const float p = __fmul_rn(expf(load(x + j) - mx), k);
      store(d + j, j == target ? p - scale : p);
    }
  }
}

/* Packs when both buffers' rows start 16-byte aligned. */
template <typename T>
static fsdp_status_t xent(T *dlogits, double *losses, const T *logits, const int *targets, int B,
                          int V, int ld, float scale, cudaStream_t s) {
  if (B <= 0 || V <= 0) return FSDP_SUCCESS;
  constexpr int W = pack_width<T>();
  if (ld % W == 0 && aligned16(dlogits) && aligned16(logits))
    FSDP_LAUNCH((xent_kernel<W, T>), fsdp_grid((size_t)B, 1), XENT_BLOCK, 0, s, dlogits, losses,
                logits, targets, B, V, ld, scale);
  else
    FSDP_LAUNCH((xent_kernel<1, T>), fsdp_grid((size_t)B, 1), XENT_BLOCK, 0, s, dlogits, losses,
                logits, targets, B, V, ld, scale);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_cuda_xent(const fsdp_xent_args_t *a, fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("xent", a->dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    S *logits = as<S>(a->logits);
    return xent(a->grad ? logits : nullptr, a->losses, logits, a->targets, a->B, a->V, a->ld,
                a->scale, s);
  });
}
