/* tests/cudasim/cublas/gemm_reference.h — the simulated cuBLAS's core: one
 * description of a (strided batched) GemmEx call, its documented argument
 * checks, and the reference loop that computes it. No CUDA runtime here, so
 * test_gemm_reference.cc checks the core on its own; cublas.cc wraps it in
 * handles and streams. The contract modelled is written out in
 * tests/cudasim/include/cublas_v2.h. */
#ifndef FSDP_CUDASIM_GEMM_REFERENCE_H
#define FSDP_CUDASIM_GEMM_REFERENCE_H

#include <stddef.h>

#include "cublas_v2.h"

/* Everything a product needs after the call returns: alpha and beta are
 * copied (host pointer mode), pointers are the caller's device buffers. */
struct sim_gemm {
  const char *fn;                  /* "cublasGemmEx" or "cublasGemmStridedBatchedEx" */
  /* The enums arrive as ints: a caller may pass any number, and holding one
   * that is no enumerator in an enum type is undefined behaviour. */
  int transa, transb;              /* cublasOperation_t */
  int m, n, k;
  double alpha, beta;              /* read from the caller's pointers by sim_gemm_check */
  const void *A;
  int atype;                       /* cudaDataType */
  int lda;
  long long strideA;
  const void *B;
  int btype;
  int ldb;
  long long strideB;
  void *C;
  int ctype;
  int ldc;
  long long strideC;
  int batch;                       /* 1 for cublasGemmEx */
  int compute;                     /* cublasComputeType_t */
  int algo;                        /* cublasGemmAlgo_t */
};

/* Checks g as cuBLAS documents (cublas_v2.h) and, on success, reads *alpha and
 * *beta into g->alpha / g->beta in the compute type's scalar type. On failure
 * returns the status and writes one line naming the argument and its value
 * into why (also what the caller prints). */
cublasStatus_t sim_gemm_check(struct sim_gemm *g, const void *alpha, const void *beta,
                              char *why, size_t why_size);

/* Computes a checked product, every batch, in the calling thread. */
void sim_gemm_run(const struct sim_gemm *g);

/* Rounding helpers the tests share: fp32 -> bf16 bits (nearest even, NaN kept
 * quiet) and back; fp32 -> TF32 (ties away from zero). */
unsigned short sim_bf16_from_float(float x);
float sim_bf16_to_float(unsigned short h);
float sim_tf32_round(float x);

#endif
