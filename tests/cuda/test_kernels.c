/* tests/cuda/test_kernels.c — every CUDA kernel of src/backend/cuda/kernels.h (the
 * compute table's entry points at both dtypes, and the shard kernels) against
 * its CPU reference (fsdp/nn.h, fsdp/optim.h, fsdp_f32_to_bf16 and the
 * engine's shard loops) on fresh random inputs: fp32 within 1e-5 relative,
 * bf16 within 1e-2, casts bit for bit. Prints a table (kernel, max relative
 * error, tolerance, pass) at the end, and writes it to $FSDP_CUDA_REPORT when
 * set. The seed comes from $FSDP_TEST_SEED, else the clock, and is printed.
 * Without a usable GPU it says why and exits 77 (skipped). CK_FORK=no: a
 * forked child cannot use its parent's CUDA context. */
#include <check.h>
#include <cuda_runtime_api.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/arrays.h"
#include "common/gqa.h"
#include "common/rng.h"
#include "backend/cuda/attention_cudnn.h"
#include "backend/cuda/kernels.h"
#include "cuda_gate.h"
#include "backend/compute.h"
#include "fsdp/nn.h"
#include "backend/cpu/head.h"
#include "backend/cpu/llama_layers.h"
#include "fsdp/optim.h"

#define LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* The issue's bounds. bf16 outputs are rounded once (2^-9 relative) from fp32
 * math on the same bf16-rounded inputs the CPU sees, so 1e-2 leaves 5x room.
 * The sum of squares accumulates in double on both sides, in different
 * orders: about sqrt(n) ulps apart (1e-12 at n = 1e7), at most n ulps (1e-9);
 * an accumulation in float would be 1e-7 or more off. */
#define TOL_F32 1e-5
#define TOL_BF16 1e-2
/* The fused products' bf16 forward rounds twice where the product + pass runs
 * (the product as stored, then with the bias; blas.cu says where; cuBLASLt's
 * epilogue rounds once): a different fp32 summation order can move
 * the first rounding by one bf16 ulp, up to 2^-7 relative, before the second
 * half-ulp, so 1e-2 would leave no room. */
#define TOL_BF16_TWICE 2e-2
#define TOL_SUMSQ 1e-9
#define TOL_EXACT 0.0

static fsdp_stream_t fs; /* an fsdp CUDA stream: what the table's entry points take */
static cudaStream_t stream; /* its cudaStream_t: the test's copies and the shard kernels */
static unsigned long long seed;

/* ---- the result table: one row per kernel, the worst case over its cases ---- */

static const char *const kKernels[] = {
    "matmul_forward", "matmul_backward", "matmul_forward_bf16", "matmul_backward_bf16",
    "ln_fused_forward", "ln_fused_backward", "ln_fused_forward_bf16", "ln_fused_backward_bf16",
    "ln_backward_bits", "ln_backward_bits_bf16",
    "embedding_forward", "embedding_backward",
    "embedding_forward_bf16", "embedding_backward_bf16",
    "rmsnorm_forward", "rmsnorm_backward", "rmsnorm_forward_bf16", "rmsnorm_backward_bf16",
    "rope_forward", "rope_backward", "rope_forward_bf16", "rope_backward_bf16",
    "swiglu_forward", "swiglu_backward", "swiglu_forward_bf16", "swiglu_backward_bf16",
    "llama_refusals", "attention_forward",
    "attention_backward", "attention_forward_gqa", "attention_backward_gqa",
    "attention_forward_bf16", "attention_backward_bf16",
    "attention_forward_cudnn", "attention_backward_cudnn", "attention_forward_cudnn_gqa",
    "attention_backward_cudnn_gqa", "attention_gqa_refusals", "attention_choice",
    "product_choice",
    "xent", "xent_bf16", "head_forward", "head_backward",
    "head_forward_bf16", "head_backward_bf16", "xent_inplace", "xent_inplace_bf16",
    "adamw_update", "sgd_update",
    "sum_squares", "scale", "axpy", "axpy_bf16", "table_refusals", "f32_to_bf16", "bf16_to_f32",
    "f32_to_f16", "f16_to_f32"};

static struct {
  double err, tol;
  int cases, failed;
  char skipped[200]; /* why the row could not run here (not a failure) */
} table[LEN(kKernels)];

static int kernel_row(const char *kernel) {
  for (int i = 0; i < LEN(kKernels); ++i)
    if (!strcmp(kKernels[i], kernel)) return i;
  ck_abort_msg("kernel %s is not in the table", kernel);
  return -1;
}

/* Records err for kernel, then fails the test when it exceeds tol (NaN too). */
static void check_err(const char *kernel, const char *what, double err, double tol) {
  const int r = kernel_row(kernel);
  const int ok = err <= tol;
  table[r].tol = tol;
  if (!table[r].cases || !(err <= table[r].err)) table[r].err = err; /* NaN sticks */
  table[r].cases++;
  table[r].failed += !ok;
  ck_assert_msg(ok, "%s: %s: max relative error %.3g above %.3g (FSDP_TEST_SEED=%llu)", kernel,
                what, err, tol, seed);
}

/* A row that cannot run on this machine, and why (printed in the table). */
static void skip_row(const char *kernel, const char *why) {
  snprintf(table[kernel_row(kernel)].skipped, sizeof table[0].skipped, "%s", why);
}

static char device_line[320]; /* the device and the seed, the table's first line */

static void print_table(FILE *f) {
  fprintf(f, "%s\n", device_line);
  fprintf(f, "%-28s %12s %10s  %s\n", "kernel", "max_rel_err", "tolerance", "pass");
  for (int i = 0; i < LEN(kKernels); ++i) {
    char tol[32];
    if (table[i].tol == TOL_EXACT)
      snprintf(tol, sizeof tol, "exact");
    else
      snprintf(tol, sizeof tol, "%.0e", table[i].tol);
    if (!table[i].cases && table[i].skipped[0])
      fprintf(f, "%-28s %12s %10s  SKIPPED: %s\n", kKernels[i], "-", "-", table[i].skipped);
    else if (!table[i].cases)
      fprintf(f, "%-28s %12s %10s  %s\n", kKernels[i], "-", "-", "NOT RUN");
    else
      fprintf(f, "%-28s %12.3g %10s  %s\n", kKernels[i], table[i].err, tol,
              table[i].failed ? "FAIL" : "yes");
  }
}

/* ---- random inputs (common/rng.h) ---- */

/* x rounded to bf16 in place: the CPU then computes on exactly what the GPU reads. */
static float *round_bf16(float *x, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = fsdp_bf16_to_f32(fsdp_f32_to_bf16(x[i]));
  return x;
}

/* ---- device buffers: freed at the start of every test, failed ones too ---- */

#define MAX_DEV 64
static void *dev_bufs[MAX_DEV];
static int n_dev;

static void cu_check(cudaError_t e, const char *expr, int line) {
  ck_assert_msg(e == cudaSuccess, "line %d: %s: %s", line, expr, cudaGetErrorString(e));
}
#define CU(expr) cu_check((expr), #expr, __LINE__)

static void ok_check(fsdp_status_t st, const char *expr, int line) {
  ck_assert_msg(st == FSDP_SUCCESS, "line %d: %s: %s: %s", line, expr, fsdp_status_string(st),
                fsdp_last_error());
}
#define OK(expr) ok_check((expr), #expr, __LINE__)

static void dev_free_all(void) {
  for (int i = 0; i < n_dev; ++i) cudaFree(dev_bufs[i]);
  n_dev = 0;
}

static void *dev_alloc(size_t bytes) {
  ck_assert_int_lt(n_dev, MAX_DEV);
  void *p = NULL;
  CU(cudaMalloc(&p, bytes ? bytes : 1));
  dev_bufs[n_dev++] = p;
  return p;
}

/* Copies go on the test's stream, which does not synchronise with the legacy
 * default stream (cudaStreamNonBlocking): a kernel that ignored its stream
 * argument would race with them and show. */
static void *dev_copy(const void *host, size_t bytes) {
  void *d = dev_alloc(bytes);
  if (bytes) CU(cudaMemcpyAsync(d, host, bytes, cudaMemcpyHostToDevice, stream));
  CU(cudaStreamSynchronize(stream));
  return d;
}

static void host_copy(void *host, const void *dev, size_t bytes) {
  if (bytes) CU(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream));
  CU(cudaStreamSynchronize(stream));
}

static float *dev_f32(const float *x, size_t n) { return dev_copy(x, n * sizeof(float)); }

static uint16_t *dev_bf16(const float *x, size_t n) {
  uint16_t *h = xmalloc(n * sizeof(uint16_t));
  for (size_t i = 0; i < n; ++i) h[i] = fsdp_f32_to_bf16(x[i]);
  uint16_t *d = dev_copy(h, n * sizeof(uint16_t));
  free(h);
  return d;
}

static float *back_f32(const float *d, size_t n) {
  float *h = xmalloc(n * sizeof(float));
  host_copy(h, d, n * sizeof(float));
  return h;
}

static float *back_bf16(const uint16_t *d, size_t n) {
  uint16_t *b = xmalloc(n * sizeof(uint16_t));
  host_copy(b, d, n * sizeof(uint16_t));
  float *h = xmalloc(n * sizeof(float));
  for (size_t i = 0; i < n; ++i) h[i] = fsdp_bf16_to_f32(b[i]);
  free(b);
  return h;
}

/* Activations in the case's dtype: to the device, back to host fp32. */
static fsdp_dtype_t act_dtype(int bf16) { return bf16 ? FSDP_BF16 : FSDP_F32; }
static void *dev_act(int bf16, const float *x, size_t n) {
  return bf16 ? (void *)dev_bf16(x, n) : (void *)dev_f32(x, n);
}
static void *dev_act_alloc(int bf16, size_t n) { return dev_alloc(n * (bf16 ? 2 : 4)); }
static float *back_act(int bf16, const void *d, size_t n) {
  return bf16 ? back_bf16(d, n) : back_f32(d, n);
}

/* Per-row losses (double on the device) as floats, for rel_err. */
static float *back_losses(const double *d, size_t n) {
  double *h = xmalloc(n * sizeof(double));
  host_copy(h, d, n * sizeof(double));
  float *f = xmalloc(n * sizeof(float));
  for (size_t i = 0; i < n; ++i) f[i] = (float)h[i];
  free(h);
  return f;
}

/* ---- the error measure ----
 * max over i of |got - want| / max(|want|, rms(want)). Why the floor: two
 * correct fp32 evaluations of a sum differ by rounding errors proportional to
 * the terms summed, which for these O(1) random inputs are of the size of the
 * output's typical element (its RMS), not of the one element; an element that
 * cancels to near 0 keeps an absolute difference of a few ulps of the RMS, and
 * dividing it by its own tiny value would measure the cancellation, not the
 * kernel. A real bug (a dropped term, a wrong index, scale or sign) moves an
 * element by O(RMS): an error of O(1) on this scale, 1e5 times the fp32 bound.
 * NaN must meet NaN and an infinity the same infinity. */
static double rel_err_floor(const float *got, const float *want, size_t n, double at_least) {
  double ss = 0.0;
  size_t finite = 0;
  for (size_t i = 0; i < n; ++i)
    if (isfinite(want[i])) {
      ss += (double)want[i] * want[i];
      finite++;
    }
  const double rms = finite ? sqrt(ss / (double)finite) : 0.0;
  const double floor = fmax(rms, at_least) > 0.0 ? fmax(rms, at_least) : DBL_MIN;
  double worst = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (isnan(want[i]) || isnan(got[i])) {
      if (!(isnan(want[i]) && isnan(got[i]))) return INFINITY;
      continue;
    }
    if (isinf(want[i]) || isinf(got[i])) {
      if (got[i] != want[i]) return INFINITY;
      continue;
    }
    const double e = fabs((double)got[i] - want[i]) / fmax(fabs((double)want[i]), floor);
    worst = e > worst ? e : worst;
  }
  return worst;
}

static double rel_err(const float *got, const float *want, size_t n) {
  return rel_err_floor(got, want, n, 0.0);
}

static double max2(double a, double b) { return a > b || isnan(a) ? a : b; }

static double rms_of(const float *x, size_t n) {
  double ss = 0.0;
  for (size_t i = 0; i < n; ++i) ss += (double)x[i] * x[i];
  return n ? sqrt(ss / (double)n) : 0.0;
}

static char *row_name(char *buf, const char *kind, const char *suffix) {
  snprintf(buf, 64, "%s%s", kind, suffix);
  return buf;
}

/* ---- device tensors off 16-byte alignment ---- */

/* What the elements before a skewed tensor hold, and must still hold after
 * the kernels ran (exact in bf16). */
#define SENTINEL 7.0f

/* x (n) to the device in the case's dtype, `skew` elements (2 or 4 bytes
 * each) into its buffer, SENTINEL before it: off 16-byte alignment for skew
 * = 1, so the kernels must take their scalar forms (a misaligned 16-byte
 * access faults in the simulator as on a GPU). */
static void *dev_skewed(int bf16, const float *x, size_t n, int skew) {
  float *h = xmalloc((n + (size_t)skew) * sizeof(float));
  for (int i = 0; i < skew; ++i) h[i] = SENTINEL;
  memcpy(h + skew, x, n * sizeof(float));
  char *d = dev_act(bf16, h, n + (size_t)skew);
  free(h);
  return d + (size_t)skew * (bf16 ? 2 : 4);
}

/* A dev_skewed tensor back to host fp32; fails when a kernel wrote before
 * its first element. */
static float *back_skewed(int bf16, const void *d, size_t n, int skew) {
  float *h = back_act(bf16, (const char *)d - (size_t)skew * (bf16 ? 2 : 4), n + (size_t)skew);
  for (int i = 0; i < skew; ++i)
    ck_assert_msg(h[i] == SENTINEL, "a skewed kernel wrote before its first element");
  memmove(h, h + skew, n * sizeof(float));
  return h;
}

/* ---- the products (fsdp_cuda_matmul_forward / _backward) ----
 * Against the CPU's layer kernels composed: forward = conv1d/linear, then
 * GELU of the pre-activation as stored; backward's d(input) is WRITTEN over a
 * buffer of random values (a product with beta = 1, or one that skipped the
 * write, is off by O(1)), times gelu'(pre) when the fc's GELU is fused; the
 * weight and bias gradients add onto random values. */

typedef void (*mm_fwd_cpu)(float *, const float *, const float *, const float *, int, int, int);
typedef void (*mm_bwd_cpu)(float *, float *, float *, const float *, const float *,
                           const float *, int, int, int);

/* Rows, inputs, outputs; linear (1) or conv1d (0) weight; bias (and dbias);
 * GELU; d(input) asked for; tensors `skew` elements off alignment, and the
 * epilogue's (bias, pre-activation, the backward's gelu_pre: cuBLASLt's bias
 * and aux pointers) `eskew` more: {9, 16, 32} and {64, 96, 160} take
 * cuBLASLt aligned, the product and our own pass with only the epilogue's
 * tensors off (cuBLASLt would refuse them: tests/cudasim/cublas). 13, 37, 21
 * and 5 are not multiples of a pack (scalar forms and tails); 768 x 3072 is
 * GPT-2's fc; C = 0 is the empty reduction (out = bias); OC = 0 the empty
 * d(input) (zeros). */
static const struct { int B, C, OC, linear, bias, gelu, dinp, skew, eskew; } kMatmul[] = {
    {37, 13, 21, 0, 1, 1, 1, 0, 0}, {5, 40, 24, 1, 1, 0, 1, 0, 0},
    {64, 96, 160, 0, 0, 1, 1, 0, 0}, {64, 96, 160, 1, 1, 0, 1, 0, 0},
    {7, 16, 5, 1, 0, 0, 1, 0, 0}, {7, 13, 5, 1, 0, 0, 0, 0, 0}, {7, 13, 5, 0, 0, 0, 0, 0, 0},
    {256, 768, 384, 1, 1, 0, 1, 0, 0}, {256, 768, 384, 0, 1, 0, 1, 0, 0},
    {1, 1, 1, 1, 1, 0, 1, 0, 0}, {1, 1, 1, 0, 1, 1, 1, 0, 0}, {5, 0, 3, 1, 1, 0, 1, 0, 0},
    {5, 0, 3, 0, 1, 1, 1, 0, 0}, {11, 40, 24, 0, 1, 1, 1, 1, 0}, {9, 16, 32, 1, 1, 1, 1, 1, 0},
    {33, 768, 3072, 0, 1, 1, 1, 0, 0}, {5, 3, 0, 1, 1, 0, 1, 0, 0}, {5, 3, 0, 0, 0, 1, 1, 0, 0},
    {9, 16, 32, 1, 1, 1, 1, 0, 1}, {64, 96, 160, 0, 1, 1, 1, 0, 1},
};

static float *maybe_round(int bf16, float *x, size_t n) { return bf16 ? round_bf16(x, n) : x; }

#define LONG_ROWS 100000

/* dw += dout^T inp (linear: dw (OC, C); conv1d: (C, OC)), db += column sums
 * of dout, each sum in double and rounded once. */
static void param_grads_f64(float *dw, float *db, const float *dout, const float *inp, int B,
                            int C, int OC, int linear) {
  for (int o = 0; o < OC; ++o) {
    for (int c = 0; c < C; ++c) {
      double sum = 0.0;
      for (int r = 0; r < B; ++r) sum += (double)dout[(size_t)r * OC + o] * inp[(size_t)r * C + c];
      float *g = linear ? &dw[(size_t)o * C + c] : &dw[(size_t)c * OC + o];
      *g = (float)(*g + sum);
    }
    if (!db) continue;
    double sum = 0.0;
    for (int r = 0; r < B; ++r) sum += dout[(size_t)r * OC + o];
    db[o] = (float)(db[o] + sum);
  }
}

static void matmul_case(int bf16, int B, int C, int OC, int linear, int with_bias, int gelu,
                        int with_dinp, int skew, int eskew) {
  const fsdp_dtype_t dt = bf16 ? FSDP_BF16 : FSDP_F32;
  const size_t ni = (size_t)B * C, nw = (size_t)OC * C, no = (size_t)B * OC;
  const double tol = bf16 ? TOL_BF16 : TOL_F32;
  const mm_fwd_cpu cpu_fwd = linear ? fsdp_linear_forward : fsdp_conv1d_forward;
  const mm_bwd_cpu cpu_bwd = linear ? fsdp_linear_backward : fsdp_conv1d_backward;
  float *inp = maybe_round(bf16, rand_floats(ni, 0, 1), ni);
  float *w = maybe_round(bf16, rand_floats(nw, 0, 1), nw);
  float *bias = maybe_round(bf16, rand_floats(OC, 0, 1), OC);
  float *dout = maybe_round(bf16, rand_floats(no, 0, 1), no);
  /* the pre-activation of the layer below, for the fused gelu' of d(input):
   * to +-6, both tails */
  float *pre_in = maybe_round(bf16, rand_floats(ni, 0, 6), ni);
  float *junk = rand_floats(ni > no ? ni : no, 0, 1);
  float *dw = rand_floats(nw, 0, 1), *db = rand_floats(OC, 0, 1);
  void *g_inp = dev_skewed(bf16, inp, ni, skew), *g_w = dev_skewed(bf16, w, nw, skew);
  void *g_out = dev_skewed(bf16, junk, no, skew);
  void *g_pre = gelu ? dev_skewed(bf16, junk, no, skew + eskew) : NULL;
  void *g_dinp = with_dinp ? dev_skewed(bf16, junk, ni, skew) : NULL;
  float *g_dw = dev_f32(dw, nw), *g_db = dev_f32(db, OC);
  float *scratch = dev_alloc(fsdp_cuda_colsum_scratch_bytes(OC));
  OK(fsdp_cuda_matmul_forward(
      &(fsdp_matmul_forward_args_t){
          .dt = dt, .out = g_out, .pre = g_pre, .inp = g_inp, .weight = g_w,
          .bias = with_bias ? dev_skewed(bf16, bias, OC, skew + eskew) : NULL, .B = B, .C = C,
          .OC = OC, .weight_out_in = linear},
      fs));
  OK(fsdp_cuda_matmul_backward(
      &(fsdp_matmul_backward_args_t){
          .dt = dt, .dinp = g_dinp, .dweight = g_dw, .dbias = with_bias ? g_db : NULL,
          .scratch = scratch, .dout = dev_skewed(bf16, dout, no, skew), .inp = g_inp,
          .weight = g_w, .gelu_pre = gelu ? dev_skewed(bf16, pre_in, ni, skew + eskew) : NULL,
          .B = B, .C = C, .OC = OC, .weight_out_in = linear},
      fs));
  float *got = back_skewed(bf16, g_out, no, skew);
  float *got_pre = gelu ? back_skewed(bf16, g_pre, no, skew + eskew) : NULL;
  float *got_dinp = with_dinp ? back_skewed(bf16, g_dinp, ni, skew) : NULL;
  float *got_dw = back_f32(g_dw, nw), *got_db = back_f32(g_db, OC);
  /* the CPU: the layer, then GELU of the pre-activation as the GPU stores it */
  float *pre = xmalloc(no * 4), *act = xmalloc(no * 4), *dinp = calloc(ni, 4);
  cpu_fwd(pre, inp, w, NULL, B, C, OC);
  /* bf16: the product is stored, then the bias added and stored again */
  maybe_round(bf16, pre, no);
  /* Rounding errors scale with the terms, not with their sum: a product that
   * the bias all but cancels (one element at B = C = OC = 1) leaves a tiny
   * result next to an error of the product's size, so the pre-activation and
   * the output are measured on the scale of the product and the bias. */
  const double terms = hypot(rms_of(pre, no), with_bias ? rms_of(bias, OC) : 0.0);
  for (size_t i = 0; i < no && with_bias; ++i) pre[i] += bias[i % (size_t)OC];
  double err = 0.0;
  if (gelu) {
    err = rel_err_floor(got_pre, pre, no, terms);
    fsdp_gelu_forward(act, maybe_round(bf16, copy_floats(pre, no), no), no);
    free(pre);
    pre = act;
    act = NULL;
  }
  /* one rounding in bf16 without the bias pass, two with it (TOL_BF16_TWICE) */
  check_err(bf16 ? "matmul_forward_bf16" : "matmul_forward", "pre/out",
            max2(err, rel_err_floor(got, pre, no, terms)),
            bf16 && (with_bias || gelu) ? TOL_BF16_TWICE : tol);
  /* Over millions of rows (gelu_long) the CPU layer's own running fp32 sums
   * of the weight and bias gradients are off by ~sqrt(rows) ulps of their
   * scale (1e-4 at 3.4 M rows): there the reference sums in double. */
  if (B > LONG_ROWS) {
    float *ignored = calloc(nw, 4);
    cpu_bwd(with_dinp ? dinp : NULL, ignored, NULL, dout, inp, w, B, C, OC);
    free(ignored);
    param_grads_f64(dw, with_bias ? db : NULL, dout, inp, B, C, OC, linear);
  } else {
    cpu_bwd(with_dinp ? dinp : NULL, dw, with_bias ? db : NULL, dout, inp, w, B, C, OC);
  }
  if (with_dinp && gelu) { /* d(pre_in) = d(input) * gelu'(pre_in), d(input) stored first */
    float *dx = maybe_round(bf16, dinp, ni);
    dinp = calloc(ni, 4);
    fsdp_gelu_backward(dinp, pre_in, dx, ni);
    free(dx);
  }
  if (with_dinp)
    check_err(bf16 ? "matmul_backward_bf16" : "matmul_backward", "dinp",
              rel_err(got_dinp, dinp, ni), tol);
  /* A column sum of B random terms is about sqrt(B) RMS terms in size; one
   * that cancels to near 0 is measured on that scale (as rel_err does with
   * the RMS of several), or OC = 1 would divide by its own tiny value. */
  const double sum_of = sqrt((double)B) * rms_of(dout, no);
  /* dbias sums dout's stored values in fp32 on every path (the weight
   * gradient's BGRADA/BGRADB epilogue in dweight's type, the column sum, the
   * CPU's loop), so f32's bound holds in bf16 too, below LONG_ROWS. */
  check_err(bf16 ? "matmul_backward_bf16" : "matmul_backward", "dbias",
            rel_err_floor(got_db, db, OC, sum_of), B > LONG_ROWS ? tol : TOL_F32);
  /* dweight's sum runs inside cuBLAS: over 3.4 M rows a GPU's fp32 running
   * sum may be off by ~sqrt(rows) / sqrt(6) ulps of that scale (4e-5; the
   * simulator's reference GEMM sums in double), so 2 sqrt(rows) ulps there
   * (2.2e-4); a dropped row moves it by 1 / sqrt(rows) (5.5e-4). */
  const double tol_dw = B > LONG_ROWS ? fmax(tol, 2.0 * sqrt((double)B) * 0x1p-24) : tol;
  check_err(bf16 ? "matmul_backward_bf16" : "matmul_backward", "dweight",
            rel_err_floor(got_dw, dw, nw, sum_of * rms_of(inp, ni)), tol_dw);
  free(inp), free(w), free(bias), free(dout), free(pre_in), free(junk), free(dw), free(db);
  free(pre), free(act), free(dinp), free(got), free(got_pre), free(got_dinp), free(got_dw);
  free(got_db);
}

START_TEST(matmul) {
  rng_seed(seed + 1000 + (uint64_t)_i);
  for (int bf16 = 0; bf16 <= 1; ++bf16) {
    matmul_case(bf16, kMatmul[_i].B, kMatmul[_i].C, kMatmul[_i].OC, kMatmul[_i].linear,
                kMatmul[_i].bias, kMatmul[_i].gelu, kMatmul[_i].dinp, kMatmul[_i].skew,
                kMatmul[_i].eskew);
    dev_free_all();
  }
}
END_TEST

/* What runs each product (fsdp_cuda_product_impl), wherever it runs: a
 * layer without bias or GELU is three plain products; GELU with OC not a
 * multiple of 8 takes the pass without asking cuBLASLt (the GELU input's
 * leading dimension), and d(input)'s slope likewise for C; GPT-2's four
 * block layers name an epilogue or a pass with its reason for each product,
 * and under the simulator (whose cuBLASLt takes every shape here) the
 * epilogue: BGRADA for a Conv1D's weight gradient, BGRADB for a linear
 * layer's, each with the workspace its algorithm takes from the stream's
 * 32 MiB (the simulator's: D's m x n in fp32, as split-K partials would).
 * Bad sizes, no buffer and an f16 product are refused. */
START_TEST(product_choice) {
  char impl[400];
  OK(fsdp_cuda_product_impl(fs, FSDP_BF16, 64, 96, 160, FSDP_PRODUCT_OUT_IN, impl, sizeof impl));
  ck_assert_str_eq(impl, "fwd cuBLAS, dinp cuBLAS, dW cuBLAS");
  /* FSDP_CUBLASLT_WORKSPACE_KIB (the kernels-lt-workspace-* tests): 0 offers
   * none, so no algorithm takes one; a bad value is refused by name at the
   * first decision and at a stream's prepare. */
  const char *ws_env = getenv("FSDP_CUBLASLT_WORKSPACE_KIB");
  if (ws_env && strcmp(ws_env, "0")) {
    ck_assert_int_eq(fsdp_cuda_product_impl(fs, FSDP_BF16, 2048, 768, 2304, FSDP_PRODUCT_BIAS,
                                            impl, sizeof impl), FSDP_ERR_INVALID_ARGUMENT);
    char want[96];
    snprintf(want, sizeof want, "FSDP_CUBLASLT_WORKSPACE_KIB=%s: expected a whole number", ws_env);
    ck_assert_msg(strstr(fsdp_last_error(), want), "%s", fsdp_last_error());
    fsdp_stream_t other;
    OK(fsdp_stream_create_cuda("lt-workspace", 0, &other));
    ck_assert_int_eq(fsdp_cuda_blas_prepare(other, NULL), FSDP_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp_last_error(), want), "%s", fsdp_last_error());
    fsdp_stream_destroy(other);
    check_err("product_choice", "a bad FSDP_CUBLASLT_WORKSPACE_KIB refused", 0.0, TOL_EXACT);
    return;
  }
  OK(fsdp_cuda_product_impl(fs, FSDP_F32, 37, 13, 21, FSDP_PRODUCT_BIAS | FSDP_PRODUCT_GELU |
                            FSDP_PRODUCT_DGELU, impl, sizeof impl));
  const char *odd = "fwd cuBLAS + bias+GELU pass (OC not a multiple of 8), dinp cuBLAS + "
                    "GELU' pass (C not a multiple of 8), dW ";
  ck_assert_msg(!strncmp(impl, odd, strlen(odd)), "%s", impl);
  const int simulated = !strncmp(device_line, "device: cudasim", 15);
  static const struct { int C, OC, flags; const char *want; } gpt2[] = {
      {768, 2304, FSDP_PRODUCT_BIAS, "fwd cuBLASLt BIAS (workspace 18.00 MiB), dinp cuBLAS, "
                                     "dW cuBLASLt BGRADA (workspace 6.75 MiB)"},
      {768, 768, FSDP_PRODUCT_BIAS, "fwd cuBLASLt BIAS (workspace 6.00 MiB), dinp cuBLAS, "
                                    "dW cuBLASLt BGRADA (workspace 2.25 MiB)"},
      {768, 3072, FSDP_PRODUCT_BIAS | FSDP_PRODUCT_GELU,
       "fwd cuBLASLt GELU_AUX_BIAS (workspace 24.00 MiB), dinp cuBLAS, dW cuBLASLt BGRADA "
       "(workspace 9.00 MiB)"},
      {3072, 768, FSDP_PRODUCT_BIAS | FSDP_PRODUCT_DGELU,
       "fwd cuBLASLt BIAS (workspace 6.00 MiB), dinp cuBLASLt DGELU (workspace 24.00 MiB), "
       "dW cuBLASLt BGRADA (workspace 9.00 MiB)"},
      {768, 3072, FSDP_PRODUCT_BIAS | FSDP_PRODUCT_OUT_IN,
       "fwd cuBLASLt BIAS (workspace 24.00 MiB), dinp cuBLAS, dW cuBLASLt BGRADB "
       "(workspace 9.00 MiB)"},
  };
  for (int dt = 0; dt < 2; ++dt)
    for (int i = 0; i < LEN(gpt2); ++i) {
      OK(fsdp_cuda_product_impl(fs, dt ? FSDP_BF16 : FSDP_F32, 2048, gpt2[i].C, gpt2[i].OC,
                                gpt2[i].flags, impl, sizeof impl));
      char want[400];
      snprintf(want, sizeof want, "%s", gpt2[i].want);
      for (char *w; ws_env && (w = strstr(want, " (workspace "));) /* none offered: none taken */
        memmove(w, strchr(w, ')') + 1, strlen(strchr(w, ')') + 1) + 1);
      if (simulated) ck_assert_str_eq(impl, want);
      /* elsewhere: each part with a bias an epilogue, or a pass that says why */
      const char *dw = strstr(impl, ", dW ");
      ck_assert_msg(!strncmp(impl, "fwd cuBLASLt ", 13) || strstr(impl, " pass ("), "%s", impl);
      ck_assert_msg(dw && (!strncmp(dw, ", dW cuBLASLt BGRAD", 19) ||
                           !strncmp(dw, ", dW cuBLAS + bias column sum (", 31)), "%s", impl);
    }
  ck_assert_int_eq(fsdp_cuda_product_impl(fs, FSDP_F32, 0, 8, 8, 0, impl, sizeof impl),
                   FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "B 0"));
  ck_assert_int_eq(fsdp_cuda_product_impl(fs, FSDP_F32, 8, 8, 8, 0, NULL, 0),
                   FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_cuda_product_impl(fs, FSDP_F16, 8, 8, 8, 0, impl, sizeof impl),
                   FSDP_ERR_UNSUPPORTED);
  check_err("product_choice", "the products' reports and refusals", 0.0, TOL_EXACT);
}
END_TEST

/* The column sums need their scratch: without it the fused backward ops
 * refuse, naming the size, instead of writing through NULL. */
START_TEST(fused_scratch_refused) {
  float *x = dev_alloc(16 * 16 * 4), *g = dev_alloc(16 * 4), *st = dev_alloc(16 * 4);
  fsdp_status_t st1 = fsdp_cuda_matmul_backward(
      &(fsdp_matmul_backward_args_t){.dt = FSDP_F32, .dinp = x, .dweight = x, .dbias = g,
                                     .dout = x, .inp = x, .weight = x, .B = 16, .C = 16,
                                     .OC = 16},
      fs);
  ck_assert_int_eq(st1, FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "fsdp_cuda_colsum_scratch_bytes(16)"));
  fsdp_status_t st2 = fsdp_cuda_layernorm_fused_backward(
      &(fsdp_layernorm_backward_args_t){.dt = FSDP_BF16, .dinp = x, .dweight = g, .dbias = g,
                                        .dout = x, .inp = x, .weight = x, .mean = st, .rstd = st,
                                        .N = 16, .C = 16},
      fs);
  ck_assert_int_eq(st2, FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "fsdp_cuda_colsum_scratch_bytes(16)"));
}
END_TEST

/* ---- residual + LayerNorm (fsdp_cuda_layernorm_fused_forward / _backward) ----
 * Forward against the CPU's residual then LayerNorm on x' as stored; backward
 * against fsdp_layernorm_backward, d(input) added onto random values (or not
 * asked for). An offset of 3 next to a spread of 1 tests the two-pass
 * variance; C = 1600 (GPT-2 XL) leaves a partial pass of the row's lanes.
 * Backward is one kernel up to C = 1024 (16 rows a block, at most 128
 * blocks, widths in steps of 256 columns; layernorm.cu) and two passes past
 * it: 2051 rows fill the 128 blocks and deal a warp a second row, 21 rows
 * leave a second block 5; C = 1024 is the one kernel's widest and 1032 the
 * two passes' narrowest whole packs; 999 and the skewed rows take its scalar
 * form, 999 at its widest step and 257 with one column in its last. A row is
 * fetched 3 packs or 12 elements at a time: 1024 and 999 end on a part. */
static const struct { int N, C, branch, skew; double offset; int dinp; } kFusedLn[] = {
    {37, 768, 1, 0, 0.0, 1},   {5, 13, 1, 0, 3.0, 1},      {9, 24, 0, 0, 3.0, 1},
    {11, 40, 1, 1, 0.0, 1},    {1, 1, 1, 0, 0.0, 1},       {64, 1600, 0, 0, 3.0, 0},
    {2051, 24, 0, 0, 0.0, 1},  {21, 1024, 1, 0, 3.0, 1},   {21, 1032, 1, 0, 3.0, 1},
    {19, 999, 0, 0, 0.0, 1},   {6, 257, 0, 1, 3.0, 0},
};

static void fused_ln_case(int bf16, int N, int C, int branch, int skew, double offset,
                          int with_dinp) {
  const fsdp_dtype_t dt = bf16 ? FSDP_BF16 : FSDP_F32;
  const size_t n = (size_t)N * C;
  const double tol = bf16 ? TOL_BF16 : TOL_F32;
  float *x = maybe_round(bf16, rand_floats(n, offset, 1), n);
  float *br = maybe_round(bf16, rand_floats(n, 0, 1), n);
  float *w = maybe_round(bf16, rand_floats(C, 1, 0.5), C);
  float *b = maybe_round(bf16, rand_floats(C, 0, 0.5), C);
  float *dout = maybe_round(bf16, rand_floats(n, 0, 1), n);
  float *dinp = maybe_round(bf16, rand_floats(n, 0, 1), n);
  float *dw = rand_floats(C, 0, 1), *db = rand_floats(C, 0, 1);
  void *g_x = dev_skewed(bf16, x, n, skew), *g_br = dev_skewed(bf16, br, n, skew);
  void *g_w = dev_skewed(bf16, w, C, skew), *g_b = dev_skewed(bf16, b, C, skew);
  void *g_res = dev_skewed(bf16, x, n, skew), *g_out = dev_skewed(bf16, x, n, skew);
  void *g_dout = dev_skewed(bf16, dout, n, skew), *g_dinp = dev_skewed(bf16, dinp, n, skew);
  float *g_mean = dev_alloc(N * 4), *g_rstd = dev_alloc(N * 4);
  float *g_dw = dev_f32(dw, C), *g_db = dev_f32(db, C);
  float *scratch = dev_alloc(fsdp_cuda_colsum_scratch_bytes(C));
  OK(fsdp_cuda_layernorm_fused_forward(
      &(fsdp_layernorm_forward_args_t){.dt = dt, .res = g_res, .out = g_out, .mean = g_mean,
                                       .rstd = g_rstd, .inp = g_x, .branch = branch ? g_br : NULL,
                                       .weight = g_w, .bias = g_b, .N = N, .C = C},
      fs));
  const void *ln_in = branch ? g_res : g_x;
  OK(fsdp_cuda_layernorm_fused_backward(
      &(fsdp_layernorm_backward_args_t){.dt = dt, .dinp = with_dinp ? g_dinp : NULL,
                                        .dweight = g_dw, .dbias = g_db, .scratch = scratch,
                                        .dout = g_dout, .inp = ln_in, .weight = g_w,
                                        .mean = g_mean, .rstd = g_rstd, .N = N, .C = C},
      fs));
  float *got_res = back_skewed(bf16, g_res, n, skew), *got = back_skewed(bf16, g_out, n, skew);
  float *got_mean = back_f32(g_mean, N), *got_rstd = back_f32(g_rstd, N);
  float *got_dinp = back_skewed(bf16, g_dinp, n, skew), *got_dw = back_f32(g_dw, C);
  float *got_db = back_f32(g_db, C);
  /* the CPU: x' = x + branch, stored, then LayerNorm of it */
  float *res = copy_floats(x, n), *out = xmalloc(n * 4), *mean = xmalloc(N * 4),
        *rstd = xmalloc(N * 4);
  if (branch) maybe_round(bf16, (fsdp_residual_forward(res, x, br, n), res), n);
  fsdp_layernorm_forward(out, mean, rstd, res, w, b, N, C);
  double err = max2(rel_err(got, out, n), max2(rel_err(got_mean, mean, N), rel_err(got_rstd, rstd, N)));
  if (branch) err = max2(err, rel_err(got_res, res, n));
  check_err(bf16 ? "ln_fused_forward_bf16" : "ln_fused_forward", "x'/out/mean/rstd", err, tol);
  /* without d(input) its buffer keeps what it had */
  fsdp_layernorm_backward(with_dinp ? dinp : NULL, dw, db, dout, res, w, mean, rstd, N, C);
  err = max2(rel_err(got_dinp, dinp, n), max2(rel_err(got_dw, dw, C), rel_err(got_db, db, C)));
  check_err(bf16 ? "ln_fused_backward_bf16" : "ln_fused_backward", "dinp/dweight/dbias", err,
            tol);
  free(x), free(br), free(w), free(b), free(dout), free(dinp), free(dw), free(db);
  free(got_res), free(got), free(got_mean), free(got_rstd), free(got_dinp), free(got_dw);
  free(got_db), free(res), free(out), free(mean), free(rstd);
}

START_TEST(fused_layernorm) {
  rng_seed(seed + 3500 + (uint64_t)_i);
  for (int bf16 = 0; bf16 <= 1; ++bf16) {
    fused_ln_case(bf16, kFusedLn[_i].N, kFusedLn[_i].C, kFusedLn[_i].branch, kFusedLn[_i].skew,
                  kFusedLn[_i].offset, kFusedLn[_i].dinp);
    dev_free_all();
  }
}
END_TEST

/* LayerNorm backward twice on the same inputs, into fresh buffers holding
 * the same values but scratch filled differently (zeros, then 0xff bytes: a
 * NaN): d(input), dweight and dbias must come back bit for bit the same (the
 * engine compares checkpointed and plain runs so). On a GPU, where blocks
 * race, a sum whose order varies shows here; the simulator runs blocks in
 * index order, so there it is a result that reads scratch no block wrote.
 * Both paths (C 24 over 128 blocks, 768, 999 scalar; 1032: two passes). */
static const struct { int N, C, skew; } kLnRepeat[] = {
    {2051, 24, 0}, {37, 768, 0}, {19, 999, 1}, {21, 1032, 0}};

static void ln_repeat_case(int bf16, int N, int C, int skew) {
  const size_t n = (size_t)N * C, sb = fsdp_cuda_colsum_scratch_bytes(C);
  float *x = maybe_round(bf16, rand_floats(n, 0, 1), n);
  float *w = maybe_round(bf16, rand_floats(C, 1, 0.5), C);
  float *b = maybe_round(bf16, rand_floats(C, 0, 0.5), C);
  float *dout = maybe_round(bf16, rand_floats(n, 0, 1), n);
  float *dinp = maybe_round(bf16, rand_floats(n, 0, 1), n);
  float *dw = rand_floats(C, 0, 1), *db = rand_floats(C, 0, 1);
  float *out = xmalloc(n * 4), *mean = xmalloc(N * 4), *rstd = xmalloc(N * 4);
  fsdp_layernorm_forward(out, mean, rstd, x, w, b, N, C);
  void *g_x = dev_skewed(bf16, x, n, skew), *g_w = dev_skewed(bf16, w, C, skew);
  void *g_dout = dev_skewed(bf16, dout, n, skew);
  float *g_mean = dev_f32(mean, N), *g_rstd = dev_f32(rstd, N), *got[2][3];
  for (int r = 0; r < 2; ++r) {
    void *g_dinp = dev_skewed(bf16, dinp, n, skew), *scratch = dev_alloc(sb);
    float *g_dw = dev_f32(dw, C), *g_db = dev_f32(db, C);
    CU(cudaMemsetAsync(scratch, r ? 0xff : 0, sb, stream));
    OK(fsdp_cuda_layernorm_fused_backward(
        &(fsdp_layernorm_backward_args_t){.dt = act_dtype(bf16), .dinp = g_dinp,
                                          .dweight = g_dw, .dbias = g_db, .scratch = scratch,
                                          .dout = g_dout, .inp = g_x, .weight = g_w,
                                          .mean = g_mean, .rstd = g_rstd, .N = N, .C = C},
        fs));
    got[r][0] = back_skewed(bf16, g_dinp, n, skew);
    got[r][1] = back_f32(g_dw, C);
    got[r][2] = back_f32(g_db, C);
  }
  const size_t len[3] = {n, (size_t)C, (size_t)C};
  size_t bad = 0;
  for (int k = 0; k < 3; ++k)
    for (size_t i = 0; i < len[k]; ++i) bad += memcmp(&got[0][k][i], &got[1][k][i], 4) != 0;
  check_err(bf16 ? "ln_backward_bits_bf16" : "ln_backward_bits", "two runs", bad ? INFINITY : 0.0,
            TOL_EXACT);
  ck_assert_msg(!bad, "LayerNorm backward N %d C %d: %zu elements differ between two runs", N, C,
                bad);
  free(x), free(w), free(b), free(dout), free(dinp), free(dw), free(db), free(out), free(mean);
  free(rstd);
  for (int r = 0; r < 2; ++r)
    for (int k = 0; k < 3; ++k) free(got[r][k]);
}

START_TEST(layernorm_repeat) {
  rng_seed(seed + 3600 + (uint64_t)_i);
  for (int bf16 = 0; bf16 <= 1; ++bf16) {
    ln_repeat_case(bf16, kLnRepeat[_i].N, kLnRepeat[_i].C, kLnRepeat[_i].skew);
    dev_free_all();
  }
}
END_TEST

/* ---- GELU over long tensors ----
 * The products' bias + GELU pass on (B, OC) outputs and the gelu' pass on
 * (B, C) input gradients, from 1,000 elements to 16,781,315, past
 * FSDP_CUDA_MAX_GRID * 256 threads: each grid-stride loop wraps once (in the
 * scalar form: 5 is not a multiple of a pack). One column on the other side
 * keeps the products cheap. */
static const struct { int B, C, OC; } kLong[] = {
    {8, 1, 125}, {3356263, 1, 5}, {3356263, 5, 1}};

START_TEST(gelu_long) {
  rng_seed(seed + 2000 + (uint64_t)_i);
  for (int bf16 = 0; bf16 <= 1; ++bf16) {
    matmul_case(bf16, kLong[_i].B, kLong[_i].C, kLong[_i].OC, 0, 1, 1, 1, 0, 0);
    dev_free_all();
  }
}
END_TEST

/* ---- embedding ---- */

/* V = 5 with 128 positions repeats every token many times: the atomic scatter
 * collides. wpe 0: the token embedding alone (RoPE models: wpe and dwpe
 * NULL). */
static const struct { int B, T, C, V, wpe; } kEmbedding[] = {
    {3, 17, 40, 50, 1}, {2, 64, 768, 5, 1}, {1, 1, 1, 1, 1}, {3, 17, 40, 50, 0}, {2, 64, 576, 5, 0},
};

static void embedding_case(int bf16, int B, int T, int C, int V, int with_wpe) {
  const size_t n = (size_t)B * T * C, nte = (size_t)V * C, npe = (size_t)T * C;
  const double tol = bf16 ? TOL_BF16 : TOL_F32;
  int *tok = rand_tokens((size_t)B * T, V);
  float *wte = rand_floats(nte, 0, 1), *wpe = rand_floats(npe, 0, 1), *dout = rand_floats(n, 0, 1);
  float *dwte = rand_floats(nte, 0, 1), *dwpe = rand_floats(npe, 0, 1), *out = xmalloc(n * 4);
  if (bf16) {
    round_bf16(wte, nte);
    round_bf16(wpe, npe);
    round_bf16(dout, n);
  }
  int *g_tok = dev_copy(tok, (size_t)B * T * sizeof(int));
  float *g_dwte = dev_f32(dwte, nte), *g_dwpe = dev_f32(dwpe, npe);
  const fsdp_dtype_t dt = act_dtype(bf16);
  void *g_out = dev_act_alloc(bf16, n);
  OK(fsdp_cuda_embedding_forward(
      &(fsdp_embedding_forward_args_t){.dt = dt, .out = g_out, .tokens = g_tok,
                                       .wte = dev_act(bf16, wte, nte),
                                       .wpe = with_wpe ? dev_act(bf16, wpe, npe) : NULL, .B = B,
                                       .T = T, .C = C},
      fs));
  OK(fsdp_cuda_embedding_backward(
      &(fsdp_embedding_backward_args_t){.dt = dt, .dwte = g_dwte,
                                        .dwpe = with_wpe ? g_dwpe : NULL,
                                        .dout = dev_act(bf16, dout, n), .tokens = g_tok, .B = B,
                                        .T = T, .C = C},
      fs));
  float *got = back_act(bf16, g_out, n);
  fsdp_embedding_forward(out, tok, wte, with_wpe ? wpe : NULL, B, T, C);
  fsdp_embedding_backward(dwte, with_wpe ? dwpe : NULL, dout, tok, B, T, C);
  float *got_dwte = back_f32(g_dwte, nte), *got_dwpe = back_f32(g_dwpe, npe);
  check_err(bf16 ? "embedding_forward_bf16" : "embedding_forward", "out", rel_err(got, out, n),
            tol);
  check_err(bf16 ? "embedding_backward_bf16" : "embedding_backward", "dwte/dwpe",
            max2(rel_err(got_dwte, dwte, nte), rel_err(got_dwpe, dwpe, npe)), tol);
  free(tok), free(wte), free(wpe), free(dout), free(dwte), free(dwpe), free(out), free(got),
      free(got_dwte), free(got_dwpe);
}

START_TEST(embedding) {
  rng_seed(seed + 4000 + (uint64_t)_i);
  for (int bf16 = 0; bf16 <= 1; ++bf16)
    embedding_case(bf16, kEmbedding[_i].B, kEmbedding[_i].T, kEmbedding[_i].C,
                   kEmbedding[_i].V, kEmbedding[_i].wpe);
}
END_TEST

/* ---- the Llama family's layers (llama.cu) against the CPU table ----
 * The CPU table's slots (backend/cpu/llama_layers.c) are the reference, on
 * the same bf16-rounded inputs in bf16 cases. */

static const fsdp_compute_ops_t *cpu_table(void) {
  const fsdp_compute_ops_t *c = fsdp_compute_ops(FSDP_DEVICE_CPU);
  ck_assert_ptr_nonnull(c);
  return c;
}

/* RMSNorm: C = 13 and 40 at skew 1 take the scalar form; 768 and 2048 the
 * packs with a partial pass of the row's lanes; eps 1e-5 and Llama's 1e-6;
 * an offset of 3 (a row far from zero mean, which RMSNorm does not remove).
 * C = 1 is offset to 5: d(input) of a one-element row is r g (1 - xhat^2),
 * all cancellation, and r = 1/|x| would make fp32's rounding of it, not the
 * kernel, the error for an |x| near 0. bf16's out is rounded twice (x * rstd
 * as stored, HF's order, then the product): up to 2 * 2^-8 relative. */
static const struct { int N, C, branch, skew; float eps; double offset; } kRms[] = {
    {37, 768, 1, 0, 1e-5f, 0.0}, {5, 13, 1, 0, 1e-6f, 3.0}, {9, 24, 0, 0, 1e-5f, 0.0},
    {11, 40, 1, 1, 1e-6f, 0.0},  {1, 1, 1, 0, 1e-5f, 5.0},  {64, 2048, 0, 0, 1e-6f, 3.0},
};

static void rmsnorm_case(int bf16, int N, int C, int branch, int skew, float eps,
                         double offset) {
  const fsdp_dtype_t dt = act_dtype(bf16);
  const size_t n = (size_t)N * C;
  const double tol = bf16 ? TOL_BF16 : TOL_F32;
  float *x = maybe_round(bf16, rand_floats(n, offset, 1), n);
  float *br = maybe_round(bf16, rand_floats(n, 0, 1), n);
  float *w = maybe_round(bf16, rand_floats(C, 1, 0.5), C);
  float *dout = maybe_round(bf16, rand_floats(n, 0, 1), n);
  float *dinp = maybe_round(bf16, rand_floats(n, 0, 1), n);
  float *dw = rand_floats(C, 0, 1);
  void *g_x = dev_skewed(bf16, x, n, skew), *g_br = dev_skewed(bf16, br, n, skew);
  void *g_w = dev_skewed(bf16, w, C, skew), *g_res = dev_skewed(bf16, x, n, skew);
  void *g_out = dev_skewed(bf16, x, n, skew), *g_dout = dev_skewed(bf16, dout, n, skew);
  void *g_dinp = dev_skewed(bf16, dinp, n, skew);
  float *g_rstd = dev_alloc(N * 4), *g_dw = dev_f32(dw, C);
  void *scratch = dev_alloc(fsdp_cuda_colsum_scratch_bytes(C));
  OK(fsdp_cuda_rmsnorm_forward(
      &(fsdp_rmsnorm_forward_args_t){.dt = dt, .res = g_res, .out = g_out, .rstd = g_rstd,
                                     .inp = g_x, .branch = branch ? g_br : NULL, .weight = g_w,
                                     .N = N, .C = C, .eps = eps},
      fs));
  OK(fsdp_cuda_rmsnorm_backward(
      &(fsdp_rmsnorm_backward_args_t){.dt = dt, .dinp = g_dinp,
                                      .dweight = g_dw, .scratch = scratch, .dout = g_dout,
                                      .inp = branch ? g_res : g_x, .weight = g_w, .rstd = g_rstd,
                                      .N = N, .C = C},
      fs));
  float *got_res = back_skewed(bf16, g_res, n, skew), *got = back_skewed(bf16, g_out, n, skew);
  float *got_rstd = back_f32(g_rstd, N), *got_dinp = back_skewed(bf16, g_dinp, n, skew);
  float *got_dw = back_f32(g_dw, C);
  /* the CPU: res = x + branch, rounded as the dtype stores it, then RMSNorm of it */
  float *res = xmalloc(n * 4), *out = xmalloc(n * 4), *rstd = xmalloc(N * 4);
  const fsdp_compute_ops_t *cpu = cpu_table();
  const float *normed = x;
  if (branch) {
    OK(cpu->rmsnorm_forward(&(fsdp_rmsnorm_forward_args_t){.dt = FSDP_F32, .res = res,
                                                           .out = out, .rstd = rstd, .inp = x,
                                                           .branch = br, .weight = w, .N = N,
                                                           .C = C, .eps = eps},
                            FSDP_HOST_STREAM));
    normed = maybe_round(bf16, res, n);
  }
  OK(cpu->rmsnorm_forward(&(fsdp_rmsnorm_forward_args_t){.dt = FSDP_F32, .out = out,
                                                         .rstd = rstd, .inp = normed,
                                                         .weight = w, .N = N, .C = C, .eps = eps},
                          FSDP_HOST_STREAM));
  double err = max2(rel_err(got, out, n), rel_err(got_rstd, rstd, N));
  if (branch) err = max2(err, rel_err(got_res, res, n));
  check_err(bf16 ? "rmsnorm_forward_bf16" : "rmsnorm_forward", "res/out/rstd", err, tol);
  OK(cpu->rmsnorm_backward(&(fsdp_rmsnorm_backward_args_t){.dt = FSDP_F32, .dinp = dinp,
                                                           .dweight = dw, .dout = dout,
                                                           .inp = normed, .weight = w,
                                                           .rstd = rstd, .N = N, .C = C},
                           FSDP_HOST_STREAM));
  err = max2(rel_err(got_dinp, dinp, n), rel_err(got_dw, dw, C));
  check_err(bf16 ? "rmsnorm_backward_bf16" : "rmsnorm_backward", "dinp/dweight", err, tol);
  free(x), free(br), free(w), free(dout), free(dinp), free(dw), free(got_res), free(got);
  free(got_rstd), free(got_dinp), free(got_dw), free(res), free(out), free(rstd);
}

START_TEST(rmsnorm) {
  rng_seed(seed + 4500 + (uint64_t)_i);
  for (int bf16 = 0; bf16 <= 1; ++bf16) {
    rmsnorm_case(bf16, kRms[_i].N, kRms[_i].C, kRms[_i].branch, kRms[_i].skew, kRms[_i].eps,
                 kRms[_i].offset);
    dev_free_all();
  }
}
END_TEST

/* RoPE's inverse frequencies for head size D through fsdp_llama_inv_freq:
 * HF's default at theta 10000, or Llama-3.2-1B's (theta 500000, llama3
 * scaling). */
static float *rope_freqs(int D, int llama3) {
  fsdp_llama_config_t c;
  OK(fsdp_llama_preset("Llama-3.2-1B", &c));
  c.n_head = 1, c.n_kv_head = 1, c.n_embd = D;
  if (!llama3) c.rope_type = FSDP_ROPE_DEFAULT, c.rope_theta = 10000.0f;
  float *f = xmalloc((size_t)(D / 2) * sizeof(float));
  fsdp_llama_inv_freq(&c, f);
  return f;
}

/* RoPE forward, and backward on a separate gradient, in place on the whole
 * packed qkv (v must come back untouched): grouped-query (4 over 2), one KV
 * head (3 over 1), multi-head (NKV 0), D = 6 (3 pairs: part of a warp's
 * lanes), D = 128 (64 pairs: two per lane), positions from pos0 = 1000 and
 * 8000 (angles in the thousands: full-range cos and sin). */
static const struct { int B, T, NH, NKV, D, pos0, llama3; } kRope[] = {
    {2, 17, 4, 2, 16, 0, 0}, {1, 5, 3, 1, 8, 1000, 0}, {2, 9, 2, 0, 64, 3, 1},
    {1, 3, 4, 4, 6, 0, 0},   {1, 20, 2, 1, 128, 8000, 1},
};

static void rope_case(int bf16, int B, int T, int NH, int NKV, int D, int pos0, int llama3) {
  const fsdp_dtype_t dt = act_dtype(bf16);
  const size_t n = (size_t)B * T * (NH + 2 * (NKV ? NKV : NH)) * D;
  const double tol = bf16 ? TOL_BF16 : TOL_F32;
  float *freq = rope_freqs(D, llama3), *g_freq = dev_f32(freq, (size_t)D / 2);
  float *x = maybe_round(bf16, rand_floats(n, 0, 1), n);
  float *dx = maybe_round(bf16, rand_floats(n, 0, 1), n);
  void *g_x = dev_act(bf16, x, n), *g_dx = dev_act(bf16, dx, n);
  fsdp_rope_args_t a = {.dt = dt, .qkv = g_x, .inv_freq = g_freq, .B = B, .T = T, .NH = NH,
                        .NKV = NKV, .D = D, .pos0 = pos0};
  OK(fsdp_cuda_rope_forward(&a, fs));
  a.qkv = g_dx;
  OK(fsdp_cuda_rope_backward(&a, fs));
  float *got = back_act(bf16, g_x, n), *got_d = back_act(bf16, g_dx, n);
  const fsdp_compute_ops_t *cpu = cpu_table();
  a = (fsdp_rope_args_t){.dt = FSDP_F32, .qkv = x, .inv_freq = freq, .B = B, .T = T, .NH = NH,
                         .NKV = NKV, .D = D, .pos0 = pos0};
  OK(cpu->rope_forward(&a, FSDP_HOST_STREAM));
  a.qkv = dx;
  OK(cpu->rope_backward(&a, FSDP_HOST_STREAM));
  check_err(bf16 ? "rope_forward_bf16" : "rope_forward", "qkv", rel_err(got, x, n), tol);
  check_err(bf16 ? "rope_backward_bf16" : "rope_backward", "dqkv", rel_err(got_d, dx, n), tol);
  free(freq), free(x), free(dx), free(got), free(got_d);
}

START_TEST(rope) {
  rng_seed(seed + 4600 + (uint64_t)_i);
  for (int bf16 = 0; bf16 <= 1; ++bf16) {
    rope_case(bf16, kRope[_i].B, kRope[_i].T, kRope[_i].NH, kRope[_i].NKV, kRope[_i].D,
              kRope[_i].pos0, kRope[_i].llama3);
    dev_free_all();
  }
}
END_TEST

/* SwiGLU: F = 13 and skew 1 (scalar form), 64 and 1024 (packs); gates
 * spread to +-16 where exp(-x) overflows and silu saturates. Backward
 * writes its buffer of random values. */
static const struct { int N, F, skew; double spread; } kSwiglu[] = {
    {37, 13, 0, 1.0}, {8, 64, 0, 4.0}, {5, 24, 1, 1.0}, {1, 1, 0, 1.0}, {16, 1024, 0, 16.0},
};

static void swiglu_case(int bf16, int N, int F, int skew, double spread) {
  const fsdp_dtype_t dt = act_dtype(bf16);
  const size_t n = (size_t)N * F;
  const double tol = bf16 ? TOL_BF16 : TOL_F32;
  float *inp = maybe_round(bf16, rand_floats(2 * n, 0, spread), 2 * n);
  float *dout = maybe_round(bf16, rand_floats(n, 0, 1), n);
  float *dinp = rand_floats(2 * n, 0, 1), *out = xmalloc(n * 4);
  void *g_inp = dev_skewed(bf16, inp, 2 * n, skew), *g_out = dev_skewed(bf16, dout, n, skew);
  void *g_dout = dev_skewed(bf16, dout, n, skew), *g_dinp = dev_skewed(bf16, dinp, 2 * n, skew);
  OK(fsdp_cuda_swiglu_forward(
      &(fsdp_swiglu_forward_args_t){.dt = dt, .out = g_out, .inp = g_inp, .N = N, .F = F}, fs));
  OK(fsdp_cuda_swiglu_backward(&(fsdp_swiglu_backward_args_t){.dt = dt, .dinp = g_dinp,
                                                              .dout = g_dout, .inp = g_inp,
                                                              .N = N, .F = F},
                               fs));
  float *got = back_skewed(bf16, g_out, n, skew), *got_d = back_skewed(bf16, g_dinp, 2 * n, skew);
  const fsdp_compute_ops_t *cpu = cpu_table();
  OK(cpu->swiglu_forward(
      &(fsdp_swiglu_forward_args_t){.dt = FSDP_F32, .out = out, .inp = inp, .N = N, .F = F},
      FSDP_HOST_STREAM));
  OK(cpu->swiglu_backward(&(fsdp_swiglu_backward_args_t){.dt = FSDP_F32, .dinp = dinp,
                                                         .dout = dout, .inp = inp, .N = N,
                                                         .F = F},
                          FSDP_HOST_STREAM));
  check_err(bf16 ? "swiglu_forward_bf16" : "swiglu_forward", "out", rel_err(got, out, n), tol);
  check_err(bf16 ? "swiglu_backward_bf16" : "swiglu_backward", "dinp (written)",
            rel_err(got_d, dinp, 2 * n), tol);
  free(inp), free(dout), free(dinp), free(out), free(got), free(got_d);
}

START_TEST(swiglu) {
  rng_seed(seed + 4700 + (uint64_t)_i);
  for (int bf16 = 0; bf16 <= 1; ++bf16) {
    swiglu_case(bf16, kSwiglu[_i].N, kSwiglu[_i].F, kSwiglu[_i].skew, kSwiglu[_i].spread);
    dev_free_all();
  }
}
END_TEST

/* What the Llama kernels refuse, by name, before anything runs: an f16
 * RMSNorm, a backward without its scratch, RoPE with 3 KV heads for 4 query
 * heads and with an odd head size. */
START_TEST(llama_refusals) {
  float *buf = dev_alloc(256 * 4);
  ck_assert_int_eq(fsdp_cuda_rmsnorm_forward(
                       &(fsdp_rmsnorm_forward_args_t){.dt = FSDP_F16, .out = buf, .rstd = buf,
                                                      .inp = buf, .weight = buf, .N = 2, .C = 8,
                                                      .eps = 1e-5f},
                       fs),
                   FSDP_ERR_UNSUPPORTED);
  ck_assert_msg(strstr(fsdp_last_error(), "rmsnorm_forward") &&
                    strstr(fsdp_last_error(), "f16"), "%s", fsdp_last_error());
  ck_assert_int_eq(fsdp_cuda_rmsnorm_backward(
                       &(fsdp_rmsnorm_backward_args_t){.dt = FSDP_F32, .dinp = buf,
                                                       .dweight = buf, .dout = buf, .inp = buf,
                                                       .weight = buf, .rstd = buf, .N = 2, .C = 8},
                       fs),
                   FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(fsdp_last_error(), "scratch"), "%s", fsdp_last_error());
  fsdp_rope_args_t a = {.dt = FSDP_F32, .qkv = buf, .inv_freq = buf, .B = 1, .T = 2, .NH = 4,
                        .NKV = 3, .D = 8};
  ck_assert_int_eq(fsdp_cuda_rope_forward(&a, fs), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(fsdp_last_error(), "NKV 3") && strstr(fsdp_last_error(), "NH 4"), "%s",
                fsdp_last_error());
  a.NKV = 2, a.D = 7;
  ck_assert_int_eq(fsdp_cuda_rope_backward(&a, fs), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(fsdp_last_error(), "D 7"), "%s", fsdp_last_error());
  check_err("llama_refusals", "named errors", 0.0, TOL_EXACT);
}
END_TEST

/* ---- attention ---- */

/* T = 65 and 200 leave partial 32-lane rows; 12 heads of 64 is GPT-2's shape.
 * NKV: grouped-query (4 query heads over 2 KV heads, 8 over 2), one KV head
 * for 6 (multi-query), and 0 (= NH) as GPT-2 calls it. */
static const struct { int B, T, C, NH, NKV; } kAttention[] = {
    {2, 65, 48, 3, 0},  {1, 1, 8, 2, 0},   {2, 200, 128, 4, 0}, {1, 64, 768, 12, 0},
    {2, 65, 64, 4, 2},  {1, 33, 96, 6, 1}, {2, 40, 128, 8, 2},  {1, 1, 8, 2, 1},
};

/* The packed qkv's floats: (B,T,(NH+2*NKV)*C/NH), NKV 0 meaning NH. */
static size_t qkv_floats(int B, int T, int C, int NH, int NKV) {
  return (size_t)B * T * (size_t)(NH + 2 * (NKV ? NKV : NH)) * (size_t)(C / NH);
}

/* fp32 attention against the CPU table's (backend/cpu: multi-head and
 * grouped-query), forward's out and probabilities, backward's dqkv written
 * over random values on the GPU and over NaN on the CPU (both tables write
 * it, neither adds). */
static void attention_case(int B, int T, int C, int NH, int NKV) {
  const size_t nqkv = qkv_floats(B, T, C, NH, NKV), no = (size_t)B * T * C,
               natt = (size_t)B * NH * T * T;
  const fsdp_compute_ops_t *cpu = cpu_table();
  float *qkv = rand_floats(nqkv, 0, 1), *dout = rand_floats(no, 0, 1);
  float *dqkv = rand_floats(nqkv, 0, 1), *out = xmalloc(no * 4), *att = xmalloc(natt * 4);
  float *g_qkv = dev_f32(qkv, nqkv), *g_out = dev_alloc(no * 4), *g_att = dev_alloc(natt * 4);
  const fsdp_attention_forward_args_t dims = {.dt = FSDP_F32, .B = B, .T = T, .C = C, .NH = NH,
                                              .NKV = NKV};
  ck_assert_uint_eq(fsdp_cuda_attention_state_floats(&dims), natt);
  float *g_dqkv = dev_f32(dqkv, nqkv);
  for (size_t i = 0; i < nqkv; ++i) dqkv[i] = NAN;
  void *g_scratch = dev_alloc(fsdp_cuda_attention_scratch_bytes(&dims));
  OK(fsdp_cuda_attention_forward(
      &(fsdp_attention_forward_args_t){.dt = FSDP_F32, .out = g_out, .att = g_att,
                                       .scratch = g_scratch, .qkv = g_qkv, .B = B, .T = T,
                                       .C = C, .NH = NH, .NKV = NKV},
      fs));
  OK(cpu->attention_forward(&(fsdp_attention_forward_args_t){.dt = FSDP_F32, .out = out,
                                                             .att = att, .qkv = qkv, .B = B,
                                                             .T = T, .C = C, .NH = NH,
                                                             .NKV = NKV},
                            FSDP_HOST_STREAM));
  float *got = back_f32(g_out, no), *got_att = back_f32(g_att, natt);
  const int gqa = NKV && NKV != NH;
  check_err(gqa ? "attention_forward_gqa" : "attention_forward", "out/att",
            max2(rel_err(got, out, no), rel_err(got_att, att, natt)), TOL_F32);
  /* Backward reads the CPU's probabilities: checked on its own. */
  OK(fsdp_cuda_attention_backward(
      &(fsdp_attention_backward_args_t){.dt = FSDP_F32, .dqkv = g_dqkv, .scratch = g_scratch,
                                        .dout = dev_f32(dout, no), .qkv = g_qkv, .out = g_out,
                                        .att = dev_f32(att, natt), .B = B, .T = T, .C = C,
                                        .NH = NH, .NKV = NKV},
      fs));
  OK(cpu->attention_backward(&(fsdp_attention_backward_args_t){.dt = FSDP_F32, .dqkv = dqkv,
                                                               .dout = dout, .qkv = qkv,
                                                               .out = out, .att = att, .B = B,
                                                               .T = T, .C = C, .NH = NH,
                                                               .NKV = NKV},
                             FSDP_HOST_STREAM));
  float *got_d = back_f32(g_dqkv, nqkv);
  /* Measured on the gradient's own scale (it is written, not added onto
   * random values that doubled the scale): dk and dv of a KV head sum G query
   * heads' T products, and at the production shapes (T 256, 4 heads a group)
   * the worst element reaches 1.0e-5 of the rms over seeds: 4 x TOL_F32. */
  check_err(gqa ? "attention_backward_gqa" : "attention_backward", "dqkv",
            rel_err(got_d, dqkv, nqkv), 4 * TOL_F32);
  free(qkv), free(dout), free(dqkv), free(out), free(att), free(got), free(got_att),
      free(got_d);
}

START_TEST(attention) {
  rng_seed(seed + 5000 + (uint64_t)_i);
  attention_case(kAttention[_i].B, kAttention[_i].T, kAttention[_i].C, kAttention[_i].NH,
                 kAttention[_i].NKV);
}
END_TEST

/* bf16 attention, the fused flash kernel (flash.cu), through the table's
 * entry points, against the CPU's fp32 attention on the same bf16-rounded
 * inputs. out is a convex combination of v rows: bf16 probabilities (2^-9
 * relative each) and the bf16 output (2^-9 of |out| <= max|v|) bound its
 * error by 2^-8 max|v| whatever the row's length (against the RMS of out,
 * which shrinks like 1/sqrt(T) while a row of 2 tokens keeps O(|v|), a
 * relative measure would not be bounded): tolerance 2^-7 max|v|. lse against
 * a double-precision log-sum-exp of the scaled scores, to 2^-7 (the row sums
 * of bf16-rounded weights are within 2^-8 of the exact ones). dqkv from zeros,
 * measured as flash_backward_reference says. Then the add-into contract: a
 * second backward on the same dqkv must double it. Shapes: T not a multiple
 * of the 32- or 64-row tiles, T = 1, several batch rows and heads, every
 * tile variant (head sizes 16, 32, 64 with 64-row inner tiles, 128 with 32),
 * grouped-query attention (2 query heads per KV head at head sizes 64 and
 * 128, 3 at 64, and one KV head for 4 query heads, multi-query), and T =
 * 1024 at GPT-2's head size 64 (2 heads: the simulator's tensor cores are
 * fibers; the production shapes are the kernels-big test's). */
static const struct { int B, T, C, NH, NKV; } kFlash[] = {
    {2, 65, 96, 3, 0},  {1, 1, 128, 2, 0},   {3, 77, 192, 3, 0},  {2, 100, 256, 2, 0},
    {1, 130, 32, 2, 0}, {2, 77, 256, 4, 2},  {1, 100, 512, 4, 1}, {2, 70, 384, 6, 2},
    {1, 1, 512, 4, 2},  {1, 1024, 128, 2, 0},
};

/* The log-sum-exp of each row's scaled causal scores, in double. */
static float *lse_reference(const float *qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const double scale = 1.0 / sqrt((double)hs);
  float *lse = xmalloc((size_t)B * NH * T * sizeof(float));
  double *s = xmalloc((size_t)T * sizeof(double));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < T; ++i) {
        const float *q = qkv + ((size_t)b * T + i) * 3 * C + h * hs;
        double mx = -INFINITY, sum = 0.0;
        for (int j = 0; j <= i; ++j) {
          const float *k = qkv + ((size_t)b * T + j) * 3 * C + C + h * hs;
          double dot = 0.0;
          for (int d = 0; d < hs; ++d) dot += (double)q[d] * k[d];
          s[j] = dot * scale;
          mx = fmax(mx, s[j]);
        }
        for (int j = 0; j <= i; ++j) sum += exp(s[j] - mx);
        lse[((size_t)b * NH + h) * T + i] = (float)(mx + log(sum));
      }
  free(s);
  return lse;
}

/* The gradient of causal attention (want, into dqkv) from the CPU's
 * probabilities att and output out, in double, and beside each element the
 * size of what a bf16 kernel may get wrong in it (mag): the sum of the
 * magnitudes of its terms, each term's factors perturbed as the kernel rounds
 * them (p and dS to bf16 as the products' operands; D = dout . out from the
 * bf16 output, which moves D by up to 2^-9 sum |dout| |out|). A sum of n
 * terms each off by a relative e is off by at most e times the sum of their
 * magnitudes: error / (|want| + mag) is then a few 2^-9 whatever the shape,
 * while a real bug (a term dropped or added by the mask, a wrong row of the
 * statistics) is O(1) on this scale. Measured against the gradient's RMS
 * instead, the rounding of the few large probabilities of the first keys
 * alone (2^-9 of p ~ 0.5, times |dout| ~ 1) is 1-3 % of dq's and dk's RMS. */
static void flash_backward_reference(float *dqkv, float *mag, const float *dout,
                                     const float *qkv, const float *att, const float *out,
                                     int B, int T, int C, int NH) {
  const int hs = C / NH;
  const double scale = 1.0 / sqrt((double)hs);
  const size_t nqkv = (size_t)B * T * 3 * C;
  double *acc = xmalloc(2 * nqkv * sizeof(double)), *m = acc + nqkv;
  memset(acc, 0, 2 * nqkv * sizeof(double));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < T; ++i) {
        const size_t ri = ((size_t)b * T + i) * 3 * C + h * hs, oi = ((size_t)b * T + i) * C + h * hs;
        double D = 0.0, dD = 0.0;
        for (int d = 0; d < hs; ++d) {
          D += (double)dout[oi + d] * out[oi + d];
          dD += fabs((double)dout[oi + d] * out[oi + d]);
        }
        for (int j = 0; j <= i; ++j) {
          const size_t rj = ((size_t)b * T + j) * 3 * C + h * hs;
          const double p = att[(((size_t)b * NH + h) * T + i) * T + j];
          double dp = 0.0;
          for (int d = 0; d < hs; ++d) dp += (double)dout[oi + d] * qkv[rj + 2 * C + d];
          const double ds = scale * p * (dp - D), ds_mag = fabs(ds) + scale * p * dD;
          for (int d = 0; d < hs; ++d) {
            acc[ri + d] += ds * qkv[rj + C + d];
            acc[rj + C + d] += ds * qkv[ri + d];
            acc[rj + 2 * C + d] += p * dout[oi + d];
            m[ri + d] += ds_mag * fabs(qkv[rj + C + d]);
            m[rj + C + d] += ds_mag * fabs(qkv[ri + d]);
            m[rj + 2 * C + d] += fabs(p * dout[oi + d]);
          }
        }
      }
  for (size_t i = 0; i < nqkv; ++i) dqkv[i] = (float)acc[i], mag[i] = (float)m[i];
  free(acc);
}

/* max over i of |got - want| / (|want| + mag); NaN is an infinite error. */
static double flash_err(const float *got, const float *want, const float *mag, size_t n) {
  double worst = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double e = fabs((double)got[i] - want[i]) / (fabs((double)want[i]) + mag[i] + DBL_MIN);
    worst = isnan(e) ? INFINITY : fmax(worst, e);
  }
  return worst;
}

/* One bf16 case through the table's entry points, whichever kernel the
 * attention mode picks, its errors recorded in rows fwd and bwd; dqkv starts
 * as NaN (backward writes every element); twice: a second backward over the
 * first's result gives the gradient again (it writes, never adds). NKV
 * key/value heads (0: NH):
 * the references run on the multi-head repeat_kv of the inputs (common/gqa.h),
 * and their dk and dv (with their bounds) are folded back. */
static void bf16_attention_case(int B, int T, int C, int NH, int NKV, const char *fwd,
                                const char *bwd, int twice) {
  const int nkv = NKV ? NKV : NH;
  const size_t nqkv = qkv_floats(B, T, C, NH, nkv), nmha = (size_t)B * T * 3 * C,
               no = (size_t)B * T * C, natt = (size_t)B * NH * T * T, nlse = (size_t)B * NH * T;
  float *qkv = round_bf16(rand_floats(nqkv, 0, 1), nqkv);
  float *mha = xmalloc(nmha * 4);
  gqa_repeat_kv(mha, qkv, B, T, C, NH, nkv);
  float *dout = round_bf16(rand_floats(no, 0, 1), no);
  float *dmha = xmalloc(nmha * 4), *out = xmalloc(no * 4), *att = xmalloc(natt * 4);
  float *nans = xmalloc(nqkv * 4);
  for (size_t i = 0; i < nqkv; ++i) nans[i] = NAN;
  uint16_t *g_qkv = dev_bf16(qkv, nqkv), *g_out = dev_alloc(no * 2), *g_dqkv = dev_bf16(nans, nqkv);
  uint16_t *g_dout = dev_bf16(dout, no);
  const fsdp_attention_forward_args_t dims = {.dt = FSDP_BF16, .B = B, .T = T, .C = C, .NH = NH,
                                              .NKV = NKV};
  ck_assert_uint_eq(fsdp_cuda_attention_state_floats(&dims), nlse);
  ck_assert_uint_eq(fsdp_cuda_attention_scratch_bytes(&dims), nlse * 4); /* no T^2 */
  float *g_lse = dev_alloc(nlse * 4), *g_scratch = dev_alloc(nlse * 4);
  OK(fsdp_cuda_attention_forward(
      &(fsdp_attention_forward_args_t){.dt = FSDP_BF16, .out = g_out, .att = g_lse, .qkv = g_qkv,
                                       .B = B, .T = T, .C = C, .NH = NH, .NKV = NKV},
      fs));
  const fsdp_attention_backward_args_t bargs = {.dt = FSDP_BF16, .dqkv = g_dqkv,
                                                .scratch = g_scratch, .dout = g_dout,
                                                .qkv = g_qkv, .out = g_out, .att = g_lse, .B = B,
                                                .T = T, .C = C, .NH = NH, .NKV = NKV};
  OK(fsdp_cuda_attention_backward(&bargs, fs));
  fsdp_attention_forward(out, att, mha, B, T, C, NH);
  float *lse = lse_reference(mha, B, T, C, NH), *got_lse = back_f32(g_lse, nlse);
  float *got = back_bf16(g_out, no), *got_d = back_bf16(g_dqkv, nqkv);
  float *mag_mha = xmalloc(nmha * 4);
  flash_backward_reference(dmha, mag_mha, dout, mha, att, out, B, T, C, NH);
  float *dqkv = xmalloc(nqkv * 4), *mag = xmalloc(nqkv * 4);
  gqa_fold_kv(dqkv, dmha, B, T, C, NH, nkv);
  gqa_fold_kv(mag, mag_mha, B, T, C, NH, nkv);
  double vmax = 0.0, worst = 0.0, lse_worst = 0.0;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c)
        vmax = fmax(vmax, fabs(mha[((size_t)b * T + t) * 3 * C + 2 * C + c]));
  for (size_t i = 0; i < no; ++i)
    worst = isnan(got[i]) ? INFINITY : fmax(worst, fabs((double)got[i] - out[i]));
  for (size_t i = 0; i < nlse; ++i)
    lse_worst = isnan(got_lse[i]) ? INFINITY : fmax(lse_worst, fabs((double)got_lse[i] - lse[i]));
  check_err(fwd, "out (|error| / max|v|)", worst / vmax, 1.0 / 128);
  check_err(fwd, "lse (|error|)", lse_worst, 1.0 / 128);
  check_err(bwd, "dqkv (|error| / (|dqkv| + bf16 bound))",
            flash_err(got_d, dqkv, mag, nqkv), TOL_BF16);
  if (twice) { /* the write contract: a second backward over the first's result */
    OK(fsdp_cuda_attention_backward(&bargs, fs));
    float *got2 = back_bf16(g_dqkv, nqkv);
    check_err(bwd, "dqkv after a second backward over it (written, not added)",
              flash_err(got2, dqkv, mag, nqkv), TOL_BF16);
    free(got2);
  }
  free(qkv), free(mha), free(dout), free(dmha), free(out), free(att), free(nans), free(got),
      free(got_d), free(lse), free(got_lse), free(mag_mha), free(dqkv), free(mag);
}

START_TEST(flash_attention) {
  rng_seed(seed + 5700 + (uint64_t)_i);
  OK(fsdp_cuda_attention_set_mode("flash")); /* the in-house kernel, cuDNN or not */
  bf16_attention_case(kFlash[_i].B, kFlash[_i].T, kFlash[_i].C, kFlash[_i].NH, kFlash[_i].NKV,
                      "attention_forward_bf16", "attention_backward_bf16", kFlash[_i].T < 1024);
}
END_TEST

/* Head sizes the kernel has no tiles for, misaligned tensors, KV heads that
 * do not divide the query heads and a missing scratch: refused by name before
 * anything is launched. */
START_TEST(flash_attention_refuses) {
  OK(fsdp_cuda_attention_set_mode("flash")); /* cuDNN takes head size 144 */
  uint16_t *buf = dev_alloc(3 * 4 * 160 * 2 * 2);
  float *lse = dev_alloc(4 * 4 * 4);
  fsdp_attention_forward_args_t fwd = {.dt = FSDP_BF16, .out = buf, .att = lse, .qkv = buf,
                                       .B = 1, .T = 4, .C = 40, .NH = 2};
  ck_assert_int_eq(fsdp_cuda_attention_forward(&fwd, fs), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "head size 20"));
  ck_assert_int_eq(fsdp_cuda_attention_backward(
                       &(fsdp_attention_backward_args_t){.dt = FSDP_BF16, .dqkv = buf,
                                                         .dout = buf, .qkv = buf, .out = buf,
                                                         .att = lse, .B = 1, .T = 4, .C = 144,
                                                         .NH = 1},
                       fs),
                   FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "head size 144"));
  fwd.out = buf + 1, fwd.C = 64, fwd.NH = 1;
  ck_assert_int_eq(fsdp_cuda_attention_forward(&fwd, fs), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "out at"));
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "16-byte aligned"));
  fwd.out = buf, fwd.C = 30, fwd.NH = 4;
  ck_assert_int_eq(fsdp_cuda_attention_forward(&fwd, fs), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "multiple of the 4 heads"));
  /* KV heads that do not divide the query heads, in both precisions */
  fwd.C = 64, fwd.NH = 4, fwd.NKV = 3;
  for (int bf16 = 0; bf16 <= 1; ++bf16) {
    fwd.dt = bf16 ? FSDP_BF16 : FSDP_F32;
    ck_assert_int_eq(fsdp_cuda_attention_forward(&fwd, fs), FSDP_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(
        strstr(fsdp_last_error(), "NKV 3 key/value heads do not divide the NH 4 query heads"));
  }
  /* backward without the scratch attention_scratch_bytes asks for */
  ck_assert_int_eq(fsdp_cuda_attention_backward(
                       &(fsdp_attention_backward_args_t){.dt = FSDP_BF16, .dqkv = buf,
                                                         .dout = buf, .qkv = buf, .out = buf,
                                                         .att = lse, .B = 1, .T = 4, .C = 64,
                                                         .NH = 4, .NKV = 2},
                       fs),
                   FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "no scratch"));
}
END_TEST

/* cuDNN's fused attention (attention_cudnn.cpp) against the same references
 * and bounds as the flash kernel: bf16 products with fp32 softmax and
 * accumulation, so the same error budget. Small shapes (T not a multiple of
 * any tile, head sizes 16, 32, 64; not T = 1, which cuDNN 9.14 refuses on an
 * H200: "s_q = s_kv = 1 is not supported", so auto runs flash there) and GPT-2's production layer at
 * batch 2 (T 1024, 12 heads of 64); grouped-query (rows *_cudnn_gqa): 4 query
 * heads over 2 KV heads, 6 over 1, and the Llama shapes, 32 heads over 8 of
 * 64 (Llama-3.2-1B, C 2048) and of 128 (C 4096). Skipped, named in the
 * table, where cuDNN does not load (the simulator has none). */
static const struct { int B, T, C, NH, NKV; } kCudnn[] = {
    {2, 65, 96, 3, 0},   {3, 77, 192, 3, 0},   {1, 130, 32, 2, 0},
    {2, 1024, 768, 12, 0}, {2, 65, 128, 4, 2}, {1, 77, 192, 6, 1},
    {2, 256, 2048, 32, 8}, {1, 256, 4096, 32, 8},
};

START_TEST(cudnn_attention) {
  const char *why = NULL;
  if (!fsdp_cudnn_load(&why)) {
    skip_row("attention_forward_cudnn", why);
    skip_row("attention_backward_cudnn", why);
    skip_row("attention_forward_cudnn_gqa", why);
    skip_row("attention_backward_cudnn_gqa", why);
    return;
  }
  rng_seed(seed + 5800 + (uint64_t)_i);
  const int B = kCudnn[_i].B, T = kCudnn[_i].T, C = kCudnn[_i].C, NH = kCudnn[_i].NH,
            NKV = kCudnn[_i].NKV;
  OK(fsdp_cuda_attention_set_mode("cudnn")); /* a shape cuDNN refuses fails, not falls back */
  int use_cudnn = 0;
  OK(fsdp_cuda_attention_pick(B, T, C, NH, NKV, &use_cudnn));
  ck_assert_msg(use_cudnn, "cuDNN is open but does not run B %d T %d C %d NH %d NKV %d", B, T, C,
                NH, NKV);
  if (!NKV) {
    char impl[512];
    OK(fsdp_cuda_attention_impl(fs, FSDP_BF16, B, T, C, NH, 0, impl, sizeof impl));
    ck_assert_msg(!strncmp(impl, "cudnn 9.", 8) && strchr(impl, '/'),
                  "cuDNN is open but the shape reports %s", impl);
    bf16_attention_case(B, T, C, NH, 0, "attention_forward_cudnn", "attention_backward_cudnn",
                        1);
  } else
    bf16_attention_case(B, T, C, NH, NKV, "attention_forward_cudnn_gqa",
                        "attention_backward_cudnn_gqa", 1);
}
END_TEST

/* The choice itself, wherever it runs: an unknown mode is refused; cuDNN
 * forced on a shape it cannot run (head size 20: cuDNN needs a multiple of
 * 8; or no cuDNN at all) is an error naming FSDP_ATTENTION and cuDNN's
 * reason, never a silent fallback; in auto mode the report names cuDNN with
 * its version and path or the in-house kernel with a reason, and f32 names
 * the probabilities kernel. */
START_TEST(attention_choice) {
  uint16_t *buf = dev_alloc(3 * 4 * 40 * 2);
  float *lse = dev_alloc(2 * 4 * 4);
  ck_assert_int_eq(fsdp_cuda_attention_set_mode("fast"), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "fast"));
  OK(fsdp_cuda_attention_set_mode("cudnn"));
  ck_assert_int_eq(fsdp_cuda_attention_forward(
                       &(fsdp_attention_forward_args_t){.dt = FSDP_BF16, .out = buf, .att = lse,
                                                        .qkv = buf, .B = 1, .T = 4, .C = 40,
                                                        .NH = 2},
                       fs),
                   FSDP_ERR_UNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "FSDP_ATTENTION=cudnn"));
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "cuDNN"));
  OK(fsdp_cuda_attention_set_mode("auto"));
  char impl[512];
  OK(fsdp_cuda_attention_impl(fs, FSDP_BF16, 2, 64, 128, 2, 0, impl, sizeof impl));
  const char *why = NULL;
  if (fsdp_cudnn_load(&why))
    ck_assert_msg(!strncmp(impl, "cudnn 9.", 8), "cuDNN loads but auto picked: %s", impl);
  else
    ck_assert_msg(!strncmp(impl, "in-house flash: ", 16) && strstr(impl, why),
                  "without cuDNN (%s) auto reported: %s", why, impl);
  OK(fsdp_cuda_attention_impl(fs, FSDP_F32, 2, 64, 128, 2, 0, impl, sizeof impl));
  ck_assert_ptr_nonnull(strstr(impl, "fp32"));
  check_err("attention_choice", "the choice's refusals and reports", 0.0, TOL_EXACT);
}
END_TEST

/* Grouped-query attention in bf16 where cuDNN cannot run the shape (head
 * size 20: no cuDNN graph; or no cuDNN at all: the simulator) goes to the
 * in-house flash kernel in auto mode, as multi-head does (flash_attention
 * checks its values), so a head size flash has no tiles for is refused
 * there by name, forward and backward, not computed wrong. */
START_TEST(attention_gqa_refusals) {
  uint16_t *buf = dev_alloc(4 * 8 * 80 * 2);
  float *lse = dev_alloc(4 * 4 * 4), *scratch = dev_alloc(4 * 4 * 4);
  const fsdp_attention_forward_args_t fwd = {.dt = FSDP_BF16, .out = buf, .att = lse, .qkv = buf,
                                             .B = 1, .T = 4, .C = 80, .NH = 4, .NKV = 2};
  const fsdp_attention_backward_args_t bwd = {.dt = FSDP_BF16, .dqkv = buf, .scratch = scratch,
                                              .dout = buf, .qkv = buf, .out = buf, .att = lse,
                                              .B = 1, .T = 4, .C = 80, .NH = 4, .NKV = 2};
  OK(fsdp_cuda_attention_set_mode("auto"));
  ck_assert_int_eq(fsdp_cuda_attention_forward(&fwd, fs), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(fsdp_last_error(), "head size 20"), "%s", fsdp_last_error());
  ck_assert_int_eq(fsdp_cuda_attention_backward(&bwd, fs), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(fsdp_last_error(), "head size 20"), "%s", fsdp_last_error());
  check_err("attention_gqa_refusals", "named errors", 0.0, TOL_EXACT);
}
END_TEST

START_TEST(attention_rejects_uneven_heads) {
  float *buf = dev_alloc(3 * 10 * 4 * 4);
  ck_assert_int_eq(fsdp_cuda_attention_forward(
                       &(fsdp_attention_forward_args_t){.dt = FSDP_F32, .out = buf, .att = buf,
                                                        .scratch = buf, .qkv = buf, .B = 1,
                                                        .T = 1, .C = 10, .NH = 3},
                       fs),
                   FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "multiple"));
}
END_TEST

/* ---- the table's refusals ----
 * The CUDA table is these entry points, every slot set; it refuses what it
 * has no kernel for, naming the op, before anything runs: an f16 LayerNorm,
 * and a product with its GELU on the host stream (the legacy stream would
 * race the engine's). */
START_TEST(table_refusals) {
  const fsdp_compute_ops_t *k = fsdp_compute_ops(FSDP_DEVICE_CUDA);
  ck_assert_ptr_nonnull(k);
  const char *missing = "?";
  ck_assert_msg(fsdp_compute_ops_complete(k, &missing), "CUDA table: slot %s is empty", missing);
  ck_assert_ptr_eq(k->layernorm_fused_forward, fsdp_cuda_layernorm_fused_forward);
  float *buf = dev_alloc(64 * 4);
  ck_assert_int_eq(k->layernorm_fused_forward(
                       &(fsdp_layernorm_forward_args_t){.dt = FSDP_F16, .out = buf, .mean = buf,
                                                        .rstd = buf, .inp = buf, .weight = buf,
                                                        .bias = buf, .N = 2, .C = 8},
                       fs),
                   FSDP_ERR_UNSUPPORTED);
  ck_assert_msg(strstr(fsdp_last_error(), "layernorm_fused_forward") &&
                    strstr(fsdp_last_error(), "f16"), "%s", fsdp_last_error());
  ck_assert_int_eq(k->matmul_forward(&(fsdp_matmul_forward_args_t){.dt = FSDP_F32, .out = buf,
                                                                   .pre = buf + 16,
                                                                   .inp = buf + 32,
                                                                   .weight = buf + 48, .B = 2,
                                                                   .C = 2, .OC = 2},
                                     FSDP_HOST_STREAM),
                   FSDP_ERR_INVALID_USAGE);
  ck_assert_msg(strstr(fsdp_last_error(), "matmul_forward") &&
                    strstr(fsdp_last_error(), "not a CUDA stream"), "%s", fsdp_last_error());
  check_err("table_refusals", "named errors", 0.0, TOL_EXACT);
}
END_TEST

/* ---- softmax cross-entropy ---- */

/* bad: row 1 gets the target V (out of range), whose loss and gradient row
 * must be NaN. masked: every logit but the first 64 and the target's is -inf
 * (a masked vocabulary), so most threads of a row see only -inf. pad: the
 * device's rows are V + pad apart, the pad columns a sentinel that must
 * survive. V = 50257 is GPT-2's vocabulary: rows 50257 apart (the scalar
 * form), 50304 (its head's: 16-byte packs) and 50261 (no whole number of
 * packs: the scalar form), each bf16 row staged in shared memory. */
#define XENT_WIDEST (-1) /* V: the widest bf16 row the device stages (kernels.h) */
#define XENT_PAST (-2)   /* V: one column more, read twice */
#define XENT_PACKS (-1)  /* pad: up to a whole number of 16-byte bf16 packs */
static const struct { int B, V, pad, bad, masked; } kXent[] = {
    {16, 50257, 0, 0, 0}, {5, 7, 0, 1, 0},     {1, 1, 0, 0, 0},     {64, 1000, 0, 1, 0},
    {4, 50257, 0, 0, 1},  {3, 50257, 47, 1, 0}, {2, 50257, 47, 0, 1}, {3, 50257, 4, 1, 0},
    {2, XENT_WIDEST, XENT_PACKS, 0, 0}, {2, XENT_PAST, XENT_PACKS, 0, 0},
};

#define XENT_SENTINEL 77.0f

/* The widest bf16 row fsdp_cuda_xent stages on the current device: 2-byte
 * columns, rounded up to 16 bytes, beside 384 bytes of scratch within the
 * opt-in shared memory per block and half an SM's less its reservation
 * (kernels.h). */
static int xent_widest(void) {
  int device = 0, optin = 0, per_sm = 0, reserved = 0;
  CU(cudaGetDevice(&device));
  CU(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  CU(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  CU(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device));
  const int budget = optin < per_sm / 2 - reserved ? optin : per_sm / 2 - reserved;
  return (budget - 384) / 16 * 16 / 2;
}

/* The fused op with rows ld = V + pad apart against fsdp_softmax_xent: the
 * losses of a pass without the gradient (logits untouched, never staged),
 * then of one writing it over the logits (staged as kernels.h says). */
static void xent_case(int bf16, int B, int V, int pad, int bad, int masked) {
  const int ld = V + pad;
  const size_t n = (size_t)B * V, np = (size_t)B * ld;
  const float scale = 1.0f / (float)B;
  const char *name = bf16 ? "xent_bf16" : "xent";
  const double tol = bf16 ? TOL_BF16 : TOL_F32;
  float *logits = rand_floats(n, 0, 4), *dl = xmalloc(n * 4), *loss = xmalloc(B * 4);
  float *host = xmalloc(np * 4);
  int *tgt = rand_tokens(B, V);
  if (bad) tgt[1] = V;
  for (size_t i = 0; i < n && masked; ++i)
    if (i % (size_t)V >= 64 && (int)(i % (size_t)V) != tgt[i / (size_t)V]) logits[i] = -INFINITY;
  if (bf16) round_bf16(logits, n);
  for (int b = 0; b < B; ++b) {
    loss[b] = (float)fsdp_softmax_xent(NULL, logits + (size_t)b * V, tgt + b, 1, V, scale);
    for (int j = 0; j < ld; ++j)
      host[(size_t)b * ld + j] = j < V ? logits[(size_t)b * V + j] : XENT_SENTINEL;
  }
  fsdp_softmax_xent(dl, logits, tgt, B, V, scale);
  int *g_tgt = dev_copy(tgt, B * sizeof(int));
  double *g_loss = dev_alloc(B * 8), *g_loss2 = dev_alloc(B * 8);
  const fsdp_dtype_t dt = act_dtype(bf16);
  void *g_logits = dev_act(bf16, host, np);
  fsdp_xent_args_t xa = {.dt = dt, .logits = g_logits, .ld = ld, .losses = g_loss2,
                         .targets = g_tgt, .B = B, .V = V, .scale = scale, .grad = 0};
  size_t staged = 1;
  OK(fsdp_cuda_xent_staged_bytes(&xa, &staged));
  ck_assert_msg(staged == 0, "%s V %d: a pass without the gradient staged %zu bytes", name, V,
                staged);
  OK(fsdp_cuda_xent(&xa, fs));
  float *kept = back_act(bf16, g_logits, np);
  xa.losses = g_loss, xa.grad = 1;
  const size_t want_staged = bf16 && V <= xent_widest() ? ((size_t)V * 2 + 15) / 16 * 16 : 0;
  OK(fsdp_cuda_xent_staged_bytes(&xa, &staged));
  ck_assert_msg(staged == want_staged, "%s V %d: %zu bytes staged, not %zu (widest %d)", name, V,
                staged, want_staged, xent_widest());
  OK(fsdp_cuda_xent(&xa, fs));
  float *got_pad = back_act(bf16, g_logits, np);
  int pad_ok = 1;
  float *got = xmalloc(n * 4);
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < ld; ++j) {
      if (j < V) got[(size_t)b * V + j] = got_pad[(size_t)b * ld + j];
      else pad_ok &= got_pad[(size_t)b * ld + j] == XENT_SENTINEL;
    }
  float *got_loss = back_losses(g_loss, B), *got_loss2 = back_losses(g_loss2, B);
  double err = max2(rel_err(got, dl, n), rel_err(got_loss, loss, B));
  err = max2(err, rel_err(kept, host, np)); /* grad 0 writes nothing */
  err = pad_ok ? err : INFINITY;            /* nor does anything past V */
  check_err(name, "dlogits/losses", max2(err, rel_err(got_loss2, loss, B)), tol);
  free(logits), free(dl), free(loss), free(host), free(tgt), free(got), free(got_pad), free(kept);
  free(got_loss), free(got_loss2);
}

START_TEST(xent) {
  rng_seed(seed + 6000 + (uint64_t)_i);
  const int V = kXent[_i].V == XENT_WIDEST ? xent_widest()
                : kXent[_i].V == XENT_PAST ? xent_widest() + 1
                                           : kXent[_i].V;
  const int pad = kXent[_i].pad == XENT_PACKS ? (8 - V % 8) % 8 : kXent[_i].pad;
  for (int bf16 = 0; bf16 <= 1; ++bf16)
    xent_case(bf16, kXent[_i].B, V, pad, kXent[_i].bad, kXent[_i].masked);
}
END_TEST

/* ---- GPT-2's vocabulary head: rows ld apart, the gradient over the logits ----
 * Against the CPU's backend/cpu/head.h (bitwise the unpadded kernels: test_layers).
 * Device buffers start with a sentinel in columns [V, ld), which must survive
 * forward, the in-place cross-entropy and backward; it is large and positive,
 * so a kernel that took a pad column for a logit would have its softmax (and
 * the loss) dominated by it. The CUDA products split the vocabulary at V / 128
 * * 128 (blas.cu): GPT-2's 50176 + 81, 128 + 122, 896 + 104, a whole 128, and
 * a vocabulary under 128 (the remainder alone). */

static const struct { int B, C, V; } kHead[] = {
    {16, 64, 50257}, {7, 13, 250}, {4, 768, 1000}, {3, 5, 128}, {5, 9, 100},
};

#define HEAD_SENTINEL 77.0f

/* (B, ld) host rows: x's V columns, the sentinel after them. */
static float *padded_rows(const float *x, int B, int V, int ld) {
  float *h = xmalloc((size_t)B * ld * sizeof(float));
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < ld; ++j) h[(size_t)b * ld + j] = j < V ? x[(size_t)b * V + j] : HEAD_SENTINEL;
  return h;
}

/* The V columns of (B, ld) rows packed; *pad_ok: every pad column kept the sentinel. */
static float *packed_rows(const float *h, int B, int V, int ld, int *pad_ok) {
  float *x = xmalloc((size_t)B * V * sizeof(float));
  *pad_ok = 1;
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < ld; ++j) {
      if (j < V) x[(size_t)b * V + j] = h[(size_t)b * ld + j];
      else *pad_ok &= h[(size_t)b * ld + j] == HEAD_SENTINEL;
    }
  return x;
}

static void head_case(int bf16, int B, int C, int V) {
  const int ld = (V + 127) / 128 * 128;
  const size_t ni = (size_t)B * C, nw = (size_t)V * C, nl = (size_t)B * V, np = (size_t)B * ld;
  const double tol = bf16 ? TOL_BF16 : TOL_F32;
  const float scale = 1.0f / (float)B;
  float *inp = rand_floats(ni, 0, 1), *w = rand_floats(nw, 0, 0.5), *dinp = rand_floats(ni, 0, 1);
  float *dw = rand_floats(nw, 0, 1), *zero_l = xmalloc(nl * 4), *loss = xmalloc(B * 4);
  int *tgt = rand_tokens(B, V);
  if (bf16) round_bf16(inp, ni), round_bf16(w, nw), round_bf16(dinp, ni);
  for (size_t i = 0; i < nl; ++i) zero_l[i] = 0.0f;
  float *pad = padded_rows(zero_l, B, V, ld), *host = xmalloc(np * 4);
  int *g_tgt = dev_copy(tgt, B * sizeof(int));
  float *g_dw = dev_f32(dw, nw);
  double *g_loss = dev_alloc(B * 8), *g_loss0 = dev_alloc(B * 8);
  int pad_fwd, pad_bwd;
  const fsdp_dtype_t dt = act_dtype(bf16);
  void *g_l = dev_act(bf16, pad, np), *g_inp = dev_act(bf16, inp, ni), *g_w = dev_act(bf16, w, nw);
  void *g_dinp = dev_act(bf16, dinp, ni);
  OK(fsdp_cuda_head_forward(&(fsdp_head_forward_args_t){.dt = dt, .logits = g_l, .ld = ld,
                                                        .inp = g_inp, .wte = g_w, .B = B, .C = C,
                                                        .V = V},
                            fs));
  fsdp_xent_args_t xa = {.dt = dt, .logits = g_l, .ld = ld, .losses = g_loss0, .targets = g_tgt,
                         .B = B, .V = V, .scale = scale, .grad = 0};
  OK(fsdp_cuda_xent(&xa, fs));
  float *h = back_act(bf16, g_l, np);
  float *logits = packed_rows(h, B, V, ld, &pad_fwd);
  free(h);
  xa.losses = g_loss, xa.grad = 1;
  OK(fsdp_cuda_xent(&xa, fs));
  OK(fsdp_cuda_head_backward(&(fsdp_head_backward_args_t){.dt = dt, .dinp = g_dinp, .dwte = g_dw,
                                                          .dlogits = g_l, .ld = ld, .inp = g_inp,
                                                          .wte = g_w, .B = B, .C = C, .V = V},
                             fs));
  h = back_act(bf16, g_l, np);
  memcpy(host, h, np * 4);
  free(h);
  float *got_dinp = back_act(bf16, g_dinp, ni);
  float *grad = packed_rows(host, B, V, ld, &pad_bwd);
  float *got_dw = back_f32(g_dw, nw), *got_loss = back_losses(g_loss, B);
  float *got_loss0 = back_losses(g_loss0, B);
  /* The CPU: forward into its own padded rows; the cross-entropy and backward
   * from the GPU's logits, so each kernel is measured alone. */
  float *want_l = xmalloc(np * 4), *want_g = padded_rows(logits, B, V, ld);
  nn_head_forward(want_l, ld, inp, w, B, C, V);
  float *want_logits = packed_rows(want_l, B, V, ld, &(int){0});
  for (int b = 0; b < B; ++b)
    loss[b] = (float)nn_xent_inplace(want_g + (size_t)b * ld, ld, NULL, tgt + b, 1, V, scale, 1);
  float *want_grad = packed_rows(want_g, B, V, ld, &(int){0});
  if (bf16) round_bf16(want_grad, nl); /* the GPU stores the gradient in bf16 */
  nn_head_backward(dinp, dw, grad, V, inp, w, B, C, V);
  char name[64];
  check_err(row_name(name, "head_forward", bf16 ? "_bf16" : ""), "logits",
            pad_fwd ? rel_err(logits, want_logits, nl) : INFINITY, tol);
  check_err(row_name(name, "xent_inplace", bf16 ? "_bf16" : ""), "gradient/losses",
            pad_bwd ? max2(max2(rel_err(grad, want_grad, nl), rel_err(got_loss, loss, B)),
                           rel_err(got_loss0, loss, B))
                    : INFINITY,
            tol);
  check_err(row_name(name, "head_backward", bf16 ? "_bf16" : ""), "dinp/dwte",
            max2(rel_err(got_dinp, dinp, ni), rel_err(got_dw, dw, nw)), tol);
  free(inp), free(w), free(dinp), free(dw), free(zero_l), free(loss), free(tgt), free(pad);
  free(host), free(logits), free(grad), free(got_dinp), free(got_dw), free(got_loss);
  free(got_loss0), free(want_l), free(want_g), free(want_logits), free(want_grad);
}

START_TEST(head) {
  rng_seed(seed + 6500 + (uint64_t)_i);
  for (int bf16 = 0; bf16 <= 1; ++bf16) head_case(bf16, kHead[_i].B, kHead[_i].C, kHead[_i].V);
}
END_TEST

/* ---- optimizers ---- */

#define OPT_N 1000003

static const struct { float lr, wd; int decay; int64_t t; } kAdamw[] = {
    {1e-3f, 0.1f, 1, 1}, {3e-4f, 0.1f, 0, 10}, {1e-2f, 0.0f, 1, 1000},
};

START_TEST(adamw) {
  rng_seed(seed + 7000 + (uint64_t)_i);
  fsdp_optim_config_t c = FSDP_OPTIM_CONFIG_INIT;
  c.weight_decay = kAdamw[_i].wd;
  const size_t n = OPT_N;
  float *p = rand_floats(n, 0, 1), *g = rand_floats(n, 0, 1), *m = rand_floats(n, 0, 0.1);
  float *v = rand_floats(n, 0.005, 0.005); /* second moments are >= 0 */
  float *g_p = dev_f32(p, n), *g_m = dev_f32(m, n), *g_v = dev_f32(v, n);
  /* One launch over three runs of alternating decay (as a unit's tensors),
   * with a clipping factor on case 1, against the CPU run by run; the 16-bit
   * copy (bf16, fp16, none by case) is the GPU's own result rounded as the
   * host rounds it, bit for bit. */
  const size_t cut[4] = {0, n / 3, 2 * n / 3, n};
  const int d0 = kAdamw[_i].decay;
  const float coef = _i == 1 ? 0.5f : 1.0f;
  const fsdp_dtype_t lp_dt = _i == 0 ? FSDP_BF16 : FSDP_F16;
  uint16_t *g_lp = _i < 2 ? dev_alloc(n * sizeof(uint16_t)) : NULL;
  unsigned long long runs[3];
  for (int r = 0; r < 3; r++) runs[r] = (unsigned long long)cut[r] << 1 | (unsigned)(d0 ^ (r & 1));
  OK(fsdp_cuda_adamw_multi(&(fsdp_adamw_args_t){.param = g_p, .grad = dev_f32(g, n), .m = g_m,
                                                .v = g_v, .param_lp = g_lp, .lp_dtype = lp_dt,
                                                .n = n, .runs = dev_copy(runs, sizeof runs),
                                                .n_runs = 3, .coef = coef, .c = &c,
                                                .lr = kAdamw[_i].lr, .t = kAdamw[_i].t},
                           fs));
  for (size_t i = 0; i < n && coef != 1.0f; i++) g[i] *= coef;
  for (int r = 0; r < 3; r++)
    fsdp_adamw_update(p + cut[r], g + cut[r], m + cut[r], v + cut[r], cut[r + 1] - cut[r], &c,
                      kAdamw[_i].lr, kAdamw[_i].t, d0 ^ (r & 1));
  float *got_p = back_f32(g_p, n), *got_m = back_f32(g_m, n), *got_v = back_f32(g_v, n);
  double err = max2(rel_err(got_p, p, n), rel_err(got_m, m, n));
  check_err("adamw_update", "param/m/v", max2(err, rel_err(got_v, v, n)), TOL_F32);
  if (g_lp) {
    uint16_t *got_lp = xmalloc(n * sizeof(uint16_t));
    host_copy(got_lp, g_lp, n * sizeof(uint16_t));
    size_t bad = 0, first = n;
    for (size_t i = 0; i < n; i++) {
      const uint16_t want = lp_dt == FSDP_BF16 ? fsdp_f32_to_bf16(got_p[i])
                                               : fsdp_f32_to_f16(got_p[i]);
      if (got_lp[i] != want && bad++ == 0) first = i;
    }
    ck_assert_msg(bad == 0, "adamw_multi's %s copy: %zu of %zu elements are not the updated "
                  "parameter rounded (first at %zu)", fsdp_dtype_name(lp_dt), bad, n, first);
    free(got_lp);
  }
  free(p), free(g), free(m), free(v), free(got_p), free(got_m), free(got_v);
}
END_TEST

/* Every branch of fsdp_sgd_update: plain, first with and without Nesterov,
 * later with and without Nesterov. */
static const struct { float momentum; int nesterov, first, decay; } kSgd[] = {
    {0.0f, 0, 0, 1}, {0.9f, 0, 1, 1}, {0.9f, 0, 0, 0}, {0.9f, 1, 1, 1}, {0.9f, 1, 0, 1},
};

START_TEST(sgd) {
  rng_seed(seed + 8000 + (uint64_t)_i);
  fsdp_optim_config_t c = FSDP_OPTIM_CONFIG_INIT;
  c.kind = FSDP_OPTIM_SGD;
  c.momentum = kSgd[_i].momentum;
  c.nesterov = kSgd[_i].nesterov;
  c.weight_decay = 0.01f;
  const size_t n = OPT_N;
  const float lr = 0.05f;
  float *p = rand_floats(n, 0, 1), *g = rand_floats(n, 0, 1), *buf = rand_floats(n, 0, 1);
  float *g_p = dev_f32(p, n), *g_buf = dev_f32(buf, n);
  OK(fsdp_cuda_sgd_update(&(fsdp_sgd_args_t){.param = g_p, .grad = dev_f32(g, n), .buf = g_buf,
                                             .n = n, .c = &c, .lr = lr, .first = kSgd[_i].first,
                                             .decay = kSgd[_i].decay},
                          fs));
  fsdp_sgd_update(p, g, buf, n, &c, lr, kSgd[_i].first, kSgd[_i].decay);
  float *got_p = back_f32(g_p, n), *got_buf = back_f32(g_buf, n);
  check_err("sgd_update", "param/buf", max2(rel_err(got_p, p, n), rel_err(got_buf, buf, n)),
            TOL_F32);
  free(p), free(g), free(buf), free(got_p), free(got_buf);
}
END_TEST

/* ---- shard kernels ---- */

/* Sizes of the shard kernels and casts. The last passes FSDP_CUDA_MAX_GRID *
 * 256 elements: the grid-stride loops wrap. */
static const size_t kSizes[] = {1, 1000, 1048579, 16781315};

/* 10000019 needs more blocks than FSDP_CUDA_SUMSQ_PARTIALS: the capped grid
 * strides. */
static const size_t kSumsq[] = {0, 1, 1000, 4097, 10000019};

START_TEST(sum_squares) {
  rng_seed(seed + 9000 + (uint64_t)_i);
  const size_t n = kSumsq[_i];
  float *x = rand_floats(n, 0, 1);
  double want = 0.0, got[2];
  for (size_t i = 0; i < n; ++i) want += (double)x[i] * x[i]; /* src/engine/step.c's loop */
  float *g_x = dev_f32(x, n);
  double *g_out = dev_alloc(2 * sizeof(double));
  double *g_part = dev_alloc(FSDP_CUDA_SUMSQ_PARTIALS * sizeof(double));
  OK(fsdp_cuda_sum_squares(
      &(fsdp_sum_squares_args_t){.out = g_out, .partials = g_part, .x = g_x, .n = n}, fs));
  OK(fsdp_cuda_sum_squares(
      &(fsdp_sum_squares_args_t){.out = g_out + 1, .partials = g_part, .x = g_x, .n = n}, fs));
  host_copy(got, g_out, sizeof got);
  ck_assert_msg(!memcmp(&got[0], &got[1], sizeof(double)),
                "sum_squares is not deterministic: %.17g then %.17g", got[0], got[1]);
  const double err = fabs(got[0] - want) / fmax(fabs(want), DBL_MIN);
  check_err("sum_squares", "sum", err, TOL_SUMSQ);
  free(x);
}
END_TEST

START_TEST(scale_axpy) {
  rng_seed(seed + 10000 + (uint64_t)_i);
  const size_t n = kSizes[_i];
  const float s = 0.37f, a = 0.25f;
  float *x = rand_floats(n, 0, 1), *y = rand_floats(n, 0, 1), *y16 = copy_floats(y, n);
  float *xr = round_bf16(copy_floats(x, n), n), *g_y = dev_f32(y, n), *g_y16 = dev_f32(y, n);
  float *g_x = dev_f32(x, n);
  OK(fsdp_cuda_axpy(&(fsdp_axpy_args_t){.y = g_y, .xdt = FSDP_F32, .x = g_x, .alpha = a, .n = n},
                    fs));
  OK(fsdp_cuda_axpy(&(fsdp_axpy_args_t){.y = g_y16, .xdt = FSDP_BF16, .x = dev_bf16(x, n),
                                        .alpha = a, .n = n},
                    fs));
  OK(fsdp_cuda_scale(&(fsdp_scale_args_t){.x = g_x, .alpha = s, .n = n}, fs));
  /* The engine's loops: src/engine/schedule.c (g += scale * src), step.c (g *= coef). */
  for (size_t i = 0; i < n; ++i) y[i] += a * x[i], y16[i] += a * xr[i], x[i] *= s;
  float *got_y = back_f32(g_y, n), *got_y16 = back_f32(g_y16, n), *got_x = back_f32(g_x, n);
  check_err("axpy", "y", rel_err(got_y, y, n), TOL_F32);
  check_err("axpy_bf16", "y", rel_err(got_y16, y16, n), TOL_F32);
  check_err("scale", "x", rel_err(got_x, x, n), TOL_F32);
  free(x), free(y), free(y16), free(xr), free(got_y), free(got_y16), free(got_x);
}
END_TEST

/* ---- casts: bit for bit ---- */

static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Random floats over the whole exponent range (subnormals to overflow), after
 * the cases that decide rounding: ties to even both ways, the carry into the
 * exponent, overflow to inf, signed zeros, infinities, NaNs with payloads. */
static float *cast_inputs(size_t n) {
  static const uint32_t special[] = {
      0x3f808000u, 0x3f818000u, 0x3f80c000u, 0x3f807fffu, 0x7f7fffffu, 0x7f7f8000u,
      0xff7fffffu, 0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x7f800000u,
      0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fa5a5a5u, 0xff812345u,
  };
  float *x = xmalloc(n * sizeof(float));
  for (size_t i = 0; i < n; ++i) {
    if (i < (size_t)LEN(special)) {
      x[i] = from_bits(special[i]);
      continue;
    }
    /* |x| < 2^127: converting a larger double to float would be undefined. */
    const int e = (int)((rnd() + 1.0) * 138.5) - 150; /* 2^-150 .. 2^126 */
    x[i] = (float)ldexp(rnd(), e);
  }
  return x;
}

/* Each 16-bit type's device casts against its host reference. */
static const struct cast_case {
  const char *narrow_name, *widen_name;
  uint16_t (*narrow)(float);
  float (*widen)(uint16_t);
  fsdp_dtype_t dt; /* the 16-bit side of fsdp_cuda_cast */
} kCasts[] = {
    {"f32_to_bf16", "bf16_to_f32", fsdp_f32_to_bf16, fsdp_bf16_to_f32, FSDP_BF16},
    {"f32_to_f16", "f16_to_f32", fsdp_f32_to_f16, fsdp_f16_to_f32, FSDP_F16},
};

/* Bit for bit against the host casts over the inputs above (normals,
 * subnormals, overflow, NaN, inf), and widening every one of the 65536
 * 16-bit patterns. */
START_TEST(casts) {
  const struct cast_case *c = &kCasts[_i];
  rng_seed(seed + 11000 + 1000 * (uint64_t)_i);
  const size_t n = kSizes[LEN(kSizes) - 1];
  float *x = cast_inputs(n);
  uint16_t *want = xmalloc(n * 2), *got = xmalloc(n * 2);
  for (size_t i = 0; i < n; ++i) want[i] = c->narrow(x[i]);
  uint16_t *g_n = dev_alloc(n * 2);
  OK(fsdp_cuda_cast(&(fsdp_cast_args_t){.dst_dt = c->dt, .dst = g_n, .src_dt = FSDP_F32,
                                        .src = dev_f32(x, n), .n = n},
                    fs));
  host_copy(got, g_n, n * 2);
  size_t bad = 0, first = 0;
  for (size_t i = n; i-- > 0;)
    if (got[i] != want[i]) bad++, first = i;
  check_err(c->narrow_name, "bits", bad ? INFINITY : 0.0, TOL_EXACT);
  ck_assert_msg(!bad, "%s: %zu of %zu differ, first at %zu: %a gave 0x%04x not 0x%04x",
                c->narrow_name, bad, n, first, (double)x[first], got[first], want[first]);
  uint16_t *all = xmalloc(65536 * 2);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = (uint16_t)i;
  float *g_f = dev_alloc(65536 * 4), *wide = xmalloc(65536 * 4);
  OK(fsdp_cuda_cast(&(fsdp_cast_args_t){.dst_dt = FSDP_F32, .dst = g_f, .src_dt = c->dt,
                                        .src = dev_copy(all, 65536 * 2), .n = 65536},
                    fs));
  host_copy(wide, g_f, 65536 * 4);
  bad = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const float w = c->widen((uint16_t)i);
    bad += memcmp(&w, &wide[i], sizeof w) != 0;
  }
  check_err(c->widen_name, "bits", bad ? INFINITY : 0.0, TOL_EXACT);
  free(x), free(want), free(got), free(all), free(wide);
}
END_TEST

static void add_test(Suite *s, const char *name, const TTest *test, int n);

/* ---- production shapes (FSDP_TEST_BIG=1: the kernels-big test) ----
 * GPT-2's real sizes, once each, at few rows to keep the simulator's time
 * sane: the size is the point (index arithmetic past 2^20 elements, rows
 * longer than a block, grid-stride loops over rows), not the row count. */

/* Attention (and its row softmax) at T = 1024, GPT-2's context: 1024 x 1024
 * score rows per head, 2 heads of 64. */
START_TEST(big_attention) {
  rng_seed(seed + 9000);
  attention_case(1, 1024, 128, 2, 0);
}
END_TEST

/* The flash kernel at production shapes, T = 1024, one batch row each (the
 * rows are independent blocks; the simulator's tensor cores are fibers):
 * GPT-2's layer (12 heads of 64) and Llama-3-8B's attention geometry (heads
 * of 128, 4 query heads per KV head) at a quarter of its 32 heads (8 over 2:
 * each head's work and the kernels' paths are the same; all 32 made this
 * test 373 s against 86 s on a shared 2-core machine), forward, lse and
 * backward. */
START_TEST(big_flash_attention) {
  rng_seed(seed + 9050);
  OK(fsdp_cuda_attention_set_mode("flash"));
  bf16_attention_case(1, 1024, 768, 12, 0, "attention_forward_bf16", "attention_backward_bf16", 0);
  dev_free_all();
  bf16_attention_case(1, 1024, 1024, 8, 2, "attention_forward_bf16", "attention_backward_bf16",
                      0);
}
END_TEST

/* The vocabulary product in bf16: out (B, 50257) = inp (B, 768) W^T, W of
 * 50257 rows: leading dimension 50257 for cuBLAS, an odd one. */
START_TEST(big_vocab_matmul) {
  rng_seed(seed + 9100);
  matmul_case(1, 4, 768, 50257, 1, 0, 0, 1, 0, 0);
}
END_TEST

/* Cross-entropy over 16,384 rows (B 16 x T 1024) of a small vocabulary (the
 * row count is the point: one block per row), and over GPT-2's 50257 in bf16
 * at 8 rows. */
START_TEST(big_xent) {
  rng_seed(seed + 9200);
  xent_case(0, 16384, 64, 0, 1, 0);
  xent_case(1, 8, 50257, 0, 0, 0);
}
END_TEST

/* Residual + LayerNorm at C = 1600 (GPT-2 XL), both precisions, with dinp. */
START_TEST(big_layernorm) {
  rng_seed(seed + 9300);
  for (int bf16 = 0; bf16 <= 1; ++bf16) {
    fused_ln_case(bf16, 48, 1600, 1, 0, 3.0, 1);
    dev_free_all();
  }
}
END_TEST

/* The fused products at BT = 2048 rows and 768 outputs: the bias gradient's
 * column sums over all their row slices (a 3-wide input keeps the reference
 * product cheap), and residual + LayerNorm over 2048 rows of C = 768. */
START_TEST(big_fused) {
  rng_seed(seed + 9400);
  for (int bf16 = 0; bf16 <= 1; ++bf16) {
    matmul_case(bf16, 2048, 3, 768, 0, 1, 0, 1, 0, 0);
    fused_ln_case(bf16, 2048, 768, 1, 0, 3.0, 1);
    dev_free_all();
  }
}
END_TEST

/* The Llama family's production shapes: Llama-3.2-1B's C 2048 (32 heads of
 * 64 over 8 KV heads, its llama3-scaled frequencies, F 8192) and a C 4096
 * layer (32 heads of 128 over 8, HF's default frequencies): RMSNorm with its
 * residual, RoPE at positions 4000.., SwiGLU, and fp32 grouped-query
 * attention at T = 256 (bf16's: big_flash_attention and cudnn_attention). */
START_TEST(big_llama) {
  rng_seed(seed + 9500);
  for (int bf16 = 0; bf16 <= 1; ++bf16) {
    rmsnorm_case(bf16, 16, 2048, 1, 0, 1e-5f, 0.0);
    rmsnorm_case(bf16, 16, 4096, 1, 0, 1e-6f, 0.0);
    rope_case(bf16, 1, 64, 32, 8, 64, 4000, 1);
    rope_case(bf16, 1, 64, 32, 8, 128, 4000, 0);
    swiglu_case(bf16, 8, 8192, 0, 4.0);
    dev_free_all();
  }
  attention_case(1, 256, 2048, 32, 8);
  attention_case(1, 256, 4096, 32, 8);
}
END_TEST

static int big_mode(void) {
  const char *b = getenv("FSDP_TEST_BIG");
  return b && *b && strcmp(b, "0") != 0;
}

static Suite *kernels_big_suite(void) {
  Suite *s = suite_create("cuda_kernels_big");
  add_test(s, "big_attention", big_attention, 1);
  add_test(s, "big_flash_attention", big_flash_attention, 1);
  add_test(s, "big_vocab_matmul", big_vocab_matmul, 1);
  add_test(s, "big_xent", big_xent, 1);
  add_test(s, "big_layernorm", big_layernorm, 1);
  add_test(s, "big_fused", big_fused, 1);
  add_test(s, "big_llama", big_llama, 1);
  return s;
}

/* ---- the suite ---- */

/* Before every test, failed ones too: no device buffers, attention's choice
 * back to auto (cleared). */
static void fresh_test(void) {
  dev_free_all();
  ck_assert_int_eq(fsdp_cuda_attention_set_mode("auto"), FSDP_SUCCESS);
}

static void add_test(Suite *s, const char *name, const TTest *test, int n) {
  TCase *tc = tcase_create(name);
  tcase_add_checked_fixture(tc, fresh_test, NULL);
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, test, 0, n);
  suite_add_tcase(s, tc);
}

static Suite *kernels_suite(void) {
  Suite *s = suite_create("cuda_kernels");
  add_test(s, "matmul", matmul, LEN(kMatmul));
  add_test(s, "fused_layernorm", fused_layernorm, LEN(kFusedLn));
  add_test(s, "layernorm_repeat", layernorm_repeat, LEN(kLnRepeat));
  add_test(s, "gelu_long", gelu_long, LEN(kLong));
  add_test(s, "fused_scratch_refused", fused_scratch_refused, 1);
  add_test(s, "product_choice", product_choice, 1);
  add_test(s, "embedding", embedding, LEN(kEmbedding));
  add_test(s, "rmsnorm", rmsnorm, LEN(kRms));
  add_test(s, "rope", rope, LEN(kRope));
  add_test(s, "swiglu", swiglu, LEN(kSwiglu));
  add_test(s, "llama_refusals", llama_refusals, 1);
  add_test(s, "attention", attention, LEN(kAttention));
  add_test(s, "flash_attention", flash_attention, LEN(kFlash));
  add_test(s, "flash_attention_refuses", flash_attention_refuses, 1);
  add_test(s, "cudnn_attention", cudnn_attention, LEN(kCudnn));
  add_test(s, "attention_choice", attention_choice, 1);
  add_test(s, "attention_heads", attention_rejects_uneven_heads, 1);
  add_test(s, "attention_gqa_refusals", attention_gqa_refusals, 1);
  add_test(s, "table_refusals", table_refusals, 1);
  add_test(s, "xent", xent, LEN(kXent));
  add_test(s, "head", head, LEN(kHead));
  add_test(s, "adamw", adamw, LEN(kAdamw));
  add_test(s, "sgd", sgd, LEN(kSgd));
  add_test(s, "sum_squares", sum_squares, LEN(kSumsq));
  add_test(s, "scale_axpy", scale_axpy, LEN(kSizes));
  add_test(s, "casts", casts, LEN(kCasts));
  return s;
}

static int write_report(void) {
  const char *path = getenv("FSDP_CUDA_REPORT");
  if (!path || !*path) return 0;
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "test_kernels: cannot write FSDP_CUDA_REPORT %s\n", path);
    return 1;
  }
  print_table(f);
  return fclose(f) != 0;
}

int main(void) {
  const int gate = fsdp_cuda_gate("test_kernels");
  if (gate) return gate;
  struct cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess ||
      fsdp_stream_create_cuda("test_kernels", 0, &fs) != FSDP_SUCCESS) {
    printf("test_kernels: device 0 is not usable: %s / %s\n",
           cudaGetErrorString(cudaGetLastError()), fsdp_last_error());
    return EXIT_FAILURE;
  }
  stream = fsdp_stream_cuda_handle(fs);
  const char *s = getenv("FSDP_TEST_SEED");
  seed = s && *s ? strtoull(s, NULL, 10) : (unsigned long long)time(NULL) ^ (unsigned)getpid();
  snprintf(device_line, sizeof device_line, "device: %s (sm_%d%d), FSDP_TEST_SEED=%llu",
           prop.name, prop.major, prop.minor, seed);
  printf("test_kernels: %s\n", device_line);

  SRunner *sr = srunner_create(big_mode() ? kernels_big_suite() : kernels_suite());
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);

  dev_free_all();
  if (fsdp_cuda_blas_release() != FSDP_SUCCESS) {
    printf("test_kernels: fsdp_cuda_blas_release: %s\n", fsdp_last_error());
    failed++;
  }
  fsdp_stream_destroy(fs);
  print_table(stdout);
  failed += write_report();
  const char *only = getenv("CK_RUN_CASE"); /* a case by name checks what it names */
  if (!big_mode() && !(only && *only)) /* the big shapes check a few kernels only */
    for (int i = 0; i < LEN(kKernels); ++i) /* a kernel left unchecked */
      failed += !table[i].cases && !table[i].skipped[0];
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
