/* src/cuda/layernorm.cu — LayerNorm forward and backward (fp32 and bf16
 * storage). A warp owns a row: two passes (mean, then squared deviations) as on
 * the CPU, so a large mean next to a small spread does not cancel. The weight
 * and bias gradients are column sums in a fixed order: no atomics. */
#include "cuda/cuda_internal.cuh"

#define LN_EPS 1e-5f /* a float, widened to double as on the CPU */
#define LN_WARPS 8 /* rows per block */

template <typename T>
__global__ void layernorm_forward_kernel(T *out, float *mean, float *rstd, const T *inp,
                                         const T *weight, const T *bias, int N, int C) {
  const int lane = threadIdx.x & 31;
  for (size_t row = (size_t)blockIdx.x * LN_WARPS + (threadIdx.x >> 5); row < (size_t)N;
       row += (size_t)gridDim.x * LN_WARPS) {
    const T *x = inp + row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += load(x + c);
    const float m = (float)((double)warp_sum(s) / C);
    float q = 0.0f;
    for (int c = lane; c < C; c += 32) {
      const float d = load(x + c) - m;
      q += d * d;
    }
    /* The CPU's expression, in double: 1 / sqrt(var + eps) rounded once. */
    const float r = (float)(1.0 / sqrt((double)warp_sum(q) / C + LN_EPS));
    T *o = out + row * C;
    for (int c = lane; c < C; c += 32)
      store(o + c, (load(x + c) - m) * r * load(weight + c) + load(bias + c));
    if (lane == 0) {
      mean[row] = m;
      rstd[row] = r;
    }
  }
}

/* dinp += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = weight * dout. */
template <typename T>
__global__ void layernorm_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *weight,
                                      const float *mean, const float *rstd, int N, int C) {
  const int lane = threadIdx.x & 31;
  for (size_t row = (size_t)blockIdx.x * LN_WARPS + (threadIdx.x >> 5); row < (size_t)N;
       row += (size_t)gridDim.x * LN_WARPS) {
    const T *x = inp + row * C, *dy = dout + row * C;
    const float m = mean[row], r = rstd[row];
    float gs = 0.0f, gxs = 0.0f;
    for (int c = lane; c < C; c += 32) {
      const float xhat = (load(x + c) - m) * r, g = load(weight + c) * load(dy + c);
      gs += g;
      gxs += g * xhat;
    }
    const float g_mean = (float)((double)warp_sum(gs) / C);
    const float gx_mean = (float)((double)warp_sum(gxs) / C);
    T *dx = dinp + row * C;
    for (int c = lane; c < C; c += 32) {
      const float xhat = (load(x + c) - m) * r;
      store(dx + c,
            load(dx + c) + r * (load(weight + c) * load(dy + c) - g_mean - xhat * gx_mean));
    }
  }
}

/* dweight[c] += sum_rows xhat * dout; dbias[c] += sum_rows dout. A block owns
 * 32 columns and 32 row lanes; lane sums are added in lane order. */
#define LN_TILE 32
template <typename T>
__global__ void __launch_bounds__(LN_TILE * LN_TILE) layernorm_params_kernel(float *dweight, float *dbias, const T *dout,
                                        const T *inp, const float *mean, const float *rstd,
                                        int N, int C) {
  FSDP_SHARED(float, pw, [LN_TILE][LN_TILE + 1]);
  FSDP_SHARED(float, pb, [LN_TILE][LN_TILE + 1]);
  const int col = blockIdx.x * LN_TILE + threadIdx.x;
  float sw = 0.0f, sb = 0.0f;
  if (col < C)
    for (int r = threadIdx.y; r < N; r += LN_TILE) {
      const size_t i = (size_t)r * C + col;
      const float dy = load(dout + i);
      sw += (load(inp + i) - mean[r]) * rstd[r] * dy;
      sb += dy;
    }
  pw[threadIdx.y][threadIdx.x] = sw;
  pb[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y == 0 && col < C) {
    float tw = 0.0f, tb = 0.0f;
    for (int k = 0; k < LN_TILE; ++k) {
      tw += pw[k][threadIdx.x];
      tb += pb[k][threadIdx.x];
    }
    dweight[col] += tw;
    dbias[col] += tb;
  }
}

static unsigned row_blocks(int N) { return fsdp_grid((size_t)N, LN_WARPS); }

template <typename T>
static fsdp_status_t layernorm_forward(T *out, float *mean, float *rstd, const T *inp,
                                       const T *weight, const T *bias, int N, int C,
                                       cudaStream_t s) {
  if (N <= 0 || C <= 0) return FSDP_SUCCESS;
  FSDP_LAUNCH(layernorm_forward_kernel, row_blocks(N), LN_WARPS * 32, 0, s, out, mean, rstd, inp,
              weight, bias, N, C);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

template <typename T>
static fsdp_status_t layernorm_backward(T *dinp, float *dweight, float *dbias, const T *dout,
                                        const T *inp, const T *weight, const float *mean,
                                        const float *rstd, int N, int C, cudaStream_t s) {
  if (N <= 0 || C <= 0) return FSDP_SUCCESS;
  const unsigned col_blocks = (unsigned)((C + LN_TILE - 1) / LN_TILE);
  FSDP_LAUNCH(layernorm_params_kernel, col_blocks, dim3(LN_TILE, LN_TILE), 0, s, dweight, dbias,
              dout, inp, mean, rstd, N, C);
  LAUNCH_CHECK();
  if (!dinp) return FSDP_SUCCESS;
  FSDP_LAUNCH(layernorm_dinp_kernel, row_blocks(N), LN_WARPS * 32, 0, s, dinp, dout, inp, weight,
              mean, rstd, N, C);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_cuda_layernorm_forward(fsdp_dtype_t dt, void *out, float *mean, float *rstd,
                                          const void *inp, const void *weight, const void *bias,
                                          int N, int C, fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("layernorm_forward", dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    return layernorm_forward(as<S>(out), mean, rstd, as<S>(inp), as<S>(weight), as<S>(bias), N,
                             C, s);
  });
}

fsdp_status_t fsdp_cuda_layernorm_backward(fsdp_dtype_t dt, void *dinp, float *dweight,
                                           float *dbias, const void *dout, const void *inp,
                                           const void *weight, const float *mean,
                                           const float *rstd, int N, int C,
                                           fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("layernorm_backward", dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    return layernorm_backward(as<S>(dinp), dweight, dbias, as<S>(dout), as<S>(inp),
                              as<S>(weight), mean, rstd, N, C, s);
  });
}
