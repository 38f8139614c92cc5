/* src/backend/cpu/llama_layers.c — the CPU fp32 kernels of the Llama family's
 * decoder layer: RMSNorm, rotary position embedding (HF's rotate-half
 * convention) and SwiGLU, forward and backward (backend/cpu/llama_layers.h).
 * Grouped-query attention is in layers.c with multi-head attention. */
#include <math.h>
#include <stddef.h>

#include "backend/cpu/llama_layers.h"

/* ---- RMSNorm ---- */

/* Sum of squares in double over 8 interleaved partial sums (as LayerNorm's
 * statistics in layers.c): the error does not grow with C. */
static double row_sum_sq(const float *x, int C) {
  double acc[8] = {0};
  int c = 0;
  for (; c + 8 <= C; c += 8)
    for (int k = 0; k < 8; ++k) acc[k] += (double)x[c + k] * x[c + k];
  for (; c < C; ++c) acc[0] += (double)x[c] * x[c];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

void nn_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                        int C, float eps) {
  if (N <= 0 || C <= 0) return;
  for (int i = 0; i < N; ++i) {
    const float *x = inp + (size_t)i * C;
    float *o = out + (size_t)i * C;
    /* HF's order: the fp32 mean of squares plus eps, its reciprocal root,
     * x times that, then the weight */
    const float ms = (float)(row_sum_sq(x, C) / C);
    const float r = 1.0f / sqrtf(ms + eps);
    for (int c = 0; c < C; ++c) o[c] = weight[c] * (x[c] * r);
    rstd[i] = r;
  }
}

void nn_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                         const float *weight, const float *rstd, int N, int C) {
  if (N <= 0 || C <= 0) return;
  for (int i = 0; i < N; ++i) {
    const float *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
    const float r = rstd[i];
    /* y = w x r with r = (mean(x^2) + eps)^-1/2: dx = r (g - x r^2 mean(g x)),
     * g = w dy */
    double gx = 0.0;
    for (int c = 0; c < C; ++c) {
      const float g = weight[c] * dy[c];
      gx += (double)g * x[c];
      dweight[c] += x[c] * r * dy[c];
    }
    const float k = (float)(gx / C) * r * r;
    float *dx = dinp + (size_t)i * C;
    for (int c = 0; c < C; ++c) dx[c] += r * (weight[c] * dy[c] - x[c] * k);
  }
}

/* ---- rotary position embedding ---- */

void nn_rope(float *qkv, const float *inv_freq, int B, int T, int NH, int NKV, int D, int pos0,
             int inverse) {
  if (B <= 0 || T <= 0 || NH <= 0 || D < 2) return;
  if (NKV <= 0) NKV = NH;
  const int half = D / 2, heads = NH + NKV; /* q's heads then k's, contiguous */
  const size_t ld = (size_t)(NH + 2 * NKV) * D;
  for (int t = 0; t < T; ++t) {
    const float p = (float)(pos0 + t);
    for (int i = 0; i < half; ++i) {
      const float angle = p * inv_freq[i];
      const float c = cosf(angle), s = inverse ? -sinf(angle) : sinf(angle);
      for (int b = 0; b < B; ++b) {
        float *row = qkv + ((size_t)b * T + t) * ld;
        for (int h = 0; h < heads; ++h) {
          float *x = row + (size_t)h * D;
          const float x0 = x[i], x1 = x[i + half];
          x[i] = x0 * c - x1 * s;
          x[i + half] = x1 * c + x0 * s;
        }
      }
    }
  }
}

/* ---- SwiGLU ---- */

void nn_swiglu_forward(float *out, const float *inp, int N, int F) {
  if (N <= 0 || F <= 0) return;
  for (int i = 0; i < N; ++i) {
    const float *g = inp + (size_t)i * 2 * F, *u = g + F;
    float *o = out + (size_t)i * F;
    for (int j = 0; j < F; ++j) o[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
  }
}

void nn_swiglu_backward(float *dinp, const float *dout, const float *inp, int N, int F) {
  if (N <= 0 || F <= 0) return;
  for (int i = 0; i < N; ++i) {
    const float *g = inp + (size_t)i * 2 * F, *u = g + F, *dy = dout + (size_t)i * F;
    float *dg = dinp + (size_t)i * 2 * F, *du = dg + F;
    for (int j = 0; j < F; ++j) {
      /* silu'(g) = s (1 + g (1 - s)), s = sigmoid(g); both finite at any g */
      const float s = 1.0f / (1.0f + expf(-g[j]));
      dg[j] = dy[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
      du[j] = dy[j] * g[j] * s;
    }
  }
}
