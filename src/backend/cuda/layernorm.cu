/* src/backend/cuda/layernorm.cu — LayerNorm forward (fused with the residual add
 * that feeds it) and backward (fp32 and bf16 storage). A warp owns a row: two
 * passes (mean, then squared deviations) as on the CPU, so a large mean next
 * to a small spread does not cancel. Backward reads a row once, d(input)
 * and the weight and bias gradients' column partials in one kernel, up to
 * 1024 columns (two passes past that); the partials are added in a fixed
 * order: no atomics. */
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

/* ---- backward ----
 * dinp += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = weight * dout,
 * xhat = (x - mean) * rstd; dweight[c] += sum over rows of xhat * dout and
 * dbias[c] += of dout.
 *
 * Up to LN_BWD_MAX_C columns, one kernel (layernorm_backward_kernel): a warp
 * owns a row as forward does and reads its x and dout once from HBM (its
 * second pass, for d(input), reads the row it has just read, from L1), and
 * adds the row's xhat * dout and dout onto per-warp column partials held in
 * registers: 2 C / 32 floats a lane, which is what bounds C. A block's
 * LN_BWD_WARPS warps then add their partials in warp order through shared
 * memory, one slice of the colsum scratch per block, and colsum's second
 * kernel adds the slices in block order onto dweight and dbias. The grid is
 * a function of N alone, capped at the scratch's COLSUM_MAX_SLICES blocks
 * (one a SM of a 132-SM H100 or H200), rows dealt to warps in a fixed
 * stride: the same bits every run, no atomics. Per call it moves x and dout
 * once, dinp read and written, mean and rstd, and 2 C floats a block written
 * and read back, against the two passes' x and dout twice: at GPT-2 124M's
 * N 16384, C 768 in bf16, 102.4 MB, 21 us at an H200's 4.8 TB/s (unmeasured;
 * the two passes declared 151.1 MB and took about 60 us a call, half of
 * HBM's bandwidth). Memory-bound, so what matters is the bytes in flight: 16
 * warps a SM (128 registers a thread at C 768 bf16, no spill), each fetching
 * its row's x and dout at once (3 KB), not a pack or two at a time.
 *
 * Wider rows (GPT-2 XL's 1600) take two passes: the column sums over all
 * SMs (colsum, cuda_internal.cuh), then layernorm_dinp_kernel. */
#define LN_BWD_WARPS 16 /* rows in flight per block: one 512-thread block a SM */
#define LN_BWD_SPAN 256 /* columns per step Q of the fused kernel's width */
#define LN_BWD_MAX_C (4 * LN_BWD_SPAN)
#define LN_BWD_STAGE 4 /* warps' partials in shared memory at once */
#define LN_BWD_AHEAD 12 /* registers a tensor's packs fetched at once take */

/* The fused kernel's width in LN_BWD_SPAN-column steps for rows of C, or 0:
 * the two passes. The one place the path is chosen. */
static int ln_bwd_steps(int C) {
  return C <= LN_BWD_MAX_C ? (C + LN_BWD_SPAN - 1) / LN_BWD_SPAN : 0;
}

/* W elements of T as stored: the fused kernel fetches packs ahead of their
 * use, so that they are in flight together, and widens each to floats where
 * it is used (holding the stored bytes, not floats, in between). */
template <int W, typename T> struct ln_stored {
  T v[W];
};

template <int W, typename T>
__device__ __forceinline__ void ln_fetch(ln_stored<W, T> &s, const T *p) {
  if constexpr (W == 1) {
    s.v[0] = *p;
  } else {
    static_assert(sizeof(ln_stored<W, T>) == 16, "a pack is 16 bytes");
    const int4 bits = *reinterpret_cast<const int4 *>(p);
    memcpy(&s, &bits, sizeof bits);
  }
}

template <int W, typename T>
__device__ __forceinline__ void ln_widen(float (&f)[W], const ln_stored<W, T> &s) {
  for (int j = 0; j < W; ++j) f[j] = load(&s.v[j]);
}

/* Packs p0 .. p0 + G - 1 of a row (of P a lane: pack p at (p 32 + lane) W),
 * those in the row, fetched at once. */
template <int P, int G, int W, typename T>
__device__ __forceinline__ void ln_fetch_ahead(ln_stored<W, T> (&s)[G], const T *row, int p0,
                                               int lane, int C) {
  for (int g = 0; g < G; ++g) {
    const int p = p0 + g, c = (p * 32 + lane) * W;
    if (p < P && c < C) ln_fetch(s[g], row + c);
  }
}

/* acc += d(input) of W elements, given the row's mean(g) and mean(g * xhat). */
template <int W>
__device__ __forceinline__ void ln_dinp_add(float (&acc)[W], const float (&xv)[W],
                                            const float (&wv)[W], const float (&dv)[W], float m,
                                            float r, float g_mean, float gx_mean) {
  for (int j = 0; j < W; ++j) acc[j] += r * (wv[j] * dv[j] - g_mean - (xv[j] - m) * r * gx_mean);
}

/* The fused backward for C <= Q LN_BWD_SPAN: a lane's P packs of W columns
 * (pack p at (p 32 + lane) W) each keep their dweight and dbias partials in
 * dw[p] and db[p]. Each pass over a row fetches G packs of each tensor at
 * once (LN_BWD_AHEAD registers: a bf16 row of 768 in one go), the second
 * pass dinp from HBM, x and dout again from L1. scratch[k][blockIdx.x][c]
 * gets the block's sums (k 0: dweight, 1: dbias), the warps' added in order. */
template <int Q, int W, typename T>
__global__ void __launch_bounds__(LN_BWD_WARPS * 32)
    layernorm_backward_kernel(T *dinp, float *scratch, const T *dout, const T *inp,
                              const T *weight, const float *mean, const float *rstd, int N,
                              int C) {
  constexpr int CAP = Q * LN_BWD_SPAN, P = CAP / (32 * W), THREADS = LN_BWD_WARPS * 32;
  constexpr int G = LN_BWD_AHEAD / ((W * (int)sizeof(T) + 3) / 4);
  constexpr int E = 2 * CAP / THREADS; /* shared entries a thread adds up */
  static_assert(CAP % (32 * W) == 0 && 2 * CAP % THREADS == 0, "whole packs and entries");
  FSDP_SHARED(float, part, [LN_BWD_STAGE][2 * CAP]);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float dw[P][W] = {}, db[P][W] = {};
  for (size_t row = (size_t)blockIdx.x * LN_BWD_WARPS + warp; row < (size_t)N;
       row += (size_t)gridDim.x * LN_BWD_WARPS) {
    const T *x = inp + row * C, *dy = dout + row * C;
    const float m = mean[row], r = rstd[row];
    float gs = 0.0f, gxs = 0.0f;
    for (int p0 = 0; p0 < P; p0 += G) {
      ln_stored<W, T> xs[G] = {}, ds[G] = {};
      ln_fetch_ahead<P>(xs, x, p0, lane, C);
      ln_fetch_ahead<P>(ds, dy, p0, lane, C);
      for (int g = 0; g < G; ++g) {
        const int p = p0 + g, c = (p * 32 + lane) * W;
        if (p >= P || c >= C) break;
        float xv[W], wv[W], dv[W];
        ln_widen(xv, xs[g]);
        vload<W>(wv, weight + c);
        ln_widen(dv, ds[g]);
        for (int j = 0; j < W; ++j) {
          const float xh = (xv[j] - m) * r, gw = wv[j] * dv[j];
          gs += gw;
          gxs += gw * xh;
          dw[p][j] += xh * dv[j];
          db[p][j] += dv[j];
        }
      }
    }
    if (!dinp) continue;
    const float g_mean = (float)((double)warp_sum(gs) / C);
    const float gx_mean = (float)((double)warp_sum(gxs) / C);
    T *dx = dinp + row * C;
    for (int p0 = 0; p0 < P; p0 += G) {
      ln_stored<W, T> xs[G] = {}, ds[G] = {}, as[G] = {};
      ln_fetch_ahead<P>(as, dx, p0, lane, C);
      ln_fetch_ahead<P>(xs, x, p0, lane, C);
      ln_fetch_ahead<P>(ds, dy, p0, lane, C);
      for (int g = 0; g < G; ++g) {
        const int p = p0 + g, c = (p * 32 + lane) * W;
        if (p >= P || c >= C) break;
        float xv[W], wv[W], dv[W], acc[W];
        ln_widen(xv, xs[g]);
        vload<W>(wv, weight + c);
        ln_widen(dv, ds[g]);
        ln_widen(acc, as[g]);
        ln_dinp_add(acc, xv, wv, dv, m, r, g_mean, gx_mean);
        vstore<W>(dx + c, acc);
      }
    }
  }
  /* A warp's partials in shared memory lane-minor, (p W + j) 32 + lane for
   * column (p 32 + lane) W + j, so that neither side conflicts on a bank. */
  float tot[E] = {};
  for (int w0 = 0; w0 < LN_BWD_WARPS; w0 += LN_BWD_STAGE) {
    if (warp >= w0 && warp < w0 + LN_BWD_STAGE)
      for (int p = 0; p < P; ++p)
        for (int j = 0; j < W; ++j) {
          part[warp - w0][(p * W + j) * 32 + lane] = dw[p][j];
          part[warp - w0][CAP + (p * W + j) * 32 + lane] = db[p][j];
        }
    __syncthreads();
    for (int e = 0; e < E; ++e)
      for (int w = 0; w < LN_BWD_STAGE; ++w) tot[e] += part[w][e * THREADS + threadIdx.x];
    __syncthreads();
  }
  for (int e = 0; e < E; ++e) {
    const int i = e * THREADS + threadIdx.x, k = i / CAP, q = i % CAP;
    const int c = (q / (32 * W) * 32 + q % 32) * W + q / 32 % W;
    if (c < C) scratch[((size_t)k * gridDim.x + blockIdx.x) * C + c] = tot[e];
  }
}

/* The two passes' d(input): a warp per row, mean(g) and mean(g * xhat) first. */
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
      ln_dinp_add(acc, xv, wv, dv, m, r, g_mean, gx_mean);
      vstore<W>(dx + c, acc);
    }
  }
}

/* The fused kernel at width Q, then colsum's second kernel over its blocks'
 * slices. */
template <int Q, int W, typename T>
static fsdp_status_t layernorm_fused(const fsdp_layernorm_backward_args_t &a, cudaStream_t s) {
  const size_t want = ((size_t)a.N + LN_BWD_WARPS - 1) / LN_BWD_WARPS;
  const unsigned blocks = want < COLSUM_MAX_SLICES ? (unsigned)want : COLSUM_MAX_SLICES;
  float *scratch = static_cast<float *>(a.scratch);
  FSDP_LAUNCH((layernorm_backward_kernel<Q, W, T>), blocks, LN_BWD_WARPS * 32, 0, s, as<T>(a.dinp),
              scratch, as<T>(a.dout), as<T>(a.inp), as<T>(a.weight), a.mean, a.rstd, a.N, a.C);
  LAUNCH_CHECK();
  FSDP_LAUNCH(colsum_finish_kernel<2>, (unsigned)((a.C + 255) / 256), 256, 0, s, a.dweight,
              a.dbias, scratch, (int)blocks, a.C);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

template <int W, typename T>
static fsdp_status_t layernorm_fused(int steps, const fsdp_layernorm_backward_args_t &a,
                                     cudaStream_t s) {
  switch (steps) {
  case 1: return layernorm_fused<1, W, T>(a, s);
  case 2: return layernorm_fused<2, W, T>(a, s);
  case 3: return layernorm_fused<3, W, T>(a, s);
  default: return layernorm_fused<4, W, T>(a, s);
  }
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

/* The two passes, for rows wider than LN_BWD_MAX_C. */
template <typename T>
static fsdp_status_t layernorm_two_pass(const fsdp_layernorm_backward_args_t &a, cudaStream_t s) {
  T *dinp = as<T>(a.dinp);
  const T *dout = as<T>(a.dout), *inp = as<T>(a.inp), *weight = as<T>(a.weight);
  float *scratch = static_cast<float *>(a.scratch);
  const int N = a.N, C = a.C;
  constexpr int W = pack_width<T>();
  if (rows_packable<T>(C, {dout, inp}))
    FSDP_TRY((layernorm_params<W, T>(a.dweight, a.dbias, scratch, dout, inp, a.mean, a.rstd, N,
                                     C, s)));
  else
    FSDP_TRY((layernorm_params<1, T>(a.dweight, a.dbias, scratch, dout, inp, a.mean, a.rstd, N,
                                     C, s)));
  if (!dinp) return FSDP_SUCCESS;
  if (rows_packable<T>(C, {dinp, dout, inp, weight}))
    FSDP_LAUNCH((layernorm_dinp_kernel<W, T>), row_blocks(N), LN_WARPS * 32, 0, s, dinp, dout,
                inp, weight, a.mean, a.rstd, N, C);
  else
    FSDP_LAUNCH((layernorm_dinp_kernel<1, T>), row_blocks(N), LN_WARPS * 32, 0, s, dinp, dout,
                inp, weight, a.mean, a.rstd, N, C);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

template <typename T>
static fsdp_status_t layernorm_backward(const fsdp_layernorm_backward_args_t &a, cudaStream_t s) {
  if (a.N <= 0 || a.C <= 0) return FSDP_SUCCESS;
  if (!a.scratch)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "layernorm_fused_backward: needs scratch of "
                      "fsdp_cuda_colsum_scratch_bytes(%d) bytes, got NULL", a.C);
  const int steps = ln_bwd_steps(a.C);
  if (!steps) return layernorm_two_pass<T>(a, s);
  if (rows_packable<T>(a.C, {a.dinp, a.dout, a.inp, a.weight}))
    return layernorm_fused<pack_width<T>(), T>(steps, a, s);
  return layernorm_fused<1, T>(steps, a, s);
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
                              return layernorm_backward<S>(*a, s);
                            });
}
