/* tests/cudasim/include/mma.h — the simulator's WMMA (nvcuda::wmma): the
 * portable tensor-core API for the one shape the kernels use, m16n16k16 with
 * bf16 operands (__nv_bfloat16) and fp32 accumulators, row_major and
 * col_major operands, mem_row_major and mem_col_major accumulators.
 *
 * The model. CUDA leaves the mapping of a tile's elements onto the lanes'
 * fragments unspecified; here each lane holds 8 of the 256, as on a GPU:
 * element e of lane l is the tile's (row, column) = divmod(32 e + l, 16) in
 * the matrix's own orientation (A: M x K, B: K x N, C: M x N), whatever the
 * memory layout it was loaded from. So a kernel that touches fragments only
 * through the API, or element-wise alike for fragments of one type (x[i] of
 * two accumulators is the same (row, column)), computes the right thing; one
 * that assumes the hardware's mapping does not.
 *
 * Every call is warp-collective, as CUDA documents: it first waits until all
 * 32 lanes of the warp have arrived (a __syncwarp: a lane that never comes,
 * or a partial warp, is reported as the simulator reports a shuffle's). Then
 * - load_matrix_sync: each lane reads its own 8 elements;
 * - store_matrix_sync: each lane writes its own 8 elements, and nothing more:
 *   a lane that reads what another lane stored needs a __syncwarp (or
 *   __syncthreads) in between, as on a GPU, or it reads stale memory;
 * - mma_sync: each lane publishes where its A and B fragments lie (a per-warp
 *   table on the stream's worker thread, where the block's fibers run), the
 *   warp syncs, each lane computes its 8 elements of D = A B + C from every
 *   lane's fragments (fp32, fmaf in k order: a GPU's tensor cores may round
 *   the sum differently, to fp32 rounding), the warp syncs again (no lane
 *   overwrites a fragment another still reads), and then D is written.
 * Checked as a GPU requires, with a fault naming the call: the pointer 256-bit
 * (32-byte) aligned, ldm a multiple of 8 elements for bf16 and 4 for float.
 *
 * Not modelled: other shapes and types (refused at compile time), fragments
 * with a layout given at load time (Layout = void for A and B), satf. */
#ifndef FSDP_CUDASIM_MMA_H
#define FSDP_CUDASIM_MMA_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <stdint.h>
#include <string.h>

#include <type_traits>

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
class fragment {
  static_assert(M == 16 && N == 16 && K == 16, "cudasim: WMMA is modelled for m16n16k16 only");
  static_assert(std::is_same<Use, accumulator>::value
                    ? std::is_same<T, float>::value && std::is_void<Layout>::value
                    : std::is_same<T, __nv_bfloat16>::value &&
                          (std::is_same<Layout, row_major>::value ||
                           std::is_same<Layout, col_major>::value),
                "cudasim: WMMA is modelled for row_major/col_major __nv_bfloat16 A and B "
                "fragments and float accumulators only");

public:
  enum { num_elements = 8 };
  T x[num_elements];
};

} // namespace wmma
} // namespace nvcuda

namespace fsdp_sim {
namespace wmma_model {

const int kLaneElems = 8;

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

/* Element e of this lane: its row and column in the 16 x 16 tile. */
inline void element(int e, unsigned l, int *r, int *c) {
  const int i = 32 * e + (int)l;
  *r = i / 16, *c = i % 16;
}

inline void arrive(const char *what, const char *file, int line) {
  (void)what;
  __syncwarp(0xffffffffu, file, line);
}

inline void check(const void *p, unsigned ldm, unsigned ldm_multiple, const char *what,
                  const char *file, int line) {
  if (reinterpret_cast<uintptr_t>(p) % 32)
    fault(cudaErrorMisalignedAddress, file, line,
          "%s at %p: the pointer must be 256-bit (32-byte) aligned", what, p);
  if (ldm % ldm_multiple)
    fault(cudaErrorMisalignedAddress, file, line,
          "%s with ldm %u: must be a multiple of %u elements", what, ldm, ldm_multiple);
}

inline float value(__nv_bfloat16 b) {
  const uint32_t u = (uint32_t)b.__x << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Offset of tile element (r, c) in memory of leading dimension ldm. */
inline size_t offset(int r, int c, unsigned ldm, bool row_major) {
  return row_major ? (size_t)r * ldm + c : (size_t)c * ldm + r;
}

/* Where each lane of a warp keeps its A and B fragments during an mma_sync:
 * [warp][lane]. Per stream worker thread, where a block's fibers run. */
struct mma_slot {
  const __nv_bfloat16 *a, *b;
};
inline thread_local mma_slot slots[32][32];

} // namespace wmma_model
} // namespace fsdp_sim

namespace nvcuda {
namespace wmma {

template <typename Use, typename T, typename Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout> &f, const T &v) {
  for (int e = 0; e < f.num_elements; ++e) f.x[e] = v;
}

template <typename Use, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, Layout> &f,
                      const __nv_bfloat16 *p, unsigned ldm, const char *file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
  namespace m = ::fsdp_sim::wmma_model;
  m::arrive("load_matrix_sync", file, line);
  m::check(p, ldm, 8, "load_matrix_sync of a bf16 fragment", file, line);
  const unsigned l = m::lane();
  for (int e = 0; e < m::kLaneElems; ++e) {
    int r, c;
    m::element(e, l, &r, &c);
    f.x[e] = p[m::offset(r, c, ldm, std::is_same<Layout, row_major>::value)];
  }
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                             unsigned ldm, layout_t layout, const char *file = __builtin_FILE(),
                             int line = __builtin_LINE()) {
  namespace m = ::fsdp_sim::wmma_model;
  m::arrive("load_matrix_sync", file, line);
  m::check(p, ldm, 4, "load_matrix_sync of an accumulator", file, line);
  const unsigned l = m::lane();
  for (int e = 0; e < m::kLaneElems; ++e) {
    int r, c;
    m::element(e, l, &r, &c);
    f.x[e] = p[m::offset(r, c, ldm, layout == mem_row_major)];
  }
}

inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                              unsigned ldm, layout_t layout, const char *file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  namespace m = ::fsdp_sim::wmma_model;
  m::arrive("store_matrix_sync", file, line);
  m::check(p, ldm, 4, "store_matrix_sync", file, line);
  const unsigned l = m::lane();
  for (int e = 0; e < m::kLaneElems; ++e) {
    int r, c;
    m::element(e, l, &r, &c);
    p[m::offset(r, c, ldm, layout == mem_row_major)] = f.x[e];
  }
}

template <typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
              const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
              const fragment<accumulator, 16, 16, 16, float> &c, bool satf = false,
              const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  namespace m = ::fsdp_sim::wmma_model;
  (void)satf;
  const unsigned l = m::lane(), w = m::warp();
  m::slots[w][l] = m::mma_slot{a.x, b.x};
  m::arrive("mma_sync", file, line);
  float out[m::kLaneElems];
  for (int e = 0; e < m::kLaneElems; ++e) {
    int r, n;
    m::element(e, l, &r, &n);
    float acc = c.x[e];
    for (int k = 0; k < 16; ++k) {
      /* A (r, k) and B (k, n): element (i / 32) of lane (i % 32), i = 16 row + col */
      const int ia = 16 * r + k, ib = 16 * k + n;
      acc = fmaf(m::value(m::slots[w][ia % 32].a[ia / 32]),
                 m::value(m::slots[w][ib % 32].b[ib / 32]), acc);
    }
    out[e] = acc;
  }
  m::arrive("mma_sync", file, line);
  for (int e = 0; e < m::kLaneElems; ++e) d.x[e] = out[e];
}

} // namespace wmma
} // namespace nvcuda

#endif
