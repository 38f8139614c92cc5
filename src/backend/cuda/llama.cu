/* src/backend/cuda/llama.cu — the Llama family's layer kernels (fp32 and bf16
 * storage): RMSNorm forward (fused with the residual add that feeds it) and
 * backward, rotary position embedding in place on a packed qkv and its
 * inverse, SwiGLU and its backward. Math in fp32; compute.h documents each
 * contract. All three are memory-bound: one read and one write of the
 * activations per call is what each kernel costs (RMSNorm's forward and
 * d(input) read a row twice, from L1/L2: a warp owns a row), plus the
 * column sums of dweight over all SMs (colsum, cuda_internal.cuh).
 * Expected time on an H100 (3.35 TB/s) at Llama-3.2-1B's shapes, B*T = 8192
 * rows of C = 2048 bf16: RMSNorm forward ~20 us (32 MiB read, 32 MiB
 * written), RoPE ~30 us (40 of 48 heads of 64 read and written), SwiGLU
 * forward over F = 8192 ~60 us (256 MiB read, 128 MiB written). */
#include "backend/cuda/cuda_internal.cuh"

#define RMS_WARPS 8 /* rows per block */

/* ---- RMSNorm ---- */

/* x = inp + branch stored in res (when branch is given), else inp; rstd =
 * 1 / sqrt(mean(x^2) + eps); out = weight * (x * rstd as stored). A warp
 * owns a row and reads it in packs of W (C % W == 0 when W > 1); res is read
 * back by the lane that wrote it. */
template <int W, typename T>
__global__ void rmsnorm_forward_kernel(T *res, T *out, float *rstd, const T *inp, const T *branch,
                                       const T *weight, int N, int C, float eps) {
  const int lane = threadIdx.x & 31;
  for (size_t row = (size_t)blockIdx.x * RMS_WARPS + (threadIdx.x >> 5); row < (size_t)N;
       row += (size_t)gridDim.x * RMS_WARPS) {
    const T *x = inp + row * C;
    T *xr = branch ? res + row * C : nullptr;
    float q = 0.0f, v[W], t[W];
    for (int c = lane * W; c < C; c += 32 * W) {
      vload<W>(v, x + c);
      if (xr) {
        vload<W>(t, branch + row * C + c);
        for (int j = 0; j < W; ++j) v[j] = rounded(v[j] + t[j], x);
        vstore<W>(xr + c, v);
      }
      for (int j = 0; j < W; ++j) q += v[j] * v[j];
    }
    const T *src = xr ? xr : x;
    const float r = 1.0f / sqrtf((float)((double)warp_sum(q) / C) + eps);
    T *o = out + row * C;
    for (int c = lane * W; c < C; c += 32 * W) {
      float w[W];
      vload<W>(v, src + c);
      vload<W>(w, weight + c);
      for (int j = 0; j < W; ++j) v[j] = w[j] * rounded(v[j] * r, x);
      vstore<W>(o + c, v);
    }
    if (lane == 0) rstd[row] = r;
  }
}

/* dinp += rstd * (g - xhat * mean(g * xhat)), g = weight * dout, xhat = x *
 * rstd. */
template <int W, typename T>
__global__ void rmsnorm_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *weight,
                                    const float *rstd, int N, int C) {
  const int lane = threadIdx.x & 31;
  for (size_t row = (size_t)blockIdx.x * RMS_WARPS + (threadIdx.x >> 5); row < (size_t)N;
       row += (size_t)gridDim.x * RMS_WARPS) {
    const T *x = inp + row * C, *dy = dout + row * C;
    const float r = rstd[row];
    float gxs = 0.0f, xv[W], wv[W], dv[W];
    for (int c = lane * W; c < C; c += 32 * W) {
      vload<W>(xv, x + c);
      vload<W>(wv, weight + c);
      vload<W>(dv, dy + c);
      for (int j = 0; j < W; ++j) gxs += wv[j] * dv[j] * (xv[j] * r);
    }
    const float gx_mean = (float)((double)warp_sum(gxs) / C);
    T *dx = dinp + row * C;
    for (int c = lane * W; c < C; c += 32 * W) {
      float acc[W];
      vload<W>(xv, x + c);
      vload<W>(wv, weight + c);
      vload<W>(dv, dy + c);
      vload<W>(acc, dx + c);
      for (int j = 0; j < W; ++j) acc[j] += r * (wv[j] * dv[j] - xv[j] * r * gx_mean);
      vstore<W>(dx + c, acc);
    }
  }
}

static unsigned row_blocks(int N) { return fsdp_grid((size_t)N, RMS_WARPS); }

template <typename T>
static fsdp_status_t rmsnorm_forward(T *res, T *out, float *rstd, const T *inp, const T *branch,
                                     const T *weight, int N, int C, float eps, cudaStream_t s) {
  if (N <= 0 || C <= 0) return FSDP_SUCCESS;
  if (branch && !res)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "RMSNorm: a residual branch needs an output");
  if (!(eps >= 0.0f))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "RMSNorm: eps %g is not >= 0", (double)eps);
  constexpr int W = pack_width<T>();
  if (rows_packable<T>(C, {res, out, inp, branch, weight}))
    FSDP_LAUNCH((rmsnorm_forward_kernel<W, T>), row_blocks(N), RMS_WARPS * 32, 0, s, res, out,
                rstd, inp, branch, weight, N, C, eps);
  else
    FSDP_LAUNCH((rmsnorm_forward_kernel<1, T>), row_blocks(N), RMS_WARPS * 32, 0, s, res, out,
                rstd, inp, branch, weight, N, C, eps);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

/* dweight[c] += sum over rows of xhat * dout (colsum, K = 1). */
template <int W, typename T>
static fsdp_status_t rmsnorm_dweight(float *dweight, float *scratch, const T *dout, const T *inp,
                                     const float *rstd, int N, int C, cudaStream_t s) {
  return colsum<1, W>(dweight, nullptr, scratch, N, C,
                      [=] __device__(int r, int c, float(&v)[1][W]) {
                        float x[W], dy[W];
                        const size_t i = (size_t)r * C + c;
                        vload<W>(x, inp + i);
                        vload<W>(dy, dout + i);
                        const float rs = rstd[r];
                        for (int j = 0; j < W; ++j) v[0][j] += x[j] * rs * dy[j];
                      },
                      s);
}

template <typename T>
static fsdp_status_t rmsnorm_backward(T *dinp, float *dweight, float *scratch, const T *dout,
                                      const T *inp, const T *weight, const float *rstd, int N,
                                      int C, cudaStream_t s) {
  if (N <= 0 || C <= 0) return FSDP_SUCCESS;
  if (!scratch)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "rmsnorm_backward: needs scratch of "
                      "fsdp_cuda_colsum_scratch_bytes(%d) bytes, got NULL", C);
  if (!dinp) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "rmsnorm_backward: dinp is NULL");
  constexpr int W = pack_width<T>();
  if (rows_packable<T>(C, {dout, inp}))
    FSDP_TRY((rmsnorm_dweight<W, T>(dweight, scratch, dout, inp, rstd, N, C, s)));
  else
    FSDP_TRY((rmsnorm_dweight<1, T>(dweight, scratch, dout, inp, rstd, N, C, s)));
  if (rows_packable<T>(C, {dinp, dout, inp, weight}))
    FSDP_LAUNCH((rmsnorm_dinp_kernel<W, T>), row_blocks(N), RMS_WARPS * 32, 0, s, dinp, dout, inp,
                weight, rstd, N, C);
  else
    FSDP_LAUNCH((rmsnorm_dinp_kernel<1, T>), row_blocks(N), RMS_WARPS * 32, 0, s, dinp, dout, inp,
                weight, rstd, N, C);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

/* ---- RoPE ---- */

#define ROPE_PAIRS 32 /* threadIdx.x: rotation pairs i of a head */
#define ROPE_HEADS 8  /* threadIdx.y: heads of the row */

/* One (B*T) row per block iteration: a thread owns pairs i (stride 32),
 * computes their angle's cos and sin once and rotates them in each of its
 * heads (stride 8) among the row's NH + NKV q and k heads; dir = -1 turns
 * by the opposite angle (the transpose: backward). */
template <typename T>
__global__ void __launch_bounds__(ROPE_PAIRS *ROPE_HEADS)
    rope_kernel(T *qkv, const float *inv_freq, int rows, int T_, int heads, int ld, int D,
                int pos0, float dir) {
  const int half = D / 2;
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const float p = (float)(pos0 + row % T_);
    T *x = qkv + (size_t)row * ld;
    for (int i = threadIdx.x; i < half; i += ROPE_PAIRS) {
      const float angle = p * inv_freq[i];
      const float c = cosf(angle), sn = dir * sinf(angle);
      for (int h = threadIdx.y; h < heads; h += ROPE_HEADS) {
        T *a = x + (size_t)h * D + i, *b = a + half;
        const float x1 = load(a), x2 = load(b);
        store(a, x1 * c - x2 * sn);
        store(b, x2 * c + x1 * sn);
      }
    }
  }
}

template <typename T>
static fsdp_status_t rope(const char *op, T *qkv, const float *inv_freq, int B, int T_, int NH,
                          int NKV, int D, int pos0, float dir, cudaStream_t s) {
  if (NKV == 0) NKV = NH;
  if (B < 0 || T_ < 0 || NH <= 0 || NKV < 0 || NH % NKV != 0 || D <= 0 || D % 2 != 0 || pos0 < 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: B %d, T %d, NH %d, NKV %d, D %d, pos0 %d: "
                      "positive heads with NKV dividing NH, an even head size and pos0 >= 0 "
                      "expected", op, B, T_, NH, NKV, D, pos0);
  if ((long long)pos0 + T_ > (1LL << 24))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: positions up to pos0 %d + T %d are past "
                      "2^24, where fp32 no longer holds every integer", op, pos0, T_);
  const long long rows = (long long)B * T_;
  if (rows == 0) return FSDP_SUCCESS;
  if (rows > INT32_MAX)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: B*T = %lld rows is past 2^31", op, rows);
  const unsigned grid = rows > FSDP_CUDA_MAX_GRID ? FSDP_CUDA_MAX_GRID : (unsigned)rows;
  FSDP_LAUNCH(rope_kernel<T>, grid, dim3(ROPE_PAIRS, ROPE_HEADS), 0, s, qkv, inv_freq, (int)rows,
              T_, NH + NKV, (NH + 2 * NKV) * D, D, pos0, dir);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

/* ---- SwiGLU ---- */

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Every pack of W outputs (F % W == 0 when W > 1: a pack never crosses a
 * row): out = silu(gate) * up. */
template <int W, typename T>
__global__ void swiglu_forward_kernel(T *out, const T *inp, int F, size_t packs) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < packs;
       i += (size_t)gridDim.x * blockDim.x) {
    const size_t e = i * W, row = e / F, f = e % F;
    float g[W], u[W];
    vload<W>(g, inp + row * 2 * F + f);
    vload<W>(u, inp + row * 2 * F + F + f);
    for (int j = 0; j < W; ++j) g[j] = g[j] * sigmoid(g[j]) * u[j];
    vstore<W>(out + e, g);
  }
}

/* dgate = dout * up * silu'(gate), silu'(x) = s (1 + x (1 - s)) with s =
 * sigmoid(x); dup = dout * silu(gate); both written. */
template <int W, typename T>
__global__ void swiglu_backward_kernel(T *dinp, const T *dout, const T *inp, int F,
                                       size_t packs) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < packs;
       i += (size_t)gridDim.x * blockDim.x) {
    const size_t e = i * W, row = e / F, f = e % F;
    float g[W], u[W], dy[W];
    vload<W>(g, inp + row * 2 * F + f);
    vload<W>(u, inp + row * 2 * F + F + f);
    vload<W>(dy, dout + e);
    for (int j = 0; j < W; ++j) {
      const float sg = sigmoid(g[j]);
      const float dg = dy[j] * u[j] * sg * (1.0f + g[j] * (1.0f - sg));
      u[j] = dy[j] * g[j] * sg;
      g[j] = dg;
    }
    vstore<W>(dinp + row * 2 * F + f, g);
    vstore<W>(dinp + row * 2 * F + F + f, u);
  }
}

static fsdp_status_t swiglu_check(const char *op, int N, int F) {
  if (N < 0 || F < 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: N %d, F %d: sizes >= 0 expected", op, N, F);
  return FSDP_SUCCESS;
}

template <typename T>
static fsdp_status_t swiglu_forward(T *out, const T *inp, int N, int F, cudaStream_t s) {
  FSDP_TRY(swiglu_check("swiglu_forward", N, F));
  const size_t n = (size_t)N * F;
  if (n == 0) return FSDP_SUCCESS;
  constexpr int W = pack_width<T>();
  if (rows_packable<T>(F, {out, inp}))
    FSDP_LAUNCH((swiglu_forward_kernel<W, T>), fsdp_grid(n / W, FSDP_CUDA_BLOCK), FSDP_CUDA_BLOCK,
                0, s, out, inp, F, n / W);
  else
    FSDP_LAUNCH((swiglu_forward_kernel<1, T>), fsdp_grid(n, FSDP_CUDA_BLOCK), FSDP_CUDA_BLOCK, 0,
                s, out, inp, F, n);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

template <typename T>
static fsdp_status_t swiglu_backward(T *dinp, const T *dout, const T *inp, int N, int F,
                                     cudaStream_t s) {
  FSDP_TRY(swiglu_check("swiglu_backward", N, F));
  const size_t n = (size_t)N * F;
  if (n == 0) return FSDP_SUCCESS;
  constexpr int W = pack_width<T>();
  if (rows_packable<T>(F, {dinp, dout, inp}))
    FSDP_LAUNCH((swiglu_backward_kernel<W, T>), fsdp_grid(n / W, FSDP_CUDA_BLOCK),
                FSDP_CUDA_BLOCK, 0, s, dinp, dout, inp, F, n / W);
  else
    FSDP_LAUNCH((swiglu_backward_kernel<1, T>), fsdp_grid(n, FSDP_CUDA_BLOCK), FSDP_CUDA_BLOCK, 0,
                s, dinp, dout, inp, F, n);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

/* ---- the table's entry points ---- */

fsdp_status_t fsdp_cuda_rmsnorm_forward(const fsdp_rmsnorm_forward_args_t *a,
                                        fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("rmsnorm_forward", a->dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    return rmsnorm_forward(as<S>(a->res), as<S>(a->out), a->rstd, as<S>(a->inp),
                           as<S>(a->branch), as<S>(a->weight), a->N, a->C, a->eps, s);
  });
}

fsdp_status_t fsdp_cuda_rmsnorm_backward(const fsdp_rmsnorm_backward_args_t *a,
                                         fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("rmsnorm_backward", a->dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    return rmsnorm_backward(as<S>(a->dinp), a->dweight, static_cast<float *>(a->scratch),
                            as<S>(a->dout), as<S>(a->inp), as<S>(a->weight), a->rstd, a->N, a->C,
                            s);
  });
}

fsdp_status_t fsdp_cuda_rope_forward(const fsdp_rope_args_t *a, fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("rope_forward", a->dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    return rope("rope_forward", as<S>(a->qkv), a->inv_freq, a->B, a->T, a->NH, a->NKV, a->D,
                a->pos0, 1.0f, s);
  });
}

fsdp_status_t fsdp_cuda_rope_backward(const fsdp_rope_args_t *a, fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("rope_backward", a->dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    return rope("rope_backward", as<S>(a->qkv), a->inv_freq, a->B, a->T, a->NH, a->NKV, a->D,
                a->pos0, -1.0f, s);
  });
}

fsdp_status_t fsdp_cuda_swiglu_forward(const fsdp_swiglu_forward_args_t *a,
                                       fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("swiglu_forward", a->dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    return swiglu_forward(as<S>(a->out), as<S>(a->inp), a->N, a->F, s);
  });
}

fsdp_status_t fsdp_cuda_swiglu_backward(const fsdp_swiglu_backward_args_t *a,
                                        fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("swiglu_backward", a->dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    return swiglu_backward(as<S>(a->dinp), as<S>(a->dout), as<S>(a->inp), a->N, a->F, s);
  });
}
