/* tests/cudasim/include/cublas_v2.h — the simulated cuBLAS's public header
 * (implementation: tests/cudasim/cublas/). It declares the subset of the
 * cuBLAS v2 API that fsdp calls (src/backend/cuda/blas.cu, bench/bench_cuda.c through
 * src/backend/cuda/cublas_lazy.h): handles, the stream binding, cublasGemmEx and
 * cublasGemmStridedBatchedEx, and the status text. Enum values and
 * signatures are the CUDA 13 toolkit's (cublas_api.h), so a program compiled
 * against this header passes cuBLAS the same numbers it passes on a GPU.
 *
 * The library is a shared object named libcublas.so.<CUBLAS_VER_MAJOR>, so
 * cublas_lazy.h's dlopen finds it exactly as it finds the real one; the
 * program's RUNPATH or LD_LIBRARY_PATH must name its directory before the
 * toolkit's (the real libcublas.so.13 may be in the ld.so cache).
 *
 * What the simulation models (every product is a plain reference loop
 * written from the cuBLAS documentation, not from fsdp's wrappers):
 *  - column-major storage, C = alpha op(A) op(B) + beta C with op(A) m x k,
 *    op(B) k x n, C m x n; CUBLAS_OP_C equals CUBLAS_OP_T for real types;
 *  - the documented argument checks, each refused with
 *    CUBLAS_STATUS_INVALID_VALUE and one stderr line naming the argument and
 *    its value: m, n, k, batchCount < 0; transa/transb not N, T or C;
 *    lda < max(1, transa == N ? m : k); ldb < max(1, transb == N ? k : n);
 *    ldc < max(1, m); alpha or beta NULL; a number that is no data type,
 *    compute type or algorithm. Also (beyond cuBLAS, which would fault on
 *    the device instead) a NULL A, B or C that the product would touch;
 *  - type combinations from the cublasGemmEx table: A and B of one type;
 *    COMPUTE_32F / _32F_PEDANTIC with (32F,32F,32F), (16BF,16BF,16BF),
 *    (16BF,16BF,32F); _32F_FAST_TF32 and _32F_FAST_16BF with 32F only;
 *    COMPUTE_64F / _64F_PEDANTIC with 64F. Others that cuBLAS documents
 *    (fp16, int8, complex, _32F_FAST_16F, 32I) are CUBLAS_STATUS_NOT_SUPPORTED
 *    here with a line saying the simulator does not model them; a
 *    combination cuBLAS itself refuses is CUBLAS_STATUS_NOT_SUPPORTED too;
 *  - arithmetic: inputs widened exactly (bf16 -> fp32 is exact), except
 *    _32F_FAST_TF32, which first rounds each fp32 input to TF32 (10 mantissa
 *    bits, nearest, ties away from zero as cvt.rna.tf32.f32 does), and
 *    _32F_FAST_16BF, which rounds each fp32 input to bf16 (nearest even).
 *    The dot product is accumulated in double in k order, then
 *    alpha * dot + beta * C is formed in double and rounded once to fp32 (and
 *    then once more to bf16, nearest even, for a bf16 C; fp64 C keeps
 *    double). A GPU accumulates in fp32 in an order of its choosing, so the
 *    simulator is at least as accurate: it proves the mapping (operands,
 *    shapes, strides, leading dimensions), not the GPU's rounding;
 *  - beta == 0: C is not read (NaN garbage in C is overwritten); alpha == 0:
 *    A and B are not read (the reference BLAS rule); m, n or batchCount == 0:
 *    nothing is done; k == 0: C = beta C;
 *  - alpha and beta are read at the call (CUBLAS_POINTER_MODE_HOST, the
 *    default and the only mode modelled): float for the 32F compute types,
 *    double for 64F;
 *  - the product runs on the handle's stream (cublasSetStream_v2; the legacy
 *    stream 0 by default), queued with cudaLaunchHostFunc: the call returns at
 *    once and products on one stream run in order, as kernels do;
 *  - a handle that cublasCreate_v2 did not return, or one already destroyed,
 *    is CUBLAS_STATUS_NOT_INITIALIZED (a registry of live handles, so the
 *    check never reads freed memory).
 * Not modelled: timing, tensor-core rounding and summation order, the
 * workspace, math modes, device pointer mode, cudaDeviceSynchronize in
 * cublasDestroy_v2 (queued products own copies of their arguments, so a
 * destroyed handle cannot be touched by them). */
#ifndef FSDP_CUDASIM_CUBLAS_V2_H
#define FSDP_CUDASIM_CUBLAS_V2_H

#include <cuda_runtime_api.h> /* cudaStream_t */

#include "library_types.h"

#define CUBLAS_VER_MAJOR 13
#define CUBLAS_VER_MINOR 0
#define CUBLAS_VER_PATCH 0
#define CUBLAS_VERSION (CUBLAS_VER_MAJOR * 10000 + CUBLAS_VER_MINOR * 100 + CUBLAS_VER_PATCH)

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
  CUBLAS_STATUS_LICENSE_ERROR = 16
} cublasStatus_t;

typedef enum {
  CUBLAS_OP_N = 0,
  CUBLAS_OP_T = 1,
  CUBLAS_OP_C = 2,
  CUBLAS_OP_HERMITAN = 2,
  CUBLAS_OP_CONJG = 3 /* cuBLAS: "not supported"; refused as INVALID_VALUE */
} cublasOperation_t;

/* Any algorithm is accepted and means the same reference loop. */
typedef enum {
  CUBLAS_GEMM_DFALT = -1,
  CUBLAS_GEMM_DEFAULT = -1,
  CUBLAS_GEMM_ALGO0 = 0,  /* ... through CUBLAS_GEMM_ALGO23 = 23 */
  CUBLAS_GEMM_ALGO23 = 23,
  CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99,
  CUBLAS_GEMM_DFALT_TENSOR_OP = 99,
  CUBLAS_GEMM_ALGO0_TENSOR_OP = 100, /* ... through ALGO15_TENSOR_OP = 115 */
  CUBLAS_GEMM_ALGO15_TENSOR_OP = 115
} cublasGemmAlgo_t;

typedef enum {
  CUBLAS_COMPUTE_16F = 64,
  CUBLAS_COMPUTE_16F_PEDANTIC = 65,
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_PEDANTIC = 69,
  CUBLAS_COMPUTE_32F_FAST_16F = 74,
  CUBLAS_COMPUTE_32F_FAST_16BF = 75,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
  CUBLAS_COMPUTE_32F_EMULATED_16BFX9 = 78,
  CUBLAS_COMPUTE_64F = 70,
  CUBLAS_COMPUTE_64F_PEDANTIC = 71,
  CUBLAS_COMPUTE_64F_EMULATED_FIXEDPOINT = 79,
  CUBLAS_COMPUTE_32I = 72,
  CUBLAS_COMPUTE_32I_PEDANTIC = 73
} cublasComputeType_t;

struct cublasContext;
typedef struct cublasContext *cublasHandle_t;

/* CUBLAS_STATUS_ALLOC_FAILED when out of memory; handle NULL:
 * CUBLAS_STATUS_INVALID_VALUE. The new handle uses the legacy stream 0. */
cublasStatus_t cublasCreate_v2(cublasHandle_t *handle);
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle);
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId);
cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *streamId);

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo);

/* Batch i uses A + i*strideA, B + i*strideB, C + i*strideC (in elements). */
cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
    int k, const void *alpha, const void *A, cudaDataType Atype, int lda, long long int strideA,
    const void *B, cudaDataType Btype, int ldb, long long int strideB, const void *beta, void *C,
    cudaDataType Ctype, int ldc, long long int strideC, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t algo);

/* "CUBLAS_STATUS_<NAME>: what it means"; never NULL. */
const char *cublasGetStatusString(cublasStatus_t status);
const char *cublasGetStatusName(cublasStatus_t status);

#ifdef __cplusplus
}
#endif

#define cublasCreate cublasCreate_v2
#define cublasDestroy cublasDestroy_v2
#define cublasSetStream cublasSetStream_v2
#define cublasGetStream cublasGetStream_v2

#endif
