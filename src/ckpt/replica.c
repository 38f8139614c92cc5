/* src/ckpt/replica.c — buddy replicas (fsdp/replica.h): snapshots of each
 * rank's shard in host memory, shifted to the buddy on a stream of their own,
 * and the survivors' in-memory rebuild for a new world size.
 *
 * A snapshot is one buffer: a header (magic, step, scaler, world, rank, the
 * trainer's integers), then each unit's element count on the snapshotting
 * rank, then per unit its master shard and optimizer states, each padded to
 * the shard's capacity, so that every rank's buffer has the same size and
 * one fsdp_shift moves it.
 *
 * Under HSDP (R replica groups x S ranks) the S shards of a unit exist R
 * times: old rank q holds shard q mod S, and every rank of q's replica group
 * holds the same one, bit for bit (the replica all-reduce gives them the same
 * gradient). A restore therefore needs, per shard index, one complete
 * snapshot of it: the own snapshot of any surviving holder, else a buddy's
 * copy of a lost one. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/internal.h"
#include "fsdp/replica.h"

#define SNAP_MAGIC 0x66736470736e6170ull /* "fsdpsnap" */
#define MAX_STATES 3
#define REPLICA_BUFFERS 4 /* own[2] and held[2] */

typedef struct {
  uint64_t magic;
  int64_t step, good_steps;
  double scale;
  int32_t world, rank, n_units, n_states;
  uint64_t bytes;
  fsdp_ckpt_meta_t meta;
} snap_header_t;

struct fsdp_replica {
  fsdp_engine_t eng;
  int every, n_units, n_states;
  int world, rank, offset;    /* the world the snapshots are taken in; shift distance */
  int shards;                 /* ranks a unit is sharded over there (HSDP's S; 1 NO_SHARD) */
  size_t *cap, *numel;        /* per unit: shard capacity, parameters */
  size_t *at;                 /* per unit: first float of its block in a snapshot */
  size_t head_bytes, bytes;   /* header + counts; the whole snapshot */
  unsigned char *own[2], *held[2];
  int64_t own_step[2], held_step[2];
  int in_flight;              /* the slot being sent, -1 none */
  int snapshots;              /* taken so far, and the seconds their copies took */
  double copy_s;
  int64_t in_flight_step;
  fsdp_comm_t comm;
  fsdp_stream_t stream;
  fsdp_event_t done;
};

static size_t round8(size_t n) { return (n + 7) & ~(size_t)7; }

static const snap_header_t *header_of(const unsigned char *buf) {
  return (const snap_header_t *)buf;
}

/* Per unit: where the rank's slice starts in the flat buffer, and its count. */
static uint64_t *ranges_of(unsigned char *buf) {
  return (uint64_t *)(buf + sizeof(snap_header_t));
}

static float *block_of(const fsdp_replica_t r, unsigned char *buf, int u, int state) {
  return (float *)(buf + r->head_bytes) + r->at[u] + (size_t)state * r->cap[u];
}

/* ---- connection (communicator, stream, event) ------------------------------ */

static fsdp_status_t finish(fsdp_replica_t r);
static int shard_world(fsdp_engine_t e);

/* A transfer that completed before the failure still counts; one that failed
 * is not an error here (the failure is the caller's news already). */
static void disconnect(fsdp_replica_t r) {
  if (r->in_flight >= 0) {
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", fsdp_last_error());
    if (finish(r) != FSDP_SUCCESS) fsdp_error(FSDP_ERR_COMM, "%s", saved);
  }
  fsdp_event_destroy(r->done);
  fsdp_stream_destroy(r->stream);
  fsdp_comm_destroy(r->comm);
  r->done = NULL;
  r->stream = NULL;
  r->comm = NULL;
}

/* The world of e: ranks, buddy distance, a communicator and stream of our own. */
static fsdp_status_t connect(fsdp_replica_t r, fsdp_engine_t e) {
  fsdp_world_t w = fsdp_engine_world(e);
  r->eng = e;
  r->world = fsdp_world_size(w);
  r->rank = fsdp_world_rank(w);
  r->shards = shard_world(e);
  FSDP_TRY(fsdp_comm_dup(fsdp_engine_comm(e), &r->comm));
  /* A copy its sender finished before dying must still arrive at its buddy
   * after another collective of the world failed here. */
  fsdp_status_t st = fsdp_comm_set_cancel_on_failure(r->comm, 0);
  /* The distance is the smallest node's rank count, agreed by every rank:
   * after a shrink the nodes may hold different numbers of ranks. */
  double local = -(double)fsdp_world_local_size(w), fewest;
  if (st == FSDP_SUCCESS)
    st = fsdp_all_reduce(r->comm, &local, &fewest, 1, FSDP_F64, FSDP_MAX, FSDP_HOST_STREAM);
  int least = (int)-fewest;
  r->offset = r->world == 1 ? 0 : least > 0 && least < r->world ? least : 1;
  if (st == FSDP_SUCCESS) st = fsdp_stream_create("replica", &r->stream);
  if (st == FSDP_SUCCESS) st = fsdp_event_create(&r->done);
  if (st != FSDP_SUCCESS) disconnect(r);
  return st;
}

/* ---- layout ---------------------------------------------------------------- */

static void free_buffers(fsdp_replica_t r) {
  for (int k = 0; k < 2; k++) {
    fsdp_free(r->own[k]);
    fsdp_free(r->held[k]);
    r->own[k] = r->held[k] = NULL;
    r->own_step[k] = r->held_step[k] = -1;
  }
  fsdp_free(r->cap);
  fsdp_free(r->numel);
  fsdp_free(r->at);
  r->cap = r->numel = r->at = NULL;
}

/* The ranks a unit of e is sharded over: the shard group's (HSDP's S, the
 * world without), 1 under NO_SHARD. */
static int shard_world(fsdp_engine_t e) {
  const fsdp_config_t *c = fsdp_engine_config(e);
  return c->strategy == FSDP_NO_SHARD ? 1 : c->shard_size;
}

/* The one definition of a snapshot's size: per unit the shard capacity of a
 * split over `shards` ranks (as the engine lays it out), n_states floats per
 * element, after a header and the per-unit ranges. cap and at (may be NULL)
 * receive per unit the capacity and the first float of its block. */
static fsdp_status_t snapshot_size(const size_t *numel, int n_units, int n_states, int shards,
                                   size_t align, size_t *cap, size_t *at, size_t *head_bytes,
                                   size_t *bytes) {
  size_t floats = 0;
  for (int u = 0; u < n_units; u++) {
    size_t c;
    FSDP_TRY(fsdp_shard_layout(numel[u], shards, align, 0, NULL, &c, NULL, NULL));
    if (cap) cap[u] = c;
    if (at) at[u] = floats;
    floats += c * (size_t)n_states;
  }
  *head_bytes = round8(sizeof(snap_header_t) + 2 * (size_t)n_units * sizeof(uint64_t));
  *bytes = *head_bytes + floats * sizeof(float);
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_replica_bytes(const size_t *numel, int n_units, int n_states, int shards,
                                 size_t align, size_t *snapshot, size_t *host) {
  if (!numel || n_units <= 0 || n_states < 1 || n_states > MAX_STATES || shards < 1 ||
      align == 0 || (align & (align - 1)))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_replica_bytes: needs numel of n_units "
                      "> 0 units (%d), n_states in [1, %d] (%d), shards >= 1 (%d) and a power "
                      "of two align (%zu)", n_units, MAX_STATES, n_states, shards, align);
  size_t head, bytes;
  FSDP_TRY(snapshot_size(numel, n_units, n_states, shards, align, NULL, NULL, &head, &bytes));
  if (snapshot) *snapshot = bytes;
  if (host) *host = REPLICA_BUFFERS * bytes;
  return FSDP_SUCCESS;
}

/* Sizes the snapshots for e's units and allocates the four buffers. */
static fsdp_status_t layout(fsdp_replica_t r, fsdp_engine_t e) {
  int n = fsdp_engine_num_units(e);
  if (n <= 0)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "replica: the engine has no units (create the "
                      "replica after fsdp_engine_materialize)");
  r->n_units = n;
  r->cap = fsdp_alloc((size_t)n * sizeof(size_t));
  r->numel = fsdp_alloc((size_t)n * sizeof(size_t));
  r->at = fsdp_alloc((size_t)n * sizeof(size_t));
  if (!r->cap || !r->numel || !r->at)
    return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "replica: out of memory for %d units", n);
  fsdp_shard_t s;
  FSDP_TRY(fsdp_unit_shard(e, 0, &s));
  r->n_states = 1 + (s.m != NULL) + (s.v != NULL);
  FSDP_TRY(fsdp_unit_shard_release(e, 0, 0));
  for (int u = 0; u < n; u++) {
    fsdp_unit_info_t info;
    FSDP_TRY(fsdp_unit_info(e, u, &info));
    r->numel[u] = info.numel;
  }
  const int shards = shard_world(e);
  const size_t align = fsdp_engine_config(e)->align;
  FSDP_TRY(snapshot_size(r->numel, n, r->n_states, shards, align, r->cap, r->at, &r->head_bytes,
                         &r->bytes));
  /* a joining rank and the restore compute old capacities the same way */
  for (int u = 0; u < n; u++) {
    fsdp_unit_info_t info;
    FSDP_TRY(fsdp_unit_info(e, u, &info));
    if (info.shard_numel != r->cap[u])
      return fsdp_error(FSDP_ERR_INTERNAL, "replica: unit %d ('%s') has %zu elements per rank, "
                        "not the %zu of fsdp_shard_layout over %d ranks at alignment %zu", u,
                        info.name, info.shard_numel, r->cap[u], shards, align);
  }
  for (int k = 0; k < 2; k++) {
    r->own[k] = fsdp_alloc(r->bytes);
    r->held[k] = fsdp_alloc(r->bytes);
    if (!r->own[k] || !r->held[k])
      return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "replica: cannot allocate %d snapshots of %zu "
                        "bytes", REPLICA_BUFFERS, r->bytes);
    memset(r->own[k], 0, r->bytes); /* padding is sent too: no uninitialised bytes */
    r->own_step[k] = r->held_step[k] = -1;
  }
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_replica_create(fsdp_engine_t e, int every, fsdp_replica_t *out) {
  if (!e || !out)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_replica_create: engine and out must "
                      "not be NULL");
  if (every < 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_replica_create: every is %d; pass a "
                      "number of updates >= 1 (0: the default, %d)", every,
                      FSDP_REPLICA_DEFAULT_EVERY);
  fsdp_replica_t r = fsdp_alloc(sizeof *r);
  if (!r) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "fsdp_replica_create: out of memory");
  memset(r, 0, sizeof *r);
  r->every = every ? every : FSDP_REPLICA_DEFAULT_EVERY;
  r->in_flight = -1;
  fsdp_status_t st = layout(r, e);
  if (st == FSDP_SUCCESS) st = connect(r, e);
  if (st != FSDP_SUCCESS) {
    fsdp_replica_destroy(r);
    return st;
  }
  *out = r;
  return FSDP_SUCCESS;
}

void fsdp_replica_destroy(fsdp_replica_t r) {
  if (!r) return;
  if (r->comm) disconnect(r);
  free_buffers(r);
  fsdp_free(r);
}

void fsdp_replica_disconnect(fsdp_replica_t r) {
  if (r && r->comm) disconnect(r);
}

/* ---- snapshots --------------------------------------------------------------- */

/* Ends the transfer in flight: the received buffer counts when its header is
 * the one its source must have sent. */
static fsdp_status_t finish(fsdp_replica_t r) {
  if (r->in_flight < 0) return FSDP_SUCCESS;
  int k = r->in_flight;
  r->in_flight = -1;
  FSDP_TRY(fsdp_event_synchronize(r->done));
  const snap_header_t *h = header_of(r->held[k]);
  int source = (r->rank - r->offset + r->world) % r->world;
  if (h->magic != SNAP_MAGIC || h->step != r->in_flight_step || h->rank != source ||
      h->world != r->world || h->bytes != r->bytes)
    return fsdp_error(FSDP_ERR_INTERNAL, "replica: rank %d received a snapshot from rank %d "
                      "that is not the one of step %lld (step %lld, rank %d, world %d)",
                      r->rank, source, (long long)r->in_flight_step, (long long)h->step,
                      (int)h->rank, (int)h->world);
  r->held_step[k] = h->step;
  return FSDP_SUCCESS;
}

static fsdp_status_t fill(fsdp_replica_t r, unsigned char *buf, int64_t step,
                          const fsdp_ckpt_meta_t *meta) {
  snap_header_t h = {.magic = SNAP_MAGIC, .step = step, .scale = 1.0, .world = r->world,
                     .rank = r->rank, .n_units = r->n_units, .n_states = r->n_states,
                     .bytes = r->bytes};
  if (meta) h.meta = *meta;
  if (fsdp_engine_config(r->eng)->loss_scale_init != 1.0)
    FSDP_TRY(fsdp_engine_scaler_state(r->eng, &h.scale, &h.good_steps));
  memcpy(buf, &h, sizeof h);
  uint64_t *ranges = ranges_of(buf);
  for (int u = 0; u < r->n_units; u++) {
    fsdp_shard_t s;
    FSDP_TRY(fsdp_unit_shard(r->eng, u, &s));
    const float *from[MAX_STATES] = {s.master, s.m, s.v};
    ranges[2 * u] = s.offset;
    ranges[2 * u + 1] = s.count;
    for (int k = 0; k < r->n_states; k++) {
      float *to = block_of(r, buf, u, k);
      memcpy(to, from[k], s.count * sizeof(float));
      memset(to + s.count, 0, (r->cap[u] - s.count) * sizeof(float));
    }
    FSDP_TRY(fsdp_unit_shard_release(r->eng, u, 0));
  }
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_replica_snapshot(fsdp_replica_t r, const fsdp_ckpt_meta_t *meta, int *taken) {
  if (taken) *taken = 0;
  if (!r) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_replica_snapshot: replica is NULL");
  if (!r->comm)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "fsdp_replica_snapshot: the replica was "
                      "disconnected; restore it into the new world first");
  int64_t step = fsdp_engine_step_count(r->eng);
  if (step <= 0 || step % r->every) return FSDP_SUCCESS;
  FSDP_TRY(finish(r));
  int k = (int)((step / r->every) & 1);
  r->own_step[k] = -1;
  double t0 = fsdp_time_now();
  FSDP_TRY(fill(r, r->own[k], step, meta));
  r->copy_s += fsdp_time_now() - t0;
  r->snapshots++;
  r->own_step[k] = step;
  r->held_step[k] = -1; /* being overwritten: the other one is the complete copy */
  /* in pieces of at most 2^28 floats: the MPI and Gloo backends count a
   * collective's elements in an int, and a rank's snapshot can pass 2^31 */
  const size_t total = r->bytes / sizeof(float), piece = (size_t)1 << 28;
  for (size_t at = 0; at < total; at += piece)
    FSDP_TRY(fsdp_shift(r->comm, r->own[k] + at * sizeof(float), r->held[k] + at * sizeof(float),
                        total - at < piece ? total - at : piece, FSDP_F32, r->offset, r->stream));
  FSDP_TRY(fsdp_event_record(r->done, r->stream));
  r->in_flight = k;
  r->in_flight_step = step;
  if (taken) *taken = 1;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_replica_wait(fsdp_replica_t r) {
  if (!r) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_replica_wait: replica is NULL");
  return finish(r);
}

fsdp_status_t fsdp_replica_info(fsdp_replica_t r, fsdp_replica_info_t *info) {
  if (!r || !info)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_replica_info: replica and info must "
                      "not be NULL");
  *info = (fsdp_replica_info_t){.every = r->every, .world_size = r->world, .rank = r->rank,
                                .buddy = (r->rank + r->offset) % r->world,
                                .source = (r->rank - r->offset + r->world) % r->world,
                                .snapshot_bytes = r->bytes,
                                .host_bytes = REPLICA_BUFFERS * r->bytes,
                                .snapshots = r->snapshots, .copy_s = r->copy_s};
  for (int k = 0; k < 2; k++) {
    info->own_step[k] = r->own_step[k];
    info->held_step[k] = r->held_step[k];
  }
  return FSDP_SUCCESS;
}

static int slot_of(const int64_t steps[2], int64_t step) {
  return step < 0 ? -1 : steps[0] == step ? 0 : steps[1] == step ? 1 : -1;
}

fsdp_status_t fsdp_replica_view(fsdp_replica_t r, int held, int64_t step, int unit, int state,
                                const float **data, size_t *count) {
  if (!r || !data || !count)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_replica_view: replica, data and count "
                      "must not be NULL");
  int k = slot_of(held ? r->held_step : r->own_step, step);
  if (k < 0 || unit < 0 || unit >= r->n_units || state < 0 || state >= r->n_states)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_replica_view: no %s snapshot of step "
                      "%lld, unit %d, state %d on rank %d (it has steps %lld and %lld, %d "
                      "units, %d states)", held ? "held" : "own", (long long)step, unit, state,
                      r->rank, (long long)(held ? r->held_step : r->own_step)[0],
                      (long long)(held ? r->held_step : r->own_step)[1], r->n_units,
                      r->n_states);
  *data = block_of(r, held ? r->held[k] : r->own[k], unit, state);
  *count = r->cap[unit];
  return FSDP_SUCCESS;
}

/* ---- the survivors' rebuild -------------------------------------------------- */

/* What each rank of the new world tells the others, as int64s. */
typedef struct {
  int64_t world, rank, offset, n_units, shards;
  int64_t own[2], held[2];
} survivor_t;

/* Where a snapshot of step s of shard j (the shard old ranks j, j + S, ...
 * held) is: the new rank holding it, *held whether as a buddy's copy; -1
 * when nowhere. A surviving holder's own snapshot first, so that HSDP's
 * replicas serve before any buddy copy is needed. */
static int holder(const survivor_t *all, const survivor_t *ref, const int *by_old, int j,
                  int64_t s, int *held) {
  const int n = (int)ref->world, S = (int)ref->shards, off = (int)ref->offset;
  *held = 0;
  for (int q = j; q < n; q += S)
    if (by_old[q] >= 0 && slot_of(all[by_old[q]].own, s) >= 0) return by_old[q];
  *held = 1;
  for (int q = j; q < n; q += S) {
    int b = by_old[(q + off) % n];
    if (b >= 0 && slot_of(all[b].held, s) >= 0) return b;
  }
  return -1;
}

/* "1, 3" */
static void ranks_of_shard(const survivor_t *ref, int j, char *buf, size_t size) {
  size_t used = 0;
  buf[0] = '\0';
  for (int q = j; q < (int)ref->world && used < size; q += (int)ref->shards)
    used += (size_t)snprintf(buf + used, size - used, "%s%d", q == j ? "" : ", ", q);
}

/* Why step s cannot be restored: the first shard without a copy. */
static fsdp_status_t no_copy(const survivor_t *all, const survivor_t *ref, const int *by_old,
                             int64_t s) {
  int n = (int)ref->world, off = (int)ref->offset, S = (int)ref->shards;
  if (s < 0)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "replica: the old world of %d ranks took no "
                      "snapshot before the loss (the first comes after `every` updates); "
                      "resume from the last checkpoint on disk instead", n);
  for (int j = 0; j < S; j++) {
    int held;
    if (holder(all, ref, by_old, j, s, &held) >= 0) continue;
    if (S < n) { /* HSDP: every holder of shard j and their buddies */
      char ranks[256];
      ranks_of_shard(ref, j, ranks, sizeof ranks);
      return fsdp_error(FSDP_ERR_INVALID_USAGE, "replica: no complete snapshot of step %lld "
                        "of shard %d of %d (held by old ranks %s, and copied to each one's "
                        "buddy, %d rank%s on) is left in memory: those ranks were lost or hold "
                        "other steps; resume from the last checkpoint on disk instead",
                        (long long)s, j, S, ranks, off, off == 1 ? "" : "s");
    }
    int q = j, b = (q + off) % n;
    if (by_old[q] >= 0)
      return fsdp_error(FSDP_ERR_INVALID_USAGE, "replica: surviving rank %d (old numbering) "
                        "holds no snapshot of step %lld; resume from the last checkpoint on "
                        "disk instead", q, (long long)s);
    if (by_old[b] < 0)
      return fsdp_error(FSDP_ERR_INVALID_USAGE, "replica: rank %d was lost and so was its "
                        "buddy, rank %d: no complete copy of rank %d's shard is left in "
                        "memory; resume from the last checkpoint on disk instead", q, b, q);
    const survivor_t *h = &all[by_old[b]];
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "replica: rank %d was lost and its buddy, rank "
                      "%d, holds no complete snapshot of step %lld of it (it holds steps %lld "
                      "and %lld); resume from the last checkpoint on disk instead", q, b,
                      (long long)s, (long long)h->held[0], (long long)h->held[1]);
  }
  return FSDP_SUCCESS;
}

/* The newest step every shard has a complete snapshot of (survivors' own
 * copies, buddies' copies of lost ranks), or an error naming why not. ref is
 * a survivor; joining ranks (world 0) hold nothing. */
static fsdp_status_t agree(const survivor_t *all, const survivor_t *ref, int m, int *by_old,
                           int64_t *step) {
  int n = (int)ref->world;
  for (int q = 0; q < n; q++) by_old[q] = -1;
  for (int i = 0; i < m; i++) {
    const survivor_t *a = &all[i];
    if (a->world == 0) continue;
    if (a->world != n || a->offset != ref->offset || a->n_units != ref->n_units ||
        a->shards != ref->shards || a->rank < 0 || a->rank >= n || by_old[a->rank] >= 0)
      return fsdp_error(FSDP_ERR_INVALID_USAGE, "replica: new rank %d's replica (old rank "
                        "%lld of %lld) does not fit new rank 0's (of %d ranks) or repeats an "
                        "old rank: every survivor must restore the replica it kept", i,
                        (long long)a->rank, (long long)a->world, n);
    by_old[a->rank] = i;
  }
  if (ref->shards < 1 || n % ref->shards)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "replica: the old world of %d ranks was sharded "
                      "over groups of %lld ranks, which does not divide it", n,
                      (long long)ref->shards);
  /* the candidates, newest first: every step any survivor holds */
  int64_t newest = -1;
  for (int64_t below = INT64_MAX;;) {
    int64_t c = -1;
    for (int i = 0; i < m; i++)
      for (int k = 0; k < 2; k++) {
        int64_t s[2] = {all[i].own[k], all[i].held[k]};
        for (int x = 0; x < 2; x++)
          if (s[x] < below && s[x] > c) c = s[x];
      }
    if (c < 0) break;
    if (newest < 0) newest = c;
    int ok = 1, held;
    for (int j = 0; j < (int)ref->shards && ok; j++)
      ok = holder(all, ref, by_old, j, c, &held) >= 0;
    if (ok) return *step = c, FSDP_SUCCESS;
    below = c;
  }
  return no_copy(all, ref, by_old, newest);
}

/* Old rank q's slice of unit u, sent by the new rank holding it to all, and
 * its overlap with this rank's new slice written into the engine's shard. */
static fsdp_status_t move_slice(fsdp_replica_t r, fsdp_comm_t comm, int root, const void *snap,
                                int u, size_t cap, float *buf, const fsdp_shard_t *to) {
  size_t n = cap * (size_t)r->n_states;
  if (snap) {
    memcpy(buf, ranges_of((unsigned char *)snap) + 2 * u, 2 * sizeof(uint64_t));
    memcpy(buf + 4, block_of(r, (unsigned char *)snap, u, 0), n * sizeof(float));
  }
  FSDP_TRY(fsdp_broadcast(comm, buf, n + 4, FSDP_F32, root, FSDP_HOST_STREAM));
  uint64_t range[2];
  memcpy(range, buf, sizeof range);
  size_t a = range[0] > to->offset ? range[0] : to->offset;
  size_t b = range[0] + range[1] < to->offset + to->count ? range[0] + range[1]
                                                         : to->offset + to->count;
  float *dst[MAX_STATES] = {to->master, to->m, to->v};
  for (int k = 0; a < b && k < r->n_states; k++)
    memcpy(dst[k] + (a - to->offset), buf + 4 + (size_t)k * cap + (a - range[0]),
           (b - a) * sizeof(float));
  return FSDP_SUCCESS;
}

static fsdp_status_t check_units(fsdp_replica_t r, fsdp_engine_t e) {
  if (fsdp_engine_num_units(e) != r->n_units)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "fsdp_replica_restore: the engine has %d units, "
                      "the snapshots %d: build the same model", fsdp_engine_num_units(e),
                      r->n_units);
  for (int u = 0; u < r->n_units; u++) {
    fsdp_unit_info_t info;
    fsdp_shard_t s;
    FSDP_TRY(fsdp_unit_info(e, u, &info));
    if (info.numel != r->numel[u])
      return fsdp_error(FSDP_ERR_INVALID_USAGE, "fsdp_replica_restore: unit %d ('%s') has %zu "
                        "parameters, the snapshots %zu", u, info.name, info.numel, r->numel[u]);
    FSDP_TRY(fsdp_unit_shard(e, u, &s));
    int states = 1 + (s.m != NULL) + (s.v != NULL);
    FSDP_TRY(fsdp_unit_shard_release(e, u, 0));
    if (states != r->n_states)
      return fsdp_error(FSDP_ERR_INVALID_USAGE, "fsdp_replica_restore: the engine's optimizer "
                        "keeps %d states, the snapshots %d", states - 1, r->n_states - 1);
  }
  return FSDP_SUCCESS;
}

/* Unit u's shard capacity in the old world, sharded over `shards` ranks (a
 * joining rank has no snapshot to read it from); a survivor checks it
 * against its own. */
static fsdp_status_t old_capacity(fsdp_replica_t r, fsdp_engine_t e, int u, int shards,
                                  size_t *cap) {
  fsdp_unit_info_t info;
  FSDP_TRY(fsdp_unit_info(e, u, &info));
  FSDP_TRY(fsdp_shard_layout(info.numel, shards, fsdp_engine_config(e)->align, 0, NULL, cap,
                             NULL, NULL));
  if (r->world > 0 && *cap != r->cap[u])
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "fsdp_replica_restore: unit %d ('%s') had %zu "
                      "elements per rank, not the %zu of a split over %d ranks at alignment "
                      "%zu: keep config.align as it was", u, info.name, r->cap[u], *cap, shards,
                      fsdp_engine_config(e)->align);
  return FSDP_SUCCESS;
}

/* The buffer of step `step` a holder sends: its own or its buddy copy. */
static const unsigned char *snapshot_of(fsdp_replica_t r, int held, int64_t step) {
  return held ? r->held[slot_of(r->held_step, step)] : r->own[slot_of(r->own_step, step)];
}

static fsdp_status_t move_all(fsdp_replica_t r, fsdp_engine_t e, const survivor_t *all,
                              const survivor_t *ref, const int *by_old, int64_t step) {
  fsdp_comm_t comm = fsdp_engine_comm(e);
  int me = fsdp_comm_rank(comm), shards = (int)ref->shards;
  size_t most = 0, cap;
  for (int u = 0; u < r->n_units; u++) {
    FSDP_TRY(old_capacity(r, e, u, shards, &cap));
    if (cap > most) most = cap;
  }
  float *buf = fsdp_alloc((most * (size_t)r->n_states + 4) * sizeof(float));
  if (!buf) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "fsdp_replica_restore: out of memory");
  fsdp_status_t st = FSDP_SUCCESS;
  for (int u = 0; u < r->n_units && !st; u++) {
    fsdp_shard_t s;
    if ((st = old_capacity(r, e, u, shards, &cap)) || (st = fsdp_unit_shard(e, u, &s))) break;
    for (int j = 0; j < shards && !st; j++) {
      int held, root = holder(all, ref, by_old, j, step, &held);
      st = move_slice(r, comm, root, root == me ? snapshot_of(r, held, step) : NULL, u, cap, buf,
                      &s);
    }
    fsdp_status_t rs = fsdp_unit_shard_release(e, u, st == FSDP_SUCCESS);
    if (!st) st = rs;
  }
  fsdp_free(buf);
  return st;
}

/* The snapshot's scaler state and trainer integers, from the holder of shard
 * 0 (every snapshot of a step carries them; a joining rank has none). */
typedef struct {
  double scale;
  int64_t good_steps;
  fsdp_ckpt_meta_t meta;
} restored_t;
_Static_assert(sizeof(restored_t) % sizeof(float) == 0, "moved as f32 elements");

static fsdp_status_t share_header(fsdp_replica_t r, fsdp_comm_t comm, const survivor_t *all,
                                  const survivor_t *ref, const int *by_old, int64_t step,
                                  restored_t *out) {
  int held, root = holder(all, ref, by_old, 0, step, &held);
  memset(out, 0, sizeof *out);
  if (fsdp_comm_rank(comm) == root) {
    const snap_header_t *h = header_of(snapshot_of(r, held, step));
    *out = (restored_t){h->scale, h->good_steps, h->meta};
  }
  return fsdp_broadcast(comm, out, sizeof *out / sizeof(float), FSDP_F32, root, FSDP_HOST_STREAM);
}

/* The restore proper, on every rank of the new world (survivors and joining
 * ranks alike: r->world 0 for the latter). */
static fsdp_status_t restore(fsdp_replica_t r, fsdp_engine_t e, fsdp_ckpt_meta_t *meta,
                             int64_t *step_out) {
  fsdp_comm_t comm = fsdp_engine_comm(e);
  int m = fsdp_comm_size(comm), first = -1;
  survivor_t mine = {r->world, r->rank, r->offset, r->n_units, r->shards,
                     {r->own_step[0], r->own_step[1]}, {r->held_step[0], r->held_step[1]}};
  survivor_t *all = fsdp_alloc((size_t)m * sizeof *all);
  if (!all) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "fsdp_replica_restore: out of memory");
  fsdp_status_t st = fsdp_all_gather(comm, &mine, all, sizeof mine / sizeof(double), FSDP_F64,
                                     FSDP_HOST_STREAM);
  for (int i = 0; !st && i < m && first < 0; i++)
    if (all[i].world > 0) first = i;
  int *by_old = first >= 0 ? fsdp_alloc((size_t)all[first].world * sizeof *by_old) : NULL;
  if (!st && first < 0)
    st = fsdp_error(FSDP_ERR_INVALID_USAGE, "replica: no rank of the new world holds "
                    "snapshots; resume from the last checkpoint on disk instead");
  else if (!st && !by_old)
    st = fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "fsdp_replica_restore: out of memory");
  int64_t step = -1;
  restored_t h;
  if (!st) st = check_units(r, e); /* the same model on every rank: the same verdict */
  if (!st) st = agree(all, &all[first], m, by_old, &step);
  if (!st) st = move_all(r, e, all, &all[first], by_old, step);
  if (!st) st = share_header(r, comm, all, &all[first], by_old, step, &h);
  if (!st) st = fsdp_engine_set_step(e, step);
  if (!st && fsdp_engine_config(e)->loss_scale_init != 1.0)
    st = fsdp_engine_set_scaler_state(e, h.scale, h.good_steps);
  if (!st && meta) *meta = h.meta;
  if (!st && step_out) *step_out = step;
  fsdp_free(all);
  fsdp_free(by_old);
  if (st) return st;
  free_buffers(r); /* the old world's snapshots; the new world's start now */
  st = layout(r, e);
  return st ? st : connect(r, e);
}

fsdp_status_t fsdp_replica_restore(fsdp_replica_t r, fsdp_engine_t e, fsdp_ckpt_meta_t *meta,
                                   int64_t *step_out) {
  if (!r || !e)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_replica_restore: replica and engine "
                      "must not be NULL");
  if (r->comm) disconnect(r);
  return restore(r, e, meta, step_out);
}

fsdp_status_t fsdp_replica_join(fsdp_engine_t e, int every, fsdp_replica_t *out,
                                fsdp_ckpt_meta_t *meta, int64_t *step) {
  if (!e || !out || every < 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_replica_join: engine and out must not "
                      "be NULL, every >= 0 (it is %d)", every);
  fsdp_replica_t r = fsdp_alloc(sizeof *r);
  if (!r) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "fsdp_replica_join: out of memory");
  memset(r, 0, sizeof *r);
  r->every = every ? every : FSDP_REPLICA_DEFAULT_EVERY;
  r->in_flight = -1;
  r->rank = -1; /* world 0: a joining rank, holding nothing */
  fsdp_status_t st = layout(r, e);
  if (st == FSDP_SUCCESS) st = restore(r, e, meta, step);
  if (st != FSDP_SUCCESS) {
    fsdp_replica_destroy(r);
    return st;
  }
  *out = r;
  return FSDP_SUCCESS;
}
