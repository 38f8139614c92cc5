/* tests/cudasim/include/cudasim_ptx.h — the simulator's model of the PTX
 * instructions that src/backend/cuda/mma.cuh wraps in inline assembly under
 * nvcc: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32,
 * ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 and cp.async (16 or 4
 * bytes, zero fill), each with the fragment layout the PTX ISA documents ("Matrix
 * Fragments for mma.m16n8k16 with floating point type", "ldmatrix"), so that
 * a kernel that relies on that layout (a row's scores in known registers,
 * the accumulator of one product reused as the A operand of the next)
 * computes here what it computes on a GPU.
 *
 * The layouts (lane l, groupID g = l / 4, t = l % 4; a .b32 register holds two
 * bf16, the lower-indexed element in its low 16 bits):
 * - A (16 x 16, row): a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g,
 *   2t+8..), a[3] = (g+8, 2t+8..);
 * - B (16 x 8, col): b[0] = (k 2t..2t+1, n g), b[1] = (k 2t+8.., n g);
 * - C and D (16 x 8, fp32): c[0..1] = (g, 2t..2t+1), c[2..3] = (g+8, 2t..).
 * - ldmatrix x4: lanes 8i..8i+7 give the row addresses (16 bytes each, 16-byte
 *   aligned) of 8 x 8 matrix i; register i of lane l gets row g, columns 2t and
 *   2t+1 of matrix i, or with .trans rows 2t and 2t+1 of column g.
 *
 * Warp-collective as the hardware is (.sync.aligned): each call first waits
 * for all 32 lanes (a __syncwarp: a lane that never comes is reported, as for
 * a shuffle), each lane publishes where its operands lie (a per-warp table on
 * the stream's worker thread, where the block's fibers run), computes its own
 * result from every lane's operands, and the warp syncs again before any lane
 * writes its result. The product: the exact bf16 products summed in double
 * and rounded once to fp32 (tensor cores round the sum their own way, to
 * fp32 rounding). Faults, as a GPU raises them:
 * an ldmatrix row address or a cp.async address not 16-byte aligned (4 for
 * a 4-byte copy).
 *
 * cp.async is modelled as a synchronous copy (zeros when the source
 * size is 0): what a kernel reads after cp.async.wait_group and a barrier is
 * what a GPU gives it; a kernel that reads before waiting is not caught here
 * (fibers switch only at sync points). commit_group and wait_group are no-ops. */
#ifndef FSDP_CUDASIM_PTX_H
#define FSDP_CUDASIM_PTX_H

#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

namespace fsdp_sim {
namespace ptx {

inline unsigned lane() {
  const uint3 &t = thread_idx();
  const dim3 &d = block_dim();
  return (t.x + d.x * (t.y + d.y * t.z)) & 31u;
}
inline unsigned warp() {
  const uint3 &t = thread_idx();
  const dim3 &d = block_dim();
  return (t.x + d.x * (t.y + d.y * t.z)) >> 5;
}

inline float bf16_value(uint16_t bits) {
  const uint32_t u = (uint32_t)bits << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
/* Element `half` (0: low, 1: high) of a packed pair. */
inline uint16_t half_of(uint32_t r, int half) { return (uint16_t)(half ? r >> 16 : r & 0xffffu); }

/* Where each lane of a warp keeps its operands during a call: [warp][lane]. */
struct slot {
  const uint32_t *a, *b;
  const uint16_t *row;
};
inline thread_local slot slots[32][32];

/* A (row, k) and B (k, n) of the product, read from the lane that holds it
 * (ws: the warp's slots, looked up once per call: a thread_local is a
 * function call away in a shared object). */
inline float a_elem(const slot *ws, int row, int k) {
  const int reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
  return bf16_value(half_of(ws[(row & 7) * 4 + (k & 7) / 2].a[reg], k & 1));
}
inline float b_elem(const slot *ws, int k, int n) {
  return bf16_value(half_of(ws[n * 4 + (k & 7) / 2].b[k >= 8 ? 1 : 0], k & 1));
}

/* d = A (16 x 16) B (16 x 8) + c, this lane's fragments. */
inline void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2],
                              const float c[4], const char *file, int line) {
  const unsigned l = lane();
  slot *ws = slots[warp()];
  ws[l].a = a, ws[l].b = b;
  __syncwarp(0xffffffffu, file, line);
  /* this lane's rows g, g + 8 of A and columns 2t, 2t + 1 of B */
  const int g = (int)(l / 4), t = (int)(l % 4);
  float ar[2][16], bc[2][16], out[4];
  for (int k = 0; k < 16; ++k) {
    ar[0][k] = a_elem(ws, g, k), ar[1][k] = a_elem(ws, g + 8, k);
    bc[0][k] = b_elem(ws, k, 2 * t), bc[1][k] = b_elem(ws, k, 2 * t + 1);
  }
  for (int i = 0; i < 4; ++i) {
    double acc = c[i]; /* bf16 products are exact in double */
    for (int k = 0; k < 16; ++k) acc += (double)ar[i >> 1][k] * bc[i & 1][k];
    out[i] = (float)acc;
  }
  __syncwarp(0xffffffffu, file, line);
  for (int i = 0; i < 4; ++i) d[i] = out[i];
}

/* ldmatrix .m8n8 .x4 (.trans when trans) from this lane's row address. */
inline void ldmatrix_x4(uint32_t r[4], const void *row, bool trans, const char *file, int line) {
  if (reinterpret_cast<uintptr_t>(row) % 16)
    fault(cudaErrorMisalignedAddress, file, line,
          "ldmatrix row address %p: must be 16-byte aligned", row);
  const unsigned l = lane();
  slot *ws = slots[warp()];
  ws[l].row = static_cast<const uint16_t *>(row);
  __syncwarp(0xffffffffu, file, line);
  uint32_t out[4];
  const unsigned g = l / 4, t = l % 4;
  for (int i = 0; i < 4; ++i) {
    uint16_t lo, hi;
    if (trans) { /* rows 2t, 2t+1 of the stored matrix, column g */
      lo = ws[8 * i + 2 * t].row[g];
      hi = ws[8 * i + 2 * t + 1].row[g];
    } else { /* row g, columns 2t, 2t+1 */
      lo = ws[8 * i + g].row[2 * t];
      hi = ws[8 * i + g].row[2 * t + 1];
    }
    out[i] = (uint32_t)lo | (uint32_t)hi << 16;
  }
  __syncwarp(0xffffffffu, file, line);
  for (int i = 0; i < 4; ++i) r[i] = out[i];
}

/* cp.async of 16 bytes, src_bytes 16 or 0 (then dst is zero-filled). */
inline void cp_async16(void *dst, const void *src, int src_bytes, const char *file, int line) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 || (src_bytes && reinterpret_cast<uintptr_t>(src) % 16))
    fault(cudaErrorMisalignedAddress, file, line,
          "cp.async of 16 bytes from %p to %p: both must be 16-byte aligned", src, dst);
  if (src_bytes)
    memcpy(dst, src, 16);
  else
    memset(dst, 0, 16);
}

/* cp.async of 4 bytes (.ca), src_bytes 4 or 0. */
inline void cp_async4(void *dst, const void *src, int src_bytes, const char *file, int line) {
  if (reinterpret_cast<uintptr_t>(dst) % 4 || (src_bytes && reinterpret_cast<uintptr_t>(src) % 4))
    fault(cudaErrorMisalignedAddress, file, line,
          "cp.async of 4 bytes from %p to %p: both must be 4-byte aligned", src, dst);
  if (src_bytes)
    memcpy(dst, src, 4);
  else
    memset(dst, 0, 4);
}

} // namespace ptx
} // namespace fsdp_sim

#endif
