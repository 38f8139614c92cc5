/* src/comm/comm_watch.c — per-world communicator bookkeeping and the
 * watchdog.
 *
 * Every communicator of a world joins the world's watch, which gives it the
 * world's next communicator id (creation is collective, so ids agree across
 * ranks) and holds backend state they share. With more than one rank a
 * watchdog thread wakes every tick (a tenth of the timeout, 50 ms to 1 s), and
 *  - publishes, under env://, this rank's progress on every communicator to
 *    the store (key "watch/<rank>", "id:issued:started:completed;..."), so a
 *    rank whose collective expires can tell which peers never arrived;
 *  - asks device backends (nccl) which collectives they queued on CUDA
 *    streams have completed (ops->poll), so those are watched as well;
 *  - finds a collective in flight for longer than the world's timeout, prints
 *    what it was (operation, sequence number, tag), which ranks never issued
 *    or started it, and aborts every communicator of the world: gloo makes
 *    every blocked and later call fail, which the caller sees as
 *    FSDP_ERR_TIMEOUT with this message; nccl calls ncclCommAbort; MPI cannot
 *    interrupt a call, so in an MPI world the job ends with MPI_Abort. The
 *    watchdog fires once per world.
 * Without waiting for a deadline, the first collective of a host backend to
 * fail on the transport (a peer died or cancelled) cancels the world's other
 * communicators on this rank (fsdp_watch_failed): otherwise a peer waiting
 * for this rank in one of them, and this rank's own streams blocked there,
 * would wait for the deadline, since this rank cannot destroy them (and so
 * close their connections) before its blocked streams return. A rank whose
 * collective waits on nothing that failed (Gloo does not fail a send still
 * queued to a peer that died) learns of the loss from fsdp-run instead: in an
 * elastic world the watchdog peeks at the control pipe every tick, and a
 * smaller world announced there cancels the same communicators. */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_internal.h"
#include "core/internal.h"
#include "world/world_internal.h"

#define WATCH_MSG_MAX 1024
#define WATCH_REPORT_S 5.0 /* what the store queries of a report may take */

struct fsdp_comm_watch {
  fsdp_world_t world;
  int rank, size;
  double timeout_s, tick_s;
  pthread_mutex_t mu; /* guards comms, stopping */
  pthread_cond_t cv;
  pthread_t thread;
  int has_thread, stopping;
  fsdp_comm_t *comms;
  int n_comms, cap_comms;
  void *shared;
  void (*shared_free)(void *);
  atomic_int aborted;            /* set once abort_msg is final */
  char abort_msg[WATCH_MSG_MAX];
  pthread_mutex_t fail_mu;       /* guards fail_msg */
  char fail_msg[WATCH_MSG_MAX];  /* the first collective that failed inside a stream, or "" */
  int cancelled;                 /* mu: the device communicators were cancelled after it */
  int host_cancelled;            /* mu: the host ones were, after cancel_msg */
  char cancel_msg[WATCH_MSG_MAX];
  int control_fd;                /* fsdp-run's control pipe (elastic), or -1 */
};

/* ---- progress ------------------------------------------------------------ */

/* One communicator's counters, read consistently. */
typedef struct {
  fsdp_comm_t comm; /* alive: nobody destroys a communicator with work in flight */
  int id;
  uint64_t issued;
  fsdp_comm_progress_t p;
} snapshot_t;

static snapshot_t snapshot(fsdp_comm_t c) {
  snapshot_t s;
  pthread_mutex_lock(&c->mu);
  s.comm = c;
  s.id = c->id;
  s.issued = c->issued;
  s.p = c->progress;
  pthread_mutex_unlock(&c->mu);
  return s;
}

/* "id:issued:started:completed;" for every communicator; the caller holds mu. */
static void progress_text(struct fsdp_comm_watch *w, char *buf, size_t n) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < w->n_comms && used < n; i++) {
    snapshot_t s = snapshot(w->comms[i]);
    int k = snprintf(buf + used, n - used, "%d:%" PRIu64 ":%" PRIu64 ":%" PRIu64 ";", s.id,
                     s.issued, s.p.started, s.p.completed);
    used += k > 0 ? (size_t)k : 0;
  }
}

/* Finds comm id's entry in a peer's progress text. 1 when found. */
static int parse_progress(const char *text, int id, uint64_t *issued, uint64_t *started) {
  for (const char *p = text; p && *p; p = strchr(p, ';'), p = p ? p + 1 : NULL) {
    int cid;
    uint64_t i, s, d;
    if (sscanf(p, "%d:%" SCNu64 ":%" SCNu64 ":%" SCNu64, &cid, &i, &s, &d) == 4 && cid == id) {
      *issued = i;
      *started = s;
      return 1;
    }
  }
  return 0;
}

/* ---- the report ---------------------------------------------------------- */

typedef struct {
  int *never, *queued, *inside, *unknown;
  int n_never, n_queued, n_inside, n_unknown;
} arrivals_t;

/* Sorts every other rank of comm's group (world ranks) by how far it got
 * with collective seq on comm id, from what the peers published to the
 * store. Ranks outside a split's group hold another group under that id. */
static void classify(struct fsdp_comm_watch *w, fsdp_store_t *store, fsdp_comm_t comm, int id,
                     uint64_t seq, arrivals_t *a) {
  for (int i = 0; i < comm->size; i++) {
    int r = fsdp_comm_world_rank(comm, i);
    if (r == w->rank) continue;
    char key[32], *text = NULL;
    uint64_t issued = 0, started = 0;
    snprintf(key, sizeof key, "watch/%d", r);
    int known = fsdp_store_get(store, key, 0, &text, NULL) == FSDP_SUCCESS &&
                parse_progress(text, id, &issued, &started);
    fsdp_free(text);
    if (!known) a->unknown[a->n_unknown++] = r;
    else if (issued < seq) a->never[a->n_never++] = r;
    else if (started < seq) a->queued[a->n_queued++] = r;
    else a->inside[a->n_inside++] = r;
  }
}

/* Appends "; <ranks> <verb>" with the verb for one rank or for several. */
static size_t append_ranks(char *buf, size_t used, size_t n, const int *r, int count,
                           const char *one, const char *many) {
  if (!count || used >= n) return used;
  char list[256];
  fsdp_format_ranks(list, sizeof list, r, count);
  int k = snprintf(buf + used, n - used, "; %s %s %s", count == 1 ? "rank" : "ranks", list,
                   count == 1 ? one : many);
  return used + (k > 0 ? (size_t)k : 0);
}

/* "; rank 1 never issued it; ranks 2-3 are in it too" from the store. */
static void arrivals_text(struct fsdp_comm_watch *w, fsdp_store_t *store, fsdp_comm_t comm,
                          int id, uint64_t seq, char *buf, size_t n) {
  int *all = calloc((size_t)(4 * w->size), sizeof *all);
  if (!store || !all) {
    snprintf(buf, n, "; which ranks never arrived is unknown (%s)",
             store ? "out of memory" : "only an env:// world has a store to ask");
    free(all);
    return;
  }
  arrivals_t a = {all, all + w->size, all + 2 * w->size, all + 3 * w->size, 0, 0, 0, 0};
  classify(w, store, comm, id, seq, &a);
  size_t used = 0;
  buf[0] = '\0';
  used = append_ranks(buf, used, n, a.never, a.n_never, "never issued it", "never issued it");
  used = append_ranks(buf, used, n, a.queued, a.n_queued,
                      "issued it but its stream has not started it (blocked behind earlier work)",
                      "issued it but their streams have not started it (blocked behind earlier "
                      "work)");
  used = append_ranks(buf, used, n, a.inside, a.n_inside, "is in it too", "are in it too");
  append_ranks(buf, used, n, a.unknown, a.n_unknown,
               "published no progress (dead, or its watchdog cannot reach the store)",
               "published no progress (dead, or their watchdogs cannot reach the store)");
  free(all);
}

/* Polls the device backends (ops->poll); once one of them reported a
 * failure inside a stream, cancels them all (ops->cancel): the peers waiting
 * for this rank in any of its device communicators are released. The caller
 * holds mu. */
static void poll_devices(struct fsdp_comm_watch *w) {
  for (int i = 0; i < w->n_comms; i++)
    if (w->comms[i]->ready && w->comms[i]->ops->poll) w->comms[i]->ops->poll(w->comms[i]);
  if (w->cancelled) return;
  pthread_mutex_lock(&w->fail_mu);
  w->cancelled = w->fail_msg[0] != '\0';
  pthread_mutex_unlock(&w->fail_mu);
  if (!w->cancelled) return;
  for (int i = 0; i < w->n_comms; i++)
    if (w->comms[i]->ready && w->comms[i]->ops->enqueue && w->comms[i]->ops->cancel)
      w->comms[i]->ops->cancel(w->comms[i]);
}

/* Prints why, keeps it for the failing calls, and aborts every communicator. */
static void fire(struct fsdp_comm_watch *w, fsdp_store_t *store, const snapshot_t *s) {
  char what[256], who[600], group[FSDP_COMM_LABEL_MAX + 4];
  fsdp_coll_describe(&s->p.coll, what, sizeof what);
  fsdp_comm_label_text(s->comm, group, sizeof group);
  arrivals_text(w, store, s->comm, s->id, s->p.coll.seq, who, sizeof who);
  int mpi = fsdp_world_kind(w->world) == FSDP_WORLD_MPI;
  snprintf(w->abort_msg, sizeof w->abort_msg, "watchdog: %s on communicator %d%s did not "
           "complete within the %g s timeout (FSDP_TIMEOUT_S) on rank %d%s; %s", what, s->id,
           group, w->timeout_s, w->rank, who,
           mpi ? "aborting the job (MPI_Abort)" : "aborting the communicators");
  fsdp_log(FSDP_LOG_ERROR, "%s", w->abort_msg);
  fflush(stderr);
  fsdp_world_mark_failed(w->world);
  pthread_mutex_lock(&w->mu);
  atomic_store(&w->aborted, 1);
  pthread_cond_broadcast(&w->cv); /* calls waiting in fsdp_watch_failed */
  for (int i = 0; i < w->n_comms; i++) { /* once set up */
    fsdp_comm_t c = w->comms[i];
    if (c->ops->abort && c->ready) c->ops->abort(c);
  }
  pthread_mutex_unlock(&w->mu);
}

/* ---- cancelling ---------------------------------------------------------- */

/* The first transport failure of a host collective on this rank, or
 * fsdp-run's word of a loss (why): cancels the host communicators of the
 * world but the exempt ones. */
static void cancel_hosts(struct fsdp_comm_watch *w, const char *why) {
  pthread_mutex_lock(&w->mu);
  if (!w->host_cancelled) {
    w->host_cancelled = 1;
    snprintf(w->cancel_msg, sizeof w->cancel_msg, "%s", why);
    for (int i = 0; i < w->n_comms; i++) {
      fsdp_comm_t c = w->comms[i];
      if (c->ready && c->ops->cancel && !c->ops->enqueue && !c->keep_on_failure)
        c->ops->cancel(c);
    }
  }
  pthread_mutex_unlock(&w->mu);
}

/* A cancel aborts one wait of each buffer of the collective running (gloo),
 * which may wait on it again: every tick, the cancelled host communicators
 * with a collective in flight are cancelled anew. The caller holds mu. */
static void recancel(struct fsdp_comm_watch *w) {
  if (!w->host_cancelled) return;
  for (int i = 0; i < w->n_comms; i++) {
    fsdp_comm_t c = w->comms[i];
    if (!c->ready || !c->ops->cancel || c->ops->enqueue || c->keep_on_failure) continue;
    snapshot_t s = snapshot(c);
    if (s.p.started > s.p.completed) c->ops->cancel(c);
  }
}

/* Once fsdp-run announced a smaller world (a rank was lost), this world is
 * over: its collectives are cancelled, whether or not they failed here. */
static void heed_loss(struct fsdp_comm_watch *w) {
  int generation, size;
  pthread_mutex_lock(&w->mu);
  int done = w->host_cancelled;
  pthread_mutex_unlock(&w->mu);
  if (done || !fsdp_world_loss_announced(w->control_fd, w->size, &generation, &size)) return;
  char why[256];
  snprintf(why, sizeof why, "fsdp-run announced world %d of %d ranks after a loss (this world "
           "has %d): this world's collectives are cancelled", generation, size, w->size);
  fsdp_world_mark_failed(w->world);
  cancel_hosts(w, why);
}

/* ---- the thread ---------------------------------------------------------- */

/* The first collective in flight past the deadline; the caller holds mu. */
static int find_expired(struct fsdp_comm_watch *w, snapshot_t *out) {
  double now = fsdp_time_now();
  for (int i = 0; i < w->n_comms; i++) {
    snapshot_t s = snapshot(w->comms[i]);
    if (s.p.started > s.p.completed && now - s.p.t_start > w->timeout_s) {
      *out = s;
      return 1;
    }
  }
  return 0;
}

static void tick_wait(struct fsdp_comm_watch *w) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  double t = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + w->tick_s;
  ts.tv_sec = (time_t)t;
  ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
  pthread_cond_timedwait(&w->cv, &w->mu, &ts);
}

static fsdp_store_t *open_store(struct fsdp_comm_watch *w) {
  fsdp_store_t *store = NULL;
  if (fsdp_world_kind(w->world) != FSDP_WORLD_ENV) return NULL;
  if (fsdp_world_store_open(w->world, &store) != FSDP_SUCCESS)
    fsdp_log(FSDP_LOG_WARN, "watchdog: cannot reach the store (%s); a timeout will not be "
             "able to name the ranks that never arrived", fsdp_last_error());
  return store;
}

static void *watch_main(void *arg) {
  struct fsdp_comm_watch *w = arg;
  fsdp_store_t *store = open_store(w);
  char text[2048], published[2048] = "", key[32];
  snprintf(key, sizeof key, "watch/%d", w->rank);
  snapshot_t expired;
  int fired = 0;
  pthread_mutex_lock(&w->mu);
  while (!w->stopping && !fired) {
    poll_devices(w);
    recancel(w);
    fired = find_expired(w, &expired);
    progress_text(w, text, sizeof text);
    pthread_mutex_unlock(&w->mu);
    if (store && strcmp(text, published) != 0 &&
        fsdp_store_set(store, key, text, strlen(text)) == FSDP_SUCCESS)
      memcpy(published, text, sizeof text);
    if (fired) fire(w, store, &expired);
    else heed_loss(w);
    pthread_mutex_lock(&w->mu);
    if (!w->stopping && !fired) tick_wait(w);
  }
  pthread_mutex_unlock(&w->mu);
  fsdp_store_close(store);
  return NULL;
}

/* ---- lifetime ------------------------------------------------------------ */

static fsdp_status_t watch_start(struct fsdp_comm_watch *w) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  int rc = pthread_cond_init(&w->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (rc == 0) rc = pthread_mutex_init(&w->mu, NULL);
  if (rc == 0) rc = pthread_mutex_init(&w->fail_mu, NULL);
  if (rc == 0 && w->size > 1) {
    rc = pthread_create(&w->thread, NULL, watch_main, w);
    w->has_thread = rc == 0;
    if (rc == 0) pthread_setname_np(w->thread, "fsdp-watchdog");
  }
  if (rc)
    return fsdp_error(FSDP_ERR_SYSTEM, "comm: cannot start the watchdog thread: %s",
                      strerror(rc));
  return FSDP_SUCCESS;
}

static fsdp_status_t watch_create(fsdp_world_t world, struct fsdp_comm_watch **out) {
  struct fsdp_comm_watch *w = calloc(1, sizeof *w);
  if (!w) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "comm: cannot allocate the watchdog");
  w->world = world;
  w->rank = fsdp_world_rank(world);
  w->size = fsdp_world_size(world);
  w->timeout_s = fsdp_world_timeout(world);
  w->control_fd = fsdp_world_kind(world) == FSDP_WORLD_ENV ? fsdp_world_control_fd() : -1;
  /* Ticks of a tenth of the timeout, within [50 ms, 1 s]: timeouts fire at most
   * 10% late, and the store sees at most one progress write per second. */
  w->tick_s = w->timeout_s / 10 < 0.05 ? 0.05 : w->timeout_s / 10 > 1.0 ? 1.0 : w->timeout_s / 10;
  fsdp_status_t st = watch_start(w);
  if (st != FSDP_SUCCESS) {
    free(w);
    return st;
  }
  *out = w;
  return FSDP_SUCCESS;
}

static void watch_destroy(struct fsdp_comm_watch *w) {
  pthread_mutex_lock(&w->mu);
  w->stopping = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  if (w->has_thread) pthread_join(w->thread, NULL);
  if (w->shared_free) w->shared_free(w->shared);
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
  pthread_mutex_destroy(&w->fail_mu);
  free(w->comms);
  free(w);
}

fsdp_status_t fsdp_watch_attach(fsdp_world_t world, fsdp_comm_t c) {
  struct fsdp_comm_watch *w = fsdp_world_comm_state(world);
  if (!w) {
    FSDP_TRY(watch_create(world, &w));
    fsdp_world_set_comm_state(world, w);
  }
  pthread_mutex_lock(&w->mu);
  if (w->n_comms == w->cap_comms) {
    int cap = w->cap_comms ? 2 * w->cap_comms : 8;
    fsdp_comm_t *grown = realloc(w->comms, (size_t)cap * sizeof *grown);
    if (!grown) {
      pthread_mutex_unlock(&w->mu);
      if (w->n_comms == 0) {
        fsdp_world_set_comm_state(world, NULL);
        watch_destroy(w);
      }
      return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "comm: cannot register a communicator");
    }
    w->comms = grown;
    w->cap_comms = cap;
  }
  w->comms[w->n_comms++] = c;
  c->id = fsdp_world_next_comm_id(world);
  c->watch = w;
  pthread_mutex_unlock(&w->mu);
  return FSDP_SUCCESS;
}

void fsdp_watch_detach(fsdp_comm_t c) {
  struct fsdp_comm_watch *w = c->watch;
  if (!w) return;
  pthread_mutex_lock(&w->mu);
  for (int i = 0; i < w->n_comms; i++)
    if (w->comms[i] == c) w->comms[i] = w->comms[--w->n_comms];
  int last = w->n_comms == 0;
  pthread_mutex_unlock(&w->mu);
  c->watch = NULL;
  if (!last) return;
  fsdp_world_set_comm_state(w->world, NULL);
  watch_destroy(w);
}

void fsdp_watch_set_ready(fsdp_comm_t c, int on) {
  struct fsdp_comm_watch *w = c->watch;
  if (!w) return;
  pthread_mutex_lock(&w->mu);
  c->ready = on;
  pthread_mutex_unlock(&w->mu);
}

void fsdp_watch_set_keep(fsdp_comm_t c, int keep) {
  struct fsdp_comm_watch *w = c->watch;
  if (!w) return;
  pthread_mutex_lock(&w->mu);
  c->keep_on_failure = keep;
  pthread_mutex_unlock(&w->mu);
}

/* ---- per collective ------------------------------------------------------ */

void fsdp_watch_begin(fsdp_comm_t c, const fsdp_coll_t *coll) {
  pthread_mutex_lock(&c->mu);
  c->progress.started = coll->seq;
  c->progress.t_start = fsdp_time_now();
  c->progress.coll = *coll;
  pthread_mutex_unlock(&c->mu);
}

void fsdp_watch_end(fsdp_comm_t c, const fsdp_coll_t *coll) {
  pthread_mutex_lock(&c->mu);
  c->progress.completed = coll->seq;
  pthread_mutex_unlock(&c->mu);
}

/* 1 when comm's collective in flight has passed its deadline. */
static int overdue(struct fsdp_comm_watch *w, fsdp_comm_t c) {
  snapshot_t s = snapshot(c);
  return s.p.started > s.p.completed && fsdp_time_now() - s.p.t_start >= w->timeout_s;
}

int fsdp_watch_cancelled(fsdp_comm_t c, char *buf, size_t n) {
  struct fsdp_comm_watch *w = c->watch;
  if (!w) return 0;
  pthread_mutex_lock(&w->mu);
  int cancelled = w->host_cancelled && !c->keep_on_failure;
  if (cancelled) snprintf(buf, n, "%s", w->cancel_msg);
  pthread_mutex_unlock(&w->mu);
  return cancelled;
}

fsdp_status_t fsdp_watch_failed(fsdp_comm_t c, fsdp_status_t st) {
  struct fsdp_comm_watch *w = c->watch;
  fsdp_world_mark_failed(c->world);
  if (!w) return st;
  if (st == FSDP_ERR_COMM && !c->ops->enqueue) {
    char why[WATCH_MSG_MAX];
    snprintf(why, sizeof why, "another collective failed here first: %s", fsdp_last_error());
    cancel_hosts(w, why);
  }
  /* A backend that timed out on its own (gloo) got there about when the
   * watchdog does: wait for its report, which names the missing ranks. The
   * watchdog fires within a tick, plus the store queries of its report. */
  pthread_mutex_lock(&w->mu);
  double give_up = fsdp_time_now() + 3 * w->tick_s + WATCH_REPORT_S;
  while (w->has_thread && !atomic_load(&w->aborted) && overdue(w, c) &&
         fsdp_time_now() < give_up)
    tick_wait(w);
  pthread_mutex_unlock(&w->mu);
  if (!atomic_load(&w->aborted)) return st;
  return fsdp_error(FSDP_ERR_TIMEOUT, "%s", w->abort_msg);
}

void fsdp_watch_note_failure(fsdp_comm_t c, const char *msg) {
  struct fsdp_comm_watch *w = c->watch;
  fsdp_world_mark_failed(c->world);
  if (!w) return;
  pthread_mutex_lock(&w->fail_mu);
  if (!w->fail_msg[0]) snprintf(w->fail_msg, sizeof w->fail_msg, "%s", msg);
  pthread_mutex_unlock(&w->fail_mu);
}

fsdp_status_t fsdp_watch_check(fsdp_comm_t c) {
  struct fsdp_comm_watch *w = c->watch;
  if (!w) return FSDP_SUCCESS;
  pthread_mutex_lock(&w->mu);
  poll_devices(w);
  pthread_mutex_unlock(&w->mu);
  pthread_mutex_lock(&w->fail_mu);
  fsdp_status_t st = w->fail_msg[0] ? fsdp_error(FSDP_ERR_COMM, "%s; every later collective "
                                                 "of this world is refused", w->fail_msg)
                                    : FSDP_SUCCESS;
  pthread_mutex_unlock(&w->fail_mu);
  return st;
}

fsdp_status_t fsdp_watch_first_failure(fsdp_comm_t c, const char *own) {
  struct fsdp_comm_watch *w = c->watch;
  if (!w) return FSDP_SUCCESS;
  pthread_mutex_lock(&w->fail_mu);
  /* own quotes the failure already when the communicator it met was
   * aborted for it: then the report is said once. */
  const int quoted = strstr(own, w->fail_msg) != NULL;
  fsdp_status_t st = w->fail_msg[0] ? fsdp_error(FSDP_ERR_COMM, "%s; every later collective "
                                                 "of this world is refused%s%s%s",
                                                 w->fail_msg, quoted ? "" : " (this call: ",
                                                 quoted ? "" : own, quoted ? "" : ")")
                                    : FSDP_SUCCESS;
  pthread_mutex_unlock(&w->fail_mu);
  return st;
}

void *fsdp_watch_shared(fsdp_comm_t c) { return c->watch ? c->watch->shared : NULL; }

void fsdp_watch_set_shared(fsdp_comm_t c, void *shared, void (*free_fn)(void *)) {
  c->watch->shared = shared;
  c->watch->shared_free = free_fn;
}

double fsdp_watch_timeout(fsdp_comm_t c) { return fsdp_world_timeout(c->world); }
