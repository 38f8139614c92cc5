/* src/comm/comm_self.c — the "self" backend: a world of one rank. Every
 * collective reduces to a copy (or nothing), which still runs in stream order
 * so the engine's schedule behaves exactly as it does with more ranks. */
#include <stdint.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "core/internal.h"

static fsdp_status_t self_create(fsdp_world_t world, fsdp_comm_t c) {
  (void)world;
  c->rank = 0;
  c->size = 1;
  c->impl = NULL;
  return FSDP_SUCCESS;
}

static fsdp_status_t self_dup(fsdp_comm_t comm, fsdp_comm_t out) {
  (void)comm;
  return self_create(NULL, out);
}

/* Only a group of one rank can be a split of a one-rank communicator. */
static fsdp_status_t self_split(fsdp_comm_t parent, fsdp_comm_t out, int key) {
  (void)parent;
  (void)key;
  out->impl = NULL;
  return FSDP_SUCCESS;
}

static void self_destroy(fsdp_comm_t c) { (void)c; }

static fsdp_status_t self_run(fsdp_comm_t c, const fsdp_coll_t *k) {
  (void)c;
  /* With one rank, SUM, AVG (x 1/1) and MAX of a single contribution are the
   * contribution itself, and a gather or reduce-scatter is a copy; memmove
   * because the in-place forms alias (here they coincide exactly). */
  switch (k->kind) {
  case FSDP_COLL_ALL_GATHER:
  case FSDP_COLL_REDUCE_SCATTER:
  case FSDP_COLL_ALL_REDUCE:
  case FSDP_COLL_SHIFT:
    if (k->send != k->recv) memmove(k->recv, k->send, k->count * fsdp_dtype_size(k->dtype));
    return FSDP_SUCCESS;
  case FSDP_COLL_BROADCAST:
  case FSDP_COLL_BARRIER:
    return FSDP_SUCCESS;
  }
  return fsdp_error(FSDP_ERR_INTERNAL, "comm self: unknown collective kind %d", (int)k->kind);
}

/* A self communicator has no per-call count limit beyond size_t. */
const fsdp_comm_ops_t fsdp_comm_self_ops = {
    .name = "self",
    .max_count = SIZE_MAX,
    .create = self_create,
    .dup = self_dup,
    .destroy = self_destroy,
    .run = self_run,
    .split = self_split,
};
