/* src/engine/engine_internal.h — the engine's private state, shared by the
 * engine's source files (life.c: create, materialize, destroy; engine.c:
 * configuration; comms.c: communicators and their streams; units.c: the registry;
 * materialize.c: shards and pools; tensor_io.c: parameters in and out;
 * schedule.c: gathers and reductions; step.c: the optimizer step;
 * accounting.c: memory and the timeline; consistency.c: the start-up
 * comparison of configuration and plan across ranks). */
#ifndef FSDP_ENGINE_INTERNAL_H
#define FSDP_ENGINE_INTERNAL_H

#include <pthread.h>

#include "core/internal.h"
#include "backend/compute.h"
#include "device/stream_internal.h"
#include "fsdp/engine.h"
#include "fsdp/profile.h"

struct tensor {
  char *name;
  int ndim;
  int64_t shape[FSDP_MAX_DIMS];
  size_t numel;
  size_t offset; /* in the unit's flat buffer */
  fsdp_init_kind_t init;
  float init_scale;
  int no_decay;
  float lr_mult, wd_mult; /* parameter groups (fsdp_unit_opts_t) */
};

/* A unit has at most one gather and one reduction in flight, so the closures its
 * stream work needs live here instead of being allocated per operation. */
struct unit;
struct stream_op {
  struct fsdp_engine *eng;
  struct unit *u;
  fsdp_pass_t pass;
  double t_begin;
  const uint16_t *lp; /* 16-bit gathers on the CPU: the gathered values to widen into dst */
  float *dst;
};

/* A unit's memory (materialize.c allocates it, units.c frees it; the step
 * updates the values in place; the host copies are tensor_io.c's). */
struct unit_mem {
  float *master, *grad, *m, *v; /* shard-sized, persistent */
  unsigned long long *decay_runs; /* CUDA AdamW: start << 1 | decay of each run of the shard's
                                     elements sharing a decay flag (device); n_runs of them */
  int n_runs;
  uint16_t *lp;                 /* 16-bit params: the master shard rounded, what is gathered */
  float *rounded;               /* 16-bit params on one shard (CPU): lp widened, what views show */
  float *full_grad;             /* accumulate_full_grads only: padded-sized */
  /* CUDA: host copies of master, grad, m, v that fsdp_unit_shard hands out
   * until fsdp_unit_shard_release; written back at fsdp_engine_set_step while
   * mirror_dirty. */
  float *mirror[4];
  int mirror_dirty;
};

/* A unit's place in the schedule (schedule.c; the step counts backward
 * passes off and waits for the reductions). */
struct unit_sched {
  int slot;      /* param slot holding the gathered params, -1 none */
  int held;      /* acquired by the caller: -1 no, else the pass */
  int gslot;     /* grad slot handed out in backward, -1 none */
  int bwd_count; /* backward passes since the last step */

  float **param_ptrs, **grad_ptrs; /* what views point at */
  fsdp_event_t ready;              /* gather done (gather stream) */
  fsdp_event_t reduced;            /* last reduction done (reduce stream) */
  struct stream_op gather_op, reduce_op;
  float reduce_scale;
  float *reduce_src; /* full gradient being reduced */
  /* HSDP: the gradient shard's all-reduce across the replica group. */
  fsdp_event_t replicated;
  struct stream_op replica_op;
};

/* A unit: its plan (units.c registers it, materialize.c lays it out), its
 * memory and its schedule state. */
struct unit {
  char *name, *kind;
  int n_tensors;
  struct tensor *tensors;
  size_t numel, padded, shard, shard_offset;
  size_t count; /* real elements of this rank's slice */
  /* Per-unit choices (fsdp_unit_opts_t), resolved at add. */
  int reshard;              /* free the gathered params at the forward release (ZeRO-3) */
  int lowp;                 /* gathered in 16 bits (bf16 or f16) */
  fsdp_dtype_t lp_dtype;    /* that dtype (FSDP_F32 when !lowp) */
  int widen;                /* 16 bits on the CPU: gathers are widened to f32 for compute */
  int own_slot;             /* !reshard: the param slot reserved for it, else -1 */

  struct unit_mem mem;
  struct unit_sched sched;
};

/* Param slots: [0, n_own) reserved, one per unit that keeps its gathered
 * parameters from forward to backward (reshard_after_forward 0); the rest
 * shared by the resharding units, max_padded each. */
struct pslot {
  float *buf;      /* what views show (f32); NULL on CUDA with 16-bit params */
  uint16_t *lp;    /* 16-bit params: the gathered values (CPU: widened into buf) */
  size_t capacity; /* elements */
  int owner;       /* unit or -1 */
  fsdp_event_t free_ev; /* compute stream passed the last use */
};

/* Three full-gradient buffers: one for a root unit held across the others in
 * backward, two alternating between the unit computing and the one reducing. */
#define FSDP_GRAD_SLOTS 3
struct gslot {
  float *buf;
  int owner; /* unit that last used it, -1 none */
  int busy;  /* its owner's reduction may still be reading it */
  int held;  /* handed out to an acquired unit */
};

typedef enum { PHASE_IDLE = 0, PHASE_FORWARD, PHASE_BACKWARD } phase_t;

/* The engine's state by concept. Each part names the file that owns it: the
 * one that sets it up, frees it and (but for what the comment says) is its
 * only writer; the others read it. */

/* Configuration (engine.c): resolved at create, then only read. */
struct engine_conf {
  fsdp_world_t world;
  fsdp_config_t cfg;
  int rank, nranks;
  int shard_world; /* ranks a unit is sharded over (shard group): shard_size, 1 for NO_SHARD */
  int shard_rank;  /* this rank in its shard group (rank % shard_world) */
  int hybrid;      /* HSDP: 1 < shard_world < nranks, replica all-reduce after reduce-scatter */
  int bf16_reduce; /* reduce_dtype is bf16 */
  int direct_grads; /* one rank, one micro-batch: backward adds into the grad shards themselves */
  char *comm_backend; /* config.comm_backend, copied (cfg.comm_backend points here) */
  size_t stats_bytes; /* of fsdp_step_stats_t the caller's header has (see engine.c) */
};

/* The device (life.c): config.device's compute table, whose `device` says
 * where every buffer of the engine lives (fsdp_engine_on_host), and the
 * stream the caller's compute and the shard kernels run on. */
struct engine_dev {
  const fsdp_compute_ops_t *ops; /* every shard kernel */
  fsdp_stream_t s_compute; /* CUDA: the compute stream; CPU: the host stream (NULL) */
};

/* The plan and its units (units.c registers them; materialize.c lays them
 * out and sets what follows n_units; life.c marks them materialized). */
struct engine_plan {
  struct unit *units;
  int n_units, cap_units;
  int materialized;
  uint64_t seed;
  int lowp;      /* some resharding unit gathers 16 bits (shared slots carry 16-bit buffers) */
  int f32_views; /* some resharding unit's views read f32 from a shared slot */
  size_t max_padded, max_shard;
};

/* Communication (comms.c): communicators and the streams collectives run on. */
struct engine_comm {
  fsdp_comm_t comm_host, comm_gather, comm_reduce;
  /* HSDP only (else NULL): the replica group on the gather backend, and the
   * shard group on the host backend (gradient norm, read_tensor). */
  fsdp_comm_t comm_replica, comm_host_shard;
  fsdp_stream_t s_gather, s_reduce;
  fsdp_stream_t s_replica; /* HSDP: the replica all-reduces */
  fsdp_stream_t s_aux; /* CUDA with worker comm streams: their kernels' stream; else NULL */
  int device;          /* CUDA: the device ordinal current at creation, the workers' */
};

/* Memory pools (materialize.c allocates and frees them; the schedule hands
 * the slots out: their owner, busy and held fields are schedule.c's). */
struct engine_pools {
  struct pslot *pslots;
  int n_pslots, n_own;
  size_t shared_capacity; /* elements of a shared slot */
  /* CUDA AdamW on one tensor piece (units with parameter groups): device
   * {0, 1}, a run from element 0 without, and with, weight decay. */
  unsigned long long *piece_runs;
  struct gslot gslots[FSDP_GRAD_SLOTS];
  int n_gslots;
  float *staging; /* reduction output, one shard; used on the reduce stream only */
  uint16_t *grad_lp, *staging_lp; /* bf16 reduce: the cast gradient and its reduced shard */
  double *norm_dev;  /* CUDA step: per-unit sums of squares, then the partials */
  double *norm_host; /* CUDA step: the per-unit sums, copied back */
  size_t param_pool_bytes, grad_pool_bytes, staging_bytes; /* what the above reserve */
};

/* Schedule and prefetch (schedule.c; the step ends a phase). */
struct engine_sched {
  phase_t phase;
  int fwd_next;      /* next unit to acquire in forward */
  int fwd_done;      /* a complete forward awaits its backward */
  fsdp_event_t compute_done; /* recorded on the compute stream before a reduction */
  int *fwd_release;  /* release order of the last forward */
  int n_released;
  int bwd_next;      /* backward acquires so far: index into reversed fwd_release */
  int bwd_released;  /* backward releases so far */
  int next_gslot;    /* the grad slot to try first */
};

/* The optimizer step's counters, numerics guard and loss scaler (step.c). */
struct engine_optim {
  int64_t step;
  int64_t optim_step; /* updates since the optimizer state was last zeroed */
  int loss_bad;            /* a non-finite loss was reported since the last step */
  int consecutive_skips;
  int64_t skipped_total;
  double loss_scale;       /* 1: no scaling */
  int64_t good_steps;      /* updates in a row since the scale last changed */
};

/* Statistics and the timeline (accounting.c; others count through
 * fsdp_mem_track and fsdp_tl_add; the kernel profile is profile.c's). */
struct engine_stats {
  size_t gathered, gathered_peak, grads_live, grads_peak;
  size_t host_copies, host_copies_peak; /* CUDA: fsdp_unit_shard's host copies (tensor_io.c) */
  /* timeline, appended from the comm streams too */
  pthread_mutex_t tl_lock;
  fsdp_tl_event_t *tl;
  size_t tl_count, tl_cap, tl_dropped;
  /* CUDA: collectives on CUDA communication streams and the compute
   * stream's waits for them, marked with timing events (accounting.c),
   * waiting to be read into the timeline; NULL without a timeline or CUDA. */
  fsdp_marks_t tl_marks;
  struct tl_pending *tl_pending;
  size_t n_pending, cap_pending;
  /* per-kernel-class timing (profile.c); NULL until profiling is first on */
  struct kprof *prof;
};

struct fsdp_engine {
  struct engine_conf conf;
  struct engine_dev dev;
  struct engine_plan plan;
  struct engine_comm comm;
  struct engine_pools pools;
  struct engine_sched sched;
  struct engine_optim optim;
  struct engine_stats stats;
  /* first asynchronous failure; every later call reports it (engine.c) */
  fsdp_status_t poisoned;
  char poison_msg[512];
};

/* The engine's buffers are host memory (config.device's compute table says
 * where its pointers live): fsdp_unit_shard hands them out in place, they
 * are filled directly, and the CPU kernels compute on f32 views of 16-bit
 * parameters. Otherwise (CUDA) they are device memory. */
static inline int fsdp_engine_on_host(const struct fsdp_engine *e) {
  return e->dev.ops->device == FSDP_DEVICE_CPU;
}

void fsdp_tl_add(struct fsdp_engine *e, fsdp_tl_kind_t kind, int unit, fsdp_pass_t pass,
                 int stream, double t0, double t1, size_t bytes);
/* Collectives on CUDA streams go on the timeline without host functions: a
 * timing mark (a CUDA event) is recorded on the stream before the collective
 * (fsdp_tl_mark_begin; *mark FSDP_NO_MARK when none) and after it
 * (fsdp_tl_mark_end, with the event to add, its times left out), and
 * fsdp_tl_resolve reads the marks of every collective the streams have passed
 * into the timeline: at the step's end and when the timeline is read. A pool
 * holds the marks of min(timeline_capacity, FSDP_TL_MARKED_MAX) collectives
 * and compute-stream waits between two reads (about 6 per unit and
 * micro-batch: two gathers, a reduction, up to three waits); those past it
 * count as dropped. No-ops without a timeline or CUDA. */
#define FSDP_TL_MARKED_MAX 8192
struct tl_pending {
  fsdp_tl_event_t ev;
  size_t begin, end; /* marks */
};
fsdp_status_t fsdp_tl_marks_create(struct fsdp_engine *e);
void fsdp_tl_marks_destroy(struct fsdp_engine *e);
fsdp_status_t fsdp_tl_mark_begin(struct fsdp_engine *e, fsdp_stream_t s, size_t *mark);
fsdp_status_t fsdp_tl_mark_end(struct fsdp_engine *e, fsdp_stream_t s, size_t begin,
                               fsdp_tl_event_t ev);
fsdp_status_t fsdp_tl_resolve(struct fsdp_engine *e);
/* The compute stream waits for ev (a collective's completion); on CUDA with a
 * timeline, between two marks that put the stall on the timeline as
 * FSDP_TL_COMPUTE_WAIT (unit, pass). Only the host thread calls it. */
fsdp_status_t fsdp_compute_wait(struct fsdp_engine *e, fsdp_event_t ev, int unit,
                                fsdp_pass_t pass);
/* Kernel-class scopes (profile.c): adds those the compute stream has passed
 * (every one with wait, which waits for the stream); destroy frees it. */
fsdp_status_t fsdp_kprof_drain(struct fsdp_engine *e, int wait);
void fsdp_kprof_destroy(struct fsdp_engine *e);
void fsdp_mem_track(size_t *live, size_t *peak, size_t add, size_t sub);
/* Bytes per element of a gather buffer: what is gathered, plus the f32 twin
 * the CPU widens bf16 into. */
static inline size_t fsdp_gather_elem_bytes(const struct unit *u) {
  return u->lowp ? sizeof(uint16_t) + (u->widen ? sizeof(float) : 0) : sizeof(float);
}
static inline size_t fsdp_unit_gathered_bytes(const struct fsdp_engine *e, const struct unit *u) {
  (void)e;
  return u->padded * fsdp_gather_elem_bytes(u);
}
/* The communicator for host-side sums over one copy of the model: the shard
 * group's under HSDP (every replica holds the same shards), else the world's. */
static inline fsdp_comm_t fsdp_engine_shard_comm(const struct fsdp_engine *e) {
  return e->comm.comm_host_shard ? e->comm.comm_host_shard : e->comm.comm_host;
}
/* Memory of the engine's device, zeroed; NULL on failure (the error is set). */
void *fsdp_engine_alloc(const struct fsdp_engine *e, size_t bytes);
void fsdp_engine_free(const struct fsdp_engine *e, void *p);
/* Zeroes bytes at p in stream order on the compute stream (CPU: now). */
fsdp_status_t fsdp_engine_zero(const struct fsdp_engine *e, void *p, size_t bytes);
fsdp_status_t fsdp_engine_poison(struct fsdp_engine *e, fsdp_status_t st);
fsdp_status_t fsdp_engine_check_live(struct fsdp_engine *e);
/* Each part's set-up and release, in its owner's file, called by life.c.
 * engine.c: the configuration resolved and checked (conf_free may follow a
 * failed conf_init). materialize.c: the shards and pools. comms.c: the
 * communicators and their streams (after the configuration); stop destroys
 * the streams (first of all: queued work may touch any buffer), destroy the
 * communicators (last). accounting.c: the timeline's lock and marks, and all
 * statistics state. schedule.c: its event, and the release order sized for
 * the units at materialize. units.c: the units. step.c: the loss scaler's
 * start. */
fsdp_status_t fsdp_engine_conf_init(struct fsdp_engine *e, fsdp_world_t world,
                                    const fsdp_config_t *cfg);
void fsdp_engine_conf_free(struct fsdp_engine *e);
fsdp_status_t fsdp_engine_shards_create(struct fsdp_engine *e, uint64_t seed);
fsdp_status_t fsdp_engine_comm_create(struct fsdp_engine *e);
void fsdp_engine_comm_stop(struct fsdp_engine *e);
void fsdp_engine_comm_destroy(struct fsdp_engine *e);
fsdp_status_t fsdp_engine_stats_create(struct fsdp_engine *e);
void fsdp_engine_stats_destroy(struct fsdp_engine *e);
fsdp_status_t fsdp_engine_sched_create(struct fsdp_engine *e);
fsdp_status_t fsdp_engine_sched_plan(struct fsdp_engine *e);
void fsdp_engine_sched_destroy(struct fsdp_engine *e);
void fsdp_engine_pools_free(struct fsdp_engine *e);
void fsdp_engine_units_free(struct fsdp_engine *e);
void fsdp_engine_optim_init(struct fsdp_engine *e);

/* The consistency check of the engine's own part, configuration and unit
 * plan (consistency.c); fsdp_engine_materialize runs it first. */
fsdp_status_t fsdp_engine_check_plan(struct fsdp_engine *e);

/* The unit registry (units.c). fsdp_tensor_find: the tensor named `name` and
 * where it is (unit, index may be NULL), or NULL. fsdp_unit_get: unit `unit`,
 * or an error naming `what`. fsdp_unit_free: everything a unit owns. */
const struct tensor *fsdp_tensor_find(const struct fsdp_engine *e, const char *name, int *unit,
                                      int *index);
fsdp_status_t fsdp_unit_get(fsdp_engine_t e, fsdp_unit_t unit, const char *what,
                            struct unit **u);
void fsdp_unit_free(const struct fsdp_engine *e, struct unit *u);

/* Calls fn for each piece of a tensor inside [lo, hi) of the unit's flat buffer
 * with the piece's first element within the tensor, its length and flat offset. */
typedef void (*fsdp_segment_fn)(const struct tensor *t, size_t t_first, size_t n, size_t flat,
                                void *ctx);
void fsdp_unit_segments(const struct unit *u, size_t lo, size_t hi, fsdp_segment_fn fn,
                        void *ctx);
/* One more shared param slot (materialize.c): at materialize, and when a
 * first step shows units held across the others (schedule.c). */
fsdp_status_t fsdp_engine_add_shared_slot(struct fsdp_engine *e);
/* What a loader wrote into u's host copies (fsdp_unit_shard on CUDA), to the
 * device (tensor_io.c). */
fsdp_status_t fsdp_unit_host_copies_write_back(struct unit *u);
/* Frees gathered copies no caller holds; they go stale when weights change. */
void fsdp_engine_drop_gathers(struct fsdp_engine *e);
/* After the master shard of u changed: its bf16 copy (and widened view copy)
 * follow. No-op for f32 parameters. */
fsdp_status_t fsdp_unit_refresh_params(const struct fsdp_engine *e, struct unit *u);
/* Its second half, after the 16-bit copy was written (AdamW writes it): the
 * widened view copy follows. No-op without one. */
fsdp_status_t fsdp_unit_widen_params(const struct fsdp_engine *e, struct unit *u);

#endif
