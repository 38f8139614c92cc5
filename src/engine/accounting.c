/* src/engine/accounting.c — memory accounting (persistent shards, gathered
 * parameters and gradients in flight, with peaks) and the timeline of
 * gathers, reductions, acquires, releases and steps, with the timing marks
 * that time collectives on CUDA streams. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"

void fsdp_mem_track(size_t *live, size_t *peak, size_t add, size_t sub) {
  *live = *live + add - sub;
  if (*live > *peak) *peak = *live;
}

fsdp_status_t fsdp_engine_memory(fsdp_engine_t e, fsdp_mem_stats_t *mem) {
  if (!e || !mem)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_engine_memory: engine and mem must "
                      "not be NULL");
  memset(mem, 0, sizeof *mem);
  for (int i = 0; i < e->plan.n_units && e->plan.materialized; i++) {
    const struct unit *u = &e->plan.units[i];
    size_t b = u->shard * sizeof(float);
    mem->master += b;
    mem->grad_shard += b;
    mem->optim_state += (u->mem.m ? b : 0) + (u->mem.v ? b : 0);
    mem->param_copy += (u->mem.lp ? u->shard * sizeof(uint16_t) : 0) + (u->mem.rounded ? b : 0);
  }
  mem->persistent = mem->master + mem->grad_shard + mem->optim_state + mem->param_copy;
  mem->gathered_params = e->stats.gathered;
  mem->gathered_params_peak = e->stats.gathered_peak;
  mem->grads_in_flight = e->stats.grads_live;
  mem->grads_in_flight_peak = e->stats.grads_peak;
  mem->param_pool = e->pools.param_pool_bytes;
  mem->grad_pool = e->pools.grad_pool_bytes;
  mem->staging = e->pools.staging_bytes;
  mem->total_reserved = mem->persistent + mem->param_pool + mem->grad_pool + mem->staging;
  return FSDP_SUCCESS;
}

void fsdp_engine_reset_peaks(fsdp_engine_t e) {
  if (!e) return;
  e->stats.gathered_peak = e->stats.gathered;
  e->stats.grads_peak = e->stats.grads_live;
}

void fsdp_tl_add(struct fsdp_engine *e, fsdp_tl_kind_t kind, int unit, fsdp_pass_t pass,
                 int stream, double t0, double t1, size_t bytes) {
  pthread_mutex_lock(&e->stats.tl_lock);
  if (e->stats.tl_count == e->stats.tl_cap && e->stats.tl_cap < e->conf.cfg.timeline_capacity) {
    size_t cap = e->stats.tl_cap ? 2 * e->stats.tl_cap : 1024;
    if (cap > e->conf.cfg.timeline_capacity) cap = e->conf.cfg.timeline_capacity;
    fsdp_tl_event_t *grown = realloc(e->stats.tl, cap * sizeof *grown);
    if (grown) {
      e->stats.tl = grown;
      e->stats.tl_cap = cap;
    }
  }
  if (e->stats.tl_count < e->stats.tl_cap)
    e->stats.tl[e->stats.tl_count++] = (fsdp_tl_event_t){kind, unit, pass, stream, t0, t1, bytes};
  else
    e->stats.tl_dropped++;
  pthread_mutex_unlock(&e->stats.tl_lock);
}

static void tl_dropped_add(struct fsdp_engine *e) {
  pthread_mutex_lock(&e->stats.tl_lock);
  e->stats.tl_dropped++;
  pthread_mutex_unlock(&e->stats.tl_lock);
}

/* ---- timing marks on CUDA streams ---------------------------------------- */

fsdp_status_t fsdp_tl_marks_create(struct fsdp_engine *e) {
  if (fsdp_engine_on_host(e) || e->conf.cfg.timeline_capacity == 0) return FSDP_SUCCESS;
  size_t n = e->conf.cfg.timeline_capacity < FSDP_TL_MARKED_MAX ? e->conf.cfg.timeline_capacity
                                                                 : FSDP_TL_MARKED_MAX;
  if (!(e->stats.tl_pending = calloc(n, sizeof *e->stats.tl_pending)))
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "engine: out of host memory for the timeline");
  e->stats.cap_pending = n;
  FSDP_TRY(fsdp_marks_create(2 * n, &e->stats.tl_marks));
  return fsdp_marks_anchor(e->stats.tl_marks, e->dev.s_compute); /* idle: nothing issued yet */
}

void fsdp_tl_marks_destroy(struct fsdp_engine *e) {
  fsdp_marks_destroy(e->stats.tl_marks);
  free(e->stats.tl_pending);
}

fsdp_status_t fsdp_tl_mark_begin(struct fsdp_engine *e, fsdp_stream_t s, size_t *mark) {
  *mark = FSDP_NO_MARK;
  return e->stats.tl_marks ? fsdp_marks_record(e->stats.tl_marks, s, mark) : FSDP_SUCCESS;
}

fsdp_status_t fsdp_tl_mark_end(struct fsdp_engine *e, fsdp_stream_t s, size_t begin,
                               fsdp_tl_event_t ev) {
  if (!e->stats.tl_marks) return FSDP_SUCCESS;
  size_t end = FSDP_NO_MARK;
  if (begin != FSDP_NO_MARK) FSDP_TRY(fsdp_marks_record(e->stats.tl_marks, s, &end));
  if (end == FSDP_NO_MARK || e->stats.n_pending == e->stats.cap_pending) {
    tl_dropped_add(e); /* the pool is spent until the next read */
    return FSDP_SUCCESS;
  }
  e->stats.tl_pending[e->stats.n_pending++] = (struct tl_pending){ev, begin, end};
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_compute_wait(struct fsdp_engine *e, fsdp_event_t ev, int unit,
                                fsdp_pass_t pass) {
  size_t mark;
  FSDP_TRY(fsdp_tl_mark_begin(e, e->dev.s_compute, &mark));
  FSDP_TRY(fsdp_stream_wait_event(e->dev.s_compute, ev));
  return fsdp_tl_mark_end(e, e->dev.s_compute, mark,
                          (fsdp_tl_event_t){FSDP_TL_COMPUTE_WAIT, unit, pass, 0, 0.0, 0.0, 0});
}

fsdp_status_t fsdp_tl_resolve(struct fsdp_engine *e) {
  if (!e->stats.tl_marks) return FSDP_SUCCESS;
  size_t latest = FSDP_NO_MARK;
  double t_latest = 0.0;
  for (size_t i = 0; i < e->stats.n_pending; i++) {
    const struct tl_pending *p = &e->stats.tl_pending[i];
    double t0, t1;
    FSDP_TRY(fsdp_marks_time(e->stats.tl_marks, p->begin, &t0));
    FSDP_TRY(fsdp_marks_time(e->stats.tl_marks, p->end, &t1));
    fsdp_tl_add(e, p->ev.kind, p->ev.unit, p->ev.pass, p->ev.stream, t0, t1, p->ev.bytes);
    if (latest == FSDP_NO_MARK || t1 > t_latest) latest = p->end, t_latest = t1;
  }
  e->stats.n_pending = 0;
  fsdp_marks_recycle(e->stats.tl_marks, latest, t_latest);
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_engine_timeline(fsdp_engine_t e, const fsdp_tl_event_t **events,
                                   size_t *count, size_t *dropped) {
  if (!e || !events || !count)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_engine_timeline: engine, events and "
                      "count must not be NULL");
  /* Streams append (and may grow the array) while they run: let them finish;
   * then the marks they passed can be read. */
  fsdp_stream_synchronize(e->comm.s_gather);
  fsdp_stream_synchronize(e->comm.s_reduce);
  fsdp_stream_synchronize(e->comm.s_replica);
  FSDP_TRY(fsdp_tl_resolve(e));
  pthread_mutex_lock(&e->stats.tl_lock);
  *count = e->stats.tl_count;
  if (dropped) *dropped = e->stats.tl_dropped;
  *events = e->stats.tl;
  pthread_mutex_unlock(&e->stats.tl_lock);
  return FSDP_SUCCESS;
}

void fsdp_engine_timeline_clear(fsdp_engine_t e) {
  if (!e) return;
  pthread_mutex_lock(&e->stats.tl_lock);
  e->stats.tl_count = e->stats.tl_dropped = 0;
  pthread_mutex_unlock(&e->stats.tl_lock);
  e->stats.n_pending = 0; /* marked collectives not read yet go too; the anchor stays */
  if (e->stats.tl_marks) fsdp_marks_recycle(e->stats.tl_marks, FSDP_NO_MARK, 0.0);
}

fsdp_status_t fsdp_engine_stats_create(struct fsdp_engine *e) {
  int rc = pthread_mutex_init(&e->stats.tl_lock, NULL);
  return rc ? fsdp_error(FSDP_ERR_SYSTEM, "engine: the timeline's lock: %s", strerror(rc))
            : FSDP_SUCCESS;
}

void fsdp_engine_stats_destroy(struct fsdp_engine *e) {
  free(e->stats.tl);
  fsdp_tl_marks_destroy(e);
  fsdp_kprof_destroy(e);
  pthread_mutex_destroy(&e->stats.tl_lock);
}
