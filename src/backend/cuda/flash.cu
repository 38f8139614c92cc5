/* src/backend/cuda/flash.cu — fused causal flash attention in bf16, forward and
 * backward, FlashAttention-2's design (Dao 2023) on mma.sync m16n8k16 through
 * mma.cuh: multi-head or grouped-query (query head h reads KV head
 * h / (NH / NKV)), keeping only the (B,NH,T) fp32 log-sum-exp.
 *
 * Work split. A block of 4 warps takes one (batch row, head) and 64 rows of
 * the outer side (queries: forward, dq; keys: dk/dv); each warp owns 16 of
 * them outright, so a row never crosses warps. The outer rows' operands are
 * staged once through shared memory into registers (ldmatrix); the inner
 * side (keys and values, or queries and dout) streams through two shared
 * stages filled by cp.async, the next tile's copy in flight while the warps
 * compute on this one, with one barrier a step: the copy is issued after the
 * barrier that says every warp is done with the stage it overwrites. Scores
 * and probabilities never leave registers: the fp32 accumulators of
 * S = Q K^T are masked, exponentiated and packed to bf16 in place as the A
 * operand of the next product (the PTX layouts make an accumulator's two
 * neighbouring n8 tiles one A fragment). exp2 with log2(e) / sqrt(D) folded
 * into the scale; the online softmax keeps each row's running max and a
 * per-lane partial sum, reduced over the row's 4 lanes once at the end.
 * Causal: a block visits only the inner tiles that reach its diagonal, a warp
 * skips those wholly past its own rows, and the mask is applied element by
 * element only on tiles that straddle the diagonal or T.
 *
 * Backward (FA2's, parallel over key tiles): a pass D = rowsum(dO * O) into
 * scratch; dk/dv, a block per (batch row, KV head, 64 keys) looping over the
 * group's query heads and their query tiles, with P^T = exp2(scale2 K Q^T -
 * lse2) recomputed from the log-sum-exp (each tile's lse and D copied into
 * shared memory with it), dS^T = P^T (V dO^T - D), dV += P^T dO,
 * dK += dS^T Q, all four products register to register; and dq, a
 * block per (batch row, head, 64 queries), which recomputes S and dP (dQ +=
 * dS K). dq in its own pass rather than fp32 atomics from the dk/dv blocks
 * (FA2's choice): every output element has one writer, so the gradient is the
 * same bits every run, no fp32 dq buffer (B T C floats) is zeroed and folded
 * back, and the price is the two recomputed products (7 products instead of
 * 5).
 *
 * Tiles and shared memory (static, under 48 KiB): inner tiles of 64 rows for
 * head sizes up to 64, 32 above; rows padded by 16 bytes, so the 8 rows an
 * ldmatrix reads fall in 8 different bank groups. Expected on an H100 at
 * GPT-2's layer (B 16, T 1024, 12 heads of 64): 26 GFLOP forward (the causal
 * half of 2 products), ~0.1 ms at 250 TF/s (a third of the dense bf16 peak,
 * FA2's share); backward 7 products, ~0.36 ms; 12 layers ~5.6 ms a step,
 * against the 67.8 ms the WMMA kernel took (issue 22). Registers (ptxas
 * 13.1, sm_90, head size 64 / 128): forward 128 / 168, dq 168 / 224, dk/dv
 * 234 / 255, none spilled: 4 / 3, 3 / 2 and 2 / 2 blocks of 4 warps per SM
 * (docs/gpu.md has the table, and what moved them). */
#include "backend/cuda/mma.cuh"

namespace {

const float kLog2e = 1.4426950408889634f;
const int kWarps = 4;
const int kRows = 16 * kWarps; /* the outer tile */
const int kThreads = 32 * kWarps;

template <int D> struct tiles {
  static constexpr int inner = D <= 64 ? 64 : 32; /* keys (forward, dq) or queries (dk/dv) */
  static constexpr int ld = D + 8;                 /* a shared row, padded */
  static constexpr int ksteps = D / 16;            /* k steps over the head */
  static constexpr int dtiles = D / 8;             /* n8 tiles over the head */
  static constexpr int itiles = inner / 8;         /* n8 tiles over the inner tile */
};

/* Two stages of two inner tiles each (K and V, or Q and dO); also the outer
 * tiles' staging (the first 2 * kRows rows). */
template <int D> struct alignas(16) smem {
  bf16 row[4 * tiles<D>::inner][tiles<D>::ld];
};

struct flash_dims {
  int T, NH, NKV, C; /* C = NH * D */
  int ldq;           /* (NH + 2 NKV) D: a qkv row */
  float scale;       /* 1 / sqrt(D) */
  float scale2;      /* log2(e) / sqrt(D) */
};

/* Rows [r0, r0 + n) of a bf16 matrix (row stride ld elements, src at row 0's
 * column of this head) into shared rows, by cp.async; rows at or past T are
 * zeros (a masked key's value must be finite: 0 * NaN is NaN). Where a row's
 * 16-byte chunks divide the block (head sizes 16, 32, 64, 128), a thread
 * keeps one column and steps its source pointer down the rows: computing
 * each chunk's address from its index took ~30 integer instructions a copy
 * (a third of the forward's inner loop at head size 64) and, at 128, the
 * registers that made dk/dv spill. */
template <int D>
__device__ void load_rows(bf16 (*dst)[tiles<D>::ld], const bf16 *src, size_t ld, int r0, int n,
                          int T) {
  const int per_row = D / 8;
  if (kThreads % per_row == 0) {
    const int c = (int)threadIdx.x % per_row * 8, dr = kThreads / per_row;
    int r = (int)threadIdx.x / per_row;
    const bf16 *x = src + (size_t)(r0 + r) * ld + c;
    for (; r < n; r += dr, x += (size_t)dr * ld) {
      const bool in = r0 + r < T;
      cp_async16(&dst[r][c], in ? x : src + c, in);
    }
  } else {
    for (int i = threadIdx.x; i < n * per_row; i += kThreads) {
      const int r = i / per_row, c = (i % per_row) * 8;
      const bool in = r0 + r < T;
      cp_async16(&dst[r][c], src + (size_t)(in ? r0 + r : 0) * ld + c, in);
    }
  }
}

/* The A fragments of shared rows [r, r + 16), all D columns. */
template <int D>
__device__ void load_a(uint32_t (&a)[tiles<D>::ksteps][4], const bf16 (*x)[tiles<D>::ld], int r) {
  const int lane = threadIdx.x & 31;
  for (int kk = 0; kk < tiles<D>::ksteps; ++kk)
    ldmatrix_x4(a[kk], &x[r + (lane & 15)][kk * 16 + (lane >> 4) * 8]);
}

/* acc (16 x N) += A (16 x D, fragments) X^T, X rows [0, N) of shared memory. */
template <int D, int N>
__device__ void mma_abt(float (&acc)[N / 8][4], const uint32_t (&a)[tiles<D>::ksteps][4],
                        const bf16 (*x)[tiles<D>::ld]) {
  const int lane = threadIdx.x & 31;
  for (int kk = 0; kk < tiles<D>::ksteps; ++kk)
    for (int n = 0; n < N / 8; n += 2) {
      uint32_t r[4];
      ldmatrix_x4(r, &x[n * 8 + (lane & 7) + (lane >> 4) * 8][kk * 16 + ((lane >> 3) & 1) * 8]);
      const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      mma_bf16_16816(acc[n], a[kk], b0);
      mma_bf16_16816(acc[n + 1], a[kk], b1);
    }
}

/* acc (16 x D) += P (16 x K, fragments) X, X rows [0, K) of shared memory. */
template <int D, int K>
__device__ void mma_ab(float (&acc)[tiles<D>::dtiles][4], const uint32_t (&p)[K / 16][4],
                       const bf16 (*x)[tiles<D>::ld]) {
  const int lane = threadIdx.x & 31;
  for (int kk = 0; kk < K / 16; ++kk)
    for (int d = 0; d < D; d += 16) {
      uint32_t r[4];
      ldmatrix_x4_trans(r, &x[kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8][d + (lane >> 4) * 8]);
      const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      mma_bf16_16816(acc[d / 8], p[kk], b0);
      mma_bf16_16816(acc[d / 8 + 1], p[kk], b1);
    }
}

/* Accumulators (16 x N, fp32) as the A fragments of the next product (bf16). */
template <int N>
__device__ void to_a(uint32_t (&a)[N / 16][4], const float (&acc)[N / 8][4]) {
  for (int kk = 0; kk < N / 16; ++kk) {
    a[kk][0] = pack_bf16x2(acc[2 * kk][0], acc[2 * kk][1]);
    a[kk][1] = pack_bf16x2(acc[2 * kk][2], acc[2 * kk][3]);
    a[kk][2] = pack_bf16x2(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
    a[kk][3] = pack_bf16x2(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
  }
}

template <int N> __device__ void zero(float (&acc)[N][4]) {
  for (int n = 0; n < N; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
}

/* rows[row0 + g (+8)] = f * acc (16 x D, this lane's columns), rows at or
 * past T left alone; rows ld apart from dst (this head's column). */
template <int D>
__device__ void write_rows(bf16 *dst, size_t ld, int row0, int T, const float (&acc)[D / 8][4],
                           const float (&f)[2]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  for (int hf = 0; hf < 2; ++hf) {
    const int row = row0 + g + 8 * hf;
    if (row >= T) continue;
    for (int n = 0; n < D / 8; ++n) {
      bf16 *o = dst + (size_t)row * ld + n * 8 + 2 * t;
      *reinterpret_cast<uint32_t *>(o) =
          pack_bf16x2(f[hf] * acc[n][2 * hf], f[hf] * acc[n][2 * hf + 1]);
    }
  }
}

/* ---- forward ---- */

template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(bf16 *out, float *lse, const bf16 *qkv, flash_dims p) {
  typedef tiles<D> G;
  FSDP_SHARED(smem<D>, sm_, [1]);
  bf16(*rows)[G::ld] = sm_[0].row;
  const int T = p.T, b = (int)blockIdx.z, h = (int)blockIdx.y, hk = h / (p.NH / p.NKV);
  const int q0 = (int)(gridDim.x - 1 - blockIdx.x) * kRows; /* longest rows first */
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int row0 = q0 + 16 * w;
  const size_t ldq = (size_t)p.ldq;
  const bf16 *qb = qkv + (size_t)b * T * ldq + (size_t)h * D;
  const bf16 *kb = qkv + (size_t)b * T * ldq + (size_t)(p.NH + hk) * D;
  const bf16 *vb = kb + (size_t)p.NKV * D;
  load_rows<D>(rows, qb, ldq, q0, kRows, T);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  uint32_t qa[G::ksteps][4];
  load_a<D>(qa, rows, 16 * w);
  __syncthreads(); /* every warp holds its queries before the stages take keys */
  const int keys = T < q0 + kRows ? T : q0 + kRows;
  const int n_tiles = (keys + G::inner - 1) / G::inner;
  load_rows<D>(rows, kb, ldq, 0, G::inner, T);
  load_rows<D>(rows + G::inner, vb, ldq, 0, G::inner, T);
  cp_async_commit();
  float o[G::dtiles][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  zero(o);
  for (int j = 0; j < n_tiles; ++j) {
    const int k0 = j * G::inner;
    bf16(*ks)[G::ld] = rows + (j & 1) * 2 * G::inner, (*vs)[G::ld] = ks + G::inner;
    cp_async_wait<0>();
    __syncthreads(); /* tile j is in; every warp is done with tile j - 1, whose stage is next */
    if (j + 1 < n_tiles) { /* the next tile into the other stage, in flight meanwhile */
      bf16(*kn)[G::ld] = rows + ((j + 1) & 1) * 2 * G::inner;
      load_rows<D>(kn, kb, ldq, k0 + G::inner, G::inner, T);
      load_rows<D>(kn + G::inner, vb, ldq, k0 + G::inner, G::inner, T);
      cp_async_commit();
    }
    if (row0 < T && k0 <= row0 + 15) {
      float s[G::itiles][4];
      zero(s);
      mma_abt<D, G::inner>(s, qa, ks);
      const bool edge = k0 + G::inner - 1 > row0 || k0 + G::inner > T;
      float mx[2] = {-INFINITY, -INFINITY};
      for (int n = 0; n < G::itiles; ++n)
        for (int i = 0; i < 4; ++i) {
          const int key = k0 + 8 * n + 2 * t + (i & 1), row = row0 + g + 8 * (i >> 1);
          float x = s[n][i] * p.scale2;
          if (edge && (key > row || key >= T)) x = -INFINITY;
          s[n][i] = x;
          mx[i >> 1] = fmaxf(mx[i >> 1], x);
        }
      float alpha[2];
      for (int hf = 0; hf < 2; ++hf) { /* the row's 4 lanes agree on its max */
        mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 1));
        mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 2));
        const float m_new = fmaxf(m[hf], mx[hf]); /* finite: key 0 is in every row's first tile */
        alpha[hf] = exp2_approx(m[hf] - m_new);   /* 0 on the first tile */
        m[hf] = m_new;
        l[hf] *= alpha[hf];
      }
      for (int n = 0; n < G::itiles; ++n)
        for (int i = 0; i < 4; ++i) {
          s[n][i] = exp2_approx(s[n][i] - m[i >> 1]);
          l[i >> 1] += s[n][i];
        }
      for (int d = 0; d < G::dtiles; ++d)
        for (int i = 0; i < 4; ++i) o[d][i] *= alpha[i >> 1];
      uint32_t pa[G::inner / 16][4];
      to_a<G::inner>(pa, s);
      mma_ab<D, G::inner>(o, pa, vs);
    }
  }
  if (row0 >= T) return;
  float inv[2];
  for (int hf = 0; hf < 2; ++hf) {
    l[hf] += __shfl_xor_sync(0xffffffffu, l[hf], 1);
    l[hf] += __shfl_xor_sync(0xffffffffu, l[hf], 2);
    inv[hf] = 1.0f / l[hf];
    const int row = row0 + g + 8 * hf;
    if (t == 0 && row < T)
      lse[((size_t)b * p.NH + h) * T + row] = (m[hf] + log2f(l[hf])) * (1.0f / kLog2e);
  }
  write_rows<D>(out + (size_t)b * T * p.C + (size_t)h * D, (size_t)p.C, row0, T, o, inv);
}

/* ---- backward ---- */

/* dsum[b][h][t] = sum over the head's d of dout * out (fp32), a warp per row. */
__global__ void flash_dot_kernel(float *dsum, const bf16 *dout, const bf16 *out, int B, int T,
                                 int NH, int D) {
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  const size_t n = (size_t)B * T * NH;
  for (size_t r = (size_t)blockIdx.x * warps + (threadIdx.x >> 5); r < n;
       r += (size_t)gridDim.x * warps) {
    const size_t bt = r / NH;
    const int h = (int)(r % NH);
    const bf16 *y = dout + bt * NH * D + (size_t)h * D, *o = out + bt * NH * D + (size_t)h * D;
    float s = 0.0f;
    for (int d = lane; d < D; d += 32) s += load(y + d) * load(o + d);
    s = warp_sum(s);
    if (lane == 0) dsum[((bt / T) * NH + h) * T + bt % T] = s;
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_backward_dq_kernel(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse,
                             const float *dsum, flash_dims p) {
  typedef tiles<D> G;
  FSDP_SHARED(smem<D>, sm_, [1]);
  bf16(*rows)[G::ld] = sm_[0].row;
  const int T = p.T, b = (int)blockIdx.z, h = (int)blockIdx.y, hk = h / (p.NH / p.NKV);
  const int q0 = (int)(gridDim.x - 1 - blockIdx.x) * kRows;
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int row0 = q0 + 16 * w;
  const size_t ldq = (size_t)p.ldq;
  const bf16 *qb = qkv + (size_t)b * T * ldq + (size_t)h * D;
  const bf16 *kb = qkv + (size_t)b * T * ldq + (size_t)(p.NH + hk) * D;
  const bf16 *vb = kb + (size_t)p.NKV * D;
  load_rows<D>(rows, qb, ldq, q0, kRows, T);
  load_rows<D>(rows + kRows, dout + (size_t)b * T * p.C + (size_t)h * D, (size_t)p.C, q0, kRows, T);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  uint32_t qa[G::ksteps][4], da[G::ksteps][4];
  load_a<D>(qa, rows, 16 * w);
  load_a<D>(da, rows + kRows, 16 * w);
  float lse2[2], dd[2];
  for (int hf = 0; hf < 2; ++hf) {
    const int row = row0 + g + 8 * hf;
    const size_t at = ((size_t)b * p.NH + h) * T + (row < T ? row : 0);
    lse2[hf] = lse[at] * kLog2e, dd[hf] = dsum[at];
  }
  __syncthreads();
  const int keys = T < q0 + kRows ? T : q0 + kRows;
  const int n_tiles = (keys + G::inner - 1) / G::inner;
  load_rows<D>(rows, kb, ldq, 0, G::inner, T);
  load_rows<D>(rows + G::inner, vb, ldq, 0, G::inner, T);
  cp_async_commit();
  float dq[G::dtiles][4];
  zero(dq);
  for (int j = 0; j < n_tiles; ++j) {
    const int k0 = j * G::inner;
    bf16(*ks)[G::ld] = rows + (j & 1) * 2 * G::inner, (*vs)[G::ld] = ks + G::inner;
    cp_async_wait<0>();
    __syncthreads(); /* as in the forward: tile j in, tile j - 1's stage free */
    if (j + 1 < n_tiles) {
      bf16(*kn)[G::ld] = rows + ((j + 1) & 1) * 2 * G::inner;
      load_rows<D>(kn, kb, ldq, k0 + G::inner, G::inner, T);
      load_rows<D>(kn + G::inner, vb, ldq, k0 + G::inner, G::inner, T);
      cp_async_commit();
    }
    if (row0 < T && k0 <= row0 + 15) {
      float s[G::itiles][4], dp[G::itiles][4];
      zero(s), zero(dp);
      mma_abt<D, G::inner>(s, qa, ks);
      mma_abt<D, G::inner>(dp, da, vs);
      const bool edge = k0 + G::inner - 1 > row0 || k0 + G::inner > T || row0 + 16 > T;
      for (int n = 0; n < G::itiles; ++n)
        for (int i = 0; i < 4; ++i) {
          const int key = k0 + 8 * n + 2 * t + (i & 1), row = row0 + g + 8 * (i >> 1);
          const bool in = !edge || (key <= row && row < T);
          const float pr = in ? exp2_approx(s[n][i] * p.scale2 - lse2[i >> 1]) : 0.0f;
          s[n][i] = pr * (dp[n][i] - dd[i >> 1]); /* dS, the scale applied at the end */
        }
      uint32_t dsa[G::inner / 16][4];
      to_a<G::inner>(dsa, s);
      mma_ab<D, G::inner>(dq, dsa, ks);
    }
  }
  if (row0 >= T) return;
  const float f[2] = {p.scale, p.scale};
  write_rows<D>(dqkv + (size_t)b * T * ldq + (size_t)h * D, ldq, row0, T, dq, f);
}

/* dk/dv's shared memory: the stages, and per stage its query rows'
 * log-sum-exp and D, copied in with the tiles (cp.async) and read by each lane
 * where the softmax needs them: loaded from global memory there, they were 32
 * dependent loads a step at head size 64, with two warps per scheduler to
 * hide them. */
template <int D> struct dkdv_smem {
  smem<D> t;
  float stat[2][2][tiles<D>::inner]; /* [stage][lse, D][query] */
};

template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_backward_dkdv_kernel(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse,
                               const float *dsum, flash_dims p) {
  typedef tiles<D> G;
  FSDP_SHARED(dkdv_smem<D>, sm_, [1]);
  bf16(*rows)[G::ld] = sm_[0].t.row;
  float(*stat)[2][G::inner] = sm_[0].stat;
  const int T = p.T, b = (int)blockIdx.z, hk = (int)blockIdx.y, group = p.NH / p.NKV;
  const int k0 = (int)blockIdx.x * kRows; /* the longest columns first */
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int key0 = k0 + 16 * w;
  const size_t ldq = (size_t)p.ldq;
  const bf16 *kb = qkv + (size_t)b * T * ldq + (size_t)(p.NH + hk) * D;
  const bf16 *vb = kb + (size_t)p.NKV * D;
  load_rows<D>(rows, kb, ldq, k0, kRows, T);
  load_rows<D>(rows + kRows, vb, ldq, k0, kRows, T);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  uint32_t ka[G::ksteps][4], va[G::ksteps][4];
  load_a<D>(ka, rows, 16 * w);
  load_a<D>(va, rows + kRows, 16 * w);
  __syncthreads();
  /* steps: the group's query heads, each over its query tiles from k0's */
  const int i_first = k0 / G::inner * G::inner;
  const int per_head = (T - i_first + G::inner - 1) / G::inner, n_steps = group * per_head;
  /* Step j's Q and dO tiles and statistics into stage j % 2, one group of
   * copies (thread i < 2 inner copies query i % inner's lse, then its D). */
  static_assert(kThreads >= 2 * G::inner, "a thread per query's lse and D");
  auto fetch = [&](int j) {
    const int h = hk * group + j / per_head, i0 = i_first + j % per_head * G::inner;
    bf16(*qn)[G::ld] = rows + (j & 1) * 2 * G::inner;
    load_rows<D>(qn, qkv + (size_t)b * T * ldq + (size_t)h * D, ldq, i0, G::inner, T);
    load_rows<D>(qn + G::inner, dout + (size_t)b * T * p.C + (size_t)h * D, (size_t)p.C, i0,
                 G::inner, T);
    const int x = (int)threadIdx.x / G::inner, qi = i0 + (int)threadIdx.x % G::inner;
    if (x < 2)
      cp_async4(&stat[j & 1][x][qi - i0],
                (x ? dsum : lse) + ((size_t)b * p.NH + h) * T + (qi < T ? qi : 0), qi < T);
    cp_async_commit();
  };
  fetch(0);
  float dk[G::dtiles][4], dv[G::dtiles][4];
  zero(dk), zero(dv);
  for (int j = 0; j < n_steps; ++j) {
    bf16(*qs)[G::ld] = rows + (j & 1) * 2 * G::inner, (*ys)[G::ld] = qs + G::inner;
    cp_async_wait<0>();
    __syncthreads(); /* as in the forward: step j in, step j - 1's stage free */
    if (j + 1 < n_steps) fetch(j + 1); /* in flight over this step */
    const int i0 = i_first + j % per_head * G::inner;
    if (key0 < T && i0 + G::inner - 1 >= key0) { /* else every query comes before the keys */
      float s[G::itiles][4], dp[G::itiles][4];
      zero(s), zero(dp);
      mma_abt<D, G::inner>(s, ka, qs);
      mma_abt<D, G::inner>(dp, va, ys);
      const bool edge = i0 < key0 + 15 || i0 + G::inner > T;
      for (int n = 0; n < G::itiles; ++n)
        for (int c = 0; c < 2; ++c) {
          const int qi = i0 + 8 * n + 2 * t + c;
          const float l2 = stat[j & 1][0][qi - i0] * kLog2e, dd = stat[j & 1][1][qi - i0];
          for (int hf = 0; hf < 2; ++hf) {
            const int key = key0 + g + 8 * hf, i = 2 * hf + c;
            const bool in = !edge || (key <= qi && qi < T);
            const float pr = in ? exp2_approx(s[n][i] * p.scale2 - l2) : 0.0f;
            s[n][i] = pr;                    /* P^T */
            dp[n][i] = pr * (dp[n][i] - dd); /* dS^T, the scale applied at the end */
          }
        }
      uint32_t pa[G::inner / 16][4];
      to_a<G::inner>(pa, s);
      mma_ab<D, G::inner>(dv, pa, ys);
      to_a<G::inner>(pa, dp);
      mma_ab<D, G::inner>(dk, pa, qs);
    }
  }
  if (key0 >= T) return;
  bf16 *db = dqkv + (size_t)b * T * ldq + (size_t)(p.NH + hk) * D;
  const float fk[2] = {p.scale, p.scale}, fv[2] = {1.0f, 1.0f};
  write_rows<D>(db, ldq, key0, T, dk, fk);
  write_rows<D>(db + (size_t)p.NKV * D, ldq, key0, T, dv, fv);
}

/* ---- launches ---- */

struct flash_args {
  int B, T, C, NH, NKV, hs;
};

fsdp_status_t check_args(const flash_args &a, const void *const *ptrs, const char *const *names,
                         int n) {
  if (a.C % a.NH != 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "flash attention: C %d is not a multiple of the %d heads", a.C, a.NH);
  if (a.NKV <= 0 || a.NKV > a.NH || a.NH % a.NKV != 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "flash attention: %d KV heads do not divide the %d query heads", a.NKV,
                      a.NH);
  if (a.hs % 16 != 0 || a.hs > 128)
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

flash_dims dims_of(const flash_args &a) {
  const float scale = 1.0f / sqrtf((float)a.hs);
  return {a.T, a.NH, a.NKV, a.C, (a.NH + 2 * a.NKV) * a.hs, scale, scale * kLog2e};
}

template <int D>
fsdp_status_t forward(bf16 *out, float *lse, const bf16 *qkv, const flash_args &a, cudaStream_t s) {
  const dim3 grid((unsigned)((a.T + kRows - 1) / kRows), (unsigned)a.NH, (unsigned)a.B);
  FSDP_LAUNCH(flash_forward_kernel<D>, grid, kThreads, 0, s, out, lse, qkv, dims_of(a));
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

template <int D>
fsdp_status_t backward(bf16 *dqkv, float *dsum, const bf16 *dout, const bf16 *qkv,
                       const bf16 *out, const float *lse, const flash_args &a, cudaStream_t s) {
  const size_t rows = (size_t)a.B * a.T * a.NH;
  FSDP_LAUNCH(flash_dot_kernel, fsdp_grid(rows, FSDP_CUDA_BLOCK / 32), FSDP_CUDA_BLOCK, 0, s, dsum,
              dout, out, a.B, a.T, a.NH, D);
  LAUNCH_CHECK();
  const unsigned tiles_t = (unsigned)((a.T + kRows - 1) / kRows);
  FSDP_LAUNCH(flash_backward_dkdv_kernel<D>, dim3(tiles_t, (unsigned)a.NKV, (unsigned)a.B),
              kThreads, 0, s, dqkv, dout, qkv, lse, dsum, dims_of(a));
  LAUNCH_CHECK();
  FSDP_LAUNCH(flash_backward_dq_kernel<D>, dim3(tiles_t, (unsigned)a.NH, (unsigned)a.B), kThreads,
              0, s, dqkv, dout, qkv, lse, dsum, dims_of(a));
  LAUNCH_CHECK();
  return FSDP_SUCCESS;
}

/* One instantiation per supported head size. */
#define FLASH_HEAD_SIZES(X) X(16) X(32) X(48) X(64) X(80) X(96) X(112) X(128)

} // namespace

fsdp_status_t fsdp_cuda_flash_forward(bf16 *out, float *lse, const bf16 *qkv, int B, int T, int C,
                                      int NH, int NKV, cudaStream_t stream) {
  if (B <= 0 || T <= 0 || C <= 0 || NH <= 0) return FSDP_SUCCESS;
  const flash_args a = {B, T, C, NH, NKV ? NKV : NH, C / NH};
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

fsdp_status_t fsdp_cuda_flash_backward(bf16 *dqkv, float *scratch, const bf16 *dout,
                                       const bf16 *qkv, const bf16 *out, const float *lse, int B,
                                       int T, int C, int NH, int NKV, cudaStream_t stream) {
  if (B <= 0 || T <= 0 || C <= 0 || NH <= 0) return FSDP_SUCCESS;
  const flash_args a = {B, T, C, NH, NKV ? NKV : NH, C / NH};
  const void *ptrs[] = {dqkv, dout, qkv, out};
  const char *names[] = {"dqkv", "dout", "qkv", "out"};
  FSDP_TRY(check_args(a, ptrs, names, 4));
  if (!scratch)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "flash attention backward: no scratch (attention_scratch_bytes gives %zu "
                      "bytes for B %d, T %d, NH %d)",
                      (size_t)B * T * NH * sizeof(float), B, T, NH);
  switch (a.hs) {
#define FLASH_BACKWARD(hs) \
  case hs:                 \
    return backward<hs>(dqkv, scratch, dout, qkv, out, lse, a, stream);
    FLASH_HEAD_SIZES(FLASH_BACKWARD)
#undef FLASH_BACKWARD
  }
  return fsdp_error(FSDP_ERR_INTERNAL, "flash attention: head size %d not dispatched", a.hs);
}
