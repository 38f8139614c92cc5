/* src/backend/cuda/flash.cu — fused causal flash attention in bf16 on tensor cores
 * (the portable WMMA API, m16n16k16 bf16 with fp32 accumulators, sm_80 up),
 * forward and backward, keeping only the (B,NH,T) fp32 log-sum-exp.
 *
 * Tiling: a block takes one (batch row, head) and an outer tile of `rows`
 * (64, or 32 for hs > 64) queries (forward, dq) or keys (dk/dv); each of its
 * warps owns 16 of those rows outright, so rows never cross warps and a
 * warp's softmax needs only __syncwarp. The inner loop walks 32-wide tiles of
 * the other side (keys, or queries for dk/dv) through shared memory. Causal:
 * a block visits only the tiles that reach its diagonal, and a warp skips
 * every tile lying wholly past its own rows' diagonal; the mask is applied
 * element by element only where a tile straddles it.
 *
 * Row ownership without a fragment layout: WMMA leaves the mapping of a
 * tile's elements to lanes unspecified, so the forward softmax, which needs
 * row maxima and sums, stages the warp's 16 x 32 scores through shared memory
 * in fp32 (two lanes per row) and writes the probabilities back as bf16, the
 * next product's operand. Per-element work that needs an element's row or
 * column (the running output's rescale, the mask, exp(s - lse) and dS in
 * backward) runs on the accumulators directly: a fragment loaded from a 16 x
 * 16 table of row (column) indices gives, element for element, the row
 * (column) of every accumulator of the same type.
 *
 * Backward is two kernels, so that each output row has one writer and
 * nothing is atomic (deterministic, no fp32 scratch): dk/dv over key tiles
 * (S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q) and dq over query
 * tiles (S, dP again, dQ += dS K). D = rowsum(dO * O) is recomputed from the
 * forward's output where needed. Scores are recomputed as p = exp(s - lse). */
#include <cuda_bf16.h>
#include <mma.h>

#include "backend/cuda/cuda_internal.cuh"

using namespace nvcuda;

namespace {

const int kInner = 32; /* the inner tile: keys (forward, dq) or queries (dk/dv) */
const int kFrag = 16;

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> frag_a;
/* B = X^T for a row-major X tile: X's rows are B's columns */
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> frag_bt;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> frag_b;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

template <int HS> struct geom {
  static constexpr int rows = HS <= 64 ? 64 : 32; /* the outer tile: fits 48 KiB up to HS 128 */
  static constexpr int warps = rows / kFrag;
  static constexpr int threads = warps * 32;
  static constexpr int dfrags = HS / kFrag;
};

/* What every kernel reads in the same way: the (b, h) slices of qkv and the
 * tables of row and column indices. */
struct alignas(32) index_tables {
  float row[kFrag][kFrag]; /* row[r][c] = r */
  float col[kFrag][kFrag]; /* col[r][c] = c */
};

struct heads {
  int T, C, NH, b, h;
  __device__ size_t row(int t, int ld) const { return ((size_t)b * T + t) * ld; }
  __device__ size_t stat(int t) const { return ((size_t)b * NH + h) * T + t; }
};

__device__ const __nv_bfloat16 *wm(const bf16 *p) {
  return reinterpret_cast<const __nv_bfloat16 *>(p);
}

__device__ void fill_tables(index_tables *t) {
  for (int i = threadIdx.x; i < kFrag * kFrag; i += blockDim.x) {
    t->row[i / kFrag][i % kFrag] = (float)(i / kFrag);
    t->col[i / kFrag][i % kFrag] = (float)(i % kFrag);
  }
}

/* Rows [r0, r0 + n) of a bf16 matrix with leading dimension ld (src points at
 * row 0's column of this head) into tile (n, HS), 16 bytes at a time; rows at
 * or past T are zeros (a masked key's value must be finite: 0 * NaN is NaN). */
union alignas(16) pack8 { /* 8 bf16 moved as one 16-byte access */
  uint4 u;
  bf16 h[8];
};

template <int HS>
__device__ void load_tile(bf16 (*tile)[HS], const bf16 *src, size_t ld, int r0, int n, int T) {
  const int per_row = HS / 8;
  for (int i = threadIdx.x; i < n * per_row; i += blockDim.x) {
    const int r = i / per_row, c = (i % per_row) * 8;
    pack8 v;
    v.u = uint4{0u, 0u, 0u, 0u};
    if (r0 + r < T) v = *reinterpret_cast<const pack8 *>(src + (size_t)(r0 + r) * ld + c);
    *reinterpret_cast<pack8 *>(&tile[r][c]) = v;
  }
}

/* acc (16 x 16 of A's rows by B's rows) = A (16 x HS) @ B^T, both row-major in shared memory. */
template <int HS>
__device__ void product_nt(frag_c &acc, const bf16 *a, const bf16 *b) {
  wmma::fill_fragment(acc, 0.0f);
  for (int k = 0; k < HS / kFrag; ++k) {
    frag_a fa;
    frag_bt fb;
    wmma::load_matrix_sync(fa, wm(a + k * kFrag), HS);
    wmma::load_matrix_sync(fb, wm(b + k * kFrag), HS);
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

/* acc[d] += P (16 x kInner, bf16, ld kInner) @ X (kInner x HS, row-major), for every d. */
template <int HS>
__device__ void product_pv(frag_c (&acc)[geom<HS>::dfrags], const bf16 *p, bf16 (*x)[HS]) {
  for (int j = 0; j < kInner / kFrag; ++j) {
    frag_a fa;
    wmma::load_matrix_sync(fa, wm(p + j * kFrag), kInner);
    for (int d = 0; d < geom<HS>::dfrags; ++d) {
      frag_b fb;
      wmma::load_matrix_sync(fb, wm(&x[j * kFrag][d * kFrag]), HS);
      wmma::mma_sync(acc[d], fa, fb, acc[d]);
    }
  }
}

/* The warp's fp32 16 x kInner staging area back to bf16 (lanes in step). */
__device__ void to_bf16(bf16 *dst, const float *src) {
  const int lane = threadIdx.x & 31;
  __syncwarp();
  for (int i = lane; i < kFrag * kInner; i += 32) store(dst + i, src[i]);
  __syncwarp();
}

/* acc[d] (16 x HS) times per-row factors, then += or = into rows [row0, row0
 * + 16) of a bf16 matrix (ld, this head's column), rows at or past T left
 * alone; staged kInner columns at a time through the warp's fp32 area. */
template <int HS>
__device__ void write_rows(bf16 *dst, size_t ld, int row0, int T, frag_c (&acc)[geom<HS>::dfrags],
                           float *stage, bool add) {
  const int lane = threadIdx.x & 31;
  for (int d0 = 0; d0 < HS; d0 += kInner) {
    for (int d = d0; d < d0 + kInner && d < HS; d += kFrag)
      wmma::store_matrix_sync(stage + (d - d0), acc[d / kFrag], kInner, wmma::mem_row_major);
    __syncwarp();
    const int width = HS - d0 < kInner ? HS - d0 : kInner;
    for (int i = lane; i < kFrag * width; i += 32) {
      const int r = i / width, c = i % width;
      if (row0 + r >= T) continue;
      bf16 *o = dst + (size_t)(row0 + r) * ld + d0 + c;
      const float v = stage[r * kInner + c];
      store(o, add ? load(o) + v : v);
    }
    __syncwarp();
  }
}

/* D[i] = sum_d dO[i][d] O[i][d] for n rows from r0 (dout tile in shared,
 * O from global), 0 past T; one warp per row. */
template <int HS>
__device__ void rowdot(float *D, bf16 (*dout)[HS], const bf16 *o, size_t ld, int r0, int n, int T) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int r = warp; r < n; r += nwarps) {
    float s = 0.0f;
    if (r0 + r < T)
      for (int d = lane; d < HS; d += 32) s += load(&dout[r][d]) * load(o + (size_t)(r0 + r) * ld + d);
    s = warp_sum(s);
    if (lane == 0) D[r] = s;
  }
}

/* ---- forward ---- */

template <int HS> struct alignas(32) fwd_smem {
  bf16 q[geom<HS>::rows][HS];
  bf16 k[kInner][HS];
  bf16 v[kInner][HS];
  float s[geom<HS>::warps][kFrag][kInner]; /* scores, then the output's staging */
  bf16 p[geom<HS>::warps][kFrag][kInner];
  float factor[geom<HS>::warps][kFrag]; /* per row: the rescale, then 1 / sum */
  index_tables ids;
};

/* The online softmax of the warp's staged 16 x kInner scores (keys from k0)
 * for rows from row0: running max m and sum l per row (two lanes per row, each
 * 16 columns, both holding m and l), probabilities to p as bf16, and each
 * row's rescale of the running output to factor. */
__device__ void online_softmax(float *m, float *l, const float (*s)[kInner], bf16 (*p)[kInner],
                               float *factor, int row0, int k0, int T, float scale) {
  const int lane = threadIdx.x & 31, r = lane >> 1, c0 = (lane & 1) * (kInner / 2);
  const int i = row0 + r, last = i < T ? i : T - 1; /* a row past T attends like row T-1 */
  float x[kInner / 2], mx = -INFINITY;
  for (int c = 0; c < kInner / 2; ++c) {
    x[c] = k0 + c0 + c <= last ? s[r][c0 + c] * scale : -INFINITY;
    mx = fmaxf(mx, x[c]);
  }
  const float m_new = fmaxf(*m, fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1)));
  float sum = 0.0f;
  for (int c = 0; c < kInner / 2; ++c) {
    store(&p[r][c0 + c], expf(x[c] - m_new));
    sum += load(&p[r][c0 + c]); /* the weights the product applies */
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  const float alpha = expf(*m - m_new); /* 0 on the first tile: m was -inf */
  *l = *l * alpha + sum;
  *m = m_new;
  if (c0 == 0) factor[r] = alpha;
}

template <int HS>
__global__ void __launch_bounds__(geom<HS>::threads)
    flash_forward_kernel(bf16 *out, float *lse, const bf16 *qkv, int T, int C, int NH,
                         float scale) {
  typedef geom<HS> G;
  typedef fwd_smem<HS> smem_t;
  FSDP_SHARED(smem_t, sm_, [1]);
  smem_t &sm = sm_[0];
  const heads hd = {T, C, NH, (int)blockIdx.z, (int)blockIdx.y};
  const int q0 = (int)(gridDim.x - 1 - blockIdx.x) * G::rows; /* longest rows first */
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, row0 = q0 + w * kFrag;
  const size_t ld = 3 * (size_t)C;
  const bf16 *base = qkv + hd.row(0, (int)ld) + (size_t)hd.h * HS;
  load_tile<HS>(sm.q, base, ld, q0, G::rows, T);
  fill_tables(&sm.ids);
  __syncthreads();
  frag_c o[G::dfrags], rows;
  for (int d = 0; d < G::dfrags; ++d) wmma::fill_fragment(o[d], 0.0f);
  wmma::load_matrix_sync(rows, &sm.ids.row[0][0], kFrag, wmma::mem_row_major);
  float m = -INFINITY, l = 0.0f;
  const int keys = T < q0 + G::rows ? T : q0 + G::rows;
  for (int k0 = 0; k0 < keys; k0 += kInner) {
    __syncthreads(); /* every warp is done with the previous k and v */
    load_tile<HS>(sm.k, base + C, ld, k0, kInner, T);
    load_tile<HS>(sm.v, base + 2 * (size_t)C, ld, k0, kInner, T);
    __syncthreads();
    if (row0 >= T || k0 > row0 + kFrag - 1) continue; /* wholly masked for this warp */
    for (int n = 0; n < kInner / kFrag; ++n) {
      frag_c s;
      product_nt<HS>(s, &sm.q[w * kFrag][0], &sm.k[n * kFrag][0]);
      wmma::store_matrix_sync(&sm.s[w][0][n * kFrag], s, kInner, wmma::mem_row_major);
    }
    __syncwarp();
    online_softmax(&m, &l, sm.s[w], sm.p[w], sm.factor[w], row0, k0, T, scale);
    __syncwarp();
    for (int d = 0; d < G::dfrags; ++d)
      for (int e = 0; e < o[d].num_elements; ++e) o[d].x[e] *= sm.factor[w][(int)rows.x[e]];
    product_pv<HS>(o, &sm.p[w][0][0], sm.v);
  }
  if (row0 >= T) return;
  const int r = lane >> 1;
  if ((lane & 1) == 0) {
    sm.factor[w][r] = 1.0f / l;
    if (row0 + r < T) lse[hd.stat(row0 + r)] = m + logf(l);
  }
  __syncwarp();
  for (int d = 0; d < G::dfrags; ++d)
    for (int e = 0; e < o[d].num_elements; ++e) o[d].x[e] *= sm.factor[w][(int)rows.x[e]];
  write_rows<HS>(out + hd.row(0, C) + (size_t)hd.h * HS, C, row0, T, o, &sm.s[w][0][0], false);
}

/* ---- backward ---- */

/* Element-wise on the recomputed scores s and dp of one 16 x 16 tile: p =
 * exp(scale s - lse) where the key does not come after the query, else 0; dS
 * = scale p (dp - D). The statistics are indexed by query, which is the
 * tile's row (dq: rows are queries) or its column (dk/dv: rows are keys). */
__device__ void softmax_grad(frag_c &s, frag_c &dp, const frag_c &rows, const frag_c &cols,
                             int row0, int col0, bool rows_are_queries, const float *lse,
                             const float *D, int stat0, int T, float scale) {
  for (int e = 0; e < s.num_elements; ++e) {
    const int r = (int)rows.x[e], c = (int)cols.x[e];
    const int qi = rows_are_queries ? row0 + r : col0 + c, ki = rows_are_queries ? col0 + c : row0 + r;
    const int si = (rows_are_queries ? row0 + r : col0 + c) - stat0;
    const float p = ki <= qi && qi < T ? expf(s.x[e] * scale - lse[si]) : 0.0f;
    s.x[e] = p;
    dp.x[e] = scale * p * (dp.x[e] - D[si]);
  }
}

template <int HS> struct alignas(32) dq_smem {
  bf16 q[geom<HS>::rows][HS];
  bf16 dout[geom<HS>::rows][HS];
  bf16 k[kInner][HS];
  bf16 v[kInner][HS];
  float s[geom<HS>::warps][kFrag][kInner]; /* dS, then the output's staging */
  bf16 ds[geom<HS>::warps][kFrag][kInner];
  float lse[geom<HS>::rows];
  float D[geom<HS>::rows];
  index_tables ids;
};

template <int HS>
__global__ void __launch_bounds__(geom<HS>::threads)
    flash_backward_dq_kernel(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const bf16 *out,
                             const float *lse, int T, int C, int NH, float scale) {
  typedef geom<HS> G;
  typedef dq_smem<HS> smem_t;
  FSDP_SHARED(smem_t, sm_, [1]);
  smem_t &sm = sm_[0];
  const heads hd = {T, C, NH, (int)blockIdx.z, (int)blockIdx.y};
  const int q0 = (int)(gridDim.x - 1 - blockIdx.x) * G::rows;
  const int w = threadIdx.x >> 5, row0 = q0 + w * kFrag;
  const size_t ld = 3 * (size_t)C, col = (size_t)hd.h * HS;
  const bf16 *base = qkv + hd.row(0, (int)ld) + col;
  load_tile<HS>(sm.q, base, ld, q0, G::rows, T);
  load_tile<HS>(sm.dout, dout + hd.row(0, C) + col, C, q0, G::rows, T);
  fill_tables(&sm.ids);
  for (int i = threadIdx.x; i < G::rows; i += blockDim.x)
    sm.lse[i] = q0 + i < T ? lse[hd.stat(q0 + i)] : 0.0f;
  __syncthreads();
  rowdot<HS>(sm.D, sm.dout, out + hd.row(0, C) + col, C, q0, G::rows, T);
  __syncthreads();
  frag_c dq[G::dfrags], rows, cols;
  for (int d = 0; d < G::dfrags; ++d) wmma::fill_fragment(dq[d], 0.0f);
  wmma::load_matrix_sync(rows, &sm.ids.row[0][0], kFrag, wmma::mem_row_major);
  wmma::load_matrix_sync(cols, &sm.ids.col[0][0], kFrag, wmma::mem_row_major);
  const int keys = T < q0 + G::rows ? T : q0 + G::rows;
  for (int k0 = 0; k0 < keys; k0 += kInner) {
    __syncthreads();
    load_tile<HS>(sm.k, base + C, ld, k0, kInner, T);
    load_tile<HS>(sm.v, base + 2 * (size_t)C, ld, k0, kInner, T);
    __syncthreads();
    if (row0 >= T || k0 > row0 + kFrag - 1) continue;
    for (int n = 0; n < kInner / kFrag; ++n) {
      frag_c s, dp;
      product_nt<HS>(s, &sm.q[w * kFrag][0], &sm.k[n * kFrag][0]);
      product_nt<HS>(dp, &sm.dout[w * kFrag][0], &sm.v[n * kFrag][0]);
      softmax_grad(s, dp, rows, cols, row0, k0 + n * kFrag, true, sm.lse, sm.D, q0, T, scale);
      wmma::store_matrix_sync(&sm.s[w][0][n * kFrag], dp, kInner, wmma::mem_row_major);
    }
    to_bf16(&sm.ds[w][0][0], &sm.s[w][0][0]);
    product_pv<HS>(dq, &sm.ds[w][0][0], sm.k);
  }
  if (row0 >= T) return;
  write_rows<HS>(dqkv + hd.row(0, (int)ld) + col, ld, row0, T, dq, &sm.s[w][0][0], true);
}

template <int HS> struct alignas(32) dkdv_smem {
  bf16 k[geom<HS>::rows][HS];
  bf16 v[geom<HS>::rows][HS];
  bf16 q[kInner][HS];
  bf16 dout[kInner][HS];
  float s[geom<HS>::warps][kFrag][kInner]; /* P^T and dS^T staging, then the outputs' */
  bf16 pt[geom<HS>::warps][kFrag][kInner];
  bf16 dst[geom<HS>::warps][kFrag][kInner];
  float lse[kInner];
  float D[kInner];
  index_tables ids;
};

template <int HS>
__global__ void __launch_bounds__(geom<HS>::threads)
    flash_backward_dkdv_kernel(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const bf16 *out,
                               const float *lse, int T, int C, int NH, float scale) {
  typedef geom<HS> G;
  typedef dkdv_smem<HS> smem_t;
  FSDP_SHARED(smem_t, sm_, [1]);
  smem_t &sm = sm_[0];
  const heads hd = {T, C, NH, (int)blockIdx.z, (int)blockIdx.y};
  const int k0 = (int)blockIdx.x * G::rows; /* the longest columns come first */
  const int w = threadIdx.x >> 5, key0 = k0 + w * kFrag;
  const size_t ld = 3 * (size_t)C, col = (size_t)hd.h * HS;
  const bf16 *base = qkv + hd.row(0, (int)ld) + col, *dy = dout + hd.row(0, C) + col;
  load_tile<HS>(sm.k, base + C, ld, k0, G::rows, T);
  load_tile<HS>(sm.v, base + 2 * (size_t)C, ld, k0, G::rows, T);
  fill_tables(&sm.ids);
  __syncthreads();
  frag_c dk[G::dfrags], dv[G::dfrags], rows, cols;
  for (int d = 0; d < G::dfrags; ++d) wmma::fill_fragment(dk[d], 0.0f), wmma::fill_fragment(dv[d], 0.0f);
  wmma::load_matrix_sync(rows, &sm.ids.row[0][0], kFrag, wmma::mem_row_major);
  wmma::load_matrix_sync(cols, &sm.ids.col[0][0], kFrag, wmma::mem_row_major);
  for (int i0 = k0 / kInner * kInner; i0 < T; i0 += kInner) {
    __syncthreads();
    load_tile<HS>(sm.q, base, ld, i0, kInner, T);
    load_tile<HS>(sm.dout, dy, C, i0, kInner, T);
    for (int i = threadIdx.x; i < kInner; i += blockDim.x)
      sm.lse[i] = i0 + i < T ? lse[hd.stat(i0 + i)] : 0.0f;
    __syncthreads();
    rowdot<HS>(sm.D, sm.dout, out + hd.row(0, C) + col, C, i0, kInner, T);
    __syncthreads();
    if (key0 >= T || i0 + kInner - 1 < key0) continue; /* every query before the warp's keys */
    frag_c s[kInner / kFrag], dp[kInner / kFrag];
    for (int n = 0; n < kInner / kFrag; ++n) {
      product_nt<HS>(s[n], &sm.k[w * kFrag][0], &sm.q[n * kFrag][0]);
      product_nt<HS>(dp[n], &sm.v[w * kFrag][0], &sm.dout[n * kFrag][0]);
      softmax_grad(s[n], dp[n], rows, cols, key0, i0 + n * kFrag, false, sm.lse, sm.D, i0, T,
                   scale);
      wmma::store_matrix_sync(&sm.s[w][0][n * kFrag], s[n], kInner, wmma::mem_row_major);
    }
    to_bf16(&sm.pt[w][0][0], &sm.s[w][0][0]);
    for (int n = 0; n < kInner / kFrag; ++n)
      wmma::store_matrix_sync(&sm.s[w][0][n * kFrag], dp[n], kInner, wmma::mem_row_major);
    to_bf16(&sm.dst[w][0][0], &sm.s[w][0][0]);
    product_pv<HS>(dv, &sm.pt[w][0][0], sm.dout);
    product_pv<HS>(dk, &sm.dst[w][0][0], sm.q);
  }
  if (key0 >= T) return;
  bf16 *dbase = dqkv + hd.row(0, (int)ld) + col;
  write_rows<HS>(dbase + C, ld, key0, T, dk, &sm.s[w][0][0], true);
  write_rows<HS>(dbase + 2 * (size_t)C, ld, key0, T, dv, &sm.s[w][0][0], true);
}

/* ---- launches ---- */

struct flash_args {
  int B, T, C, NH, hs;
  float scale;
};

fsdp_status_t check_args(const flash_args &a, const void *const *ptrs, const char *const *names,
                         int n) {
  if (a.C % a.NH != 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "flash attention: C %d is not a multiple of the %d heads", a.C, a.NH);
  if (a.hs % kFrag != 0 || a.hs > 128)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "flash attention: head size %d (C %d / NH %d) is not supported: the "
                      "kernel needs a multiple of 16 up to 128",
                      a.hs, a.C, a.NH);
  if (a.B > 65535 || a.NH > 65535)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "flash attention: B %d or NH %d is past the grid's 65535", a.B, a.NH);
  for (int i = 0; i < n; ++i)
    if ((uintptr_t)ptrs[i] % 16)
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                        "flash attention: %s at %p is not 16-byte aligned (tiles are loaded "
                        "16 bytes at a time)",
                        names[i], ptrs[i]);
  return FSDP_SUCCESS;
}

template <int HS>
fsdp_status_t forward(bf16 *out, float *lse, const bf16 *qkv, const flash_args &a,
                      cudaStream_t s) {
  const dim3 grid((unsigned)((a.T + geom<HS>::rows - 1) / geom<HS>::rows), (unsigned)a.NH,
                  (unsigned)a.B);
  FSDP_LAUNCH(flash_forward_kernel<HS>, grid, geom<HS>::threads, 0, s, out, lse, qkv, a.T, a.C,
              a.NH, a.scale);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

template <int HS>
fsdp_status_t backward(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const bf16 *out,
                       const float *lse, const flash_args &a, cudaStream_t s) {
  const dim3 grid((unsigned)((a.T + geom<HS>::rows - 1) / geom<HS>::rows), (unsigned)a.NH,
                  (unsigned)a.B);
  FSDP_LAUNCH(flash_backward_dkdv_kernel<HS>, grid, geom<HS>::threads, 0, s, dqkv, dout, qkv, out,
              lse, a.T, a.C, a.NH, a.scale);
  LAUNCH_CHECK();
  FSDP_LAUNCH(flash_backward_dq_kernel<HS>, grid, geom<HS>::threads, 0, s, dqkv, dout, qkv, out,
              lse, a.T, a.C, a.NH, a.scale);
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

/* One instantiation per supported head size. */
#define FLASH_HEAD_SIZES(X) X(16) X(32) X(48) X(64) X(80) X(96) X(112) X(128)

} // namespace

fsdp_status_t fsdp_cuda_flash_forward(bf16 *out, float *lse, const bf16 *qkv, int B, int T, int C,
                                      int NH, cudaStream_t stream) {
  if (B <= 0 || T <= 0 || C <= 0 || NH <= 0) return FSDP_SUCCESS;
  const flash_args a = {B, T, C, NH, C / NH, 1.0f / sqrtf((float)(C / NH))};
  const void *ptrs[] = {out, qkv};
  const char *names[] = {"out", "qkv"};
  FSDP_TRY(check_args(a, ptrs, names, 2));
  switch (a.hs) {
#define FLASH_FORWARD(hs) \
  case hs:                \
    return forward<hs>(out, lse, qkv, a, stream);
    FLASH_HEAD_SIZES(FLASH_FORWARD)
#undef FLASH_FORWARD
  }
  return fsdp_error(FSDP_ERR_INTERNAL, "flash attention: head size %d not dispatched", a.hs);
}

fsdp_status_t fsdp_cuda_flash_backward(bf16 *dqkv, const bf16 *dout, const bf16 *qkv,
                                       const bf16 *out, const float *lse, int B, int T, int C,
                                       int NH, cudaStream_t stream) {
  if (B <= 0 || T <= 0 || C <= 0 || NH <= 0) return FSDP_SUCCESS;
  const flash_args a = {B, T, C, NH, C / NH, 1.0f / sqrtf((float)(C / NH))};
  const void *ptrs[] = {dqkv, dout, qkv, out};
  const char *names[] = {"dqkv", "dout", "qkv", "out"};
  FSDP_TRY(check_args(a, ptrs, names, 4));
  switch (a.hs) {
#define FLASH_BACKWARD(hs) \
  case hs:                 \
    return backward<hs>(dqkv, dout, qkv, out, lse, a, stream);
    FLASH_HEAD_SIZES(FLASH_BACKWARD)
#undef FLASH_BACKWARD
  }
  return fsdp_error(FSDP_ERR_INTERNAL, "flash attention: head size %d not dispatched", a.hs);
}
