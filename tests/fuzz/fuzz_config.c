/* tests/fuzz/fuzz_config.c — libFuzzer target: the tools' YAML configuration
 * file (src/tools/config.c) read with a flag table of every value type, its
 * keys applied as flags (src/tools/flags.c), its rules and partition specs
 * planned over a two-block model's modules and tensors, and printed back. */
#include "fuzz_file.h"
#include "tools/config.h"

static int word(void *ctx, const char *tool, const char *flag, const char *v) {
  static const char *const known[] = {"--strategy", "--dtype"};
  (void)ctx;
  if (!v) return flags_known(flag, known, 2);
  if (!strcmp(flag, "--strategy")) {
    fsdp_strategy_t s;
    return fsdp_strategy_parse(v, &s) == FSDP_SUCCESS ? 0 : -1;
  }
  fsdp_config_t cfg = FSDP_CONFIG_INIT;
  int rc = flags_config_word(tool, flag, v, &cfg);
  return rc > 0 ? -1 : rc;
}

/* The rules and specs against modules "h.0", "h.1" and their tensors, as a
 * model's planning would meet them. */
static void plan(cfg_file_t *c) {
  static const fsdp_module_t mods[] = {{"h.0", "GPT2Block", 10}, {"h.1", "GPT2Block", 10}};
  fsdp_tensor_desc_t t[] = {{.name = "wte", .ndim = 2, .shape = {8, 4}},
                            {.name = "h.0.attn.c_attn.weight", .ndim = 2, .shape = {12, 4}},
                            {.name = "h.1.ln_1.bias", .ndim = 1, .shape = {4}}};
  static const char *const tied[] = {"lm_head.weight", "wte", NULL};
  cfg_model_t m = {"GPT2Block", 0, NULL, 3, tied, NULL, NULL, NULL};
  fsdp_plan_opts_t po;
  char ckpt[512];
  if (cfg_model_opts(c, &m, &po, ckpt, sizeof ckpt)) return;
  for (int i = 0; m.plan && i < 2; i++) m.plan->wrap_fn(m.plan->wrap_user, mods, 2, i, 0);
  fsdp_unit_opts_t uo = FSDP_UNIT_OPTS_INIT;
  if (m.unit_opts) m.unit_opts(m.unit_opts_user, "root", "GPT2Model", t, 3, &uo);
  cfg_check_matched(c, 1);
  cfg_check_matched(c, 2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_write("config.yaml", data, size, NULL);
  int steps = 0, layers = 1, json = 0;
  int64_t seed = 0, batch = -1;
  size_t min_params = 0;
  float lr = 0;
  const char *text = NULL, *wrap = "GPT2Block";
  const flag_t table[] = {
      {"--steps", NULL, FLAG_INT, &steps},        {"--layers", NULL, FLAG_POS, &layers},
      {"--seed", NULL, FLAG_I64, &seed},          {"--global-batch", NULL, FLAG_I64_32, &batch},
      {"--wrap-min-params", NULL, FLAG_SIZE, &min_params},
      {"--lr", NULL, FLAG_F32, &lr},              {"--data", NULL, FLAG_STR, &text},
      {"--json", NULL, FLAG_SET, &json},          {"--no-wrap", NULL, FLAG_CLEAR, &wrap},
      {"--wrap", NULL, FLAG_STR, &wrap}};
  size_t n = sizeof table / sizeof table[0];
  cfg_keys_t keys = {table, n, word, NULL, cfg_bench_only, "fsdp-bench"};
  cfg_file_t c;
  if (cfg_load("fuzz", path, &keys, &c) == 0 && cfg_apply("fuzz", &c, table, n, word, NULL) == 0) {
    FILE *out = fopen("/dev/null", "w");
    cfg_check_matched(&c, 0);
    plan(&c);
    if (out) cfg_print_rules(out, &c), cfg_print_matches(out, &c), fclose(out);
  }
  cfg_free(&c);
  return 0;
}
