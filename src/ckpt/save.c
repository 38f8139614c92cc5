/* src/ckpt/save.c — the collective save: the manifest built from the engine,
 * every rank's shard file written in parallel, and rank 0's commit. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ckpt/ckpt_internal.h"

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
  if (!st && o.llama) st = fsdp_llama_config_check(o.llama);
  if (!st && o.llama) m.has_llama = 1, m.llama = *o.llama;
  m.id = c.rank == 0 ? ckpt_random_id() : 0;
  st = ckpt_agree(c.comm, st);
  if (!st) st = share_id(c.comm, &m.id);
  int adopted = 0; /* step-<k> already committed with exactly this state */
  if (!st && !o.overwrite) st = ckpt_adopt(e, save_dir, &m, &adopted, path_out, cap);
  if (!st && !adopted) st = save_new(e, &c, &m, o.overwrite, path_out, cap);
  ckpt_manifest_free(&m);
  return st;
}
