/* src/engine/comms.c — the engine's communication: the host, gather, reduce
 * and (HSDP) replica communicators split from the world, and the streams
 * their collectives run on. The schedule and the step issue on them. */
#include <stdio.h>
#include <string.h>

#include "comm/comm_names.h"
#include "engine/engine_internal.h"

static fsdp_status_t worker_set_device(void *arg) {
  return fsdp_cuda_set_device(((struct fsdp_engine *)arg)->comm.device);
}

/* c split into this rank's group of `what` ("shard" or "replica"), labelled. */
static fsdp_status_t group_split(struct fsdp_engine *e, fsdp_comm_t c, const char *what,
                                 int color, fsdp_comm_t *out) {
  FSDP_TRY(fsdp_comm_split(c, color, e->conf.rank, out));
  char label[FSDP_COMM_LABEL_MAX];
  const char *world = strstr(fsdp_comm_label(*out), "world ");
  snprintf(label, sizeof label, "%s group %d, %s", what, color, world ? world : "");
  fsdp_comm_set_label(*out, label);
  return FSDP_SUCCESS;
}

/* The host communicator (gradient norm, the caller's metrics) is always the
 * world's; gathers and reductions use the configured backend, within the
 * shard group; HSDP adds the replica group and a host shard group. */
static fsdp_status_t comms_create(struct fsdp_engine *e) {
  FSDP_TRY(fsdp_comm_create(e->conf.world, &e->comm.comm_host));
  fsdp_comm_t base = NULL;
  if (e->conf.comm_backend)
    FSDP_TRY(fsdp_comm_create_backend(e->conf.world, e->conf.comm_backend, &base));
  else FSDP_TRY(fsdp_comm_dup(e->comm.comm_host, &base));
  fsdp_status_t st = FSDP_SUCCESS;
  if (!e->conf.hybrid) {
    e->comm.comm_gather = base;
    return fsdp_comm_dup(base, &e->comm.comm_reduce);
  }
  int group = e->conf.rank / e->conf.shard_world, replica = e->conf.rank % e->conf.shard_world;
  st = group_split(e, base, "shard", group, &e->comm.comm_gather);
  if (!st) st = fsdp_comm_dup(e->comm.comm_gather, &e->comm.comm_reduce);
  if (!st) st = group_split(e, base, "replica", replica, &e->comm.comm_replica);
  if (!st) st = group_split(e, e->comm.comm_host, "shard", group, &e->comm.comm_host_shard);
  fsdp_comm_destroy(base);
  return st;
}

/* Collectives on NCCL run on CUDA streams; host backends on worker streams
 * (on CUDA their kernels go to the aux stream, on the caller's device). */
static fsdp_status_t streams_create(struct fsdp_engine *e) {
  int replica = e->comm.comm_replica != NULL;
  if (!fsdp_engine_on_host(e) && strcmp(fsdp_comm_backend(e->comm.comm_gather), "nccl") == 0) {
    /* NCCL queues on CUDA streams: communication never waits for the host. */
    FSDP_TRY(fsdp_stream_create_cuda("fsdp-gather", 1, &e->comm.s_gather));
    FSDP_TRY(fsdp_stream_create_cuda("fsdp-reduce", 1, &e->comm.s_reduce));
    if (replica) FSDP_TRY(fsdp_stream_create_cuda("fsdp-replica", 1, &e->comm.s_replica));
    return FSDP_SUCCESS;
  }
  /* Host backends (on CUDA: staged through pinned memory) run on workers. */
  FSDP_TRY(fsdp_stream_create("fsdp-gather", &e->comm.s_gather));
  FSDP_TRY(fsdp_stream_create("fsdp-reduce", &e->comm.s_reduce));
  if (replica) FSDP_TRY(fsdp_stream_create("fsdp-replica", &e->comm.s_replica));
  if (fsdp_engine_on_host(e)) return FSDP_SUCCESS;
  FSDP_TRY(fsdp_stream_create_cuda("fsdp-aux", 1, &e->comm.s_aux));
  /* The current device is per thread: the workers take the caller's. */
  FSDP_TRY(fsdp_cuda_get_device(&e->comm.device));
  FSDP_TRY(fsdp_stream_launch(e->comm.s_gather, worker_set_device, e));
  FSDP_TRY(fsdp_stream_launch(e->comm.s_reduce, worker_set_device, e));
  if (replica) FSDP_TRY(fsdp_stream_launch(e->comm.s_replica, worker_set_device, e));
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_engine_comm_create(struct fsdp_engine *e) {
  FSDP_TRY(comms_create(e));
  return streams_create(e);
}

void fsdp_engine_comm_stop(struct fsdp_engine *e) {
  fsdp_stream_destroy(e->comm.s_gather);
  fsdp_stream_destroy(e->comm.s_reduce);
  fsdp_stream_destroy(e->comm.s_replica);
  fsdp_stream_destroy(e->comm.s_aux);
  e->comm.s_gather = e->comm.s_reduce = e->comm.s_replica = e->comm.s_aux = NULL;
}

void fsdp_engine_comm_destroy(struct fsdp_engine *e) {
  fsdp_comm_destroy(e->comm.comm_gather);
  fsdp_comm_destroy(e->comm.comm_reduce);
  fsdp_comm_destroy(e->comm.comm_replica);
  fsdp_comm_destroy(e->comm.comm_host_shard);
  fsdp_comm_destroy(e->comm.comm_host);
}
