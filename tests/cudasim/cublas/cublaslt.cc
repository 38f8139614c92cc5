/* tests/cudasim/cublas/cublaslt.cc — the simulated cuBLASLt library's entry
 * points (cublasLt.h): live handles, heap descriptors, a heuristic that
 * answers one algorithm exactly when cublasLtMatmul would accept the call, and
 * cublasLtMatmul, which checks at the call (lt_reference.cc) and queues the
 * reference epilogue on the given stream with cudaLaunchHostFunc, in stream
 * order like a kernel.
 * Workspace: offered one (CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES), the
 * heuristic's algorithm takes min(offered, m * n * 4 bytes), as a split-K
 * kernel's fp32 partial sums would; cublasLtMatmul refuses a smaller or NULL
 * workspace (CUBLAS_STATUS_INVALID_VALUE, as the toolkit documents) and
 * overwrites the part its algorithm takes in stream order, so that a workspace smaller than
 * claimed is a heap overflow under ASan and one shared by two streams a data
 * race under TSan. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include <mutex>
#include <new>
#include <unordered_set>

#include "cublasLt.h"
#include "lt_reference.h"

#define SIM_EXPORT extern "C" __attribute__((visibility("default")))

struct cublasLtContext {
  int unused;
};
struct cublasLtMatmulDescSim {
  int compute, scale, transa, transb;
  uint32_t epilogue;
  void *bias, *aux;
  int64_t aux_ld;
};
struct cublasLtMatrixLayoutSim {
  int type;
  uint64_t rows, cols;
  int64_t ld;
};
struct cublasLtMatmulPreferenceSim {
  uint64_t workspace;
  uint32_t align[4]; /* A, B, C, D: promised alignment in bytes */
};

namespace {

std::mutex handles_lock;
std::unordered_set<cublasLtContext *> handles;

bool live(cublasLtHandle_t h) {
  std::lock_guard<std::mutex> guard(handles_lock);
  return handles.count(h) != 0;
}

cublasStatus_t refuse(cublasStatus_t st, const char *fn, const char *what) {
  fprintf(stderr, "%s: %s\n", fn, what);
  return st;
}

/* A queued call and the workspace its algorithm takes. */
struct queued_lt {
  sim_lt e;
  void *ws;
  size_t ws_bytes;
};

void run_call(void *p) {
  queued_lt *q = static_cast<queued_lt *>(p);
  sim_lt_run(&q->e);
  if (q->ws_bytes) memset(q->ws, 0xa5, q->ws_bytes); /* the kernel's scratch, in stream order */
  delete q;
}

/* The call described by the descriptors; pointers as given. */
cublasStatus_t describe(const char *fn, cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                        cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                        cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd, const void *A,
                        const void *B, const void *C, void *D, sim_lt *e) {
  if (!live(h))
    return refuse(CUBLAS_STATUS_NOT_INITIALIZED, fn, "the handle is not a live cuBLASLt handle "
                  "(never created by cublasLtCreate, or destroyed): CUBLAS_STATUS_NOT_INITIALIZED");
  if (!d || !a || !b || !c || !dd)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "a descriptor is NULL: "
                  "CUBLAS_STATUS_INVALID_VALUE");
  if (c->type != dd->type || c->rows != dd->rows || c->cols != dd->cols || c->ld != dd->ld)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "Cdesc and Ddesc differ (type, rows, cols "
                  "or ld): CUBLAS_STATUS_INVALID_VALUE");
  if (C != D)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "C and D are different buffers, which the "
                  "simulator does not model: CUBLAS_STATUS_NOT_SUPPORTED");
  const uint64_t m = dd->rows, n = dd->cols;
  const uint64_t am = d->transa == CUBLAS_OP_N ? a->rows : a->cols;
  const uint64_t k = d->transa == CUBLAS_OP_N ? a->cols : a->rows;
  const uint64_t bk = d->transb == CUBLAS_OP_N ? b->rows : b->cols;
  const uint64_t bn = d->transb == CUBLAS_OP_N ? b->cols : b->rows;
  if (am != m || bk != k || bn != n) {
    char why[256];
    snprintf(why, sizeof why, "op(A) is %llu x %llu and op(B) %llu x %llu, D is %llu x %llu: "
             "CUBLAS_STATUS_INVALID_VALUE", (unsigned long long)am, (unsigned long long)k,
             (unsigned long long)bk, (unsigned long long)bn, (unsigned long long)m,
             (unsigned long long)n);
    return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, why);
  }
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX || a->ld > INT_MAX || b->ld > INT_MAX ||
      dd->ld > INT_MAX)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "a dimension past INT_MAX, which the "
                  "simulator does not model: CUBLAS_STATUS_NOT_SUPPORTED");
  if (d->scale != CUDA_R_32F && d->scale != CUDA_R_64F)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "a scale type other than 32F/64F, which "
                  "the simulator does not model: CUBLAS_STATUS_NOT_SUPPORTED");
  *e = sim_lt{sim_gemm{fn, d->transa, d->transb, (int)m, (int)n, (int)k, 0.0, 0.0, A, a->type,
                       (int)a->ld, 0, B, b->type, (int)b->ld, 0, D, dd->type, (int)dd->ld, 0, 1,
                       d->compute, CUBLAS_GEMM_DEFAULT},
              (int)d->epilogue, d->bias, d->aux, d->aux_ld};
  return CUBLAS_STATUS_SUCCESS;
}

/* The alignment in bytes the heuristic reads from a bias or aux pointer: its
 * largest power-of-two divisor, at most 256 (the preference's default for
 * A..D); 0 for NULL. */
uint64_t alignment_of(const void *p) {
  const uintptr_t v = (uintptr_t)p, low = v & (~v + 1); /* the lowest set bit */
  return low < 256 ? low : 256;
}

template <class T> cublasStatus_t put(T *slot, const void *buf, size_t size, const char *name) {
  if (!buf || size != sizeof(T)) {
    fprintf(stderr, "cublasLt: attribute %s takes %zu bytes, got %zu%s: "
            "CUBLAS_STATUS_INVALID_VALUE\n", name, sizeof(T), size, buf ? "" : " at NULL");
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  memcpy(slot, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

} // namespace

SIM_EXPORT cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle) {
  if (!handle) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate", "handle is NULL");
  cublasLtContext *h = new (std::nothrow) cublasLtContext{0};
  if (!h) return CUBLAS_STATUS_ALLOC_FAILED;
  std::lock_guard<std::mutex> guard(handles_lock);
  handles.insert(h);
  *handle = h;
  return CUBLAS_STATUS_SUCCESS;
}

SIM_EXPORT cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  std::lock_guard<std::mutex> guard(handles_lock);
  if (handles.erase(handle) != 1)
    return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy", "not a live handle");
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

SIM_EXPORT cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc,
                                                   cublasComputeType_t compute,
                                                   cudaDataType_t scale) {
  if (!desc) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescCreate", "NULL");
  *desc = new (std::nothrow) cublasLtMatmulDescSim{(int)compute, (int)scale, CUBLAS_OP_N,
                                                   CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT,
                                                   nullptr, nullptr, 0};
  return *desc ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

SIM_EXPORT cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

SIM_EXPORT cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                                         cublasLtMatmulDescAttributes_t attr,
                                                         const void *buf, size_t size) {
  if (!d) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescSetAttribute", "NULL");
  switch (attr) {
  case CUBLASLT_MATMUL_DESC_TRANSA: return put(&d->transa, buf, size, "TRANSA");
  case CUBLASLT_MATMUL_DESC_TRANSB: return put(&d->transb, buf, size, "TRANSB");
  case CUBLASLT_MATMUL_DESC_EPILOGUE: return put(&d->epilogue, buf, size, "EPILOGUE");
  case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return put(&d->bias, buf, size, "BIAS_POINTER");
  case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return put(&d->aux, buf, size, "AUX_POINTER");
  case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return put(&d->aux_ld, buf, size, "AUX_LD");
  }
  fprintf(stderr, "cublasLtMatmulDescSetAttribute: attribute %d is not modelled by the "
          "simulator: CUBLAS_STATUS_NOT_SUPPORTED\n", (int)attr);
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

SIM_EXPORT cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout,
                                                     cudaDataType type, uint64_t rows,
                                                     uint64_t cols, int64_t ld) {
  if (!layout) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate", "NULL");
  *layout = new (std::nothrow) cublasLtMatrixLayoutSim{(int)type, rows, cols, ld};
  return *layout ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

SIM_EXPORT cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

SIM_EXPORT cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
  if (!pref) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceCreate", "NULL");
  *pref = new (std::nothrow) cublasLtMatmulPreferenceSim{0, {256, 256, 256, 256}};
  return *pref ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

SIM_EXPORT cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

SIM_EXPORT cublasStatus_t cublasLtMatmulPreferenceSetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
    size_t size) {
  if (!pref)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceSetAttribute", "NULL");
  switch (attr) {
  case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
    return put(&pref->workspace, buf, size, "MAX_WORKSPACE_BYTES");
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
    return put(&pref->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, size,
               "MIN_ALIGNMENT");
  }
  return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulPreferenceSetAttribute",
                "an attribute the simulator does not model: CUBLAS_STATUS_NOT_SUPPORTED");
}

/* One algorithm when the call with these descriptors would be accepted,
 * relying on the preference's promised alignments for A..D and on the
 * alignment of the bias and aux pointers it is shown (kept in the
 * algorithm's data[0..3] and [4], [5], checked by cublasLtMatmul), taking
 * min(MAX_WORKSPACE_BYTES, m * n * 4) bytes of workspace (workspaceSize and
 * data[6], checked by cublasLtMatmul); else the
 * refusal's status and no algorithm (the toolkit answers
 * CUBLAS_STATUS_NOT_SUPPORTED when no kernel fits). */
SIM_EXPORT cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
    cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd, cublasLtMatmulPreference_t pref,
    int requested, cublasLtMatmulHeuristicResult_t results[], int *count) {
  const char *fn = "cublasLtMatmulAlgoGetHeuristic";
  if (!pref || requested < 1 || !results || !count)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "NULL preference, results or count, or "
                  "requestedAlgoCount < 1: CUBLAS_STATUS_INVALID_VALUE");
  *count = 0;
  static const float probe[1] = {0.0f}; /* the heuristic reads no matrix: any non-NULL */
  float scratch[1];
  sim_lt e;
  cublasStatus_t st = describe(fn, h, d, a, b, c, dd, probe, probe, scratch, scratch, &e);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const double one = 1.0, zero = 0.0;
  const float onef = 1.0f, zerof = 0.0f;
  const bool f64 = d->scale == CUDA_R_64F;
  char why[512];
  st = sim_lt_check(&e, f64 ? (const void *)&one : &onef, f64 ? (const void *)&zero : &zerof,
                    why, sizeof why);
  if (st != CUBLAS_STATUS_SUCCESS) return refuse(st, fn, why);
  memset(&results[0], 0, sizeof results[0]);
  for (int i = 0; i < 4; ++i) results[0].algo.data[i] = pref->align[i];
  results[0].algo.data[4] = alignment_of(sim_lt_has_bias(e.epilogue) ? e.bias : nullptr);
  results[0].algo.data[5] = alignment_of(sim_lt_has_aux(e.epilogue) ? e.aux : nullptr);
  const uint64_t partials = (uint64_t)e.g.m * (uint64_t)e.g.n * 4;
  results[0].workspaceSize = pref->workspace < partials ? pref->workspace : partials;
  results[0].algo.data[6] = results[0].workspaceSize;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *count = 1;
  return CUBLAS_STATUS_SUCCESS;
}

SIM_EXPORT cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                         const void *alpha, const void *A,
                                         cublasLtMatrixLayout_t a, const void *B,
                                         cublasLtMatrixLayout_t b, const void *beta,
                                         const void *C, cublasLtMatrixLayout_t c, void *D,
                                         cublasLtMatrixLayout_t dd,
                                         const cublasLtMatmulAlgo_t *algo, void *workspace,
                                         size_t workspace_bytes, cudaStream_t stream) {
  const char *fn = "cublasLtMatmul";
  if (!algo)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "no algorithm: the simulator models only "
                  "one from cublasLtMatmulAlgoGetHeuristic: CUBLAS_STATUS_NOT_SUPPORTED");
  const uint64_t ws_need = algo->data[6];
  if (ws_need && (!workspace || workspace_bytes < ws_need)) {
    char why[200];
    snprintf(why, sizeof why, "workspace %p of %zu bytes, its algorithm takes %llu: "
             "CUBLAS_STATUS_INVALID_VALUE", workspace, workspace_bytes,
             (unsigned long long)ws_need);
    return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, why);
  }
  const void *ptrs[4] = {A, B, C, D};
  for (int i = 0; i < 4; ++i)
    if (algo->data[i] == 0 || (uintptr_t)ptrs[i] % algo->data[i] != 0) {
      char why[200];
      snprintf(why, sizeof why, "matrix %c at %p is less aligned than the %llu bytes its "
               "algorithm was chosen for (MIN_ALIGNMENT_%c_BYTES): CUBLAS_STATUS_NOT_SUPPORTED",
               "ABCD"[i], ptrs[i], (unsigned long long)algo->data[i], "ABCD"[i]);
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, why);
    }
  sim_lt e;
  cublasStatus_t st = describe(fn, h, d, a, b, c, dd, A, B, C, D, &e);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  char why[512];
  st = sim_lt_check(&e, alpha, beta, why, sizeof why);
  if (st != CUBLAS_STATUS_SUCCESS) return refuse(st, fn, why);
  /* The bias and aux pointers as aligned as those the heuristic chose for (an
   * algorithm chosen without one has 0 there). */
  const struct {
    bool used;
    const void *p;
    uint64_t align;
    const char *name;
  } epi[2] = {{sim_lt_has_bias(e.epilogue), e.bias, algo->data[4], "BIAS_POINTER"},
              {sim_lt_has_aux(e.epilogue), e.aux, algo->data[5], "EPILOGUE_AUX_POINTER"}};
  for (const auto &x : epi)
    if (x.used && (x.align == 0 || (uintptr_t)x.p % x.align != 0)) {
      snprintf(why, sizeof why, "CUBLASLT_MATMUL_DESC_%s %p is less aligned than the %llu bytes "
               "its algorithm was chosen for (the pointer cublasLtMatmulAlgoGetHeuristic saw): "
               "CUBLAS_STATUS_NOT_SUPPORTED", x.name, x.p, (unsigned long long)x.align);
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, why);
    }
  if (e.g.m == 0 || e.g.n == 0) return CUBLAS_STATUS_SUCCESS;
  queued_lt *queued = new (std::nothrow) queued_lt{e, workspace, (size_t)ws_need};
  if (!queued) return CUBLAS_STATUS_ALLOC_FAILED;
  const cudaError_t err = cudaLaunchHostFunc(stream, run_call, queued);
  if (err != cudaSuccess) {
    delete queued;
    return refuse(CUBLAS_STATUS_EXECUTION_FAILED, fn, cudaGetErrorString(err));
  }
  return CUBLAS_STATUS_SUCCESS;
}
