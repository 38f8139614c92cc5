/* src/ckpt/live.c — the live engine as a checkpoint sees it: the agreement
 * step that carries any rank's failure, message included, to all; the check
 * that the engine is between steps; its manifest; and its shard bytes. Shared
 * by save, adopt, load, the lock and the probe. */
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

/* The outcome on every rank of the engine; engine NULL: this process alone. */
fsdp_status_t ckpt_engine_agree(fsdp_engine_t e, fsdp_status_t st) {
  return e ? ckpt_agree(fsdp_engine_comm(e), st) : st;
}

int ckpt_engine_states(fsdp_engine_t e) {
  const fsdp_optim_config_t *o = &fsdp_engine_config(e)->optim;
  return 1 + (o->kind == FSDP_OPTIM_ADAMW ? 2 : o->momentum > 0.0f ? 1 : 0);
}

int ckpt_engine_rank(fsdp_engine_t e) { return e ? fsdp_comm_rank(fsdp_engine_comm(e)) : 0; }

/* Save and load happen between steps: the probe fails, changing nothing that
 * matters (it drops gathered copies), before materialize, while units are
 * held or gradients wait. */
fsdp_status_t ckpt_engine_idle(fsdp_engine_t e, const char *what) {
  if (!e) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: engine is NULL", what);
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
  snprintf(m->optimizer, sizeof m->optimizer, "%s", c->optim.kind == FSDP_OPTIM_SGD ? "sgd" : "adamw");
  m->n_states = ckpt_engine_states(e);
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

