/* src/nn/gpt2_cost.c — what each kernel class of a GPT-2 step costs, in
 * FLOPs and bytes (fsdp_gpt2_kernel_costs, fsdp/nn.h): the formulas of
 * bench/gpu_budget.py's design "built", row for row (a class holds the rows its
 * kernels' calls cover: the bias gradients are summed inside the backward
 * products). Change one side and the kernel-profile test says where they
 * part. A Llama's (fsdp_llama_kernel_costs) by the same counting, with its
 * bias-free products, grouped-query attention and its own norm, RoPE and
 * SwiGLU classes; bench/check_bench.py's llama_costs is its second side.
 * Dims: L layers, C width, NH heads, NKV key/value heads, D head size, V
 * vocabulary, F SwiGLU's width, N = B T tokens. */
#include <math.h>

#include "core/internal.h"
#include "fsdp/nn.h"

/* Scores the flash kernel (src/backend/cuda/flash.cu) computes per (batch row, head):
 * a warp owns 16 rows of a block's outer tile (64 rows, 32 past head size 64)
 * and skips every 32-wide inner tile wholly past its diagonal. *q: query-major
 * (forward, dq), *kv: key-major (dk/dv). bench/gpu_budget.py's
 * causal_tile_area is the same loop. */
static void flash_areas(int T, int hs, double *q, double *kv) {
  const int rows = hs <= 64 ? 64 : 32, inner = 32;
  *q = *kv = 0;
  for (int r0 = 0; r0 < T; r0 += 16) *q += 16.0 * inner * ((r0 + 15) / inner + 1);
  for (int k0 = 0; k0 < T; k0 += 16)
    for (int i0 = k0 / rows * rows; i0 < T; i0 += inner)
      if (i0 + inner - 1 >= k0) *kv += 16.0 * inner;
}

/* L products of (N, K) by (K, M) per micro-batch, forward and backward; a =
 * bytes of an activation element. */
static void product_costs(double L, double N, double K, double M, double a, int bias,
                          fsdp_kclass_cost_t *k) {
  k[FSDP_KC_BLOCK_FWD].flops += L * 2 * N * K * M;
  k[FSDP_KC_BLOCK_FWD].bytes += L * (N * K + K * M + N * M) * a;
  k[FSDP_KC_BLOCK_BWD].flops += L * 4 * N * K * M;
  /* dout, weight, input read; d(input) and d(weight) written (fp32) */
  k[FSDP_KC_BLOCK_BWD].bytes += L * ((N * M + K * M + N * K) * a + (N * K + N * M) * a + K * M * 4);
  if (!bias) return;
  /* the bias as the product's cuBLASLt epilogue (blas.cu): the bias read; the
   * bias gradient in dweight's product (fp32, M written) added onto dbias (M
   * read twice, written). The product + pass that runs where cuBLASLt does
   * not reads and writes the output again and reads dout once more. */
  k[FSDP_KC_BLOCK_FWD].bytes += L * M * a;
  k[FSDP_KC_BLOCK_BWD].bytes += L * M * 4 * 4;
}

/* flash: 2 products forward, 7 backward (dk/dv: S^T, dP^T, dV, dK; dq: S, dP,
 * dQ) over the tiles computed, per query head; scores stay on chip. Forward
 * reads q|k|v (QKV = (NH + 2 NKV) D wide) and writes out; backward's two
 * kernels each read q|k|v, dout and out, and d(q|k|v) is written once. */
static void attention_costs(double L, double B, double T, double NH, double NKV, int D,
                            double a, fsdp_kclass_cost_t *k) {
  const double N = B * T, C = NH * D, QKV = (NH + 2 * NKV) * D;
  const double lse = B * NH * T * 4; /* the log-sum-exp */
  double qa, ka;
  flash_areas((int)T, D, &qa, &ka);
  const double prod = 2.0 * D * B * NH * L; /* FLOPs per score of one product */
  k[FSDP_KC_ATTN_FWD].flops += 2 * qa * prod;
  k[FSDP_KC_ATTN_FWD].bytes += L * ((N * QKV + N * C) * a + lse);
  k[FSDP_KC_ATTN_BWD].flops += (3 * qa + 4 * ka) * prod;
  k[FSDP_KC_ATTN_BWD].bytes += L * ((3 * N * QKV + 4 * N * C) * a + 2 * lse);
}

/* One LayerNorm backward over N rows of C (src/backend/cuda/layernorm.cu),
 * d(input) added into. Up to C = 1024 one kernel: x and dout read once,
 * d(input) read and written, mean, rstd and the weight read, and 2 C fp32
 * partials a block (16 rows each, at most 128 blocks) written, then read back
 * by a second kernel that adds them onto dweight and dbias (read and
 * written). Wider rows, two passes: d(input) (dout, x, d(input) read and
 * written), then the weight and bias column sums (dout and x again).
 * bench/gpu_budget.py's ln_backward is the same count. */
static double ln_backward_bytes(double N, double C, double a) {
  if (C > 1024) return 6 * N * C * a + 8 * N;
  const double blocks = fmin(128, ceil(N / 16));
  return 4 * N * C * a + 8 * N + C * a + 16 * C * blocks + 16 * C;
}

/* Per micro-batch. */
static void block_costs(const fsdp_gpt2_config_t *c, double B, double T, double a,
                        fsdp_kclass_cost_t *k) {
  const double L = c->n_layer, C = c->n_embd, N = B * T;
  const double lin[4][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}}; /* (K, M) */
  for (int i = 0; i < 4; i++) product_costs(L, N, lin[i][0], lin[i][1], a, 1, k);
  k[FSDP_KC_BLOCK_FWD].bytes += L * N * 4 * C * a; /* fc's pre-activation (GELU_AUX_BIAS) */
  k[FSDP_KC_BLOCK_BWD].bytes += L * N * 4 * C * a; /* pre read by fc-proj's DGELU epilogue */
  attention_costs(L, B, T, c->n_head, c->n_head, c->n_embd / c->n_head, a, k);
  const double ln = 2 * L + 1; /* two per block and ln_f: x and the branch in, x' and ln(x') out */
  k[FSDP_KC_RESID_LN_FWD].bytes += ln * (4 * N * C * a + 8 * N);
  k[FSDP_KC_LN_BWD].bytes += ln * ln_backward_bytes(N, C, a);
}

/* The head, cross-entropy and embedding; P positions of a position embedding
 * gathered too (GPT-2's wpe: T; a Llama has none). */
static void head_costs(double C, double V, double B, double T, double P, double a,
                       fsdp_kclass_cost_t *k) {
  const double N = B * T;
  k[FSDP_KC_HEAD_FWD].flops += 2 * N * C * V;
  k[FSDP_KC_HEAD_FWD].bytes += (N * C + V * C + N * V) * a;
  k[FSDP_KC_HEAD_BWD].flops += 4 * N * C * V;
  k[FSDP_KC_HEAD_BWD].bytes += (2 * N * V + V * C + 2 * N * C) * a + V * C * 4;
  k[FSDP_KC_XENT].bytes += 2 * N * V * a + 8 * N; /* one read, the gradient over the logits */
  /* forward gather of wte (and wpe) rows, backward scatter-add into fp32 */
  k[FSDP_KC_EMBED].bytes += (2 * N * C + P * C) * a + N * C * a + 2 * N * C * 4;
}

/* Scales a micro-batch's costs to a step's and adds the step's AdamW over P
 * parameters: fp32 master, gradient, m and v read and written but the
 * gradient (28 bytes), and the 16-bit copy written; and the engine's pass
 * over the fp32 gradient for the norm (read) and the one zeroing it (written). */
static void step_costs(fsdp_kclass_cost_t *k, int micro_batches, double P, double a,
                       fsdp_kclass_cost_t *out, int n) {
  for (int i = 0; i < FSDP_KC_COUNT; i++) k[i].flops *= micro_batches, k[i].bytes *= micro_batches;
  k[FSDP_KC_ADAMW].bytes = P * (28 + (a == 2.0 ? 2 : 0));
  k[FSDP_KC_GRAD_NORM].bytes = P * (4 + 4);
  for (int i = 0; i < n; i++) out[i] = k[i];
}

fsdp_status_t fsdp_gpt2_kernel_costs(const fsdp_gpt2_config_t *c, int B, int T,
                                     int micro_batches, fsdp_dtype_t act_dtype,
                                     fsdp_kclass_cost_t *out, int n) {
  if (!c || !out || n < 0 || n > FSDP_KC_COUNT)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_gpt2_kernel_costs: config and out must "
                      "not be NULL, n in [0, %d]", FSDP_KC_COUNT);
  FSDP_TRY(fsdp_gpt2_config_check(c));
  if (B < 1 || T < 1 || T > c->block_size || micro_batches < 1)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_gpt2_kernel_costs: batch %d x %d x %d "
                      "micro-batches (T at most the context, %d)", B, T, micro_batches,
                      c->block_size);
  if (act_dtype != FSDP_F32 && act_dtype != FSDP_BF16)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_gpt2_kernel_costs: activations in %s: "
                      "GPT-2 computes in f32 or bf16", fsdp_dtype_name(act_dtype));
  fsdp_kclass_cost_t k[FSDP_KC_COUNT] = {{0}};
  const double a = act_dtype == FSDP_BF16 ? 2.0 : 4.0;
  block_costs(c, B, T, a, k);
  head_costs(c->n_embd, c->vocab_size, B, T, T, a, k);
  step_costs(k, micro_batches, (double)fsdp_gpt2_num_params(c), a, out, n);
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_llama_kernel_costs(const fsdp_llama_config_t *c, int B, int T,
                                      int micro_batches, fsdp_dtype_t act_dtype,
                                      fsdp_kclass_cost_t *out, int n) {
  if (!c || !out || n < 0 || n > FSDP_KC_COUNT)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_llama_kernel_costs: config and out must "
                      "not be NULL, n in [0, %d]", FSDP_KC_COUNT);
  FSDP_TRY(fsdp_llama_config_check(c));
  if (B < 1 || T < 1 || T > c->max_seq_len || micro_batches < 1)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_llama_kernel_costs: batch %d x %d x %d "
                      "micro-batches (T at most the context, %d)", B, T, micro_batches,
                      c->max_seq_len);
  if (act_dtype != FSDP_F32 && act_dtype != FSDP_BF16)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_llama_kernel_costs: activations in %s: "
                      "a Llama computes in f32 or bf16", fsdp_dtype_name(act_dtype));
  fsdp_kclass_cost_t k[FSDP_KC_COUNT] = {{0}};
  const double a = act_dtype == FSDP_BF16 ? 2.0 : 4.0, L = c->n_layer, C = c->n_embd;
  const double F = c->ffn_hidden, NH = c->n_head, NKV = c->n_kv_head, N = (double)B * T;
  const int D = c->n_embd / c->n_head;
  const double lin[4][2] = {{C, (NH + 2 * NKV) * D}, {C, C}, {C, 2 * F}, {F, C}}; /* (K, M) */
  for (int i = 0; i < 4; i++) product_costs(L, N, lin[i][0], lin[i][1], a, 0, k);
  attention_costs(L, B, T, NH, NKV, D, a, k);
  const double norms = 2 * L + 1; /* x and the branch in, x' and the norm out; rstd */
  k[FSDP_KC_RMSNORM_FWD].bytes += norms * (4 * N * C * a + 4 * N);
  /* d(input) (dout, x, d(residual) read and written), the weight's column
   * sums (dout and x again) */
  k[FSDP_KC_RMSNORM_BWD].bytes += norms * (6 * N * C * a + 4 * N);
  /* q and k rotated in place, forward; d(q) and d(k) back */
  k[FSDP_KC_ROPE].bytes += L * 2 * 2 * N * (NH + NKV) * D * a;
  /* gate|up in, h out; d(h) and gate|up in, d(gate|up) out */
  k[FSDP_KC_SWIGLU].bytes += L * (3 + 5) * N * F * a;
  head_costs(C, c->vocab_size, B, T, 0, a, k);
  step_costs(k, micro_batches, (double)fsdp_llama_num_params(c), a, out, n);
  return FSDP_SUCCESS;
}
