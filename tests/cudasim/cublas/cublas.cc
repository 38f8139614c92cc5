/* tests/cudasim/cublas/cublas.cc — the simulated cuBLAS library's entry
 * points (cublas_v2.h): a registry of live handles, the stream binding, and
 * the two GemmEx calls, which check their arguments at the call (as cuBLAS
 * does, before launching anything) and queue the reference product
 * (gemm_reference.cc) on the handle's stream with cudaLaunchHostFunc, so
 * that it runs asynchronously and in stream order like a kernel. */
#include <stdio.h>

#include <mutex>
#include <new>
#include <unordered_set>

#include "gemm_reference.h"

#define SIM_EXPORT extern "C" __attribute__((visibility("default")))

struct cublasContext {
  cudaStream_t stream; /* 0 (the legacy stream) until cublasSetStream_v2 */
};

namespace {

/* Live handles: a destroyed or made-up handle is found missing here rather
 * than by reading freed memory. */
std::mutex handles_lock;
std::unordered_set<cublasContext *> handles;

bool live(cublasHandle_t h, cudaStream_t *stream) {
  std::lock_guard<std::mutex> guard(handles_lock);
  if (!handles.count(h)) return false;
  if (stream) *stream = h->stream;
  return true;
}

cublasStatus_t not_initialized(const char *fn, cublasHandle_t h) {
  fprintf(stderr, "%s: handle %p is not a live cuBLAS handle (never created by "
          "cublasCreate_v2, or destroyed): CUBLAS_STATUS_NOT_INITIALIZED\n", fn, (void *)h);
  return CUBLAS_STATUS_NOT_INITIALIZED;
}

void run_product(void *p) {
  sim_gemm *g = static_cast<sim_gemm *>(p);
  sim_gemm_run(g);
  delete g;
}

/* Checks g at the call and queues it on h's stream. */
cublasStatus_t launch(cublasHandle_t h, sim_gemm g, const void *alpha, const void *beta) {
  cudaStream_t stream;
  if (!live(h, &stream)) return not_initialized(g.fn, h);
  char why[512];
  const cublasStatus_t st = sim_gemm_check(&g, alpha, beta, why, sizeof why);
  if (st != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "%s\n", why);
    return st;
  }
  if (g.m == 0 || g.n == 0 || g.batch == 0) return CUBLAS_STATUS_SUCCESS;
  sim_gemm *queued = new (std::nothrow) sim_gemm(g);
  if (!queued) return CUBLAS_STATUS_ALLOC_FAILED;
  const cudaError_t e = cudaLaunchHostFunc(stream, run_product, queued);
  if (e != cudaSuccess) {
    delete queued;
    fprintf(stderr, "%s: cannot queue the product on stream %p: %s: "
            "CUBLAS_STATUS_EXECUTION_FAILED\n", g.fn, (void *)stream, cudaGetErrorString(e));
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  return CUBLAS_STATUS_SUCCESS;
}

} // namespace

SIM_EXPORT cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
  if (!handle) {
    fprintf(stderr, "cublasCreate_v2: handle is NULL: CUBLAS_STATUS_INVALID_VALUE\n");
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  cublasContext *h = new (std::nothrow) cublasContext{nullptr};
  if (!h) return CUBLAS_STATUS_ALLOC_FAILED;
  std::lock_guard<std::mutex> guard(handles_lock);
  handles.insert(h);
  *handle = h;
  return CUBLAS_STATUS_SUCCESS;
}

SIM_EXPORT cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  {
    std::lock_guard<std::mutex> guard(handles_lock);
    if (handles.erase(handle) == 1) {
      delete handle;
      return CUBLAS_STATUS_SUCCESS;
    }
  }
  return not_initialized("cublasDestroy_v2", handle);
}

SIM_EXPORT cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  std::lock_guard<std::mutex> guard(handles_lock);
  if (!handles.count(handle)) return not_initialized("cublasSetStream_v2", handle);
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

SIM_EXPORT cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *stream) {
  if (!stream) {
    fprintf(stderr, "cublasGetStream_v2: streamId is NULL: CUBLAS_STATUS_INVALID_VALUE\n");
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (!live(handle, stream)) return not_initialized("cublasGetStream_v2", handle);
  return CUBLAS_STATUS_SUCCESS;
}

SIM_EXPORT cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                                       cublasOperation_t transb, int m, int n, int k,
                                       const void *alpha, const void *A, cudaDataType Atype,
                                       int lda, const void *B, cudaDataType Btype, int ldb,
                                       const void *beta, void *C, cudaDataType Ctype, int ldc,
                                       cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  const sim_gemm g = {"cublasGemmEx", transa, transb, m, n, k, 0.0, 0.0, A, Atype, lda, 0,
                      B, Btype, ldb, 0, C, Ctype, ldc, 0, 1, computeType, algo};
  return launch(handle, g, alpha, beta);
}

SIM_EXPORT cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
    int k, const void *alpha, const void *A, cudaDataType Atype, int lda, long long strideA,
    const void *B, cudaDataType Btype, int ldb, long long strideB, const void *beta, void *C,
    cudaDataType Ctype, int ldc, long long strideC, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  const sim_gemm g = {"cublasGemmStridedBatchedEx", transa, transb, m, n, k, 0.0, 0.0,
                      A, Atype, lda, strideA, B, Btype, ldb, strideB, C, Ctype, ldc, strideC,
                      batchCount, computeType, algo};
  return launch(handle, g, alpha, beta);
}

SIM_EXPORT const char *cublasGetStatusName(cublasStatus_t s) {
  switch (s) {
  case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
  case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
  case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
  case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
  case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
  case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
  case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

SIM_EXPORT const char *cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
  case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS: success";
  case CUBLAS_STATUS_NOT_INITIALIZED:
    return "CUBLAS_STATUS_NOT_INITIALIZED: the handle was not created by cublasCreate";
  case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED: out of memory";
  case CUBLAS_STATUS_INVALID_VALUE:
    return "CUBLAS_STATUS_INVALID_VALUE: an argument is out of its documented range";
  case CUBLAS_STATUS_ARCH_MISMATCH:
    return "CUBLAS_STATUS_ARCH_MISMATCH: the device lacks a feature the call needs";
  case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR: texture mapping failed";
  case CUBLAS_STATUS_EXECUTION_FAILED:
    return "CUBLAS_STATUS_EXECUTION_FAILED: the product could not be launched";
  case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR: internal error";
  case CUBLAS_STATUS_NOT_SUPPORTED:
    return "CUBLAS_STATUS_NOT_SUPPORTED: this combination of types or options is not supported";
  case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR: license error";
  }
  return "CUBLAS_STATUS_UNKNOWN: not a cublasStatus_t value";
}
