/* tests/cudasim/include/library_types.h — the simulator's cudaDataType_t
 * (owned by the cuBLAS/NCCL half of the simulator, tests/cudasim/cublas).
 * The numeric values are the CUDA toolkit's (library_types.h of CUDA 13), so
 * that a value printed by the simulator means what it means on a GPU and a
 * program built against either header passes the same numbers. Only the real
 * types are listed; the complex, 4-bit and fp6/fp4 ones are absent because
 * nothing here uses them (a caller passing such a number gets
 * CUBLAS_STATUS_INVALID_VALUE from the simulated cuBLAS, naming it). */
#ifndef FSDP_CUDASIM_LIBRARY_TYPES_H
#define FSDP_CUDASIM_LIBRARY_TYPES_H

typedef enum cudaDataType_t {
  CUDA_R_16F = 2,       /* half */
  CUDA_R_16BF = 14,     /* bfloat16 */
  CUDA_R_32F = 0,       /* float */
  CUDA_R_64F = 1,       /* double */
  CUDA_R_8I = 3,        /* int8 */
  CUDA_R_8U = 8,        /* uint8 */
  CUDA_R_16I = 20,      /* int16 */
  CUDA_R_16U = 22,      /* uint16 */
  CUDA_R_32I = 10,      /* int32 */
  CUDA_R_32U = 12,      /* uint32 */
  CUDA_R_64I = 24,      /* int64 */
  CUDA_R_64U = 26,      /* uint64 */
  CUDA_R_8F_E4M3 = 28,  /* fp8 e4m3 */
  CUDA_R_8F_E5M2 = 29   /* fp8 e5m2 */
} cudaDataType;

typedef enum cudaDataType_t cudaDataType_t;

#endif
