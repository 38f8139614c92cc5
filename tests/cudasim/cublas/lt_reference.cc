/* tests/cudasim/cublas/lt_reference.cc — the simulated cuBLASLt's checks and
 * reference epilogues (contract: lt_reference.h). */
#include "lt_reference.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include <vector>

namespace {

double get(const void *p, int t, long long i) {
  return t == CUDA_R_16BF ? sim_bf16_to_float(((const unsigned short *)p)[i])
                          : ((const float *)p)[i];
}

void put(void *p, int t, long long i, double v) {
  if (t == CUDA_R_16BF) ((unsigned short *)p)[i] = sim_bf16_from_float((float)v);
  else ((float *)p)[i] = (float)v;
}

bool known(int e) {
  return e == SIM_LT_DEFAULT || e == SIM_LT_BIAS || e == SIM_LT_GELU_AUX_BIAS ||
         e == SIM_LT_DGELU || e == SIM_LT_DGELU_BGRAD || e == SIM_LT_BGRADA ||
         e == SIM_LT_BGRADB;
}

} // namespace

bool sim_lt_has_bias(int e) {
  return e == SIM_LT_BIAS || e == SIM_LT_GELU_AUX_BIAS || e == SIM_LT_DGELU_BGRAD ||
         e == SIM_LT_BGRADA || e == SIM_LT_BGRADB;
}
bool sim_lt_has_aux(int e) {
  return e == SIM_LT_GELU_AUX_BIAS || e == SIM_LT_DGELU || e == SIM_LT_DGELU_BGRAD;
}

float sim_gelu(float x) {
  const float s = 0.7978845608028654f; /* sqrt(2 / pi) */
  return 0.5f * x * (1.0f + tanhf(s * (x + 0.044715f * x * x * x)));
}

float sim_gelu_grad(float x) {
  const float s = 0.7978845608028654f;
  const float u = s * (x + 0.044715f * x * x * x), t = tanhf(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * s * (1.0f + 3.0f * 0.044715f * x * x);
}

cublasStatus_t sim_lt_check(sim_lt *e, const void *alpha, const void *beta, char *why,
                            size_t why_size) {
  const cublasStatus_t st = sim_gemm_check(&e->g, alpha, beta, why, why_size);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const int ep = e->epilogue;
  if (!known(ep)) {
    snprintf(why, why_size, "cublasLtMatmul: CUBLASLT_MATMUL_DESC_EPILOGUE %d is not modelled "
             "by the simulator: CUBLAS_STATUS_NOT_SUPPORTED", ep);
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (ep == SIM_LT_DEFAULT) return CUBLAS_STATUS_SUCCESS;
  if (e->g.batch != 1 || e->g.ctype == CUDA_R_64F) {
    snprintf(why, why_size, "cublasLtMatmul: epilogue %d on a %s product is not modelled by "
             "the simulator: CUBLAS_STATUS_NOT_SUPPORTED", ep,
             e->g.batch != 1 ? "batched" : "fp64");
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const unsigned size = e->g.ctype == CUDA_R_16BF ? 2 : 4; /* the bias's and aux's element */
  if (sim_lt_has_bias(ep)) {
    if (!e->bias) {
      snprintf(why, why_size, "cublasLtMatmul: epilogue %d needs "
               "CUBLASLT_MATMUL_DESC_BIAS_POINTER, which is NULL: CUBLAS_STATUS_INVALID_VALUE", ep);
      return CUBLAS_STATUS_INVALID_VALUE;
    }
    if ((uintptr_t)e->bias % size != 0) {
      snprintf(why, why_size, "cublasLtMatmul: CUBLASLT_MATMUL_DESC_BIAS_POINTER %p is not "
               "aligned to its %u-byte elements: CUBLAS_STATUS_NOT_SUPPORTED", e->bias, size);
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
  }
  if (sim_lt_has_aux(ep)) {
    if (!e->aux) {
      snprintf(why, why_size, "cublasLtMatmul: epilogue %d needs "
               "CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, which is NULL: "
               "CUBLAS_STATUS_INVALID_VALUE", ep);
      return CUBLAS_STATUS_INVALID_VALUE;
    }
    if ((uintptr_t)e->aux % size != 0) {
      snprintf(why, why_size, "cublasLtMatmul: CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER %p is "
               "not aligned to its %u-byte elements: CUBLAS_STATUS_NOT_SUPPORTED", e->aux, size);
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (e->aux_ld < e->g.m) {
      snprintf(why, why_size, "cublasLtMatmul: CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD %lld is below "
               "D's %d rows: CUBLAS_STATUS_INVALID_VALUE", e->aux_ld, e->g.m);
      return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (e->aux_ld % 8 != 0) {
      snprintf(why, why_size, "cublasLtMatmul: CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD %lld is not "
               "divisible by 8: CUBLAS_STATUS_NOT_SUPPORTED", e->aux_ld);
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

void sim_lt_run(const sim_lt *e) {
  const sim_gemm &g = e->g;
  if (g.m == 0 || g.n == 0) return;
  if (e->epilogue == SIM_LT_DEFAULT) {
    sim_gemm_run(&g);
    return;
  }
  const int t = g.ctype;
  const long long m = g.m, n = g.n;
  /* The product in fp32 (C widened exactly when beta reads it), then the
   * epilogue on those values and one rounding to each output's type. */
  std::vector<float> acc((size_t)(m * n));
  if (g.beta != 0.0)
    for (long long j = 0; j < n; ++j)
      for (long long i = 0; i < m; ++i) acc[i + j * m] = (float)get(g.C, t, i + j * g.ldc);
  sim_gemm f = g;
  f.C = acc.data();
  f.ctype = CUDA_R_32F;
  f.ldc = (int)m;
  sim_gemm_run(&f);
  std::vector<double> bgrad(e->epilogue == SIM_LT_DGELU_BGRAD ? (size_t)m : 0, 0.0);
  for (long long j = 0; j < n; ++j)
    for (long long i = 0; i < m; ++i) {
      float v = acc[i + j * m];
      const long long ia = i + j * e->aux_ld;
      switch (e->epilogue) {
      case SIM_LT_BIAS: v += (float)get(e->bias, t, i); break;
      case SIM_LT_GELU_AUX_BIAS:
        v += (float)get(e->bias, t, i);
        put(e->aux, t, ia, v);
        v = sim_gelu(v);
        break;
      case SIM_LT_DGELU:
      case SIM_LT_DGELU_BGRAD:
        v *= sim_gelu_grad((float)get(e->aux, t, ia));
        if (!bgrad.empty()) bgrad[i] += v;
        break;
      default: break; /* BGRADA, BGRADB: D is the plain product */
      }
      put(g.C, t, i + j * g.ldc, v);
    }
  for (long long i = 0; i < (long long)bgrad.size(); ++i) put(e->bias, t, i, (float)bgrad[i]);
  if (e->epilogue == SIM_LT_BGRADA) {
    /* bias[row] = sum over k of op(A)(row, l) */
    const bool ta = g.transa != CUBLAS_OP_N;
    for (long long i = 0; i < m; ++i) {
      double s = 0.0;
      for (long long l = 0; l < g.k; ++l)
        s += get(g.A, g.atype, ta ? l + i * g.lda : i + l * g.lda);
      put(e->bias, t, i, (float)s);
    }
  }
  if (e->epilogue == SIM_LT_BGRADB) {
    /* bias[col] = sum over k of op(B)(l, col) */
    const bool tb = g.transb != CUBLAS_OP_N;
    for (long long j = 0; j < n; ++j) {
      double s = 0.0;
      for (long long l = 0; l < g.k; ++l) s += get(g.B, g.btype, tb ? j + l * g.ldb : l + j * g.ldb);
      put(e->bias, t, j, (float)s);
    }
  }
}
