/* src/backend/cuda/attention.cu — causal self-attention, forward and
 * backward, behind the table's one entry point per op: fp32 keeps the
 * probabilities, bf16 is cuDNN's fused attention where it runs the shape
 * (attention_cudnn.cpp, chosen in attention_choice.cu), else the fused flash
 * kernel (flash.cu: FlashAttention-2 on mma.sync, multi-head and
 * grouped-query); both keep only the log-sum-exp. fp32:
 * the score and value products of each batch row are strided-batched cuBLAS
 * calls over its heads (the heads of a row are hs columns apart; batch rows
 * are not a uniform stride away from them, hence calls per b; one per
 * query head of a KV group with grouped-query attention, see struct gqa);
 * softmax and its backward are warp-per-row kernels. The
 * full (T,T) score block is computed, the masked upper triangle included, and
 * the softmax writes it as 0, as the CPU's att holds. */
#include "backend/cuda/attention_cudnn.h"
#include "backend/cuda/cuda_internal.cuh"

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

/* The KV heads of a shape (NKV 0 means NH), checked: NH heads dividing C,
 * NKV dividing NH. */
static fsdp_status_t kv_heads(int C, int NH, int NKV, int *nkv) {
  *nkv = NKV == 0 ? NH : NKV;
  if (NH <= 0 || C % NH != 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "attention: C %d is not a multiple of the %d heads", C, NH);
  if (*nkv < 0 || NH % *nkv != 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "attention: NKV %d key/value heads do not "
                      "divide the NH %d query heads", NKV, NH);
  return FSDP_SUCCESS;
}

static unsigned softmax_blocks(size_t n_rows) { return fsdp_grid(n_rows, ATT_WARPS); }

/* Grouped-query heads as strided batches: query head h = g*G + j (G = NH /
 * NKV) reads KV head g, so for each j the heads j, G + j, ... are one batch
 * of NKV, G*hs columns (G (T,T) blocks) apart, against the NKV KV heads hs
 * columns apart: G calls per batch row (one with NKV = NH, as plain
 * multi-head attention). No call writes one KV head's gradient twice, so
 * dk and dv accumulate over j with beta = 1. */
struct gqa {
  int hs, G, NKV, ld; /* head size, query heads per KV head, KV heads, row length */
  size_t kc, vc;      /* columns of the first k and v head */
};

static gqa gqa_of(int C, int NH, int NKV) {
  const int hs = C / NH;
  return {hs, NH / NKV, NKV, (NH + 2 * NKV) * hs, (size_t)NH * hs, (size_t)(NH + NKV) * hs};
}

/* fp32: the (B,NH,T,T) probabilities kept in att. */
static fsdp_status_t probs_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                                   int NH, int NKV, cudaStream_t stream) {
  if (B <= 0 || T <= 0 || C <= 0 || NH <= 0) return FSDP_SUCCESS;
  FSDP_TRY(kv_heads(C, NH, NKV, &NKV));
  const gqa g = gqa_of(C, NH, NKV);
  const int hs = g.hs, ld = g.ld;
  const float scale = 1.0f / sqrtf((float)hs);
  const long long tt = (long long)T * T, gtt = g.G * tt, ghs = (long long)g.G * hs;
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < g.G; ++j) {
      const float *row = qkv + (size_t)b * T * ld, *q = row + (size_t)j * hs, *k = row + g.kc;
      float *a = att + ((size_t)b * NH + j) * tt;
      /* a (T,T) = scale * q @ k^T, per head */
      FSDP_TRY(heads_gemm(false, true, T, T, hs, q, ld, ghs, k, ld, hs, scale, 0.0f, a, T, gtt,
                          NKV, stream));
    }
  const size_t rows = (size_t)B * NH * T;
  FSDP_LAUNCH(causal_softmax_kernel, softmax_blocks(rows), ATT_WARPS * 32, 0, stream, att, rows, T);
  LAUNCH_CHECK();
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < g.G; ++j) {
      const float *v = qkv + (size_t)b * T * ld + g.vc, *a = att + ((size_t)b * NH + j) * tt;
      /* out (T,hs) = a (T,T) @ v (T,hs), per head; a is 0 past the diagonal */
      FSDP_TRY(heads_gemm(false, false, T, hs, T, a, T, gtt, v, ld, hs, 1.0f, 0.0f,
                          out + (size_t)b * T * C + (size_t)j * hs, C, ghs, NKV, stream));
    }
  return FSDP_SUCCESS;
}

/* scratch: (NH,T,T) floats, one batch row's dscore at a time. dqkv is
 * zeroed, then the products add into it: the group's query heads into their
 * KV head's dk and dv one call after another (stream order), never in one
 * batch. */
static fsdp_status_t probs_backward(float *dqkv, float *scratch, const float *dout,
                                    const float *qkv, const float *att, int B, int T, int C,
                                    int NH, int NKV, cudaStream_t stream) {
  if (B <= 0 || T <= 0 || C <= 0 || NH <= 0) return FSDP_SUCCESS;
  FSDP_TRY(kv_heads(C, NH, NKV, &NKV));
  const gqa g = gqa_of(C, NH, NKV);
  const int hs = g.hs, ld = g.ld;
  const float scale = 1.0f / sqrtf((float)hs);
  const long long tt = (long long)T * T, gtt = g.G * tt, ghs = (long long)g.G * hs;
  const size_t rows = (size_t)NH * T;
  CUDA_CHECK(cudaMemsetAsync(dqkv, 0, (size_t)B * T * ld * sizeof *dqkv, stream));
  for (int b = 0; b < B; ++b) {
    const size_t off = (size_t)b * T * ld;
    const float *q = qkv + off, *k = q + g.kc, *v = q + g.vc;
    float *dq = dqkv + off, *dk = dq + g.kc, *dv = dq + g.vc;
    const float *a = att + (size_t)b * NH * tt, *dy = dout + (size_t)b * T * C;
    for (int j = 0; j < g.G; ++j) {
      const size_t hj = (size_t)j * hs;
      /* dv += a^T @ dout */
      FSDP_TRY(heads_gemm(true, false, T, hs, T, a + j * tt, T, gtt, dy + hj, C, ghs, 1.0f, 1.0f,
                          dv, ld, hs, NKV, stream));
      /* scratch (T,T) = dout @ v^T */
      FSDP_TRY(heads_gemm(false, true, T, T, hs, dy + hj, C, ghs, v, ld, hs, 1.0f, 0.0f,
                          scratch + j * tt, T, gtt, NKV, stream));
    }
    FSDP_LAUNCH(causal_softmax_backward_kernel, softmax_blocks(rows), ATT_WARPS * 32, 0, stream,
                scratch, att + (size_t)b * NH * tt, rows, T, scale);
    LAUNCH_CHECK();
    for (int j = 0; j < g.G; ++j) {
      const size_t hj = (size_t)j * hs;
      /* dq += dscore @ k;  dk += dscore^T @ q */
      FSDP_TRY(heads_gemm(false, false, T, hs, T, scratch + j * tt, T, gtt, k, ld, hs, 1.0f, 1.0f,
                          dq + hj, ld, ghs, NKV, stream));
      FSDP_TRY(heads_gemm(true, false, T, hs, T, scratch + j * tt, T, gtt, q + hj, ld, ghs, 1.0f,
                          1.0f, dk, ld, hs, NKV, stream));
    }
  }
  return FSDP_SUCCESS;
}

size_t fsdp_cuda_attention_state_floats(const fsdp_attention_forward_args_t *a) {
  const size_t bnt = (size_t)a->B * (size_t)a->NH * (size_t)a->T;
  return a->dt == FSDP_BF16 ? bnt : bnt * (size_t)a->T;
}

/* bf16: the flash backward's D = rowsum(dout * out), (B,NH,T) floats. */
size_t fsdp_cuda_attention_scratch_bytes(const fsdp_attention_forward_args_t *a) {
  const size_t nt = (size_t)a->NH * (size_t)a->T;
  return (a->dt == FSDP_BF16 ? (size_t)a->B : (size_t)a->T) * nt * sizeof(float);
}

/* Forward needs no scratch in either precision. */
fsdp_status_t fsdp_cuda_attention_forward(const fsdp_attention_forward_args_t *a,
                                          fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("attention_forward", a->dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    if constexpr (std::is_same<S, bf16>::value) {
      int cudnn = 0; /* cuDNN's fused attention where it runs the shape (attention_choice.cu) */
      FSDP_TRY(fsdp_cuda_attention_pick(a->B, a->T, a->C, a->NH, a->NKV, &cudnn));
      if (cudnn)
        return fsdp_cudnn_attention_forward(a->out, a->att, a->qkv, a->B, a->T, a->C, a->NH,
                                            a->NKV, s);
      return fsdp_cuda_flash_forward(as<S>(a->out), a->att, as<S>(a->qkv), a->B, a->T, a->C,
                                     a->NH, a->NKV, s);
    } else
      return probs_forward(as<S>(a->out), a->att, as<S>(a->qkv), a->B, a->T, a->C, a->NH,
                           a->NKV, s);
  });
}

fsdp_status_t fsdp_cuda_attention_backward(const fsdp_attention_backward_args_t *a,
                                           fsdp_stream_t stream) {
  return fsdp_cuda_dispatch("attention_backward", a->dt, stream, [&](auto *tag, cudaStream_t s) {
    STORAGE(tag);
    if constexpr (std::is_same<S, bf16>::value) {
      int cudnn = 0; /* as forward chose, so att holds the stats this path wrote */
      FSDP_TRY(fsdp_cuda_attention_pick(a->B, a->T, a->C, a->NH, a->NKV, &cudnn));
      if (cudnn)
        return fsdp_cudnn_attention_backward(a->dqkv, a->dout, a->qkv, a->out, a->att, a->B,
                                             a->T, a->C, a->NH, a->NKV, s);
      return fsdp_cuda_flash_backward(as<S>(a->dqkv), static_cast<float *>(a->scratch),
                                      as<S>(a->dout), as<S>(a->qkv), as<S>(a->out), a->att, a->B,
                                      a->T, a->C, a->NH, a->NKV, s);
    } else
      return probs_backward(as<S>(a->dqkv), static_cast<float *>(a->scratch), as<S>(a->dout),
                            as<S>(a->qkv), a->att, a->B, a->T, a->C, a->NH, a->NKV, s);
  });
}
