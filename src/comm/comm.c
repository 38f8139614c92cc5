/* src/comm/comm.c — the process group front end (include/fsdp/comm.h).
 *
 * Every collective is validated here, on the calling thread and before any
 * communication, so that a bad argument fails the same way on every rank rather
 * than leaving the others blocked in a collective. A valid collective runs now
 * (host stream) or is copied into a closure and queued on the stream; the
 * backend (comm_mpi.c, comm_self.c) only ever sees validated work. */
#include <stdint.h>

#include "comm/comm_internal.h"
#include "core/internal.h"
#include "device/stream_internal.h"
#include "dist/world_internal.h"

const char *fsdp_coll_name(fsdp_coll_kind_t kind) {
  static const char *names[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast",
                                "barrier"};
  return (unsigned)kind < sizeof names / sizeof names[0] ? names[kind] : "collective";
}

void fsdp_comm_scale(void *buf, size_t count, fsdp_dtype_t dtype, double factor) {
  if (dtype == FSDP_F64) {
    double *d = buf;
    for (size_t i = 0; i < count; i++) d[i] *= factor;
  } else if (dtype == FSDP_F32) {
    float *f = buf;
    float k = (float)factor;
    for (size_t i = 0; i < count; i++) f[i] *= k;
  }
}

/* ---- lifetime ------------------------------------------------------------ */

static fsdp_status_t comm_new(const fsdp_comm_ops_t *ops, fsdp_comm_t *out) {
  struct fsdp_comm *c = fsdp_alloc(sizeof *c);
  if (!c)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "comm: cannot allocate a %s communicator",
                      ops->name);
  c->ops = ops;
  *out = c;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_comm_create(fsdp_world_t world, fsdp_comm_t *comm) {
  if (!world || !comm)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_comm_create: %s is NULL",
                      !world ? "world" : "comm");
  const fsdp_comm_ops_t *ops = fsdp_world_uses_mpi(world) ? &fsdp_comm_mpi_ops
                                                          : &fsdp_comm_self_ops;
  fsdp_comm_t c = NULL;
  FSDP_TRY(comm_new(ops, &c));
  fsdp_status_t st = ops->create(world, c);
  if (st != FSDP_SUCCESS) {
    fsdp_free(c);
    return st;
  }
  *comm = c;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_comm_dup(fsdp_comm_t comm, fsdp_comm_t *out) {
  if (!comm || !out)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_comm_dup: %s is NULL",
                      !comm ? "comm" : "out");
  fsdp_comm_t c = NULL;
  FSDP_TRY(comm_new(comm->ops, &c));
  fsdp_status_t st = comm->ops->dup(comm, c);
  if (st != FSDP_SUCCESS) {
    fsdp_free(c);
    return st;
  }
  *out = c;
  return FSDP_SUCCESS;
}

void fsdp_comm_destroy(fsdp_comm_t comm) {
  if (!comm) return;
  comm->ops->destroy(comm);
  fsdp_free(comm);
}

int fsdp_comm_rank(fsdp_comm_t comm) { return comm ? comm->rank : -1; }
int fsdp_comm_size(fsdp_comm_t comm) { return comm ? comm->size : 0; }
const char *fsdp_comm_backend(fsdp_comm_t comm) { return comm ? comm->ops->name : "none"; }

/* ---- validation ---------------------------------------------------------- */

/* Bytes each side of the collective moves: send and recv sizes. */
static void coll_extent(fsdp_comm_t comm, const fsdp_coll_t *c, size_t *send_b, size_t *recv_b) {
  size_t one = c->count * fsdp_dtype_size(c->dtype);
  size_t all = one * (size_t)comm->size;
  *send_b = c->kind == FSDP_COLL_REDUCE_SCATTER ? all : one;
  *recv_b = c->kind == FSDP_COLL_ALL_GATHER ? all : one;
}

static int ranges_overlap(const void *a, size_t an, const void *b, size_t bn) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return an && bn && x < y + bn && y < x + an;
}

/* Sets in_place for the layouts comm.h allows; any other overlap is an error
 * because MPI (and NCCL) forbid aliased buffers. */
static fsdp_status_t check_aliasing(fsdp_comm_t comm, fsdp_coll_t *c) {
  if (c->kind == FSDP_COLL_BROADCAST || c->kind == FSDP_COLL_BARRIER) return FSDP_SUCCESS;
  size_t send_b, recv_b;
  coll_extent(comm, c, &send_b, &recv_b);
  size_t slot = c->count * fsdp_dtype_size(c->dtype) * (size_t)comm->rank;
  uintptr_t s = (uintptr_t)c->send, r = (uintptr_t)c->recv;
  if (c->kind == FSDP_COLL_ALL_GATHER) c->in_place = s == r + slot;
  if (c->kind == FSDP_COLL_REDUCE_SCATTER) c->in_place = r == s + slot;
  if (c->kind == FSDP_COLL_ALL_REDUCE) c->in_place = s == r;
  if (c->in_place || !ranges_overlap(c->send, send_b, c->recv, recv_b)) return FSDP_SUCCESS;
  return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                    "%s: send and recv overlap but not in the in-place layout (send %p, "
                    "recv %p, count %zu, rank %d); see the in-place forms in fsdp/comm.h",
                    fsdp_coll_name(c->kind), c->send, (void *)c->recv, c->count, comm->rank);
}

static fsdp_status_t check_reduction(const fsdp_coll_t *c) {
  if (c->op != FSDP_SUM && c->op != FSDP_AVG && c->op != FSDP_MAX)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: reduce op %d is not FSDP_SUM, FSDP_AVG "
                      "or FSDP_MAX", fsdp_coll_name(c->kind), (int)c->op);
  if (c->dtype != FSDP_F32 && c->dtype != FSDP_F64)
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "%s: reductions in %s are not supported yet; "
                      "reduce in f32 or f64 (cast the buffer first)",
                      fsdp_coll_name(c->kind), fsdp_dtype_name(c->dtype));
  return FSDP_SUCCESS;
}

static fsdp_status_t check_sizes(fsdp_comm_t comm, const fsdp_coll_t *c) {
  const char *name = fsdp_coll_name(c->kind);
  size_t es = fsdp_dtype_size(c->dtype);
  if (es == 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: dtype %d is not an fsdp_dtype_t",
                      name, (int)c->dtype);
  if (c->count > comm->ops->max_count)
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "%s: count %zu exceeds the %s backend's limit "
                      "of %zu elements per call; split the buffer into smaller calls",
                      name, c->count, comm->ops->name, comm->ops->max_count);
  if (c->count > SIZE_MAX / es / (size_t)comm->size)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: count %zu x %d ranks x %zu bytes "
                      "overflows size_t", name, c->count, comm->size, es);
  return FSDP_SUCCESS;
}

static fsdp_status_t check_coll(fsdp_comm_t comm, fsdp_coll_t *c) {
  const char *name = fsdp_coll_name(c->kind);
  if (!comm) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: comm is NULL", name);
  if (c->kind == FSDP_COLL_BARRIER) return FSDP_SUCCESS;
  FSDP_TRY(check_sizes(comm, c));
  int has_send = c->kind != FSDP_COLL_BROADCAST;
  if (c->count > 0 && ((has_send && !c->send) || !c->recv))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: %s buffer is NULL with count %zu",
                      name, !c->recv ? (has_send ? "recv" : "the") : "send", c->count);
  if (c->kind == FSDP_COLL_REDUCE_SCATTER || c->kind == FSDP_COLL_ALL_REDUCE)
    FSDP_TRY(check_reduction(c));
  if (c->kind == FSDP_COLL_BROADCAST && (c->root < 0 || c->root >= comm->size))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "broadcast: root %d is not a rank of this "
                      "communicator (size %d)", c->root, comm->size);
  return check_aliasing(comm, c);
}

/* ---- issue --------------------------------------------------------------- */

typedef struct {
  fsdp_comm_t comm;
  fsdp_coll_t coll;
} coll_task_t;

static fsdp_status_t coll_task_run(void *arg) {
  coll_task_t *t = arg;
  fsdp_status_t st = t->comm->ops->run(t->comm, &t->coll);
  fsdp_free(t);
  return st;
}

static fsdp_status_t coll_task_skip(void *arg) {
  fsdp_free(arg);
  return FSDP_SUCCESS;
}

static fsdp_status_t coll_issue(fsdp_comm_t comm, fsdp_coll_t *c, fsdp_stream_t stream) {
  FSDP_TRY(check_coll(comm, c));
  /* Every rank passes the same count, so skipping an empty collective keeps
   * all ranks in step. */
  if (c->count == 0 && c->kind != FSDP_COLL_BARRIER) return FSDP_SUCCESS;
  if (!stream) return comm->ops->run(comm, c);
  coll_task_t *t = fsdp_alloc(sizeof *t);
  if (!t)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: cannot allocate the queued collective",
                      fsdp_coll_name(c->kind));
  t->comm = comm;
  t->coll = *c;
  fsdp_status_t st = fsdp_stream_launch_owned(stream, coll_task_run, coll_task_skip, t);
  if (st != FSDP_SUCCESS) fsdp_free(t);
  return st;
}

fsdp_status_t fsdp_all_gather(fsdp_comm_t comm, const void *send, void *recv, size_t count,
                              fsdp_dtype_t dtype, fsdp_stream_t stream) {
  fsdp_coll_t c = {FSDP_COLL_ALL_GATHER, send, recv, count, dtype, FSDP_SUM, 0, 0};
  return coll_issue(comm, &c, stream);
}

fsdp_status_t fsdp_reduce_scatter(fsdp_comm_t comm, const void *send, void *recv,
                                  size_t count, fsdp_dtype_t dtype, fsdp_reduce_op_t op,
                                  fsdp_stream_t stream) {
  fsdp_coll_t c = {FSDP_COLL_REDUCE_SCATTER, send, recv, count, dtype, op, 0, 0};
  return coll_issue(comm, &c, stream);
}

fsdp_status_t fsdp_all_reduce(fsdp_comm_t comm, const void *send, void *recv, size_t count,
                              fsdp_dtype_t dtype, fsdp_reduce_op_t op, fsdp_stream_t stream) {
  fsdp_coll_t c = {FSDP_COLL_ALL_REDUCE, send, recv, count, dtype, op, 0, 0};
  return coll_issue(comm, &c, stream);
}

fsdp_status_t fsdp_broadcast(fsdp_comm_t comm, void *buf, size_t count, fsdp_dtype_t dtype,
                             int root, fsdp_stream_t stream) {
  fsdp_coll_t c = {FSDP_COLL_BROADCAST, NULL, buf, count, dtype, FSDP_SUM, root, 0};
  return coll_issue(comm, &c, stream);
}

fsdp_status_t fsdp_barrier(fsdp_comm_t comm, fsdp_stream_t stream) {
  fsdp_coll_t c = {FSDP_COLL_BARRIER, NULL, NULL, 0, FSDP_F32, FSDP_SUM, 0, 0};
  return coll_issue(comm, &c, stream);
}
