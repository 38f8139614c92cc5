/* tests/cudasim/include/cublasLt.h — the simulated cuBLASLt's public header
 * (implementation: tests/cudasim/cublas/cublaslt.cc, core lt_reference.h,
 * which says what is modelled and refused). The subset fsdp calls: the
 * handle, matmul and layout descriptors created on the heap, the preference,
 * the heuristic and cublasLtMatmul. Enum values, attribute sizes and
 * signatures are the CUDA 13 toolkit's; the descriptors are opaque pointers
 * here (the toolkit's are pointers to fixed-size structs that a caller may
 * also place itself; fsdp only creates them). The library is
 * libcublasLt.so.<CUBLAS_VER_MAJOR>, beside the simulated libcublas. */
#ifndef FSDP_CUDASIM_CUBLASLT_H
#define FSDP_CUDASIM_CUBLASLT_H

#include <stddef.h>
#include <stdint.h>

#include "cublas_v2.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cublasLtContext *cublasLtHandle_t;
typedef struct cublasLtMatmulDescSim *cublasLtMatmulDesc_t;
typedef struct cublasLtMatrixLayoutSim *cublasLtMatrixLayout_t;
typedef struct cublasLtMatmulPreferenceSim *cublasLtMatmulPreference_t;

typedef struct {
  uint64_t data[8];
} cublasLtMatmulAlgo_t;

typedef struct {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
} cublasLtMatmulHeuristicResult_t;

/* Attributes modelled; each takes a buffer of exactly the size noted. */
typedef enum {
  CUBLASLT_MATMUL_DESC_TRANSA = 3,                 /* int32_t (cublasOperation_t) */
  CUBLASLT_MATMUL_DESC_TRANSB = 4,                 /* int32_t */
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,               /* uint32_t (cublasLtEpilogue_t) */
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,           /* void * */
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11,  /* void * */
  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12,       /* int64_t */
} cublasLtMatmulDescAttributes_t;

typedef enum {
  CUBLASLT_EPILOGUE_DEFAULT = 1,
  CUBLASLT_EPILOGUE_RELU = 2,
  CUBLASLT_EPILOGUE_BIAS = 4,
  CUBLASLT_EPILOGUE_GELU = 32,
  CUBLASLT_EPILOGUE_GELU_AUX = (CUBLASLT_EPILOGUE_GELU | 128),
  CUBLASLT_EPILOGUE_GELU_BIAS = (CUBLASLT_EPILOGUE_GELU | CUBLASLT_EPILOGUE_BIAS),
  CUBLASLT_EPILOGUE_GELU_AUX_BIAS = (CUBLASLT_EPILOGUE_GELU_AUX | CUBLASLT_EPILOGUE_BIAS),
  CUBLASLT_EPILOGUE_DGELU = 64 | 128,
  CUBLASLT_EPILOGUE_DGELU_BGRAD = CUBLASLT_EPILOGUE_DGELU | 16,
  CUBLASLT_EPILOGUE_BGRADA = 256,
  CUBLASLT_EPILOGUE_BGRADB = 512,
} cublasLtEpilogue_t;

/* MIN_ALIGNMENT_*: the alignment the caller promises for each matrix
 * (default 256, cudaMalloc's); the algorithm the heuristic returns may rely
 * on it, and cublasLtMatmul refuses a pointer less aligned than promised. */
typedef enum {
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,     /* uint64_t */
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,   /* uint32_t */
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,   /* uint32_t */
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,   /* uint32_t */
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,   /* uint32_t */
} cublasLtMatmulPreferenceAttributes_t;

cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                        cublasComputeType_t computeType,
                                        cudaDataType_t scaleType);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t sizeInBytes);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t sizeInBytes);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
    cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc,
    cublasLtMatrixLayout_t Ddesc, cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int *returnAlgoCount);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                              const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                              void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
