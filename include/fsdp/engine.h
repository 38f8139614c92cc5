/* fsdp/engine.h — the FSDP engine: units, flat shards, the gather/compute/
 * reduce-scatter schedule, the optimizer on shards, memory and timeline.
 *
 * Life of an engine
 *   fsdp_engine_create     (config is validated and copied)
 *   fsdp_unit_add ...      (in forward execution order; named tensors per unit)
 *   fsdp_engine_materialize(seed)  -> shards allocated and initialised
 *   per step, per micro-batch (config.grad_accum of them):
 *     forward:  for each unit:  fsdp_unit_acquire(FWD) ... compute ... release
 *     backward: for each unit, in the reverse of the forward release order:
 *               fsdp_unit_acquire(BWD) ... compute, grads += ... release
 *   fsdp_engine_step       -> clip, AdamW/SGD on the shard, lr schedule
 *
 * Units may nest (a root unit acquired first and released last, as for tied
 * embeddings): backward must then acquire units in the reverse of the order in
 * which forward released them. The engine checks both orders and prefetches
 * along them.
 *
 * Flat shards: a unit's tensors are laid end to end and padded to a multiple of
 * world_size * align elements (world_size: the shard group's under HSDP);
 * rank r owns the slice [r*S, (r+1)*S). Padding is
 * never visible: views and tensor reads cover real elements only, padding is zero
 * and never counts in the gradient norm.
 *
 * Strategies and their memory per rank (P parameters, N ranks, S = shard_size
 * ranks per shard group, S = N unless HSDP, AdamW, fp32):
 *   FSDP_FULL_SHARD    (ZeRO-3) 16P/S persistent + gathered params of at most
 *                      max_live_units units in shared buffers of the largest
 *                      unit's size (unset: prefetch_depth + 1, plus one per unit
 *                      held across the others, e.g. a tied-embedding root: the
 *                      engine adds those buffers in the first step that nests
 *                      units, so prefetch never stops for lack of one)
 *   FSDP_SHARD_GRAD_OP (ZeRO-2) 16P/S persistent + every unit's params gathered
 *                      from its forward until its backward, each in a buffer of
 *                      its own size
 *   FSDP_NO_SHARD      (DDP)    16P persistent, gradients all-reduced
 * Per unit (fsdp_unit_add_opts) reshard_after_forward picks ZeRO-3 or ZeRO-2
 * behaviour and param_dtype f32 or bf16 for that unit alone: transient memory
 * is then sum over the ZeRO-2 units of padded x e(u) + the shared buffers x
 * (largest ZeRO-3 unit) x e, where e(u) is 4 bytes per element (f32), 2
 * (bf16/f16 on CUDA) or 6 (bf16/f16 on the CPU, with its f32 twin), and e for
 * a shared buffer holds what any ZeRO-3 unit needs (4 + 2 when f32 and 16-bit
 * units share it); persistent memory adds 2 bytes per shard element of each
 * 16-bit unit (+4 on one rank). fsdp_engine_memory reports exactly these.
 *
 * Hybrid sharding (HSDP, config.shard_size S < N, S dividing N): the world is
 * R = N/S replica groups x S ranks per shard group. Shard group g is the
 * consecutive ranks [g*S, (g+1)*S) (rank r is rank r % S of group r / S, so
 * with S = ranks per node a shard group is a node); replica group k is the
 * ranks equal to k mod S, one per shard group. Units are sharded over the
 * shard group (layout as above with world_size S): parameters are gathered
 * and gradients reduce-scattered within it; then, once per step, after a
 * unit's last reduce-scatter, its fp32 gradient shard is all-reduced (summed)
 * across the replica group on a stream of its own (1/S of the gradient bytes,
 * overlapping the rest of backward; the step waits for it), and the optimizer
 * runs on the shard. The gradient norm sums over one shard group. S = N is
 * plain FSDP, unchanged (no sub-communicators); S = 1 keeps the whole model
 * on every rank and all-reduces gradients (as NO_SHARD). The engine creates
 * its sub-communicators with fsdp_comm_split on the gather backend (mpi, gloo,
 * nccl) and the world's host backend; watchdog and desync reports name the
 * group ("shard group 1, world ranks 2-3"). Checkpoints are written by shard
 * group 0 in the format of a world of S ranks, and load at any R x S or N.
 * The timeline records the replica all-reduces as FSDP_TL_REPLICA_REDUCE.
 * On one rank every strategy reads its (whole) master shard directly: nothing is
 * gathered and nothing is copied.
 *
 * Mixed precision (param_dtype FSDP_BF16 or FSDP_F16): master shards and
 * optimizer state stay fp32; after every update the shard is rounded (to
 * nearest even) to the 16-bit type and that is what the gathers move (half the
 * bytes). On CUDA, views show the gathered values themselves (view.dtype
 * FSDP_BF16 or FSDP_F16; the nn models compute in bf16 only); on the CPU they
 * show them widened to f32 (the CPU computes in fp32), so compute sees exactly
 * the parameters a 16-bit GPU run sees. Costs per rank: +2 bytes per parameter
 * / N for the 16-bit shard, and on the CPU each gather buffer has an f32 twin
 * (6 bytes per gathered element). fp16 keeps 11 significant bits (bf16: 8) but
 * only magnitudes from 6e-8 to 65504: parameters past it gather as Inf (caught
 * by the numerics guard below), and fp16 runs use loss scaling by default.
 * Gradients are reduced in reduce_dtype: FSDP_F32 (default), or FSDP_BF16 (the
 * fp32 gradient is rounded to bf16, reduced in bf16 — each pairwise sum rounded
 * — and added into the fp32 gradient shard: half the bytes, about 3 significant
 * digits per micro-batch; costs a bf16 copy of the largest unit's gradient).
 *
 * Devices (config.device): FSDP_DEVICE_CPU keeps everything in host memory.
 * FSDP_DEVICE_CUDA keeps shards, optimizer state, gather and gradient buffers
 * in device memory of the device current when fsdp_engine_create is called
 * (choose it first: fsdp_cuda_set_device, e.g. local rank % device count). They
 * are allocated at materialize and reused: nothing is allocated inside a step,
 * so memory is a function of the configuration. Compute goes on
 * fsdp_engine_stream (a CUDA stream); the optimizer step runs there too.
 * Communication (config.comm_backend):
 *   "nccl"        gathers and reductions queued on two high-priority CUDA
 *                 streams, ordered against compute by events: no host
 *                 synchronisation inside a micro-batch, no host function on
 *                 any stream (the timeline reads CUDA events); the step
 *                 synchronises once (the gradient norm comes back to the host);
 *   NULL, "mpi"   the world's host backend on worker threads, device buffers
 *                 staged through pinned host memory (several ranks may share a
 *                 GPU, which NCCL refuses); acquiring a unit waits on the host
 *                 for its gather.
 * The host communicator (fsdp_engine_comm) is always the world's (HSDP too).
 * Gradient accumulation over grad_accum micro-batches:
 *   default                each micro-batch's gradients are reduce-scattered into
 *                          the fp32 gradient shard: grad_accum x the traffic;
 *                          three full-gradient buffers of the largest unit (a
 *                          held root, one computing, one reducing);
 *   accumulate_full_grads  full fp32 gradients of every unit are kept across the
 *                          micro-batches and reduced once on the last: 1x the
 *                          traffic, +4P bytes per rank.
 * On one rank with grad_accum 1, with or without accumulate_full_grads, there
 * are no gradient buffers: grad[i] points into the gradient shard itself (zero
 * at acquire all the same), and nothing is reduced or accumulated.
 *
 * Streams: compute happens on fsdp_engine_stream (the calling thread on the CPU
 * backend, FSDP_HOST_STREAM; a CUDA stream on CUDA); gathers and reductions run
 * on two communication streams of their own and overlap compute. Views are
 * valid from acquire until release; on CUDA the caller queues its work that
 * uses them on fsdp_engine_stream before the release.
 *
 * Thread safety: one engine is driven by one thread. Distinct engines are
 * independent. Errors: after a failed collective the engine is poisoned and
 * every later call returns that error; usage errors (wrong order, bad names)
 * leave the engine as it was. */
#ifndef FSDP_ENGINE_H
#define FSDP_ENGINE_H

#include "fsdp/comm.h"
#include "fsdp/core.h"
#include "fsdp/device.h"
#include "fsdp/optim.h"
#include "fsdp/world.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_engine *fsdp_engine_t;
typedef int fsdp_unit_t; /* index in registration order */

typedef enum {
  FSDP_FULL_SHARD = 0, /* ZeRO-3 */
  FSDP_SHARD_GRAD_OP,  /* ZeRO-2 */
  FSDP_NO_SHARD        /* replicated, all-reduce */
} fsdp_strategy_t;

typedef enum { FSDP_FORWARD = 0, FSDP_BACKWARD } fsdp_pass_t;

FSDP_API const char *fsdp_strategy_name(fsdp_strategy_t s); /* "zero3","zero2","noshard" */
/* Parses "zero3"/"full_shard", "zero2"/"shard_grad_op", "noshard"/"no_shard". */
FSDP_API fsdp_status_t fsdp_strategy_parse(const char *text, fsdp_strategy_t *out);

/* Engine configuration. Start from FSDP_CONFIG_INIT and set what you need.
 *
 * Compatibility (the NCCL ncclConfig_t rule): size, magic and version come
 * first and are set by FSDP_CONFIG_INIT; new fields are only ever appended. A
 * program compiled against an older header passes its smaller size, and every
 * field past it takes its default; a config not made by FSDP_CONFIG_INIT (magic
 * wrong) or from a newer header than the library is refused with a message.
 * optim and schedule are embedded by value and frozen: options added later
 * become fields of this struct. Fields whose default depends on something else
 * use an "unset" value (0 or NULL, said below) that fsdp_config_resolve and
 * fsdp_engine_create replace. */
typedef struct {
  size_t size;                   /* sizeof(fsdp_config_t) as the caller compiled it */
  unsigned int magic;            /* FSDP_CONFIG_MAGIC */
  unsigned int version;          /* FSDP_VERSION_CODE of the caller's header */
  fsdp_strategy_t strategy;      /* FSDP_FULL_SHARD */
  int prefetch_depth;            /* 1: units gathered ahead; 0 = off */
  int max_live_units;            /* 0 (unset): prefetch_depth + 1; hard cap on gathered units */
  int grad_accum;                /* 1: micro-batches per step */
  int accumulate_full_grads;     /* 0: see above */
  fsdp_reduce_op_t grad_reduce;  /* FSDP_AVG: mean over ranks and micro-batches */
  fsdp_dtype_t param_dtype;      /* FSDP_F32 (or FSDP_BF16): what is gathered (above) */
  size_t align;                  /* 16: shard alignment in elements (power of two) */
  size_t timeline_capacity;      /* 65536: events kept; 0 = no timeline */
  fsdp_optim_config_t optim;     /* FSDP_OPTIM_CONFIG_INIT (AdamW, lr 1e-3) */
  fsdp_schedule_t schedule;      /* FSDP_SCHEDULE_INIT (constant) */
  fsdp_device_kind_t device;     /* FSDP_DEVICE_CPU: where shards, gathers and gradients live */
  fsdp_dtype_t reduce_dtype;     /* FSDP_F32 (or FSDP_BF16): what gradients are reduced in */
  const char *comm_backend;      /* NULL (unset): the world's; "nccl" on CUDA (above); copied */
  int max_consecutive_skips;     /* 0 (unset): 20; steps skipped in a row (non-finite loss or
                                    gradients, see "Numerics guard") before fsdp_engine_step
                                    fails with FSDP_ERR_NONFINITE */
  double loss_scale_init;        /* 0 (unset): 65536 with param_dtype FSDP_F16, else 1;
                                    1 = no loss scaling, else dynamic scaling from this value */
  double loss_scale_growth;      /* 2.0: factor after loss_scale_interval good steps (>= 1) */
  double loss_scale_backoff;     /* 0.5: factor after a skipped step (in (0, 1]) */
  int loss_scale_interval;       /* 2000: good steps in a row before the scale grows */
  int shard_size;                /* 0 (unset): the world; else ranks per shard group, a divisor
                                    of the world (HSDP, above); fsdp_engine_config: resolved */
} fsdp_config_t;
FSDP_ASSERT_NO_TAIL(fsdp_config_t, shard_size);

#define FSDP_CONFIG_MAGIC 0xf5d9c0f1u

#define FSDP_CONFIG_INIT                                                             \
  {                                                                                  \
    .size = sizeof(fsdp_config_t), .magic = FSDP_CONFIG_MAGIC,                       \
    .version = FSDP_VERSION_CODE, .strategy = FSDP_FULL_SHARD, .prefetch_depth = 1,  \
    .max_live_units = 0, .grad_accum = 1, .accumulate_full_grads = 0,                \
    .grad_reduce = FSDP_AVG, .param_dtype = FSDP_F32, .align = 16,                   \
    .timeline_capacity = 1 << 16, .optim = FSDP_OPTIM_CONFIG_INIT,                   \
    .schedule = FSDP_SCHEDULE_INIT, .device = FSDP_DEVICE_CPU,                       \
    .reduce_dtype = FSDP_F32, .comm_backend = NULL, .max_consecutive_skips = 0,      \
    .loss_scale_init = 0.0, .loss_scale_growth = 2.0, .loss_scale_backoff = 0.5,     \
    .loss_scale_interval = 2000, .shard_size = 0                                     \
  }

/* Checks cfg (the same checks as fsdp_engine_create) and writes to *out the
 * configuration an engine would run with: the caller's fields, defaults for
 * fields past its size, unset values resolved. Only cfg->size bytes of *out
 * are written (out->size = cfg->size): out is taken to be the same struct as
 * the caller's cfg, so a caller compiled against an older header sees the
 * fields it knows and nothing past its struct is touched. comm_backend stays
 * the caller's pointer. FSDP_ERR_INVALID_ARGUMENT with the field and value
 * when wrong; *out is written only on success. */
FSDP_API fsdp_status_t fsdp_config_resolve(const fsdp_config_t *cfg, fsdp_config_t *out);

typedef enum {
  FSDP_INIT_ZEROS = 0,
  FSDP_INIT_CONSTANT, /* every element = scale */
  FSDP_INIT_NORMAL,   /* N(0, scale^2) */
  FSDP_INIT_UNIFORM   /* U(-scale, scale) */
} fsdp_init_kind_t;

#define FSDP_MAX_DIMS 4

typedef struct {
  const char *name; /* unique within the engine; copied */
  int ndim;         /* 1..FSDP_MAX_DIMS */
  int64_t shape[FSDP_MAX_DIMS];
  fsdp_init_kind_t init;
  float init_scale;
  int no_decay; /* 1: weight decay never applies (biases, norms) */
} fsdp_tensor_desc_t;

/* What acquire hands out; valid until the matching release. param[i] is the
 * full tensor i (row-major, shape as declared). grad[i] (backward only, else
 * NULL) is the full gradient buffer, fp32, zero at acquire: add into it.
 * dtype says what param[i] points at: FSDP_F32 floats, except on a CUDA engine
 * with param_dtype FSDP_BF16 or FSDP_F16, where it is that dtype and param[i]
 * points at 16-bit values (uint16_t, cast from float *). On a CUDA engine both live in
 * device memory and are ready for work queued on fsdp_engine_stream. */
typedef struct {
  int n;
  float *const *param;
  float *const *grad;
  fsdp_dtype_t dtype;
} fsdp_view_t;

/* Fields are only appended. A caller compiled against a header from before
 * `skipped` (its config's size says so) gets only the fields it knows. */
typedef struct {
  int64_t step;       /* updates done, this one included (a skipped step is not one) */
  float lr;           /* learning rate used (or that would have been, when skipped) */
  double grad_norm;   /* global L2 norm before clipping, unscaled (NaN/Inf when skipped) */
  double clip_coef;   /* factor applied to the unscaled gradients (1 = none) */
  int skipped;        /* 1: non-finite loss or gradients; nothing was updated */
  int nonfinite_loss_ranks; /* ranks that reported a non-finite loss for this step */
  int consecutive_skips;    /* skipped steps in a row, this one included (0 after an update) */
  int64_t skipped_total;    /* skipped steps since the engine was created */
  double loss_scale;  /* the scale this step's gradients carried (1 = none); the next
                         step's is fsdp_engine_loss_scale */
} fsdp_step_stats_t;

/* Bytes per rank. Persistent: master, grad_shard, optim_state. Transient
 * (*_peak since creation or the last fsdp_engine_reset_peaks): gathered
 * parameters and full gradient buffers handed out or in flight. Reserved:
 * what the preallocated pools hold, i.e. the most transient can ever reach
 * (with max_live_units unset, the gather pool grows once, in the first step
 * that holds units across the others: one buffer per unit held). */
typedef struct {
  size_t master, grad_shard, optim_state;
  size_t param_copy; /* bf16 params: the shard rounded to bf16 (+ its f32 widening
                        when shards are whole: one rank or NO_SHARD) */
  size_t persistent; /* the four above */
  size_t gathered_params, gathered_params_peak;
  size_t grads_in_flight, grads_in_flight_peak;
  size_t param_pool, grad_pool, staging;
  size_t total_reserved;
} fsdp_mem_stats_t;

typedef enum {
  FSDP_TL_ACQUIRE = 0, /* host: the acquire call (includes waiting for a gather) */
  FSDP_TL_RELEASE,     /* host: the release call */
  FSDP_TL_ALL_GATHER,  /* gather stream */
  FSDP_TL_REDUCE,      /* reduce stream: reduce-scatter or all-reduce of grads; unit -1,
                          stream 0: the step's all-reduce of the gradient norm */
  FSDP_TL_STEP,        /* host: the optimizer step */
  FSDP_TL_REPLICA_REDUCE, /* replica stream (3): HSDP all-reduce of a unit's gradient shard
                             across its replica group */
  FSDP_TL_COMPUTE_WAIT /* CUDA only, stream 0: the compute stream stalled for communication,
                          timed on the GPU by CUDA events recorded just before and after its
                          wait: for a unit's gather or a reduction still reading the gradient
                          buffer it reuses (unit, pass: the acquire's), or for every reduction
                          before the step (unit -1). Zero-length when the collective was done */
} fsdp_tl_kind_t;

typedef struct {
  fsdp_tl_kind_t kind;
  fsdp_unit_t unit; /* -1 for the step */
  fsdp_pass_t pass;
  int stream;       /* 0 compute/host, 1 gather, 2 reduce, 3 replica (HSDP) */
  double t_begin, t_end; /* fsdp_time_now() seconds */
  size_t bytes;     /* bytes each rank contributes to a collective */
} fsdp_tl_event_t;

typedef struct {
  const char *name;
  const char *kind;
  int n_tensors;
  size_t numel;        /* real parameters */
  size_t padded_numel; /* flat buffer, multiple of world * align */
  size_t shard_numel;  /* per rank (padded_numel on NO_SHARD) */
  size_t shard_offset; /* where this rank's slice starts in the flat buffer */
  int reshard_after_forward; /* resolved (fsdp_unit_opts_t) */
  fsdp_dtype_t param_dtype;  /* resolved: what the unit is gathered in */
} fsdp_unit_info_t;

/* What this rank owns of a unit, for checkpoints and tests. Pointers stay owned
 * by the engine and valid until fsdp_unit_shard_release of the unit or destroy;
 * m and v are NULL when the optimizer keeps no such state. Elements past
 * `count` are padding. On CUDA they point at host copies (16 bytes per shard
 * element with AdamW) that fsdp_unit_shard makes and refreshes from the device
 * (it waits for the engine's streams); what the caller writes into them
 * reaches the device at fsdp_unit_shard_release with written set, or else at
 * the next fsdp_engine_set_step (checkpoint loaders call it), and is discarded
 * by an fsdp_engine_step before that. Release each unit when done with it, so
 * that a save or a check holds one unit's copies on the host at a time. */
typedef struct {
  size_t offset, count, capacity;
  float *master, *grad, *m, *v;
} fsdp_shard_t;

FSDP_API fsdp_status_t fsdp_engine_create(fsdp_world_t world, const fsdp_config_t *cfg,
                                          fsdp_engine_t *engine);
/* Waits for queued work, frees everything. NULL is ignored. On CUDA it also
 * drops the process's cached cuBLAS handles (they are made again on first
 * use): destroy an engine while no other engine of the process computes. */
FSDP_API void fsdp_engine_destroy(fsdp_engine_t engine);

/* Registers a unit in forward execution order. kind is a free label used by
 * wrap and checkpoint policies ("GPT2Block"); NULL means "". */
FSDP_API fsdp_status_t fsdp_unit_add(fsdp_engine_t engine, const char *name, const char *kind,
                                     const fsdp_tensor_desc_t *tensors, int n_tensors,
                                     fsdp_unit_t *unit);

/* Per-unit choices, for fsdp_unit_add_opts. Start from FSDP_UNIT_OPTS_INIT
 * and set what you need; every field left unset means "the engine config's
 * choice", so a unit added with FSDP_UNIT_OPTS_INIT (or NULL) behaves exactly
 * as fsdp_unit_add. size/magic/version first, new fields appended (the
 * fsdp_config_t rule). Wrap policies and configuration files map their rules
 * onto this struct, one per unit.
 *
 * reshard_after_forward  1: ZeRO-3 for this unit (its gathered parameters are
 *     freed at the forward release and gathered again in backward); 0: ZeRO-2
 *     (kept from forward to backward in a buffer of its own). Unset: 1 under
 *     FSDP_FULL_SHARD, 0 under FSDP_SHARD_GRAD_OP. Ignored under NO_SHARD and
 *     when a unit's shard group is one rank (nothing is gathered).
 * param_dtype  FSDP_F32, FSDP_BF16 or FSDP_F16: what this unit's parameters
 *     are gathered and computed in (see Mixed precision), e.g. FSDP_F32 for
 *     LayerNorm-only units of a bf16 model. Unset: config.param_dtype. Loss
 *     scaling follows config.param_dtype (set loss_scale_init yourself for f16
 *     units in a model that is not f16).
 * lr_mult, wd_mult  parameter groups: n_tensors factors each (in the order of
 *     the tensors passed), copied at the call. Tensor i's update uses
 *     lr * lr_mult[i] (after the schedule) and weight_decay * wd_mult[i] (a
 *     no_decay tensor stays undecayed whatever its wd_mult). NULL: 1 for every
 *     tensor. Each must be finite and >= 0 (0 freezes a tensor's updates, or
 *     its decay). */
typedef struct {
  size_t size;               /* sizeof(fsdp_unit_opts_t) as the caller compiled it */
  unsigned int magic;        /* FSDP_UNIT_OPTS_MAGIC */
  unsigned int version;      /* FSDP_VERSION_CODE of the caller's header */
  int reshard_after_forward; /* -1 (unset): the strategy's; 0 or 1 */
  fsdp_dtype_t param_dtype;  /* FSDP_DTYPE_UNSET: config.param_dtype */
  const float *lr_mult;      /* NULL: 1 for every tensor; else n_tensors factors, copied */
  const float *wd_mult;      /* NULL: 1 for every tensor; else n_tensors factors, copied */
} fsdp_unit_opts_t;
FSDP_ASSERT_NO_TAIL(fsdp_unit_opts_t, wd_mult);

#define FSDP_UNIT_OPTS_MAGIC 0xf5d9a0a1u
#define FSDP_DTYPE_UNSET ((fsdp_dtype_t)-1)

#define FSDP_UNIT_OPTS_INIT                                                          \
  {                                                                                  \
    .size = sizeof(fsdp_unit_opts_t), .magic = FSDP_UNIT_OPTS_MAGIC,                 \
    .version = FSDP_VERSION_CODE, .reshard_after_forward = -1,                       \
    .param_dtype = FSDP_DTYPE_UNSET, .lr_mult = NULL, .wd_mult = NULL                \
  }

/* fsdp_unit_add with per-unit choices (opts NULL: none). Errors, before
 * anything is registered: FSDP_ERR_INVALID_ARGUMENT naming the unit and the
 * field (a struct not from FSDP_UNIT_OPTS_INIT, reshard_after_forward not
 * -1/0/1, a dtype other than f32/bf16/f16, a multiplier negative or not finite,
 * naming the tensor). Same thread and ordering rules as fsdp_unit_add. */
FSDP_API fsdp_status_t fsdp_unit_add_opts(fsdp_engine_t engine, const char *name,
                                          const char *kind, const fsdp_tensor_desc_t *tensors,
                                          int n_tensors, const fsdp_unit_opts_t *opts,
                                          fsdp_unit_t *unit);

/* Allocates shards, state and pools, and fills each rank's slice: element i of
 * tensor t is a pure function of (seed, t's name, i), so the model is the same
 * at every world size. Collective. */
FSDP_API fsdp_status_t fsdp_engine_materialize(fsdp_engine_t engine, uint64_t seed);

/* Start-up consistency: ranks started with different arguments would train
 * different models without a word, or hang in mismatched collectives. This
 * compares, collectively over the engine's ranks, the caller's n settings
 * (keys[i] = values[i]: a trainer's flags, its data's identity), then the
 * engine's resolved configuration (strategy, prefetch, accumulation, dtypes,
 * optimizer, schedule, device, backend) and its unit plan so far (every unit,
 * tensor name and shape). Call it on every rank at the same point, with the
 * same keys in the same order; values are what may differ. Cost when the ranks
 * agree: one all-reduce of 56 bytes (a hash and a length, and whether a rank
 * failed to prepare its part); on a mismatch, one more of the longest rank's
 * settings. Both have the same size on every rank, so the check itself never
 * hangs; a rank whose own part fails (bad arguments, no memory, an engine
 * stopped by an earlier failure) still takes part, so every rank fails at
 * once: that rank with its error, the others with its status and a message
 * naming it and quoting its reason.
 * fsdp_engine_materialize runs the engine's part on its own before any other
 * collective, so an embedding trainer that never calls this still gets its
 * configuration and model compared.
 * Errors: FSDP_ERR_INVALID_USAGE on every rank when they differ, naming the
 * first differing key and every rank's value, e.g. "ranks were started with
 * different settings, seen by rank 0: --lr: rank 1 has 0.01, ranks 0, 2-3 have
 * 0.002"; FSDP_ERR_INVALID_ARGUMENT for n < 0 or NULL arrays; a failed
 * exchange as the collective's error. A NULL value reads as "(unset)";
 * newlines and tabs in values read as spaces. keys and values are not kept.
 * Collective; main thread. */
FSDP_API fsdp_status_t fsdp_engine_check_consistency(fsdp_engine_t engine, int n,
                                                     const char *const *keys,
                                                     const char *const *values);

/* Sets a whole tensor from `full` held by rank `root` (others pass NULL) and
 * broadcast to all: weights supplied by the user, as sync_module_states does.
 * Optimizer state of the tensor is left alone. Collective. */
FSDP_API fsdp_status_t fsdp_engine_load_tensor(fsdp_engine_t engine, const char *name,
                                               const float *full, int root);
/* Gathers a whole tensor's current parameters into `full` on rank `root`
 * (root = -1: on every rank). Collective; not while units are acquired. */
FSDP_API fsdp_status_t fsdp_engine_read_tensor(fsdp_engine_t engine, const char *name,
                                               float *full, int root);

FSDP_API fsdp_status_t fsdp_unit_acquire(fsdp_engine_t engine, fsdp_unit_t unit,
                                         fsdp_pass_t pass, fsdp_view_t *view);
FSDP_API fsdp_status_t fsdp_unit_release(fsdp_engine_t engine, fsdp_unit_t unit,
                                         fsdp_pass_t pass);

/* Waits for every reduction, clips, updates the shards. stats may be NULL.
 *
 * Numerics guard: the gradient-norm all-reduce (done every step, with or
 * without clipping) also carries, per rank, whether its gradient shard holds
 * NaN/Inf and whether it reported a non-finite loss (fsdp_engine_report_loss):
 * 24 bytes instead of 8, no extra collective (NO_SHARD on several ranks, which
 * had no norm all-reduce, now does this one). When any rank has either, every
 * rank skips the step: parameters, optimizer state and the step count stay as
 * they were (so the learning-rate schedule, a function of the step count, does
 * not advance), the gradients are zeroed, stats->skipped is 1. After
 * config.max_consecutive_skips skipped steps in a row the call fails with
 * FSDP_ERR_NONFINITE (stats still filled in); the engine stays usable.
 *
 * Loss scaling (config.loss_scale_init != 1, the default with fp16 params; as
 * PyTorch's GradScaler): the caller multiplies its loss by
 * fsdp_engine_loss_scale before backward (the nn models' loss_scale argument);
 * the step divides it out of the norm and the gradients (before clipping, in
 * the same pass as the clip factor), skips on overflow and multiplies the scale
 * by loss_scale_backoff, and by loss_scale_growth after loss_scale_interval
 * good steps in a row. Checkpoints save and restore the scale. */
FSDP_API fsdp_status_t fsdp_engine_step(fsdp_engine_t engine, fsdp_step_stats_t *stats);

/* Reports this rank's loss for the coming step, so that the guard above skips
 * it when the loss is NaN or Inf even if the gradients are finite. Local (no
 * communication); call it any number of times between two steps (e.g. per
 * micro-batch): one non-finite value marks the step. Ranks need not agree on
 * whether they call it. */
FSDP_API fsdp_status_t fsdp_engine_report_loss(fsdp_engine_t engine, double loss);
/* What the caller multiplies its loss by before backward: 1 without loss
 * scaling; -1 for a NULL engine. */
FSDP_API double fsdp_engine_loss_scale(fsdp_engine_t engine);
/* The scaler's state, for checkpoints: the scale and the good steps in a row
 * since it last changed. Set restores both (scale finite and > 0, good_steps
 * >= 0); both are FSDP_ERR_INVALID_ARGUMENT on bad values. */
FSDP_API fsdp_status_t fsdp_engine_scaler_state(fsdp_engine_t engine, double *scale,
                                                int64_t *good_steps);
FSDP_API fsdp_status_t fsdp_engine_set_scaler_state(fsdp_engine_t engine, double scale,
                                                    int64_t good_steps);

/* Splits a global batch: this rank's micro-batch size and its first sample
 * index in each global micro-batch. Fails when world_size * grad_accum does not
 * divide global_batch. */
FSDP_API fsdp_status_t fsdp_engine_shard_batch(fsdp_engine_t engine, int64_t global_batch,
                                               int64_t *micro_batch, int64_t *offset);

FSDP_API int fsdp_engine_num_units(fsdp_engine_t engine);
FSDP_API fsdp_status_t fsdp_unit_info(fsdp_engine_t engine, fsdp_unit_t unit,
                                      fsdp_unit_info_t *info);
FSDP_API fsdp_status_t fsdp_unit_shard(fsdp_engine_t engine, fsdp_unit_t unit,
                                       fsdp_shard_t *shard);
/* Ends the access fsdp_unit_shard began. On CUDA the unit's host copies are
 * freed, their contents first copied to the device when written is nonzero
 * (as fsdp_engine_set_step would; call it after writing every unit, as
 * before: it refreshes the 16-bit copies and drops gathered ones). On the CPU
 * the shard is the engine's own memory and nothing happens. A unit without
 * host copies is fine. When written is set, FSDP_ERR_INVALID_USAGE in the
 * middle of a forward or backward pass, or while the unit is acquired, holds
 * gradients or is kept gathered between forward and backward (ZeRO-2): a
 * gather could read the shard being written, or keep its old values. A copy
 * to the device that fails leaves the unit half written: it stops the engine
 * (every later call fails with that error, as after a failed step), and the
 * host copies are freed all the same. */
FSDP_API fsdp_status_t fsdp_unit_shard_release(fsdp_engine_t engine, fsdp_unit_t unit,
                                               int written);
/* Host bytes of fsdp_unit_shard's copies (CUDA; 0 on the CPU) held now, and
 * the most held at once since creation. Either pointer may be NULL. */
FSDP_API fsdp_status_t fsdp_engine_host_copy_bytes(fsdp_engine_t engine, size_t *live,
                                                   size_t *peak);
FSDP_API fsdp_status_t fsdp_engine_find_tensor(fsdp_engine_t engine, const char *name,
                                               fsdp_unit_t *unit, int *index);
/* Tensor `index` (0 .. fsdp_unit_info().n_tensors - 1) of a unit as declared,
 * with where it lies in the unit's flat buffer: what checkpoints record so
 * they can map elements between layouts. name is owned by the engine. */
typedef struct {
  const char *name;
  int ndim;
  int64_t shape[FSDP_MAX_DIMS];
  size_t numel;
  size_t offset; /* first element in the unit's flat buffer */
  int no_decay;
  float lr_mult, wd_mult; /* fsdp_unit_opts_t (1 unless set) */
} fsdp_tensor_info_t;
FSDP_API fsdp_status_t fsdp_unit_tensor(fsdp_engine_t engine, fsdp_unit_t unit, int index,
                                        fsdp_tensor_info_t *info);
FSDP_API int64_t fsdp_engine_step_count(fsdp_engine_t engine);
/* For checkpoint loaders that wrote shards (fsdp_unit_shard) directly: sets the
 * update count (the schedule and AdamW's bias correction follow it) and drops
 * gathered copies, which would be stale; the numerics guard starts afresh (no
 * reported loss, no skips in a row). Not before fsdp_engine_materialize,
 * while units are acquired, nor between a backward and its step
 * (FSDP_ERR_INVALID_USAGE). */
FSDP_API fsdp_status_t fsdp_engine_set_step(fsdp_engine_t engine, int64_t step);
/* The optimizer's own update count, which AdamW's bias correction and SGD's
 * first momentum step follow (the schedule follows the engine's step). Equal
 * to the step unless set: fsdp_engine_set_step sets both; a loader that zeroes
 * the optimizer state (reset_optim, weights-only checkpoints) then sets it to
 * 0, so that the next update is a first update. step in [0, the engine's step];
 * not between a backward and its step. */
FSDP_API fsdp_status_t fsdp_engine_set_optim_step(fsdp_engine_t engine, int64_t step);
FSDP_API const fsdp_config_t *fsdp_engine_config(fsdp_engine_t engine);
FSDP_API fsdp_world_t fsdp_engine_world(fsdp_engine_t engine);
/* A communicator for the caller's own host-side reductions (losses, metrics). */
FSDP_API fsdp_comm_t fsdp_engine_comm(fsdp_engine_t engine);
FSDP_API fsdp_stream_t fsdp_engine_stream(fsdp_engine_t engine);

FSDP_API fsdp_status_t fsdp_engine_memory(fsdp_engine_t engine, fsdp_mem_stats_t *mem);
FSDP_API void fsdp_engine_reset_peaks(fsdp_engine_t engine);
/* What fsdp_engine_materialize will reserve on this rank, by the rule it
 * allocates with: *plan receives the reserved fields of fsdp_engine_memory
 * (master .. persistent, param_pool, grad_pool, staging, total_reserved; the
 * transient ones 0) as they will read after materialize and the first step.
 * held (n_held units, may be NULL when 0) names the units the caller keeps
 * acquired while it acquires others (a decoder's root: embeddings and head);
 * each that reshards adds its gather slot when max_live_units is unset. Call
 * it after the units are registered (it counts those registered so far);
 * after materialize it answers the same. Not counted here nor by
 * fsdp_engine_memory: AdamW's per-unit decay runs (8 bytes per tensor at
 * most) and the device's own overheads (context, library workspaces).
 * Allocates nothing; not concurrently with calls that add units. Errors:
 * FSDP_ERR_INVALID_ARGUMENT for NULL engine or plan, n_held < 0, NULL held
 * with n_held > 0, or a held entry that is not a unit; *plan is then left
 * unchanged. */
FSDP_API fsdp_status_t fsdp_engine_memory_plan(fsdp_engine_t engine, const fsdp_unit_t *held,
                                               int n_held, fsdp_mem_stats_t *plan);

/* The recorded events in *events (valid until the next engine call) and their
 * number in *count. Events past timeline_capacity are counted in *dropped (may
 * be NULL) and not kept. Waits for the engine's streams. Events are added as
 * they are known: host calls when they return, collectives on the CPU's worker
 * streams when they end; collectives on CUDA streams, and the compute stream's
 * waits for them (FSDP_TL_COMPUTE_WAIT), are timed by CUDA events recorded
 * around them (no host function on the stream: nothing stalls it) and
 * added at the end of fsdp_engine_step or by this call, in fsdp_time_now()
 * seconds like the rest (the GPU's clock is tied to the host's once, when the
 * engine is created, to within microseconds). Sort by t_begin for time order. */
FSDP_API fsdp_status_t fsdp_engine_timeline(fsdp_engine_t engine, const fsdp_tl_event_t **events,
                                            size_t *count, size_t *dropped);
FSDP_API void fsdp_engine_timeline_clear(fsdp_engine_t engine);

/* Shard layout as the engine computes it: numel elements padded to a multiple
 * of world*align; *begin and *end bound rank's real elements (end - begin may be 0),
 * *shard the per-rank slice length. */
FSDP_API fsdp_status_t fsdp_shard_layout(size_t numel, int world, size_t align, int rank,
                                         size_t *padded, size_t *shard, size_t *begin,
                                         size_t *end);

/* The value materialize gives element `index` of tensor `name`. */
FSDP_API float fsdp_init_value(uint64_t seed, const char *name, size_t index,
                               fsdp_init_kind_t kind, float scale);

#ifdef __cplusplus
}
#endif
#endif
