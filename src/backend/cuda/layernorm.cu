/* src/backend/cuda/layernorm.cu — LayerNorm forward (fused with the residual add
 * that feeds it) and backward (fp32 and bf16 storage). A warp owns a row: two
 * passes (mean, then squared deviations) as on the CPU, so a large mean next
 * to a small spread does not cancel. The weight and bias gradients are column
 * sums over all SMs in a fixed order: no atomics. */
#include "backend/cuda/cuda_internal.cuh"

#define LN_EPS 1e-5f /* a float, widened to double as on the CPU */
#define LN_WARPS 8 /* rows per block */

/* x' = x + branch stored (when branch is given), then out = LayerNorm(x')
 * with x' read as stored, mean and rstd. A warp owns a row and reads it in
 * packs of W (C % W == 0 when W > 1); x' is read back by the lane that wrote
 * it. */
template <int W, typename T>
__global__ void layernorm_forward_kernel(T *res, T *out, float *mean, float *rstd, const T *inp,
                                         const T *branch, const T *weight, const T *bias, int N,
                                         int C) {
  const int lane = threadIdx.x & 31;
  for (size_t row = (size_t)blockIdx.x * LN_WARPS + (threadIdx.x >> 5); row < (size_t)N;
       row += (size_t)gridDim.x * LN_WARPS) {
    const T *x = inp + row * C;
    T *xr = branch ? res + row * C : nullptr;
    float s = 0.0f, v[W], t[W];
    for (int c = lane * W; c < C; c += 32 * W) {
      vload<W>(v, x + c);
      if (xr) {
        vload<W>(t, branch + row * C + c);
        for (int j = 0; j < W; ++j) v[j] = rounded(v[j] + t[j], x);
        vstore<W>(xr + c, v);
      }
      for (int j = 0; j < W; ++j) s += v[j];
    }
    const T *src = xr ? xr : x;
    const float m = (float)((double)warp_sum(s) / C);
    float q = 0.0f;
    for (int c = lane * W; c < C; c += 32 * W) {
      vload<W>(v, src + c);
      for (int j = 0; j < W; ++j) q += (v[j] - m) * (v[j] - m);
    }
    /* The CPU's expression, in double: 1 / sqrt(var + eps) rounded once. */
    const float r = (float)(1.0 / sqrt((double)warp_sum(q) / C + LN_EPS));
    T *o = out + row * C;
    for (int c = lane * W; c < C; c += 32 * W) {
      float w[W], b[W];
      vload<W>(v, src + c);
      vload<W>(w, weight + c);
      vload<W>(b, bias + c);
      for (int j = 0; j < W; ++j) v[j] = (v[j] - m) * r * w[j] + b[j];
      vstore<W>(o + c, v);
    }
    if (lane == 0) {
      mean[row] = m;
      rstd[row] = r;
    }
  }
}

/* dinp += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = weight * dout. */
template <int W, typename T>
__global__ void layernorm_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *weight,
                                      const float *mean, const float *rstd, int N, int C) {
  const int lane = threadIdx.x & 31;
  for (size_t row = (size_t)blockIdx.x * LN_WARPS + (threadIdx.x >> 5); row < (size_t)N;
       row += (size_t)gridDim.x * LN_WARPS) {
    const T *x = inp + row * C, *dy = dout + row * C;
    const float m = mean[row], r = rstd[row];
    float gs = 0.0f, gxs = 0.0f, xv[W], wv[W], dv[W];
    for (int c = lane * W; c < C; c += 32 * W) {
      vload<W>(xv, x + c);
      vload<W>(wv, weight + c);
      vload<W>(dv, dy + c);
      for (int j = 0; j < W; ++j) {
        const float g = wv[j] * dv[j];
        gs += g;
        gxs += g * ((xv[j] - m) * r);
      }
    }
    const float g_mean = (float)((double)warp_sum(gs) / C);
    const float gx_mean = (float)((double)warp_sum(gxs) / C);
    T *dx = dinp + row * C;
    for (int c = lane * W; c < C; c += 32 * W) {
      float acc[W];
      vload<W>(xv, x + c);
      vload<W>(wv, weight + c);
      vload<W>(dv, dy + c);
      vload<W>(acc, dx + c);
      for (int j = 0; j < W; ++j)
        acc[j] += r * (wv[j] * dv[j] - g_mean - (xv[j] - m) * r * gx_mean);
      vstore<W>(dx + c, acc);
    }
  }
}

static unsigned row_blocks(int N) { return fsdp_grid((size_t)N, LN_WARPS); }

template <typename T>
static fsdp_status_t layernorm_forward(T *res, T *out, float *mean, float *rstd, const T *inp,
                                       const T *branch, const T *weight, const T *bias, int N,
                                       int C, cudaStream_t s) {
  if (N <= 0 || C <= 0) return FSDP_SUCCESS;
  if (branch && !res)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "LayerNorm: a residual branch needs an output");
  constexpr int W = pack_width<T>();
  if (rows_packable<T>(C, {res, out, inp, branch, weight, bias}))
    FSDP_LAUNCH((layernorm_forward_kernel<W, T>), row_blocks(N), LN_WARPS * 32, 0, s, res, out,
                mean, rstd, inp, branch, weight, bias, N, C);
  else
    FSDP_LAUNCH((layernorm_forward_kernel<1, T>), row_blocks(N), LN_WARPS * 32, 0, s, res, out,
                mean, rstd, inp, branch, weight, bias, N, C);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

template <typename T>
static fsdp_status_t layernorm_dinp(T *dinp, const T *dout, const T *inp, const T *weight,
                                    const float *mean, const float *rstd, int N, int C,
                                    cudaStream_t s) {
  constexpr int W = pack_width<T>();
  if (rows_packable<T>(C, {dinp, dout, inp, weight}))
    FSDP_LAUNCH((layernorm_dinp_kernel<W, T>), row_blocks(N), LN_WARPS * 32, 0, s, dinp, dout,
                inp, weight, mean, rstd, N, C);
  else
    FSDP_LAUNCH((layernorm_dinp_kernel<1, T>), row_blocks(N), LN_WARPS * 32, 0, s, dinp, dout,
                inp, weight, mean, rstd, N, C);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

/* dweight[c] += sum_rows xhat * dout, dbias[c] += sum_rows dout: column sums
 * over all SMs (colsum, cuda_internal.cuh). */
template <int W, typename T>
static fsdp_status_t layernorm_params(float *dweight, float *dbias, float *scratch, const T *dout,
                                      const T *inp, const float *mean, const float *rstd, int N,
                                      int C, cudaStream_t s) {
  return colsum<2, W>(dweight, dbias, scratch, N, C,
                      [=] __device__(int r, int c, float(&v)[2][W]) {
                        float x[W], dy[W];
                        const size_t i = (size_t)r * C + c;
                        vload<W>(x, inp + i);
                        vload<W>(dy, dout + i);
                        const float m = mean[r], rs = rstd[r];
                        for (int j = 0; j < W; ++j) {
                          v[0][j] += (x[j] - m) * rs * dy[j];
                          v[1][j] += dy[j];
                        }
                      },
                      s);
}

template <typename T>
static fsdp_status_t layernorm_backward(T *dinp, float *dweight, float *dbias, float *scratch,
                                        const T *dout, const T *inp, const T *weight,
                                        const float *mean, const float *rstd, int N, int C,
                                        cudaStream_t s) {
  if (N <= 0 || C <= 0) return FSDP_SUCCESS;
  if (!scratch)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "layernorm_fused_backward: needs scratch of "
                      "fsdp_cuda_colsum_scratch_bytes(%d) bytes, got NULL", C);
  if (rows_packable<T>(C, {dout, inp}))
    FSDP_TRY((layernorm_params<pack_width<T>(), T>(dweight, dbias, scratch, dout, inp, mean, rstd,
                                                   N, C, s)));
  else
    FSDP_TRY((layernorm_params<1, T>(dweight, dbias, scratch, dout, inp, mean, rstd, N, C, s)));
  return dinp ? layernorm_dinp(dinp, dout, inp, weight, mean, rstd, N, C, s) : FSDP_SUCCESS;
}

fsdp_status_t fsdp_cuda_layernorm_fused_forward(const fsdp_layernorm_forward_args_t *a,
                                                fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("layernorm_fused_forward", a->dt, stream,
                            [&](auto *tag, cudaStream_t s) {
                              STORAGE(tag);
                              return layernorm_forward(as<S>(a->res), as<S>(a->out), a->mean,
                                                       a->rstd, as<S>(a->inp), as<S>(a->branch),
                                                       as<S>(a->weight), as<S>(a->bias), a->N,
                                                       a->C, s);
                            });
}

fsdp_status_t fsdp_cuda_layernorm_fused_backward(const fsdp_layernorm_backward_args_t *a,
                                                 fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("layernorm_fused_backward", a->dt, stream,
                            [&](auto *tag, cudaStream_t s) {
                              STORAGE(tag);
                              return layernorm_backward(
                                  as<S>(a->dinp), a->dweight, a->dbias,
                                  static_cast<float *>(a->scratch), as<S>(a->dout), as<S>(a->inp),
                                  as<S>(a->weight), a->mean, a->rstd, a->N, a->C, s);
                            });
}
