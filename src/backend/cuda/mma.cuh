/* src/backend/cuda/mma.cuh — the warp-level tensor-core and async-copy
 * instructions flash.cu is built on, one wrapper each, with the fragment
 * layouts the PTX ISA documents (sm_80 and up): under nvcc inline PTX, under
 * the simulator (FSDP_CUDA_SIM) tests/cudasim/include/cudasim_ptx.h's model of
 * the same layouts, so a kernel that keeps a row's scores in known registers
 * runs the same on both.
 *
 * Layouts (lane l, g = l / 4, t = l % 4; two bf16 per 32-bit register, the
 * lower-indexed element in the low half):
 *   mma_bf16_16816: D (16 x 8, fp32) += A (16 x 16, bf16) B (16 x 8, bf16);
 *     a[0] = A(g, 2t..2t+1), a[1] = A(g+8, 2t..), a[2] = A(g, 2t+8..),
 *     a[3] = A(g+8, 2t+8..); b[0] = B(2t..2t+1, g), b[1] = B(2t+8.., g);
 *     d[0..1] = D(g, 2t..2t+1), d[2..3] = D(g+8, 2t..2t+1).
 *   ldmatrix_x4 / ldmatrix_x4_trans: lanes 8i..8i+7 point at the 8 rows (16
 *     bytes, 16-byte aligned, shared memory) of 8 x 8 matrix i; r[i] gets
 *     row g, columns 2t, 2t+1 of it (trans: rows 2t, 2t+1 of column g).
 * So a row-major tile X[row][col] in shared memory loads as an A operand with
 * ldmatrix_x4 (lane l at row l % 16, column 8 (l / 16)), as the B operand of
 * X^T (its rows are B's columns) with ldmatrix_x4, and as a B operand itself
 * (its rows are B's k) with ldmatrix_x4_trans; and the D fragments of two
 * neighbouring n8 tiles, packed to bf16, are the A fragment of the next
 * product (the FlashAttention-2 register reuse).
 *
 * cp_async16 (and cp_async4): 16 (4) bytes global -> shared without a
 * register, or zeros when !full; cp_async_commit closes this thread's group of copies,
 * cp_async_wait<N> waits until at most N of its groups are in flight (then a
 * __syncthreads makes every thread's copies visible). */
#ifndef FSDP_CUDA_MMA_CUH
#define FSDP_CUDA_MMA_CUH

#include <stdint.h>

#include "backend/cuda/cuda_internal.cuh" /* the simulator's runtime defines FSDP_CUDA_SIM */

#ifdef FSDP_CUDA_SIM
#include <cudasim_ptx.h>
#endif

#ifdef FSDP_CUDA_SIM
#define FSDP_PTX_SITE , const char *file = __builtin_FILE(), int line = __builtin_LINE()
#else
#define FSDP_PTX_SITE
#endif

/* d += A B, fragments as above. */
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4],
                                               const uint32_t (&b)[2] FSDP_PTX_SITE) {
#ifdef FSDP_CUDA_SIM
  ::fsdp_sim::ptx::mma_m16n8k16_bf16(d, a, b, d, file, line);
#else
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
               "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16 *row FSDP_PTX_SITE) {
#ifdef FSDP_CUDA_SIM
  ::fsdp_sim::ptx::ldmatrix_x4(r, row, false, file, line);
#else
  const uint32_t s = (uint32_t)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
#endif
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16 *row FSDP_PTX_SITE) {
#ifdef FSDP_CUDA_SIM
  ::fsdp_sim::ptx::ldmatrix_x4(r, row, true, file, line);
#else
  const uint32_t s = (uint32_t)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
#endif
}

/* 16 bytes from src (global) to dst (shared), or 16 zero bytes when !full
 * (src is then not read). */
__device__ __forceinline__ void cp_async16(bf16 *dst, const bf16 *src, bool full FSDP_PTX_SITE) {
#ifdef FSDP_CUDA_SIM
  ::fsdp_sim::ptx::cp_async16(dst, src, full ? 16 : 0, file, line);
#else
  const uint32_t s = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src),
               "r"(full ? 16 : 0));
#endif
}

/* 4 bytes global -> shared (both 4-byte aligned), or 4 zero bytes when !full
 * (src is then not read): a row's fp32 statistics next to its tiles. */
__device__ __forceinline__ void cp_async4(float *dst, const float *src, bool full FSDP_PTX_SITE) {
#ifdef FSDP_CUDA_SIM
  ::fsdp_sim::ptx::cp_async4(dst, src, full ? 4 : 0, file, line);
#else
  const uint32_t s = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(src),
               "r"(full ? 4 : 0));
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#ifndef FSDP_CUDA_SIM
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N> __device__ __forceinline__ void cp_async_wait() {
#ifndef FSDP_CUDA_SIM
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/* 2^x, the SFU's approximation on the GPU (softmax weights: relative error
 * ~2^-22, far below the bf16 rounding they get next). */
__device__ __forceinline__ float exp2_approx(float x) {
#ifdef FSDP_CUDA_SIM
  return exp2f(x);
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#endif
}

/* Two floats as a bf16 pair (lo in the low half), rounded to nearest even as
 * fsdp_bf16_bits rounds (one cvt on the GPU; NaN payloads may differ). */
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
#ifdef FSDP_CUDA_SIM
  return (uint32_t)fsdp_bf16_bits(lo) | (uint32_t)fsdp_bf16_bits(hi) << 16;
#else
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#endif
}

#undef FSDP_PTX_SITE

#endif
