/* tests/unit/test_plan.c — the library's wrap policies (fsdp/plan.h): the
 * plans each policy makes and the errors they name; and a user's own
 * three-module model, written here against the public API alone, that lets a
 * kind policy and a callback policy cut it into units and trains a step
 * through the engine with either plan, getting the same loss and parameters. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/check_run.h"
#include "common/solo_world.h"
#include "fsdp/fsdp.h"

static const fsdp_module_t mods[] = {
    {"embed", "Embedding", 100}, {"blk.0", "Block", 300}, {"blk.1", "Block", 300},
    {"blk.2", "Block", 300},     {"head", "Linear", 50}};
enum { NM = 5 };

static fsdp_plan_t make(const fsdp_plan_opts_t *o) {
  fsdp_plan_t p;
  ck_assert_msg(fsdp_plan_create(mods, NM, o, &p) == FSDP_SUCCESS, "%s", fsdp_last_error());
  return p;
}

/* "unit:first+count ..." with "-" for a module in the root. */
static void expect(fsdp_plan_t p, const char *names, const int *unit_of) {
  char got[256] = "";
  for (int u = 0; u < fsdp_plan_num_units(p); u++) {
    fsdp_plan_unit_t pu;
    ck_assert_int_eq(fsdp_plan_unit(p, u, &pu), FSDP_SUCCESS);
    snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s%s", u ? " " : "", pu.name,
             pu.checkpoint ? "*" : "");
  }
  ck_assert_str_eq(got, names);
  for (int m = 0; m < NM; m++) ck_assert_int_eq(fsdp_plan_unit_of(p, m), unit_of[m]);
  fsdp_plan_destroy(p);
}

START_TEST(built_in_policies) {
  fsdp_plan_opts_t o = FSDP_PLAN_OPTS_INIT;
  expect(make(&o), "", (int[]){-1, -1, -1, -1, -1});
  o.wrap_kinds = "Block";
  o.checkpoint_names = "blk.1";
  expect(make(&o), "blk.0 blk.1* blk.2", (int[]){-1, 0, 1, 2, -1});
  o = (fsdp_plan_opts_t)FSDP_PLAN_OPTS_INIT;
  o.wrap_names = "blk.[02], head"; /* spaces around items are dropped */
  o.wrap_kinds = "Embedding";
  expect(make(&o), "embed blk.0 blk.2 head", (int[]){0, 1, -1, 2, 3});
  /* size: 100+300 < 500 joins blk.1 (700); blk.2 + head = 350 < 500 stays in the root */
  o = (fsdp_plan_opts_t)FSDP_PLAN_OPTS_INIT;
  o.wrap_min_params = 500;
  expect(make(&o), "embed-blk.1", (int[]){0, 0, 0, -1, -1});
  o.wrap_min_params = 600; /* blk.0 + blk.1 share a prefix: "blk.0-1" */
  fsdp_module_t two[] = {{"blk.0", "Block", 300}, {"blk.1", "Block", 300}};
  fsdp_plan_t p;
  ck_assert_int_eq(fsdp_plan_create(two, 2, &o, &p), FSDP_SUCCESS);
  fsdp_plan_unit_t pu;
  ck_assert_int_eq(fsdp_plan_unit(p, 0, &pu), FSDP_SUCCESS);
  ck_assert_str_eq(pu.name, "blk.0-1");
  ck_assert_uint_eq(pu.numel, 600);
  fsdp_plan_destroy(p);
}
END_TEST

/* Blocks in pairs, the rest in the root: what no built-in policy does. */
static fsdp_wrap_t pairs(void *user, const fsdp_module_t *m, int n, int i, size_t open) {
  int *calls = user;
  (*calls)++;
  ck_assert_int_eq(n, NM);
  if (strcmp(m[i].kind, "Block")) return FSDP_WRAP_SKIP;
  return open == m[i].numel && i > 0 && !strcmp(m[i - 1].kind, "Block") ? FSDP_WRAP_JOIN
                                                                         : FSDP_WRAP_UNIT;
}

START_TEST(callback_policy) {
  int calls = 0;
  fsdp_plan_opts_t o = FSDP_PLAN_OPTS_INIT;
  o.wrap_fn = pairs;
  o.wrap_user = &calls;
  expect(make(&o), "blk.0-1 blk.2", (int[]){-1, 0, 0, 1, -1});
  ck_assert_int_eq(calls, NM);
}
END_TEST

static fsdp_wrap_t join_first(void *user, const fsdp_module_t *m, int n, int i, size_t open) {
  (void)user, (void)m, (void)n, (void)i, (void)open;
  return FSDP_WRAP_JOIN;
}

static void refused(const fsdp_plan_opts_t *o, const char *a, const char *b) {
  fsdp_plan_t p = NULL;
  ck_assert_int_eq(fsdp_plan_create(mods, NM, o, &p), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_null(p);
  ck_assert_msg(strstr(fsdp_last_error(), a) && strstr(fsdp_last_error(), b), "'%s' lacks '%s' "
                "or '%s'", fsdp_last_error(), a, b);
}

START_TEST(policy_errors) {
  fsdp_plan_opts_t o = FSDP_PLAN_OPTS_INIT;
  o.wrap_kinds = "Block,Attention";
  refused(&o, "no module of kind 'Attention'", "Embedding, Block, Linear");
  o = (fsdp_plan_opts_t)FSDP_PLAN_OPTS_INIT;
  o.wrap_names = "h.*";
  refused(&o, "wrap_names: pattern 'h.*' matches no module", "embed");
  o.wrap_min_params = 10;
  refused(&o, "give one of", "wrap_min_params (10)");
  o = (fsdp_plan_opts_t)FSDP_PLAN_OPTS_INIT;
  o.wrap_fn = join_first;
  refused(&o, "module 'embed' joins", "first module");
  o = (fsdp_plan_opts_t)FSDP_PLAN_OPTS_INIT;
  o.wrap_kinds = "Block";
  o.checkpoint_kinds = "Linear";
  refused(&o, "checkpoint: module 'head'", "wrap it");
  o.checkpoint_kinds = NULL;
  o.magic = 0; /* not from FSDP_PLAN_OPTS_INIT */
  refused(&o, "fsdp_plan_opts_t", "FSDP_PLAN_OPTS_INIT");
  ck_assert_int_eq(fsdp_pattern_match("h.*.attn.*", "h.3.attn.c_attn.weight"), 1);
  ck_assert_int_eq(fsdp_pattern_match("h.*", "wte"), 0);
}
END_TEST

/* List items of any length are matched whole: a 300-character pattern is
 * not cut to a prefix that names another module (which picked the wrong
 * module, silently). */
START_TEST(long_list_items) {
  char shorter[256], longer[301], kind[401], names[700];
  memset(shorter, 'a', sizeof shorter - 1);
  shorter[sizeof shorter - 1] = '\0';
  memset(longer, 'a', sizeof longer - 1);
  longer[sizeof longer - 1] = '\0';
  memset(kind, 'K', sizeof kind - 1);
  kind[sizeof kind - 1] = '\0';
  const fsdp_module_t m[] = {{shorter, "Block", 10}, {longer, kind, 10}, {"tail", "Block", 10}};
  fsdp_plan_opts_t o = FSDP_PLAN_OPTS_INIT;
  o.wrap_names = longer;
  fsdp_plan_t p;
  ck_assert_msg(fsdp_plan_create(m, 3, &o, &p) == FSDP_SUCCESS, "%s", fsdp_last_error());
  ck_assert_int_eq(fsdp_plan_num_units(p), 1);
  ck_assert_int_eq(fsdp_plan_unit_of(p, 0), -1);
  ck_assert_int_eq(fsdp_plan_unit_of(p, 1), 0);
  fsdp_plan_destroy(p);
  o = (fsdp_plan_opts_t)FSDP_PLAN_OPTS_INIT;
  o.wrap_kinds = kind;
  snprintf(names, sizeof names, " tail , %s", longer);
  o.checkpoint_names = names;
  ck_assert_msg(fsdp_plan_create(m, 3, &o, &p) == FSDP_ERR_INVALID_ARGUMENT,
                "'tail' is checkpointed but in no unit");
  o.checkpoint_names = longer;
  ck_assert_msg(fsdp_plan_create(m, 3, &o, &p) == FSDP_SUCCESS, "%s", fsdp_last_error());
  fsdp_plan_unit_t pu;
  ck_assert_int_eq(fsdp_plan_unit(p, 0, &pu), FSDP_SUCCESS);
  ck_assert_str_eq(pu.name, longer);
  ck_assert_int_eq(pu.checkpoint, 1);
  fsdp_plan_destroy(p);
}
END_TEST

/* ---- a user's model: x (B,4) -> linear 8, relu -> linear 8, relu -> linear 3,
 * softmax cross-entropy. Its modules are its three layers. --------------- */

enum { B = 4, IN = 4, HID = 8, OUT = 3 };
static const int widths[4] = {IN, HID, HID, OUT};
static const fsdp_module_t layers[3] = {
    {"embed", "Linear", HID * IN + HID}, {"hidden", "Linear", HID * HID + HID},
    {"head", "Linear", OUT * HID + OUT}};

typedef struct {
  fsdp_engine_t eng;
  fsdp_plan_t plan;
  fsdp_unit_t root, units[3]; /* root: -1 when every layer has a unit */
  int slot[3];                /* first tensor of layer m in its unit's view */
  fsdp_view_t root_view, views[3];
  float act[4][B * HID];      /* act[m]: layer m's input; act[3] logits */
} user_model_t;

static void describe(int m, fsdp_tensor_desc_t *d, char names[2][32]) {
  snprintf(names[0], 32, "%s.weight", layers[m].name);
  snprintf(names[1], 32, "%s.bias", layers[m].name);
  d[0] = (fsdp_tensor_desc_t){names[0], 2, {widths[m + 1], widths[m]}, FSDP_INIT_UNIFORM, 0.5f, 0};
  d[1] = (fsdp_tensor_desc_t){names[1], 1, {widths[m + 1]}, FSDP_INIT_UNIFORM, 0.1f, 1};
}

/* The root (the layers no unit takes) first, then the plan's units. */
static void user_register(user_model_t *u) {
  fsdp_tensor_desc_t d[6];
  char names[3][2][32];
  int n = 0;
  u->root = -1;
  for (int m = 0; m < 3; m++)
    if (fsdp_plan_unit_of(u->plan, m) < 0) u->slot[m] = n, describe(m, &d[n], names[m]), n += 2;
  if (n) ck_assert_int_eq(fsdp_unit_add(u->eng, "root", "UserModel", d, n, &u->root), 0);
  for (int k = 0; k < fsdp_plan_num_units(u->plan); k++) {
    fsdp_plan_unit_t pu;
    ck_assert_int_eq(fsdp_plan_unit(u->plan, k, &pu), FSDP_SUCCESS);
    for (int m = pu.first; m < pu.first + pu.count; m++)
      u->slot[m] = 2 * (m - pu.first), describe(m, &d[2 * (m - pu.first)], names[m]);
    ck_assert_int_eq(fsdp_unit_add(u->eng, pu.name, pu.kind, d, 2 * pu.count, &u->units[k]), 0);
  }
}

static fsdp_view_t *view_of(user_model_t *u, int m) {
  int k = fsdp_plan_unit_of(u->plan, m);
  return k < 0 ? &u->root_view : &u->views[k];
}

/* Acquires (or releases) layer m's unit where it begins (or ends) in pass. */
static void edge(user_model_t *u, int m, fsdp_pass_t pass, int at_start) {
  int k = fsdp_plan_unit_of(u->plan, m);
  if (k < 0) return;
  fsdp_plan_unit_t pu;
  fsdp_plan_unit(u->plan, k, &pu);
  int first = pass == FSDP_FORWARD ? pu.first : pu.first + pu.count - 1;
  int last = pass == FSDP_FORWARD ? pu.first + pu.count - 1 : pu.first;
  if (at_start && m == first)
    ck_assert_int_eq(fsdp_unit_acquire(u->eng, u->units[k], pass, &u->views[k]), 0);
  if (!at_start && m == last) ck_assert_int_eq(fsdp_unit_release(u->eng, u->units[k], pass), 0);
}

static double user_step(user_model_t *u, const float *x, const int *y) {
  if (u->root >= 0) ck_assert_int_eq(fsdp_unit_acquire(u->eng, u->root, FSDP_FORWARD, &u->root_view), 0);
  memcpy(u->act[0], x, sizeof(float) * B * IN);
  for (int m = 0; m < 3; m++) {
    edge(u, m, FSDP_FORWARD, 1);
    const fsdp_view_t *v = view_of(u, m);
    fsdp_linear_forward(u->act[m + 1], u->act[m], v->param[u->slot[m]], v->param[u->slot[m] + 1],
                        B, widths[m], widths[m + 1]);
    if (m < 2) fsdp_relu_forward(u->act[m + 1], u->act[m + 1], (size_t)B * widths[m + 1]);
    edge(u, m, FSDP_FORWARD, 0);
  }
  if (u->root >= 0) ck_assert_int_eq(fsdp_unit_release(u->eng, u->root, FSDP_FORWARD), 0);
  float dout[B * HID], din[B * HID];
  double loss = fsdp_softmax_xent(dout, u->act[3], y, B, OUT, 1.0f / B);
  if (u->root >= 0) ck_assert_int_eq(fsdp_unit_acquire(u->eng, u->root, FSDP_BACKWARD, &u->root_view), 0);
  for (int m = 2; m >= 0; m--) {
    edge(u, m, FSDP_BACKWARD, 1);
    const fsdp_view_t *v = view_of(u, m);
    memset(din, 0, sizeof din);
    fsdp_linear_backward(din, v->grad[u->slot[m]], v->grad[u->slot[m] + 1], dout, u->act[m],
                         v->param[u->slot[m]], B, widths[m], widths[m + 1]);
    memset(dout, 0, sizeof dout);
    if (m > 0) fsdp_relu_backward(dout, u->act[m], din, (size_t)B * widths[m]);
    edge(u, m, FSDP_BACKWARD, 0);
  }
  if (u->root >= 0) ck_assert_int_eq(fsdp_unit_release(u->eng, u->root, FSDP_BACKWARD), 0);
  ck_assert_int_eq(fsdp_engine_step(u->eng, NULL), FSDP_SUCCESS);
  return loss / B;
}

/* Trains two steps under a plan; the parameters after them land in out. */
static void user_train(const fsdp_plan_opts_t *o, int units, double loss[2], float *out) {
  fsdp_world_t w;
  ck_assert_int_eq(solo_world_init(&w), FSDP_SUCCESS);
  user_model_t u = {0};
  fsdp_config_t c = FSDP_CONFIG_INIT;
  ck_assert_int_eq(fsdp_engine_create(w, &c, &u.eng), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_plan_create(layers, 3, o, &u.plan), FSDP_SUCCESS);
  user_register(&u);
  ck_assert_int_eq(fsdp_engine_num_units(u.eng), units);
  ck_assert_int_eq(fsdp_engine_materialize(u.eng, 7), FSDP_SUCCESS);
  float x[B * IN];
  int y[B] = {0, 2, 1, 2};
  for (int i = 0; i < B * IN; i++) x[i] = sinf(0.7f * (float)i);
  for (int s = 0; s < 2; s++) loss[s] = user_step(&u, x, y);
  ck_assert_int_eq(fsdp_engine_read_tensor(u.eng, "hidden.weight", out, 0), FSDP_SUCCESS);
  fsdp_plan_destroy(u.plan);
  fsdp_engine_destroy(u.eng);
  fsdp_world_destroy(w);
}

/* The head with the hidden layer, the first layer left in the root. */
static fsdp_wrap_t tail_pair(void *user, const fsdp_module_t *m, int n, int i, size_t open) {
  (void)user, (void)m, (void)open;
  return i == 0 ? FSDP_WRAP_SKIP : i == n - 1 ? FSDP_WRAP_JOIN : FSDP_WRAP_UNIT;
}

START_TEST(user_model_trains_with_either_plan) {
  fsdp_plan_opts_t by_kind = FSDP_PLAN_OPTS_INIT, by_fn = FSDP_PLAN_OPTS_INIT;
  by_kind.wrap_kinds = "Linear";
  by_fn.wrap_fn = tail_pair;
  double a[2], b[2];
  float wa[HID * HID], wb[HID * HID];
  user_train(&by_kind, 3, a, wa); /* three units, no root */
  user_train(&by_fn, 2, b, wb);   /* root (embed) + "hidden-head" */
  ck_assert(a[1] < a[0]);         /* it learns */
  ck_assert(a[0] == b[0] && a[1] == b[1]);
  ck_assert_mem_eq(wa, wb, sizeof wa);
}
END_TEST

/* The library's MLP under a size policy (fc.0 and fc.1 in one unit, fc.2 in
 * the root) trains exactly as with its default unit per layer. */
static void mlp_train(const fsdp_plan_opts_t *plan, const char *second, double *loss, float *w) {
  fsdp_world_t wd;
  ck_assert_int_eq(solo_world_init(&wd), FSDP_SUCCESS);
  fsdp_engine_t e;
  fsdp_config_t c = FSDP_CONFIG_INIT;
  ck_assert_int_eq(fsdp_engine_create(wd, &c, &e), FSDP_SUCCESS);
  const int mlp_widths[4] = {6, 5, 4, 3};
  fsdp_mlp_t m;
  if (plan) ck_assert_int_eq(fsdp_mlp_create_plan(e, mlp_widths, 3, 4, plan, &m), FSDP_SUCCESS);
  else ck_assert_int_eq(fsdp_mlp_create(e, mlp_widths, 3, 4, &m), FSDP_SUCCESS);
  fsdp_unit_info_t info;
  ck_assert_int_eq(fsdp_unit_info(e, 1, &info), FSDP_SUCCESS);
  ck_assert_str_eq(info.name, second);
  ck_assert_int_eq(fsdp_engine_materialize(e, 3), FSDP_SUCCESS);
  float x[4 * 6];
  int y[4] = {2, 0, 1, 1};
  for (int i = 0; i < 24; i++) x[i] = cosf(0.3f * (float)i);
  for (int s = 0; s < 2; s++) {
    ck_assert_int_eq(fsdp_mlp_forward_backward(m, x, y, 4, 0.25f, &loss[s]), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_engine_step(e, NULL), FSDP_SUCCESS);
  }
  ck_assert_int_eq(fsdp_engine_read_tensor(e, "fc.1.weight", w, 0), FSDP_SUCCESS);
  fsdp_mlp_destroy(m);
  fsdp_engine_destroy(e);
  fsdp_world_destroy(wd);
}

START_TEST(mlp_follows_a_plan) {
  fsdp_plan_opts_t by_size = FSDP_PLAN_OPTS_INIT;
  by_size.wrap_min_params = 50; /* fc.0 35 + fc.1 24 >= 50; fc.2 15 < 50 stays in the root */
  double a[2], b[2];
  float wa[20], wb[20];
  mlp_train(NULL, "fc.1", a, wa);       /* units fc.0 fc.1 fc.2 */
  mlp_train(&by_size, "fc.0-1", b, wb); /* units root (fc.2), fc.0-1 */
  ck_assert(a[0] == b[0] && a[1] == b[1]);
  ck_assert_mem_eq(wa, wb, sizeof wa);
  fsdp_plan_opts_t ckpt = FSDP_PLAN_OPTS_INIT;
  ckpt.wrap_kinds = "Linear";
  ckpt.checkpoint_names = "fc.1";
  fsdp_world_t wd;
  ck_assert_int_eq(solo_world_init(&wd), FSDP_SUCCESS);
  fsdp_engine_t e;
  fsdp_config_t c = FSDP_CONFIG_INIT;
  ck_assert_int_eq(fsdp_engine_create(wd, &c, &e), FSDP_SUCCESS);
  fsdp_mlp_t m;
  const int mlp_widths[4] = {6, 5, 4, 3};
  ck_assert_int_eq(fsdp_mlp_create_plan(e, mlp_widths, 3, 4, &ckpt, &m), FSDP_ERR_UNSUPPORTED);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "unit 'fc.1'"));
  fsdp_engine_destroy(e);
  fsdp_world_destroy(wd);
}
END_TEST

int main(void) {
  Suite *s = suite_create("plan");
  TCase *tc = tcase_create("plan");
  tcase_add_test(tc, built_in_policies);
  tcase_add_test(tc, callback_policy);
  tcase_add_test(tc, policy_errors);
  tcase_add_test(tc, long_list_items);
  tcase_add_test(tc, user_model_trains_with_either_plan);
  tcase_add_test(tc, mlp_follows_a_plan);
  suite_add_tcase(s, tc);
  return check_run(s);
}
