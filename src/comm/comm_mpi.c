/* src/comm/comm_mpi.c — the "mpi" backend: host buffers, one duplicated MPI
 * communicator per fsdp_comm_t so that collectives issued from different
 * streams (threads) never match each other. Errors return (MPI_ERRORS_RETURN)
 * and become FSDP_ERR_COMM with MPI's own text. bf16 travels as MPI_UINT16_T
 * and reduces through two commutative user ops (fsdp_bf16_combine), made per
 * communicator so that no process-wide state needs freeing before
 * MPI_Finalize. */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "core/internal.h"
#include "world/world_mpi.h"

typedef struct {
  MPI_Comm comm;
  MPI_Op bf16_sum, bf16_max; /* reductions of bf16 bit patterns */
} mpi_impl_t;

static MPI_Comm impl_comm(fsdp_comm_t c) { return ((mpi_impl_t *)c->impl)->comm; }

static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type) {
  (void)type;
  fsdp_bf16_combine(inout, inout, in, (size_t)*len, FSDP_SUM);
}

static void bf16_max(void *in, void *inout, int *len, MPI_Datatype *type) {
  (void)type;
  fsdp_bf16_combine(inout, inout, in, (size_t)*len, FSDP_MAX);
}

static MPI_Datatype mpi_type(fsdp_dtype_t dtype) {
  switch (dtype) {
  case FSDP_F64:
    return MPI_DOUBLE;
  case FSDP_BF16:
    return MPI_UINT16_T; /* moved as bits, reduced by the bf16 user ops */
  case FSDP_F16:
    return MPI_UINT16_T; /* moved as bits; never reduced (check_reduction) */
  default:
    return MPI_FLOAT;
  }
}

static MPI_Op mpi_op(fsdp_comm_t c, const fsdp_coll_t *k) {
  const mpi_impl_t *impl = c->impl;
  if (k->dtype == FSDP_BF16) return k->op == FSDP_MAX ? impl->bf16_max : impl->bf16_sum;
  return k->op == FSDP_MAX ? MPI_MAX : MPI_SUM;
}

static fsdp_status_t mpi_check(fsdp_comm_t c, int rc, const char *call, const fsdp_coll_t *coll) {
  if (rc == MPI_SUCCESS) return FSDP_SUCCESS;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "code %d", rc);
  return fsdp_error(FSDP_ERR_COMM, "%s (%s of %zu %s) failed on rank %d of %d: %s", call,
                    coll ? fsdp_coll_name(coll->kind) : "setup", coll ? coll->count : 0,
                    coll ? fsdp_dtype_name(coll->dtype) : "-", c->rank, c->size, text);
}

/* Takes ownership of a fresh MPI communicator (dup of `from`) for c. */
static fsdp_status_t mpi_adopt(fsdp_comm_t c, MPI_Comm from) {
  mpi_impl_t *impl = fsdp_alloc(sizeof *impl);
  if (!impl) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "comm: cannot allocate mpi state");
  /* Collective: a peer that failed or stalled before creating its
   * communicator would block us here forever without a deadline. */
  int rank = 0;
  MPI_Comm_rank(from, &rank);
  fsdp_mpi_guard_t *g = fsdp_mpi_guard_begin("communicator creation (MPI_Comm_dup)", rank,
                                             fsdp_world_timeout(c->world));
  int rc = MPI_Comm_dup(from, &impl->comm);
  fsdp_mpi_guard_end(g);
  if (rc != MPI_SUCCESS) {
    fsdp_free(impl);
    return mpi_check(c, rc, "MPI_Comm_dup", NULL);
  }
  MPI_Comm_set_errhandler(impl->comm, MPI_ERRORS_RETURN);
  MPI_Op_create(bf16_sum, 1, &impl->bf16_sum);
  MPI_Op_create(bf16_max, 1, &impl->bf16_max);
  MPI_Comm_rank(impl->comm, &c->rank);
  MPI_Comm_size(impl->comm, &c->size);
  c->impl = impl;
  return FSDP_SUCCESS;
}

static fsdp_status_t mpi_create(fsdp_world_t world, fsdp_comm_t c) {
  return mpi_adopt(c, fsdp_world_mpi_comm(world));
}

static fsdp_status_t mpi_dup(fsdp_comm_t comm, fsdp_comm_t out) {
  return mpi_adopt(out, impl_comm(comm));
}

/* MPI_Comm_split by colour, ranks ordered by key then parent rank: the order
 * comm.c computed; the result is adopted (duplicated) like any other. */
static fsdp_status_t mpi_split(fsdp_comm_t parent, fsdp_comm_t out, int key) {
  MPI_Comm part;
  int rc = MPI_Comm_split(impl_comm(parent), out->color, key, &part);
  if (rc != MPI_SUCCESS) return mpi_check(out, rc, "MPI_Comm_split", NULL);
  fsdp_status_t st = mpi_adopt(out, part);
  MPI_Comm_free(&part);
  return st;
}

static void mpi_destroy(fsdp_comm_t c) {
  mpi_impl_t *impl = c->impl;
  int finalized = 0;
  MPI_Finalized(&finalized); /* after MPI_Finalize there is nothing to free */
  if (!finalized) {
    MPI_Op_free(&impl->bf16_sum);
    MPI_Op_free(&impl->bf16_max);
    MPI_Comm_free(&impl->comm);
  }
  fsdp_free(impl);
}

static fsdp_status_t run_all_gather(fsdp_comm_t c, const fsdp_coll_t *k) {
  MPI_Datatype t = mpi_type(k->dtype);
  const void *send = k->in_place ? MPI_IN_PLACE : k->send;
  int n = (int)k->count;
  return mpi_check(c, MPI_Allgather(send, n, t, k->recv, n, t, impl_comm(c)), "MPI_Allgather", k);
}

static fsdp_status_t run_reduce_scatter(fsdp_comm_t c, const fsdp_coll_t *k) {
  MPI_Datatype t = mpi_type(k->dtype);
  size_t bytes = k->count * fsdp_dtype_size(k->dtype);
  int n = (int)k->count, rc;
  if (k->in_place) {
    /* MPI's in-place form leaves the result at the start of the full buffer,
     * while ours puts it in the rank's own slot: move it there afterwards. */
    char *full = (char *)k->recv - (size_t)c->rank * bytes;
    rc = MPI_Reduce_scatter_block(MPI_IN_PLACE, full, n, t, mpi_op(c, k), impl_comm(c));
    if (rc == MPI_SUCCESS && full != (char *)k->recv) memmove(k->recv, full, bytes);
  } else {
    rc = MPI_Reduce_scatter_block(k->send, k->recv, n, t, mpi_op(c, k), impl_comm(c));
  }
  FSDP_TRY(mpi_check(c, rc, "MPI_Reduce_scatter_block", k));
  if (k->op == FSDP_AVG) fsdp_comm_scale(k->recv, k->count, k->dtype, 1.0 / c->size);
  return FSDP_SUCCESS;
}

static fsdp_status_t run_all_reduce(fsdp_comm_t c, const fsdp_coll_t *k) {
  const void *send = k->in_place ? MPI_IN_PLACE : k->send;
  int rc = MPI_Allreduce(send, k->recv, (int)k->count, mpi_type(k->dtype), mpi_op(c, k),
                         impl_comm(c));
  FSDP_TRY(mpi_check(c, rc, "MPI_Allreduce", k));
  if (k->op == FSDP_AVG) fsdp_comm_scale(k->recv, k->count, k->dtype, 1.0 / c->size);
  return FSDP_SUCCESS;
}

static fsdp_status_t mpi_run(fsdp_comm_t c, const fsdp_coll_t *k) {
  switch (k->kind) {
  case FSDP_COLL_ALL_GATHER:
    return run_all_gather(c, k);
  case FSDP_COLL_REDUCE_SCATTER:
    return run_reduce_scatter(c, k);
  case FSDP_COLL_ALL_REDUCE:
    return run_all_reduce(c, k);
  case FSDP_COLL_BROADCAST:
    return mpi_check(c, MPI_Bcast(k->recv, (int)k->count, mpi_type(k->dtype), k->root,
                                  impl_comm(c)), "MPI_Bcast", k);
  case FSDP_COLL_BARRIER:
    return mpi_check(c, MPI_Barrier(impl_comm(c)), "MPI_Barrier", k);
  case FSDP_COLL_SHIFT: {
    int n = (int)k->count, to = (c->rank + k->root) % c->size;
    int from = (c->rank - k->root + c->size) % c->size;
    return mpi_check(c, MPI_Sendrecv(k->send, n, mpi_type(k->dtype), to, 0, k->recv, n,
                                     mpi_type(k->dtype), from, 0, impl_comm(c),
                                     MPI_STATUS_IGNORE), "MPI_Sendrecv", k);
  }
  }
  return fsdp_error(FSDP_ERR_INTERNAL, "comm mpi: unknown collective kind %d", (int)k->kind);
}

/* MPI offers no way to interrupt a blocked call: the watchdog ends the job. */
static void mpi_abort(fsdp_comm_t c) {
  (void)c;
  MPI_Abort(MPI_COMM_WORLD, 1);
}

const fsdp_comm_ops_t fsdp_comm_mpi_ops = {
    .name = "mpi",
    .max_count = INT_MAX,
    .create = mpi_create,
    .dup = mpi_dup,
    .destroy = mpi_destroy,
    .run = mpi_run,
    .abort = mpi_abort,
    .split = mpi_split,
};
