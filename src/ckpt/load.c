/* src/ckpt/load.c — the collective load: resolve, check everything (manifest,
 * model, headers, sizes, CRCs shared out across ranks) and agree, and only then
 * read each rank's new elements from whichever old files hold them. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/ckpt_internal.h"

/* ---- resolving a path ------------------------------------------------------------ */

static int is_file(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* `latest` as a symbolic link to a step directory (made by hand or by other
 * tools): the step is the link's target. */
static int is_step_link(const char *latest) {
  struct stat sb;
  char manifest[CKPT_PATH_MAX];
  return lstat(latest, &sb) == 0 && S_ISLNK(sb.st_mode) && stat(latest, &sb) == 0 &&
         S_ISDIR(sb.st_mode) && !ckpt_path(manifest, sizeof manifest, "%s/" CKPT_MANIFEST, latest) &&
         is_file(manifest);
}

static fsdp_status_t read_latest(const char *dir, const char *latest, char *out, size_t cap) {
  char *text;
  size_t len;
  FSDP_TRY(ckpt_read_whole(latest, &text, &len));
  char *end;
  int ok = len > 6 && !strncmp(text, "step-", 5) && text[5] >= '0' && text[5] <= '9';
  if (ok) {
    strtoll(text + 5, &end, 10);
    ok = !strcmp(end, "\n") || !*end;
  }
  if (ok && *end) *end = '\0';
  fsdp_status_t st = ok ? ckpt_path(out, cap, "%s/%s", dir, text)
                        : fsdp_error(FSDP_ERR_FORMAT, "%s: does not hold 'step-<k>' (corrupt)", latest);
  free(text);
  return st;
}

fsdp_status_t fsdp_ckpt_resolve(const char *path, char *step_dir, size_t cap) {
  char probe[CKPT_PATH_MAX];
  struct stat sb;
  if (!path || !path[0] || !step_dir)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_ckpt_resolve: no path given");
  if (stat(path, &sb) != 0)
    return fsdp_error(FSDP_ERR_IO, "%s: no such checkpoint directory (%s)", path, strerror(errno));
  FSDP_TRY(ckpt_path(probe, sizeof probe, "%s/" CKPT_MANIFEST, path));
  if (is_file(probe)) return ckpt_path(step_dir, cap, "%s", path);
  FSDP_TRY(ckpt_path(probe, sizeof probe, "%s/latest", path));
  char target[PATH_MAX];
  if (is_step_link(probe) && realpath(probe, target)) return ckpt_path(step_dir, cap, "%s", target);
  if (!is_file(probe))
    return fsdp_error(FSDP_ERR_IO, "%s: missing, and %s has no " CKPT_MANIFEST ": no committed "
                      "checkpoint here (pass a step directory such as %s/step-<k>)", probe, path,
                      path);
  return read_latest(path, probe, step_dir, cap);
}

/* ---- does the checkpoint fit the model? ------------------------------------------ */

static void shape_text(char *out, size_t cap, int ndim, const int64_t *shape) {
  size_t n = (size_t)snprintf(out, cap, "(");
  for (int d = 0; d < ndim && n < cap; d++)
    n += (size_t)snprintf(out + n, cap - n, "%s%" PRId64, d ? ", " : "", shape[d]);
  if (n < cap) snprintf(out + n, cap - n, ")");
}

static fsdp_status_t match_tensor(const ckpt_manifest_t *m, const fsdp_tensor_info_t *ti) {
  int t = ckpt_find_tensor(m, ti->name);
  if (t < 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: the model's tensor '%s' is not in this "
                      "checkpoint (a different model?)", m->dir, ti->name);
  const ckpt_tensor_t *c = &m->tensors[t];
  if (c->ndim != ti->ndim || memcmp(c->shape, ti->shape, (size_t)c->ndim * sizeof c->shape[0])) {
    char a[96], b[96];
    shape_text(a, sizeof a, c->ndim, c->shape);
    shape_text(b, sizeof b, ti->ndim, ti->shape);
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: tensor '%s' is %s in the checkpoint but %s "
                      "in the model (a model of a different shape)", m->dir, ti->name, a, b);
  }
  return FSDP_SUCCESS;
}

static fsdp_status_t match_model(fsdp_engine_t e, const ckpt_manifest_t *m) {
  int live = 0;
  for (int u = 0; u < fsdp_engine_num_units(e); u++) {
    fsdp_unit_info_t info;
    FSDP_TRY(fsdp_unit_info(e, u, &info));
    for (int i = 0; i < info.n_tensors; i++, live++) {
      fsdp_tensor_info_t ti;
      FSDP_TRY(fsdp_unit_tensor(e, u, i, &ti));
      FSDP_TRY(match_tensor(m, &ti));
    }
  }
  for (int t = 0; live != m->n_tensors && t < m->n_tensors; t++)
    if (fsdp_engine_find_tensor(e, m->tensors[t].name, NULL, NULL) != FSDP_SUCCESS)
      return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: checkpoint tensor '%s' is not in the "
                        "model (a different model?)", m->dir, m->tensors[t].name);
  return FSDP_SUCCESS;
}

/* 1: load the state; 0: zero it (weights-only checkpoint, or asked to). */
static fsdp_status_t match_optimizer(fsdp_engine_t e, const ckpt_manifest_t *m,
                                     const fsdp_ckpt_load_opts_t *o, int *load_state) {
  const char *kind = fsdp_engine_config(e)->optim.kind == FSDP_OPTIM_SGD ? "sgd" : "adamw";
  int states = ckpt_engine_states(e);
  *load_state = m->n_states > 1;
  if (!*load_state || (states == m->n_states && !strcmp(kind, m->optimizer))) return FSDP_SUCCESS;
  if (o->reset_optim) return *load_state = 0, FSDP_SUCCESS;
  return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: holds %s state (%d buffers per element), but "
                    "the engine runs %s with %d: load with reset_optim to take the parameters and "
                    "start the optimizer state from zero", m->dir, m->optimizer, m->n_states - 1,
                    kind, states - 1);
}

/* ---- reading into the live shards ------------------------------------------------ */

static fsdp_status_t fill_shard(fsdp_engine_t e, int u, ckpt_files_t *f, int load_state,
                                const fsdp_shard_t *sh) {
  const fsdp_shard_t s = *sh;
  fsdp_unit_info_t info;
  FSDP_TRY(fsdp_unit_info(e, u, &info));
  size_t lo = s.offset < info.numel ? s.offset : info.numel, hi = lo + s.count;
  float *bufs[CKPT_MAX_STATES] = {s.master, s.m, s.v};
  int n_states = load_state ? f->m->n_states : 1;
  for (int i = 0; i < info.n_tensors; i++) {
    fsdp_tensor_info_t ti;
    FSDP_TRY(fsdp_unit_tensor(e, u, i, &ti));
    size_t a = ti.offset > lo ? ti.offset : lo;
    size_t b = ti.offset + ti.numel < hi ? ti.offset + ti.numel : hi;
    int t = ckpt_find_tensor(f->m, ti.name);
    for (int k = 0; a < b && k < n_states; k++)
      FSDP_TRY(ckpt_read_elems(f, t, k, a - ti.offset, b - a, bufs[k] + (a - s.offset)));
  }
  for (int k = 1; !load_state && k < CKPT_MAX_STATES; k++)
    if (bufs[k]) memset(bufs[k], 0, s.capacity * sizeof(float));
  return FSDP_SUCCESS;
}

/* Unit by unit: the shard's host copies (CUDA) exist for one unit at a time,
 * and go to the device once filled. */
static fsdp_status_t fill_unit(fsdp_engine_t e, int u, ckpt_files_t *f, int load_state) {
  fsdp_shard_t s;
  FSDP_TRY(fsdp_unit_shard(e, u, &s));
  fsdp_status_t st = fill_shard(e, u, f, load_state, &s);
  fsdp_status_t rs = fsdp_unit_shard_release(e, u, st == FSDP_SUCCESS);
  return st ? st : rs;
}

static fsdp_status_t fill_engine(fsdp_engine_t e, ckpt_files_t *f, int load_state) {
  for (int u = 0; u < fsdp_engine_num_units(e); u++) {
    fsdp_status_t st = fill_unit(e, u, f, load_state);
    if (st)
      return fsdp_error(st, "%s (after verification: the engine's state is partly overwritten; "
                        "load a checkpoint again before training)", fsdp_last_error());
  }
  return FSDP_SUCCESS;
}

/* ---- the collective load ---------------------------------------------------------- */

static fsdp_status_t check_local(fsdp_engine_t e, const char *path, const fsdp_ckpt_load_opts_t *o,
                                 ckpt_manifest_t *m, ckpt_files_t *f, int *load_state) {
  char dir[CKPT_PATH_MAX];
  FSDP_TRY(ckpt_engine_idle(e, "fsdp_ckpt_load"));
  FSDP_TRY(fsdp_ckpt_resolve(path, dir, sizeof dir));
  FSDP_TRY(ckpt_manifest_read(dir, m));
  FSDP_TRY(match_model(e, m));
  FSDP_TRY(match_optimizer(e, m, o, load_state));
  FSDP_TRY(ckpt_files_init(f, m));
  for (int r = 0; r < m->world; r++) FSDP_TRY(ckpt_check_file(f, r, 0));
  return FSDP_SUCCESS;
}

/* Each rank checks the CRCs of files rank, rank + N, ...: one read in all. */
static fsdp_status_t check_crcs(ckpt_files_t *f, int rank, int nranks) {
  for (int r = rank; r < f->m->world; r += nranks) FSDP_TRY(ckpt_check_file(f, r, 1));
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_ckpt_load(fsdp_engine_t e, const char *path, const fsdp_ckpt_load_opts_t *opts,
                             fsdp_ckpt_meta_t *meta, char *path_out, size_t cap) {
  fsdp_ckpt_load_opts_t o = FSDP_CKPT_LOAD_OPTS_INIT;
  if (opts)
    FSDP_TRY(fsdp_opts_import(&o, opts, sizeof o, FSDP_CKPT_LOAD_OPTS_MAGIC,
                              "fsdp_ckpt_load_opts_t", "FSDP_CKPT_LOAD_OPTS_INIT"));
  if (!e) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_ckpt_load: engine is NULL");
  fsdp_comm_t comm = fsdp_engine_comm(e);
  ckpt_manifest_t m = {0};
  ckpt_files_t f = {0};
  int load_state = 0;
  fsdp_status_t st = ckpt_agree(comm, check_local(e, path, &o, &m, &f, &load_state));
  if (!st) st = ckpt_agree(comm, check_crcs(&f, fsdp_comm_rank(comm), fsdp_comm_size(comm)));
  if (!st) st = ckpt_agree(comm, fill_engine(e, &f, load_state));
  if (!st) st = fsdp_engine_set_step(e, m.step);
  /* The scale continues where it was; an engine without scaling ignores it. */
  if (!st && m.has_scaler && fsdp_engine_config(e)->loss_scale_init != 1.0)
    st = fsdp_engine_set_scaler_state(e, m.loss_scale, m.good_steps);
  /* Zeroed moments start a new optimizer: its bias correction restarts too. */
  if (!st && !load_state) st = fsdp_engine_set_optim_step(e, 0);
  if (!st && meta) *meta = m.meta;
  if (!st && path_out && cap) snprintf(path_out, cap, "%s", m.dir);
  ckpt_files_close(&f);
  ckpt_manifest_free(&m);
  return st;
}
