/* src/engine/schedule.c — the per-micro-batch schedule: acquire (wait for the
 * gather, prefetch the next units), release (free the gathered params, start the
 * gradient reduction), and the order checks that keep every rank issuing the same
 * collectives in the same order. */
#include <stdlib.h>
#include <string.h>

#include "comm/comm_names.h"
#include "engine/engine_internal.h"

static const char *pass_name(fsdp_pass_t p) { return p == FSDP_FORWARD ? "forward" : "backward"; }
static int unit_index(const struct fsdp_engine *e, const struct unit *u) {
  return (int)(u - e->plan.units);
}

/* ---- stream work: timeline marks, casts and gradient accumulation -------- *
 * On the CPU these run as host functions on the communication streams. On
 * CUDA with NCCL (communication streams are CUDA streams) the kernels are
 * queued on those streams when the engine issues the work, and the timeline
 * marks are timing events (accounting.c) read at the step's end: no host
 * function ever goes on a CUDA stream, whose every one would stall it for a
 * round trip to the host. On CUDA with a host backend (worker streams) the
 * host functions launch the kernels on the aux stream of the worker and wait
 * for them there. */

/* Worker streams run host functions, which read the unit's stream_op. */
static int host_marks(fsdp_stream_t s) { return !fsdp_stream_cuda_handle(s); }

/* What a rank puts on the wire: its shard in the gathered dtype (the f32 twin
 * the CPU widens 16-bit gathers into is memory, not traffic). */
static size_t gather_bytes(const struct unit *u) {
  return u->shard * (u->lowp ? sizeof(uint16_t) : sizeof(float));
}
/* Alone, a rank reduces nothing over the wire (accumulation only). */
static size_t reduce_bytes(const struct fsdp_engine *e, const struct unit *u) {
  if (e->conf.nranks == 1) return 0;
  return u->shard * (e->conf.bf16_reduce ? sizeof(uint16_t) : sizeof(float));
}

static fsdp_status_t mark_begin(void *arg) {
  ((struct stream_op *)arg)->t_begin = fsdp_time_now();
  return FSDP_SUCCESS;
}

/* The begin mark: a host function on a worker, a timing event on CUDA. */
static fsdp_status_t mark_open(struct fsdp_engine *e, fsdp_stream_t s, struct stream_op *op,
                               size_t *cu_mark) {
  *cu_mark = FSDP_NO_MARK;
  if (host_marks(s)) return fsdp_stream_launch(s, mark_begin, op);
  return fsdp_tl_mark_begin(e, s, cu_mark);
}

/* Widens a 16-bit gather for compute on the CPU (in this worker task: the
 * host stream), then the timeline mark. */
static fsdp_status_t gather_end(void *arg) {
  struct stream_op *op = arg;
  if (op->lp)
    FSDP_TRY(op->eng->dev.ops->cast(&(fsdp_cast_args_t){.dst_dt = FSDP_F32, .dst = op->dst,
                                                         .src_dt = op->u->lp_dtype, .src = op->lp,
                                                         .n = op->u->padded},
                                    FSDP_HOST_STREAM));
  fsdp_tl_add(op->eng, FSDP_TL_ALL_GATHER, unit_index(op->eng, op->u), op->pass, 1, op->t_begin,
              fsdp_time_now(), gather_bytes(op->u));
  return FSDP_SUCCESS;
}

static fsdp_status_t reduce_mark(void *arg) {
  struct stream_op *op = arg;
  struct fsdp_engine *e = op->eng;
  fsdp_tl_add(e, FSDP_TL_REDUCE, unit_index(e, op->u), FSDP_BACKWARD, 2, op->t_begin,
              fsdp_time_now(), reduce_bytes(e, op->u));
  return FSDP_SUCCESS;
}

/* bf16 reduce dtype: the full fp32 gradient rounded into grad_lp. */
static fsdp_status_t cast_grad(struct fsdp_engine *e, struct unit *u, fsdp_stream_t s) {
  return e->dev.ops->cast(&(fsdp_cast_args_t){.dst_dt = FSDP_BF16, .dst = e->pools.grad_lp,
                                              .src_dt = FSDP_F32, .src = u->sched.reduce_src,
                                              .n = u->padded},
                          s);
}

/* grad shard += scale * reduced gradient (the averaging is folded in here). */
static fsdp_status_t accumulate(struct fsdp_engine *e, struct unit *u, fsdp_stream_t s) {
  const int lp = e->conf.bf16_reduce && e->conf.nranks > 1;
  const float *src = e->conf.shard_world > 1 ? e->pools.staging : u->sched.reduce_src;
  const uint16_t *src_lp = e->conf.shard_world > 1 ? e->pools.staging_lp : e->pools.grad_lp;
  return e->dev.ops->axpy(&(fsdp_axpy_args_t){.y = u->mem.grad,
                                              .xdt = lp ? FSDP_BF16 : FSDP_F32,
                                              .x = lp ? (const void *)src_lp : src,
                                              .alpha = u->sched.reduce_scale, .n = u->shard},
                          s);
}

typedef fsdp_status_t (*shard_fn)(struct fsdp_engine *, struct unit *, fsdp_stream_t);

/* Host-function forms for worker streams: on the CPU the kernel runs in the
 * task (the host stream); on CUDA on the aux stream, waited for, so the
 * worker's next task sees the result. */
static fsdp_status_t on_worker(struct stream_op *op, shard_fn fn) {
  struct fsdp_engine *e = op->eng;
  FSDP_TRY(fn(e, op->u, e->comm.s_aux)); /* NULL on the CPU: the host stream */
  return fsdp_stream_synchronize(e->comm.s_aux);
}
static fsdp_status_t cast_task(void *arg) { return on_worker(arg, cast_grad); }
static fsdp_status_t accumulate_task(void *arg) { return on_worker(arg, accumulate); }

/* Queues fn on the reduce stream: a kernel on a CUDA stream, else a task. */
static fsdp_status_t reduce_queue(struct fsdp_engine *e, struct unit *u, shard_fn fn,
                                  fsdp_host_fn task) {
  if (fsdp_stream_cuda_handle(e->comm.s_reduce)) return fn(e, u, e->comm.s_reduce);
  return fsdp_stream_launch(e->comm.s_reduce, task, &u->sched.reduce_op);
}

/* ---- gathers ------------------------------------------------------------ */

/* Units the caller holds in a shared slot: the nesting (a root unit held
 * across the others). */
static int nesting(const struct fsdp_engine *e) {
  int n = 0;
  for (int i = e->pools.n_own; i < e->pools.n_pslots; i++)
    if (e->pools.pslots[i].owner >= 0 && e->plan.units[e->pools.pslots[i].owner].sched.held >= 0)
      n++;
  return n;
}

/* u's own slot (ZeRO-2 units), else a free shared one, -1 when none. With
 * max_live_units unset the shared slots are prefetch_depth + 1 plus the
 * nesting: the first step that holds units across the others adds a slot
 * per unit held, so that prefetch never stops for lack of one. */
static fsdp_status_t free_slot(struct fsdp_engine *e, const struct unit *u, int *slot) {
  *slot = u->reshard ? -1 : u->own_slot;
  for (int i = e->pools.n_own; i < e->pools.n_pslots && *slot < 0; i++)
    if (e->pools.pslots[i].owner < 0) *slot = i;
  int want = e->conf.cfg.prefetch_depth + 1 + nesting(e);
  if (*slot >= 0 || e->conf.cfg.max_live_units || e->pools.n_pslots - e->pools.n_own >= want)
    return FSDP_SUCCESS;
  FSDP_TRY(fsdp_engine_add_shared_slot(e));
  *slot = e->pools.n_pslots - 1;
  return FSDP_SUCCESS;
}

static fsdp_status_t gather_issue(struct fsdp_engine *e, struct unit *u, int slot,
                                  fsdp_pass_t pass) {
  struct pslot *p = &e->pools.pslots[slot];
  p->owner = unit_index(e, u);
  u->sched.slot = slot;
  fsdp_mem_track(&e->stats.gathered, &e->stats.gathered_peak, fsdp_unit_gathered_bytes(e, u), 0);
  int host = host_marks(e->comm.s_gather);
  /* Queued host functions of its last gather read the closure (CPU: done). */
  if (host) FSDP_TRY(fsdp_event_synchronize(u->sched.ready));
  u->sched.gather_op = (struct stream_op){e, u, pass, 0.0, u->widen ? p->lp : NULL, p->buf};
  FSDP_TRY(fsdp_stream_wait_event(e->comm.s_gather, p->free_ev));
  size_t mark;
  FSDP_TRY(mark_open(e, e->comm.s_gather, &u->sched.gather_op, &mark));
  fsdp_comm_set_tag(e->comm.comm_gather, u->name); /* names the unit in timeouts and desyncs */
  if (u->lowp)
    FSDP_TRY(fsdp_all_gather(e->comm.comm_gather, u->mem.lp, p->lp, u->shard, u->lp_dtype,
                             e->comm.s_gather));
  else
    FSDP_TRY(fsdp_all_gather(e->comm.comm_gather, u->mem.master, p->buf, u->shard, FSDP_F32,
                             e->comm.s_gather));
  if (host) FSDP_TRY(fsdp_stream_launch(e->comm.s_gather, gather_end, &u->sched.gather_op));
  else
    FSDP_TRY(fsdp_tl_mark_end(e, e->comm.s_gather, mark, (fsdp_tl_event_t){FSDP_TL_ALL_GATHER,
                              unit_index(e, u), pass, 1, 0.0, 0.0, gather_bytes(u)}));
  return fsdp_event_record(u->sched.ready, e->comm.s_gather);
}

static fsdp_status_t slot_release(struct fsdp_engine *e, struct unit *u) {
  struct pslot *p = &e->pools.pslots[u->sched.slot];
  /* The next gather into this buffer must wait until compute has passed it. */
  FSDP_TRY(fsdp_event_record(p->free_ev, e->dev.s_compute));
  p->owner = -1;
  u->sched.slot = -1;
  fsdp_mem_track(&e->stats.gathered, &e->stats.gathered_peak, 0, fsdp_unit_gathered_bytes(e, u));
  return FSDP_SUCCESS;
}

/* Takes back a shared slot holding a prefetched unit nobody acquired yet. */
static int evict_prefetched(struct fsdp_engine *e) {
  for (int i = e->pools.n_own; i < e->pools.n_pslots; i++) {
    int owner = e->pools.pslots[i].owner;
    if (owner >= 0 && e->plan.units[owner].sched.held < 0) {
      struct unit *v = &e->plan.units[owner];
      if (fsdp_event_synchronize(v->sched.ready) != FSDP_SUCCESS) return -1;
      if (slot_release(e, v) != FSDP_SUCCESS) return -1;
      return i;
    }
  }
  return -1;
}

static fsdp_status_t gather_needed(struct fsdp_engine *e, struct unit *u, fsdp_pass_t pass) {
  if (e->conf.shard_world == 1 || u->sched.slot >= 0) return FSDP_SUCCESS;
  int slot;
  FSDP_TRY(free_slot(e, u, &slot));
  if (slot < 0) slot = evict_prefetched(e);
  if (slot < 0)
    return fsdp_error(FSDP_ERR_INVALID_USAGE,
                      "cannot acquire unit '%s' in %s: all %d gather buffers are held by "
                      "acquired units (raise config.max_live_units or release units sooner)",
                      u->name, pass_name(pass), e->pools.n_pslots);
  return gather_issue(e, u, slot, pass);
}

/* The unit `k` places after position `pos` in this pass's order, or NULL. */
static struct unit *unit_ahead(struct fsdp_engine *e, fsdp_pass_t pass, int pos, int k) {
  int i = pos + k;
  if (i >= e->plan.n_units) return NULL;
  if (pass == FSDP_FORWARD) return &e->plan.units[i];
  return &e->plan.units[e->sched.fwd_release[e->plan.n_units - 1 - i]];
}

static fsdp_status_t prefetch(struct fsdp_engine *e, fsdp_pass_t pass, int pos) {
  if (e->conf.shard_world == 1) return FSDP_SUCCESS;
  for (int k = 1; k <= e->conf.cfg.prefetch_depth; k++) {
    struct unit *v = unit_ahead(e, pass, pos, k);
    if (!v) break;
    if (v->sched.slot >= 0) continue;
    int slot;
    FSDP_TRY(free_slot(e, v, &slot));
    if (slot < 0) break; /* the cap on live units (max_live_units): stop prefetching */
    FSDP_TRY(gather_issue(e, v, slot, pass));
  }
  return FSDP_SUCCESS;
}

/* ---- gradients ---------------------------------------------------------- */

/* Where backward adds u's gradient: the shard itself (conf.direct_grads),
 * the unit's full gradient (accumulate_full_grads), else a zeroed slot. */
static fsdp_status_t grad_buffer(struct fsdp_engine *e, struct unit *u, float **buf) {
  size_t bytes = u->padded * sizeof(float);
  if (e->conf.direct_grads) {
    *buf = u->mem.grad;
    return FSDP_SUCCESS;
  }
  if (e->conf.cfg.accumulate_full_grads) {
    if (u->sched.bwd_count == 0) {
      FSDP_TRY(fsdp_compute_wait(e, u->sched.reduced, unit_index(e, u), FSDP_BACKWARD));
      FSDP_TRY(fsdp_engine_zero(e, u->mem.full_grad, bytes));
      fsdp_mem_track(&e->stats.grads_live, &e->stats.grads_peak, bytes, 0);
    }
    *buf = u->mem.full_grad;
    return FSDP_SUCCESS;
  }
  int k = 0;
  while (k < e->pools.n_gslots &&
         e->pools.gslots[(e->sched.next_gslot + k) % e->pools.n_gslots].held)
    k++;
  if (k == e->pools.n_gslots)
    return fsdp_error(FSDP_ERR_INVALID_USAGE,
                      "cannot acquire unit '%s' in backward: all %d gradient buffers are held "
                      "by acquired units; release units sooner", u->name, e->pools.n_gslots);
  int slot = (e->sched.next_gslot + k) % e->pools.n_gslots;
  struct gslot *g = &e->pools.gslots[slot];
  if (g->busy) { /* compute waits for the reduction still reading it */
    struct unit *prev = &e->plan.units[g->owner];
    FSDP_TRY(fsdp_compute_wait(e, prev->sched.reduced, unit_index(e, u), FSDP_BACKWARD));
    fsdp_mem_track(&e->stats.grads_live, &e->stats.grads_peak, 0, prev->padded * sizeof(float));
  }
  u->sched.gslot = slot;
  e->sched.next_gslot = (slot + 1) % e->pools.n_gslots;
  g->busy = g->held = 1;
  g->owner = unit_index(e, u);
  FSDP_TRY(fsdp_engine_zero(e, g->buf, bytes));
  fsdp_mem_track(&e->stats.grads_live, &e->stats.grads_peak, bytes, 0);
  *buf = g->buf;
  return FSDP_SUCCESS;
}

static fsdp_status_t replica_mark(void *arg) {
  struct stream_op *op = arg;
  fsdp_tl_add(op->eng, FSDP_TL_REPLICA_REDUCE, unit_index(op->eng, op->u), FSDP_BACKWARD, 3,
              op->t_begin, fsdp_time_now(), op->u->shard * sizeof(float));
  return FSDP_SUCCESS;
}

/* HSDP, after a unit's last reduce-scatter of the step: its fp32 gradient
 * shard (already scaled by 1 / (world x grad_accum)) summed in place across
 * the replica group, 1/S of the gradient, on the replica stream once the
 * reduce stream has passed the accumulation. The step waits for it. */
static fsdp_status_t replica_issue(struct fsdp_engine *e, struct unit *u) {
  int host = host_marks(e->comm.s_replica);
  if (host) FSDP_TRY(fsdp_event_synchronize(u->sched.replicated));
  u->sched.replica_op = (struct stream_op){e, u, FSDP_BACKWARD, 0.0, NULL, NULL};
  FSDP_TRY(fsdp_stream_wait_event(e->comm.s_replica, u->sched.reduced));
  size_t mark;
  FSDP_TRY(mark_open(e, e->comm.s_replica, &u->sched.replica_op, &mark));
  fsdp_comm_set_tag(e->comm.comm_replica, u->name);
  FSDP_TRY(fsdp_all_reduce(e->comm.comm_replica, u->mem.grad, u->mem.grad, u->shard, FSDP_F32,
                           FSDP_SUM, e->comm.s_replica));
  if (host) FSDP_TRY(fsdp_stream_launch(e->comm.s_replica, replica_mark, &u->sched.replica_op));
  else
    FSDP_TRY(fsdp_tl_mark_end(e, e->comm.s_replica, mark, (fsdp_tl_event_t){FSDP_TL_REPLICA_REDUCE,
                              unit_index(e, u), FSDP_BACKWARD, 3, 0.0, 0.0,
                              u->shard * sizeof(float)}));
  return fsdp_event_record(u->sched.replicated, e->comm.s_replica);
}

/* Starts the reduction of a unit's full gradient into its fp32 shard. The sum
 * runs in the collective; the averaging scale is folded into accumulation. */
static fsdp_status_t reduce_issue(struct fsdp_engine *e, struct unit *u, float *src) {
  int host = host_marks(e->comm.s_reduce);
  /* Queued host functions read the closure: let the last ones finish. */
  if (host) FSDP_TRY(fsdp_event_synchronize(u->sched.reduced));
  u->sched.reduce_src = src;
  u->sched.reduce_scale = e->conf.cfg.grad_reduce == FSDP_AVG
                        ? 1.0f / (float)((double)e->conf.nranks * e->conf.cfg.grad_accum) : 1.0f;
  u->sched.reduce_op = (struct stream_op){e, u, FSDP_BACKWARD, 0.0, NULL, NULL};
  FSDP_TRY(fsdp_event_record(e->sched.compute_done, e->dev.s_compute));
  FSDP_TRY(fsdp_stream_wait_event(e->comm.s_reduce, e->sched.compute_done));
  size_t mark;
  FSDP_TRY(mark_open(e, e->comm.s_reduce, &u->sched.reduce_op, &mark));
  fsdp_comm_set_tag(e->comm.comm_reduce, u->name);
  int lp = e->conf.bf16_reduce && e->conf.nranks > 1;
  if (lp) FSDP_TRY(reduce_queue(e, u, cast_grad, cast_task));
  const void *send = lp ? (const void *)e->pools.grad_lp : (const void *)src;
  fsdp_dtype_t dt = lp ? FSDP_BF16 : FSDP_F32;
  if (e->conf.shard_world > 1)
    FSDP_TRY(fsdp_reduce_scatter(e->comm.comm_reduce, send,
                                 lp ? (void *)e->pools.staging_lp : e->pools.staging, u->shard, dt,
                                 FSDP_SUM, e->comm.s_reduce));
  else if (e->conf.nranks > 1)
    FSDP_TRY(fsdp_all_reduce(e->comm.comm_reduce, send, (void *)send, u->padded, dt, FSDP_SUM,
                             e->comm.s_reduce));
  FSDP_TRY(reduce_queue(e, u, accumulate, accumulate_task));
  if (host) FSDP_TRY(fsdp_stream_launch(e->comm.s_reduce, reduce_mark, &u->sched.reduce_op));
  else
    FSDP_TRY(fsdp_tl_mark_end(e, e->comm.s_reduce, mark, (fsdp_tl_event_t){FSDP_TL_REDUCE,
                              unit_index(e, u), FSDP_BACKWARD, 2, 0.0, 0.0, reduce_bytes(e, u)}));
  FSDP_TRY(fsdp_event_record(u->sched.reduced, e->comm.s_reduce));
  return e->conf.hybrid && u->sched.bwd_count == e->conf.cfg.grad_accum ? replica_issue(e, u)
                                                                  : FSDP_SUCCESS;
}

/* ---- order checks ------------------------------------------------------- */

static fsdp_status_t check_order(struct fsdp_engine *e, struct unit *u, fsdp_pass_t pass) {
  int ui = unit_index(e, u);
  if (u->sched.held >= 0)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "unit '%s' is already acquired (in %s)", u->name,
                      pass_name((fsdp_pass_t)u->sched.held));
  if (pass == FSDP_FORWARD) {
    if (e->sched.phase == PHASE_BACKWARD)
      return fsdp_error(FSDP_ERR_INVALID_USAGE,
                        "forward acquire of unit '%s' in the middle of a backward pass "
                        "(%d of %d units done): finish the backward first", u->name,
                        e->sched.bwd_next, e->plan.n_units);
    if (ui != e->sched.fwd_next)
      return fsdp_error(FSDP_ERR_INVALID_USAGE,
                        "unit '%s' acquired out of order in forward: expected '%s' (units are "
                        "acquired in the order they were added)", u->name,
                        e->plan.units[e->sched.fwd_next % e->plan.n_units].name);
    return FSDP_SUCCESS;
  }
  if (e->sched.phase != PHASE_BACKWARD && !e->sched.fwd_done)
    return fsdp_error(FSDP_ERR_INVALID_USAGE,
                      "backward acquire of unit '%s' without a complete forward pass before it",
                      u->name);
  int pos = e->sched.phase == PHASE_BACKWARD ? e->sched.bwd_next : 0;
  int want = e->sched.fwd_release[e->plan.n_units - 1 - pos];
  if (ui != want)
    return fsdp_error(FSDP_ERR_INVALID_USAGE,
                      "unit '%s' acquired out of order in backward: expected '%s' (backward "
                      "goes in the reverse of the forward release order)", u->name,
                      e->plan.units[want].name);
  if (u->sched.bwd_count >= e->conf.cfg.grad_accum)
    return fsdp_error(FSDP_ERR_INVALID_USAGE,
                      "unit '%s': backward pass %d in one step but config.grad_accum is %d: "
                      "call fsdp_engine_step",
                      u->name, u->sched.bwd_count + 1, e->conf.cfg.grad_accum);
  return FSDP_SUCCESS;
}

static fsdp_status_t unit_lookup(fsdp_engine_t e, fsdp_unit_t unit, fsdp_pass_t pass,
                                 const char *what, struct unit **u) {
  FSDP_TRY(fsdp_engine_check_live(e));
  if (!e->plan.materialized)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "%s before fsdp_engine_materialize", what);
  if (unit < 0 || unit >= e->plan.n_units)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: unit %d does not exist (%d units)", what,
                      unit, e->plan.n_units);
  if (pass != FSDP_FORWARD && pass != FSDP_BACKWARD)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: pass %d is neither forward nor backward",
                      what, (int)pass);
  *u = &e->plan.units[unit];
  return FSDP_SUCCESS;
}

/* ---- acquire / release -------------------------------------------------- */

static fsdp_status_t acquire(struct fsdp_engine *e, struct unit *u, fsdp_pass_t pass,
                             fsdp_view_t *view) {
  int starts = pass == FSDP_FORWARD ? e->sched.fwd_next == 0 : e->sched.phase != PHASE_BACKWARD;
  int pos = pass == FSDP_FORWARD ? e->sched.fwd_next : starts ? 0 : e->sched.bwd_next;
  /* The one failure the caller can fix (no free buffer) leaves no trace. */
  FSDP_TRY(gather_needed(e, u, pass));
  if (starts && pass == FSDP_FORWARD) {
    e->sched.phase = PHASE_FORWARD;
    e->sched.n_released = 0;
  } else if (starts) {
    e->sched.phase = PHASE_BACKWARD;
    e->sched.bwd_next = e->sched.bwd_released = 0;
  }
  e->sched.fwd_done = e->sched.fwd_done && !starts;
  FSDP_TRY(prefetch(e, pass, pos));
  FSDP_TRY(fsdp_compute_wait(e, u->sched.ready, unit_index(e, u), pass));
  /* 16-bit params on CUDA: views show the gathered values themselves. */
  int lp = u->lowp && !u->widen;
  const void *base = e->conf.shard_world > 1 ? (lp ? (const void *)e->pools.pslots[u->sched.slot].lp
                                                : (const void *)e->pools.pslots[u->sched.slot].buf)
                     : lp      ? (const void *)u->mem.lp
                     : u->lowp ? (const void *)u->mem.rounded
                               : (const void *)u->mem.master;
  size_t elem = lp ? sizeof(uint16_t) : sizeof(float);
  for (int i = 0; i < u->n_tensors; i++)
    u->sched.param_ptrs[i] = (float *)((char *)base + u->tensors[i].offset * elem);
  if (pass == FSDP_BACKWARD) {
    float *g = NULL;
    FSDP_TRY(grad_buffer(e, u, &g));
    for (int i = 0; i < u->n_tensors; i++) u->sched.grad_ptrs[i] = g + u->tensors[i].offset;
    e->sched.bwd_next = pos + 1;
  } else {
    e->sched.fwd_next++;
  }
  u->sched.held = (int)pass;
  *view =
      (fsdp_view_t){u->n_tensors, u->sched.param_ptrs,
                    pass == FSDP_BACKWARD ? u->sched.grad_ptrs : NULL, lp ? u->lp_dtype : FSDP_F32};
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_unit_acquire(fsdp_engine_t e, fsdp_unit_t unit, fsdp_pass_t pass,
                                fsdp_view_t *view) {
  struct unit *u = NULL;
  FSDP_TRY(unit_lookup(e, unit, pass, "fsdp_unit_acquire", &u));
  if (!view) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_unit_acquire: view is NULL");
  FSDP_TRY(check_order(e, u, pass));
  double t0 = fsdp_time_now();
  fsdp_status_t st = acquire(e, u, pass, view);
  if (st == FSDP_ERR_INVALID_USAGE) return st;
  if (st != FSDP_SUCCESS) return fsdp_engine_poison(e, st);
  fsdp_tl_add(e, FSDP_TL_ACQUIRE, unit, pass, 0, t0, fsdp_time_now(), 0);
  return FSDP_SUCCESS;
}

/* After u's backward: its gradient goes on to the shard (grad_buffer's
 * three cases). */
static fsdp_status_t grad_release(struct fsdp_engine *e, struct unit *u) {
  if (e->conf.direct_grads) return FSDP_SUCCESS; /* already there */
  if (!e->conf.cfg.accumulate_full_grads) {
    e->pools.gslots[u->sched.gslot].held = 0;
    return reduce_issue(e, u, e->pools.gslots[u->sched.gslot].buf);
  }
  return u->sched.bwd_count == e->conf.cfg.grad_accum ? reduce_issue(e, u, u->mem.full_grad)
                                                      : FSDP_SUCCESS;
}

static fsdp_status_t release(struct fsdp_engine *e, struct unit *u, fsdp_pass_t pass) {
  u->sched.held = -1;
  if (pass == FSDP_FORWARD) {
    e->sched.fwd_release[e->sched.n_released++] = unit_index(e, u);
    if (u->reshard && u->sched.slot >= 0) FSDP_TRY(slot_release(e, u));
    if (e->sched.n_released == e->plan.n_units) {
      e->sched.phase = PHASE_IDLE;
      e->sched.fwd_done = 1;
      e->sched.fwd_next = 0;
    }
    return FSDP_SUCCESS;
  }
  u->sched.bwd_count++;
  FSDP_TRY(grad_release(e, u));
  u->sched.gslot = -1;
  if (u->sched.slot >= 0) FSDP_TRY(slot_release(e, u));
  if (++e->sched.bwd_released == e->plan.n_units) e->sched.phase = PHASE_IDLE;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_unit_release(fsdp_engine_t e, fsdp_unit_t unit, fsdp_pass_t pass) {
  struct unit *u = NULL;
  FSDP_TRY(unit_lookup(e, unit, pass, "fsdp_unit_release", &u));
  if (u->sched.held != (int)pass)
    return fsdp_error(FSDP_ERR_INVALID_USAGE,
                      "unit '%s' released in %s but it is not acquired in %s%s", u->name,
                      pass_name(pass), pass_name(pass),
                      u->sched.held < 0 ? " (released twice?)" : "");
  double t0 = fsdp_time_now();
  fsdp_status_t st = release(e, u, pass);
  if (st != FSDP_SUCCESS) return fsdp_engine_poison(e, st);
  fsdp_tl_add(e, FSDP_TL_RELEASE, unit, pass, 0, t0, fsdp_time_now(), 0);
  return FSDP_SUCCESS;
}

/* ---- set-up -------------------------------------------------------------- */

fsdp_status_t fsdp_engine_sched_create(struct fsdp_engine *e) {
  return fsdp_event_create(&e->sched.compute_done);
}

fsdp_status_t fsdp_engine_sched_plan(struct fsdp_engine *e) {
  e->sched.fwd_release = calloc((size_t)e->plan.n_units, sizeof *e->sched.fwd_release);
  if (!e->sched.fwd_release)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "engine: out of host memory");
  return FSDP_SUCCESS;
}

void fsdp_engine_sched_destroy(struct fsdp_engine *e) {
  fsdp_event_destroy(e->sched.compute_done);
  free(e->sched.fwd_release);
}
