/* src/comm/comm_nccl.c — the "nccl" backend: CUDA device buffers, one
 * ncclComm_t per fsdp_comm_t on the CUDA device current at creation.
 *
 * Bootstrap: rank 0 makes the ncclUniqueId and every rank learns it from the
 * world: MPI_Bcast over the world's communicator under mpirun, the store key
 * "nccl/<communicator id>" under env://, nothing in a world of one rank.
 * Communicators are created in the same order on every rank (comm.h), so the
 * broadcasts match and the ids agree.
 *
 * A collective on a CUDA stream is queued there (enqueue), a CUDA event is
 * recorded after it, and the call returns; the world's watchdog thread polls
 * the queued collectives' events in issue order (poll) and ncclCommGetAsyncError,
 * and reports a collective that is at the front of its communicator's queue
 * for longer than the world's timeout as the host backends' are reported
 * (comm_watch.c). On the host or a CPU stream (run) it is queued on the
 * communicator's own stream, which the calling thread then polls until it is
 * done, the communicator reports an asynchronous error, or the watchdog gives
 * up on it. The watchdog's abort calls ncclCommAbort from its own thread
 * (which ends every wait on the communicator's streams) and, in an MPI
 * world, ends the job with MPI_Abort. Every NCCL call on a communicator holds
 * its mutex except a collective's enqueue: NCCL may block there (a peer that
 * never connects, a full work queue), and the watchdog must still poll, see
 * the deadline (which starts before the call when nothing earlier is
 * queued) and abort, which is what ends such a call (ncclCommAbort from
 * another thread: NCCL's way to end a hung call); the handle is never used
 * again once the abort is seen. Every error becomes
 * FSDP_ERR_COMM with NCCL's text and the collective's description; after one,
 * and after an abort, the communicator is failed: later collectives are
 * refused (FSDP_ERR_TIMEOUT with the watchdog's report after its abort, the
 * first failure's report after one inside a stream: comm.c) and
 * destroy calls ncclCommAbort instead of ncclCommDestroy, unless the
 * watchdog already did. */
#include "fsdp_config.h"

#if FSDP_HAVE_NCCL
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "comm/comm_internal.h"
#include "core/internal.h"
#include "world/world_internal.h"
#include "world/world_mpi.h"

/* nccl.h declares ncclGroupStart() and others without (void). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

/* A collective queued on a CUDA stream, until the watchdog sees it done. */
typedef struct {
  cudaEvent_t done; /* recorded on its stream right after it */
  fsdp_coll_t coll;
} pending_t;

typedef struct {
  ncclComm_t comm;
  int device;          /* CUDA ordinal the communicator lives on */
  cudaStream_t own;    /* for collectives issued on the host or a CPU stream */
  float *scratch;      /* (1) on the device: what a barrier all-reduces */
  atomic_int failed;   /* an error or an abort: refuse work, abort at destroy */
  /* Guards the fields below and every NCCL call on comm except a
   * collective's enqueue (issue), which may block inside NCCL and must not
   * stall the watchdog's poll and abort (lock order: the watch's mutex,
   * this, the fsdp_comm's mutex). */
  pthread_mutex_t mu;
  int gone;            /* ncclCommAbort was called (abort_locked, submit): comm is freed */
  int in_call;         /* a collective's enqueue is inside NCCL (entering) */
  int cancel_due;      /* an abort deferred during that call: submit aborts after it */
  fsdp_coll_t entering;
  char why[512];       /* why a failure aborted it (fail_async, nccl_cancel); "" for a deadline */
  atomic_int held;     /* FSDP_TEST_FAULT nccl_enqueue_poll: the gate (hold) is closed */
  _Atomic double held_until; /* ... until then at most */
  pending_t *pending;  /* a ring of cap slots, count queued from head; */
  size_t cap, head, count; /* a slot keeps its event for reuse */
} nccl_impl_t;

static nccl_impl_t *impl_of(fsdp_comm_t c) { return c->impl; }

static fsdp_status_t nccl_fail(fsdp_comm_t c, ncclResult_t r, const char *call,
                               const fsdp_coll_t *k) {
  nccl_impl_t *im = impl_of(c);
  char what[256] = "communicator set-up";
  if (k) fsdp_coll_describe(k, what, sizeof what);
  if (im) atomic_store(&im->failed, 1);
  const char *last = ncclGetLastError(im ? im->comm : NULL);
  return fsdp_error(FSDP_ERR_COMM, "nccl: %s failed for %s on communicator %d, rank %d of %d: "
                    "%s%s%s", call, what, c->id, c->rank, c->size, ncclGetErrorString(r),
                    last && *last ? ": " : "", last ? last : "");
}

static fsdp_status_t cuda_fail(fsdp_comm_t c, cudaError_t e, const char *call,
                               const fsdp_coll_t *k) {
  char what[256] = "communicator set-up";
  if (k) fsdp_coll_describe(k, what, sizeof what);
  if (c->impl) atomic_store(&impl_of(c)->failed, 1);
  return fsdp_error(FSDP_ERR_COMM, "nccl: %s failed for %s on communicator %d, rank %d of %d: "
                    "%s", call, what, c->id, c->rank, c->size, cudaGetErrorString(e));
}

#define NCCL_TRY(c, call, k)                                   \
  do {                                                         \
    ncclResult_t r_ = (call);                                  \
    if (r_ != ncclSuccess) return nccl_fail(c, r_, #call, k); \
  } while (0)

/* ---- bootstrap ------------------------------------------------------------ */

/* Rank 0's unique id, or word that it has none, as every rank receives it. */
typedef struct {
  ncclUniqueId id;
  int ok;
} id_msg_t;

/* A group of a split (c->members) under mpirun: every world rank sends its
 * message and takes its group leader's (every rank of the world creates its
 * group's communicator at the same time: fsdp_comm_split's rule). */
static fsdp_status_t exchange_group_mpi(fsdp_comm_t c, id_msg_t *m) {
  int world = fsdp_world_size(c->world);
  id_msg_t *all = fsdp_alloc((size_t)world * sizeof *all);
  if (!all) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "nccl: cannot exchange unique ids");
  int rc = MPI_Allgather(m, (int)sizeof *m, MPI_BYTE, all, (int)sizeof *m, MPI_BYTE,
                         fsdp_world_mpi_comm(c->world));
  if (rc == MPI_SUCCESS) *m = all[c->members[0]];
  fsdp_free(all);
  if (rc != MPI_SUCCESS)
    return fsdp_error(FSDP_ERR_COMM, "nccl: MPI_Allgather of the unique ids of communicator "
                      "%d failed on rank %d (MPI error %d)", c->id, c->rank, rc);
  return FSDP_SUCCESS;
}

static fsdp_status_t exchange(fsdp_comm_t c, id_msg_t *m) {
  if (fsdp_world_kind(c->world) == FSDP_WORLD_MPI) {
    if (c->members) return exchange_group_mpi(c, m);
    int rc = MPI_Bcast(m, (int)sizeof *m, MPI_BYTE, 0, fsdp_world_mpi_comm(c->world));
    if (rc != MPI_SUCCESS)
      return fsdp_error(FSDP_ERR_COMM, "nccl: MPI_Bcast of the unique id of communicator %d "
                        "failed on rank %d (MPI error %d)", c->id, c->rank, rc);
    return FSDP_SUCCESS;
  }
  char key[64];
  if (c->color >= 0) snprintf(key, sizeof key, "nccl/%d/%d", c->id, c->color);
  else snprintf(key, sizeof key, "nccl/%d", c->id);
  fsdp_store_t *store = fsdp_world_store(c->world);
  if (c->rank == 0) return fsdp_store_set(store, key, m, sizeof *m);
  char *v = NULL;
  size_t n = 0;
  FSDP_TRY(fsdp_store_get(store, key, fsdp_world_rendezvous_timeout(c->world), &v, &n));
  if (n == sizeof *m) memcpy(m, v, sizeof *m);
  fsdp_free(v);
  if (n != sizeof *m)
    return fsdp_error(FSDP_ERR_COMM, "nccl: store key '%s' holds %zu bytes, not the %zu of a "
                      "unique id", key, n, sizeof *m);
  return FSDP_SUCCESS;
}

/* Rank 0's unique id on every rank of c's group (the world, or a split's).
 * Rank 0 sends even when it has no id, so that the others fail with it
 * instead of waiting. A group takes part even alone: under mpirun the
 * exchange spans the world. */
static fsdp_status_t share_id(fsdp_comm_t c, ncclUniqueId *id) {
  id_msg_t m;
  memset(&m, 0, sizeof m);
  fsdp_status_t st = FSDP_SUCCESS;
  if (c->rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&m.id);
    m.ok = r == ncclSuccess;
    if (!m.ok) st = nccl_fail(c, r, "ncclGetUniqueId", NULL);
  }
  if (c->size > 1 || c->members) {
    fsdp_status_t sent = exchange(c, &m);
    if (st == FSDP_SUCCESS) st = sent;
  }
  if (st == FSDP_SUCCESS && !m.ok)
    st = fsdp_error(FSDP_ERR_COMM, "nccl: rank 0 could not make the unique id of "
                    "communicator %d (see its message)", c->id);
  *id = m.id;
  return st;
}

static void impl_free(nccl_impl_t *im) {
  for (size_t i = 0; i < im->cap; i++)
    if (im->pending[i].done) cudaEventDestroy(im->pending[i].done);
  fsdp_free(im->pending);
  pthread_mutex_destroy(&im->mu);
  if (im->scratch) cudaFree(im->scratch);
  if (im->own) cudaStreamDestroy(im->own);
  fsdp_free(im);
}

/* A new NCCL communicator over c's ranks on the current device. */
static fsdp_status_t nccl_connect(fsdp_comm_t c) {
  /* The id first: every rank takes part in its broadcast whatever happens
   * to its own CUDA set-up after it. */
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  FSDP_TRY(share_id(c, &id));
  nccl_impl_t *im = fsdp_alloc(sizeof *im);
  if (!im) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "comm: cannot allocate nccl state");
  memset(im, 0, sizeof *im);
  pthread_mutex_init(&im->mu, NULL);
  cudaError_t e = cudaGetDevice(&im->device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&im->own, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaMalloc((void **)&im->scratch, sizeof *im->scratch);
  if (e != cudaSuccess) {
    impl_free(im);
    return cuda_fail(c, e, "CUDA set-up (is a GPU present and selected?)", NULL);
  }
  ncclResult_t r = ncclCommInitRank(&im->comm, c->size, id, c->rank);
  if (r != ncclSuccess) {
    impl_free(im);
    return nccl_fail(c, r, "ncclCommInitRank", NULL);
  }
  c->impl = im;
  return FSDP_SUCCESS;
}

static fsdp_status_t nccl_create(fsdp_world_t world, fsdp_comm_t c) {
  c->rank = fsdp_world_rank(world);
  c->size = fsdp_world_size(world);
  return nccl_connect(c);
}

/* On comm's device, whichever device is current in the caller. */
static fsdp_status_t nccl_dup(fsdp_comm_t comm, fsdp_comm_t out) {
  out->rank = comm->rank;
  out->size = comm->size;
  int prev = 0;
  cudaGetDevice(&prev);
  cudaError_t e = cudaSetDevice(impl_of(comm)->device);
  if (e != cudaSuccess) return cuda_fail(out, e, "cudaSetDevice", NULL);
  fsdp_status_t st = nccl_connect(out);
  cudaSetDevice(prev);
  return st;
}

/* A fresh communicator per group (ncclCommInitRank with the group leader's
 * unique id, shared through the world) rather than ncclCommSplit, so that the
 * bootstrap is the one every other communicator uses. On parent's device. */
static fsdp_status_t nccl_split(fsdp_comm_t parent, fsdp_comm_t out, int key) {
  (void)key;
  int prev = 0;
  cudaGetDevice(&prev);
  cudaError_t e = cudaSetDevice(impl_of(parent)->device);
  if (e != cudaSuccess) return cuda_fail(out, e, "cudaSetDevice", NULL);
  fsdp_status_t st = nccl_connect(out);
  cudaSetDevice(prev);
  return st;
}

static void nccl_destroy(fsdp_comm_t c) {
  nccl_impl_t *im = impl_of(c);
  if (im->gone) { /* the watchdog aborted it */
  } else if (atomic_load(&im->failed)) ncclCommAbort(im->comm);
  else ncclCommDestroy(im->comm);
  impl_free(im);
  c->impl = NULL;
}

/* ---- collectives ---------------------------------------------------------- */

static ncclDataType_t nccl_type(fsdp_dtype_t dtype) {
  return dtype == FSDP_F64    ? ncclFloat64
         : dtype == FSDP_BF16 ? ncclBfloat16
         : dtype == FSDP_F16  ? ncclFloat16
                              : ncclFloat32;
}

static ncclRedOp_t nccl_op(fsdp_reduce_op_t op) {
  return op == FSDP_MAX ? ncclMax : op == FSDP_AVG ? ncclAvg : ncclSum;
}

/* A ring shift: the send to rank + offset and the receive from rank -
 * offset in one group, which NCCL pairs by peer and runs together (every
 * rank sends and receives at once: no ordering can deadlock). A call that
 * fails still closes the group, which then runs nothing. */
static ncclResult_t shift(ncclComm_t comm, const fsdp_coll_t *k, int rank, int size,
                          ncclDataType_t t, cudaStream_t s) {
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return r;
  r = ncclSend(k->send, k->count, t, (rank + k->root) % size, comm, s);
  if (r == ncclSuccess) r = ncclRecv(k->recv, k->count, t, (rank - k->root + size) % size, comm, s);
  ncclResult_t end = ncclGroupEnd();
  return r != ncclSuccess ? r : end;
}

/* The NCCL call that queues k on s. */
static ncclResult_t issue(fsdp_comm_t c, ncclComm_t comm, const fsdp_coll_t *k, float *scratch,
                          cudaStream_t s, const char **fn) {
  ncclDataType_t t = nccl_type(k->dtype);
  switch (k->kind) {
  case FSDP_COLL_ALL_GATHER:
    *fn = "ncclAllGather";
    return ncclAllGather(k->send, k->recv, k->count, t, comm, s);
  case FSDP_COLL_REDUCE_SCATTER:
    *fn = "ncclReduceScatter";
    return ncclReduceScatter(k->send, k->recv, k->count, t, nccl_op(k->op), comm, s);
  case FSDP_COLL_ALL_REDUCE:
    *fn = "ncclAllReduce";
    return ncclAllReduce(k->send, k->recv, k->count, t, nccl_op(k->op), comm, s);
  case FSDP_COLL_BROADCAST:
    *fn = "ncclBroadcast";
    return ncclBroadcast(k->recv, k->recv, k->count, t, k->root, comm, s);
  case FSDP_COLL_SHIFT:
    *fn = "ncclSend/ncclRecv (shift)";
    return shift(comm, k, c->rank, c->size, t, s);
  case FSDP_COLL_BARRIER: /* NCCL has none: a one-element all-reduce orders the streams */
    *fn = "ncclAllReduce (barrier)";
    return ncclAllReduce(scratch, scratch, 1, ncclFloat32, ncclSum, comm, s);
  }
  *fn = "an unknown collective";
  return ncclInvalidArgument;
}

/* k met the communicator aborted: after a failure inside a stream
 * (fail_async) or a cancel after one elsewhere in the world (nccl_cancel),
 * both of which say why first, or by the watchdog past a deadline. The
 * caller holds im->mu. */
static fsdp_status_t aborted(fsdp_comm_t c, const fsdp_coll_t *k) {
  nccl_impl_t *im = impl_of(c);
  return fsdp_error(FSDP_ERR_COMM, "nccl: %s #%llu on communicator %d: the communicator was "
                    "aborted%s%s", fsdp_coll_name(k->kind), (unsigned long long)k->seq, c->id,
                    im->why[0] ? ": " : " by the watchdog past a deadline", im->why);
}

/* Queues k on cuda_stream with im->mu released around the NCCL call (an
 * enqueue may block inside NCCL), so that the watchdog can still poll,
 * time k out and abort the communicator, which ends the call. With
 * `clock`, k is watched from its call on when nothing queued before it is
 * still running (the watch's rule: a deadline counts from when a collective
 * became the oldest unfinished one); a collective run on the host is
 * watched by comm.c already. On failure the clock is stopped. */
static fsdp_status_t submit(fsdp_comm_t c, const fsdp_coll_t *k, void *cuda_stream, int clock) {
  nccl_impl_t *im = impl_of(c);
  pthread_mutex_lock(&im->mu);
  if (im->gone) {
    fsdp_status_t st = aborted(c, k);
    pthread_mutex_unlock(&im->mu);
    return st;
  }
  ncclComm_t comm = im->comm;
  im->in_call = 1;
  im->entering = *k;
  if (clock && im->count == 0) fsdp_watch_begin(c, k);
  pthread_mutex_unlock(&im->mu);
  const char *fn = NULL;
  ncclResult_t r = issue(c, comm, k, im->scratch, cuda_stream, &fn);
  pthread_mutex_lock(&im->mu);
  im->in_call = 0;
  const int cancelled = im->cancel_due && !im->gone;
  if (cancelled) { /* a cancel or fail_async waited for the call to return */
    ncclCommAbort(im->comm);
    im->gone = 1;
  }
  int gone = im->gone;
  if ((gone || r != ncclSuccess) && clock && im->count == 0) fsdp_watch_end(c, k);
  fsdp_status_t st = gone && !cancelled ? aborted(c, k) : FSDP_SUCCESS;
  pthread_mutex_unlock(&im->mu);
  if (cancelled) { /* the world's first failure names the cause */
    st = fsdp_watch_check(c);
    if (st) return st;
    char what[256];
    fsdp_coll_describe(k, what, sizeof what);
    pthread_mutex_lock(&im->mu);
    st = fsdp_error(FSDP_ERR_COMM, "nccl: %s on communicator %d, rank %d of %d, was cancelled "
                    "(%s)", what, c->id, c->rank, c->size,
                    im->why[0] ? im->why : "a failure elsewhere in the world");
    pthread_mutex_unlock(&im->mu);
    return st;
  }
  /* The watchdog's report, or the first failure's (coll_cuda), replaces it. */
  if (gone) return st;
  if (r != ncclSuccess) return nccl_fail(c, r, fn, k);
  return FSDP_SUCCESS;
}

/* Room for one more pending collective; the caller holds im->mu. */
static fsdp_status_t pending_reserve(fsdp_comm_t c) {
  nccl_impl_t *im = impl_of(c);
  if (im->count < im->cap) return FSDP_SUCCESS;
  size_t cap = im->cap ? 2 * im->cap : 64;
  pending_t *grown = fsdp_alloc(cap * sizeof *grown);
  if (!grown)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "nccl: cannot track %zu queued collectives", cap);
  memset(grown, 0, cap * sizeof *grown);
  for (size_t i = 0; i < im->cap; i++) grown[i] = im->pending[(im->head + i) % im->cap];
  fsdp_free(im->pending);
  im->pending = grown;
  im->cap = cap;
  im->head = 0;
  return FSDP_SUCCESS;
}

/* NCCL's asynchronous error on c, ncclSuccess for none (or in progress), or
 * once an abort is done or deferred (fail_async reports an error once). */
static ncclResult_t async_error(nccl_impl_t *im) {
  ncclResult_t async = ncclSuccess;
  if (im->gone || im->cancel_due || ncclCommGetAsyncError(im->comm, &async) != ncclSuccess)
    return ncclSuccess;
  return async == ncclInProgress ? ncclSuccess : async;
}

/* Drops the queued collectives whose events have completed, in issue order,
 * restarting the deadline's clock for the next one (fsdp_watch_begin: the
 * next queued, else the one whose enqueue is still inside NCCL) or marking
 * the queue drained (fsdp_watch_end). The issuing thread calls it too, so
 * the queue stays as short as the work in flight without a watchdog thread
 * (a world of one). A collective that fails inside its stream never
 * completes there (NCCL's kernel waits until ncclCommAbort) and a
 * communicator's collectives run in issue order: so with the error read
 * first, every collective whose event has completed succeeded, and the
 * first one still queued is the one that failed (fail_async reports it).
 * Returns the asynchronous error read, or ncclSuccess. The caller holds
 * im->mu. */
static ncclResult_t retire(fsdp_comm_t c) {
  nccl_impl_t *im = impl_of(c);
  ncclResult_t a = async_error(im);
  while (!im->gone && im->count) {
    pending_t *p = &im->pending[im->head];
    if (cudaEventQuery(p->done) == cudaErrorNotReady) break;
    im->head = (im->head + 1) % im->cap;
    if (--im->count) fsdp_watch_begin(c, &im->pending[im->head].coll);
    else if (im->in_call) fsdp_watch_begin(c, &im->entering);
    else fsdp_watch_end(c, &p->coll);
  }
  return a;
}

/* ncclCommAbort now (the queued collectives and every wait on them end,
 * here and at the peers waiting for this rank; later calls fail); with
 * `defer`, a call inside NCCL on another thread is let return first (submit
 * aborts after it): a blocking communicator is not freed under a call that
 * is not hung. The caller holds im->mu. */
static void abort_locked(nccl_impl_t *im, int defer) {
  atomic_store(&im->failed, 1);
  if (im->gone) return;
  if (defer && im->in_call) {
    im->cancel_due = 1;
    return;
  }
  ncclCommAbort(im->comm);
  im->gone = 1;
}

/* An asynchronous NCCL error (a), after retire: the first collective still
 * queued on a CUDA stream is reported as the one that failed inside its
 * stream (none queued: one run on the host), its outputs not written; the
 * communicator is aborted
 * (which ends every wait on it) and failed, and the world refuses every
 * later collective with this report (fsdp_watch_note_failure). The caller
 * holds im->mu. */
static void fail_async(fsdp_comm_t c, ncclResult_t a) {
  nccl_impl_t *im = impl_of(c);
  char what[256] = "a collective run on the host";
  if (im->count) fsdp_coll_describe(&im->pending[im->head].coll, what, sizeof what);
  const char *last = ncclGetLastError(im->comm);
  snprintf(im->why, sizeof im->why, "nccl: %s on communicator %d failed inside its stream on "
           "rank %d of %d (its outputs are not valid): %s%s%s", what, c->id, c->rank, c->size,
           ncclGetErrorString(a), last && *last ? ": " : "", last ? last : "");
  fsdp_log(FSDP_LOG_ERROR, "%s; aborting the communicator", im->why);
  abort_locked(im, 1);
  fsdp_watch_note_failure(c, im->why);
}

/* Fails when the communicator failed before or NCCL reports an error from
 * work already queued (fail_async: the message names that work). */
static fsdp_status_t check_health(fsdp_comm_t c) {
  nccl_impl_t *im = impl_of(c);
  if (atomic_load(&im->failed)) {
    pthread_mutex_lock(&im->mu);
    fsdp_status_t st = fsdp_error(FSDP_ERR_COMM, "nccl: communicator %d failed earlier (%s); "
                                  "destroy it and make a new one", c->id,
                                  im->why[0] ? im->why : "see the first error");
    pthread_mutex_unlock(&im->mu);
    return st;
  }
  pthread_mutex_lock(&im->mu);
  ncclResult_t a = retire(c);
  if (a != ncclSuccess) fail_async(c, a);
  fsdp_status_t st = a == ncclSuccess ? FSDP_SUCCESS : fsdp_error(FSDP_ERR_COMM, "%s", im->why);
  pthread_mutex_unlock(&im->mu);
  return st;
}

/* The watchdog thread each tick, and every collective of the world before
 * it is issued (fsdp_watch_check): retires the collectives done (retire);
 * an asynchronous NCCL error names the collective that failed, fails and
 * aborts the communicator, which ends every wait on its streams, and makes
 * the world refuse every later collective with that report (fail_async). */
static void nccl_poll(fsdp_comm_t c) {
  nccl_impl_t *im = impl_of(c);
  pthread_mutex_lock(&im->mu);
  ncclResult_t a = retire(c);
  if (a != ncclSuccess) fail_async(c, a);
  pthread_mutex_unlock(&im->mu);
}

/* Records an event after k on cuda_stream for the watchdog (whose clock
 * submit started when the queue was empty). The caller holds im->mu. */
static fsdp_status_t track(fsdp_comm_t c, const fsdp_coll_t *k, void *cuda_stream) {
  nccl_impl_t *im = impl_of(c);
  if (im->gone) return aborted(c, k);
  FSDP_TRY(pending_reserve(c));
  pending_t *p = &im->pending[(im->head + im->count) % im->cap];
  cudaError_t e = p->done ? cudaSuccess
                          : cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(p->done, cuda_stream);
  if (e != cudaSuccess) return cuda_fail(c, e, "cudaEventRecord (for the watchdog)", k);
  p->coll = *k;
  im->count++;
  return FSDP_SUCCESS;
}

/* FSDP_TEST_FAULT="nccl_enqueue_poll@<rank>" makes certain, on that rank,
 * the race in which the watchdog's poll finds a failure inside a stream
 * between an enqueue's check_health and its submit. Each collective's
 * stream first waits for a gate (hold) that the next enqueue on the
 * communicator opens only once its check_health has passed; that enqueue
 * then polls as the watchdog does until a queued collective's failure was
 * reported or nothing is queued, so it meets a communicator the poll has
 * just aborted when what it opened fails. The poll ends: a queued
 * collective completes, or fails and is held until the abort; once
 * nothing is queued, no stream is still in a gate, so the next may be set
 * (none after a failure). A gate left closed (no later enqueue, or a wait
 * for the stream before one) opens at a failure or after the world's
 * timeout. For the simulator (a thread per stream) and for a run that
 * fails: on a GPU, host functions of every stream may share one driver
 * thread, and without a failure the last gate holds its stream until the
 * timeout. One communicator a rank: a gate on one holds the others' work
 * queued behind it on the same stream. */
static void CUDART_CB hold(void *arg) {
  nccl_impl_t *im = arg;
  const struct timespec nap = {0, 20000}; /* 20 us, as wait_own polls */
  while (atomic_load(&im->held) && !atomic_load(&im->failed) &&
         fsdp_time_now() < atomic_load(&im->held_until))
    nanosleep(&nap, NULL);
}

static void open_and_poll(fsdp_comm_t c) {
  nccl_impl_t *im = impl_of(c);
  atomic_store(&im->held, 0);
  for (;;) {
    nccl_poll(c);
    pthread_mutex_lock(&im->mu);
    const int settled = atomic_load(&im->failed) || im->count == 0;
    pthread_mutex_unlock(&im->mu);
    if (settled) return;
    const struct timespec nap = {0, 20000}; /* 20 us, as wait_own polls */
    nanosleep(&nap, NULL);
  }
}

static void close_gate(fsdp_comm_t c, void *cuda_stream) {
  nccl_impl_t *im = impl_of(c);
  atomic_store(&im->held_until, fsdp_time_now() + fsdp_watch_timeout(c));
  atomic_store(&im->held, 1);
  if (cudaLaunchHostFunc(cuda_stream, hold, im) != cudaSuccess) {
    (void)cudaGetLastError(); /* no gate; not an error for the next launch to report */
    atomic_store(&im->held, 0);
  }
}

/* A CUDA stream: queued there and watched (poll). */
static fsdp_status_t nccl_enqueue(fsdp_comm_t c, const fsdp_coll_t *k, void *cuda_stream) {
  FSDP_TRY(check_health(c));
  nccl_impl_t *im = impl_of(c);
  if (fsdp_test_fault("nccl_enqueue_poll", fsdp_world_rank(c->world))) {
    open_and_poll(c);
    if (!atomic_load(&im->failed)) close_gate(c, cuda_stream);
  }
  FSDP_TRY(submit(c, k, cuda_stream, 1));
  pthread_mutex_lock(&im->mu);
  fsdp_status_t st = track(c, k, cuda_stream);
  if (st != FSDP_SUCCESS && im->count == 0) fsdp_watch_end(c, k);
  pthread_mutex_unlock(&im->mu);
  return st;
}

/* Waits for the communicator's own stream without blocking in CUDA, so that
 * an abort or an asynchronous NCCL error ends the wait. */
static fsdp_status_t wait_own(fsdp_comm_t c, const fsdp_coll_t *k) {
  nccl_impl_t *im = impl_of(c);
  const struct timespec nap = {0, 20000}; /* 20 us */
  for (;;) {
    cudaError_t e = cudaStreamQuery(im->own);
    if (e == cudaSuccess) return FSDP_SUCCESS;
    if (e != cudaErrorNotReady) return cuda_fail(c, e, "cudaStreamQuery", k);
    if (atomic_load(&im->failed))
      return fsdp_error(FSDP_ERR_COMM, "nccl: %s on communicator %d was aborted",
                        fsdp_coll_name(k->kind), c->id);
    FSDP_TRY(check_health(c));
    nanosleep(&nap, NULL);
  }
}

/* Host or CPU stream: the collective on the communicator's device and own
 * stream, waited for here. The calling thread's device is restored. */
static fsdp_status_t nccl_run(fsdp_comm_t c, const fsdp_coll_t *k) {
  nccl_impl_t *im = impl_of(c);
  int prev = 0;
  cudaGetDevice(&prev);
  cudaError_t e = prev == im->device ? cudaSuccess : cudaSetDevice(im->device);
  if (e != cudaSuccess) return cuda_fail(c, e, "cudaSetDevice", k);
  fsdp_status_t st = check_health(c);
  if (st == FSDP_SUCCESS) st = submit(c, k, im->own, 0);
  if (st == FSDP_SUCCESS) st = wait_own(c, k);
  if (prev != im->device) cudaSetDevice(prev);
  return st;
}

/* After a failure inside a stream anywhere in the world (ops->cancel). */
static void nccl_cancel(fsdp_comm_t c) {
  nccl_impl_t *im = impl_of(c);
  pthread_mutex_lock(&im->mu);
  if (!im->why[0])
    snprintf(im->why, sizeof im->why, "cancelled after a collective of the world failed "
             "inside its stream");
  abort_locked(im, 1);
  pthread_mutex_unlock(&im->mu);
}

/* The watchdog thread, past a deadline: ncclCommAbort even under a call
 * (that call is what is hung, and the abort ends it), and in an MPI world
 * the job ends, as the mpi backend's does. */
static void nccl_abort(fsdp_comm_t c) {
  nccl_impl_t *im = impl_of(c);
  pthread_mutex_lock(&im->mu);
  abort_locked(im, 0);
  pthread_mutex_unlock(&im->mu);
  if (fsdp_world_kind(c->world) == FSDP_WORLD_MPI) MPI_Abort(MPI_COMM_WORLD, 1);
}

/* NCCL counts are size_t. */
const fsdp_comm_ops_t fsdp_comm_nccl_ops = {
    .name = "nccl",
    .max_count = SIZE_MAX,
    .create = nccl_create,
    .dup = nccl_dup,
    .destroy = nccl_destroy,
    .run = nccl_run,
    .abort = nccl_abort,
    .enqueue = nccl_enqueue,
    .split = nccl_split,
    .poll = nccl_poll,
    .cancel = nccl_cancel,
};
#endif
