/* src/comm/comm.c — the process group front end (include/fsdp/comm.h).
 *
 * Every collective is validated here, on the calling thread and before any
 * communication, so that a bad argument fails the same way on every rank rather
 * than leaving the others blocked in a collective. A valid collective gets the
 * next sequence number of its communicator and the tag set just before it,
 * then runs now (host stream) or is copied into a closure and queued on the
 * stream; the backend (comm_mpi.c, comm_gloo.cc, comm_self.c) only ever sees
 * validated work, wrapped by the watchdog's bookkeeping and, when enabled, the
 * desync check. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "core/internal.h"
#include "device/stream_internal.h"
#include "dist/world_env.h"
#include "dist/world_internal.h"

const char *fsdp_coll_name(fsdp_coll_kind_t kind) {
  static const char *names[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast",
                                "barrier"};
  return (unsigned)kind < sizeof names / sizeof names[0] ? names[kind] : "collective";
}

void fsdp_comm_scale(void *buf, size_t count, fsdp_dtype_t dtype, double factor) {
  float k = (float)factor;
  if (dtype == FSDP_F64) {
    double *d = buf;
    for (size_t i = 0; i < count; i++) d[i] *= factor;
  } else if (dtype == FSDP_F32) {
    float *f = buf;
    for (size_t i = 0; i < count; i++) f[i] *= k;
  } else if (dtype == FSDP_BF16) {
    uint16_t *h = buf;
    for (size_t i = 0; i < count; i++) h[i] = fsdp_f32_to_bf16(fsdp_bf16_to_f32(h[i]) * k);
  }
}

void fsdp_bf16_combine(uint16_t *out, const uint16_t *a, const uint16_t *b, size_t n,
                       fsdp_reduce_op_t op) {
  if (op == FSDP_MAX) {
    for (size_t i = 0; i < n; i++)
      out[i] = fsdp_bf16_to_f32(b[i]) > fsdp_bf16_to_f32(a[i]) ? b[i] : a[i];
    return;
  }
  for (size_t i = 0; i < n; i++)
    out[i] = fsdp_f32_to_bf16(fsdp_bf16_to_f32(a[i]) + fsdp_bf16_to_f32(b[i]));
}

/* ---- lifetime ------------------------------------------------------------ */

static const fsdp_comm_ops_t *ops_for(fsdp_world_t world) {
  switch (fsdp_world_kind(world)) {
  case FSDP_WORLD_MPI:
    return &fsdp_comm_mpi_ops;
  case FSDP_WORLD_ENV:
    return &fsdp_comm_gloo_ops;
  case FSDP_WORLD_SELF:
    break;
  }
  return &fsdp_comm_self_ops;
}

static void comm_free(fsdp_comm_t c) {
  fsdp_desync_free(c);
  fsdp_watch_detach(c);
  pthread_mutex_destroy(&c->mu);
  fsdp_free(c);
}

/* A communicator of world on ops: joined to the watch, set up by the backend
 * (create from the world, or dup of `from`), with its desync buffer. */
static fsdp_status_t comm_make(const fsdp_comm_ops_t *ops, fsdp_world_t world, fsdp_comm_t from,
                               fsdp_comm_t *out) {
  struct fsdp_comm *c = fsdp_alloc(sizeof *c);
  if (!c)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "comm: cannot allocate a %s communicator",
                      ops->name);
  c->ops = ops;
  c->world = world;
  pthread_mutex_init(&c->mu, NULL);
  fsdp_status_t st = fsdp_watch_attach(world, c);
  if (st != FSDP_SUCCESS) {
    pthread_mutex_destroy(&c->mu);
    fsdp_free(c);
    return st;
  }
  st = from ? ops->dup(from, c) : ops->create(world, c);
  if (st != FSDP_SUCCESS) {
    comm_free(c);
    return st;
  }
  st = fsdp_desync_setup(c);
  if (st != FSDP_SUCCESS) {
    fsdp_comm_destroy(c);
    return st;
  }
  *out = c;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_comm_create(fsdp_world_t world, fsdp_comm_t *comm) {
  if (!world || !comm)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_comm_create: %s is NULL",
                      !world ? "world" : "comm");
  return comm_make(ops_for(world), world, NULL, comm);
}

fsdp_status_t fsdp_comm_dup(fsdp_comm_t comm, fsdp_comm_t *out) {
  if (!comm || !out)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_comm_dup: %s is NULL",
                      !comm ? "comm" : "out");
  return comm_make(comm->ops, comm->world, comm, out);
}

void fsdp_comm_destroy(fsdp_comm_t comm) {
  if (!comm) return;
  comm->ops->destroy(comm);
  comm_free(comm);
}

void fsdp_comm_set_tag(fsdp_comm_t comm, const char *tag) {
  if (comm) snprintf(comm->next_tag, sizeof comm->next_tag, "%s", tag ? tag : "");
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
  if (c->dtype != FSDP_F32 && c->dtype != FSDP_BF16 && c->dtype != FSDP_F64)
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "%s: reductions in %s are not supported; "
                      "reduce in f32, bf16 or f64 (cast the buffer first)",
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

/* The backend's run, watched, and preceded by the desync check when on. */
static fsdp_status_t coll_run(fsdp_comm_t comm, const fsdp_coll_t *c) {
  fsdp_watch_begin(comm, c);
  fsdp_status_t st = fsdp_desync_check(comm, c);
  if (st == FSDP_SUCCESS) st = comm->ops->run(comm, c);
  /* Before the end mark: a call failing at its deadline is still in flight
   * for the watchdog, whose report it returns. */
  if (st != FSDP_SUCCESS) st = fsdp_watch_failed(comm, st);
  fsdp_watch_end(comm, c);
  return st;
}

typedef struct {
  fsdp_comm_t comm;
  fsdp_coll_t coll;
} coll_task_t;

static fsdp_status_t coll_task_run(void *arg) {
  coll_task_t *t = arg;
  fsdp_status_t st = coll_run(t->comm, &t->coll);
  fsdp_free(t);
  return st;
}

static fsdp_status_t coll_task_skip(void *arg) {
  fsdp_free(arg);
  return FSDP_SUCCESS;
}

/* Numbers the collective (its tag was taken at issue). */
static void coll_label(fsdp_comm_t comm, fsdp_coll_t *c) {
  pthread_mutex_lock(&comm->mu);
  c->seq = ++comm->issued;
  pthread_mutex_unlock(&comm->mu);
}

static fsdp_status_t coll_issue(fsdp_comm_t comm, fsdp_coll_t *c, fsdp_stream_t stream) {
  fsdp_status_t st = check_coll(comm, c);
  if (comm) { /* a tag labels the next call only, whatever becomes of it */
    memcpy(c->tag, comm->next_tag, sizeof c->tag);
    comm->next_tag[0] = '\0';
  }
  FSDP_TRY(st);
  /* Every rank passes the same count, so skipping an empty collective keeps
   * all ranks in step. */
  if (c->count == 0 && c->kind != FSDP_COLL_BARRIER) return FSDP_SUCCESS;
  coll_label(comm, c);
  if (!stream) return coll_run(comm, c);
  coll_task_t *t = fsdp_alloc(sizeof *t);
  if (!t)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: cannot allocate the queued collective",
                      fsdp_coll_name(c->kind));
  t->comm = comm;
  t->coll = *c;
  st = fsdp_stream_launch_owned(stream, coll_task_run, coll_task_skip, t);
  if (st != FSDP_SUCCESS) fsdp_free(t);
  return st;
}

fsdp_status_t fsdp_all_gather(fsdp_comm_t comm, const void *send, void *recv, size_t count,
                              fsdp_dtype_t dtype, fsdp_stream_t stream) {
  fsdp_coll_t c = {.kind = FSDP_COLL_ALL_GATHER, .send = send, .recv = recv, .count = count,
                   .dtype = dtype, .op = FSDP_SUM};
  return coll_issue(comm, &c, stream);
}

fsdp_status_t fsdp_reduce_scatter(fsdp_comm_t comm, const void *send, void *recv,
                                  size_t count, fsdp_dtype_t dtype, fsdp_reduce_op_t op,
                                  fsdp_stream_t stream) {
  fsdp_coll_t c = {.kind = FSDP_COLL_REDUCE_SCATTER, .send = send, .recv = recv, .count = count,
                   .dtype = dtype, .op = op};
  return coll_issue(comm, &c, stream);
}

fsdp_status_t fsdp_all_reduce(fsdp_comm_t comm, const void *send, void *recv, size_t count,
                              fsdp_dtype_t dtype, fsdp_reduce_op_t op, fsdp_stream_t stream) {
  fsdp_coll_t c = {.kind = FSDP_COLL_ALL_REDUCE, .send = send, .recv = recv, .count = count,
                   .dtype = dtype, .op = op};
  return coll_issue(comm, &c, stream);
}

fsdp_status_t fsdp_broadcast(fsdp_comm_t comm, void *buf, size_t count, fsdp_dtype_t dtype,
                             int root, fsdp_stream_t stream) {
  fsdp_coll_t c = {.kind = FSDP_COLL_BROADCAST, .recv = buf, .count = count, .dtype = dtype,
                   .op = FSDP_SUM, .root = root};
  return coll_issue(comm, &c, stream);
}

fsdp_status_t fsdp_barrier(fsdp_comm_t comm, fsdp_stream_t stream) {
  fsdp_coll_t c = {.kind = FSDP_COLL_BARRIER, .dtype = FSDP_F32, .op = FSDP_SUM};
  return coll_issue(comm, &c, stream);
}
