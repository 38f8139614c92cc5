/* tests/mpi/test_memory_plan.c — fsdp_engine_memory_plan, asked after a model
 * registers its units and before materialize, equals what fsdp_engine_memory
 * reports after materialize and the first step: GPT-2 and Llama tiny, ZeRO-3
 * and ZeRO-2, bf16 parameters (and a bf16 reduce), at N ranks. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mpi_check.h"
#include "fsdp/fsdp.h"

#define B 2
#define T 16

static fsdp_world_t world;
static int rank, nranks;

typedef struct {
  int llama;
  fsdp_strategy_t strategy;
  fsdp_dtype_t reduce;
  int max_live_units; /* 0: unset, the root's nesting slot is added in the first step */
} plan_case_t;

static const plan_case_t cases[] = {
    {0, FSDP_FULL_SHARD, FSDP_F32, 0},     {0, FSDP_SHARD_GRAD_OP, FSDP_F32, 0},
    {1, FSDP_FULL_SHARD, FSDP_F32, 0},     {1, FSDP_SHARD_GRAD_OP, FSDP_F32, 0},
    {0, FSDP_FULL_SHARD, FSDP_BF16, 0},    {1, FSDP_FULL_SHARD, FSDP_F32, 3},
};

/* The decoder's root unit (embeddings and head), which it holds across the layers. */
static fsdp_unit_t root_unit(fsdp_engine_t e) {
  for (int u = 0; u < fsdp_engine_num_units(e); u++) {
    fsdp_unit_info_t info;
    ck_assert_int_eq(fsdp_unit_info(e, u, &info), FSDP_SUCCESS);
    if (!strcmp(info.name, "root")) return u;
  }
  ck_abort_msg("no unit named root");
  return -1;
}

static void step_once(const plan_case_t *c, void *model) {
  int tok[B * T], tgt[B * T];
  for (int i = 0; i < B * T; i++) tok[i] = (i * 7 + rank) % 50, tgt[i] = (i * 3 + 1) % 50;
  double loss;
  fsdp_status_t st = c->llama ? fsdp_llama_forward_backward(model, tok, tgt, B, T, 1.0f, &loss)
                              : fsdp_gpt2_forward_backward(model, tok, tgt, B, T, 1.0f, &loss);
  ck_assert_msg(st == FSDP_SUCCESS, "forward_backward: %s", fsdp_last_error());
}

START_TEST(plan_equals_allocation) {
  const plan_case_t *c = &cases[_i];
  fsdp_config_t cfg = FSDP_CONFIG_INIT;
  cfg.strategy = c->strategy;
  cfg.param_dtype = FSDP_BF16;
  cfg.reduce_dtype = c->reduce;
  cfg.max_live_units = c->max_live_units;
  fsdp_engine_t e;
  ck_assert_int_eq(fsdp_engine_create(world, &cfg, &e), FSDP_SUCCESS);
  fsdp_gpt2_opts_t o = {.max_batch = B, .max_T = T};
  void *model = NULL;
  if (c->llama) {
    fsdp_llama_config_t lc;
    ck_assert_int_eq(fsdp_llama_preset("tiny", &lc), FSDP_SUCCESS);
    o.wrap_kinds = "LlamaDecoderLayer";
    ck_assert_int_eq(fsdp_llama_create(e, &lc, &o, (fsdp_llama_t *)&model), FSDP_SUCCESS);
  } else {
    fsdp_gpt2_config_t gc;
    ck_assert_int_eq(fsdp_gpt2_preset("tiny", &gc), FSDP_SUCCESS);
    o.wrap_kinds = "GPT2Block";
    ck_assert_int_eq(fsdp_gpt2_create(e, &gc, &o, (fsdp_gpt2_t *)&model), FSDP_SUCCESS);
  }
  const fsdp_unit_t root = root_unit(e);
  fsdp_mem_stats_t plan, real;
  ck_assert_int_eq(fsdp_engine_memory_plan(e, &root, 1, &plan), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_materialize(e, 5), FSDP_SUCCESS);
  step_once(c, model);
  ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_memory(e, &real), FSDP_SUCCESS);
  if (rank == 0)
    printf("memory plan: %s %s reduce %s live %d, %d ranks: predicted %zu, allocated %zu "
           "bytes (param pool %zu / %zu, grad pool %zu / %zu)\n",
           c->llama ? "llama" : "gpt2", c->strategy == FSDP_FULL_SHARD ? "zero3" : "zero2",
           fsdp_dtype_name(c->reduce), c->max_live_units, nranks, plan.total_reserved,
           real.total_reserved, plan.param_pool, real.param_pool, plan.grad_pool,
           real.grad_pool);
  ck_assert_uint_eq(plan.master, real.master);
  ck_assert_uint_eq(plan.grad_shard, real.grad_shard);
  ck_assert_uint_eq(plan.optim_state, real.optim_state);
  ck_assert_uint_eq(plan.param_copy, real.param_copy);
  ck_assert_uint_eq(plan.param_pool, real.param_pool);
  ck_assert_uint_eq(plan.grad_pool, real.grad_pool);
  ck_assert_uint_eq(plan.staging, real.staging);
  ck_assert_uint_eq(plan.total_reserved, real.total_reserved);
  /* a second step allocates nothing more */
  step_once(c, model);
  ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_memory(e, &real), FSDP_SUCCESS);
  ck_assert_uint_eq(plan.total_reserved, real.total_reserved);
  if (c->llama) fsdp_llama_destroy(model);
  else fsdp_gpt2_destroy(model);
  fsdp_engine_destroy(e);
}
END_TEST

START_TEST(plan_bad_arguments) {
  fsdp_config_t cfg = FSDP_CONFIG_INIT;
  fsdp_engine_t e;
  ck_assert_int_eq(fsdp_engine_create(world, &cfg, &e), FSDP_SUCCESS);
  fsdp_mem_stats_t plan;
  const fsdp_unit_t bad = 7;
  ck_assert_int_eq(fsdp_engine_memory_plan(NULL, NULL, 0, &plan), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_engine_memory_plan(e, NULL, 0, NULL), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_engine_memory_plan(e, NULL, 1, &plan), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fsdp_engine_memory_plan(e, &bad, 1, &plan), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(fsdp_last_error(), "held[0] = 7"), "%s", fsdp_last_error());
  fsdp_engine_destroy(e);
}
END_TEST

static Suite *plan_suite(void) {
  Suite *s = suite_create("memory-plan-mpi");
  TCase *tc = tcase_create("memory_plan");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, plan_equals_allocation, 0, (int)(sizeof cases / sizeof cases[0]));
  tcase_add_test(tc, plan_bad_arguments);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  if (mpi_check_join(&world, &rank, &nranks)) return EXIT_FAILURE;
  return mpi_check_run(plan_suite());
}
