/* src/backend/cpu/layers.c — the CPU fp32 layer kernels: linear and conv1d (OpenBLAS
 * sgemm; weights (OC,C) and (C,OC)), LayerNorm, token (+ position) embedding,
 * causal multi-head or grouped-query attention (sgemm on row blocks;
 * backend/cpu/llama_layers.h), the residual add, ReLU and
 * softmax cross-entropy, and GPT-2's vocabulary head with a padded row stride
 * (backend/cpu/head.h) (GELU is in gelu.c, built with fast math). Backward kernels
 * accumulate into their outputs. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "fsdp/nn.h"
#include "backend/cpu/head.h"
#include "backend/cpu/llama_layers.h"

static void add_bias(float *out, const float *bias, int B, int OC) {
  if (!bias) return;
  for (int b = 0; b < B; ++b) {
    float *row = out + (size_t)b * OC;
    for (int o = 0; o < OC; ++o) row[o] += bias[o];
  }
}

/* Row-outer order keeps the inner loop contiguous for vectorisation. */
static void sum_rows(float *dbias, const float *dout, int B, int OC) {
  if (!dbias) return;
  for (int b = 0; b < B; ++b) {
    const float *row = dout + (size_t)b * OC;
    for (int o = 0; o < OC; ++o) dbias[o] += row[o];
  }
}

/* out = inp @ op(weight) + bias; op transposes a (OC,C) weight. */
static void matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                           int B, int C, int OC, int weight_out_in) {
  if (B <= 0 || OC <= 0) return;
  /* BLAS rejects a leading dimension of 0, so an empty reduction is spelled out. */
  if (C <= 0)
    memset(out, 0, (size_t)B * (size_t)OC * sizeof(float));
  else if (weight_out_in)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, OC, C, 1.0f, inp, C, weight, C,
                0.0f, out, OC);
  else
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, OC, C, 1.0f, inp, C, weight, OC,
                0.0f, out, OC);
  add_bias(out, bias, B, OC);
}

void fsdp_linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                         int B, int C, int OC) {
  matmul_forward(out, inp, weight, bias, B, C, OC, 1);
}

void fsdp_conv1d_forward(float *out, const float *inp, const float *weight, const float *bias,
                         int B, int C, int OC) {
  matmul_forward(out, inp, weight, bias, B, C, OC, 0);
}

void fsdp_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int B, int C, int OC) {
  if (B <= 0 || OC <= 0) return;
  if (C > 0) {
    if (dinp)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, C, OC, 1.0f, dout, OC, weight,
                  C, 1.0f, dinp, C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, B, 1.0f, dout, OC, inp, C,
                1.0f, dweight, C);
  }
  sum_rows(dbias, dout, B, OC);
}

void nn_head_forward(float *logits, int ld, const float *inp, const float *wte, int B, int C,
                     int V) {
  if (B <= 0 || V <= 0) return;
  if (C <= 0) {
    for (int b = 0; b < B; ++b) memset(logits + (size_t)b * ld, 0, (size_t)V * sizeof(float));
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, V, C, 1.0f, inp, C, wte, C, 0.0f,
              logits, ld);
}

void nn_head_backward(float *dinp, float *dwte, const float *dlogits, int ld, const float *inp,
                      const float *wte, int B, int C, int V) {
  if (B <= 0 || V <= 0 || C <= 0) return;
  if (dinp)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, C, V, 1.0f, dlogits, ld, wte, C,
                1.0f, dinp, C);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, B, 1.0f, dlogits, ld, inp, C, 1.0f,
              dwte, C);
}

void fsdp_conv1d_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int B, int C, int OC) {
  if (B <= 0 || OC <= 0) return;
  if (C > 0) {
    if (dinp)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, C, OC, 1.0f, dout, OC, weight,
                  OC, 1.0f, dinp, C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, B, 1.0f, inp, C, dout, OC,
                1.0f, dweight, OC);
  }
  sum_rows(dbias, dout, B, OC);
}

void fsdp_relu_forward(float *out, const float *inp, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

void fsdp_relu_backward(float *dinp, const float *out, const float *dout, size_t n) {
  /* dout is loaded unconditionally so that the select if-converts and vectorises. */
  for (size_t i = 0; i < n; ++i) {
    const float d = dout[i];
    dinp[i] += out[i] > 0.0f ? d : 0.0f;
  }
}

/* Loss of one row; writes (softmax - onehot) * scale into drow when not NULL
 * (drow may be row itself: the row's target logit is read first).
 * A target outside [0, V) has no defined loss: the row yields NaN (and a NaN
 * gradient row) so the bad label cannot train silently; callers that own the
 * labels (fsdp_mlp_*) reject them up front with a proper error. */
static double xent_row(float *drow, const float *row, int target, int V, float scale) {
  if (target < 0 || target >= V) {
    if (drow)
      for (int j = 0; j < V; ++j) drow[j] = NAN;
    return NAN;
  }
  const double at_target = (double)row[target];
  float maxv = row[0];
  for (int j = 1; j < V; ++j) maxv = row[j] > maxv ? row[j] : maxv;
  double sum = 0.0;
  for (int j = 0; j < V; ++j) {
    float e = expf(row[j] - maxv);
    if (drow) drow[j] = e;
    sum += e;
  }
  if (drow) {
    const float k = (float)(scale / sum);
    for (int j = 0; j < V; ++j) drow[j] *= k;
    drow[target] -= scale;
  }
  return (double)maxv + log(sum) - at_target;
}

double fsdp_softmax_xent(float *dlogits, const float *logits, const int *targets, int B, int V,
                         float scale) {
  if (B <= 0 || V <= 0) return 0.0;
  double loss = 0.0;
  for (int b = 0; b < B; ++b) {
    const size_t off = (size_t)b * (size_t)V;
    loss += xent_row(dlogits ? dlogits + off : NULL, logits + off, targets[b], V, scale);
  }
  return loss;
}

double nn_xent_inplace(float *logits, int ld, double *losses, const int *targets, int B, int V,
                       float scale, int grad) {
  if (B <= 0 || V <= 0) return 0.0;
  double loss = 0.0;
  for (int b = 0; b < B; ++b) {
    float *row = logits + (size_t)b * (size_t)ld;
    const double l = xent_row(grad ? row : NULL, row, targets[b], V, scale);
    if (losses) losses[b] = l;
    loss += l;
  }
  return loss;
}

/* ---- the transformer block: LayerNorm, embedding, attention, residual ---- */

/* ---- LayerNorm ---- */

#define LN_EPS 1e-5f

/* Row sums in double over 8 interleaved partial sums: the rounding error does
 * not grow with C, and the independent chains keep the adds pipelined. */
static double row_sum(const float *x, int C) {
  double acc[8] = {0};
  int c = 0;
  for (; c + 8 <= C; c += 8)
    for (int k = 0; k < 8; ++k) acc[k] += x[c + k];
  for (; c < C; ++c) acc[0] += x[c];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static double row_sq_dev(const float *x, float m, int C) {
  double acc[8] = {0};
  int c = 0;
  for (; c + 8 <= C; c += 8)
    for (int k = 0; k < 8; ++k) {
      const double d = (double)x[c + k] - m;
      acc[k] += d * d;
    }
  for (; c < C; ++c) {
    const double d = (double)x[c] - m;
    acc[0] += d * d;
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

void fsdp_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C) {
  if (N <= 0 || C <= 0) return;
  for (int i = 0; i < N; ++i) {
    const float *x = inp + (size_t)i * C;
    float *o = out + (size_t)i * C;
    /* Two passes (mean, then squared deviations): no cancellation when the
     * mean is large next to the spread. */
    const float m = (float)(row_sum(x, C) / C);
    const float s = (float)(1.0 / sqrt(row_sq_dev(x, m, C) / C + LN_EPS));
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[i] = m;
    rstd[i] = s;
  }
}

void fsdp_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C) {
  if (N <= 0 || C <= 0) return;
  for (int i = 0; i < N; ++i) {
    const float *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
    const float m = mean[i], s = rstd[i];
    /* dinp = s * (g - mean(g) - xhat * mean(g * xhat)) with g = weight * dout. */
    double g_sum = 0.0, gx_sum = 0.0;
    for (int c = 0; c < C; ++c) {
      const float xhat = (x[c] - m) * s, g = weight[c] * dy[c];
      g_sum += g;
      gx_sum += (double)g * xhat;
      dbias[c] += dy[c];
      dweight[c] += xhat * dy[c];
    }
    if (!dinp) continue;
    const float g_mean = (float)(g_sum / C), gx_mean = (float)(gx_sum / C);
    float *dx = dinp + (size_t)i * C;
    for (int c = 0; c < C; ++c) {
      const float xhat = (x[c] - m) * s;
      dx[c] += s * (weight[c] * dy[c] - g_mean - xhat * gx_mean);
    }
  }
}

/* ---- embedding ---- */

void fsdp_embedding_forward(float *out, const int *tokens, const float *wte, const float *wpe,
                            int B, int T, int C) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const size_t bt = (size_t)b * T + t;
      const float *te = wte + (size_t)tokens[bt] * C;
      float *o = out + bt * C;
      if (!wpe) {
        memcpy(o, te, (size_t)C * sizeof(float));
        continue;
      }
      const float *pe = wpe + (size_t)t * C;
      for (int c = 0; c < C; ++c) o[c] = te[c] + pe[c];
    }
}

void fsdp_embedding_backward(float *dwte, float *dwpe, const float *dout, const int *tokens,
                             int B, int T, int C) {
  if (B <= 0 || T <= 0 || C <= 0) return;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const size_t bt = (size_t)b * T + t;
      const float *d = dout + bt * C;
      float *dte = dwte + (size_t)tokens[bt] * C;
      for (int c = 0; c < C; ++c) dte[c] += d[c];
      if (!dwpe) continue;
      float *dpe = dwpe + (size_t)t * C;
      for (int c = 0; c < C; ++c) dpe[c] += d[c];
    }
}

/* ---- attention ---- */

/* Per (b, h) head the score and value products are sgemms: at B=8, T=128,
 * C=256, NH=4 forward + backward take 4.3 ms against 17 ms for llm.c-style
 * loops (one core). Rows are processed in blocks so that the sgemms skip most
 * of the masked upper triangle: a block of rows [r0, r1) only sees keys
 * [0, r1). Blocks of 16 to 128 rows time the same; 32 it is. */
#define ATT_FWD_ROWS 32

/* Softmax of row[0..t] in place, zeros in row[t+1..T). */
static void causal_softmax_row(float *row, int t, int T) {
  /* The max runs over 8 interleaved lanes (vectorised): a single serial chain
   * of maxss was 10% of the forward at T = 128. */
  float lane[8];
  for (int k = 0; k < 8; ++k) lane[k] = row[0];
  int j = 0;
  for (; j + 8 <= t + 1; j += 8)
    for (int k = 0; k < 8; ++k) lane[k] = row[j + k] > lane[k] ? row[j + k] : lane[k];
  float maxv = lane[0];
  for (int k = 1; k < 8; ++k) maxv = lane[k] > maxv ? lane[k] : maxv;
  for (; j <= t; ++j) maxv = row[j] > maxv ? row[j] : maxv;
  float sum = 0.0f;
  for (j = 0; j <= t; ++j) {
    row[j] = expf(row[j] - maxv);
    sum += row[j];
  }
  const float inv = 1.0f / sum;
  for (j = 0; j <= t; ++j) row[j] *= inv;
  for (j = t + 1; j < T; ++j) row[j] = 0.0f;
}

/* One (b, h): q, k, v and out point at the head's first column; qkv rows
 * are ld floats apart ((NH+2*NKV)*hs: 3C without grouping), out rows C. att
 * is the head's (T, T) block. */
static void attention_head_forward(float *out, float *att, const float *q, const float *k,
                                   const float *v, int T, int C, int ld, int hs, float scale) {
  for (int r0 = 0; r0 < T; r0 += ATT_FWD_ROWS) {
    const int r1 = r0 + ATT_FWD_ROWS < T ? r0 + ATT_FWD_ROWS : T, nr = r1 - r0;
    float *a = att + (size_t)r0 * T;
    /* a[:, 0:r1] = scale * q[r0:r1] @ k[0:r1]^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, r1, hs, scale,
                q + (size_t)r0 * ld, ld, k, ld, 0.0f, a, T);
    for (int t = r0; t < r1; ++t) causal_softmax_row(att + (size_t)t * T, t, T);
    /* out[r0:r1] = a[:, 0:r1] @ v[0:r1]; a is 0 past each row's diagonal. */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, hs, r1, 1.0f, a, T, v, ld,
                0.0f, out + (size_t)r0 * C, C);
  }
}

void nn_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                          int NKV) {
  if (B <= 0 || T <= 0 || C <= 0 || NH <= 0) return;
  if (NKV <= 0) NKV = NH;
  const int hs = C / NH, ld = (NH + 2 * NKV) * hs, group = NH / NKV;
  const float scale = 1.0f / sqrtf((float)hs);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const float *row = qkv + (size_t)b * T * ld;
      const float *k = row + (size_t)(NH + h / group) * hs;
      attention_head_forward(out + (size_t)b * T * C + (size_t)h * hs,
                             att + ((size_t)b * NH + h) * T * T, row + (size_t)h * hs, k,
                             k + (size_t)NKV * hs, T, C, ld, hs, scale);
    }
}

void fsdp_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                            int NH) {
  nn_attention_forward(out, att, qkv, B, T, C, NH, NH);
}

/* Backward of one (b, h), same layout as the forward plus dq/dk/dv (rows ld
 * apart) and dout (rows C apart); dk and dv are added to, so the query heads
 * of a group sum into their shared KV head. The gradient of the pre-softmax
 * scores of a row block lives in a stack scratch of FSDP_ATTENTION_MAX_T
 * floats, so a block holds MAX_T / T rows: the whole head at T <= 64, one row
 * at 4096. */
static void attention_head_backward(float *dq, float *dk, float *dv, const float *dout,
                                    const float *q, const float *k, const float *v,
                                    const float *att, int T, int C, int ld, int hs, float scale) {
  float datt[FSDP_ATTENTION_MAX_T];
  const int rows = FSDP_ATTENTION_MAX_T / T;
  for (int r0 = 0; r0 < T; r0 += rows) {
    const int r1 = r0 + rows < T ? r0 + rows : T, nr = r1 - r0;
    const float *a = att + (size_t)r0 * T, *dy = dout + (size_t)r0 * C;
    /* dv[0:r1] += a[:, 0:r1]^T @ dout[r0:r1] */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, hs, nr, 1.0f, a, T, dy, C, 1.0f,
                dv, ld);
    /* datt (nr, r1) = dout[r0:r1] @ v[0:r1]^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, r1, hs, 1.0f, dy, C, v, ld, 0.0f,
                datt, r1);
    /* Softmax backward in place: dscore = scale * p * (datt - sum(p * datt)). */
    for (int i = 0; i < nr; ++i) {
      const int t = r0 + i;
      const float *p = a + (size_t)i * T;
      float *d = datt + (size_t)i * r1;
      float dot = 0.0f;
      for (int j = 0; j <= t; ++j) dot += p[j] * d[j];
      for (int j = 0; j <= t; ++j) d[j] = scale * p[j] * (d[j] - dot);
      for (int j = t + 1; j < r1; ++j) d[j] = 0.0f;
    }
    /* dq[r0:r1] += dscore @ k[0:r1];  dk[0:r1] += dscore^T @ q[r0:r1] */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, hs, r1, 1.0f, datt, r1, k, ld,
                1.0f, dq + (size_t)r0 * ld, ld);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, hs, nr, 1.0f, datt, r1,
                q + (size_t)r0 * ld, ld, 1.0f, dk, ld);
  }
}

void nn_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                           int B, int T, int C, int NH, int NKV) {
  if (B <= 0 || T <= 0 || C <= 0 || NH <= 0) return;
  if (NKV <= 0) NKV = NH;
  const int hs = C / NH, ld = (NH + 2 * NKV) * hs, group = NH / NKV;
  if (T > FSDP_ATTENTION_MAX_T) {
    /* Past the scratch: poison the gradient rather than train on a wrong one. */
    const size_t n = (size_t)B * T * ld;
    for (size_t i = 0; i < n; ++i) dqkv[i] = NAN;
    return;
  }
  const float scale = 1.0f / sqrtf((float)hs);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const size_t row = (size_t)b * T * ld, kv = (size_t)(NH + h / group) * hs;
      const float *q = qkv + row + (size_t)h * hs, *k = qkv + row + kv;
      float *dq = dqkv + row + (size_t)h * hs, *dk = dqkv + row + kv;
      attention_head_backward(dq, dk, dk + (size_t)NKV * hs,
                              dout + (size_t)b * T * C + (size_t)h * hs, q, k,
                              k + (size_t)NKV * hs, att + ((size_t)b * NH + h) * T * T, T, C,
                              ld, hs, scale);
    }
}

void fsdp_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                             int B, int T, int C, int NH) {
  nn_attention_backward(dqkv, dout, qkv, att, B, T, C, NH, NH);
}

/* ---- residual ---- */

void fsdp_residual_forward(float *out, const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void fsdp_residual_backward(float *da, float *db, const float *dout, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}
