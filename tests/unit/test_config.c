/* tests/unit/test_config.c — the configuration file's sharding rules and
 * torchprime's partition specs (src/tools/config.h) over Hugging Face's Llama
 * names, without the model: the plan cfg_llama_opts makes of decoder layers
 * "model.layers.<i>" through the library's planner (fsdp/plan.h), what the
 * per-unit callback gives each unit and tensor, torchprime's llama-fsdp.yaml
 * as it ships (tests/tools/torchprime/) on an untied and a tied head, and
 * the errors the model's names bring out. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/llama_layout.h"
#include "common/check_run.h"
#include "fsdp/fsdp.h"
#include "tools/config.h"

static const char *src_root = ".";

/* The tiny preset's shapes, four layers. */
static fsdp_llama_config_t tiny(void) {
  fsdp_llama_config_t c;
  ck_assert_int_eq(fsdp_llama_preset("tiny", &c), FSDP_SUCCESS);
  c.n_layer = 4;
  return c;
}

/* Layer l's nine tensors (names in names[l][k]) as the model registers them. */
static char names[4][LLAMA_LAYER_TENSORS][64];
static void layer_tensors(const fsdp_llama_config_t *c, int l, fsdp_tensor_desc_t *t) {
  for (int k = 0; k < LLAMA_LAYER_TENSORS; k++) {
    int rows, cols;
    ck_assert_int_eq(llama_layer_tensor_name(l, k, names[l][k], sizeof names[l][k]), 0);
    llama_layer_tensor_shape(c, k, &rows, &cols);
    t[k] = (fsdp_tensor_desc_t){.name = names[l][k], .ndim = cols ? 2 : 1,
                                .shape = {rows, cols}};
  }
}

/* A file with text, loaded with a table that takes one flag (--steps). */
static int steps;
static int word(void *ctx, const char *tool, const char *flag, const char *v) {
  (void)ctx, (void)tool, (void)flag, (void)v;
  return 0;
}
static const flag_t table[] = {{"--steps", NULL, FLAG_INT, &steps}};
static const cfg_keys_t keys = {table, 1, word, NULL, NULL, NULL};

static int load(const char *text, cfg_file_t *c) {
  char path[] = "/tmp/test_config_XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  int rc = cfg_load("test", path, &keys, c);
  unlink(path);
  return rc;
}

/* The model's planning as fsdp_llama_create does it, with the options
 * cfg_llama_opts makes of the rules and specs: the plan over the layers, then
 * unit_opts for the root (embed, norm, head unless tied) and for each unit.
 * Returns the plan's units as "name[*] ..." (checkpointed: '*'), or
 * "refused: <c->err>". opts[u] receives unit u's options (root: 0). */
static char units[1024];
static fsdp_unit_opts_t opts[5];
static float lr[5][LLAMA_LAYER_TENSORS], wd[5][LLAMA_LAYER_TENSORS];
static const char *plan_llama(cfg_file_t *c, const char *wrap_kinds, int tied) {
  fsdp_llama_config_t lc = tiny();
  size_t per_layer = 0;
  fsdp_tensor_desc_t lt[4][LLAMA_LAYER_TENSORS];
  for (int l = 0; l < 4; l++) layer_tensors(&lc, l, lt[l]);
  for (int k = 0; k < LLAMA_LAYER_TENSORS; k++)
    per_layer += (size_t)lt[0][k].shape[0] * (size_t)(lt[0][k].ndim == 2 ? lt[0][k].shape[1] : 1);
  fsdp_module_t mods[4];
  char mod_names[4][32];
  for (int l = 0; l < 4; l++) {
    snprintf(mod_names[l], sizeof mod_names[l], "model.layers.%d", l);
    mods[l] = (fsdp_module_t){mod_names[l], "LlamaDecoderLayer", per_layer};
  }
  fsdp_llama_opts_t m = {.wrap_kinds = wrap_kinds};
  fsdp_plan_opts_t po;
  char ckpt[256];
  fsdp_plan_t plan = NULL;
  units[0] = '\0';
  memset(opts, 0, sizeof opts);
  if (cfg_llama_opts(c, &m, tied, &po, ckpt, sizeof ckpt) ||
      fsdp_plan_create(mods, 4, m.plan, &plan) != FSDP_SUCCESS)
    goto refused;
  const int64_t V = lc.vocab_size, C = lc.n_embd;
  fsdp_tensor_desc_t root[] = {{.name = LLAMA_EMBED, .ndim = 2, .shape = {V, C}},
                               {.name = LLAMA_NORM, .ndim = 1, .shape = {C}},
                               {.name = LLAMA_HEAD, .ndim = 2, .shape = {V, C}}};
  opts[0] = (fsdp_unit_opts_t)FSDP_UNIT_OPTS_INIT;
  if (m.unit_opts(m.unit_opts_user, "root", "LlamaForCausalLM", root, tied ? 2 : 3, &opts[0]))
    goto refused;
  for (int u = 0; u < fsdp_plan_num_units(plan); u++) {
    fsdp_plan_unit_t pu;
    ck_assert_int_eq(fsdp_plan_unit(plan, u, &pu), FSDP_SUCCESS);
    snprintf(units + strlen(units), sizeof units - strlen(units), "%s%s%s", u ? " " : "",
             pu.name, pu.checkpoint ? "*" : "");
    fsdp_tensor_desc_t t[2 * LLAMA_LAYER_TENSORS];
    for (int i = 0; i < pu.count; i++)
      memcpy(t + i * LLAMA_LAYER_TENSORS, lt[pu.first + i], sizeof lt[0]);
    opts[u + 1] = (fsdp_unit_opts_t)FSDP_UNIT_OPTS_INIT;
    if (m.unit_opts(m.unit_opts_user, pu.name, pu.kind, t, pu.count * LLAMA_LAYER_TENSORS,
                    &opts[u + 1]))
      goto refused;
    for (int k = 0; opts[u + 1].lr_mult && k < LLAMA_LAYER_TENSORS; k++) /* the first layer's */
      lr[u + 1][k] = opts[u + 1].lr_mult[k], wd[u + 1][k] = opts[u + 1].wd_mult[k];
  }
  if (cfg_check_matched(c, 1) || cfg_check_matched(c, 2)) goto refused;
  fsdp_plan_destroy(plan);
  return units;
refused:
  fsdp_plan_destroy(plan);
  snprintf(units, sizeof units, "refused: %s", c->err[0] ? c->err : fsdp_last_error());
  return units;
}

/* Our own rules read like torchprime's with Hugging Face's names: units and
 * checkpointing "model.layers.*", dtype per unit pattern, parameter groups
 * per tensor pattern. */
START_TEST(rules_over_hf_names) {
  cfg_file_t c;
  ck_assert_int_eq(load("steps: 1\n"
                        "sharding:\n"
                        "  - match: \"model.layers.*\"\n"
                        "    wrap_min_params: 60000\n"
                        "    checkpoint: true\n"
                        "  - match: \"model.layers.2-3\"\n"
                        "    param_dtype: bf16\n"
                        "    reshard_after_forward: false\n"
                        "  - match: \"model.layers.*.self_attn.*\"\n"
                        "    lr_mult: 0.5\n"
                        "  - match: \"*layernorm.weight\"\n"
                        "    wd_mult: 0\n",
                        &c),
                   0);
  ck_assert_str_eq(plan_llama(&c, "LlamaDecoderLayer", 0), "model.layers.0-1* model.layers.2-3*");
  ck_assert_int_eq(opts[1].param_dtype, FSDP_DTYPE_UNSET);
  ck_assert_int_eq(opts[2].param_dtype, FSDP_BF16);
  ck_assert_int_eq(opts[2].reshard_after_forward, 0);
  ck_assert_float_eq(lr[1][LLAMA_Q], 0.5f);
  ck_assert_float_eq(lr[1][LLAMA_O], 0.5f);
  ck_assert_float_eq(lr[1][LLAMA_GATE], 1.0f);
  ck_assert_float_eq(wd[1][LLAMA_ATTN_NORM], 0.0f);
  ck_assert_float_eq(wd[1][LLAMA_MLP_NORM], 0.0f);
  ck_assert_float_eq(wd[1][LLAMA_DOWN], 1.0f);
  ck_assert_int_eq(c.rules[2].hits[2], 16); /* q, k, v, o in 4 layers */
  cfg_free(&c);
}
END_TEST

/* torchprime's llama-fsdp.yaml as it ships: every layer a unit (with no
 * --wrap policy at all), every tensor and output spec met, none refused. */
START_TEST(torchprime_llama_fsdp) {
  char path[1024];
  snprintf(path, sizeof path, "%s/tests/tools/torchprime/llama-fsdp.yaml", src_root);
  for (int tied = 0; tied < 2; tied++) {
    cfg_file_t c;
    ck_assert_int_eq(cfg_load("test", path, &keys, &c), 0);
    ck_assert_int_eq(c.n_specs, 14);
    ck_assert_str_eq(plan_llama(&c, NULL, tied),
                     "model.layers.0 model.layers.1 model.layers.2 model.layers.3");
    for (int i = 0; i < c.n_specs; i++) {
      const cfg_spec_t *s = &c.specs[i];
      int layer = !strncmp(s->name, "model.layers.*", 14), module = !strstr(s->name, ".weight");
      ck_assert_msg(s->hits[module] == (layer ? 4 : 1) && !s->hits[!module], "%s: %d, %d",
                    s->name, s->hits[0], s->hits[1]);
      ck_assert_int_eq(s->units, !strcmp(s->name, "model.layers.*") ? 4 : 0);
    }
    /* the tied head without its alias: lm_head.weight names nothing */
    cfg_model_t m = {NULL, 0, NULL, 3, NULL, NULL, NULL, NULL};
    fsdp_plan_opts_t po;
    char ckpt[64];
    ck_assert_int_eq(cfg_model_opts(&c, &m, &po, ckpt, sizeof ckpt), 0);
    fsdp_unit_opts_t uo = FSDP_UNIT_OPTS_INIT;
    fsdp_tensor_desc_t embed = {.name = LLAMA_EMBED, .ndim = 2, .shape = {256, 64}};
    ck_assert_int_eq(m.unit_opts(m.unit_opts_user, "root", "LlamaForCausalLM", &embed, 1, &uo),
                     FSDP_SUCCESS);
    ck_assert_int_eq(cfg_check_matched(&c, 2), -1);
    ck_assert_msg(strstr(c.err, "llama-fsdp.yaml:7: model.layers.*.self_attn.q_proj.weight "
                         "matches no tensor"), "%s", c.err);
    cfg_free(&c);
  }
}
END_TEST

/* What the Llama names bring out, each named by file:line. */
START_TEST(spec_errors_over_hf_names) {
  static const struct { const char *yaml, *want; } cases[] = {
      {"model.layers.*: [null, null, fsdp]\n",
       ":1: model.layers.*: shards dimension 2 of module 'model.layers.0''s output, not the "
       "batch (dimension 0): 2-D sharding is not supported"},
      {"model.layers.*.self_attn.q_proj.weight: [fsdp]\n",
       ":1: model.layers.*.self_attn.q_proj.weight: 1 entries, but tensor "
       "'model.layers.0.self_attn.q_proj.weight' has 2 dimensions"},
      {"model.layers.*.mlp[0]: [fsdp, null, null]\nmodel.layers.*.mlp.up_proj.weight[0]: [fsdp, null]\n",
       ":2: model.layers.*.mlp.up_proj.weight[0]: [0] picks one of a module's outputs"},
      {"model.norm.weight: [data]\n", ":1: model.norm.weight: tensor 'model.norm.weight' on mesh "
       "axis data"},
      {"model.layers.*: [fsdp, null, null]\nsharding:\n  - match: \"model.layers.*\"\n"
       "    wrap_min_params: 60000\n",
       ":3: rule 1 (match 'model.layers.*') groups by size module 'model.layers.0', but "
       "model.layers.* (line 1) shards its output"},
      {"model.layers.*.self_attn: [fsdp, null, null]\nmodel.layers.x: [fsdp, null, null]\n",
       ":2: model.layers.x matches no tensor and no module"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    cfg_file_t c;
    ck_assert_int_eq(load(cases[i].yaml, &c), 0);
    const char *got = plan_llama(&c, "LlamaDecoderLayer", 0);
    ck_assert_msg(!strncmp(got, "refused: ", 9) && strstr(got, cases[i].want),
                  "case %zu: %s", i, got);
    cfg_free(&c);
  }
}
END_TEST

int main(int argc, char **argv) {
  if (argc > 1) src_root = argv[1];
  Suite *s = suite_create("config");
  TCase *tc = tcase_create("config");
  tcase_add_test(tc, rules_over_hf_names);
  tcase_add_test(tc, torchprime_llama_fsdp);
  tcase_add_test(tc, spec_errors_over_hf_names);
  suite_add_tcase(s, tc);
  return check_run(s);
}
