/* tests/cudasim/cublas/test_gemm_reference.cc — the simulated cuBLAS's
 * reference product (gemm_reference.cc) against an independent naive
 * row-major triple loop over op(A) and op(B) held as plain 2-D arrays: every
 * transa x transb, fp32/bf16/fp64 storage, leading dimensions above the
 * minimum (the gaps hold NaN, so reading one shows up), strided batches,
 * alpha/beta cases (beta = 0 over NaN in C, alpha = 0 over NaN in A), the
 * TF32 and bf16 input rounding of the fast compute types, every documented
 * argument refusal, and the row-major mapping fsdp's blas.cu relies on: the
 * right mapping reproduces the row-major product, a transposed argument is
 * refused or gives a result that differs; and products larger than the
 * reference's cache blocks (64 x 64 x 256, tiles of 4) at ragged shapes with
 * values that round, where only adding each element's terms in order of k,
 * in double, gives the naive loop's result to the bit. Needs no CUDA runtime.
 * Exit 0 when every check passes. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <vector>

#include "../sim_test.h"
#include "gemm_reference.h"

/* Deterministic small values: multiples of 1/4 in [-2, 2], exact in bf16,
 * so every product and sum below is exact in double and fp32. */
static double value(unsigned seed, long long i) {
  unsigned x = seed * 2654435761u + (unsigned)i * 40503u + 12345u;
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  x ^= x >> 15;
  return ((int)(x % 17u) - 8) / 4.0;
}

static size_t esize(cudaDataType t) { return t == CUDA_R_16BF ? 2 : t == CUDA_R_64F ? 8 : 4; }

/* A column-major buffer of type t: rows x cols with leading dimension ld,
 * `batch` copies `stride` elements apart; every element not in a matrix is NaN. */
struct buffer {
  cudaDataType t;
  std::vector<unsigned char> bytes;
  buffer(cudaDataType t_, size_t n) : t(t_), bytes(n * esize(t_)) {
    for (size_t i = 0; i < n; ++i) set(i, NAN);
  }
  void set(size_t i, double v) {
    if (t == CUDA_R_64F) ((double *)bytes.data())[i] = v;
    else if (t == CUDA_R_16BF) ((unsigned short *)bytes.data())[i] = sim_bf16_from_float((float)v);
    else ((float *)bytes.data())[i] = (float)v;
  }
  double get(size_t i) const {
    if (t == CUDA_R_64F) return ((const double *)bytes.data())[i];
    if (t == CUDA_R_16BF) return sim_bf16_to_float(((const unsigned short *)bytes.data())[i]);
    return ((const float *)bytes.data())[i];
  }
};

static const char *opname(cublasOperation_t o) {
  return o == CUBLAS_OP_N ? "N" : o == CUBLAS_OP_T ? "T" : "C";
}

struct product_case {
  cublasOperation_t ta, tb;
  int m, n, k, pad_a, pad_b, pad_c, batch;
  cudaDataType ab, c;
  cublasComputeType_t compute;
  double alpha, beta;
};

/* value() over 3: no longer exact, so sums depend on their order. */
static double rough_value(unsigned seed, long long i) { return value(seed, i) / 3.0; }

/* Builds op(A) (m x k), op(B) (k x n), C0 (m x n) per batch as row-major
 * arrays, stores them in cuBLAS's layout, runs the reference, and compares
 * each element of C with the naive triple loop. rough: rough_value()s, the
 * naive loop reading them as stored (bf16 rounds them). Returns the wrong
 * count. */
static int run_case(const product_case &pc, unsigned seed, bool rough = false) {
  double (*val)(unsigned, long long) = rough ? rough_value : value;
  const bool ta = pc.ta != CUBLAS_OP_N, tb = pc.tb != CUBLAS_OP_N;
  const int ar = ta ? pc.k : pc.m, ac = ta ? pc.m : pc.k; /* stored A: ar x ac */
  const int br = tb ? pc.n : pc.k, bc = tb ? pc.k : pc.n;
  const int lda = (ar > 1 ? ar : 1) + pc.pad_a, ldb = (br > 1 ? br : 1) + pc.pad_b;
  const int ldc = (pc.m > 1 ? pc.m : 1) + pc.pad_c;
  const long long sa = (long long)lda * ac + 3, sb = (long long)ldb * bc + 5,
                  sc = (long long)ldc * pc.n + 7; /* gaps between batches too */
  buffer A(pc.ab, (size_t)(sa * pc.batch)), B(pc.ab, (size_t)(sb * pc.batch)),
      C(pc.c, (size_t)(sc * pc.batch));
  std::vector<double> opA((size_t)pc.m * pc.k * pc.batch), opB((size_t)pc.k * pc.n * pc.batch),
      C0((size_t)pc.m * pc.n * pc.batch);
  for (int b = 0; b < pc.batch; ++b) {
    for (int i = 0; i < pc.m; ++i)
      for (int l = 0; l < pc.k; ++l) {
        const double v = val(seed, ((long long)b * pc.m + i) * pc.k + l);
        /* op(A)(i,l) is stored A(i,l) (N) or A(l,i) (T), column-major */
        const size_t at = (size_t)(b * sa + (ta ? l + (long long)i * lda : i + (long long)l * lda));
        A.set(at, v);
        opA[((size_t)b * pc.m + i) * pc.k + l] = A.get(at);
      }
    for (int l = 0; l < pc.k; ++l)
      for (int j = 0; j < pc.n; ++j) {
        const double v = val(seed + 1, ((long long)b * pc.k + l) * pc.n + j);
        const size_t at = (size_t)(b * sb + (tb ? j + (long long)l * ldb : l + (long long)j * ldb));
        B.set(at, v);
        opB[((size_t)b * pc.k + l) * pc.n + j] = B.get(at);
      }
    for (int i = 0; i < pc.m; ++i)
      for (int j = 0; j < pc.n; ++j) {
        const double v = pc.beta == 0.0 ? NAN : val(seed + 2, ((long long)b * pc.m + i) * pc.n + j);
        C.set((size_t)(b * sc + i + (long long)j * ldc), v);
        C0[((size_t)b * pc.m + i) * pc.n + j] = C.get((size_t)(b * sc + i + (long long)j * ldc));
      }
  }
  sim_gemm g = {pc.batch == 1 ? "cublasGemmEx" : "cublasGemmStridedBatchedEx", pc.ta, pc.tb,
                pc.m, pc.n, pc.k, 0, 0, A.bytes.data(), pc.ab, lda, sa, B.bytes.data(), pc.ab,
                ldb, sb, C.bytes.data(), pc.c, ldc, sc, pc.batch, pc.compute, CUBLAS_GEMM_DEFAULT};
  const bool f64 = pc.compute == CUBLAS_COMPUTE_64F;
  const float fa = (float)pc.alpha, fb = (float)pc.beta;
  const double da = pc.alpha, db = pc.beta;
  char why[512] = "";
  const cublasStatus_t st =
      sim_gemm_check(&g, f64 ? (const void *)&da : &fa, f64 ? (const void *)&db : &fb, why,
                     sizeof why);
  CHECK(st == CUBLAS_STATUS_SUCCESS, "check refused a valid product: %s", why);
  if (st != CUBLAS_STATUS_SUCCESS) return 1;
  sim_gemm_run(&g);
  int wrong = 0;
  for (int b = 0; b < pc.batch; ++b)
    for (int i = 0; i < pc.m; ++i)
      for (int j = 0; j < pc.n; ++j) {
        double dot = 0;
        for (int l = 0; l < pc.k; ++l)
          dot += opA[((size_t)b * pc.m + i) * pc.k + l] * opB[((size_t)b * pc.k + l) * pc.n + j];
        double want = pc.alpha * dot;
        if (pc.beta != 0.0) want += pc.beta * C0[((size_t)b * pc.m + i) * pc.n + j];
        if (pc.c == CUDA_R_16BF) want = sim_bf16_to_float(sim_bf16_from_float((float)want));
        else if (pc.c == CUDA_R_32F) want = (float)want;
        const double got = C.get((size_t)(b * sc + i + (long long)j * ldc));
        if (!(got == want) && wrong++ < 3)
          fprintf(stderr, "  %s%s m=%d n=%d k=%d batch %d: C(%d,%d) = %g, want %g\n",
                  opname(pc.ta), opname(pc.tb), pc.m, pc.n, pc.k, b, i, j, got, want);
      }
  /* Nothing outside the matrices of C was written: the gaps still hold NaN. */
  for (int b = 0; b < pc.batch; ++b)
    for (long long e = 0; e < sc; ++e) {
      const long long i = e % ldc, j = e / ldc;
      if ((i >= pc.m || j >= pc.n) && !isnan(C.get((size_t)(b * sc + e))) && wrong++ < 3)
        fprintf(stderr, "  wrote outside C at batch %d element %lld\n", b, e);
    }
  return wrong;
}

static void test_every_op_and_type(void) {
  const cublasOperation_t ops[] = {CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_OP_C};
  struct {
    cudaDataType ab, c;
    cublasComputeType_t ct;
  } types[] = {{CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F},
               {CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F},
               {CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F},
               {CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_PEDANTIC},
               {CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_64F}};
  struct {
    int m, n, k, pa, pb, pc, batch;
    double alpha, beta;
  } shapes[] = {{5, 3, 4, 0, 0, 0, 1, 1.0, 0.0},  {5, 3, 4, 2, 3, 1, 1, 0.5, -2.0},
                {1, 7, 2, 0, 1, 0, 1, 1.0, 1.0},  {6, 1, 9, 1, 0, 2, 3, -1.5, 0.25},
                {4, 4, 4, 3, 3, 3, 4, 2.0, 0.0},  {3, 5, 1, 0, 0, 0, 2, 1.0, 1.0},
                {2, 3, 0, 1, 1, 1, 2, 1.0, 0.5}, /* k = 0: C = beta C */
                {4, 2, 3, 0, 0, 0, 2, 0.0, 1.0}};
  for (auto &t : types)
    for (auto ta : ops)
      for (auto tb : ops)
        for (auto &s : shapes) {
          product_case pc = {ta, tb, s.m, s.n, s.k, s.pa, s.pb, s.pc, s.batch, t.ab, t.c, t.ct,
                             s.alpha, s.beta};
          const int wrong = run_case(pc, (unsigned)(s.m * 131 + s.n * 7 + s.k));
          CHECK(wrong == 0, "%d wrong elements: types %d/%d compute %d, %s%s, m=%d n=%d k=%d "
                "lda+%d ldb+%d ldc+%d batch %d alpha %g beta %g", wrong, (int)t.ab, (int)t.c,
                (int)t.ct, opname(ta), opname(tb), s.m, s.n, s.k, s.pa, s.pb, s.pc, s.batch,
                s.alpha, s.beta);
        }
}

/* Past one cache block in each dimension, sizes off the block and the tile
 * (a last tile of 1 to 3 rows or columns), every transpose pair, every
 * storage type, strided batches and padded leading dimensions. */
static void test_blocked_products(void) {
  const cublasOperation_t ops[] = {CUBLAS_OP_N, CUBLAS_OP_T};
  struct {
    cudaDataType ab, c;
    cublasComputeType_t ct;
  } types[] = {{CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F},
               {CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F},
               {CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F},
               {CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_64F}};
  struct {
    int m, n, k, pa, pb, pc, batch;
    double alpha, beta;
  } shapes[] = {{130, 67, 517, 1, 2, 3, 2, 1.0, 0.5}, {5, 129, 258, 0, 0, 0, 1, -1.5, 0.0},
                {67, 3, 600, 2, 0, 1, 1, 0.25, 1.0}};
  for (auto &t : types)
    for (auto ta : ops)
      for (auto tb : ops)
        for (auto &s : shapes) {
          product_case pc = {ta, tb, s.m, s.n, s.k, s.pa, s.pb, s.pc, s.batch, t.ab, t.c, t.ct,
                             s.alpha, s.beta};
          const int wrong = run_case(pc, (unsigned)(s.m * 131 + s.n * 7 + s.k), true);
          CHECK(wrong == 0, "%d wrong elements (rounding values): types %d/%d, %s%s, m=%d n=%d "
                "k=%d batch %d", wrong, (int)t.ab, (int)t.c, opname(ta), opname(tb), s.m, s.n,
                s.k, s.batch);
        }
}

/* One 1x1x1 product, for the scalar rules. */
static double one_product(cudaDataType ab, cudaDataType c, cublasComputeType_t ct, float a,
                          float b, float c0, float alpha, float beta) {
  float fa[1] = {a}, fb[1] = {b}, fc[1] = {c0};
  unsigned short ha[1] = {sim_bf16_from_float(a)}, hb[1] = {sim_bf16_from_float(b)},
                 hc[1] = {sim_bf16_from_float(c0)};
  const bool h = ab == CUDA_R_16BF, hcv = c == CUDA_R_16BF;
  sim_gemm g = {"cublasGemmEx", CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, 0, 0,
                h ? (void *)ha : (void *)fa, ab, 1, 0, h ? (void *)hb : (void *)fb, ab, 1, 0,
                hcv ? (void *)hc : (void *)fc, c, 1, 0, 1, ct, CUBLAS_GEMM_DEFAULT};
  char why[512];
  if (sim_gemm_check(&g, &alpha, &beta, why, sizeof why) != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "  unexpected refusal: %s\n", why);
    return -12345.0;
  }
  sim_gemm_run(&g);
  return hcv ? sim_bf16_to_float(hc[0]) : fc[0];
}

static void test_scalars_and_rounding(void) {
  /* beta = 0 never reads C: NaN there is overwritten. */
  CHECK(one_product(CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, 2, 3, NAN, 1, 0) == 6.0,
        "beta = 0 read C");
  CHECK(one_product(CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, 2, 3, NAN, 1, 0) == 6.0,
        "beta = 0 read a bf16 C");
  /* alpha = 0 never reads A or B. */
  CHECK(one_product(CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, NAN, 1, 5, 0, 2) == 10.0,
        "alpha = 0 read A");
  /* beta != 0 does read C: NaN propagates. */
  CHECK(isnan(one_product(CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, 2, 3, NAN, 1, 1)),
        "beta = 1 ignored C");
  const float fine = 1.0f + ldexpf(1.0f, -12); /* below TF32's and bf16's precision */
  CHECK(one_product(CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, fine, 1, 0, 1, 0) == fine,
        "COMPUTE_32F must keep fp32 inputs");
  CHECK(one_product(CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, fine, 1, 0, 1, 0) ==
            1.0, "FAST_TF32 must round inputs to 10 mantissa bits");
  /* TF32 ties away from zero: 1 + 2^-11 is halfway between 1 and 1 + 2^-10. */
  CHECK(sim_tf32_round(1.0f + ldexpf(1.0f, -11)) == 1.0f + ldexpf(1.0f, -10), "tf32 tie");
  CHECK(one_product(CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_16BF, 1.0f + ldexpf(1, -8),
                    1, 0, 1, 0) == 1.0, "FAST_16BF must round inputs to bf16 (tie to even)");
  /* bf16 output rounds the fp32 result once, nearest even: 1 + 2^-8 + 2^-9 ->
   * 1 + 2^-7; 1 + 2^-8 (a tie) -> 1. */
  CHECK(one_product(CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, 1, 1, ldexpf(1, -8) +
                    ldexpf(1, -9), 1, 1) == 1.0 + ldexp(1, -7), "bf16 C rounding up");
  CHECK(one_product(CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, 1, 1, ldexpf(1, -8), 1, 1) ==
            1.0, "bf16 C rounding a tie to even");
}

/* A product that must be refused with `want`, its message naming `word`. */
static void refused(sim_gemm g, const void *alpha, const void *beta, cublasStatus_t want,
                    const char *word, const char *what) {
  char why[512] = "";
  const cublasStatus_t st = sim_gemm_check(&g, alpha, beta, why, sizeof why);
  CHECK(st == want, "%s: status %d, want %d (%s)", what, (int)st, (int)want, why);
  CHECK(strstr(why, word) != NULL, "%s: message '%s' does not name '%s'", what, why, word);
}

static void test_refusals(void) {
  float buf[64] = {0};
  const float one = 1.0f;
  const double done = 1.0;
  /* valid: C (4 x 3) = A (4 x 2) B (2 x 3), all N */
  const sim_gemm ok = {"cublasGemmEx", CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, 0, 0, buf, CUDA_R_32F,
                       4, 0, buf, CUDA_R_32F, 2, 0, buf, CUDA_R_32F, 4, 0, 1, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT};
  char why[512];
  sim_gemm g = ok;
  CHECK(sim_gemm_check(&g, &one, &one, why, sizeof why) == CUBLAS_STATUS_SUCCESS, "%s", why);
  const cublasStatus_t INV = CUBLAS_STATUS_INVALID_VALUE, NS = CUBLAS_STATUS_NOT_SUPPORTED;
  g = ok; g.transa = 7; refused(g, &one, &one, INV, "transa = 7", "bad transa");
  g = ok; g.transb = CUBLAS_OP_CONJG; refused(g, &one, &one, INV, "transb = 3", "CONJG transb");
  g = ok; g.m = -1; refused(g, &one, &one, INV, "m = -1", "m < 0");
  g = ok; g.n = -2; refused(g, &one, &one, INV, "n = -2", "n < 0");
  g = ok; g.k = -3; refused(g, &one, &one, INV, "k = -3", "k < 0");
  g = ok; g.lda = 3; refused(g, &one, &one, INV, "lda = 3 < max(1, m = 4)", "lda < m (N)");
  /* transa = T needs lda >= k = 2 only: lda 2 is fine, 1 is not */
  g = ok; g.transa = CUBLAS_OP_T; g.lda = 2;
  CHECK(sim_gemm_check(&g, &one, &one, why, sizeof why) == CUBLAS_STATUS_SUCCESS, "%s", why);
  g.lda = 1; refused(g, &one, &one, INV, "lda = 1 < max(1, k = 2)", "lda < k (T)");
  g = ok; g.ldb = 1; refused(g, &one, &one, INV, "ldb = 1 < max(1, k = 2)", "ldb < k (N)");
  g = ok; g.transb = CUBLAS_OP_T; g.ldb = 2;
  refused(g, &one, &one, INV, "ldb = 2 < max(1, n = 3)", "ldb < n (T)");
  g = ok; g.ldc = 3; refused(g, &one, &one, INV, "ldc = 3 < max(1, m = 4)", "ldc < m");
  /* a leading dimension of 0 is refused even when the matrix is empty */
  g = ok; g.m = 0; g.lda = 0; refused(g, &one, &one, INV, "lda = 0", "lda 0 with m = 0");
  g = ok; g.batch = -1; refused(g, &one, &one, INV, "batchCount = -1", "batch < 0");
  g = ok; refused(g, NULL, &one, INV, "alpha is NULL", "NULL alpha");
  g = ok; refused(g, &one, NULL, INV, "beta is NULL", "NULL beta");
  g = ok; g.atype = 99; refused(g, &one, &one, INV, "Atype = 99", "bad Atype");
  g = ok; g.ctype = -5; refused(g, &one, &one, INV, "Ctype = -5", "bad Ctype");
  g = ok; g.compute = 0; refused(g, &one, &one, INV, "computeType = 0", "bad compute");
  g = ok; g.algo = 50; refused(g, &one, &one, INV, "algo = 50", "bad algo");
  g = ok; g.btype = CUDA_R_16BF; refused(g, &one, &one, NS, "differ", "A/B types differ");
  g = ok; g.atype = g.btype = CUDA_R_32F; g.ctype = CUDA_R_16BF;
  refused(g, &one, &one, NS, "not a combination cuBLAS supports", "32F in, 16BF out");
  g = ok; g.atype = g.btype = CUDA_R_16F; g.ctype = CUDA_R_16F;
  refused(g, &one, &one, NS, "does not model", "fp16");
  g = ok; g.atype = g.btype = g.ctype = CUDA_R_16BF; g.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  refused(g, &one, &one, NS, "CUDA_R_32F inputs and output only", "TF32 on bf16");
  g = ok; g.compute = CUBLAS_COMPUTE_64F; refused(g, &done, &done, NS, "CUDA_R_64F", "64F on 32F");
  g = ok; g.compute = CUBLAS_COMPUTE_32F_FAST_16F; refused(g, &one, &one, NS, "not modelled", "FAST_16F");
  g = ok; g.A = NULL; refused(g, &one, &one, INV, "A is NULL", "NULL A");
  g = ok; g.C = NULL; refused(g, &one, &one, INV, "C is NULL", "NULL C");
  /* ...but a NULL A is fine when alpha = 0 or the product is empty */
  const float zero = 0.0f;
  g = ok; g.A = NULL;
  CHECK(sim_gemm_check(&g, &zero, &one, why, sizeof why) == CUBLAS_STATUS_SUCCESS, "%s", why);
  g = ok; g.A = g.B = NULL; g.C = NULL; g.n = 0;
  CHECK(sim_gemm_check(&g, &one, &one, why, sizeof why) == CUBLAS_STATUS_SUCCESS, "%s", why);
}

/* fsdp's blas.cu computes the row-major C (m x n) = A (m x k) B (k x n) as
 * the column-major C^T = B^T A^T: operands swapped, m and n swapped, row
 * lengths as leading dimensions. That mapping must reproduce the row-major
 * product; the classic mistakes must not pass silently. */
static void test_row_major_mapping(void) {
  const int m = 3, n = 5, k = 2;
  float A[m * k], B[k * n], want[m * n], C[m * n];
  for (int i = 0; i < m * k; ++i) A[i] = (float)value(7, i);
  for (int i = 0; i < k * n; ++i) B[i] = (float)value(8, i);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int l = 0; l < k; ++l) s += (double)A[i * k + l] * B[l * n + j];
      want[i * n + j] = (float)s;
    }
  const float one = 1.0f, zero = 0.0f;
  char why[512];
  auto run = [&](cublasOperation_t ta, cublasOperation_t tb, int mm, int nn, const float *P,
                 int ldp, const float *Q, int ldq, int ldc) {
    sim_gemm g = {"cublasGemmEx", ta, tb, mm, nn, k, 0, 0, P, CUDA_R_32F, ldp, 0, Q, CUDA_R_32F,
                  ldq, 0, C, CUDA_R_32F, ldc, 0, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT};
    for (float &c : C) c = NAN;
    const cublasStatus_t st = sim_gemm_check(&g, &one, &zero, why, sizeof why);
    if (st == CUBLAS_STATUS_SUCCESS) sim_gemm_run(&g);
    return st;
  };
  auto matches = [&] { return memcmp(C, want, sizeof C) == 0; };
  /* right: B first, n x m, ld = row lengths */
  CHECK(run(CUBLAS_OP_N, CUBLAS_OP_N, n, m, B, n, A, k, n) == CUBLAS_STATUS_SUCCESS && matches(),
        "blas.cu's mapping must reproduce the row-major product (%s)", why);
  /* operands not swapped: A's row length k = 2 is below m = 3: refused */
  CHECK(run(CUBLAS_OP_N, CUBLAS_OP_N, m, n, A, k, B, n, n) == CUBLAS_STATUS_INVALID_VALUE,
        "unswapped operands must be refused");
  CHECK(strstr(why, "lda = 2 < max(1, m = 3)") != NULL, "message: %s", why);
  /* a spurious transpose of the second operand: its ld (k = 2) is below n = 3 */
  CHECK(run(CUBLAS_OP_N, CUBLAS_OP_T, n, m, B, n, A, k, n) == CUBLAS_STATUS_INVALID_VALUE,
        "transposed A must be refused: %s", why);
  CHECK(strstr(why, "ldb = 2 < max(1, n = 3)") != NULL, "message: %s", why);
  /* square shapes pass every check, so a transposed operand only shows in the result */
  const int s = 4;
  float S1[s * s], S2[s * s], W[s * s], G[s * s];
  for (int i = 0; i < s * s; ++i) S1[i] = (float)value(9, i), S2[i] = (float)value(10, i);
  for (int i = 0; i < s; ++i)
    for (int j = 0; j < s; ++j) {
      double acc = 0;
      for (int l = 0; l < s; ++l) acc += (double)S1[i * s + l] * S2[l * s + j];
      W[i * s + j] = (float)acc;
    }
  sim_gemm g = {"cublasGemmEx", CUBLAS_OP_N, CUBLAS_OP_T, s, s, s, 0, 0, S2, CUDA_R_32F, s, 0,
                S1, CUDA_R_32F, s, 0, G, CUDA_R_32F, s, 0, 1, CUBLAS_COMPUTE_32F,
                CUBLAS_GEMM_DEFAULT};
  CHECK(sim_gemm_check(&g, &one, &zero, why, sizeof why) == CUBLAS_STATUS_SUCCESS, "%s", why);
  sim_gemm_run(&g);
  CHECK(memcmp(G, W, sizeof G) != 0, "a transposed square operand must change the result");
  g.transb = CUBLAS_OP_N;
  sim_gemm_run(&g);
  CHECK(memcmp(G, W, sizeof G) == 0, "the untransposed square product must match");
}

int main(void) {
  test_every_op_and_type();
  test_blocked_products();
  test_scalars_and_rounding();
  test_refusals();
  test_row_major_mapping();
  printf("test_gemm_reference: %d checks, %d failed\n", checks, failures);
  return failures ? 1 : 0;
}
