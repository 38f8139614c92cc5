/* src/cuda/attention.cu — causal multi-head self-attention, forward and
 * backward: fp32 keeping the probabilities, and bf16 on tensor cores keeping
 * only the log-sum-exp (below). The score and value products of each batch row are one
 * strided-batched cuBLAS call over its NH heads (the heads of a row are hs
 * columns apart; batch rows are not a uniform stride away from them, hence one
 * call per b); softmax and its backward are warp-per-row kernels. The full
 * (T,T) score block is computed, the masked upper triangle included, and the
 * softmax writes it as 0, as the CPU's att holds. */
#include "cuda/cuda_internal.cuh"

#define ATT_WARPS 8 /* rows per block */

/* Softmax of row[0..t] in place, zeros in row[t+1..T), for each of the n_rows
 * rows of (T,T) blocks; t is the row's index within its block. */
__global__ void causal_softmax_kernel(float *att, size_t n_rows, int T) {
  const int lane = threadIdx.x & 31;
  for (size_t r = (size_t)blockIdx.x * ATT_WARPS + (threadIdx.x >> 5); r < n_rows;
       r += (size_t)gridDim.x * ATT_WARPS) {
    float *row = att + r * T;
    const int t = (int)(r % T);
    float mx = -INFINITY;
    for (int j = lane; j <= t; j += 32) mx = fmaxf(mx, row[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j <= t; j += 32) {
      const float e = expf(row[j] - mx);
      row[j] = e;
      sum += e;
    }
    const float inv = 1.0f / warp_sum(sum);
    for (int j = lane; j < T; j += 32) row[j] = j <= t ? row[j] * inv : 0.0f;
  }
}

/* In place on datt: dscore = scale * p * (datt - sum_j p * datt) for j <= t,
 * 0 above the diagonal; p is att. */
__global__ void causal_softmax_backward_kernel(float *datt, const float *att, size_t n_rows,
                                               int T, float scale) {
  const int lane = threadIdx.x & 31;
  for (size_t r = (size_t)blockIdx.x * ATT_WARPS + (threadIdx.x >> 5); r < n_rows;
       r += (size_t)gridDim.x * ATT_WARPS) {
    float *d = datt + r * T;
    const float *p = att + r * T;
    const int t = (int)(r % T);
    float dot = 0.0f;
    for (int j = lane; j <= t; j += 32) dot += p[j] * d[j];
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += 32) d[j] = j <= t ? scale * p[j] * (d[j] - dot) : 0.0f;
  }
}

/* A strided-batched row-major product over the NH heads of one batch row, in
 * fp32 or bf16 (fp32 accumulation either way). */
template <typename T>
static fsdp_status_t heads_gemm(bool ta, bool tb, int m, int n, int k, const T *A, int lda,
                                long long sa, const T *B, int ldb, long long sb, float alpha,
                                float beta, T *C, int ldc, long long sc, int NH,
                                cudaStream_t s) {
  const fsdp_gemm g = {ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, NH,
                       fsdp_cuda_type<T>::value, fsdp_cuda_type<T>::value};
  return fsdp_cuda_gemm(&g, s);
}

/* ---- bf16 on tensor cores, keeping only the log-sum-exp ----
 * The products are bf16 cuBLAS (tensor cores, fp32 accumulation) over one
 * batch row's NH heads at a time; scores and dP come out in fp32 (a bf16
 * score would carry 2^-9 of |s| into every probability), probabilities and
 * dscore go back in bf16 as the next products' operands. A warp-per-row
 * causal softmax reads only the unmasked half, writes 0 above the diagonal
 * (the value product reads the full row) and keeps lse = max + log(sum) per
 * row in fp32. Backward recomputes the scores and p = exp(s - lse) instead of
 * storing (B,NH,T,T) per layer. The scratch is one batch row's, shared by all
 * layers. */

/* Scaled scores s (fp32) to probabilities p (bf16); lse of each row. */
__global__ void causal_softmax_lse_kernel(bf16 *p, float *lse, const float *s, size_t n_rows,
                                          int T) {
  const int lane = threadIdx.x & 31;
  for (size_t r = (size_t)blockIdx.x * ATT_WARPS + (threadIdx.x >> 5); r < n_rows;
       r += (size_t)gridDim.x * ATT_WARPS) {
    const float *row = s + r * T;
    bf16 *out = p + r * T;
    const int t = (int)(r % T);
    float mx = -INFINITY;
    for (int j = lane; j <= t; j += 32) mx = fmaxf(mx, row[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j <= t; j += 32) sum += expf(row[j] - mx);
    const float l = mx + logf(warp_sum(sum));
    for (int j = lane; j < T; j += 32) store(out + j, j <= t ? expf(row[j] - l) : 0.0f);
    if (lane == 0) lse[r] = l;
  }
}

/* From the recomputed scores s and dp = dout @ v^T (fp32): p = exp(s - lse)
 * and ds = scale * p * (dp - sum_j p dp), both bf16 and 0 above the diagonal.
 * The sum is over the bf16 p the value product reads. */
__global__ void causal_softmax_lse_backward_kernel(bf16 *p, bf16 *ds, const float *s,
                                                   const float *dp, const float *lse,
                                                   size_t n_rows, int T, float scale) {
  const int lane = threadIdx.x & 31;
  for (size_t r = (size_t)blockIdx.x * ATT_WARPS + (threadIdx.x >> 5); r < n_rows;
       r += (size_t)gridDim.x * ATT_WARPS) {
    const float *srow = s + r * T, *d = dp + r * T;
    bf16 *prow = p + r * T, *dsrow = ds + r * T;
    const int t = (int)(r % T);
    const float l = lse[r];
    float dot = 0.0f;
    for (int j = lane; j <= t; j += 32) {
      store(prow + j, expf(srow[j] - l));
      dot += load(prow + j) * d[j];
    }
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += 32) {
      const bool in = j <= t;
      store(dsrow + j, in ? scale * load(prow + j) * (d[j] - dot) : 0.0f);
      if (!in) store(prow + j, 0.0f);
    }
  }
}

/* A strided-batched product of bf16 operands into fp32, over NH heads. */
static fsdp_status_t heads_gemm_f32out(bool ta, bool tb, int m, int n, int k, const bf16 *A,
                                       int lda, long long sa, const bf16 *B, int ldb,
                                       long long sb, float alpha, float *C, int ldc,
                                       long long sc, int NH, cudaStream_t s) {
  const fsdp_gemm g = {ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, 0.0f, C, ldc, sc, NH,
                       CUDA_R_16BF, CUDA_R_32F};
  return fsdp_cuda_gemm(&g, s);
}

static fsdp_status_t check_heads(int C, int NH) {
  if (C % NH != 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "attention: C %d is not a multiple of the %d heads", C, NH);
  return FSDP_SUCCESS;
}

static unsigned softmax_blocks(size_t n_rows) { return fsdp_grid(n_rows, ATT_WARPS); }

/* fp32: the (B,NH,T,T) probabilities kept in att. */
static fsdp_status_t probs_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                                   int NH, cudaStream_t stream) {
  if (B <= 0 || T <= 0 || C <= 0 || NH <= 0) return FSDP_SUCCESS;
  FSDP_TRY(check_heads(C, NH));
  const int hs = C / NH, ld = 3 * C;
  const float scale = 1.0f / sqrtf((float)hs);
  const long long tt = (long long)T * T;
  for (int b = 0; b < B; ++b) {
    const float *q = qkv + (size_t)b * T * ld, *k = q + C;
    float *a = att + (size_t)b * NH * tt;
    /* a (T,T) = scale * q @ k^T, per head */
    FSDP_TRY(heads_gemm(false, true, T, T, hs, q, ld, hs, k, ld, hs, scale, 0.0f, a, T, tt, NH,
                        stream));
  }
  const size_t rows = (size_t)B * NH * T;
  FSDP_LAUNCH(causal_softmax_kernel, softmax_blocks(rows), ATT_WARPS * 32, 0, stream, att, rows, T);
  LAUNCH_CHECK();
  for (int b = 0; b < B; ++b) {
    const float *v = qkv + (size_t)b * T * ld + 2 * C, *a = att + (size_t)b * NH * tt;
    /* out (T,hs) = a (T,T) @ v (T,hs), per head; a is 0 past the diagonal */
    FSDP_TRY(heads_gemm(false, false, T, hs, T, a, T, tt, v, ld, hs, 1.0f, 0.0f,
                        out + (size_t)b * T * C, C, hs, NH, stream));
  }
  return FSDP_SUCCESS;
}

/* scratch: (NH,T,T) floats, one batch row's dscore at a time. */
static fsdp_status_t probs_backward(float *dqkv, float *scratch, const float *dout,
                                    const float *qkv, const float *att, int B, int T, int C,
                                    int NH, cudaStream_t stream) {
  if (B <= 0 || T <= 0 || C <= 0 || NH <= 0) return FSDP_SUCCESS;
  FSDP_TRY(check_heads(C, NH));
  const int hs = C / NH, ld = 3 * C;
  const float scale = 1.0f / sqrtf((float)hs);
  const long long tt = (long long)T * T;
  const size_t rows = (size_t)NH * T;
  for (int b = 0; b < B; ++b) {
    const size_t off = (size_t)b * T * ld;
    const float *q = qkv + off, *k = q + C, *v = q + 2 * C;
    float *dq = dqkv + off, *dk = dq + C, *dv = dq + 2 * C;
    const float *a = att + (size_t)b * NH * tt, *dy = dout + (size_t)b * T * C;
    /* dv += a^T @ dout */
    FSDP_TRY(heads_gemm(true, false, T, hs, T, a, T, tt, dy, C, hs, 1.0f, 1.0f, dv, ld, hs, NH,
                        stream));
    /* scratch (T,T) = dout @ v^T */
    FSDP_TRY(heads_gemm(false, true, T, T, hs, dy, C, hs, v, ld, hs, 1.0f, 0.0f, scratch, T, tt,
                        NH, stream));
    FSDP_LAUNCH(causal_softmax_backward_kernel, softmax_blocks(rows), ATT_WARPS * 32, 0, stream,
                scratch, a, rows, T, scale);
    LAUNCH_CHECK();
    /* dq += dscore @ k;  dk += dscore^T @ q */
    FSDP_TRY(heads_gemm(false, false, T, hs, T, scratch, T, tt, k, ld, hs, 1.0f, 1.0f, dq, ld, hs,
                        NH, stream));
    FSDP_TRY(heads_gemm(true, false, T, hs, T, scratch, T, tt, q, ld, hs, 1.0f, 1.0f, dk, ld, hs,
                        NH, stream));
  }
  return FSDP_SUCCESS;
}

static size_t lse_scratch_bytes(int T, int NH) {
  return (size_t)NH * (size_t)T * (size_t)T * 12; /* s, dp fp32; p, ds bf16 */
}

static fsdp_status_t lse_forward(bf16 *out, float *lse, void *scratch, const bf16 *qkv, int B,
                                 int T, int C, int NH, cudaStream_t stream) {
  if (B <= 0 || T <= 0 || C <= 0 || NH <= 0) return FSDP_SUCCESS;
  FSDP_TRY(check_heads(C, NH));
  const int hs = C / NH, ld = 3 * C;
  const float scale = 1.0f / sqrtf((float)hs);
  const long long tt = (long long)T * T;
  const size_t rows = (size_t)NH * T;
  float *sc = (float *)scratch;
  bf16 *p = (bf16 *)(sc + (size_t)NH * tt);
  for (int b = 0; b < B; ++b) {
    const bf16 *q = qkv + (size_t)b * T * ld, *k = q + C, *v = q + 2 * C;
    /* s (T,T) = scale * q @ k^T; then p and lse; then out (T,hs) = p @ v, per head */
    FSDP_TRY(heads_gemm_f32out(false, true, T, T, hs, q, ld, hs, k, ld, hs, scale, sc, T, tt, NH,
                               stream));
    FSDP_LAUNCH(causal_softmax_lse_kernel, softmax_blocks(rows), ATT_WARPS * 32, 0, stream, p,
                lse + (size_t)b * rows, (const float *)sc, rows, T);
    LAUNCH_CHECK();
    FSDP_TRY(heads_gemm(false, false, T, hs, T, (const bf16 *)p, T, tt, v, ld, hs, 1.0f, 0.0f,
                        out + (size_t)b * T * C, C, hs, NH, stream));
  }
  return FSDP_SUCCESS;
}

static fsdp_status_t lse_backward(bf16 *dqkv, void *scratch, const bf16 *dout, const bf16 *qkv,
                                  const float *lse, int B, int T, int C, int NH,
                                  cudaStream_t stream) {
  if (B <= 0 || T <= 0 || C <= 0 || NH <= 0) return FSDP_SUCCESS;
  FSDP_TRY(check_heads(C, NH));
  const int hs = C / NH, ld = 3 * C;
  const float scale = 1.0f / sqrtf((float)hs);
  const long long tt = (long long)T * T;
  const size_t rows = (size_t)NH * T, n = (size_t)NH * tt;
  float *sc = (float *)scratch, *dp = sc + n;
  bf16 *p = (bf16 *)(dp + n), *ds = p + n;
  for (int b = 0; b < B; ++b) {
    const size_t off = (size_t)b * T * ld;
    const bf16 *q = qkv + off, *k = q + C, *v = q + 2 * C, *dy = dout + (size_t)b * T * C;
    bf16 *dq = dqkv + off, *dk = dq + C, *dv = dq + 2 * C;
    /* s = scale * q @ k^T (recomputed), dp = dout @ v^T, then the softmax backward */
    FSDP_TRY(heads_gemm_f32out(false, true, T, T, hs, q, ld, hs, k, ld, hs, scale, sc, T, tt, NH,
                               stream));
    FSDP_TRY(heads_gemm_f32out(false, true, T, T, hs, dy, C, hs, v, ld, hs, 1.0f, dp, T, tt, NH,
                               stream));
    FSDP_LAUNCH(causal_softmax_lse_backward_kernel, softmax_blocks(rows), ATT_WARPS * 32, 0,
                stream, p, ds, (const float *)sc, (const float *)dp, lse + (size_t)b * rows, rows,
                T, scale);
    LAUNCH_CHECK();
    /* dv += p^T @ dout; dq += ds @ k; dk += ds^T @ q */
    FSDP_TRY(heads_gemm(true, false, T, hs, T, (const bf16 *)p, T, tt, dy, C, hs, 1.0f, 1.0f, dv,
                        ld, hs, NH, stream));
    FSDP_TRY(heads_gemm(false, false, T, hs, T, (const bf16 *)ds, T, tt, k, ld, hs, 1.0f, 1.0f,
                        dq, ld, hs, NH, stream));
    FSDP_TRY(heads_gemm(true, false, T, hs, T, (const bf16 *)ds, T, tt, q, ld, hs, 1.0f, 1.0f,
                        dk, ld, hs, NH, stream));
  }
  return FSDP_SUCCESS;
}

/* ---- the table's entry points: fp32 keeps probabilities, bf16 the
 * log-sum-exp (tensor cores, recomputing the probabilities in backward) ---- */

size_t fsdp_cuda_attention_state_floats(fsdp_dtype_t dt, int B, int T, int NH) {
  const size_t bnt = (size_t)B * (size_t)NH * (size_t)T;
  return dt == FSDP_BF16 ? bnt : bnt * (size_t)T;
}

size_t fsdp_cuda_attention_scratch_bytes(fsdp_dtype_t dt, int T, int NH) {
  return dt == FSDP_BF16 ? lse_scratch_bytes(T, NH)
                         : (size_t)NH * (size_t)T * (size_t)T * sizeof(float);
}

fsdp_status_t fsdp_cuda_attention_forward(fsdp_dtype_t dt, void *out, float *att, void *scratch,
                                          const void *qkv, int B, int T, int C, int NH,
                                          fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("attention_forward", dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    if constexpr (std::is_same<S, bf16>::value)
      return lse_forward(as<S>(out), att, scratch, as<S>(qkv), B, T, C, NH, s);
    else
      return probs_forward(as<S>(out), att, as<S>(qkv), B, T, C, NH, s);
  });
}

fsdp_status_t fsdp_cuda_attention_backward(fsdp_dtype_t dt, void *dqkv, void *scratch,
                                           const void *dout, const void *qkv, const float *att,
                                           int B, int T, int C, int NH, fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("attention_backward", dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    if constexpr (std::is_same<S, bf16>::value)
      return lse_backward(as<S>(dqkv), scratch, as<S>(dout), as<S>(qkv), att, B, T, C, NH, s);
    else
      return probs_backward(as<S>(dqkv), static_cast<float *>(scratch), as<S>(dout), as<S>(qkv),
                            att, B, T, C, NH, s);
  });
}
