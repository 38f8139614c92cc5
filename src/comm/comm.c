/* src/comm/comm.c — the process group front end (include/fsdp/comm.h).
 *
 * Every collective is validated here, on the calling thread and before any
 * communication, so that a bad argument fails the same way on every rank rather
 * than leaving the others blocked in a collective. A valid collective gets the
 * next sequence number of its communicator and the tag set just before it,
 * then runs now (host stream), is copied into a closure and queued (CPU
 * stream), or goes to the backend's enqueue (CUDA stream, nccl). A host
 * backend given a CUDA stream runs the collective in the caller after
 * synchronising the stream. fsdp_comm_split exchanges every rank's colour
 * and key, then has the backend build each group's communicator (the ranks
 * agree before the exchange and after the build, so a failure is every
 * rank's); a group
 * keeps its members' world ranks for reports. The backend (comm_mpi.c, comm_gloo.cc,
 * comm_self.c, comm_nccl.c) only ever sees validated work, wrapped by the
 * watchdog's bookkeeping and, when enabled, the desync check; host backends
 * see device buffers only through staging (comm_stage.c). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "core/internal.h"
#include "device/stream_internal.h"
#include "world/world_internal.h"
#include "world/world_mpi.h"

const char *fsdp_coll_name(fsdp_coll_kind_t kind) {
  static const char *names[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast",
                                "barrier", "shift"};
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

/* "mpi, self, nccl": the backends fsdp_comm_create_backend accepts for world. */
static void backends_for(fsdp_world_t world, char *buf, size_t n) {
  snprintf(buf, n, "%s%s%s", ops_for(world)->name,
           fsdp_world_size(world) == 1 && ops_for(world) != &fsdp_comm_self_ops ? ", self" : "",
           FSDP_HAVE_NCCL ? ", nccl" : "");
}

/* The ops for a backend asked for by name, or why it cannot be had. */
static fsdp_status_t ops_named(fsdp_world_t world, const char *name, const fsdp_comm_ops_t **ops) {
  char avail[64];
  backends_for(world, avail, sizeof avail);
  const fsdp_comm_ops_t *all[] = {&fsdp_comm_mpi_ops, &fsdp_comm_gloo_ops, &fsdp_comm_self_ops};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    if (strcmp(name, all[i]->name) != 0) continue;
    int fits = all[i] == ops_for(world) ||
               (all[i] == &fsdp_comm_self_ops && fsdp_world_size(world) == 1);
    if (!fits) break;
    *ops = all[i];
    return FSDP_SUCCESS;
  }
#if FSDP_HAVE_NCCL
  if (strcmp(name, "nccl") == 0) {
    *ops = &fsdp_comm_nccl_ops;
    return FSDP_SUCCESS;
  }
#endif
  int known = !strcmp(name, "mpi") || !strcmp(name, "gloo") || !strcmp(name, "self") ||
              !strcmp(name, "nccl");
  if (!known)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_comm_create_backend: unknown backend "
                      "'%s'; this %s world of %d rank(s) offers: %s", name,
                      fsdp_world_backend(world), fsdp_world_size(world), avail);
  return fsdp_error(FSDP_ERR_UNSUPPORTED, "fsdp_comm_create_backend: backend '%s' is not "
                    "available %s; this %s world of %d rank(s) offers: %s", name,
                    !strcmp(name, "nccl") ? "(fsdp was built without NCCL: configure with "
                    "CUDA and NCCL installed)" : "in this world", fsdp_world_backend(world),
                    fsdp_world_size(world), avail);
}

static void comm_free(fsdp_comm_t c) {
  fsdp_free(c->members);
  fsdp_stage_free(c);
  fsdp_desync_free(c);
  fsdp_watch_detach(c);
  pthread_mutex_destroy(&c->mu);
  fsdp_free(c);
}

/* How a new communicator is set up by its backend: from the world, as a dup
 * of `from`, or as the split of `from` into the group `members` (world ranks,
 * in rank order) that this rank is rank `rank` of. */
typedef struct {
  fsdp_comm_t from;
  int split, color, key, rank, n;
  int *members; /* owned by the new communicator once made */
} comm_origin_t;

static fsdp_status_t comm_setup(fsdp_comm_t c, fsdp_world_t world, const comm_origin_t *o) {
  if (!o->from) return c->ops->create(world, c);
  if (!o->split) return c->ops->dup(o->from, c);
  c->rank = o->rank;
  c->size = o->n;
  c->color = o->color;
  c->members = o->members;
  return c->ops->split(o->from, c, o->key);
}

/* A communicator of world on ops: joined to the watch, set up by the backend,
 * with its desync buffer. A dup keeps its parent's group and label. */
static fsdp_status_t comm_make(const fsdp_comm_ops_t *ops, fsdp_world_t world,
                               const comm_origin_t *origin, fsdp_comm_t *out) {
  struct fsdp_comm *c = fsdp_alloc(sizeof *c);
  if (!c) {
    fsdp_free(origin->members);
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "comm: cannot allocate a %s communicator",
                      ops->name);
  }
  c->ops = ops;
  c->world = world;
  c->color = -1;
  pthread_mutex_init(&c->mu, NULL);
  fsdp_status_t st = fsdp_watch_attach(world, c);
  if (st != FSDP_SUCCESS) {
    pthread_mutex_destroy(&c->mu);
    fsdp_free(c);
    fsdp_free(origin->members);
    return st;
  }
  fsdp_comm_t from = origin->from;
  if (from && !origin->split && from->members) {
    /* Backends see a dup's group as its parent's (gloo meshes by colour). */
    c->color = from->color;
    c->members = fsdp_alloc((size_t)from->size * sizeof *c->members);
    if (!c->members) {
      comm_free(c);
      return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "comm: cannot allocate a group's ranks");
    }
    memcpy(c->members, from->members, (size_t)from->size * sizeof *c->members);
  }
  if (from) memcpy(c->label, from->label, sizeof c->label);
  st = comm_setup(c, world, origin);
  if (st != FSDP_SUCCESS) {
    /* Creation is collective: the peers that did arrive are failing too, and
     * the one that did not may never reach the exit barrier. */
    fsdp_world_mark_failed(world);
    comm_free(c);
    return st;
  }
  fsdp_watch_set_ready(c, 1);
  st = fsdp_desync_setup(c);
  if (st != FSDP_SUCCESS) {
    fsdp_comm_destroy(c);
    return st;
  }
  *out = c;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_comm_create(fsdp_world_t world, fsdp_comm_t *comm) {
  return fsdp_comm_create_backend(world, NULL, comm);
}

fsdp_status_t fsdp_comm_create_backend(fsdp_world_t world, const char *backend,
                                       fsdp_comm_t *comm) {
  if (!world || !comm)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_comm_create: %s is NULL",
                      !world ? "world" : "comm");
  const fsdp_comm_ops_t *ops = ops_for(world);
  if (backend) FSDP_TRY(ops_named(world, backend, &ops));
  comm_origin_t o = {0};
  return comm_make(ops, world, &o, comm);
}

fsdp_status_t fsdp_comm_dup(fsdp_comm_t comm, fsdp_comm_t *out) {
  if (!comm || !out)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_comm_dup: %s is NULL",
                      !comm ? "comm" : "out");
  comm_origin_t o = {.from = comm};
  return comm_make(comm->ops, comm->world, &o, out);
}

/* The host communicator a split of comm exchanges and agrees over: comm
 * itself on a host backend; for a device backend (nccl) a temporary one of
 * the world (*temp), which comm must then span. */
static fsdp_status_t split_host(fsdp_comm_t comm, fsdp_comm_t *host, fsdp_comm_t *temp) {
  *temp = NULL;
  *host = comm;
  if (!comm->ops->enqueue) return FSDP_SUCCESS;
  if (comm->members)
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "fsdp_comm_split: a %s communicator is split "
                      "only when it spans the world (communicator %d is a group of %d)",
                      comm->ops->name, comm->id, comm->size);
  FSDP_TRY(fsdp_comm_create(comm->world, temp));
  *host = *temp;
  return FSDP_SUCCESS;
}

/* Every rank learns whether every rank got through a step (mine: this
 * rank's status), so that they all go on or all fail: FSDP_SUCCESS, this
 * rank's own error, or FSDP_ERR_COMM naming the highest failed rank. */
static fsdp_status_t split_agree(fsdp_comm_t comm, fsdp_comm_t host, fsdp_status_t mine,
                                 const char *step) {
  int me = fsdp_world_rank(comm->world);
  float failed = mine == FSDP_SUCCESS ? 0.0f : (float)(me + 1), worst = 0.0f;
  fsdp_status_t st = fsdp_all_reduce(host, &failed, &worst, 1, FSDP_F32, FSDP_MAX,
                                     FSDP_HOST_STREAM);
  if (mine != FSDP_SUCCESS) return mine; /* its message stands */
  if (st != FSDP_SUCCESS) return st;
  if (worst == 0.0f) return FSDP_SUCCESS;
  return fsdp_error(FSDP_ERR_COMM, "fsdp_comm_split of communicator %d: world rank %d failed "
                    "to %s (see its error), so no rank made the group", comm->id,
                    (int)worst - 1, step);
}

/* The ranks of comm sharing colour `color`, ordered by (key, rank). */
static int split_members(const fsdp_comm_t comm, const int *pairs, int color, int *order) {
  int n = 0;
  for (int r = 0; r < comm->size; r++) {
    if (pairs[2 * r] != color) continue;
    int i = n++;
    while (i > 0 && pairs[2 * order[i - 1] + 1] > pairs[2 * r + 1]) order[i] = order[i - 1], i--;
    order[i] = r;
  }
  return n;
}

/* What the ranks' (colour, key) pairs make of this rank: its group in o.
 * pairs holds 3 ints per rank of comm, members one. */
static void split_group(fsdp_comm_t comm, int *pairs, int color, comm_origin_t *o) {
  int *order = pairs + 2 * comm->size;
  o->n = split_members(comm, pairs, color, order);
  for (int i = 0; i < o->n; i++) {
    if (order[i] == comm->rank) o->rank = i;
    o->members[i] = fsdp_comm_world_rank(comm, order[i]);
  }
}

/* The group's communicator, or on any rank's failure none on every rank. */
static fsdp_status_t split_make(fsdp_comm_t comm, fsdp_comm_t host, comm_origin_t *o,
                                fsdp_comm_t *out) {
  fsdp_comm_t g = NULL;
  fsdp_status_t st = comm_make(comm->ops, comm->world, o, &g); /* owns o->members */
  if (st == FSDP_SUCCESS && fsdp_test_fault("comm_split_setup", fsdp_world_rank(comm->world))) {
    st = fsdp_error(FSDP_ERR_COMM, "fsdp_comm_split: injected failure of the group's "
                    "communicator (FSDP_TEST_FAULT)");
  }
  st = split_agree(comm, host, st, "set up its group's communicator");
  if (st != FSDP_SUCCESS) {
    fsdp_comm_destroy(g);
    return st;
  }
  *out = g;
  return FSDP_SUCCESS;
}

/* Collective in failure too: every rank allocates what it needs first and
 * the ranks agree that all did before any exchange; after the backend made
 * the groups they agree again, so that one rank's failure anywhere fails the
 * split on every rank (naming that rank) instead of leaving the others
 * waiting in a collective it never joins, or holding a group it lacks. */
fsdp_status_t fsdp_comm_split(fsdp_comm_t comm, int color, int key, fsdp_comm_t *out) {
  if (!comm || !out)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_comm_split: %s is NULL",
                      !comm ? "comm" : "out");
  if (color < 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_comm_split: colour %d on rank %d is "
                      "negative; every rank joins a group (colour >= 0)", color, comm->rank);
  if (!comm->ops->split)
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "fsdp_comm_split: the %s backend cannot split",
                      comm->ops->name);
  fsdp_comm_t host, temp;
  FSDP_TRY(split_host(comm, &host, &temp));
  int mine[2] = {color, key};
  comm_origin_t o = {.from = comm, .split = 1, .color = color, .key = key};
  int *pairs = NULL;
  if (!fsdp_test_fault("comm_split", fsdp_world_rank(comm->world))) {
    pairs = fsdp_alloc((size_t)comm->size * 3 * sizeof *pairs);
    o.members = fsdp_alloc((size_t)comm->size * sizeof *o.members);
  }
  fsdp_status_t st = pairs && o.members
                         ? FSDP_SUCCESS
                         : fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "fsdp_comm_split: out of host "
                                      "memory for the ranks of communicator %d", comm->id);
  st = split_agree(comm, host, st, "allocate");
  if (st == FSDP_SUCCESS) st = fsdp_all_gather(host, mine, pairs, 2, FSDP_F32, FSDP_HOST_STREAM);
  if (st == FSDP_SUCCESS) split_group(comm, pairs, color, &o);
  fsdp_free(pairs);
  if (st == FSDP_SUCCESS) st = split_make(comm, host, &o, out);
  else fsdp_free(o.members);
  fsdp_comm_destroy(temp);
  if (st != FSDP_SUCCESS) return st;
  char list[40], label[FSDP_COMM_LABEL_MAX];
  fsdp_format_ranks(list, sizeof list, (*out)->members, o.n);
  snprintf(label, sizeof label, "group %d of communicator %d: world %s %s", color, comm->id,
           o.n == 1 ? "rank" : "ranks", list);
  fsdp_comm_set_label(*out, label);
  return FSDP_SUCCESS;
}

void fsdp_comm_set_label(fsdp_comm_t comm, const char *label) {
  if (comm) snprintf(comm->label, sizeof comm->label, "%s", label ? label : "");
}

const char *fsdp_comm_label(fsdp_comm_t comm) { return comm ? comm->label : ""; }

void fsdp_comm_label_text(fsdp_comm_t comm, char *buf, size_t n) {
  if (comm && comm->label[0]) snprintf(buf, n, " (%s)", comm->label);
  else if (n) buf[0] = '\0';
}

void fsdp_comm_destroy(fsdp_comm_t comm) {
  if (!comm) return;
  fsdp_watch_set_ready(comm, 0);
  comm->ops->destroy(comm);
  comm_free(comm);
}

fsdp_status_t fsdp_comm_set_cancel_on_failure(fsdp_comm_t comm, int cancel) {
  if (!comm)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_comm_set_cancel_on_failure: comm is "
                      "NULL");
  fsdp_watch_set_keep(comm, !cancel);
  return FSDP_SUCCESS;
}

void fsdp_comm_set_tag(fsdp_comm_t comm, const char *tag) {
  if (comm) snprintf(comm->next_tag, sizeof comm->next_tag, "%s", tag ? tag : "");
}

int fsdp_comm_rank(fsdp_comm_t comm) { return comm ? comm->rank : -1; }
int fsdp_comm_size(fsdp_comm_t comm) { return comm ? comm->size : -1; }
const char *fsdp_comm_backend(fsdp_comm_t comm) { return comm ? comm->ops->name : NULL; }

/* ---- validation ---------------------------------------------------------- */

void fsdp_coll_extent(fsdp_comm_t comm, const fsdp_coll_t *c, size_t *send_b, size_t *recv_b) {
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
  fsdp_coll_extent(comm, c, &send_b, &recv_b);
  size_t slot = c->count * fsdp_dtype_size(c->dtype) * (size_t)comm->rank;
  uintptr_t s = (uintptr_t)c->send, r = (uintptr_t)c->recv;
  if (c->kind == FSDP_COLL_ALL_GATHER) c->in_place = s == r + slot;
  if (c->kind == FSDP_COLL_REDUCE_SCATTER) c->in_place = r == s + slot;
  if (c->kind == FSDP_COLL_ALL_REDUCE) c->in_place = s == r;
  /* A shift has no in-place form: its input leaves while its output arrives. */
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

/* A device backend (nccl) reads and writes CUDA device memory only. */
static fsdp_status_t check_placement(fsdp_comm_t comm, const fsdp_coll_t *c) {
  if (!comm->ops->enqueue || c->count == 0) return FSDP_SUCCESS;
  int has_send = c->kind != FSDP_COLL_BROADCAST;
  const void *host = has_send && !fsdp_is_device_pointer(c->send) ? c->send
                     : !fsdp_is_device_pointer(c->recv)          ? c->recv
                                                                 : NULL;
  if (!host) return FSDP_SUCCESS;
  return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "%s: the %s backend needs CUDA device buffers "
                    "(fsdp_device_alloc with FSDP_DEVICE_CUDA), but %s %p is not device memory; "
                    "use a host backend (fsdp_comm_create_backend) for host buffers",
                    fsdp_coll_name(c->kind), comm->ops->name,
                    host == c->send && has_send ? "send" : "recv", host);
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
  if (c->kind == FSDP_COLL_SHIFT && (c->root < 0 || c->root >= comm->size))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "shift: offset %d is not in 0 .. %d (the "
                      "communicator's size less one)", c->root, comm->size - 1);
  FSDP_TRY(check_placement(comm, c));
  return check_aliasing(comm, c);
}

/* ---- issue --------------------------------------------------------------- */

/* The backend's run on host copies of device buffers (host backends),
 * watched, and preceded by the desync check when on. */
static fsdp_status_t coll_run(fsdp_comm_t comm, const fsdp_coll_t *c) {
  fsdp_coll_t h;
  FSDP_TRY(fsdp_stage_in(comm, c, &h));
  fsdp_watch_begin(comm, &h);
  fsdp_status_t st = fsdp_desync_check(comm, &h);
  if (st == FSDP_SUCCESS) st = comm->ops->run(comm, &h);
  /* Before the end mark: a call failing at its deadline is still in flight
   * for the watchdog, whose report it returns. */
  if (st != FSDP_SUCCESS) st = fsdp_watch_failed(comm, st);
  fsdp_watch_end(comm, &h);
  return st == FSDP_SUCCESS ? fsdp_stage_out(comm, c, &h) : st;
}

/* A CUDA stream: the device backend queues on it; a host backend waits for
 * the stream, then runs in the caller. */
static fsdp_status_t coll_cuda(fsdp_comm_t comm, const fsdp_coll_t *c, fsdp_stream_t stream) {
  if (comm->ops->enqueue) {
    /* After the watchdog's abort: its report, as FSDP_ERR_TIMEOUT. After a
     * failure inside a stream noted since coll_issue's check (the watchdog's
     * poll aborted the communicator under this call): that first failure,
     * which names the collective that failed, then this call's own error. */
    fsdp_status_t st = comm->ops->enqueue(comm, c, fsdp_stream_cuda_handle(stream));
    if (st == FSDP_SUCCESS) return st;
    st = fsdp_watch_failed(comm, st);
    if (st == FSDP_ERR_COMM) {
      char own[512];
      snprintf(own, sizeof own, "%s", fsdp_last_error());
      const fsdp_status_t first = fsdp_watch_first_failure(comm, own);
      if (first != FSDP_SUCCESS) return first;
    }
    return st;
  }
  FSDP_TRY(fsdp_stream_synchronize(stream));
  return coll_run(comm, c);
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
  /* A collective that failed inside a stream poisons what follows. */
  FSDP_TRY(fsdp_watch_check(comm));
  /* Every rank passes the same count, so skipping an empty collective keeps
   * all ranks in step. */
  if (c->count == 0 && c->kind != FSDP_COLL_BARRIER) return FSDP_SUCCESS;
  coll_label(comm, c);
  if (!stream) return coll_run(comm, c);
  if (fsdp_stream_device(stream) == FSDP_DEVICE_CUDA)
    return coll_cuda(comm, c, stream);
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

fsdp_status_t fsdp_shift(fsdp_comm_t comm, const void *send, void *recv, size_t count,
                         fsdp_dtype_t dtype, int offset, fsdp_stream_t stream) {
  fsdp_coll_t c = {.kind = FSDP_COLL_SHIFT, .send = send, .recv = recv, .count = count,
                   .dtype = dtype, .op = FSDP_SUM, .root = offset};
  return coll_issue(comm, &c, stream);
}

fsdp_status_t fsdp_barrier(fsdp_comm_t comm, fsdp_stream_t stream) {
  fsdp_coll_t c = {.kind = FSDP_COLL_BARRIER, .dtype = FSDP_F32, .op = FSDP_SUM};
  return coll_issue(comm, &c, stream);
}
