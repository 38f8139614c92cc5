/* tests/common/ckpt_model.c — the shared test model: units of prime-sized
 * tensors, so shards split tensors at awkward places and some ranks own
 * nothing of a unit, and a loss whose gradient is nonlinear in the weights. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ckpt_model.h"

typedef struct {
  const char *name;
  int64_t dims[2];
  int ndim;
} tdef_t;

/* u0 {wte (1,1009), wpe (1,13)}, u1 {u1.w 7919, u1.b 31}, u2 {u2.w 4001,
 * u2.b 3}, u3 {u3.w 2}: 12978 parameters. */
static const tdef_t tensors[] = {{"wte", {1, 1009}, 2}, {"wpe", {1, 13}, 2},
                                 {"u1.w", {7919, 0}, 1}, {"u1.b", {31, 0}, 1},
                                 {"u2.w", {4001, 0}, 1}, {"u2.b", {3, 0}, 1},
                                 {"u3.w", {2, 0}, 1}};
static const int unit_first[] = {0, 2, 4, 6, 7}; /* tensors of unit u: [first[u], first[u+1]) */
static const int rewrapped_first[] = {0, 4, 7};

static fsdp_tensor_desc_t desc(int i, ckm_variant_t variant) {
  fsdp_tensor_desc_t d = {tensors[i].name, tensors[i].ndim, {tensors[i].dims[0], tensors[i].dims[1], 0, 0},
                          FSDP_INIT_NORMAL, 0.5f, tensors[i].ndim == 1 && i % 2 == 1};
  if (variant == CKM_RESHAPED && i == 2) d.shape[0] -= 1;
  return d;
}

static int add_units(fsdp_engine_t e, ckm_variant_t variant) {
  const int *first = variant == CKM_REWRAPPED ? rewrapped_first : unit_first;
  int n_units = variant == CKM_REWRAPPED ? 2 : 4;
  for (int u = 0; u < n_units; u++) {
    fsdp_tensor_desc_t d[8];
    int n = first[u + 1] - first[u];
    char name[16];
    for (int k = 0; k < n; k++) d[k] = desc(first[u] + k, variant);
    snprintf(name, sizeof name, "u%d", u);
    fsdp_unit_t unit;
    if (fsdp_unit_add(e, name, u == 0 ? "Embed" : "Block", d, n, &unit)) return -1;
  }
  return 0;
}

fsdp_engine_t ckm_create(fsdp_world_t world, fsdp_strategy_t strategy, fsdp_optim_kind_t optim,
                         ckm_variant_t variant, uint64_t seed) {
  return ckm_create_sharded(world, strategy, optim, variant, seed, 0);
}

fsdp_engine_t ckm_create_sharded(fsdp_world_t world, fsdp_strategy_t strategy,
                                 fsdp_optim_kind_t optim, ckm_variant_t variant, uint64_t seed,
                                 int shard_size) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.strategy = strategy;
  c.shard_size = shard_size;
  c.optim.kind = optim;
  c.optim.lr = optim == FSDP_OPTIM_ADAMW ? 1e-2f : 5e-2f;
  c.optim.momentum = 0.9f;
  c.optim.weight_decay = 0.01f;
  c.optim.max_grad_norm = 20.0f;
  c.schedule.kind = FSDP_SCHED_WARMUP_COSINE;
  c.schedule.warmup_steps = 3;
  c.schedule.total_steps = CKM_TOTAL_STEPS;
  fsdp_engine_t e = NULL;
  if (fsdp_engine_create(world, &c, &e) || add_units(e, variant) ||
      fsdp_engine_materialize(e, seed)) {
    fprintf(stderr, "ckm_create: %s\n", fsdp_last_error());
    fsdp_engine_destroy(e);
    return NULL;
  }
  return e;
}

/* d loss / d w for sample k of step s, element i of tensor `name`. */
static float grad_of(float w, int64_t s, int k, const char *name, size_t i, size_t numel) {
  size_t id = ((size_t)s * CKM_GLOBAL_BATCH + (size_t)k) * numel + i;
  float y = fsdp_init_value(777, name, id, FSDP_INIT_UNIFORM, 1.0f);
  return w - y + 0.1f * w * w * w;
}

static void backward_tensor(const fsdp_view_t *v, int t, const fsdp_tensor_info_t *ti, int64_t s,
                            int64_t off, int64_t mb, int reverse) {
  for (size_t i = 0; i < ti->numel; i++) {
    float sum = 0.0f;
    for (int64_t b = 0; b < mb; b++) {
      int k = (int)(off + (reverse ? mb - 1 - b : b));
      sum += grad_of(v->param[t][i], s, k, ti->name, i, ti->numel);
    }
    v->grad[t][i] += sum / (float)mb;
  }
}

static int one_step(fsdp_engine_t e, int64_t s, int reverse) {
  int64_t mb, off;
  int n = fsdp_engine_num_units(e);
  fsdp_view_t v;
  if (fsdp_engine_shard_batch(e, CKM_GLOBAL_BATCH, &mb, &off)) return -1;
  for (int u = 0; u < n; u++)
    if (fsdp_unit_acquire(e, u, FSDP_FORWARD, &v) || fsdp_unit_release(e, u, FSDP_FORWARD))
      return -1;
  for (int u = n - 1; u >= 0; u--) {
    fsdp_unit_info_t info;
    if (fsdp_unit_info(e, u, &info) || fsdp_unit_acquire(e, u, FSDP_BACKWARD, &v)) return -1;
    for (int t = 0; t < info.n_tensors; t++) {
      fsdp_tensor_info_t ti;
      if (fsdp_unit_tensor(e, u, t, &ti)) return -1;
      backward_tensor(&v, t, &ti, s, off, mb, reverse);
    }
    if (fsdp_unit_release(e, u, FSDP_BACKWARD)) return -1;
  }
  return fsdp_engine_step(e, NULL) ? -1 : 0;
}

int ckm_train(fsdp_engine_t e, int steps, int reverse) {
  int64_t s0 = fsdp_engine_step_count(e);
  for (int64_t s = s0; s < s0 + steps; s++)
    if (one_step(e, s, reverse)) {
      fprintf(stderr, "ckm_train: step %lld: %s\n", (long long)s, fsdp_last_error());
      return -1;
    }
  return 0;
}

size_t ckm_snapshot(fsdp_engine_t e, float *out) {
  size_t n = 0;
  for (int u = 0; u < fsdp_engine_num_units(e); u++) {
    fsdp_shard_t s;
    if (fsdp_unit_shard(e, u, &s)) return 0;
    const float *bufs[3] = {s.master, s.m, s.v};
    for (int k = 0; k < 3; k++) {
      if (!bufs[k]) continue;
      if (out) memcpy(out + n, bufs[k], s.capacity * sizeof(float));
      n += s.capacity;
    }
    if (fsdp_unit_shard_release(e, u, 0)) return 0;
  }
  return n;
}

/* ---- comparing checkpoints ------------------------------------------------ */

static int compare_tensor(fsdp_ckpt_t a, fsdp_ckpt_t b, int t, int s, double *dist, int *bitwise) {
  fsdp_ckpt_tensor_t ta, tb;
  if (fsdp_ckpt_tensor(a, t, &ta) || fsdp_ckpt_tensor(b, t, &tb) || strcmp(ta.name, tb.name) ||
      ta.numel != tb.numel)
    return -1;
  float *x = malloc(ta.numel * sizeof(float)), *y = malloc(ta.numel * sizeof(float));
  int rc = x && y && !fsdp_ckpt_read(a, t, s, 0, ta.numel, x) &&
           !fsdp_ckpt_read(b, t, s, 0, ta.numel, y) ? 0 : -1;
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; rc == 0 && i < ta.numel; i++) {
    diff = fmax(diff, fabs((double)x[i] - (double)y[i]));
    scale = fmax(scale, fabs((double)x[i]));
  }
  if (rc == 0 && memcmp(x, y, ta.numel * sizeof(float))) *bitwise = 0;
  if (rc == 0 && diff > 0.0) *dist = fmax(*dist, diff / fmax(scale, 1e-30));
  free(x);
  free(y);
  return rc;
}

int ckm_compare(const char *path_a, const char *path_b, double *dist, int *bitwise) {
  fsdp_ckpt_t a = NULL, b = NULL;
  fsdp_ckpt_info_t ia, ib;
  *dist = 0.0;
  *bitwise = 1;
  int rc = fsdp_ckpt_open(path_a, &a) || fsdp_ckpt_open(path_b, &b) ? -1 : 0;
  if (rc == 0) {
    fsdp_ckpt_info(a, &ia);
    fsdp_ckpt_info(b, &ib);
    rc = ia.n_tensors == ib.n_tensors && ia.n_states == ib.n_states && ia.step == ib.step ? 0 : -1;
  }
  for (int t = 0; rc == 0 && t < ia.n_tensors; t++)
    for (int s = 0; rc == 0 && s < ia.n_states; s++) rc = compare_tensor(a, b, t, s, dist, bitwise);
  if (rc) fprintf(stderr, "ckm_compare %s vs %s: %s\n", path_a, path_b,
                  fsdp_last_error()[0] ? fsdp_last_error() : "different tensors, states or steps");
  fsdp_ckpt_close(a);
  fsdp_ckpt_close(b);
  return rc;
}
