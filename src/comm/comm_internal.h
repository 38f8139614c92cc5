/* src/comm/comm_internal.h — the table every communication backend implements
 * (mpi, gloo, self, nccl). comm.c validates arguments once, numbers each
 * collective on its communicator, then runs it now (host stream), queues it
 * on a CPU stream, or hands it to the backend's enqueue (CUDA stream), and
 * calls the backend only through this table. The watchdog (comm_watch.c) and
 * the desync check (comm_desync.c) wrap every run; comm_stage.c moves device
 * buffers through pinned host memory for the host backends. Usable from C++
 * (the gloo adapter). Not installed. */
#ifndef FSDP_COMM_INTERNAL_H
#define FSDP_COMM_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "comm/comm_names.h"
#include "fsdp/comm.h"
#include "fsdp_config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  FSDP_COLL_ALL_GATHER = 0,
  FSDP_COLL_REDUCE_SCATTER,
  FSDP_COLL_ALL_REDUCE,
  FSDP_COLL_BROADCAST,
  FSDP_COLL_BARRIER,
  FSDP_COLL_SHIFT /* root is the offset: send to rank + root, receive from rank - root */
} fsdp_coll_kind_t;

/* One validated collective, as issued. For a broadcast, recv is the buffer;
 * for a shift, root is the offset (0 .. size - 1). */
typedef struct {
  fsdp_coll_kind_t kind;
  const void *send;
  void *recv;
  size_t count; /* elements per rank (all_gather, reduce_scatter) or in total */
  fsdp_dtype_t dtype;
  fsdp_reduce_op_t op;
  int root;
  int in_place; /* send/recv are one of the in-place layouts of comm.h */
  uint64_t seq; /* 1, 2, ... in issue order on its communicator */
  char tag[FSDP_COMM_TAG_MAX]; /* what it is for (the engine: the unit), or "" */
} fsdp_coll_t;

typedef struct fsdp_comm_ops {
  const char *name;
  size_t max_count; /* largest count one call accepts (MPI counts are int) */
  /* Sets up comm->impl, rank and size for a communicator over the world. */
  fsdp_status_t (*create)(fsdp_world_t world, fsdp_comm_t comm);
  /* Sets up out->impl, rank and size as an independent copy of comm. */
  fsdp_status_t (*dup)(fsdp_comm_t comm, fsdp_comm_t out);
  void (*destroy)(fsdp_comm_t comm); /* releases comm->impl only */
  /* Performs the collective, blocking the calling thread until it is done. */
  fsdp_status_t (*run)(fsdp_comm_t comm, const fsdp_coll_t *coll);
  /* Called by the watchdog thread when a deadline passed, while another
   * thread may be blocked in run: makes every pending and later run on comm
   * fail (gloo, here and at the peers: as cancel; nccl, which calls
   * ncclCommAbort, ending the work queued on CUDA streams too), or ends the
   * job (MPI_Abort: MPI cannot interrupt a call; nccl in an MPI world after
   * its ncclCommAbort). NULL for backends that cannot block (self). */
  void (*abort)(fsdp_comm_t comm);
  /* Device backends (nccl) only, NULL for host backends: queues the
   * collective on cuda_stream (a cudaStream_t) and returns without waiting.
   * A backend with enqueue takes device buffers only, in run too; one without
   * takes host buffers, and comm.c stages device buffers for it. */
  fsdp_status_t (*enqueue)(fsdp_comm_t comm, const fsdp_coll_t *coll, void *cuda_stream);
  /* Sets up out->impl for a communicator over a subset of parent's ranks:
   * comm.c has set out->rank, size, color and members (world ranks, in the
   * new rank order) and calls this on every rank of parent (fsdp_comm_split). */
  fsdp_status_t (*split)(fsdp_comm_t parent, fsdp_comm_t out, int key);
  /* Device backends only, NULL otherwise: called by the watchdog thread every
   * tick, before it looks for expired collectives, to bring comm->progress up
   * to date with the work enqueue left on CUDA streams (fsdp_watch_begin for
   * the oldest still queued, fsdp_watch_end when none is). */
  void (*poll)(fsdp_comm_t comm);
  /* After a collective of the world failed on this rank, makes every
   * pending and later collective on comm fail without ending the job, so
   * that peers blocked in a collective this rank will never join are
   * released instead of waiting for their deadline. nccl: after a failure
   * inside a stream (fsdp_watch_note_failure), ncclCommAbort. gloo: after a
   * host backend's collective failed on the transport (fsdp_watch_failed),
   * every pending send and receive of comm fails here at once and its
   * connections close, so the peers' pending ones with this rank fail too
   * (and they cancel theirs in turn). NULL for mpi (an MPI error ends the
   * job) and self. Called with the watch's mutex held, from any thread. */
  void (*cancel)(fsdp_comm_t comm);
} fsdp_comm_ops_t;

struct fsdp_comm_watch; /* the world's watchdog and shared backend state */

/* What a communicator is doing, for the watchdog; guarded by mu. */
typedef struct {
  uint64_t started;   /* seq of the last collective the backend began */
  uint64_t completed; /* seq of the last one that returned */
  double t_start;     /* when `started` began (fsdp_time_now) */
  fsdp_coll_t coll;   /* its description (buffers are not read) */
} fsdp_comm_progress_t;

struct fsdp_comm {
  const fsdp_comm_ops_t *ops;
  int rank, size;
  void *impl; /* backend state */
  fsdp_world_t world;
  struct fsdp_comm_watch *watch;
  int id;          /* fsdp_world_next_comm_id: equal on every rank */
  uint64_t issued; /* collectives issued so far (the issuing thread only) */
  char next_tag[FSDP_COMM_TAG_MAX]; /* set by fsdp_comm_set_tag, used once */
  pthread_mutex_t mu;
  fsdp_comm_progress_t progress;
  void *fingerprints; /* desync check: size fingerprints, received */
  void *stage;        /* pinned host memory for device buffers (comm_stage.c) */
  size_t stage_bytes;
  /* Sub-communicators (fsdp_comm_split): the world rank of each rank, NULL
   * when the communicator spans the world in world order; the split colour
   * (-1 otherwise); and a label naming the group in reports ("" for none). */
  int *members;
  int color;
  char label[FSDP_COMM_LABEL_MAX];
  /* Guarded by the watch's mutex: the backend has set comm up (impl is set),
   * so the watchdog may call its poll, cancel and abort; and whether comm is
   * exempt from the cancel after a failure elsewhere in its world
   * (fsdp_comm_set_cancel_on_failure). */
  int ready, keep_on_failure;
};

extern const fsdp_comm_ops_t fsdp_comm_mpi_ops;
extern const fsdp_comm_ops_t fsdp_comm_self_ops;
extern const fsdp_comm_ops_t fsdp_comm_gloo_ops;
#if FSDP_HAVE_NCCL
extern const fsdp_comm_ops_t fsdp_comm_nccl_ops;
#endif

/* World rank of comm's rank r. */
static inline int fsdp_comm_world_rank(fsdp_comm_t comm, int r) {
  return comm->members ? comm->members[r] : r;
}
/* " (shard group 1 (world ranks 2-3))" when comm has a label, else "". */
void fsdp_comm_label_text(fsdp_comm_t comm, char *buf, size_t n);

/* Bytes of send and of recv a collective on comm covers. */
void fsdp_coll_extent(fsdp_comm_t comm, const fsdp_coll_t *coll, size_t *send_bytes,
                      size_t *recv_bytes);

/* ---- staging (comm_stage.c) ----------------------------------------------- */

/* For a host backend: *host = coll with every CUDA device buffer replaced by
 * the communicator's pinned staging memory (grown to the largest collective
 * so far, kept until destroy), and the inputs copied in (synchronously).
 * Otherwise, and without CUDA, *host = *coll. */
fsdp_status_t fsdp_stage_in(fsdp_comm_t comm, const fsdp_coll_t *coll, fsdp_coll_t *host);
/* Copies the outputs of a collective staged by fsdp_stage_in back. */
fsdp_status_t fsdp_stage_out(fsdp_comm_t comm, const fsdp_coll_t *coll, const fsdp_coll_t *host);
void fsdp_stage_free(fsdp_comm_t comm);

/* ---- watchdog (comm_watch.c) ---------------------------------------------- */

/* Gives comm its id and joins it to its world's watch, creating the watch
 * (and, with more than one rank, the watchdog thread) on first use. */
fsdp_status_t fsdp_watch_attach(fsdp_world_t world, fsdp_comm_t comm);
/* Leaves the watch; the last communicator of a world stops the watchdog. */
void fsdp_watch_detach(fsdp_comm_t comm);
/* Lets the watchdog and the cancel call comm's ops->poll, cancel and abort
 * (on: after the backend set comm up) or stops them (off: before the backend
 * tears comm down). */
void fsdp_watch_set_ready(fsdp_comm_t comm, int on);
/* Records the start and end of a backend run for the watchdog. */
void fsdp_watch_begin(fsdp_comm_t comm, const fsdp_coll_t *coll);
void fsdp_watch_end(fsdp_comm_t comm, const fsdp_coll_t *coll);
/* A failed run after the watchdog aborted the world: FSDP_ERR_TIMEOUT with
 * the watchdog's message (the root cause) instead of the transport's error.
 * Any failure also marks the world failed (world_env.h). The first failure
 * of a host backend's collective on the transport (FSDP_ERR_COMM; not a
 * desync, which every rank sees alike) cancels every other communicator of
 * the world on this rank that has ops->cancel and is not a device backend
 * nor exempt (fsdp_comm_set_cancel_on_failure), and comm itself unless
 * exempt: the peers blocked on this rank in any of them fail at once, as do
 * this rank's own calls blocked in them (fsdp_watch_cancelled says why). */
fsdp_status_t fsdp_watch_failed(fsdp_comm_t comm, fsdp_status_t st);
/* For a backend's error text: whether comm was cancelled after a failure
 * elsewhere on this rank (1, with that failure's report in buf), else 0. */
int fsdp_watch_cancelled(fsdp_comm_t comm, char *buf, size_t n);
/* fsdp_comm_set_cancel_on_failure's setting, under the watch's mutex. */
void fsdp_watch_set_keep(fsdp_comm_t comm, int keep);
/* A device backend's collective failed inside its stream (its outputs are
 * not what they should be): msg, naming it, is kept for the world, and
 * every later collective on any communicator of the world fails with it
 * (fsdp_watch_check), so that no result computed from those outputs is
 * taken for good; the next poll (the watchdog's tick or fsdp_watch_check)
 * cancels every device communicator of the world (ops->cancel), which
 * releases the peers waiting for this rank in any of them. Called from
 * ops->poll (the watch's mutex may be held). */
void fsdp_watch_note_failure(fsdp_comm_t comm, const char *msg);
/* Before every collective (comm.c): polls the world's device backends
 * (ops->poll, which detects and reports failures inside streams), then
 * FSDP_ERR_COMM with the first such failure's report, or FSDP_SUCCESS. */
fsdp_status_t fsdp_watch_check(fsdp_comm_t comm);
/* After a device backend's enqueue failed with `own` (its message): the
 * world's first failure inside a stream as FSDP_ERR_COMM, naming it and
 * ending with "(this call: own)" unless own quotes it already, when one was
 * noted; else FSDP_SUCCESS. Reads what is noted and polls nothing. */
fsdp_status_t fsdp_watch_first_failure(fsdp_comm_t comm, const char *own);
/* Backend state shared by every communicator of a world (gloo: the TCP
 * device), freed with free_fn when the last communicator is destroyed. */
void *fsdp_watch_shared(fsdp_comm_t comm);
void fsdp_watch_set_shared(fsdp_comm_t comm, void *shared, void (*free_fn)(void *));
/* The collective deadline of comm's world, in seconds. */
double fsdp_watch_timeout(fsdp_comm_t comm);

/* ---- desync check (comm_desync.c) ---------------------------------------- */

/* Allocates comm's fingerprint buffer unless its world turned the desync
 * check off. */
fsdp_status_t fsdp_desync_setup(fsdp_comm_t comm);
void fsdp_desync_free(fsdp_comm_t comm);
/* Exchanges coll's fingerprint with every rank through the backend and fails
 * (FSDP_ERR_INVALID_USAGE, every differing fingerprint and its ranks in the
 * message) when they differ; a no-op when off. */
fsdp_status_t fsdp_desync_check(fsdp_comm_t comm, const fsdp_coll_t *coll);
/* "all_gather #5 (unit 'h.1', 1024 f32 per rank)" into buf. */
void fsdp_coll_describe(const fsdp_coll_t *coll, char *buf, size_t n);

/* buf[i] *= factor for a reduction dtype; used for FSDP_AVG. F32 and BF16
 * multiply in fp32 by (float)factor (BF16 then rounds once to nearest even),
 * F64 in double. */
void fsdp_comm_scale(void *buf, size_t count, fsdp_dtype_t dtype, double factor);
/* out[i] = a[i] op b[i] for bf16 bit patterns: widened to fp32, combined
 * there (SUM and AVG add, MAX compares) and rounded once to bf16 (to nearest
 * even), so a reduction over N ranks rounds N-1 times. out may alias a or b.
 * The reduce function of the mpi and gloo backends. */
void fsdp_bf16_combine(uint16_t *out, const uint16_t *a, const uint16_t *b, size_t n,
                       fsdp_reduce_op_t op);
/* The collective's name for messages, e.g. "all_gather". */
const char *fsdp_coll_name(fsdp_coll_kind_t kind);

#ifdef __cplusplus
}
#endif
#endif
