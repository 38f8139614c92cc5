/* src/engine/tensor_io.c — parameters in and out of the engine: whole tensors
 * (set by a broadcast from a root, read by a gather), this rank's shard as
 * checkpoints see it (on CUDA through host copies, one unit at a time, and
 * their bytes), and the bf16 copy of a shard refreshed from its master. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"
#include "engine/shard.h"

static fsdp_status_t tensor_lookup(struct fsdp_engine *e, const char *what, const char *name,
                                   struct unit **u, const struct tensor **t) {
  FSDP_TRY(fsdp_engine_check_live(e));
  if (!e->plan.materialized)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "%s('%s') before fsdp_engine_materialize",
                      what, name ? name : "(null)");
  for (int i = 0; i < e->plan.n_units; i++)
    if (e->plan.units[i].sched.held >= 0)
      return fsdp_error(FSDP_ERR_INVALID_USAGE,
                        "%s('%s') while unit '%s' is acquired: release every unit first",
                        what, name ? name : "(null)", e->plan.units[i].name);
  int ui;
  if (!name || !(*t = fsdp_tensor_find(e, name, &ui, NULL)))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: no tensor named '%s'", what,
                      name ? name : "(null)");
  *u = &e->plan.units[ui];
  return FSDP_SUCCESS;
}

void fsdp_engine_drop_gathers(struct fsdp_engine *e) {
  for (int i = 0; i < e->plan.n_units; i++) {
    struct unit *u = &e->plan.units[i];
    if (u->sched.slot >= 0 && u->sched.held < 0) {
      fsdp_event_synchronize(u->sched.ready);
      /* The next gather into it waits until compute has passed its last use. */
      fsdp_event_record(e->pools.pslots[u->sched.slot].free_ev, e->dev.s_compute);
      e->pools.pslots[u->sched.slot].owner = -1;
      fsdp_mem_track(&e->stats.gathered, &e->stats.gathered_peak, 0,
                     fsdp_unit_gathered_bytes(e, u));
      u->sched.slot = -1;
    }
  }
}

fsdp_status_t fsdp_engine_load_tensor(fsdp_engine_t e, const char *name, const float *full,
                                      int root) {
  struct unit *u = NULL;
  const struct tensor *t = NULL;
  FSDP_TRY(tensor_lookup(e, "fsdp_engine_load_tensor", name, &u, &t));
  if (root < 0 || root >= e->conf.nranks)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "fsdp_engine_load_tensor('%s'): root %d is not a rank of %d", name, root,
                      e->conf.nranks);
  if (e->conf.rank == root && !full)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "fsdp_engine_load_tensor('%s'): root rank %d passed no data", name, root);
  float *buf = fsdp_alloc(t->numel * sizeof(float));
  if (!buf)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "fsdp_engine_load_tensor('%s'): %zu bytes", name,
                      t->numel * sizeof(float));
  if (e->conf.rank == root) memcpy(buf, full, t->numel * sizeof(float));
  fsdp_status_t st = fsdp_broadcast(e->comm.comm_host, buf, t->numel, FSDP_F32, root,
                                    FSDP_HOST_STREAM);
  if (st == FSDP_SUCCESS) st = fsdp_stream_synchronize(e->dev.s_compute); /* the last update */
  if (st == FSDP_SUCCESS) {
    fsdp_engine_drop_gathers(e);
    u->mem.mirror_dirty = 0;
    size_t lo = u->shard_offset, hi = u->shard_offset + u->count;
    size_t a = t->offset > lo ? t->offset : lo;
    size_t b = t->offset + t->numel < hi ? t->offset + t->numel : hi;
    if (a < b)
      st = fsdp_device_copy(u->mem.master + (a - lo), buf + (a - t->offset),
                            (b - a) * sizeof(float), FSDP_HOST_STREAM);
    if (st == FSDP_SUCCESS) st = fsdp_unit_refresh_params(e, u);
    if (st == FSDP_SUCCESS) st = fsdp_stream_synchronize(e->dev.s_compute);
  }
  if (st != FSDP_SUCCESS) {
    fsdp_engine_poison(e, st);
  }
  fsdp_free(buf);
  return st;
}

fsdp_status_t fsdp_engine_read_tensor(fsdp_engine_t e, const char *name, float *full,
                                      int root) {
  struct unit *u = NULL;
  const struct tensor *t = NULL;
  FSDP_TRY(tensor_lookup(e, "fsdp_engine_read_tensor", name, &u, &t));
  if (root < -1 || root >= e->conf.nranks)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "fsdp_engine_read_tensor('%s'): root %d is not -1 or a rank of %d", name,
                      root, e->conf.nranks);
  if ((root == -1 || root == e->conf.rank) && !full)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "fsdp_engine_read_tensor('%s'): no output buffer on rank %d", name,
                      e->conf.rank);
  FSDP_TRY(fsdp_stream_synchronize(e->dev.s_compute)); /* the last step's update */
  if (e->conf.shard_world == 1)
    return full ? fsdp_device_copy(full, u->mem.master + t->offset, t->numel * sizeof(float),
                                   FSDP_HOST_STREAM)
                : FSDP_SUCCESS;
  float *buf = fsdp_alloc(u->padded * sizeof(float));
  if (!buf)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "fsdp_engine_read_tensor('%s'): %zu bytes", name,
                      u->padded * sizeof(float));
  /* The host communicator moves host memory: this rank's shard goes in place.
   * Under HSDP every shard group holds the whole tensor: gathered within it. */
  float *mine = buf + (size_t)e->conf.shard_rank * u->shard;
  fsdp_status_t st = fsdp_device_copy(mine, u->mem.master, u->shard * sizeof(float),
                                      FSDP_HOST_STREAM);
  if (st == FSDP_SUCCESS)
    st = fsdp_all_gather(fsdp_engine_shard_comm(e), mine, buf, u->shard, FSDP_F32,
                         FSDP_HOST_STREAM);
  if (st == FSDP_SUCCESS && (root == -1 || root == e->conf.rank))
    memcpy(full, buf + t->offset, t->numel * sizeof(float));
  if (st != FSDP_SUCCESS) fsdp_engine_poison(e, st);
  fsdp_free(buf);
  return st;
}

/* CUDA: u's host copies of master, grad, m and v (those the unit has). */
static int host_copies(struct unit *u, float *dev[4], float **host[4]) {
  float *d[4] = {u->mem.master, u->mem.grad, u->mem.m, u->mem.v};
  int n = 0;
  for (int k = 0; k < 4; k++)
    if (d[k]) dev[n] = d[k], host[n++] = &u->mem.mirror[k];
  return n;
}

static void host_copies_free(struct fsdp_engine *e, struct unit *u) {
  for (int k = 0; k < 4; k++) {
    if (!u->mem.mirror[k]) continue;
    fsdp_free(u->mem.mirror[k]);
    u->mem.mirror[k] = NULL;
    fsdp_mem_track(&e->stats.host_copies, &e->stats.host_copies_peak, 0, u->shard * sizeof(float));
  }
  u->mem.mirror_dirty = 0;
}

fsdp_status_t fsdp_unit_host_copies_write_back(struct unit *u) {
  float *dev[4], **host[4];
  int n = host_copies(u, dev, host);
  for (int k = 0; k < n; k++)
    FSDP_TRY(fsdp_device_copy(dev[k], *host[k], u->shard * sizeof(float), FSDP_HOST_STREAM));
  u->mem.mirror_dirty = 0;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_unit_shard(fsdp_engine_t e, fsdp_unit_t unit, fsdp_shard_t *shard) {
  struct unit *u = NULL;
  FSDP_TRY(fsdp_unit_get(e, unit, "fsdp_unit_shard", &u));
  if (!e->plan.materialized)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "fsdp_unit_shard('%s') before materialize",
                      u->name);
  if (!shard) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_unit_shard: shard is NULL");
  if (fsdp_engine_on_host(e)) {
    *shard = (fsdp_shard_t){u->shard_offset, u->count, u->shard, u->mem.master,
                            u->mem.grad,     u->mem.m, u->mem.v};
    return FSDP_SUCCESS;
  }
  /* CUDA: host copies, refreshed now; see fsdp_unit_shard in engine.h. */
  FSDP_TRY(fsdp_stream_synchronize(e->dev.s_compute));
  FSDP_TRY(fsdp_stream_synchronize(e->comm.s_reduce));
  FSDP_TRY(fsdp_stream_synchronize(e->comm.s_replica));
  float *dev[4], **host[4];
  int n = host_copies(u, dev, host);
  for (int k = 0; k < n; k++) {
    if (!*host[k]) {
      if (!(*host[k] = fsdp_alloc(u->shard * sizeof(float))))
        return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "fsdp_unit_shard('%s'): %zu bytes of host "
                          "memory", u->name, u->shard * sizeof(float));
      fsdp_mem_track(&e->stats.host_copies, &e->stats.host_copies_peak, u->shard * sizeof(float),
                     0);
    }
    FSDP_TRY(fsdp_device_copy(*host[k], dev[k], u->shard * sizeof(float), FSDP_HOST_STREAM));
  }
  u->mem.mirror_dirty = 1;
  *shard = (fsdp_shard_t){u->shard_offset, u->count,     u->shard,   u->mem.mirror[0],
                          u->mem.mirror[1],    u->mem.mirror[2], u->mem.mirror[3]};
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_unit_shard_release(fsdp_engine_t e, fsdp_unit_t unit, int written) {
  struct unit *u = NULL;
  FSDP_TRY(fsdp_unit_get(e, unit, "fsdp_unit_shard_release", &u));
  if (written && (u->sched.held >= 0 || u->sched.bwd_count > 0))
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "fsdp_unit_shard_release('%s', written) while "
                      "the unit is %s: finish the step first", u->name,
                      u->sched.held >= 0 ? "acquired" : "holding gradients");
  /* A gather in flight reads the master shard the write-back overwrites, and
   * a gathered copy kept for later would keep the old values. */
  if (written && (e->sched.phase != PHASE_IDLE || u->sched.slot >= 0))
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "fsdp_unit_shard_release('%s', written) %s: "
                      "finish the step first", u->name,
                      e->sched.phase == PHASE_FORWARD    ? "in the middle of a forward pass"
                      : e->sched.phase == PHASE_BACKWARD ? "in the middle of a backward pass"
                                                         : "while the unit is gathered for "
                                                           "backward");
  fsdp_status_t st =
      written && u->mem.mirror_dirty ? fsdp_unit_host_copies_write_back(u) : FSDP_SUCCESS;
  /* The unit may be half written: as any failed device copy, it stops the engine. */
  if (st != FSDP_SUCCESS) fsdp_engine_poison(e, st);
  host_copies_free(e, u);
  return st;
}

fsdp_status_t fsdp_engine_host_copy_bytes(fsdp_engine_t e, size_t *live, size_t *peak) {
  if (!e) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_engine_host_copy_bytes: engine "
                            "is NULL");
  if (live) *live = e->stats.host_copies;
  if (peak) *peak = e->stats.host_copies_peak;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_unit_refresh_params(const struct fsdp_engine *e, struct unit *u) {
  if (!u->lowp) return FSDP_SUCCESS;
  FSDP_TRY(e->dev.ops->cast(&(fsdp_cast_args_t){.dst_dt = u->lp_dtype, .dst = u->mem.lp,
                                                 .src_dt = FSDP_F32, .src = u->mem.master,
                                                 .n = u->shard},
                            e->dev.s_compute));
  return fsdp_unit_widen_params(e, u);
}

fsdp_status_t fsdp_unit_widen_params(const struct fsdp_engine *e, struct unit *u) {
  if (!u->mem.rounded) return FSDP_SUCCESS;
  return e->dev.ops->cast(&(fsdp_cast_args_t){.dst_dt = FSDP_F32, .dst = u->mem.rounded,
                                              .src_dt = u->lp_dtype, .src = u->mem.lp,
                                              .n = u->shard},
                          e->dev.s_compute);
}
