/* tests/cudasim/include/cuda_bf16.h — the simulator's bf16 type: only its
 * storage, which is what the kernels hand to the WMMA API (mma.h) through
 * pointers. Like the toolkit's __nv_bfloat16 it is 2 bytes, 2-aligned; the
 * kernels do their bf16 arithmetic through src/backend/cuda/cuda_internal.cuh's own
 * bit-exact conversions, never through this type, so none is defined here. */
#ifndef FSDP_CUDASIM_CUDA_BF16_H
#define FSDP_CUDASIM_CUDA_BF16_H

struct __nv_bfloat16 {
  unsigned short __x; /* the bit pattern: the high half of an fp32 */
};

#endif
