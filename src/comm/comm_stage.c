/* src/comm/comm_stage.c — CUDA device buffers for the host backends (mpi,
 * gloo, self): a collective whose send or recv is device memory runs on a
 * pinned host copy. The inputs are copied in before the backend runs and the
 * outputs out after it, both with synchronous copies on the calling thread
 * (the host, or the worker of a CPU stream), so the backend never sees a
 * device pointer.
 *
 * The pinned buffer belongs to the communicator: allocated (fsdp_pinned_alloc) on
 * the first collective that needs it, regrown only when a larger one comes,
 * and freed by fsdp_comm_destroy, so a training loop that repeats the same
 * collectives allocates nothing after its first step. It holds the largest
 * send + recv bytes of any one staged collective (in-place forms: the one
 * buffer). A communicator is used from one stream at a time (comm.h), so one
 * buffer per communicator suffices. Built to a pass-through without CUDA. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "core/internal.h"

#if FSDP_HAVE_CUDA
static fsdp_status_t stage_reserve(fsdp_comm_t comm, size_t bytes) {
  if (bytes <= comm->stage_bytes) return FSDP_SUCCESS;
  void *p = NULL;
  fsdp_status_t st = fsdp_pinned_alloc(bytes, &p);
  if (st != FSDP_SUCCESS) {
    char why[512];
    snprintf(why, sizeof why, "%s", fsdp_last_error());
    return fsdp_error(st, "comm: staging device buffers for the %s backend: %s",
                      comm->ops->name, why);
  }
  fsdp_stage_free(comm);
  comm->stage = p;
  comm->stage_bytes = bytes;
  return FSDP_SUCCESS;
}

/* Points the device-side buffers of host into the staging memory. */
static fsdp_status_t stage_map(fsdp_comm_t comm, const fsdp_coll_t *c, int dev_send,
                               int dev_recv, fsdp_coll_t *host) {
  size_t send_b, recv_b;
  fsdp_coll_extent(comm, c, &send_b, &recv_b);
  if (c->in_place) { /* send and recv lie in one buffer: stage it whole, offsets kept */
    const char *s = c->send, *r = c->recv, *base = s < r ? s : r;
    FSDP_TRY(stage_reserve(comm, send_b > recv_b ? send_b : recv_b));
    host->send = (char *)comm->stage + (s - base);
    host->recv = (char *)comm->stage + (r - base);
    return FSDP_SUCCESS;
  }
  size_t at = dev_send ? (send_b + 63) / 64 * 64 : 0;
  FSDP_TRY(stage_reserve(comm, at + (dev_recv ? recv_b : 0)));
  if (dev_send) host->send = comm->stage;
  if (dev_recv) host->recv = (char *)comm->stage + at;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_stage_in(fsdp_comm_t comm, const fsdp_coll_t *c, fsdp_coll_t *host) {
  *host = *c;
  if (comm->ops->enqueue || c->kind == FSDP_COLL_BARRIER) return FSDP_SUCCESS;
  int has_send = c->kind != FSDP_COLL_BROADCAST;
  int dev_send = has_send && !c->in_place && fsdp_is_device_pointer(c->send);
  int dev_recv = fsdp_is_device_pointer(c->recv);
  if (!dev_send && !dev_recv) return FSDP_SUCCESS;
  FSDP_TRY(stage_map(comm, c, dev_send, dev_recv, host));
  size_t send_b, recv_b;
  fsdp_coll_extent(comm, c, &send_b, &recv_b);
  if (has_send && host->send != c->send)
    return fsdp_device_copy((void *)host->send, c->send, send_b, FSDP_HOST_STREAM);
  if (!has_send && comm->rank == c->root) /* broadcast: the root's buffer is the input */
    return fsdp_device_copy(host->recv, c->recv, recv_b, FSDP_HOST_STREAM);
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_stage_out(fsdp_comm_t comm, const fsdp_coll_t *c, const fsdp_coll_t *host) {
  if (host->recv == c->recv) return FSDP_SUCCESS;
  if (c->kind == FSDP_COLL_BROADCAST && comm->rank == c->root) return FSDP_SUCCESS;
  size_t send_b, recv_b;
  fsdp_coll_extent(comm, c, &send_b, &recv_b);
  return fsdp_device_copy(c->recv, host->recv, recv_b, FSDP_HOST_STREAM);
}

void fsdp_stage_free(fsdp_comm_t comm) {
  fsdp_pinned_free(comm->stage);
  comm->stage = NULL;
  comm->stage_bytes = 0;
}

#else /* no CUDA: there are no device buffers to stage */

fsdp_status_t fsdp_stage_in(fsdp_comm_t comm, const fsdp_coll_t *c, fsdp_coll_t *host) {
  (void)comm;
  *host = *c;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_stage_out(fsdp_comm_t comm, const fsdp_coll_t *c, const fsdp_coll_t *host) {
  (void)comm, (void)c, (void)host;
  return FSDP_SUCCESS;
}

void fsdp_stage_free(fsdp_comm_t comm) { (void)comm; }

#endif
