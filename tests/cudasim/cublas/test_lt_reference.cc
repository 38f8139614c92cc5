/* tests/cudasim/cublas/test_lt_reference.cc — the simulated cuBLASLt's
 * epilogues (lt_reference.cc) against the reference product
 * (gemm_reference.cc) followed by a separate pass written here in double, in
 * the row-major mappings fsdp's blas.cu uses for a linear layer: forward with
 * bias and with GELU keeping its input (aux rows wider than the output, the
 * gaps left untouched), backward d(input) times GELU's slope with the bias
 * gradient, dweight with the bias gradient over B, and a Conv1D's dweight
 * accumulated in fp32 over bf16 or fp32 operands with the bias gradient over
 * A (fp32, C's type); fp32 and bf16; and every
 * epilogue refusal (aux leading dimension below the rows or not divisible by
 * 8, a missing pointer, a batched or unmodelled epilogue). Needs no CUDA
 * runtime. Exit 0 when every check passes. */
#include <math.h>
#include <stdio.h>

#include <vector>

#include "../sim_test.h"
#include "lt_reference.h"

/* Values in [-2, 2] that are not short binary fractions, so GELU and the
 * roundings are exercised. */
static double value(unsigned seed, long long i) {
  unsigned x = seed * 2654435761u + (unsigned)i * 40503u + 12345u;
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  x ^= x >> 15;
  return ((int)(x % 4001u) - 2000) / 1000.0;
}

/* A typed buffer of n elements, NaN-filled, holding what the test puts. */
struct buf {
  cudaDataType t;
  std::vector<float> f;
  std::vector<unsigned short> h;
  buf(cudaDataType t_, size_t n) : t(t_), f(t_ == CUDA_R_32F ? n : 0, NAN),
                                   h(t_ == CUDA_R_16BF ? n : 0, sim_bf16_from_float(NAN)) {}
  void *ptr() { return t == CUDA_R_32F ? (void *)f.data() : (void *)h.data(); }
  void set(size_t i, double v) {
    if (t == CUDA_R_32F) f[i] = (float)v;
    else h[i] = sim_bf16_from_float((float)v);
  }
  double get(size_t i) const { return t == CUDA_R_32F ? f[i] : sim_bf16_to_float(h[i]); }
  void fill(unsigned seed, size_t n) {
    for (size_t i = 0; i < n; ++i) set(i, value(seed, (long long)i));
  }
};

static double gelu(double x) {
  return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
static double gelu_slope(double x) {
  const double s = sqrt(2.0 / M_PI), t = tanh(s * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

/* One rounding of the output type plus fp32 noise. */
static bool near(double got, double want, cudaDataType t) {
  const double rel = t == CUDA_R_16BF ? 1.0 / 128 : 1e-5;
  return fabs(got - want) <= rel * fabs(want) + (t == CUDA_R_16BF ? 1e-2 : 1e-5);
}

/* The product alone, rounded to fp32: gemm_reference with an fp32 C. */
static std::vector<float> product(sim_gemm g) {
  std::vector<float> c((size_t)g.m * g.n);
  g.C = c.data();
  g.ctype = CUDA_R_32F;
  g.ldc = g.m;
  const float one = 1.0f, zero = 0.0f;
  char why[512];
  const cublasStatus_t st = sim_gemm_check(&g, &one, &zero, why, sizeof why);
  CHECK(st == CUBLAS_STATUS_SUCCESS, "reference product refused: %s", why);
  sim_gemm_run(&g);
  return c;
}

static sim_gemm gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                     const void *A, int lda, const void *B, int ldb, void *C, int ldc,
                     cudaDataType t) {
  return sim_gemm{"cublasLtMatmul", ta, tb, m, n, k, 0.0, 0.0, A, t, lda, 0, B, t, ldb, 0,
                  C, t, ldc, 0, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT};
}

static cublasStatus_t lt(sim_lt *e) {
  const float one = 1.0f, zero = 0.0f;
  char why[512] = "";
  const cublasStatus_t st = sim_lt_check(e, &one, &zero, why, sizeof why);
  if (st == CUBLAS_STATUS_SUCCESS) sim_lt_run(e);
  else CHECK(why[0] != 0, "refusal %d without a line", (int)st);
  return st;
}

/* y (B, OC) = inp (B, C) W^T + bias, optionally GELU with its input kept:
 * column-major D (OC x B) = op_T(W) inp. */
static void forward(cudaDataType t, bool with_gelu) {
  const int B = 7, C = 13, OC = 20, aux_ld = 24;
  buf inp(t, B * C), W(t, OC * C), bias(t, OC), y(t, B * OC), aux(t, (size_t)aux_ld * B);
  inp.fill(1, B * C), W.fill(2, OC * C), bias.fill(3, OC);
  const sim_gemm g = gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, B, C, W.ptr(), C, inp.ptr(), C,
                          y.ptr(), OC, t);
  sim_lt e = {g, with_gelu ? SIM_LT_GELU_AUX_BIAS : SIM_LT_BIAS, bias.ptr(),
              with_gelu ? aux.ptr() : nullptr, with_gelu ? aux_ld : 0};
  CHECK(lt(&e) == CUBLAS_STATUS_SUCCESS, "forward refused");
  const std::vector<float> p = product(g);
  int bad = 0;
  for (int b = 0; b < B; ++b)
    for (int o = 0; o < OC; ++o) {
      const double pre = (double)p[o + b * OC] + bias.get(o);
      const double want = with_gelu ? gelu(pre) : pre;
      if (!near(y.get(o + b * OC), want, t) && bad++ < 3)
        CHECK(false, "%s y[%d][%d] = %g, want %g", t == CUDA_R_16BF ? "bf16" : "f32", b, o,
              y.get(o + b * OC), want);
      if (with_gelu && !near(aux.get(o + (size_t)b * aux_ld), pre, t) && bad++ < 3)
        CHECK(false, "aux[%d][%d] = %g, want %g", b, o, aux.get(o + (size_t)b * aux_ld), pre);
    }
  CHECK(bad == 0, "%d forward values wrong", bad);
  if (with_gelu)
    for (int b = 0; b < B; ++b)
      for (int o = OC; o < aux_ld; ++o)
        CHECK(isnan(aux.get(o + (size_t)b * aux_ld)), "aux gap [%d][%d] written", b, o);
}

/* dinp (B, C) = dout (B, OC) W (OC, C) times gelu'(pre), and the bias
 * gradient of the layer before: dbias[c] = sum over b of dinp. Column-major
 * D (C x B) = W dout. */
static void backward_dgelu(cudaDataType t, bool with_bgrad) {
  const int B = 9, C = 16, OC = 11;
  buf dout(t, B * OC), W(t, OC * C), pre(t, B * C), dinp(t, B * C), dbias(t, C);
  dout.fill(4, B * OC), W.fill(5, OC * C), pre.fill(6, B * C);
  const sim_gemm g = gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, B, OC, W.ptr(), C, dout.ptr(), OC,
                          dinp.ptr(), C, t);
  sim_lt e = {g, with_bgrad ? SIM_LT_DGELU_BGRAD : SIM_LT_DGELU,
              with_bgrad ? dbias.ptr() : nullptr, pre.ptr(), C};
  CHECK(lt(&e) == CUBLAS_STATUS_SUCCESS, "dgelu refused");
  const std::vector<float> p = product(g);
  int bad = 0;
  for (int c = 0; c < C; ++c) {
    double sum = 0.0;
    for (int b = 0; b < B; ++b) {
      const double want = (double)p[c + b * C] * gelu_slope(pre.get(c + b * C));
      sum += want;
      if (!near(dinp.get(c + b * C), want, t) && bad++ < 3)
        CHECK(false, "dinp[%d][%d] = %g, want %g", b, c, dinp.get(c + b * C), want);
    }
    if (with_bgrad && !near(dbias.get(c), sum, t) && bad++ < 3)
      CHECK(false, "dbias[%d] = %g, want %g", c, dbias.get(c), sum);
  }
  CHECK(bad == 0, "%d dgelu values wrong", bad);
}

/* dweight (OC, C) = dout^T inp with dbias[o] = sum over b of dout (BGRADB):
 * column-major D (C x OC) = inp op_T(dout). */
static void backward_bgradb(cudaDataType t) {
  const int B = 10, C = 6, OC = 9;
  buf dout(t, B * OC), inp(t, B * C), dw(t, OC * C), dbias(t, OC);
  dout.fill(7, B * OC), inp.fill(8, B * C);
  const sim_gemm g = gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, B, inp.ptr(), C, dout.ptr(), OC,
                          dw.ptr(), C, t);
  sim_lt e = {g, SIM_LT_BGRADB, dbias.ptr(), nullptr, 0};
  CHECK(lt(&e) == CUBLAS_STATUS_SUCCESS, "bgradb refused");
  const std::vector<float> p = product(g);
  int bad = 0;
  for (int i = 0; i < C * OC; ++i)
    if (!near(dw.get(i), p[i], t) && bad++ < 3) CHECK(false, "dweight[%d] = %g, want %g", i, dw.get(i), (double)p[i]);
  for (int o = 0; o < OC; ++o) {
    double sum = 0.0;
    for (int b = 0; b < B; ++b) sum += dout.get(o + b * OC);
    if (!near(dbias.get(o), sum, t) && bad++ < 3)
      CHECK(false, "dbias[%d] = %g, want %g", o, dbias.get(o), sum);
  }
  CHECK(bad == 0, "%d bgradb values wrong", bad);
}

/* A Conv1D's dweight (C, OC) += inp^T dout, accumulated (beta = 1) in an
 * fp32 C over operands of type t, with dbias[o] = sum over b of dout
 * (BGRADA, written in C's type, fp32): column-major D (OC x C) = dout
 * op_T(inp). */
static void backward_bgrada(cudaDataType t) {
  const int B = 12, C = 5, OC = 9;
  buf dout(t, B * OC), inp(t, B * C), dw(CUDA_R_32F, OC * C), dbias(CUDA_R_32F, OC);
  dout.fill(9, B * OC), inp.fill(10, B * C), dw.fill(11, OC * C);
  const std::vector<float> before = dw.f;
  sim_gemm g = gemm(CUBLAS_OP_N, CUBLAS_OP_T, OC, C, B, dout.ptr(), OC, inp.ptr(), C, dw.ptr(),
                    OC, t);
  g.ctype = CUDA_R_32F;
  sim_lt e = {g, SIM_LT_BGRADA, dbias.ptr(), nullptr, 0};
  const float one = 1.0f;
  char why[512] = "";
  CHECK(sim_lt_check(&e, &one, &one, why, sizeof why) == CUBLAS_STATUS_SUCCESS,
        "bgrada refused: %s", why);
  sim_lt_run(&e);
  const std::vector<float> p = product(g);
  int bad = 0;
  for (int i = 0; i < C * OC; ++i)
    if (!near(dw.get(i), (double)before[i] + p[i], CUDA_R_32F) && bad++ < 3)
      CHECK(false, "dweight[%d] = %g, want %g", i, dw.get(i), (double)before[i] + p[i]);
  for (int o = 0; o < OC; ++o) {
    double sum = 0.0;
    for (int b = 0; b < B; ++b) sum += dout.get(o + b * OC);
    if (!near(dbias.get(o), sum, CUDA_R_32F) && bad++ < 3)
      CHECK(false, "dbias[%d] = %g, want %g", o, dbias.get(o), sum);
  }
  CHECK(bad == 0, "%d bgrada values wrong", bad);
}

static void refusals(void) {
  const int m = 10, n = 3, k = 4;
  buf A(CUDA_R_32F, m * k), Bm(CUDA_R_32F, k * n), D(CUDA_R_32F, 2 * m * n), bias(CUDA_R_32F, m),
      aux(CUDA_R_32F, 16 * n);
  A.fill(1, m * k), Bm.fill(2, k * n), bias.fill(3, m);
  const sim_gemm g = gemm(CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, A.ptr(), m, Bm.ptr(), k, D.ptr(), m,
                          CUDA_R_32F);
  sim_lt e = {g, SIM_LT_GELU_AUX_BIAS, bias.ptr(), aux.ptr(), 12};
  CHECK(lt(&e) == CUBLAS_STATUS_NOT_SUPPORTED, "aux ld 12 (not divisible by 8) accepted");
  e.aux_ld = 8;
  CHECK(lt(&e) == CUBLAS_STATUS_INVALID_VALUE, "aux ld 8 below 10 rows accepted");
  e.aux_ld = 16, e.aux = nullptr;
  CHECK(lt(&e) == CUBLAS_STATUS_INVALID_VALUE, "GELU_AUX_BIAS without aux accepted");
  e.aux = aux.ptr(), e.bias = nullptr;
  CHECK(lt(&e) == CUBLAS_STATUS_INVALID_VALUE, "GELU_AUX_BIAS without bias accepted");
  e.bias = bias.ptr(), e.epilogue = 2; /* CUBLASLT_EPILOGUE_RELU */
  CHECK(lt(&e) == CUBLAS_STATUS_NOT_SUPPORTED, "an unmodelled epilogue accepted");
  e.epilogue = SIM_LT_BIAS, e.g.batch = 2;
  CHECK(lt(&e) == CUBLAS_STATUS_NOT_SUPPORTED, "a batched epilogue accepted");
  e.g.batch = 1, e.g.ldc = m - 1;
  CHECK(lt(&e) == CUBLAS_STATUS_INVALID_VALUE, "the product's own check skipped (ldc < m)");
  e.g.ldc = m, e.aux_ld = 16;
  CHECK(lt(&e) == CUBLAS_STATUS_SUCCESS, "a valid bias epilogue refused");
  /* a bias or aux pointer inside an element: no kernel loads it */
  e.bias = (char *)bias.ptr() + 2;
  CHECK(lt(&e) == CUBLAS_STATUS_NOT_SUPPORTED, "an fp32 bias 2 bytes off its element accepted");
  e.epilogue = SIM_LT_DGELU, e.aux = (char *)aux.ptr() + 2;
  CHECK(lt(&e) == CUBLAS_STATUS_NOT_SUPPORTED, "an fp32 aux 2 bytes off its element accepted");
  e.aux = (char *)aux.ptr() + 4; /* DGELU reads no bias; an aux 4 bytes in is an element's */
  CHECK(lt(&e) == CUBLAS_STATUS_SUCCESS, "DGELU refused over a bias it does not read, or an "
        "aux aligned to its element");
  e.epilogue = SIM_LT_BIAS, e.bias = bias.ptr(), e.aux = aux.ptr();
  /* DEFAULT is the reference product, bit for bit. */
  e.epilogue = SIM_LT_DEFAULT;
  CHECK(lt(&e) == CUBLAS_STATUS_SUCCESS, "DEFAULT refused");
  const std::vector<float> p = product(g);
  bool same = true;
  for (int i = 0; i < m * n; ++i) same = same && D.f[i] == p[i];
  CHECK(same, "DEFAULT differs from the reference product");
}

int main(void) {
  for (cudaDataType t : {CUDA_R_32F, CUDA_R_16BF}) {
    forward(t, false);
    forward(t, true);
    backward_dgelu(t, false);
    backward_dgelu(t, true);
    backward_bgradb(t);
    backward_bgrada(t);
  }
  refusals();
  printf("%d checks, %d failed\n", checks, failures);
  return failures ? 1 : 0;
}
