/* tests/cudasim/cublas/lt_reference.h — the simulated cuBLASLt's core: one
 * cublasLtMatmul with its epilogue (bias, GELU keeping its input, GELU's
 * gradient with the bias gradient, the bias gradient over A or B), the epilogue's
 * documented checks, and the reference that computes it on top of the
 * reference product (gemm_reference.h). No CUDA runtime here, so
 * test_lt_reference.cc checks it on its own.
 *
 * What is modelled (from cublasLt.h's attribute and epilogue documentation;
 * enum values are the CUDA 13 toolkit's):
 *  - D = epilogue(alpha op(A) op(B) + beta C), column-major, D m x n, with C
 *    and D the same buffer and layout (the only form modelled);
 *  - the product is formed in fp32 (gemm_reference's rules), the epilogue is
 *    applied to that fp32 value and D, the GELU input (aux) and the bias
 *    gradient are each rounded once to their type: one rounding, not the two
 *    of a bf16 product followed by a separate pass;
 *  - CUBLASLT_EPILOGUE_DEFAULT; _BIAS: + bias[row] (length m);
 *    _GELU_AUX_BIAS: pre = product + bias[row], aux(row, col) = pre, D =
 *    gelu(pre); _DGELU: D = product * gelu'(aux); _DGELU_BGRAD: that, and
 *    bias[row] = sum over columns of D (the unrounded values); _BGRADA:
 *    bias[row] = sum over k of op(A)(row, k) (length m); _BGRADB: bias[col] =
 *    sum over k of op(B)(k, col) (length n). GELU is the tanh form. The bias,
 *    aux and bias-gradient types are C's (the attributes' defaults: an fp32 C
 *    over bf16 A and B sums the bias gradient into fp32);
 *  - refusals: a bias or aux epilogue without its pointer is
 *    CUBLAS_STATUS_INVALID_VALUE (beyond cuBLASLt, which would fault on the
 *    device); an aux leading dimension below m is INVALID_VALUE (an impossible
 *    configuration), one not divisible by 8 is CUBLAS_STATUS_NOT_SUPPORTED (the
 *    EPILOGUE_AUX_LD attribute's documented rule); a bias or aux pointer not
 *    a multiple of its element's size is NOT_SUPPORTED (no kernel loads
 *    elements off their alignment, so the heuristic, which reads these
 *    pointers for their alignment, finds none); an epilogue on a batched
 *    product, an fp64 product with an epilogue, and every epilogue not listed
 *    above are NOT_SUPPORTED with a line saying the simulator does not model
 *    them. Everything the product itself refuses is refused as
 *    cublasGemmEx refuses it.
 * Not modelled: the heuristic's choice among kernels, non-default bias / aux
 * data types, row order (the workspace is cublaslt.cc's). Pointer alignment beyond the element is
 * cublaslt.cc's: A, B, C and D the preference's promise, the bias and aux
 * pointers the alignment the heuristic saw in them (cublasLt.h: routines that
 * do not dereference them, like cublasLtMatmulAlgoGetHeuristic, depend on
 * their values to determine the expected alignment), each kept in the
 * algorithm and checked by cublasLtMatmul. */
#ifndef FSDP_CUDASIM_LT_REFERENCE_H
#define FSDP_CUDASIM_LT_REFERENCE_H

#include "gemm_reference.h"

/* The epilogues modelled (cublasLt.h's values). */
enum {
  SIM_LT_DEFAULT = 1,
  SIM_LT_BIAS = 4,
  SIM_LT_GELU_AUX_BIAS = 32 | 128 | 4,
  SIM_LT_DGELU = 64 | 128,
  SIM_LT_DGELU_BGRAD = 64 | 128 | 16,
  SIM_LT_BGRADA = 256,
  SIM_LT_BGRADB = 512,
};

/* A cublasLtMatmul call: the product (g.C is D, g.ctype D's type) and its
 * epilogue. */
struct sim_lt {
  struct sim_gemm g;
  int epilogue;
  void *bias;            /* bias (read) or bias gradient (written), C's type */
  void *aux;             /* GELU input: written by GELU_AUX_BIAS, read by DGELU */
  long long aux_ld;      /* elements */
};

/* Checks e (the product as sim_gemm_check, then the epilogue); on failure
 * returns the status and one line in why naming the argument and value. */
cublasStatus_t sim_lt_check(struct sim_lt *e, const void *alpha, const void *beta, char *why,
                            size_t why_size);

/* Whether epilogue e reads or writes the bias pointer (the bias or its
 * gradient), and the aux pointer (the GELU input). */
bool sim_lt_has_bias(int e);
bool sim_lt_has_aux(int e);

/* Computes a checked call in the calling thread. */
void sim_lt_run(const struct sim_lt *e);

/* The tanh GELU and its derivative, as the epilogues apply them. */
float sim_gelu(float x);
float sim_gelu_grad(float x);

#endif
