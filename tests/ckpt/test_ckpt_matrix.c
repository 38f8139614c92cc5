/* tests/ckpt/test_ckpt_matrix.c — save at N = a, load at N = b, for every a, b
 * in {1, 2, 3, 4}, ZeRO-3 and ZeRO-2 (saved under one, loaded under either).
 *
 * Run with no arguments it is the driver: it launches itself under
 * `mpirun -np a ... save DIR` for each a, then `mpirun -np b ... load DIR` for
 * each b (an mpirun has one world size), and fails if any run failed.
 *   save: train 10 steps, save (step-10), train 10 more, save (step-20): the run
 *         continued at N = a. At N = 1 also the same 20 steps with every rank's
 *         samples summed in reverse: the fp32 noise floor of the trajectory.
 *   load: into a freshly materialised engine (another seed), load step-10 of
 *         each (a, strategy), save it again and require it bitwise equal to
 *         what was saved (parameters and both AdamW states, through the offline
 *         reader); train 10 steps, save, and compare with step-20 of N = a:
 *         bitwise when b == a (the same reductions), else within 10 x the
 *         noise floor, as the parity test does.
 * Failures are counted on rank 0 and reduced; every run prints one summary.
 *
 * HSDP (hsdp-save, hsdp-load): saved under 2 x 2 (config.shard_size 2 at
 * N = 4: the first shard group writes, in the format of a world of 2), loaded
 * at N = 3 and at 1 x 4 and saved again: the same state bit for bit, and the
 * same bytes once consolidated by fsdp-ckpt; and back, N = 3's checkpoint
 * loaded under 2 x 2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/ckpt_model.h"

static const fsdp_strategy_t strategies[] = {FSDP_FULL_SHARD, FSDP_SHARD_GRAD_OP};

static int save_run(fsdp_world_t w, const char *dir, fsdp_strategy_t s, int reverse) {
  char path[512];
  int n = fsdp_world_size(w);
  snprintf(path, sizeof path, "%s/%s%d-%s", dir, reverse ? "noise" : "a", n, fsdp_strategy_name(s));
  fsdp_engine_t e = ckm_create(w, s, FSDP_OPTIM_ADAMW, CKM_BASE, 5);
  int rc = !e || ckm_train(e, 10, reverse) || fsdp_ckpt_save(e, path, NULL, NULL, 0) ||
           ckm_train(e, 10, reverse) || fsdp_ckpt_save(e, path, NULL, NULL, 0);
  if (rc && e) fprintf(stderr, "save %s: %s\n", path, fsdp_last_error());
  fsdp_engine_destroy(e);
  return rc ? 1 : 0;
}

static int do_save(fsdp_world_t w, const char *dir) {
  int failed = 0;
  for (int i = 0; i < 2; i++) {
    failed += save_run(w, dir, strategies[i], 0);
    if (fsdp_world_size(w) == 1) failed += save_run(w, dir, strategies[i], 1);
  }
  return failed;
}

static double worst; /* largest distance seen after 10 more steps at b != a */

/* Rank 0 compares; the verdict is its alone (the files are shared). */
static int check(int rank, const char *what, const char *a, const char *b, double tol) {
  double dist;
  int bitwise;
  if (rank != 0) return 0;
  if (ckm_compare(a, b, &dist, &bitwise)) return 1;
  if (tol > 0.0 && dist > worst) worst = dist;
  int ok = tol == 0.0 ? bitwise : dist <= tol;
  if (!ok) printf("FAIL %s: %s vs %s: distance %.3g (tolerance %.3g, bitwise %d)\n", what, a, b,
                  dist, tol, bitwise);
  return !ok;
}

typedef struct {
  const char *dir;
  int a, b, rank;
  fsdp_strategy_t saved, live;
  double tol; /* for b != a */
} load_case_t;

static int load_run(fsdp_world_t w, const load_case_t *c) {
  char src[512], out[512];
  snprintf(src, sizeof src, "%s/a%d-%s", c->dir, c->a, fsdp_strategy_name(c->saved));
  snprintf(out, sizeof out, "%s/b%d-from-a%d-%s-as-%s", c->dir, c->b, c->a,
           fsdp_strategy_name(c->saved), fsdp_strategy_name(c->live));
  char step10[600], step20[600], mine10[600], mine20[600];
  snprintf(step10, sizeof step10, "%s/step-10", src);
  snprintf(step20, sizeof step20, "%s/step-20", src);
  snprintf(mine10, sizeof mine10, "%s/step-10", out);
  snprintf(mine20, sizeof mine20, "%s/step-20", out);
  fsdp_engine_t e = ckm_create(w, c->live, FSDP_OPTIM_ADAMW, CKM_BASE, 99);
  if (!e || fsdp_ckpt_load(e, step10, NULL, NULL, NULL, 0) || fsdp_ckpt_save(e, out, NULL, NULL, 0)) {
    fprintf(stderr, "load %s at N=%d: %s\n", step10, c->b, fsdp_last_error());
    fsdp_engine_destroy(e);
    return 1;
  }
  int failed = check(c->rank, "state after load", step10, mine10, 0.0);
  if (ckm_train(e, 10, 0) || fsdp_ckpt_save(e, out, NULL, NULL, 0)) failed++;
  failed += check(c->rank, "10 more steps", step20, mine20, c->a == c->b ? 0.0 : c->tol);
  fsdp_engine_destroy(e);
  return failed;
}

static int do_load(fsdp_world_t w, const char *dir) {
  load_case_t c = {dir, 0, fsdp_world_size(w), fsdp_world_rank(w), 0, 0, 0.0};
  int failed = 0;
  for (int i = 0; i < 2; i++) {
    char ref[512], noise[512];
    double floor_dist = 0.0;
    int bitwise;
    snprintf(ref, sizeof ref, "%s/a1-%s/step-20", dir, fsdp_strategy_name(strategies[i]));
    snprintf(noise, sizeof noise, "%s/noise1-%s/step-20", dir, fsdp_strategy_name(strategies[i]));
    if (ckm_compare(ref, noise, &floor_dist, &bitwise)) return failed + 1;
    c.saved = strategies[i];
    /* A floor of exactly 0 would make the bound meaningless: 1e-7 is fp32's. */
    c.tol = 10.0 * (floor_dist > 1e-7 ? floor_dist : 1e-7);
    if (c.rank == 0 && c.b == 1) printf("noise floor (%s): %.3g -> tolerance %.3g\n",
                                        fsdp_strategy_name(c.saved), floor_dist, c.tol);
    for (c.a = 1; c.a <= 4; c.a++)
      for (int k = 0; k < 2; k++) {
        c.live = strategies[k];
        failed += load_run(w, &c);
      }
  }
  return failed;
}

/* HSDP: train 10 steps under 2 x 2 and save (N = 4 only), twice. */
static int do_hsdp_save(fsdp_world_t w, const char *dir) {
  char path[512];
  snprintf(path, sizeof path, "%s/hsdp-2x2", dir);
  fsdp_engine_t e = ckm_create_sharded(w, FSDP_FULL_SHARD, FSDP_OPTIM_ADAMW, CKM_BASE, 5, 2);
  /* Saved twice: the second finds step-10 committed with this very state and
   * keeps it (every rank compares what its shard group 0 counterpart wrote). */
  int rc = !e || ckm_train(e, 10, 0) || fsdp_ckpt_save(e, path, NULL, NULL, 0) ||
           fsdp_ckpt_save(e, path, NULL, NULL, 0);
  if (rc) fprintf(stderr, "hsdp save %s: %s\n", path, fsdp_last_error());
  fsdp_engine_destroy(e);
  return rc;
}

/* Loads `from` into a fresh engine with shard_size, saves it as `to`, and
 * requires the same state bit for bit. */
static int hsdp_reload(fsdp_world_t w, const char *dir, const char *from, const char *to,
                       int shard_size) {
  char src[512], out[512], mine[600];
  snprintf(src, sizeof src, "%s/%s/step-10", dir, from);
  snprintf(out, sizeof out, "%s/%s", dir, to);
  snprintf(mine, sizeof mine, "%s/step-10", out);
  fsdp_engine_t e =
      ckm_create_sharded(w, FSDP_FULL_SHARD, FSDP_OPTIM_ADAMW, CKM_BASE, 99, shard_size);
  int rc = !e || fsdp_ckpt_load(e, src, NULL, NULL, NULL, 0) ||
           fsdp_ckpt_save(e, out, NULL, NULL, 0);
  if (rc) fprintf(stderr, "hsdp load %s as %s: %s\n", src, to, fsdp_last_error());
  fsdp_engine_destroy(e);
  return rc || check(fsdp_world_rank(w), to, src, mine, 0.0);
}

/* N = 3: from 2 x 2 (plain); N = 4: from 2 x 2 as 1 x 4, and N = 3's as 2 x 2. */
static int do_hsdp_load(fsdp_world_t w, const char *dir) {
  if (fsdp_world_size(w) == 3) return hsdp_reload(w, dir, "hsdp-2x2", "n3-from-2x2", 0);
  return hsdp_reload(w, dir, "hsdp-2x2", "1x4-from-2x2", 4) +
         hsdp_reload(w, dir, "n3-from-2x2", "2x2-from-n3", 2);
}

static int worker(const char *mode, const char *dir) {
  fsdp_world_t w;
  if (fsdp_world_init(&w, NULL)) return fprintf(stderr, "%s\n", fsdp_last_error()), 1;
  int failed = !strcmp(mode, "save")        ? do_save(w, dir)
               : !strcmp(mode, "hsdp-save") ? do_hsdp_save(w, dir)
               : !strcmp(mode, "hsdp-load") ? do_hsdp_load(w, dir)
                                            : do_load(w, dir);
  double f = failed, total = 0;
  fsdp_comm_t comm;
  if (fsdp_comm_create(w, &comm) == FSDP_SUCCESS) {
    fsdp_all_reduce(comm, &f, &total, 1, FSDP_F64, FSDP_SUM, FSDP_HOST_STREAM);
    fsdp_comm_destroy(comm);
  } else {
    total = 1;
  }
  if (fsdp_world_rank(w) == 0 && !strncmp(mode, "hsdp", 4))
    printf("%s at N=%d: %s\n", mode, fsdp_world_size(w), total ? "FAIL" : "ok");
  else if (fsdp_world_rank(w) == 0 && strcmp(mode, "save"))
    printf("load at N=%d: %s (%.0f failures; after 10 more steps the largest distance from "
           "the run continued at N = a != %d is %.3g)\n", fsdp_world_size(w),
           total ? "FAIL" : "ok", total, fsdp_world_size(w), worst);
  else if (fsdp_world_rank(w) == 0)
    printf("save at N=%d: %s\n", fsdp_world_size(w), total ? "FAIL" : "ok");
  fsdp_world_destroy(w);
  return total ? 1 : 0;
}

static int launch(const char *mpirun, const char *self, int np, const char *mode, const char *dir) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s --oversubscribe --bind-to none -np %d %s %s %s", mpirun, np, self,
           mode, dir);
  int rc = system(cmd);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 1;
}

/* fsdp-ckpt consolidate of each HSDP checkpoint: every file byte-identical. */
static int consolidated_equal(const char *fsdp_ckpt, const char *dir) {
  static const char *const runs[] = {"hsdp-2x2", "n3-from-2x2", "1x4-from-2x2", "2x2-from-n3"};
  char cmd[2048];
  for (int i = 0; i < 4; i++) {
    snprintf(cmd, sizeof cmd, "%s consolidate %s/%s/step-10 %s/%s.safetensors", fsdp_ckpt, dir,
             runs[i], dir, runs[i]);
    if (system(cmd) != 0) return printf("FAIL %s\n", cmd), 1;
    if (i == 0) continue;
    snprintf(cmd, sizeof cmd, "cmp %s/%s.safetensors %s/%s.safetensors", dir, runs[0], dir,
             runs[i]);
    if (system(cmd) != 0) return printf("FAIL consolidated bytes differ: %s\n", cmd), 1;
  }
  printf("hsdp: consolidated checkpoints of 2x2, N=3, 1x4 and 2x2 again are byte-identical\n");
  return 0;
}

static int hsdp_round_trip(const char *mpirun, const char *self, const char *fsdp_ckpt,
                           const char *dir) {
  if (launch(mpirun, self, 4, "hsdp-save", dir) || launch(mpirun, self, 3, "hsdp-load", dir) ||
      launch(mpirun, self, 4, "hsdp-load", dir))
    return 1;
  return consolidated_equal(fsdp_ckpt, dir);
}

int main(int argc, char **argv) {
  if (argc == 3 && (!strcmp(argv[1], "save") || !strcmp(argv[1], "load") ||
                    !strncmp(argv[1], "hsdp-", 5)))
    return worker(argv[1], argv[2]);
  if (argc != 3) return fprintf(stderr, "usage: %s MPIRUN FSDP_CKPT | MODE DIR\n", argv[0]), 2;
  char dir[] = "/tmp/fsdp-ckpt-matrix-XXXXXX";
  if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
  int failed = hsdp_round_trip(argv[1], argv[0], argv[2], dir);
  for (int np = 1; np <= 4; np++) failed += launch(argv[1], argv[0], np, "save", dir) != 0;
  for (int np = 1; np <= 4 && !failed; np++) failed += launch(argv[1], argv[0], np, "load", dir) != 0;
  char rm[600];
  snprintf(rm, sizeof rm, "rm -rf %s", dir);
  if (!failed && system(rm) != 0) fprintf(stderr, "could not remove %s\n", dir);
  if (failed) printf("left %s for inspection\n", dir);
  return failed ? 1 : 0;
}
