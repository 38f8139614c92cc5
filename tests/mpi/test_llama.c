/* tests/mpi/test_llama.c — a small Llama (grouped-query attention, untied
 * head) trained 20 steps at N ranks matches one rank, under ZeRO-3 and
 * ZeRO-2, with and without activation checkpointing, within 10 x the fp32
 * noise floor measured as in test_parity.c (the same one-rank run with each
 * micro-batch's sequences in reverse order); so does the tied form. The
 * model is made for the whole global batch, so at N > 1 it runs micro-batches
 * smaller than its buffers. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mpi_check.h"
#include "fsdp/fsdp.h"

#define STEPS 20
#define GLOBAL_BATCH 12 /* divisible by N = 1..4 */
#define SEQ 16

/* 4 heads / 2 KV of D 6, F 40; untied, and tied for one run */
static const fsdp_llama_config_t cfg = {2, 4, 2, 24, 40, 32, SEQ, 10000.0f, 1e-5f, 0,
                                        FSDP_ROPE_DEFAULT, 0, 0, 0, 0};
static fsdp_world_t world, solo;
static int rank, nranks;

typedef struct {
  double loss[STEPS];
  float wte[32 * 24], fc[40 * 24];
} run_t;

/* Sequence `id` of step `s`: a noisy repeating pattern the model can learn. */
static void sequence(int s, int id, int *tok, int *tgt) {
  int x = (s * GLOBAL_BATCH + id) % 5;
  for (int t = 0; t <= SEQ; t++) {
    unsigned h = (unsigned)(s * 131 + id * 31 + t * 7) * 2654435761u;
    x = (x * 3 + 1 + (h >> 30 == 0)) % cfg.vocab_size;
    if (t < SEQ) tok[t] = x;
    if (t > 0) tgt[t - 1] = x;
  }
}

static void train(fsdp_world_t w, fsdp_strategy_t strat, int ckpt, int reverse, int tied,
                  run_t *out) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.strategy = strat;
  c.max_live_units = 3; /* depth 1 + the root */
  c.optim.lr = 3e-3f;
  c.optim.weight_decay = 0.1f;
  c.optim.max_grad_norm = 1.0f;
  fsdp_engine_t e;
  ck_assert_int_eq(fsdp_engine_create(w, &c, &e), FSDP_SUCCESS);
  int64_t mb, off;
  ck_assert_int_eq(fsdp_engine_shard_batch(e, GLOBAL_BATCH, &mb, &off), FSDP_SUCCESS);
  fsdp_llama_opts_t o = {.wrap_kinds = "LlamaDecoderLayer",
                         .checkpoint_kinds = ckpt ? "LlamaDecoderLayer" : NULL,
                         .max_batch = GLOBAL_BATCH}; /* B < max_batch at N > 1 */
  fsdp_llama_config_t lc = cfg;
  lc.tie_embeddings = tied;
  fsdp_llama_t g;
  ck_assert_int_eq(fsdp_llama_create(e, &lc, &o, &g), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_materialize(e, 3), FSDP_SUCCESS);
  int tok[GLOBAL_BATCH * SEQ], tgt[GLOBAL_BATCH * SEQ];
  for (int s = 0; s < STEPS; s++) {
    for (int b = 0; b < mb; b++) {
      int id = (int)off + (reverse ? (int)mb - 1 - b : b);
      sequence(s, id, tok + b * SEQ, tgt + b * SEQ);
    }
    double l;
    ck_assert_int_eq(fsdp_llama_forward_backward(g, tok, tgt, (int)mb, SEQ,
                                                 1.0f / (float)(mb * SEQ), &l), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_all_reduce(fsdp_engine_comm(e), &l, &l, 1, FSDP_F64, FSDP_SUM,
                                     FSDP_HOST_STREAM), FSDP_SUCCESS);
    out->loss[s] = l / (GLOBAL_BATCH * SEQ);
    ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
  }
  ck_assert_int_eq(fsdp_engine_read_tensor(e, "model.embed_tokens.weight", out->wte, -1),
                   FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_read_tensor(e, "model.layers.1.mlp.gate_proj.weight", out->fc, -1),
                   FSDP_SUCCESS);
  fsdp_llama_destroy(g);
  fsdp_engine_destroy(e);
}

static double distance(const run_t *a, const run_t *b) {
  double d = 0.0;
  for (int s = 0; s < STEPS; s++) d = fmax(d, fabs(a->loss[s] - b->loss[s]) / b->loss[s]);
  for (size_t i = 0; i < sizeof a->wte / sizeof a->wte[0]; i++)
    d = fmax(d, fabs(a->wte[i] - b->wte[i]) / 0.1);
  for (size_t i = 0; i < sizeof a->fc / sizeof a->fc[0]; i++)
    d = fmax(d, fabs(a->fc[i] - b->fc[i]) / 0.1);
  return d;
}

START_TEST(llama_parity) {
  static run_t ref, noise, got;
  train(solo, FSDP_FULL_SHARD, 0, 0, 0, &ref);
  train(solo, FSDP_FULL_SHARD, 0, 1, 0, &noise);
  double tol = fmax(10.0 * distance(&noise, &ref), 1e-6);
  ck_assert_msg(ref.loss[STEPS - 1] < 0.8 * ref.loss[0], "the reference did not learn: %g -> %g",
                ref.loss[0], ref.loss[STEPS - 1]);
  for (int k = 0; k < 4; k++) {
    fsdp_strategy_t strat = k / 2 ? FSDP_SHARD_GRAD_OP : FSDP_FULL_SHARD;
    train(world, strat, k % 2, 0, 0, &got);
    double d = distance(&got, &ref);
    if (rank == 0)
      printf("llama parity N=%d %s checkpoint=%d: distance %.3g, noise %.3g, tol %.3g\n", nranks,
             fsdp_strategy_name(strat), k % 2, d, tol / 10, tol);
    ck_assert_msg(d <= tol, "%s ckpt=%d: N=%d differs from N=1 by %g > %g",
                  fsdp_strategy_name(strat), k % 2, nranks, d, tol);
  }
  /* tied: the head's gradient reaches embed_tokens through the root unit */
  train(solo, FSDP_FULL_SHARD, 0, 0, 1, &ref);
  train(solo, FSDP_FULL_SHARD, 0, 1, 1, &noise);
  tol = fmax(10.0 * distance(&noise, &ref), 1e-6);
  train(world, FSDP_FULL_SHARD, 1, 0, 1, &got);
  double d = distance(&got, &ref);
  if (rank == 0) printf("llama parity N=%d tied: distance %.3g, tol %.3g\n", nranks, d, tol);
  ck_assert_msg(d <= tol, "tied: N=%d differs from N=1 by %g > %g", nranks, d, tol);
}
END_TEST

static Suite *llama_suite(void) {
  Suite *s = suite_create("llama-mpi");
  TCase *tc = tcase_create("llama");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, llama_parity);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  if (mpi_check_join(&world, &rank, &nranks) || !(solo = mpi_check_solo())) return EXIT_FAILURE;
  return mpi_check_run(llama_suite());
}
