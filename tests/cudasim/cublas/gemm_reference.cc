/* tests/cudasim/cublas/gemm_reference.cc — the reference loops and argument
 * checks behind the simulated cublasGemmEx / cublasGemmStridedBatchedEx,
 * written from the cuBLAS documentation (column-major, op(A) m x k, op(B)
 * k x n, C m x n), never from fsdp's own wrappers: checking how blas.cu maps
 * row-major products onto this contract is the point of the simulator. */
#include "gemm_reference.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <vector>

unsigned short sim_bf16_from_float(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}

float sim_bf16_to_float(unsigned short h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

float sim_tf32_round(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) != 0x7f800000u) u += 0x1000u; /* half of the 13 dropped bits: ties away */
  u &= 0xffffe000u;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

namespace {

const char *op_name(int op) {
  return op == CUBLAS_OP_N ? "CUBLAS_OP_N" : op == CUBLAS_OP_T ? "CUBLAS_OP_T"
         : op == CUBLAS_OP_C ? "CUBLAS_OP_C" : "not an operation";
}

/* The data types cudaDataType names (listed in library_types.h); any other
 * number is no data type at all. */
bool is_data_type(int t) {
  switch (t) {
  case CUDA_R_16F: case CUDA_R_16BF: case CUDA_R_32F: case CUDA_R_64F: case CUDA_R_8I:
  case CUDA_R_8U: case CUDA_R_16I: case CUDA_R_16U: case CUDA_R_32I: case CUDA_R_32U:
  case CUDA_R_64I: case CUDA_R_64U: case CUDA_R_8F_E4M3: case CUDA_R_8F_E5M2:
    return true;
  }
  return false;
}

bool is_compute_type(int c) {
  return (c >= CUBLAS_COMPUTE_16F && c <= CUBLAS_COMPUTE_32F_PEDANTIC && c != 66 && c != 67) ||
         (c >= CUBLAS_COMPUTE_64F && c <= CUBLAS_COMPUTE_32I_PEDANTIC) ||
         c == CUBLAS_COMPUTE_32F_FAST_16F || c == CUBLAS_COMPUTE_32F_FAST_16BF ||
         c == CUBLAS_COMPUTE_32F_FAST_TF32 || c == CUBLAS_COMPUTE_32F_EMULATED_16BFX9 ||
         c == CUBLAS_COMPUTE_64F_EMULATED_FIXEDPOINT;
}

bool is_algo(int a) { return (a >= -1 && a <= 23) || (a >= 99 && a <= 115); }

bool is_32f_compute(int c) {
  return c == CUBLAS_COMPUTE_32F || c == CUBLAS_COMPUTE_32F_PEDANTIC ||
         c == CUBLAS_COMPUTE_32F_FAST_TF32 || c == CUBLAS_COMPUTE_32F_FAST_16BF ||
         c == CUBLAS_COMPUTE_32F_FAST_16F || c == CUBLAS_COMPUTE_32F_EMULATED_16BFX9;
}

/* The combinations modelled; 0 when modelled, else the refusal. `why` says
 * whether cuBLAS itself refuses it or only the simulator does not model it. */
cublasStatus_t type_combo(const sim_gemm *g, char *why, size_t n) {
  const int a = g->atype, c = g->ctype, ct = g->compute;
  if (g->atype != g->btype) {
    snprintf(why, n, "%s: Atype %d and Btype %d differ (cuBLAS requires one input type): "
             "CUBLAS_STATUS_NOT_SUPPORTED", g->fn, (int)g->atype, (int)g->btype);
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (ct == CUBLAS_COMPUTE_32F || ct == CUBLAS_COMPUTE_32F_PEDANTIC) {
    if ((a == CUDA_R_32F && c == CUDA_R_32F) || (a == CUDA_R_16BF && c == CUDA_R_16BF) ||
        (a == CUDA_R_16BF && c == CUDA_R_32F))
      return CUBLAS_STATUS_SUCCESS;
    const bool documented = (a == CUDA_R_16F && (c == CUDA_R_16F || c == CUDA_R_32F)) ||
                            (a == CUDA_R_8I && c == CUDA_R_32F);
    snprintf(why, n, "%s: Atype/Btype %d with Ctype %d under computeType %d %s: "
             "CUBLAS_STATUS_NOT_SUPPORTED", g->fn, (int)a, (int)c, (int)ct,
             documented ? "is a cuBLAS combination the simulator does not model"
                        : "is not a combination cuBLAS supports");
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (ct == CUBLAS_COMPUTE_32F_FAST_TF32 || ct == CUBLAS_COMPUTE_32F_FAST_16BF) {
    if (a == CUDA_R_32F && c == CUDA_R_32F) return CUBLAS_STATUS_SUCCESS;
    snprintf(why, n, "%s: computeType %d takes CUDA_R_32F inputs and output only, not "
             "Atype %d / Ctype %d: CUBLAS_STATUS_NOT_SUPPORTED", g->fn, (int)ct, (int)a, (int)c);
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (ct == CUBLAS_COMPUTE_64F || ct == CUBLAS_COMPUTE_64F_PEDANTIC) {
    if (a == CUDA_R_64F && c == CUDA_R_64F) return CUBLAS_STATUS_SUCCESS;
    snprintf(why, n, "%s: computeType %d takes CUDA_R_64F inputs and output only, not "
             "Atype %d / Ctype %d: CUBLAS_STATUS_NOT_SUPPORTED", g->fn, (int)ct, (int)a, (int)c);
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  snprintf(why, n, "%s: computeType %d is not modelled by the simulator (only 32F, "
           "32F_PEDANTIC, 32F_FAST_TF32, 32F_FAST_16BF, 64F, 64F_PEDANTIC): "
           "CUBLAS_STATUS_NOT_SUPPORTED", g->fn, (int)ct);
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

/* Writes "<fn>: <what>: CUBLAS_STATUS_<st>" into why and returns st. */
__attribute__((format(printf, 5, 6))) cublasStatus_t refuse(cublasStatus_t st, char *why,
                                                            size_t n, const char *fn,
                                                            const char *fmt, ...) {
  char what[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  snprintf(why, n, "%s: %s: %s", fn, what,
           st == CUBLAS_STATUS_INVALID_VALUE ? "CUBLAS_STATUS_INVALID_VALUE"
                                             : "CUBLAS_STATUS_NOT_SUPPORTED");
  return st;
}

long long max1(long long x) { return x > 1 ? x : 1; }

} // namespace

cublasStatus_t sim_gemm_check(sim_gemm *g, const void *alpha, const void *beta, char *why,
                              size_t n) {
  const char *fn = g->fn;
  const cublasStatus_t INVALID = CUBLAS_STATUS_INVALID_VALUE;
  if (g->transa != CUBLAS_OP_N && g->transa != CUBLAS_OP_T && g->transa != CUBLAS_OP_C)
    return refuse(INVALID, why, n, fn, "transa = %d is not CUBLAS_OP_N, _T or _C", g->transa);
  if (g->transb != CUBLAS_OP_N && g->transb != CUBLAS_OP_T && g->transb != CUBLAS_OP_C)
    return refuse(INVALID, why, n, fn, "transb = %d is not CUBLAS_OP_N, _T or _C", g->transb);
  if (g->m < 0) return refuse(INVALID, why, n, fn, "m = %d < 0", g->m);
  if (g->n < 0) return refuse(INVALID, why, n, fn, "n = %d < 0", g->n);
  if (g->k < 0) return refuse(INVALID, why, n, fn, "k = %d < 0", g->k);
  const bool na = g->transa == CUBLAS_OP_N, nb = g->transb == CUBLAS_OP_N;
  if (g->lda < max1(na ? g->m : g->k))
    return refuse(INVALID, why, n, fn, "lda = %d < max(1, %s = %d) required with transa = %s",
                  g->lda, na ? "m" : "k", na ? g->m : g->k, op_name(g->transa));
  if (g->ldb < max1(nb ? g->k : g->n))
    return refuse(INVALID, why, n, fn, "ldb = %d < max(1, %s = %d) required with transb = %s",
                  g->ldb, nb ? "k" : "n", nb ? g->k : g->n, op_name(g->transb));
  if (g->ldc < max1(g->m))
    return refuse(INVALID, why, n, fn, "ldc = %d < max(1, m = %d)", g->ldc, g->m);
  if (g->batch < 0) return refuse(INVALID, why, n, fn, "batchCount = %d < 0", g->batch);
  if (!alpha) return refuse(INVALID, why, n, fn, "alpha is NULL");
  if (!beta) return refuse(INVALID, why, n, fn, "beta is NULL");
  if (!is_data_type(g->atype))
    return refuse(INVALID, why, n, fn, "Atype = %d is no cudaDataType", (int)g->atype);
  if (!is_data_type(g->btype))
    return refuse(INVALID, why, n, fn, "Btype = %d is no cudaDataType", (int)g->btype);
  if (!is_data_type(g->ctype))
    return refuse(INVALID, why, n, fn, "Ctype = %d is no cudaDataType", (int)g->ctype);
  if (!is_compute_type(g->compute))
    return refuse(INVALID, why, n, fn, "computeType = %d is no cublasComputeType_t",
                  (int)g->compute);
  if (!is_algo(g->algo))
    return refuse(INVALID, why, n, fn, "algo = %d is no cublasGemmAlgo_t", (int)g->algo);
  const cublasStatus_t combo = type_combo(g, why, n);
  if (combo != CUBLAS_STATUS_SUCCESS) return combo;
  if (is_32f_compute(g->compute)) {
    g->alpha = *(const float *)alpha;
    g->beta = *(const float *)beta;
  } else {
    g->alpha = *(const double *)alpha;
    g->beta = *(const double *)beta;
  }
  /* Past cuBLAS's own checks: a NULL operand the product would read or
   * write. cuBLAS would launch and fault on the device; say so instead. */
  const bool empty = g->m == 0 || g->n == 0 || g->batch == 0;
  const bool reads_ab = !empty && g->k > 0 && g->alpha != 0.0;
  const char *fault = "is NULL but the product %s it (on a GPU: an illegal address)";
  char what[96];
  if (reads_ab && (!g->A || !g->B)) {
    snprintf(what, sizeof what, fault, "reads");
    return refuse(INVALID, why, n, fn, "%s %s", !g->A ? "A" : "B", what);
  }
  if (!empty && !g->C) {
    snprintf(what, sizeof what, fault, "writes");
    return refuse(INVALID, why, n, fn, "C %s", what);
  }
  return CUBLAS_STATUS_SUCCESS;
}

namespace {

size_t elem_size(int t) {
  return t == CUDA_R_16BF ? 2 : t == CUDA_R_64F ? 8 : 4;
}

/* Element i of a matrix of type t, as the compute type sees it. */
double load(const void *p, int t, long long i, int ct) {
  if (t == CUDA_R_64F) return ((const double *)p)[i];
  if (t == CUDA_R_16BF) return sim_bf16_to_float(((const unsigned short *)p)[i]);
  const float x = ((const float *)p)[i];
  if (ct == CUBLAS_COMPUTE_32F_FAST_TF32) return sim_tf32_round(x);
  if (ct == CUBLAS_COMPUTE_32F_FAST_16BF) return sim_bf16_to_float(sim_bf16_from_float(x));
  return x;
}

double load_c(const void *p, int t, long long i) {
  if (t == CUDA_R_64F) return ((const double *)p)[i];
  if (t == CUDA_R_16BF) return sim_bf16_to_float(((const unsigned short *)p)[i]);
  return ((const float *)p)[i];
}

void store_c(void *p, int t, long long i, double v) {
  if (t == CUDA_R_64F) ((double *)p)[i] = v;
  else if (t == CUDA_R_16BF) ((unsigned short *)p)[i] = sim_bf16_from_float((float)v);
  else ((float *)p)[i] = (float)v;
}

/* The product, in blocks that stay in the cache: op(A) and op(B) are read a
 * block at a time into doubles (load's view), and each element of C adds its
 * k terms one after the other in double, l = 0 to k - 1, carried from block
 * to block in acc. So the result is, to the bit, that of the plain loop
 *   C(i, j) = alpha * sum_l op(A)(i, l) op(B)(l, j) [+ beta * C(i, j)]
 * over l in order (test_gemm_reference compares with that loop), at several
 * times its speed: the production-shape tests spend most of their time here.
 * Tiles of 4 x 4 elements keep their sums in registers; the packed blocks
 * are padded with zeros to whole tiles, and padded sums are never stored. */
const long long kBlockM = 64, kBlockN = 64, kBlockK = 256, kTile = 4;

struct blocks {
  std::vector<double> a;   /* (kBlockK, kBlockM): op(A)(i0 + i, l0 + l) at a[l * kBlockM + i] */
  std::vector<double> b;   /* (kBlockK, kBlockN): op(B)(l0 + l, j0 + j) at b[l * kBlockN + j] */
  std::vector<double> acc; /* (kBlockN, kBlockM): the running sums, acc[j * kBlockM + i] */
  blocks() : a(kBlockK * kBlockM), b(kBlockK * kBlockN), acc(kBlockN * kBlockM) {}
};

/* Reads op(X)(r0 + r, c0 + c) for r < rows, c < cols into out[c * ld_out + r]
 * (X column-major with leading dimension ldx, transposed when t), zeros for
 * r in [rows, pad_rows). The inner loop walks X down a column either way. */
void pack(const void *X, int type, int compute, long long ldx, bool t, long long r0,
          long long c0, long long rows, long long cols, long long pad_rows, double *out,
          long long ld_out) {
  if (t) /* op(X)(r, c) is X(c, r) */
    for (long long r = 0; r < rows; ++r)
      for (long long c = 0; c < cols; ++c)
        out[c * ld_out + r] = load(X, type, (c0 + c) + (r0 + r) * ldx, compute);
  else
    for (long long c = 0; c < cols; ++c)
      for (long long r = 0; r < rows; ++r)
        out[c * ld_out + r] = load(X, type, (r0 + r) + (c0 + c) * ldx, compute);
  for (long long c = 0; c < cols; ++c)
    for (long long r = rows; r < pad_rows; ++r) out[c * ld_out + r] = 0.0;
}

/* acc (one block of C) += a * b over kb terms, each sum in order of l. */
void block_product(blocks &w, long long kb, long long mt, long long nt) {
  for (long long j = 0; j < nt; j += kTile)
    for (long long i = 0; i < mt; i += kTile) {
      double s[kTile][kTile];
      for (int jj = 0; jj < kTile; ++jj)
        for (int ii = 0; ii < kTile; ++ii) s[jj][ii] = w.acc[(j + jj) * kBlockM + i + ii];
      const double *a = w.a.data() + i, *b = w.b.data() + j;
      for (long long l = 0; l < kb; ++l, a += kBlockM, b += kBlockN)
        for (int jj = 0; jj < kTile; ++jj)
          for (int ii = 0; ii < kTile; ++ii) s[jj][ii] += a[ii] * b[jj];
      for (int jj = 0; jj < kTile; ++jj)
        for (int ii = 0; ii < kTile; ++ii) w.acc[(j + jj) * kBlockM + i + ii] = s[jj][ii];
    }
}

long long min_ll(long long x, long long y) { return x < y ? x : y; }
long long tiles(long long x) { return (x + kTile - 1) / kTile * kTile; }

void run_one(const sim_gemm *g, const char *A, const char *B, char *C, blocks &w) {
  const bool ta = g->transa != CUBLAS_OP_N, tb = g->transb != CUBLAS_OP_N;
  const bool reads_ab = g->k > 0 && g->alpha != 0.0;
  for (long long j0 = 0; j0 < g->n; j0 += kBlockN) {
    const long long nb = min_ll(kBlockN, g->n - j0);
    for (long long i0 = 0; i0 < g->m; i0 += kBlockM) {
      const long long mb = min_ll(kBlockM, g->m - i0);
      std::fill(w.acc.begin(), w.acc.end(), 0.0);
      for (long long l0 = 0; reads_ab && l0 < g->k; l0 += kBlockK) {
        const long long kb = min_ll(kBlockK, g->k - l0);
        /* op(A) rows i0.., columns l0..: a[l][i]; op(B)^T rows j0.., columns l0..: b[l][j] */
        pack(A, g->atype, g->compute, g->lda, ta, i0, l0, mb, kb, tiles(mb), w.a.data(),
             kBlockM);
        pack(B, g->btype, g->compute, g->ldb, !tb, j0, l0, nb, kb, tiles(nb), w.b.data(),
             kBlockN);
        block_product(w, kb, tiles(mb), tiles(nb));
      }
      for (long long j = 0; j < nb; ++j)
        for (long long i = 0; i < mb; ++i) {
          const long long ic = (i0 + i) + (j0 + j) * g->ldc;
          double v = g->alpha * w.acc[j * kBlockM + i];
          if (g->beta != 0.0) v += g->beta * load_c(C, g->ctype, ic); /* beta == 0: C unread */
          if (g->ctype != CUDA_R_64F) v = (float)v;                    /* the fp32 result */
          store_c(C, g->ctype, ic, v);
        }
    }
  }
}

} // namespace

void sim_gemm_run(const sim_gemm *g) {
  if (g->m == 0 || g->n == 0) return;
  const size_t ea = elem_size(g->atype), eb = elem_size(g->btype), ec = elem_size(g->ctype);
  blocks w;
  for (int b = 0; b < g->batch; ++b)
    run_one(g, (const char *)g->A + (long long)ea * g->strideA * b,
            (const char *)g->B + (long long)eb * g->strideB * b,
            (char *)g->C + (long long)ec * g->strideC * b, w);
}
