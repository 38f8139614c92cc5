/* tests/ckpt/test_ckpt.c — checkpoints on one rank (no MPI): the strict JSON
 * reader; save/load round trips (AdamW, SGD, another wrapping, a world-3
 * checkpoint read at N = 1); overwrite refusal; every bad input (a truncated,
 * bit-flipped, missing or stray shard, a corrupt manifest, a model of another
 * shape, no `latest`) fails with the file and the problem named, through the
 * library and fsdp-ckpt, and changes nothing in memory or on disk; a save
 * killed mid-write leaves the previous checkpoint current; a save directory
 * shared safely (a live save survives another's sweep, the run lock, `latest`
 * repaired after a full disk and when missing, dangling or a link, the
 * writability and space probe); export -> import is
 * bitwise; strict safetensors validation; consolidate's memory stays flat; a
 * NaN/Inf is never saved and verify reports one.
 * argv[1] is the fsdp-ckpt executable. */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "common/check_run.h"
#include "common/ckpt_model.h"
#include "common/solo_world.h"
#include "core/json.h"

static const char *tool = "fsdp-ckpt";
static fsdp_world_t world;
static char tmp[64];

static void setup(void) {
  ck_assert_int_eq(solo_world_init(&world), FSDP_SUCCESS);
  snprintf(tmp, sizeof tmp, "/tmp/fsdp-ckpt-test-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmp));
}

static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
  ck_assert_int_eq(system(cmd), 0);
  fsdp_world_destroy(world);
}

static const char *path(const char *fmt, const char *a) {
  static char buf[4][512];
  static int k;
  char rel[256];
  snprintf(rel, sizeof rel, fmt, a);
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", tmp, rel);
  return buf[k];
}

static fsdp_engine_t trained(fsdp_strategy_t s, fsdp_optim_kind_t o, int steps) {
  fsdp_engine_t e = ckm_create(world, s, o, CKM_BASE, 5);
  ck_assert_ptr_nonnull(e);
  ck_assert_int_eq(ckm_train(e, steps, 0), 0);
  return e;
}

static float *snapshot(fsdp_engine_t e, size_t *n) {
  *n = ckm_snapshot(e, NULL);
  float *s = malloc(*n * sizeof(float));
  ck_assert_ptr_nonnull(s);
  ckm_snapshot(e, s);
  return s;
}

static void assert_same_state(fsdp_engine_t a, fsdp_engine_t b) {
  size_t na, nb;
  float *sa = snapshot(a, &na), *sb = snapshot(b, &nb);
  ck_assert_uint_eq(na, nb);
  ck_assert_msg(memcmp(sa, sb, na * sizeof(float)) == 0, "engine states differ");
  ck_assert_int_eq(fsdp_engine_step_count(a), fsdp_engine_step_count(b));
  free(sa);
  free(sb);
}

/* ---- JSON ------------------------------------------------------------------------ */

START_TEST(test_json_valid) {
  const char *text = "{\"a\": [1, -2.5e3, \"x\\u00e9\\ud83d\\ude00\\n\"],\n \"b\": {\"c\": null, "
                     "\"d\": true}, \"e\": 9007199254740993}";
  json_t *v;
  ck_assert_int_eq(json_parse(text, strlen(text), "t.json", &v), FSDP_SUCCESS);
  const json_t *a = json_get(v, "a");
  ck_assert_int_eq(a->type, JSON_ARRAY);
  ck_assert_uint_eq(a->n, 3);
  ck_assert_str_eq(a->items[2].text, "x\xc3\xa9\xf0\x9f\x98\x80\n");
  int64_t big;
  ck_assert(json_int(json_get(v, "e"), &big));
  ck_assert(big == 9007199254740993LL); /* exact, not through a double */
  ck_assert(!json_int(&a->items[1], &big));
  ck_assert_int_eq(json_get(v, "b")->line, 2);
  ck_assert_int_eq(json_get(json_get(v, "b"), "d")->boolean, 1);
  json_free(v);
}
END_TEST

static const struct {
  const char *text, *error;
} bad_json[] = {
    {"{\"a\": 1,}", "line 1, column 9: trailing comma"},
    {"{\"a\": 1, \"a\": 2}", "duplicate key \"a\""},
    {"[01]", "leading zero"},
    {"[\"\\x\"]", "invalid escape"},
    {"[\"a\tb\"]", "control character"},
    {"[\"abc", "unterminated string"},
    {"{\"a\": 1} x", "after the end of the document"},
    {"{\"a\"\n: tru}", "line 2, column 3: invalid literal"},
    {"[1 2]", "expected ',' or ']'"},
    {"[\"\\ud800\"]", "surrogate"},
    {"", "expected a value, found the end"},
    {"[1.]", "digits after '.'"},
};

START_TEST(test_json_errors) {
  json_t *v = NULL;
  const char *t = bad_json[_i].text;
  ck_assert_int_eq(json_parse(t, strlen(t), "bad.json", &v), FSDP_ERR_FORMAT);
  ck_assert_ptr_null(v);
  ck_assert_msg(strstr(fsdp_last_error(), "bad.json") && strstr(fsdp_last_error(), bad_json[_i].error),
                "'%s': got '%s'", t, fsdp_last_error());
}
END_TEST

START_TEST(test_json_depth) {
  char deep[200];
  memset(deep, '[', sizeof deep);
  json_t *v = NULL;
  ck_assert_int_eq(json_parse(deep, sizeof deep, "deep.json", &v), FSDP_ERR_FORMAT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "nested deeper"));
}
END_TEST

/* ---- round trips --------------------------------------------------------------------- */

static void round_trip(fsdp_strategy_t saved, fsdp_strategy_t live, fsdp_optim_kind_t o,
                       ckm_variant_t variant) {
  fsdp_engine_t a = trained(saved, o, 7);
  fsdp_ckpt_meta_t meta = {0}, back = {0};
  ck_assert_int_eq(fsdp_ckpt_meta_set(&meta, "seed", -3), FSDP_SUCCESS);
  fsdp_ckpt_save_opts_t so = FSDP_CKPT_SAVE_OPTS_INIT;
  so.meta = &meta;
  char dir[512];
  ck_assert_int_eq(fsdp_ckpt_save(a, path("run", ""), &so, dir, sizeof dir), FSDP_SUCCESS);
  ck_assert_str_eq(dir, path("run/step-7", ""));
  fsdp_engine_t b = ckm_create(world, live, o, variant, 99);
  ck_assert_int_eq(fsdp_ckpt_load(b, path("run", ""), NULL, &back, NULL, 0), FSDP_SUCCESS);
  int64_t seed;
  ck_assert(fsdp_ckpt_meta_get(&back, "seed", &seed) == FSDP_SUCCESS && seed == -3);
  if (variant == CKM_BASE) assert_same_state(a, b);
  ck_assert_int_eq(ckm_train(a, 3, 0), 0);
  ck_assert_int_eq(ckm_train(b, 3, 0), 0);
  if (variant == CKM_BASE) assert_same_state(a, b); /* continues bit for bit */
  ck_assert_int_eq(fsdp_ckpt_save(b, path("again", ""), NULL, NULL, 0), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_ckpt_save(a, path("run", ""), NULL, NULL, 0), FSDP_SUCCESS);
  double d;
  int bitwise;
  ck_assert_int_eq(ckm_compare(path("run", ""), path("again", ""), &d, &bitwise), 0);
  ck_assert_msg(bitwise, "step-10 differs by %g", d);
  fsdp_engine_destroy(a);
  fsdp_engine_destroy(b);
}

START_TEST(test_round_trip_adamw) { round_trip(FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP, FSDP_OPTIM_ADAMW, CKM_BASE); }
END_TEST
START_TEST(test_round_trip_sgd) { round_trip(FSDP_SHARD_GRAD_OP, FSDP_NO_SHARD, FSDP_OPTIM_SGD, CKM_BASE); }
END_TEST
START_TEST(test_round_trip_rewrapped) { round_trip(FSDP_FULL_SHARD, FSDP_FULL_SHARD, FSDP_OPTIM_ADAMW, CKM_REWRAPPED); }
END_TEST

/* Every gradient element = G: one forward and backward over every unit. */
#define G 1e-3f
static void constant_grads(fsdp_engine_t e) {
  fsdp_view_t v;
  int n = fsdp_engine_num_units(e);
  for (int u = 0; u < n; u++) {
    ck_assert_int_eq(fsdp_unit_acquire(e, u, FSDP_FORWARD, &v), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_unit_release(e, u, FSDP_FORWARD), FSDP_SUCCESS);
  }
  for (int u = n - 1; u >= 0; u--) {
    ck_assert_int_eq(fsdp_unit_acquire(e, u, FSDP_BACKWARD, &v), FSDP_SUCCESS);
    for (int t = 0; t < v.n; t++) {
      fsdp_tensor_info_t ti;
      ck_assert_int_eq(fsdp_unit_tensor(e, u, t, &ti), FSDP_SUCCESS);
      for (size_t i = 0; i < ti.numel; i++) v.grad[t][i] = G;
    }
    ck_assert_int_eq(fsdp_unit_release(e, u, FSDP_BACKWARD), FSDP_SUCCESS);
  }
}

/* reset_optim restarts AdamW: the first update after it is a first update
 * (bias corrections of step 1, so m-hat = G and v-hat = G^2), computed here
 * by hand; continuing the old step count would make it about half that. */
static void first_update_after_reset(fsdp_engine_t e) {
  const fsdp_config_t *c = fsdp_engine_config(e);
  fsdp_shard_t s;
  ck_assert_int_eq(fsdp_unit_shard(e, 1, &s), FSDP_SUCCESS);
  float *p0 = malloc(s.count * sizeof(float));
  memcpy(p0, s.master, s.count * sizeof(float));
  float lr = fsdp_schedule_lr(&c->schedule, c->optim.lr, fsdp_engine_step_count(e));
  constant_grads(e);
  fsdp_step_stats_t st;
  ck_assert_int_eq(fsdp_engine_step(e, &st), FSDP_SUCCESS);
  ck_assert(st.clip_coef == 1.0);
  ck_assert_int_eq(fsdp_unit_shard(e, 1, &s), FSDP_SUCCESS);
  const float b1 = c->optim.beta1, b2 = c->optim.beta2;
  const float m = (1.0f - b1) * G, v = (1.0f - b2) * G * G;
  const double step = (double)lr / (1.0 - b1), inv_sqrt_bc2 = 1.0 / sqrt(1.0 - b2);
  fsdp_tensor_info_t w; /* u1.w: decayed, first in the unit */
  ck_assert_int_eq(fsdp_unit_tensor(e, 1, 0, &w), FSDP_SUCCESS);
  ck_assert(!w.no_decay && w.offset == 0 && w.numel <= s.count);
  for (size_t i = 0; i < w.numel; i++) {
    double want = (double)p0[i] * (1.0 - (double)lr * c->optim.weight_decay) -
                  step * m / (sqrt(v) * inv_sqrt_bc2 + c->optim.eps);
    ck_assert_msg(fabs(s.master[i] - want) <= 1e-6 * (fabs(want) + lr),
                  "element %zu after the first AdamW update: %.9g, by hand %.9g (was %.9g, lr "
                  "%g)", i, (double)s.master[i], want, (double)p0[i], (double)lr);
  }
  free(p0);
}

START_TEST(test_optimizer_mismatch) {
  fsdp_engine_t a = trained(FSDP_FULL_SHARD, FSDP_OPTIM_SGD, 4);
  ck_assert_int_eq(fsdp_ckpt_save(a, path("run", ""), NULL, NULL, 0), FSDP_SUCCESS);
  fsdp_engine_t b = ckm_create(world, FSDP_FULL_SHARD, FSDP_OPTIM_ADAMW, CKM_BASE, 99);
  size_t n;
  float *before = snapshot(b, &n);
  ck_assert_int_eq(fsdp_ckpt_load(b, path("run", ""), NULL, NULL, NULL, 0), FSDP_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "reset_optim"));
  float *after = snapshot(b, &n);
  ck_assert(memcmp(before, after, n * sizeof(float)) == 0);
  fsdp_ckpt_load_opts_t lo = FSDP_CKPT_LOAD_OPTS_INIT;
  lo.reset_optim = 1;
  ck_assert_int_eq(fsdp_ckpt_load(b, path("run", ""), &lo, NULL, NULL, 0), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_step_count(b), 4);
  fsdp_shard_t sa, sb;
  ck_assert_int_eq(fsdp_unit_shard(a, 1, &sa), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_unit_shard(b, 1, &sb), FSDP_SUCCESS);
  ck_assert(memcmp(sa.master, sb.master, sa.count * sizeof(float)) == 0);
  for (size_t i = 0; i < sb.capacity; i++) ck_assert(sb.m[i] == 0.0f && sb.v[i] == 0.0f);
  first_update_after_reset(b);
  free(before);
  free(after);
  fsdp_engine_destroy(a);
  fsdp_engine_destroy(b);
}
END_TEST

/* Saving the same state twice keeps the first copy (nothing rewritten); a
 * different state at the same step is refused; overwrite replaces it. */
START_TEST(test_overwrite) {
  fsdp_engine_t a = trained(FSDP_FULL_SHARD, FSDP_OPTIM_ADAMW, 2);
  ck_assert_int_eq(fsdp_ckpt_save(a, path("run", ""), NULL, NULL, 0), FSDP_SUCCESS);
  fsdp_ckpt_t c;
  ck_assert_int_eq(fsdp_ckpt_open(path("run", ""), &c), FSDP_SUCCESS);
  fsdp_ckpt_info_t in;
  fsdp_ckpt_info(c, &in);
  uint64_t id = in.id;
  fsdp_ckpt_close(c);
  ck_assert_int_eq(fsdp_ckpt_save(a, path("run", ""), NULL, NULL, 0), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_ckpt_open(path("run", ""), &c), FSDP_SUCCESS);
  fsdp_ckpt_info(c, &in);
  ck_assert(in.id == id); /* kept, not rewritten */
  fsdp_ckpt_close(c);
  fsdp_engine_t other = ckm_create(world, FSDP_FULL_SHARD, FSDP_OPTIM_ADAMW, CKM_BASE, 7);
  ck_assert_int_eq(ckm_train(other, 2, 0), 0);
  ck_assert_int_eq(fsdp_ckpt_save(other, path("run", ""), NULL, NULL, 0), FSDP_ERR_INVALID_USAGE);
  ck_assert_ptr_nonnull(strstr(fsdp_last_error(), "step-2 already exists and is not this run's "
                                                  "state at step 2"));
  fsdp_ckpt_save_opts_t o = FSDP_CKPT_SAVE_OPTS_INIT;
  o.overwrite = 1;
  ck_assert_int_eq(fsdp_ckpt_save(other, path("run", ""), &o, NULL, 0), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_ckpt_open(path("run", ""), &c), FSDP_SUCCESS);
  fsdp_ckpt_info(c, &in);
  ck_assert(in.id != id);
  ck_assert_int_eq(fsdp_ckpt_verify(c), FSDP_SUCCESS);
  fsdp_ckpt_close(c);
  fsdp_engine_destroy(other);
  fsdp_engine_destroy(a);
}
END_TEST

/* A world-3 checkpoint (resharded) loads at N = 1 and consolidates to the
 * same bytes as the world-1 original; resharding back gives them again. */
START_TEST(test_reshard) {
  fsdp_engine_t a = trained(FSDP_FULL_SHARD, FSDP_OPTIM_ADAMW, 5);
  ck_assert_int_eq(fsdp_ckpt_save(a, path("run", ""), NULL, NULL, 0), FSDP_SUCCESS);
  fsdp_ckpt_t c;
  ck_assert_int_eq(fsdp_ckpt_open(path("run", ""), &c), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_ckpt_reshard(c, 3, path("w3", "")), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_ckpt_consolidate(c, path("one.safetensors", "")), FSDP_SUCCESS);
  fsdp_ckpt_close(c);
  ck_assert_int_eq(fsdp_ckpt_open(path("w3", ""), &c), FSDP_SUCCESS);
  fsdp_ckpt_info_t in;
  fsdp_ckpt_info(c, &in);
  ck_assert_int_eq(in.world_size, 3);
  ck_assert_int_eq(fsdp_ckpt_consolidate(c, path("three.safetensors", "")), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_ckpt_reshard(c, 2, path("w2", "")), FSDP_SUCCESS);
  fsdp_ckpt_close(c);
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "cmp -s %s %s", path("one.safetensors", ""), path("three.safetensors", ""));
  ck_assert_int_eq(system(cmd), 0);
  fsdp_engine_t b = ckm_create(world, FSDP_SHARD_GRAD_OP, FSDP_OPTIM_ADAMW, CKM_BASE, 99);
  ck_assert_int_eq(fsdp_ckpt_load(b, path("w3", ""), NULL, NULL, NULL, 0), FSDP_SUCCESS);
  assert_same_state(a, b);
  double d;
  int bitwise;
  ck_assert_int_eq(ckm_compare(path("run", ""), path("w2", ""), &d, &bitwise), 0);
  ck_assert(bitwise);
  fsdp_engine_destroy(a);
  fsdp_engine_destroy(b);
}
END_TEST

/* ---- bad input -------------------------------------------------------------------- */

/* Names and CRCs of every file under dir, recursively: "nothing on disk changed". */
static void fingerprint(const char *dir, char *out, size_t cap) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "cd %s && find . -type f | sort | xargs cksum 2>/dev/null; "
           "find . -type d | sort", dir);
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = '\0';
  pclose(p);
}

/* Runs fsdp-ckpt; returns its exit status, stderr in err. */
static int run_tool(const char *args, char *err, size_t cap) {
  char cmd[1200], errfile[600];
  snprintf(errfile, sizeof errfile, "%s/tool.err", tmp);
  snprintf(cmd, sizeof cmd, "%s %s > /dev/null 2> %s", tool, args, errfile);
  int rc = system(cmd);
  FILE *f = fopen(errfile, "r");
  size_t n = f ? fread(err, 1, cap - 1, f) : 0;
  err[n] = '\0';
  if (f) fclose(f);
  unlink(errfile);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void flip_bit(const char *file, long at) {
  FILE *f = fopen(file, "r+b");
  ck_assert_ptr_nonnull(f);
  if (at < 0) {
    fseek(f, 0, SEEK_END);
    at = ftell(f) / 2;
  }
  fseek(f, at, SEEK_SET);
  int c = fgetc(f);
  fseek(f, at, SEEK_SET);
  fputc(c ^ 0x10, f);
  fclose(f);
}

static void truncate_one(const char *file) {
  struct stat sb;
  ck_assert_int_eq(stat(file, &sb), 0);
  ck_assert_int_eq(truncate(file, sb.st_size - 1), 0);
}

static void copy_file(const char *from, const char *to) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "cp %s %s", from, to);
  ck_assert_int_eq(system(cmd), 0);
}

typedef enum { BAD_TRUNCATED, BAD_FLIP_SHARD, BAD_FLIP_HEADER, BAD_FLIP_MANIFEST, BAD_MISSING,
               BAD_STRAY, BAD_SHAPE, BAD_NO_LATEST } bad_kind_t;

static const struct {
  bad_kind_t kind;
  const char *file, *problem; /* both must appear in the message */
  int tool_fails;             /* verify needs no model: a shape mismatch passes it */
} bad_cases[] = {
    {BAD_TRUNCATED, "step-20/rank-1-of-3.bin", "truncated", 1},
    {BAD_FLIP_SHARD, "step-20/rank-2-of-3.bin", "CRC-32", 1},
    {BAD_FLIP_HEADER, "step-20/rank-0-of-3.bin", "header is corrupt", 1},
    {BAD_FLIP_MANIFEST, "step-20/manifest.json", "corrupt", 1},
    {BAD_MISSING, "step-20/rank-0-of-3.bin", "missing", 1},
    {BAD_STRAY, "step-20/rank-1-of-3.bin", "stray file from another checkpoint", 1},
    {BAD_SHAPE, "step-20", "is (7919) in the checkpoint but (7918) in the model", 0},
    {BAD_NO_LATEST, "w3/latest", "missing", 1},
};

/* A world-3 save directory with step-10 and step-20 (resharded from N = 1). */
static void make_w3(void) {
  fsdp_engine_t a = trained(FSDP_FULL_SHARD, FSDP_OPTIM_ADAMW, 10);
  ck_assert_int_eq(fsdp_ckpt_save(a, path("run", ""), NULL, NULL, 0), FSDP_SUCCESS);
  ck_assert_int_eq(ckm_train(a, 10, 0), 0);
  ck_assert_int_eq(fsdp_ckpt_save(a, path("run", ""), NULL, NULL, 0), FSDP_SUCCESS);
  fsdp_engine_destroy(a);
  const char *steps[] = {"run/step-10", "run/step-20"};
  for (int i = 0; i < 2; i++) {
    fsdp_ckpt_t c;
    ck_assert_int_eq(fsdp_ckpt_open(path("%s", steps[i]), &c), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_ckpt_reshard(c, 3, path("w3", "")), FSDP_SUCCESS);
    fsdp_ckpt_close(c);
  }
}

static void corrupt(bad_kind_t k, const char *file) {
  switch (k) {
  case BAD_TRUNCATED: truncate_one(file); break;
  case BAD_FLIP_SHARD: flip_bit(file, -1); break;
  case BAD_FLIP_HEADER: flip_bit(file, 17); break;
  case BAD_FLIP_MANIFEST: flip_bit(file, -1); break;
  case BAD_MISSING: ck_assert_int_eq(unlink(file), 0); break;
  case BAD_STRAY: copy_file(path("w3/step-10/rank-1-of-3.bin", ""), file); break;
  case BAD_SHAPE: break;
  case BAD_NO_LATEST: ck_assert_int_eq(unlink(file), 0); break;
  }
}

START_TEST(test_bad_input) {
  make_w3();
  bad_kind_t k = bad_cases[_i].kind;
  const char *file = k == BAD_NO_LATEST ? path("w3/latest", "") : path("w3/%s", bad_cases[_i].file);
  const char *target = k == BAD_NO_LATEST ? path("w3", "") : path("w3/step-20", "");
  corrupt(k, file);
  fsdp_engine_t e = ckm_create(world, FSDP_FULL_SHARD, FSDP_OPTIM_ADAMW,
                               k == BAD_SHAPE ? CKM_RESHAPED : CKM_BASE, 3);
  ck_assert_int_eq(ckm_train(e, 3, 0), 0);
  size_t n;
  float *before = snapshot(e, &n);
  static char fp_before[1 << 16], fp_after[1 << 16];
  fingerprint(tmp, fp_before, sizeof fp_before);

  fsdp_status_t st = fsdp_ckpt_load(e, target, NULL, NULL, NULL, 0);
  ck_assert_int_ne(st, FSDP_SUCCESS);
  const char *msg = fsdp_last_error();
  ck_assert_msg(strstr(msg, k == BAD_SHAPE ? target : file) && strstr(msg, bad_cases[_i].problem),
                "case %d: got '%s'", _i, msg);
  float *after = snapshot(e, &n);
  ck_assert_msg(memcmp(before, after, n * sizeof(float)) == 0, "live state changed");
  ck_assert_int_eq(fsdp_engine_step_count(e), 3);

  char args[700], err[4096];
  snprintf(args, sizeof args, "verify %s", target);
  int rc = run_tool(args, err, sizeof err);
  if (bad_cases[_i].tool_fails)
    ck_assert_msg(rc == 1 && strstr(err, file) && strstr(err, bad_cases[_i].problem),
                  "fsdp-ckpt verify: exit %d, '%s'", rc, err);
  else
    ck_assert_int_eq(rc, 0);
  fingerprint(tmp, fp_after, sizeof fp_after);
  ck_assert_str_eq(fp_before, fp_after);
  ck_assert_int_eq(ckm_train(e, 1, 0), 0); /* the engine still works */
  free(before);
  free(after);
  fsdp_engine_destroy(e);
}
END_TEST

/* ---- crash safety ------------------------------------------------------------------- */

static int has_tmp_dir(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *ent;
  int found = 0;
  while (d && (ent = readdir(d)) != NULL) found |= strstr(ent->d_name, ".tmp-") != NULL;
  if (d) closedir(d);
  return found;
}

static void read_text(const char *file, char *out, size_t cap) {
  FILE *f = fopen(file, "r");
  ck_assert_ptr_nonnull(f);
  size_t n = fread(out, 1, cap - 1, f);
  out[n] = '\0';
  fclose(f);
}

/* The child trains to step 20 and saves with the fault hook armed: it dies
 * after `after_bytes` bytes of the save (in the shard or in the manifest). */
static void crash_at(long after_bytes) {
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    char fault[96];
    snprintf(fault, sizeof fault, "kill:rank=0:step=20:after_bytes=%ld", after_bytes);
    setenv("FSDP_CKPT_FAULT", fault, 1);
    fsdp_engine_t e = ckm_create(world, FSDP_FULL_SHARD, FSDP_OPTIM_ADAMW, CKM_BASE, 5);
    if (!e || ckm_train(e, 20, 0)) _exit(3);
    fsdp_ckpt_save(e, path("run", ""), NULL, NULL, 0);
    _exit(4); /* the hook did not fire */
  }
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child status %d", status);
}

START_TEST(test_crash_mid_save) {
  fsdp_engine_t a = trained(FSDP_FULL_SHARD, FSDP_OPTIM_ADAMW, 10);
  ck_assert_int_eq(fsdp_ckpt_save(a, path("run", ""), NULL, NULL, 0), FSDP_SUCCESS);
  struct stat sb;
  ck_assert_int_eq(stat(path("run/step-10/rank-0-of-1.bin", ""), &sb), 0);
  long points[] = {100, (long)sb.st_size + 40}; /* in the shard; in the manifest */
  for (int i = 0; i < 2; i++) {
    crash_at(points[i]);
    char latest[64];
    read_text(path("run/latest", ""), latest, sizeof latest);
    ck_assert_str_eq(latest, "step-10\n");
    ck_assert_int_ne(stat(path("run/step-20", ""), &sb), 0);
    ck_assert(has_tmp_dir(path("run", "")));
    fsdp_engine_t b = ckm_create(world, FSDP_SHARD_GRAD_OP, FSDP_OPTIM_ADAMW, CKM_BASE, 99);
    ck_assert_int_eq(fsdp_ckpt_load(b, path("run", ""), NULL, NULL, NULL, 0), FSDP_SUCCESS);
    assert_same_state(a, b);
    fsdp_engine_destroy(b);
  }
  ck_assert_int_eq(ckm_train(a, 10, 0), 0);
  ck_assert_int_eq(fsdp_ckpt_save(a, path("run", ""), NULL, NULL, 0), FSDP_SUCCESS);
  ck_assert(!has_tmp_dir(path("run", ""))); /* the next save cleans up */
  char latest[64];
  read_text(path("run/latest", ""), latest, sizeof latest);
  ck_assert_str_eq(latest, "step-20\n");
  fsdp_engine_destroy(a);
}
END_TEST

/* ---- sharing a save directory ------------------------------------------------------ */

static void verify_ok(const char *dir) {
  fsdp_ckpt_t c;
  ck_assert_msg(fsdp_ckpt_open(dir, &c) == FSDP_SUCCESS, "%s", fsdp_last_error());
  ck_assert_msg(fsdp_ckpt_verify(c) == FSDP_SUCCESS, "%s", fsdp_last_error());
  fsdp_ckpt_close(c);
}

/* Two savers into one directory: a save held in the middle of its shard
 * (SIGSTOP by the fault hook, so its guard stays held) keeps its temporary
 * directory through another process's save, and commits once continued. The
 * old sweep deleted every step-*.tmp-*, the live one included. */
START_TEST(test_sweep_keeps_live_save) {
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    setenv("FSDP_CKPT_FAULT", "stop:rank=0:step=20:after_bytes=100", 1);
    fsdp_engine_t e = ckm_create(world, FSDP_FULL_SHARD, FSDP_OPTIM_ADAMW, CKM_BASE, 5);
    if (!e || ckm_train(e, 20, 0)) _exit(3);
    _exit(fsdp_ckpt_save(e, path("run", ""), NULL, NULL, 0) == FSDP_SUCCESS ? 0 : 4);
  }
  int status;
  ck_assert_int_eq(waitpid(pid, &status, WUNTRACED), pid);
  int stopped = WIFSTOPPED(status), live_tmp = has_tmp_dir(path("run", ""));
  fsdp_engine_t a = trained(FSDP_FULL_SHARD, FSDP_OPTIM_ADAMW, 10);
  fsdp_status_t st = fsdp_ckpt_save(a, path("run", ""), NULL, NULL, 0);
  int kept = has_tmp_dir(path("run", ""));
  kill(pid, SIGCONT);
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(stopped && live_tmp, "the held save did not stop with its directory");
  ck_assert_int_eq(st, FSDP_SUCCESS);
  ck_assert_msg(kept, "the other save's sweep removed the live save's directory");
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the held save failed (%d)", status);
  verify_ok(path("run/step-10", ""));
  verify_ok(path("run/step-20", ""));
  ck_assert(!has_tmp_dir(path("run", "")));
  fsdp_engine_destroy(a);
}
END_TEST

/* The run lock: a second holder is refused with the first named (also
 * fsdp-ckpt repair and reshard into the directory); a lock left by a killed
 * process is taken over. */
START_TEST(test_lock) {
  fsdp_ckpt_lock_t a, b;
  ck_assert_int_eq(fsdp_ckpt_lock(NULL, path("run", ""), &a), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_ckpt_lock(NULL, path("run", ""), &b), FSDP_ERR_INVALID_USAGE);
  ck_assert_ptr_null(b);
  char want[96], args[600], err[2048], text[512];
  snprintf(want, sizeof want, "in use by another run (test_ckpt pid %d on host ", (int)getpid());
  ck_assert_msg(strstr(fsdp_last_error(), want), "%s", fsdp_last_error());
  snprintf(args, sizeof args, "repair %s", path("run", ""));
  ck_assert_int_eq(run_tool(args, err, sizeof err), 1);
  ck_assert_msg(strstr(err, want), "%s", err);
  fsdp_engine_t e = trained(FSDP_FULL_SHARD, FSDP_OPTIM_ADAMW, 2);
  ck_assert_int_eq(fsdp_ckpt_save(e, path("src", ""), NULL, NULL, 0), FSDP_SUCCESS);
  fsdp_engine_destroy(e);
  snprintf(args, sizeof args, "reshard %s --world 2 %s", path("src", ""), path("run", ""));
  ck_assert_int_eq(run_tool(args, err, sizeof err), 1);
  ck_assert_msg(strstr(err, want), "%s", err);
  fsdp_ckpt_unlock(a);
  ck_assert_int_eq(run_tool(args, err, sizeof err), 0); /* once released */
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    if (fsdp_ckpt_lock(NULL, path("run", ""), &a)) _exit(3);
    raise(SIGKILL);
  }
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert(WIFSIGNALED(status));
  read_text(path("run/lock", ""), text, sizeof text);
  snprintf(want, sizeof want, "test_ckpt pid %d on host ", (int)pid);
  ck_assert_msg(strstr(text, want), "the dead holder's record: %s", text);
  ck_assert_msg(fsdp_ckpt_lock(NULL, path("run", ""), &b) == FSDP_SUCCESS, "%s", fsdp_last_error());
  fsdp_ckpt_unlock(b);
  read_text(path("run/lock", ""), text, sizeof text);
  ck_assert_str_eq(text, ""); /* released: no holder recorded */
}
END_TEST

static void write_text(const char *file, const char *text) {
  FILE *f = fopen(file, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

/* A full disk while writing `latest` leaves step-15 committed, `latest` at
 * step-10 and an empty latest.tmp. The restart loads step-10, re-runs to 15
 * and saves: the committed step-15 holds exactly that state, so it is kept
 * and `latest` repaired (it used to be refused: "already exists"). */
START_TEST(test_latest_full_disk) {
  fsdp_engine_t a = trained(FSDP_FULL_SHARD, FSDP_OPTIM_ADAMW, 10);
  ck_assert_int_eq(fsdp_ckpt_save(a, path("run", ""), NULL, NULL, 0), FSDP_SUCCESS);
  ck_assert_int_eq(ckm_train(a, 5, 0), 0);
  setenv("FSDP_CKPT_FAULT", "enospc:latest:step=15", 1);
  fsdp_status_t st = fsdp_ckpt_save(a, path("run", ""), NULL, NULL, 0);
  unsetenv("FSDP_CKPT_FAULT");
  ck_assert_int_eq(st, FSDP_ERR_IO);
  ck_assert_msg(strstr(fsdp_last_error(), "latest.tmp: write failed after 0 bytes: No space"),
                "%s", fsdp_last_error());
  char text[64];
  read_text(path("run/latest", ""), text, sizeof text);
  ck_assert_str_eq(text, "step-10\n");
  struct stat sb;
  ck_assert_int_eq(stat(path("run/latest.tmp", ""), &sb), 0);
  ck_assert_int_eq(sb.st_size, 0);
  verify_ok(path("run/step-15", ""));
  fsdp_ckpt_t c;
  fsdp_ckpt_info_t in;
  ck_assert_int_eq(fsdp_ckpt_open(path("run/step-15", ""), &c), FSDP_SUCCESS);
  fsdp_ckpt_info(c, &in);
  uint64_t id = in.id;
  fsdp_ckpt_close(c);

  fsdp_engine_t b = ckm_create(world, FSDP_FULL_SHARD, FSDP_OPTIM_ADAMW, CKM_BASE, 99);
  char dir[512];
  ck_assert_int_eq(fsdp_ckpt_load(b, path("run", ""), NULL, NULL, dir, sizeof dir), FSDP_SUCCESS);
  ck_assert_str_eq(dir, path("run/step-10", ""));
  ck_assert_int_eq(ckm_train(b, 5, 0), 0);
  st = fsdp_ckpt_save(b, path("run", ""), NULL, dir, sizeof dir);
  ck_assert_msg(st == FSDP_SUCCESS, "%s", fsdp_last_error());
  ck_assert_str_eq(dir, path("run/step-15", ""));
  read_text(path("run/latest", ""), text, sizeof text);
  ck_assert_str_eq(text, "step-15\n");
  ck_assert_int_ne(stat(path("run/latest.tmp", ""), &sb), 0);
  ck_assert_int_eq(fsdp_ckpt_open(path("run", ""), &c), FSDP_SUCCESS);
  fsdp_ckpt_info(c, &in);
  ck_assert(in.id == id);
  ck_assert_int_eq(fsdp_ckpt_verify(c), FSDP_SUCCESS);
  fsdp_ckpt_close(c);
  verify_ok(path("run/step-10", ""));
  fsdp_engine_destroy(b);
  fsdp_engine_destroy(a);
}
END_TEST

static void expect_repair(int64_t step, int changed, const char *reason) {
  fsdp_ckpt_repair_t rep;
  ck_assert_msg(fsdp_ckpt_repair(NULL, path("run", ""), &rep) == FSDP_SUCCESS, "%s",
                fsdp_last_error());
  ck_assert_int_eq(rep.step, step);
  ck_assert_int_eq(rep.changed, changed);
  ck_assert_msg(strstr(rep.reason, reason), "reason: %s", rep.reason);
  char text[64], want[64];
  if (!changed) return;
  read_text(path("run/latest", ""), text, sizeof text);
  snprintf(want, sizeof want, "step-%lld\n", (long long)step);
  ck_assert_str_eq(text, want);
}

/* `latest` as a symbolic link to a step resolves (it was "missing"); missing,
 * dangling, lagging or naming an incomplete step, it is repaired from the
 * newest complete step; with no complete step nothing changes. */
START_TEST(test_latest_repair) {
  fsdp_engine_t a = trained(FSDP_FULL_SHARD, FSDP_OPTIM_ADAMW, 10);
  ck_assert_int_eq(fsdp_ckpt_save(a, path("run", ""), NULL, NULL, 0), FSDP_SUCCESS);
  ck_assert_int_eq(ckm_train(a, 5, 0), 0);
  ck_assert_int_eq(fsdp_ckpt_save(a, path("run", ""), NULL, NULL, 0), FSDP_SUCCESS);
  char latest[512], dir[512], args[600], err[2048];
  snprintf(latest, sizeof latest, "%s", path("run/latest", ""));
  ck_assert_int_eq(unlink(latest), 0);
  ck_assert_int_eq(symlink("step-15", latest), 0);
  ck_assert_msg(fsdp_ckpt_resolve(path("run", ""), dir, sizeof dir) == FSDP_SUCCESS, "%s",
                fsdp_last_error());
  ck_assert_ptr_nonnull(strstr(dir, "/run/step-15"));
  verify_ok(path("run", ""));
  snprintf(args, sizeof args, "verify %s", path("run", ""));
  ck_assert_int_eq(run_tool(args, err, sizeof err), 0);
  expect_repair(15, 0, "");
  ck_assert_int_eq(unlink(latest), 0);
  write_text(latest, "step-99\n");
  expect_repair(15, 1, "step-99");
  ck_assert_int_eq(unlink(latest), 0);
  expect_repair(15, 1, "latest: missing");
  ck_assert_int_eq(unlink(latest), 0);
  ck_assert_int_eq(symlink("step-10", latest), 0);
  expect_repair(15, 1, "`latest` named step-10, older than the newest complete step-15");
  ck_assert_int_eq(unlink(path("run/step-15/rank-0-of-1.bin", "")), 0);
  expect_repair(10, 1, "step-15/rank-0-of-1.bin");
  ck_assert_int_eq(unlink(path("run/step-10/rank-0-of-1.bin", "")), 0);
  char before[4096], after[4096];
  fingerprint(path("run", ""), before, sizeof before);
  fsdp_ckpt_repair_t rep;
  ck_assert_int_eq(fsdp_ckpt_repair(NULL, path("run", ""), &rep), FSDP_ERR_FORMAT);
  ck_assert_msg(strstr(fsdp_last_error(), "no complete checkpoint"), "%s", fsdp_last_error());
  fingerprint(path("run", ""), after, sizeof after);
  ck_assert_str_eq(before, after);
  fsdp_engine_destroy(a);
}
END_TEST

/* The probe: a checkpoint's size as saved, no probe file left behind, and a
 * directory that cannot be written is refused naming the rank and the path. */
START_TEST(test_probe) {
  fsdp_engine_t a = trained(FSDP_FULL_SHARD, FSDP_OPTIM_ADAMW, 2);
  uint64_t need = 0, avail = 0;
  ck_assert_msg(fsdp_ckpt_probe(a, path("run", ""), &need, &avail) == FSDP_SUCCESS, "%s",
                fsdp_last_error());
  ck_assert_int_eq(fsdp_ckpt_save(a, path("run", ""), NULL, NULL, 0), FSDP_SUCCESS);
  struct stat s1, s2;
  ck_assert_int_eq(stat(path("run/step-2/rank-0-of-1.bin", ""), &s1), 0);
  ck_assert_int_eq(stat(path("run/step-2/manifest.json", ""), &s2), 0);
  uint64_t saved = (uint64_t)(s1.st_size + s2.st_size);
  ck_assert_msg(need >= saved && need < saved + 8 * 65536, "need %llu, saved %llu",
                (unsigned long long)need, (unsigned long long)saved);
  ck_assert_uint_gt(avail, 0);
  char listing[4096];
  fingerprint(path("run", ""), listing, sizeof listing);
  ck_assert_ptr_null(strstr(listing, ".probe"));
  write_text(path("file", ""), "not a directory\n");
  ck_assert_int_eq(fsdp_ckpt_probe(a, path("file/run", ""), NULL, NULL), FSDP_ERR_IO);
  ck_assert_msg(strstr(fsdp_last_error(), "rank 0: the save directory is not writable: ") &&
                strstr(fsdp_last_error(), "file/run"), "%s", fsdp_last_error());
  fsdp_engine_destroy(a);
}
END_TEST

/* ---- export / import ----------------------------------------------------------------- */

START_TEST(test_export_import) {
  fsdp_engine_t a = trained(FSDP_FULL_SHARD, FSDP_OPTIM_ADAMW, 6);
  ck_assert_int_eq(fsdp_ckpt_save(a, path("run", ""), NULL, NULL, 0), FSDP_SUCCESS);
  char args[1200], err[2048];
  snprintf(args, sizeof args, "export %s %s", path("run", ""), path("e1.safetensors", ""));
  ck_assert_int_eq(run_tool(args, err, sizeof err), 0);
  snprintf(args, sizeof args, "import %s %s", path("e1.safetensors", ""), path("imp", ""));
  ck_assert_msg(run_tool(args, err, sizeof err) == 0, "%s", err);
  snprintf(args, sizeof args, "export %s %s", path("imp", ""), path("e2.safetensors", ""));
  ck_assert_int_eq(run_tool(args, err, sizeof err), 0);
  snprintf(args, sizeof args, "cmp -s %s %s", path("e1.safetensors", ""), path("e2.safetensors", ""));
  ck_assert_int_eq(system(args), 0);
  char head[4096];
  read_text(path("e1.safetensors", ""), head, sizeof head);
  ck_assert_ptr_nonnull(strstr(head + 8, "\"wte.weight\":{\"dtype\":\"F32\",\"shape\":[1,1009]"));
  ck_assert_ptr_nonnull(strstr(head + 8, "\"__metadata__\":{\"format\":\"pt\"}"));

  fsdp_engine_t b = ckm_create(world, FSDP_SHARD_GRAD_OP, FSDP_OPTIM_ADAMW, CKM_BASE, 99);
  ck_assert_int_eq(fsdp_ckpt_load(b, path("imp", ""), NULL, NULL, NULL, 0), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_step_count(b), 0);
  for (int u = 0; u < fsdp_engine_num_units(a); u++) {
    fsdp_shard_t sa, sb;
    ck_assert_int_eq(fsdp_unit_shard(a, u, &sa), FSDP_SUCCESS);
    ck_assert_int_eq(fsdp_unit_shard(b, u, &sb), FSDP_SUCCESS);
    ck_assert(memcmp(sa.master, sb.master, sa.count * sizeof(float)) == 0);
    for (size_t i = 0; i < sb.capacity; i++) ck_assert(sb.m[i] == 0.0f && sb.v[i] == 0.0f);
  }
  fsdp_engine_destroy(a);
  fsdp_engine_destroy(b);
}
END_TEST

/* Writes a safetensors file: header text, then `data` zero bytes. */
static void write_st(const char *file, const char *header, size_t data, int64_t len_delta) {
  FILE *f = fopen(file, "wb");
  ck_assert_ptr_nonnull(f);
  uint64_t n = strlen(header) + (uint64_t)len_delta;
  for (int i = 0; i < 8; i++) fputc((int)(n >> (8 * i)) & 0xff, f);
  fputs(header, f);
  for (size_t i = 0; i < data; i++) fputc(0, f);
  fclose(f);
}

#define ST_A "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"
static const struct {
  const char *header;
  size_t data;
  int64_t len_delta;
  const char *problem; /* NULL: imports */
} st_cases[] = {
    {"{" ST_A "}", 8, 0, NULL},
    {"{" ST_A ",\"h.0.attn.bias\":{\"dtype\":\"BOOL\",\"shape\":[1,3],\"data_offsets\":[8,11]}}",
     11, 0, NULL},
    {"{" ST_A "}", 8, 1000, "header length"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],", 8, 0, "line 1"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, 0, "a gap"},
    {"{" ST_A ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, 0, "overlaps"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, 0, "need 12 bytes"},
    {"{\"a\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0, "not F32, BF16 or F16"},
    {"{\"a\":{\"dtype\":\"Q4\",\"shape\":[4],\"data_offsets\":[0,8]}}", 8, 0, "not a safetensors dtype"},
    {"{" ST_A "}", 12, 0, "trailing bytes"},
    {"{" ST_A "," ST_A "}", 8, 0, "duplicate key"},
    {"{\"__metadata__\":{\"x\":1}," ST_A "}", 8, 0, "must be a string"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8, 0, "exactly"},
    {"{\"wte.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"transformer.wte.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
     16, 0, "maps to a name"},
    {"{" ST_A "}", 8, 200000000, "header length 200000054 is over the limit of 100000000 bytes"},
};

START_TEST(test_safetensors_strict) {
  char file[600]; /* path()'s buffers are reused */
  snprintf(file, sizeof file, "%s", path("in.safetensors", ""));
  write_st(file, st_cases[_i].header, st_cases[_i].data, st_cases[_i].len_delta);
  fsdp_status_t st = fsdp_ckpt_import(file, path("out", ""));
  struct stat sb;
  if (!st_cases[_i].problem) {
    ck_assert_msg(st == FSDP_SUCCESS, "case %d: %s", _i, fsdp_last_error());
    fsdp_ckpt_t c;
    ck_assert_int_eq(fsdp_ckpt_open(path("out", ""), &c), FSDP_SUCCESS);
    fsdp_ckpt_info_t in;
    fsdp_ckpt_info(c, &in);
    ck_assert_int_eq(in.n_tensors, 1); /* the mask buffer is skipped */
    fsdp_ckpt_close(c);
    return;
  }
  ck_assert_int_ne(st, FSDP_SUCCESS);
  ck_assert_msg(strstr(fsdp_last_error(), file) && strstr(fsdp_last_error(), st_cases[_i].problem),
                "case %d: got '%s'", _i, fsdp_last_error());
  ck_assert_int_ne(stat(path("out", ""), &sb), 0); /* nothing written */
  /* nor by fsdp-ckpt, which locks the output (an empty `lock` was left) */
  char args[1200], err[2048];
  snprintf(args, sizeof args, "import %s %s", file, path("out", ""));
  ck_assert_int_ne(run_tool(args, err, sizeof err), 0);
  ck_assert_msg(strstr(err, st_cases[_i].problem), "case %d: fsdp-ckpt said '%s'", _i, err);
  ck_assert_msg(stat(path("out", ""), &sb) != 0, "case %d: fsdp-ckpt import left %s", _i,
                path("out", ""));
  ck_assert_int_eq(mkdir(path("mine", ""), 0755), 0);
  snprintf(args, sizeof args, "import %s %s", file, path("mine", ""));
  ck_assert_int_ne(run_tool(args, err, sizeof err), 0);
  ck_assert_msg(stat(path("mine/lock", ""), &sb) != 0, "case %d: a lock left in a directory "
                "that had none", _i);
}
END_TEST

/* CPU time, not wall time: the bound holds on a loaded machine too. */
static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A GPT-2 of no layers (wte, wpe, ln_f) and `extra` more entries named
 * transformer.extra.<i> of shape [each] after it: the header as the issue's. */
static void write_extras(const char *file, int extra, int each) {
  size_t cap = 64 + (size_t)extra * 96, n = 0, at = 0;
  char *h = malloc(cap);
  ck_assert_ptr_nonnull(h);
  static const char *const names[] = {"transformer.wte.weight", "transformer.wpe.weight",
                                      "transformer.ln_f.weight", "transformer.ln_f.bias"};
  static const char *const shapes[] = {"[2,2]", "[1,2]", "[2]", "[2]"};
  static const size_t bytes[] = {16, 8, 8, 8};
  n += (size_t)snprintf(h + n, cap - n, "{");
  for (int i = 0; i < 4; at += bytes[i], i++)
    n += (size_t)snprintf(h + n, cap - n, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":%s,"
                          "\"data_offsets\":[%zu,%zu]}", i ? "," : "", names[i], shapes[i], at,
                          at + bytes[i]);
  for (int i = 0; i < extra; at += 4 * (size_t)each, i++)
    n += (size_t)snprintf(h + n, cap - n, ",\"transformer.extra.%d\":{\"dtype\":\"F32\","
                          "\"shape\":[%d],\"data_offsets\":[%zu,%zu]}", i, each, at,
                          at + 4 * (size_t)each);
  snprintf(h + n, cap - n, "}");
  write_st(file, h, at, 0);
  free(h);
}

/* Hostile headers in bounded time: 60,000 foreign entries (under the entry
 * limit; compared pairwise they took 11 s of CPU, 10^6 of them hours) refused
 * at the first, and 100,000 (over it) refused before parsing, by the limit. */
START_TEST(test_import_many_entries) {
  static const struct { int extra, each; const char *problem; } cases[] = {
      {60000, 1, "tensor 'transformer.extra.0': is not a tensor of GPT-2"},
      {100000, 0, "the header holds more than 65536 entries, the limit"},
  };
  const char *file = path("many.safetensors", "");
  write_extras(file, cases[_i].extra, cases[_i].each);
  double t0 = cpu_seconds();
  ck_assert_int_eq(fsdp_ckpt_import(file, path("out", "")), FSDP_ERR_FORMAT);
  double took = cpu_seconds() - t0;
  ck_assert_msg(strstr(fsdp_last_error(), cases[_i].problem), "got '%s'", fsdp_last_error());
  ck_assert_msg(took < 2.0, "%d entries took %.2f s of CPU", cases[_i].extra, took);
}
END_TEST

/* A safetensors file with the given header and data bytes. */
static void write_st_data(const char *file, const char *header, const void *data, size_t n) {
  FILE *f = fopen(file, "wb");
  ck_assert_ptr_nonnull(f);
  uint64_t len = strlen(header);
  for (int i = 0; i < 8; i++) fputc((int)(len >> (8 * i)) & 0xff, f);
  fputs(header, f);
  fwrite(data, 1, n, f);
  fclose(f);
}

/* F16 and BF16 become f32 exactly: normal, negative, largest, subnormal,
 * signed zero; an F16 infinity is refused, by its index. */
START_TEST(test_import_converts_16bit) {
  const uint16_t h[8] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x8000, 0x3555, 0x03ff, 0x7c00};
  const float hf[8] = {1.0f, -2.0f, 65504.0f, 0x1p-24f, -0.0f, 0x1.554p-2f, 0x1.ff8p-15f, 0.5f};
  const uint16_t b[2] = {0x3f80, 0xc040};
  const char *header = "{\"a\":{\"dtype\":\"F16\",\"shape\":[8],\"data_offsets\":[0,16]},"
                       "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[16,20]}}";
  uint16_t data[10];
  memcpy(data, h, sizeof h);
  memcpy(data + 8, b, sizeof b);
  write_st_data(path("h.safetensors", ""), header, data, sizeof data);
  ck_assert_int_eq(fsdp_ckpt_import(path("h.safetensors", ""), path("imp", "")), FSDP_ERR_NONFINITE);
  ck_assert_msg(strstr(fsdp_last_error(), "tensor 'a' is inf at index 7"), "%s", fsdp_last_error());
  data[7] = 0x3800; /* 0.5 */
  write_st_data(path("h.safetensors", ""), header, data, sizeof data);
  fsdp_ckpt_io_summary_t sum;
  ck_assert_int_eq(fsdp_ckpt_import_hf(path("h.safetensors", ""), path("imp", ""), NULL, 0, &sum),
                   FSDP_SUCCESS);
  ck_assert_str_eq(sum.dtype, "mixed");
  ck_assert_int_eq(sum.tensors, 2);
  ck_assert_uint_eq(sum.numel, 10);
  fsdp_ckpt_t c;
  float got[8];
  ck_assert_int_eq(fsdp_ckpt_open(path("imp", ""), &c), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_ckpt_read(c, 0, 0, 0, 8, got), FSDP_SUCCESS);
  ck_assert_msg(memcmp(got, hf, sizeof hf) == 0, "F16: %a %a %a %a %a %a %a %a", got[0], got[1],
                got[2], got[3], got[4], got[5], got[6], got[7]);
  ck_assert_int_eq(fsdp_ckpt_read(c, 1, 0, 0, 2, got), FSDP_SUCCESS);
  ck_assert(got[0] == 1.0f && got[1] == -3.0f);
  fsdp_ckpt_close(c);
  /* again into the same place: refused, then --overwrite */
  ck_assert_int_eq(fsdp_ckpt_import_hf(path("h.safetensors", ""), path("imp", ""), NULL, 0, NULL),
                   FSDP_ERR_INVALID_USAGE);
  ck_assert_msg(strstr(fsdp_last_error(), "import --overwrite"), "%s", fsdp_last_error());
  ck_assert_int_eq(fsdp_ckpt_import_hf(path("h.safetensors", ""), path("imp", ""), NULL,
                                       FSDP_CKPT_OVERWRITE, NULL), FSDP_SUCCESS);
}
END_TEST

/* A config.json beside the file that no GPT-2 can have is refused naming the
 * key, before anything is written: a layer count whose tensor count
 * overflows (which once checked no tensor and recorded 300000000 layers),
 * and heads that do not divide the width. */
START_TEST(test_import_config_bounds) {
  static const struct { const char *config, *problem; } cases[] = {
      {"{\"n_layer\":300000000,\"n_head\":1,\"n_embd\":2,\"n_positions\":1,"
       "\"vocab_size\":1}", "\"n_layer\""},
      {"{\"n_layer\":1,\"n_head\":3,\"n_embd\":2,\"n_positions\":1,\"vocab_size\":1}",
       "\"n_head\""},
  };
  const char *header = "{\"ln_f.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  float data[2] = {1, 2};
  for (int i = 0; i < 2; i++) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s", path("hf%s", i ? "1" : "0"));
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    char file[600];
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    write_st_data(file, header, data, sizeof data);
    snprintf(file, sizeof file, "%s/config.json", dir);
    FILE *f = fopen(file, "w");
    ck_assert_ptr_nonnull(f);
    fputs(cases[i].config, f);
    fclose(f);
    ck_assert_int_eq(fsdp_ckpt_import_hf(dir, path("imp%s", i ? "1" : "0"), NULL, 0, NULL),
                     FSDP_ERR_FORMAT);
    ck_assert_msg(strstr(fsdp_last_error(), "config.json") &&
                  strstr(fsdp_last_error(), cases[i].problem), "%d: %s", i, fsdp_last_error());
  }
}
END_TEST

/* lm_head.weight equal to wte is the tied head (accepted, not imported); one
 * that differs is refused naming the element, and nothing is written. */
START_TEST(test_import_head) {
  const char *header = "{\"transformer.wte.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],"
                       "\"data_offsets\":[0,16]},\"lm_head.weight\":{\"dtype\":\"F32\","
                       "\"shape\":[2,2],\"data_offsets\":[16,32]}}";
  float data[8] = {1, 2, 3, 4, 1, 2, 3, 4};
  write_st_data(path("t.safetensors", ""), header, data, sizeof data);
  ck_assert_int_eq(fsdp_ckpt_import(path("t.safetensors", ""), path("tied", "")), FSDP_SUCCESS);
  fsdp_ckpt_t c;
  fsdp_ckpt_info_t in;
  ck_assert_int_eq(fsdp_ckpt_open(path("tied", ""), &c), FSDP_SUCCESS);
  fsdp_ckpt_info(c, &in);
  ck_assert_int_eq(in.n_tensors, 1);
  fsdp_ckpt_close(c);
  data[6] = 3.5f;
  write_st_data(path("u.safetensors", ""), header, data, sizeof data);
  ck_assert_int_eq(fsdp_ckpt_import(path("u.safetensors", ""), path("untied", "")), FSDP_ERR_FORMAT);
  ck_assert_msg(strstr(fsdp_last_error(), "'lm_head.weight' differs from 'transformer.wte.weight' "
                       "at element 2 (3.5 vs 3)"), "%s", fsdp_last_error());
  struct stat sb;
  ck_assert_int_ne(stat(path("untied", ""), &sb), 0);
}
END_TEST

/* ---- non-finite values -------------------------------------------------------------- */

/* A NaN or Inf planted in the parameters (or AdamW's exp_avg) of u1.w at index
 * 100: the save is refused naming tensor, state and index, nothing is written
 * and `latest` stays at the last good step. */
START_TEST(test_save_refuses_nonfinite) {
  const float bad = _i % 2 ? INFINITY : NAN;
  fsdp_engine_t e = trained(FSDP_FULL_SHARD, FSDP_OPTIM_ADAMW, 2);
  ck_assert_int_eq(fsdp_ckpt_save(e, path("run", ""), NULL, NULL, 0), FSDP_SUCCESS);
  ck_assert_int_eq(ckm_train(e, 1, 0), 0);
  fsdp_shard_t s;
  ck_assert_int_eq(fsdp_unit_shard(e, 1, &s), FSDP_SUCCESS);
  (_i < 2 ? s.master : s.m)[100] = bad;
  ck_assert_int_eq(fsdp_engine_set_step(e, fsdp_engine_step_count(e)), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_ckpt_save(e, path("run", ""), NULL, NULL, 0), FSDP_ERR_NONFINITE);
  const char *msg = fsdp_last_error();
  ck_assert_msg(strstr(msg, "'u1.w'") && strstr(msg, "index 100") && strstr(msg, "step 3") &&
                strstr(msg, _i < 2 ? "param" : "exp_avg"), "message: %s", msg);
  struct stat sb;
  ck_assert_int_ne(stat(path("run/step-3", ""), &sb), 0);
  char latest[64] = "";
  read_text(path("run/latest", ""), latest, sizeof latest);
  ck_assert_msg(!strncmp(latest, "step-2", 6), "latest is '%s'", latest);
  DIR *d = opendir(path("run", ""));
  struct dirent *ent;
  while ((ent = readdir(d)) != NULL)
    ck_assert_msg(!strstr(ent->d_name, ".tmp"), "left behind: %s", ent->d_name);
  closedir(d);
  fsdp_engine_destroy(e);
}
END_TEST

/* One unit, fp16 parameters (loss scaling on by default) or f32 (off). */
static fsdp_engine_t scaler_engine(fsdp_dtype_t dtype) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  c.param_dtype = dtype;
  fsdp_engine_t e;
  ck_assert_int_eq(fsdp_engine_create(world, &c, &e), FSDP_SUCCESS);
  fsdp_tensor_desc_t t = {"w", 1, {37}, FSDP_INIT_NORMAL, 0.1f, 0};
  fsdp_unit_t u;
  ck_assert_int_eq(fsdp_unit_add(e, "u", "Block", &t, 1, &u), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_materialize(e, 1), FSDP_SUCCESS);
  return e;
}

/* The loss scale and its good-step count come back bit for bit (a scale that
 * is not a power of two, as a user's growth factor makes); an engine without
 * loss scaling ignores them; an f32 run's checkpoint has none. */
START_TEST(test_loss_scale_round_trip) {
  const double scale = 1234.5678901234567;
  fsdp_engine_t a = scaler_engine(FSDP_F16), b = scaler_engine(FSDP_F16);
  fsdp_engine_t f32 = scaler_engine(FSDP_F32);
  ck_assert_int_eq(fsdp_engine_set_scaler_state(a, scale, 7), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_ckpt_save(a, path("s", ""), NULL, NULL, 0), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_ckpt_load(b, path("s", ""), NULL, NULL, NULL, 0), FSDP_SUCCESS);
  double got;
  int64_t good;
  ck_assert_int_eq(fsdp_engine_scaler_state(b, &got, &good), FSDP_SUCCESS);
  ck_assert_msg(got == scale && good == 7, "restored %.17g, %lld", got, (long long)good);
  ck_assert_int_eq(fsdp_ckpt_load(f32, path("s", ""), NULL, NULL, NULL, 0), FSDP_SUCCESS);
  ck_assert(fsdp_engine_loss_scale(f32) == 1.0);
  char text[4096] = "";
  ck_assert_int_eq(fsdp_ckpt_save(f32, path("t", ""), NULL, NULL, 0), FSDP_SUCCESS);
  read_text(path("t/step-0/manifest.json", ""), text, sizeof text);
  ck_assert_ptr_null(strstr(text, "loss_scaler"));
  fsdp_engine_destroy(a);
  fsdp_engine_destroy(b);
  fsdp_engine_destroy(f32);
}
END_TEST

/* The CRC-32 (zlib's) of a whole file. */
static uint32_t file_crc(const char *file) {
  FILE *f = fopen(file, "rb");
  ck_assert_ptr_nonnull(f);
  unsigned char buf[4096];
  uLong c = crc32(0, Z_NULL, 0);
  for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) c = crc32(c, buf, (uInt)n);
  fclose(f);
  return (uint32_t)c;
}

/* Writes floats into a one-rank checkpoint's shard at element `at` and
 * reseals it: the shard's CRC in the manifest, then the manifest's own, so
 * that only the values are wrong (the way a checkpoint with NaN would look if
 * a writer let one through). */
static void poke_values(const char *step_dir, size_t at, const float *v, size_t n) {
  char shard[600], manifest[600], text[8192];
  snprintf(shard, sizeof shard, "%s/rank-0-of-1.bin", step_dir);
  snprintf(manifest, sizeof manifest, "%s/manifest.json", step_dir);
  int fd = open(shard, O_WRONLY);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(pwrite(fd, v, n * sizeof *v, (off_t)(64 + at * sizeof *v)),
                   (ssize_t)(n * sizeof *v));
  close(fd);
  read_text(manifest, text, sizeof text);
  char *crc = strstr(text, "\"crc32\": \""), hex[9];
  ck_assert_ptr_nonnull(crc);
  snprintf(hex, sizeof hex, "%08" PRIx32, file_crc(shard));
  memcpy(crc + strlen("\"crc32\": \""), hex, 8);
  char *key = strstr(text, "\n  \"manifest_crc32\": \"");
  ck_assert_ptr_nonnull(key);
  snprintf(hex, sizeof hex, "%08" PRIx32,
           (uint32_t)crc32(0, (const Bytef *)text, (uInt)(key - text + 1)));
  memcpy(key + strlen("\n  \"manifest_crc32\": \""), hex, 8);
  FILE *f = fopen(manifest, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

/* Weights with a NaN and an Inf: import refuses them, naming the tensor and
 * the first index, and writes nothing (they once imported silently, and
 * training then skipped steps blaming the learning rate). verify, through
 * the library and fsdp-ckpt, names the tensor, the count and the first index
 * of a checkpoint holding them, and fails. */
START_TEST(test_verify_reports_nonfinite) {
  char file[600]; /* path()'s buffers are reused */
  snprintf(file, sizeof file, "%s", path("nan.safetensors", ""));
  const char *header = "{\"a\":{\"dtype\":\"F32\",\"shape\":[5],\"data_offsets\":[0,20]}}";
  const float data[5] = {1.0f, 2.0f, NAN, 3.0f, -INFINITY};
  write_st_data(file, header, data, sizeof data);
  struct stat sb;
  ck_assert_int_eq(fsdp_ckpt_import(file, path("imp", "")), FSDP_ERR_NONFINITE);
  ck_assert_msg(strstr(fsdp_last_error(), "tensor 'a' is nan at index 2"), "%s", fsdp_last_error());
  ck_assert_int_ne(stat(path("imp", ""), &sb), 0);
  char args[700], err[2048];
  snprintf(args, sizeof args, "import %s %s", file, path("imp", ""));
  ck_assert_int_ne(run_tool(args, err, sizeof err), 0);
  ck_assert_msg(strstr(err, "tensor 'a' is nan at index 2"), "fsdp-ckpt said: %s", err);
  ck_assert_int_ne(stat(path("imp", ""), &sb), 0);

  const float fine[5] = {1.0f, 2.0f, 7.0f, 3.0f, 4.0f};
  write_st_data(file, header, fine, sizeof fine);
  ck_assert_msg(fsdp_ckpt_import(file, path("imp", "")) == FSDP_SUCCESS, "%s", fsdp_last_error());
  poke_values(path("imp/step-0", ""), 2, data + 2, 3);
  fsdp_ckpt_t c;
  ck_assert_int_eq(fsdp_ckpt_open(path("imp", ""), &c), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_ckpt_verify(c), FSDP_ERR_NONFINITE);
  ck_assert_msg(strstr(fsdp_last_error(), "a (param): 2 of 5, first at index 2"), "message: %s",
                fsdp_last_error());
  fsdp_ckpt_close(c);
  snprintf(args, sizeof args, "verify %s", path("imp", ""));
  ck_assert_int_ne(run_tool(args, err, sizeof err), 0);
  ck_assert_msg(strstr(err, "2 non-finite values") && strstr(err, "first at index 2"),
                "fsdp-ckpt said: %s", err);
}
END_TEST

/* ---- consolidate streams ----------------------------------------------------------- */

/* Peak RSS of fsdp-ckpt (its own --stats) consolidating a model whose
 * parameters alone are 32 MiB (96 MiB with AdamW state): it streams through a
 * fixed buffer. */
START_TEST(test_consolidate_memory) {
  fsdp_config_t c = FSDP_CONFIG_INIT;
  fsdp_engine_t e;
  ck_assert_int_eq(fsdp_engine_create(world, &c, &e), FSDP_SUCCESS);
  fsdp_tensor_desc_t t[] = {{"big.0", 1, {1 << 22}, FSDP_INIT_NORMAL, 1.0f, 0},
                            {"big.1", 1, {1 << 22}, FSDP_INIT_NORMAL, 1.0f, 0}};
  fsdp_unit_t u;
  ck_assert_int_eq(fsdp_unit_add(e, "big", "Big", t, 2, &u), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_engine_materialize(e, 1), FSDP_SUCCESS);
  ck_assert_int_eq(fsdp_ckpt_save(e, path("run", ""), NULL, NULL, 0), FSDP_SUCCESS);
  fsdp_engine_destroy(e);
  char args[1200], err[512];
  snprintf(args, sizeof args, "--stats consolidate %s %s", path("run", ""),
           path("all.safetensors", ""));
  ck_assert_int_eq(run_tool(args, err, sizeof err), 0);
  struct stat sb;
  ck_assert_int_eq(stat(path("all.safetensors", ""), &sb), 0);
  ck_assert_int_gt(sb.st_size, 3 * (32 << 20));
  double secs, mib;
  ck_assert_msg(sscanf(err, "fsdp-ckpt: %lf s, peak RSS %lf MiB", &secs, &mib) == 2, "%s", err);
  ck_assert_msg(mib > 0 && mib < 16, "peak RSS %.1f MiB", mib);
}
END_TEST

static Suite *ckpt_suite(void) {
  Suite *s = suite_create("ckpt");
  TCase *tc = tcase_create("json");
  tcase_add_test(tc, test_json_valid);
  tcase_add_loop_test(tc, test_json_errors, 0, sizeof bad_json / sizeof bad_json[0]);
  tcase_add_test(tc, test_json_depth);
  suite_add_tcase(s, tc);
  tc = tcase_create("files");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_round_trip_adamw);
  tcase_add_test(tc, test_round_trip_sgd);
  tcase_add_test(tc, test_round_trip_rewrapped);
  tcase_add_test(tc, test_optimizer_mismatch);
  tcase_add_test(tc, test_overwrite);
  tcase_add_test(tc, test_reshard);
  tcase_add_loop_test(tc, test_bad_input, 0, sizeof bad_cases / sizeof bad_cases[0]);
  tcase_add_test(tc, test_crash_mid_save);
  tcase_add_test(tc, test_sweep_keeps_live_save);
  tcase_add_test(tc, test_lock);
  tcase_add_test(tc, test_latest_full_disk);
  tcase_add_test(tc, test_latest_repair);
  tcase_add_test(tc, test_probe);
  tcase_add_test(tc, test_export_import);
  tcase_add_loop_test(tc, test_safetensors_strict, 0, sizeof st_cases / sizeof st_cases[0]);
  tcase_add_test(tc, test_import_converts_16bit);
  tcase_add_test(tc, test_import_head);
  tcase_add_test(tc, test_import_config_bounds);
  tcase_add_loop_test(tc, test_import_many_entries, 0, 2);
  tcase_add_test(tc, test_consolidate_memory);
  tcase_add_loop_test(tc, test_save_refuses_nonfinite, 0, 4);
  tcase_add_test(tc, test_verify_reports_nonfinite);
  tcase_add_test(tc, test_loss_scale_round_trip);
  suite_add_tcase(s, tc);
  return s;
}

int main(int argc, char **argv) {
  if (argc > 1) tool = argv[1];
  return check_run(ckpt_suite());
}
