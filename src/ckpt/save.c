/* src/ckpt/save.c — the collective save: the manifest built from the engine,
 * every rank's shard file written in parallel, and rank 0's commit; plus the
 * agreement step that carries any rank's failure, message included, to all. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ckpt/ckpt_internal.h"

fsdp_status_t ckpt_agree(fsdp_comm_t comm, fsdp_status_t st) {
  int rank = fsdp_comm_rank(comm), n = fsdp_comm_size(comm);
  /* The lowest failing rank wins: it has the largest code. */
  double code = st ? (double)(n - rank) * 256.0 + (double)st : 0.0, top = 0.0;
  fsdp_status_t cs = fsdp_all_reduce(comm, &code, &top, 1, FSDP_F64, FSDP_MAX, FSDP_HOST_STREAM);
  if (cs) return cs;
  if (top == 0.0) return FSDP_SUCCESS;
  int who = n - (int)(top / 256.0);
  fsdp_status_t agreed = (fsdp_status_t)((int64_t)top % 256);
  char msg[1024] = {0}; /* moved as 512 16-bit words */
  if (rank == who) snprintf(msg, sizeof msg, "%s", fsdp_last_error());
  cs = fsdp_broadcast(comm, msg, sizeof msg / 2, FSDP_BF16, who, FSDP_HOST_STREAM);
  if (cs) return cs;
  msg[sizeof msg - 1] = '\0';
  fsdp_error_set(msg);
  return agreed;
}

/* Save and load happen between steps: the probe fails, changing nothing that
 * matters (it drops gathered copies), while units are held or gradients wait. */
fsdp_status_t ckpt_engine_idle(fsdp_engine_t e, const char *what) {
  if (!e) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: engine is NULL", what);
  fsdp_shard_t s;
  FSDP_TRY(fsdp_unit_shard(e, 0, &s)); /* fails before materialize */
  FSDP_TRY(fsdp_unit_shard_release(e, 0, 0));
  fsdp_status_t st = fsdp_engine_set_step(e, fsdp_engine_step_count(e));
  if (st) return fsdp_error(st, "%s: %s", what, fsdp_last_error());
  return FSDP_SUCCESS;
}

/* Rank r's real elements of a unit of numel elements: the engine's own split,
 * or an even 1/N of a replicated (NO_SHARD) unit. */
static fsdp_status_t unit_range(const fsdp_config_t *c, size_t numel, int world, int r,
                                ckpt_range_t *g) {
  size_t align = c->strategy == FSDP_NO_SHARD ? 1 : c->align;
  return fsdp_shard_layout(numel, world, align, r, NULL, NULL, &g->begin, &g->end);
}

static fsdp_status_t add_units(fsdp_engine_t e, ckpt_manifest_t *m) {
  const fsdp_config_t *c = fsdp_engine_config(e);
  int t = 0;
  for (int u = 0; u < m->n_units; u++) {
    fsdp_unit_info_t info;
    FSDP_TRY(fsdp_unit_info(e, u, &info));
    ckpt_unit_t *un = &m->units[u];
    un->name = fsdp_strdup(info.name);
    un->kind = fsdp_strdup(info.kind);
    un->numel = info.numel;
    if (!un->name || !un->kind) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "checkpoint: out of memory");
    for (int r = 0; r < m->world; r++) FSDP_TRY(unit_range(c, info.numel, m->world, r, &un->ranges[r]));
    for (int i = 0; i < info.n_tensors; i++, t++) {
      fsdp_tensor_info_t ti;
      FSDP_TRY(fsdp_unit_tensor(e, u, i, &ti));
      ckpt_tensor_t *ts = &m->tensors[t];
      if (!(ts->name = fsdp_strdup(ti.name)))
        return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "checkpoint: out of memory");
      ts->unit = u;
      ts->offset = ti.offset;
      ts->numel = ti.numel;
      ts->ndim = ti.ndim;
      memcpy(ts->shape, ti.shape, sizeof ts->shape);
    }
  }
  return FSDP_SUCCESS;
}

static fsdp_status_t set_optimizer(fsdp_engine_t e, ckpt_manifest_t *m) {
  const fsdp_config_t *c = fsdp_engine_config(e);
  fsdp_shard_t s;
  FSDP_TRY(fsdp_unit_shard(e, 0, &s));
  snprintf(m->optimizer, sizeof m->optimizer, "%s", c->optim.kind == FSDP_OPTIM_SGD ? "sgd" : "adamw");
  m->n_states = 1 + (s.m != NULL) + (s.v != NULL);
  FSDP_TRY(fsdp_unit_shard_release(e, 0, 0));
  for (int i = 0; i < m->n_states; i++) m->state_names[i] = ckpt_state_name(m->optimizer, i);
  return FSDP_SUCCESS;
}

fsdp_status_t ckpt_manifest_from_engine(fsdp_engine_t e, ckpt_manifest_t *m) {
  const fsdp_config_t *c = fsdp_engine_config(e);
  int n_units = fsdp_engine_num_units(e), n_tensors = 0;
  for (int u = 0; u < n_units; u++) {
    fsdp_unit_info_t info;
    FSDP_TRY(fsdp_unit_info(e, u, &info));
    n_tensors += info.n_tensors;
  }
  /* One copy of the model: the first shard group's files (HSDP: shard_size
   * ranks; the whole world otherwise), in the format of a world that size. */
  FSDP_TRY(ckpt_manifest_alloc(m, c->shard_size, n_units, n_tensors));
  m->step = fsdp_engine_step_count(e);
  m->align = c->align;
  m->cfg = c;
  snprintf(m->strategy, sizeof m->strategy, "%s", fsdp_strategy_name(c->strategy));
  snprintf(m->param_dtype, sizeof m->param_dtype, "%s", fsdp_dtype_name(c->param_dtype));
  m->has_scaler = c->loss_scale_init != 1.0;
  if (m->has_scaler) FSDP_TRY(fsdp_engine_scaler_state(e, &m->loss_scale, &m->good_steps));
  FSDP_TRY(set_optimizer(e, m));
  FSDP_TRY(add_units(e, m));
  return ckpt_manifest_layout(m, "checkpoint of the live engine");
}

/* The tensor of unit u holding flat element f, and f's index in it. */
static const ckpt_tensor_t *tensor_at(const ckpt_manifest_t *m, int u, size_t f, size_t *index) {
  for (int t = 0; t < m->n_tensors; t++) {
    const ckpt_tensor_t *ts = &m->tensors[t];
    if (ts->unit == u && f >= ts->offset && f < ts->offset + ts->numel) {
      *index = f - ts->offset;
      return ts;
    }
  }
  return NULL;
}

/* What write_unit would write of unit u, scanned first: a NaN or Inf is never
 * saved. */
static fsdp_status_t check_unit_finite(const ckpt_manifest_t *m, int u, int rank,
                                       const fsdp_shard_t *s) {
  const ckpt_range_t *g = &m->units[u].ranges[rank];
  const float *bufs[CKPT_MAX_STATES] = {s->master, s->m, s->v};
  for (int k = 0; k < m->n_states; k++)
    for (size_t f = g->begin; f < g->end; f++) {
      float x = bufs[k][f - s->offset];
      if (isfinite(x)) continue;
      size_t index = 0;
      const ckpt_tensor_t *t = tensor_at(m, u, f, &index);
      return fsdp_error(FSDP_ERR_NONFINITE, "fsdp_ckpt_save: step %" PRId64 " not saved: "
                        "rank %d's %s of tensor '%s' is %g at index %zu; a checkpoint never "
                        "holds NaN or Inf", m->step, rank, m->state_names[k],
                        t ? t->name : m->units[u].name, (double)x, t ? index : f);
    }
  return FSDP_SUCCESS;
}

/* Unit by unit: the shard's host copies (CUDA) exist for one unit at a time. */
static fsdp_status_t check_finite(fsdp_engine_t e, const ckpt_manifest_t *m, int rank) {
  for (int u = 0; u < m->n_units; u++) {
    fsdp_shard_t s;
    FSDP_TRY(fsdp_unit_shard(e, u, &s));
    fsdp_status_t st = check_unit_finite(m, u, rank, &s);
    fsdp_status_t rs = fsdp_unit_shard_release(e, u, 0);
    FSDP_TRY(st ? st : rs);
  }
  return FSDP_SUCCESS;
}

/* This rank's slice of each buffer of unit u, where the shard holds it. */
static fsdp_status_t write_shard_slice(const ckpt_manifest_t *m, int u, int rank,
                                       const fsdp_shard_t *sh, ckpt_writer_t *w) {
  const fsdp_shard_t s = *sh;
  const ckpt_range_t *g = &m->units[u].ranges[rank];
  size_t n = g->end - g->begin;
  if (n == 0) return FSDP_SUCCESS;
  size_t lo = s.offset < m->units[u].numel ? s.offset : m->units[u].numel;
  if (g->begin < lo || g->end > lo + s.count)
    return fsdp_error(FSDP_ERR_INTERNAL, "checkpoint: unit '%s': rank %d's range [%zu, %zu) is "
                      "not inside its shard [%zu, %zu)", m->units[u].name, rank, g->begin, g->end,
                      lo, lo + s.count);
  const float *bufs[CKPT_MAX_STATES] = {s.master, s.m, s.v};
  for (int k = 0; k < m->n_states; k++)
    FSDP_TRY(ckpt_write(w, bufs[k] + (g->begin - s.offset), n * sizeof(float)));
  return FSDP_SUCCESS;
}

static fsdp_status_t write_unit(fsdp_engine_t e, const ckpt_manifest_t *m, int u, int rank,
                                ckpt_writer_t *w) {
  fsdp_shard_t s;
  FSDP_TRY(fsdp_unit_shard(e, u, &s));
  fsdp_status_t st = write_shard_slice(m, u, rank, &s, w);
  fsdp_status_t rs = fsdp_unit_shard_release(e, u, 0);
  return st ? st : rs;
}

fsdp_status_t ckpt_stream_shard(fsdp_engine_t e, const ckpt_manifest_t *m, int rank,
                                ckpt_writer_t *w) {
  uint8_t head[CKPT_HEADER_BYTES];
  ckpt_header_encode(m, rank, head);
  fsdp_status_t st = ckpt_write(w, head, sizeof head);
  for (int u = 0; u < m->n_units && !st; u++) st = write_unit(e, m, u, rank, w);
  return st;
}

static fsdp_status_t write_shard(fsdp_engine_t e, const ckpt_manifest_t *m, int rank,
                                 int64_t *fault, ckpt_file_t *out) {
  char path[CKPT_PATH_MAX];
  ckpt_writer_t w;
  ckpt_shard_path(m, rank, path, sizeof path);
  FSDP_TRY(ckpt_writer_open(&w, path, fault));
  fsdp_status_t st = ckpt_stream_shard(e, m, rank, &w);
  if (st) return ckpt_writer_abort(&w), st;
  FSDP_TRY(ckpt_writer_close(&w));
  out->bytes = w.bytes;
  out->crc = w.crc;
  return FSDP_SUCCESS;
}

/* Every rank learns every file's size and CRC (exact in doubles: < 2^53);
 * the writers are the ranks 0 .. m->world - 1. */
static fsdp_status_t gather_files(fsdp_comm_t comm, ckpt_manifest_t *m, const ckpt_file_t *mine) {
  double local[2] = {(double)mine->bytes, (double)mine->crc};
  double *all = fsdp_alloc((size_t)fsdp_comm_size(comm) * 2 * sizeof(double));
  if (!all) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "checkpoint: out of memory");
  fsdp_status_t st = fsdp_all_gather(comm, local, all, 2, FSDP_F64, FSDP_HOST_STREAM);
  for (int r = 0; r < m->world && !st; r++) {
    m->files[r].bytes = (uint64_t)all[2 * r];
    m->files[r].crc = (uint32_t)all[2 * r + 1];
  }
  fsdp_free(all);
  return st;
}

static fsdp_status_t share_id(fsdp_comm_t comm, uint64_t *id) {
  uint16_t words[4];
  memcpy(words, id, sizeof words);
  FSDP_TRY(fsdp_broadcast(comm, words, 4, FSDP_BF16, 0, FSDP_HOST_STREAM));
  memcpy(id, words, sizeof words);
  return FSDP_SUCCESS;
}

typedef struct {
  fsdp_comm_t comm;
  int rank;
  const char *save_dir;
  char tmp[CKPT_PATH_MAX];
  int64_t fault;
  int guard; /* rank 0: this save's guard, held until it is committed or discarded */
} save_ctx_t;

/* Past prepare: write, agree, gather, commit, agree. */
static fsdp_status_t save_files(fsdp_engine_t e, save_ctx_t *c, ckpt_manifest_t *m,
                                char *path_out, size_t cap) {
  ckpt_file_t mine = {0};
  fsdp_status_t st = ckpt_path(m->dir, sizeof m->dir, "%s", c->tmp);
  /* HSDP: the other shard groups hold the same elements and write nothing. */
  if (!st && c->rank < m->world) st = write_shard(e, m, c->rank, &c->fault, &mine);
  st = ckpt_agree(c->comm, st);
  if (!st) st = ckpt_agree(c->comm, gather_files(c->comm, m, &mine));
  if (!st && c->rank == 0) st = ckpt_commit(m, c->save_dir, c->tmp, &c->fault, path_out, cap);
  if (st && c->rank == 0) ckpt_discard(c->tmp);
  st = ckpt_agree(c->comm, st);
  if (!st && c->rank != 0 && path_out && cap)
    snprintf(path_out, cap, "%s/step-%" PRId64, c->save_dir, m->step);
  return st;
}

/* A new step directory: rank 0 prepares it (and holds its guard until the
 * save is committed or discarded), every rank writes into it. */
static fsdp_status_t save_new(fsdp_engine_t e, save_ctx_t *c, ckpt_manifest_t *m, int overwrite,
                              char *path_out, size_t cap) {
  fsdp_status_t st = c->rank == 0
      ? ckpt_prepare(c->save_dir, m->step, m->id, overwrite, c->tmp, sizeof c->tmp, &c->guard)
      : ckpt_path(c->tmp, sizeof c->tmp, "%s/step-%" PRId64 ".tmp-%016" PRIx64, c->save_dir,
                  m->step, m->id);
  st = ckpt_agree(c->comm, st);
  c->fault = ckpt_fault_budget(c->rank, m->step);
  if (!st) st = save_files(e, c, m, path_out, cap);
  ckpt_guard_release(c->guard);
  c->guard = -1;
  return st;
}

fsdp_status_t fsdp_ckpt_save(fsdp_engine_t e, const char *save_dir,
                             const fsdp_ckpt_save_opts_t *opts, char *path_out, size_t cap) {
  fsdp_ckpt_save_opts_t o = FSDP_CKPT_SAVE_OPTS_INIT;
  fsdp_status_t st = FSDP_SUCCESS;
  if (opts)
    st = fsdp_opts_import(&o, opts, sizeof o, FSDP_CKPT_SAVE_OPTS_MAGIC, "fsdp_ckpt_save_opts_t",
                          "FSDP_CKPT_SAVE_OPTS_INIT");
  if (!st) st = ckpt_engine_idle(e, "fsdp_ckpt_save");
  if (st) return st; /* the same on every rank: nothing collective has started */
  save_ctx_t c = {fsdp_engine_comm(e), fsdp_comm_rank(fsdp_engine_comm(e)), save_dir, {0}, -1, -1};
  ckpt_manifest_t m = {0};
  if (!save_dir || !save_dir[0])
    st = fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_ckpt_save: no save directory given");
  if (!st) st = ckpt_manifest_from_engine(e, &m);
  /* HSDP: the writers' copies are the ones saved (the others are equal). */
  if (!st && c.rank < m.world) st = check_finite(e, &m, c.rank);
  if (!st && o.meta) m.meta = *o.meta;
  m.id = c.rank == 0 ? ckpt_random_id() : 0;
  st = ckpt_agree(c.comm, st);
  if (!st) st = share_id(c.comm, &m.id);
  int adopted = 0; /* step-<k> already committed with exactly this state */
  if (!st && !o.overwrite) st = ckpt_adopt(e, save_dir, &m, &adopted, path_out, cap);
  if (!st && !adopted) st = save_new(e, &c, &m, o.overwrite, path_out, cap);
  ckpt_manifest_free(&m);
  return st;
}
