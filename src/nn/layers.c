/* src/nn/layers.c — CPU fp32 layer kernels: linear and conv1d (OpenBLAS sgemm;
 * weights (OC,C) and (C,OC)), ReLU and softmax cross-entropy. Backward kernels
 * accumulate into their outputs. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "fsdp/nn.h"

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

/* Loss of one row; writes (softmax - onehot) * scale into drow when not NULL.
 * A target outside [0, V) has no defined loss: the row yields NaN (and a NaN
 * gradient row) so the bad label cannot train silently; callers that own the
 * labels (fsdp_mlp_*) reject them up front with a proper error. */
static double xent_row(float *drow, const float *row, int target, int V, float scale) {
  if (target < 0 || target >= V) {
    if (drow)
      for (int j = 0; j < V; ++j) drow[j] = NAN;
    return NAN;
  }
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
  return (double)maxv + log(sum) - (double)row[target];
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
