/* src/comm/comm_desync.c — desync detection, on unless turned off
 * (world.h): before a collective runs, every rank all-gathers a fixed-size
 * fingerprint of it (operation, tag, count, dtype, reduction, root, sequence
 * number) on the same communicator and compares. The exchange always matches
 * in size and kind, because every rank runs it before every collective, so
 * ranks that are about to issue different collectives (an extra one, another
 * count, a skipped unit) all fail with every differing fingerprint in the
 * message instead of hanging or overrunning a buffer. Costs one all-gather of
 * 72 bytes per rank per collective: one more exchange, which is what a small
 * collective costs (README, "Desync check", has the numbers); a large one
 * does not notice. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "core/internal.h"
#include "world/world_internal.h"

#define FP_MAGIC 0x66736470u /* "fsdp" */

/* Only what must agree across ranks: no buffers, no rank. */
typedef struct {
  uint32_t magic;
  int32_t kind, dtype, op, root, pad;
  uint64_t seq, count;
  char tag[FSDP_COMM_TAG_MAX];
} fingerprint_t;

_Static_assert(sizeof(fingerprint_t) % sizeof(float) == 0, "moved as f32 elements");

static fingerprint_t fingerprint_of(const fsdp_coll_t *c) {
  fingerprint_t f;
  memset(&f, 0, sizeof f);
  f.magic = FP_MAGIC;
  f.kind = (int32_t)c->kind;
  f.dtype = (int32_t)c->dtype;
  if (c->kind == FSDP_COLL_REDUCE_SCATTER || c->kind == FSDP_COLL_ALL_REDUCE)
    f.op = (int32_t)c->op;
  if (c->kind == FSDP_COLL_BROADCAST || c->kind == FSDP_COLL_SHIFT) f.root = c->root;
  if (c->kind == FSDP_COLL_BARRIER) f.dtype = 0;
  f.seq = c->seq;
  f.count = c->count;
  memcpy(f.tag, c->tag, sizeof f.tag);
  f.tag[sizeof f.tag - 1] = '\0';
  return f;
}

static fsdp_coll_t coll_of(const fingerprint_t *f) {
  fsdp_coll_t c;
  memset(&c, 0, sizeof c);
  c.kind = (fsdp_coll_kind_t)f->kind;
  c.dtype = (fsdp_dtype_t)f->dtype;
  c.op = (fsdp_reduce_op_t)f->op;
  c.root = f->root;
  c.seq = f->seq;
  c.count = f->count;
  memcpy(c.tag, f->tag, sizeof c.tag);
  c.tag[sizeof c.tag - 1] = '\0';
  return c;
}

void fsdp_coll_describe(const fsdp_coll_t *c, char *buf, size_t n) {
  static const char *ops[] = {"sum", "avg", "max"};
  char tag[FSDP_COMM_TAG_MAX + 16] = "";
  if (c->tag[0]) snprintf(tag, sizeof tag, " for '%s'", c->tag);
  const char *dt = fsdp_dtype_name(c->dtype);
  const char *op = (unsigned)c->op < 3 ? ops[c->op] : "?";
  switch (c->kind) {
  case FSDP_COLL_ALL_GATHER:
  case FSDP_COLL_REDUCE_SCATTER:
    snprintf(buf, n, "%s #%llu%s (%zu %s per rank%s%s)", fsdp_coll_name(c->kind),
             (unsigned long long)c->seq, tag, c->count, dt,
             c->kind == FSDP_COLL_REDUCE_SCATTER ? ", " : "",
             c->kind == FSDP_COLL_REDUCE_SCATTER ? op : "");
    return;
  case FSDP_COLL_ALL_REDUCE:
    snprintf(buf, n, "all_reduce #%llu%s (%zu %s, %s)", (unsigned long long)c->seq, tag,
             c->count, dt, op);
    return;
  case FSDP_COLL_BROADCAST:
    snprintf(buf, n, "broadcast #%llu%s (%zu %s from rank %d)", (unsigned long long)c->seq, tag,
             c->count, dt, c->root);
    return;
  case FSDP_COLL_SHIFT:
    snprintf(buf, n, "shift #%llu%s (%zu %s to rank + %d)", (unsigned long long)c->seq, tag,
             c->count, dt, c->root);
    return;
  case FSDP_COLL_BARRIER:
    snprintf(buf, n, "barrier #%llu%s", (unsigned long long)c->seq, tag);
    return;
  }
  snprintf(buf, n, "collective kind %d #%llu", (int)c->kind, (unsigned long long)c->seq);
}

fsdp_status_t fsdp_desync_setup(fsdp_comm_t c) {
  /* A device backend's collectives read device memory, not the fingerprints'
   * host buffer, and most of them never pass through run: not checked. */
  if (!fsdp_world_desync_check(c->world) || c->size < 2 || c->ops->enqueue) return FSDP_SUCCESS;
  c->fingerprints = fsdp_alloc((size_t)c->size * sizeof(fingerprint_t));
  if (!c->fingerprints)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "comm: cannot allocate %d desync fingerprints",
                      c->size);
  return FSDP_SUCCESS;
}

void fsdp_desync_free(fsdp_comm_t c) {
  fsdp_free(c->fingerprints);
  c->fingerprints = NULL;
}

/* Every distinct fingerprint with the ranks that sent it, as
 * "ranks 0, 2-3 issued X but rank 1 issued Y". */
static void describe_groups(fsdp_comm_t comm, const fingerprint_t *all, int size, char *buf,
                            size_t n) {
  int *ranks = fsdp_alloc(2 * (size_t)size * sizeof(int)), *done = ranks + size;
  int used = 0, groups = 0;
  buf[0] = '\0';
  if (!ranks) {
    snprintf(buf, n, "the ranks disagree (out of memory to say how)");
    return;
  }
  for (int r = 0; r < size && (size_t)used < n; r++) {
    if (done[r]) continue;
    int count = 0;
    for (int q = r; q < size; q++)
      if (!done[q] && memcmp(&all[q], &all[r], sizeof all[r]) == 0)
        ranks[count++] = fsdp_comm_world_rank(comm, q), done[q] = 1;
    char list[128], what[200];
    fsdp_format_ranks(list, sizeof list, ranks, count);
    fsdp_coll_t c = coll_of(&all[r]);
    fsdp_coll_describe(&c, what, sizeof what);
    if (all[r].magic != FP_MAGIC) snprintf(what, sizeof what, "something that is not a "
                                           "fingerprint (desync check off on that rank?)");
    int k = snprintf(buf + used, n - (size_t)used, "%s%s %s issued %s",
                     groups == 0 ? "" : groups == 1 ? " but " : " and ",
                     count == 1 ? "rank" : "ranks", list, what);
    used += k > 0 ? k : 0;
    groups++;
  }
  fsdp_free(ranks);
}

fsdp_status_t fsdp_desync_check(fsdp_comm_t c, const fsdp_coll_t *coll) {
  if (!c->fingerprints) return FSDP_SUCCESS;
  fingerprint_t mine = fingerprint_of(coll), *all = c->fingerprints;
  fsdp_coll_t ex;
  memset(&ex, 0, sizeof ex);
  ex.kind = FSDP_COLL_ALL_GATHER;
  ex.send = &mine;
  ex.recv = all;
  ex.count = sizeof mine / sizeof(float);
  ex.dtype = FSDP_F32;
  ex.seq = coll->seq;
  FSDP_TRY(c->ops->run(c, &ex));
  int same = 1;
  for (int r = 0; r < c->size && same; r++) same = memcmp(&all[r], &mine, sizeof mine) == 0;
  if (same) return FSDP_SUCCESS;
  char groups[900], label[FSDP_COMM_LABEL_MAX + 4];
  describe_groups(c, all, c->size, groups, sizeof groups);
  fsdp_comm_label_text(c, label, sizeof label);
  /* Ranks are world ranks, so that a group's report reads like the world's. */
  return fsdp_error(FSDP_ERR_INVALID_USAGE, "desync on communicator %d%s, seen by rank %d: %s; "
                    "every rank must issue the same collectives in the same order",
                    c->id, label, fsdp_comm_world_rank(c, c->rank), groups);
}
