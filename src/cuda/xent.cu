/* src/cuda/xent.cu — softmax cross-entropy fused with its gradient, one block
 * per row (fp32 and bf16 logits): the row max, the exponential sum in double
 * as on the CPU, the loss in double (kept in double), and the gradient written
 * over the logits in the same kernel (GPT-2's head, rows ld apart). The
 * row's three reads come from L2 after the first (a 50304-wide bf16 row is
 * 98 KiB): HBM sees one read and one write. */
#include "cuda/cuda_internal.cuh"

#define XENT_BLOCK 512

/* dlogits may be logits (in place): nothing is read through the read-only
 * cache, and the target logit is read before the barrier that precedes the
 * writes. Rows are ld apart in both. */
template <typename T>
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
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, load(x + j));
    mx = block_max(mx, fshared);
    double sum = 0.0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) sum += expf(load(x + j) - mx);
    sum = block_sum(sum, dshared);
    if (losses && threadIdx.x == 0)
      losses[row] = (double)mx + log(sum) - (double)load(x + target);
    __syncthreads(); /* the target logit is read before it is overwritten */
    if (d) {
      const float k = (float)(scale / sum);
      for (int j = threadIdx.x; j < V; j += blockDim.x) {
        /* The CPU rounds e * k to float before subtracting scale at the
         * target; __fmul_rn keeps nvcc from fusing the two into one fma. */
        const float p = __fmul_rn(expf(load(x + j) - mx), k);
        store(d + j, j == target ? p - scale : p);
      }
    }
  }
}

template <typename T>
static fsdp_status_t xent(T *dlogits, double *losses, const T *logits, const int *targets, int B,
                          int V, int ld, float scale, cudaStream_t s) {
  if (B <= 0 || V <= 0) return FSDP_SUCCESS;
  FSDP_LAUNCH(xent_kernel, fsdp_grid((size_t)B, 1), XENT_BLOCK, 0, s, dlogits, losses, logits,
              targets, B, V, ld, scale);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_cuda_xent(fsdp_dtype_t dt, void *logits, int ld, double *losses,
                             const int *targets, int B, int V, float scale, int grad,
                             fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("xent", dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    return xent(grad ? as<S>(logits) : nullptr, losses, as<S>(logits), targets, B, V, ld, scale,
                s);
  });
}
