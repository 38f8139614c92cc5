/* tests/launch/probe.c — the failure scenarios of the launch tests
 * (launch_test.py), one per run, under fsdp-run, mpirun, or env:// variables
 * set by hand. Every rank ends with one line "probe: rank R: <outcome>" on
 * stderr (the collective's report on failure) and exits 0 only when it saw
 * no error.
 *
 *   ok              an all_reduce of the ranks' numbers, checked
 *   stall R K       rank R stops issuing collectives at iteration K and
 *                   blocks (ignoring SIGTERM when PROBE_IGNORE_SIGTERM=1, to
 *                   make fsdp-run escalate); the others' all_reduce #K+1
 *                   times out
 *   stall-setup R   rank R blocks before creating its communicator; the
 *                   others' creation (MPI_Comm_dup, gloo's connect) must end
 *                   at the collective deadline, not hang
 *   stall-group R K the same inside a group of a split (ranks r / 2): only
 *                   R's partner times out, and its report names the group
 *   extra R         rank R issues an all_reduce the others do not, before
 *                   an all_gather they all issue
 *   count R         rank R passes a larger count to a shared all_gather
 *   skip-unit R     rank R's model lacks unit 'b' of a, b, c (equal sizes),
 *                   so its forward would gather 'c' where the others gather
 *                   'b'; materialize's plan comparison stops it first
 *   extra-group R   rank R issues an extra all_reduce inside its group of a
 *                   split (ranks r / 2): only that group desyncs, and its
 *                   report names the group and world ranks
 *   epipe           once its communicators exist, every rank writes to a
 *                   socket whose other end is closed, as Gloo's writev does to
 *                   a peer that died: the write must fail with EPIPE, not
 *                   kill the rank with SIGPIPE; then the ok scenario
 *   sigpipe R       rank 0 dies of SIGPIPE (default disposition restored);
 *                   rank R, ignoring SIGTERM from the start, sees its
 *                   communicators or all_reduce fail and then kills itself
 *                   with SIGKILL: SIGKILL, though later, is the root cause
 *                   fsdp-run names (a write to a gone peer is a consequence
 *                   of something else)
 *   rejoin R        elastic (fsdp-run --min-nproc): rank R SIGKILLs itself
 *                   before all_reduce #3; the others' all_reduce fails, they
 *                   destroy their communicators, fsdp_world_rejoin makes the
 *                   survivors' world (the change callback prints "probe:
 *                   rank R: change G: rank A of N -> rank B of M" once), and
 *                   an all_reduce over it is checked; without --min-nproc
 *                   the rejoin is refused and the rank fails
 *   rejoin-cycle [word]
 *                   elastic, 3 ranks: rank 2 SIGKILLs itself after
 *                   all_reduce #1; ranks 0 and 1 are then caught as an
 *                   engine's two streams can be, on two communicators of
 *                   their pair (a split, and its dup): rank 0 queues an
 *                   all_reduce on the dup on a stream, its shift on the
 *                   world's communicator fails on rank 2 (the shift
 *                   receives from it), and it waits for its stream, while
 *                   rank 1 is in an all_reduce on the split that rank 0
 *                   never issues. Only rank 0's failure can free them before
 *                   the deadline (it must cancel the pair's communicators);
 *                   each prints how long its wait took ("freed after S s").
 *                   With `word`, rank 0 waits on the dup on the host instead
 *                   and issues nothing with rank 2: no collective of theirs
 *                   fails, and only fsdp-run's word of the loss can free
 *                   them before the deadline;
 *                   a third communicator of the pair, exempt from that
 *                   cancel (fsdp_comm_set_cancel_on_failure), still carries
 *                   an all_reduce between them; then they rejoin as above
 *   exit0 R         after one all_reduce, rank R exits with status 0 without
 *                   destroying its world (a worker that ends while its peers
 *                   still need it); the others' next all_reduce fails
 *
 * The desync scenarios turn the check on (world opts; with
 * PROBE_DEFAULT_CHECK=1 they leave it to the default) and end with a barrier
 * on a communicator of their own, so every rank has printed its report
 * before the first one exits and a launcher stops the rest. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "comm/comm_internal.h"
#include "fsdp/fsdp.h"

static int rank;

static int say(fsdp_status_t st, const char *ok) {
  if (st == FSDP_SUCCESS)
    fprintf(stderr, "probe: rank %d: %s\n", rank, ok);
  else
    fprintf(stderr, "probe: rank %d: error %d: %s\n", rank, (int)st, fsdp_last_error());
  return st == FSDP_SUCCESS ? 0 : 1;
}

static fsdp_status_t run_ok(fsdp_comm_t c) {
  double mine = rank + 1, sum = 0;
  int n = fsdp_comm_size(c);
  fsdp_status_t st = fsdp_all_reduce(c, &mine, &sum, 1, FSDP_F64, FSDP_SUM, FSDP_HOST_STREAM);
  if (st == FSDP_SUCCESS && sum != n * (n + 1) / 2.0) {
    fprintf(stderr, "probe: rank %d: all_reduce gave %g, not %g\n", rank, sum, n * (n + 1) / 2.0);
    exit(1);
  }
  return st;
}

static fsdp_status_t run_stall(fsdp_comm_t c, int who, int at) {
  for (int i = 0;; i++) {
    if (rank == who && i == at) {
      if (getenv("PROBE_IGNORE_SIGTERM")) signal(SIGTERM, SIG_IGN);
      fprintf(stderr, "probe: rank %d: stalling before collective #%d\n", rank, i + 1);
      for (;;) pause(); /* the hang under test: only a signal ends it */
    }
    float one = 1.0f, sum = 0.0f;
    fsdp_comm_set_tag(c, "probe-loop");
    fsdp_status_t st = fsdp_all_reduce(c, &one, &sum, 1, FSDP_F32, FSDP_SUM, FSDP_HOST_STREAM);
    if (st != FSDP_SUCCESS) return st;
  }
}

static fsdp_status_t run_stall_group(fsdp_comm_t c, int who, int at) {
  fsdp_comm_t g = NULL;
  fsdp_status_t st = fsdp_comm_split(c, rank / 2, rank, &g);
  if (st == FSDP_SUCCESS) st = run_stall(g, who, at);
  fsdp_comm_destroy(g);
  return st;
}

static fsdp_status_t run_desync(fsdp_comm_t c, const char *what, int who) {
  int n = fsdp_comm_size(c);
  float x[8] = {0}, *all = calloc((size_t)n * 8, sizeof *all), one = 1.0f, sum;
  fsdp_status_t st = FSDP_SUCCESS;
  if (!strcmp(what, "extra") && rank == who)
    st = fsdp_all_reduce(c, &one, &sum, 1, FSDP_F32, FSDP_SUM, FSDP_HOST_STREAM);
  size_t count = !strcmp(what, "count") && rank == who ? 5 : 4;
  if (st == FSDP_SUCCESS) st = fsdp_all_gather(c, x, all, count, FSDP_F32, FSDP_HOST_STREAM);
  free(all);
  return st;
}

/* The extra scenario inside group r / 2 of a split of c. */
static fsdp_status_t run_extra_group(fsdp_comm_t c, int who) {
  fsdp_comm_t g = NULL;
  fsdp_status_t st = fsdp_comm_split(c, rank / 2, rank, &g);
  if (st == FSDP_SUCCESS) st = run_desync(g, "extra", who);
  fsdp_comm_destroy(g);
  return st;
}

/* One forward over units a, b, c of 64 parameters; rank `who` has no b. */
static fsdp_status_t run_skip_unit(fsdp_world_t w, int who) {
  fsdp_config_t cfg = FSDP_CONFIG_INIT;
  fsdp_engine_t e = NULL;
  fsdp_status_t st = fsdp_engine_create(w, &cfg, &e);
  const char *names[3] = {"a", "b", "c"}, *tensors[3] = {"a.w", "b.w", "c.w"};
  fsdp_unit_t units[3];
  int n = 0;
  for (int i = 0; i < 3 && st == FSDP_SUCCESS; i++) {
    if (rank == who && i == 1) continue;
    fsdp_tensor_desc_t t = {tensors[i], 1, {64}, FSDP_INIT_CONSTANT, 1.0f, 0};
    st = fsdp_unit_add(e, names[i], "Linear", &t, 1, &units[n++]);
  }
  if (st == FSDP_SUCCESS) st = fsdp_engine_materialize(e, 1);
  for (int i = 0; i < n && st == FSDP_SUCCESS; i++) {
    fsdp_view_t v;
    st = fsdp_unit_acquire(e, units[i], FSDP_FORWARD, &v);
    if (st == FSDP_SUCCESS) st = fsdp_unit_release(e, units[i], FSDP_FORWARD);
  }
  fsdp_engine_destroy(e);
  return st;
}

/* A write to a connection whose other end is closed (EPIPE, or SIGPIPE). */
static int write_to_closed(void) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return -1;
  close(sv[1]);
  char byte = 0;
  struct iovec v = {&byte, 1};
  ssize_t n = writev(sv[0], &v, 1); /* what Gloo's TCP pair calls */
  int err = errno;
  close(sv[0]);
  errno = err;
  return n < 0 ? -1 : 0;
}

static fsdp_status_t run_epipe(fsdp_comm_t c) {
  if (write_to_closed() == 0 || errno != EPIPE) {
    fprintf(stderr, "probe: rank %d: a write to a closed socket did not fail with EPIPE: %s\n",
            rank, strerror(errno));
    exit(1);
  }
  fprintf(stderr, "probe: rank %d: a write to a closed socket failed with EPIPE\n", rank);
  return run_ok(c);
}

static fsdp_status_t run_exit0(fsdp_comm_t c, int who) {
  fsdp_status_t st = run_ok(c);
  if (st == FSDP_SUCCESS && rank == who) {
    fprintf(stderr, "probe: rank %d: exiting with status 0 mid-job\n", rank);
    exit(0);
  }
  return st == FSDP_SUCCESS ? run_ok(c) : st;
}

static fsdp_status_t run_sigpipe(fsdp_comm_t c) {
  if (rank == 0) {
    signal(SIGPIPE, SIG_DFL);
    fprintf(stderr, "probe: rank 0: dying of SIGPIPE\n");
    write_to_closed();
    raise(SIGPIPE); /* not reached when the write already raised it */
  }
  return run_ok(c); /* fails: rank 0 is gone */
}

static int changes;

static void on_change(const fsdp_world_change_t *c, void *user) {
  changes++;
  fprintf(stderr, "probe: rank %d: change %d: rank %d of %d -> rank %d of %d (%s)\n", c->old_rank,
          c->generation, c->old_rank, c->old_size, c->rank, c->size, (const char *)user);
}

/* Rank 0's side of rejoin-cycle: the all_reduce queued on `later`, the
 * shift on c that fails, then the wait for the stream; FSDP_SUCCESS only if
 * the shift passed (it must not). */
static fsdp_status_t cycle_first(fsdp_comm_t c, fsdp_comm_t later, double *waited) {
  fsdp_stream_t s = NULL;
  double one = 1, sum = 0, got = 0;
  fsdp_status_t st = fsdp_stream_create("probe-later", &s);
  if (st == FSDP_SUCCESS)
    st = fsdp_all_reduce(later, &one, &sum, 1, FSDP_F64, FSDP_SUM, s);
  if (st == FSDP_SUCCESS) st = fsdp_shift(c, &one, &got, 1, FSDP_F64, 1, FSDP_HOST_STREAM);
  if (st == FSDP_SUCCESS) return st;
  fprintf(stderr, "probe: rank %d: shift failed: %s\n", rank, fsdp_last_error());
  double t0 = fsdp_time_now();
  if (s && fsdp_stream_synchronize(s) != FSDP_SUCCESS)
    fprintf(stderr, "probe: rank %d: queued all_reduce failed: %s\n", rank, fsdp_last_error());
  *waited = fsdp_time_now() - t0;
  fsdp_stream_destroy(s);
  return FSDP_ERR_COMM;
}

/* rejoin-cycle up to the failure: FSDP_SUCCESS when a survivor's
 * collectives all passed (they must not). */
static fsdp_status_t cycle(fsdp_comm_t c, int word) {
  fsdp_comm_t pair = NULL, later = NULL, kept = NULL;
  fsdp_status_t st = fsdp_comm_split(c, rank == 2, rank, &pair);
  if (st == FSDP_SUCCESS) st = fsdp_comm_dup(pair, &later);
  if (st == FSDP_SUCCESS) st = fsdp_comm_dup(pair, &kept);
  if (st == FSDP_SUCCESS) st = fsdp_comm_set_cancel_on_failure(kept, 0);
  if (st == FSDP_SUCCESS) st = run_ok(c);
  if (st != FSDP_SUCCESS) exit(say(st, ""));
  if (rank == 2) raise(SIGKILL);
  double waited = 0, t0 = fsdp_time_now();
  if (rank == 0 && !word) {
    st = cycle_first(c, later, &waited);
  } else {
    st = run_ok(rank == 0 ? later : pair);
    waited = fsdp_time_now() - t0;
    if (st != FSDP_SUCCESS)
      fprintf(stderr, "probe: rank %d: all_reduce on the %s failed: %s\n", rank,
              rank == 0 ? "dup" : "pair", fsdp_last_error());
  }
  fprintf(stderr, "probe: rank %d: freed after %.2f s\n", rank, waited);
  if (st != FSDP_SUCCESS) say(run_ok(kept), "the exempt communicator still works");
  fsdp_comm_destroy(kept);
  fsdp_comm_destroy(later);
  fsdp_comm_destroy(pair);
  return st;
}

/* The rejoin scenario, from the first all_reduce to the checked one over the
 * survivors' world; *c and *done are the old world's, made anew. */
static fsdp_status_t run_rejoin(fsdp_world_t *w, const fsdp_world_opts_t *o, fsdp_comm_t *c,
                                fsdp_comm_t *done, int who) {
  fsdp_status_t st = FSDP_SUCCESS;
  if (who < 0) st = cycle(*c, who == -2);
  for (int i = 0; i < 5 && st == FSDP_SUCCESS && who >= 0; i++) {
    if (rank == who && i == 2) raise(SIGKILL);
    st = run_ok(*c);
  }
  if (st == FSDP_SUCCESS) {
    fprintf(stderr, "probe: rank %d: every collective passed with rank %d dead\n", rank,
            who < 0 ? 2 : who);
    exit(1);
  }
  fsdp_comm_destroy(*done);
  fsdp_comm_destroy(*c);
  *c = *done = NULL;
  fsdp_world_on_change(on_change, "callback");
  fsdp_world_change_t ch;
  fsdp_status_t rs = fsdp_world_rejoin(w, o, &ch);
  if (rs != FSDP_SUCCESS) return rs;
  if (changes != 1 || ch.rank != fsdp_world_rank(*w) || ch.size != fsdp_world_size(*w) ||
      ch.old_rank != rank || ch.generation != 1) {
    fprintf(stderr, "probe: rank %d: change %d callbacks, rank %d of %d, world %d\n", rank,
            changes, ch.rank, ch.size, ch.generation);
    exit(1);
  }
  rank = fsdp_world_rank(*w);
  rs = fsdp_comm_create(*w, c);
  if (rs == FSDP_SUCCESS) rs = fsdp_comm_create(*w, done);
  return rs == FSDP_SUCCESS ? run_ok(*c) : rs;
}

int main(int argc, char **argv) {
  const char *what = argc > 1 ? argv[1] : "";
  int desync = !strcmp(what, "extra") || !strcmp(what, "count") ||
               !strcmp(what, "skip-unit") || !strcmp(what, "extra-group");
  if (strcmp(what, "ok") && strcmp(what, "stall") && strcmp(what, "stall-setup") &&
      strcmp(what, "stall-group") && strcmp(what, "epipe") && strcmp(what, "sigpipe") &&
      strcmp(what, "exit0") && strcmp(what, "rejoin") && strcmp(what, "rejoin-cycle") &&
      !desync) {
    fprintf(stderr, "usage: probe ok | stall RANK ITER | stall-group RANK ITER | stall-setup "
            "RANK | extra RANK | count RANK | skip-unit RANK | extra-group RANK | epipe | "
            "sigpipe RANK | exit0 RANK | rejoin RANK | rejoin-cycle [word]\n");
    return 2;
  }
  if (getenv("RANK")) rank = atoi(getenv("RANK")); /* for messages before the world exists */
  int who = argc > 2 ? atoi(argv[2]) : 1;
  /* sigpipe: rank `who` must outlive fsdp-run's SIGTERM, which may come as
   * soon as rank 0 dies, even before this rank has its communicators. */
  int sigpipe_victim = !strcmp(what, "sigpipe") && rank == who;
  if (sigpipe_victim) signal(SIGTERM, SIG_IGN);
  fsdp_world_opts_t o = FSDP_WORLD_OPTS_INIT;
  /* PROBE_DEFAULT_CHECK=1: leave the check to the library's default (on). */
  const char *dflt = getenv("PROBE_DEFAULT_CHECK");
  o.desync_check = desync && !(dflt && !strcmp(dflt, "1"));
  fsdp_world_t w = NULL;
  fsdp_comm_t c = NULL, done = NULL;
  fsdp_status_t st = fsdp_world_init(&w, &o);
  if (st != FSDP_SUCCESS && !sigpipe_victim) return say(st, "");
  if (w) rank = fsdp_world_rank(w);
  if (!strcmp(what, "stall-setup") && rank == who) {
    fprintf(stderr, "probe: rank %d: stalling before communicator creation\n", rank);
    for (;;) pause(); /* the hang under test: only a signal ends it */
  }
  if (st == FSDP_SUCCESS) st = fsdp_comm_create(w, &c);
  if (st == FSDP_SUCCESS) st = fsdp_comm_create(w, &done);
  if (st == FSDP_SUCCESS) {
    if (!strcmp(what, "ok")) st = run_ok(c);
    else if (!strcmp(what, "stall")) st = run_stall(c, who, argc > 3 ? atoi(argv[3]) : 3);
    else if (!strcmp(what, "stall-group"))
      st = run_stall_group(c, who, argc > 3 ? atoi(argv[3]) : 3);
    else if (!strcmp(what, "skip-unit")) st = run_skip_unit(w, who);
    else if (!strcmp(what, "extra-group")) st = run_extra_group(c, who);
    else if (!strcmp(what, "epipe")) st = run_epipe(c);
    else if (!strcmp(what, "sigpipe")) st = run_sigpipe(c);
    else if (!strcmp(what, "exit0")) st = run_exit0(c, who);
    else if (!strcmp(what, "rejoin")) st = run_rejoin(&w, &o, &c, &done, who);
    else if (!strcmp(what, "rejoin-cycle"))
      st = run_rejoin(&w, &o, &c, &done, argc > 2 && !strcmp(argv[2], "word") ? -2 : -1);
    else st = run_desync(c, what, who);
  }
  if (sigpipe_victim) {
    /* Not the error's text: it blames a peer, and a SIGKILL out of the blue
     * (the OOM killer, kill -9) prints nothing. */
    fprintf(stderr, "probe: rank %d: saw rank 0 gone; SIGKILL to itself\n", rank);
    raise(SIGKILL);
  }
  int rc = say(st, "ok");
  if (desync && done) fsdp_barrier(done, FSDP_HOST_STREAM);
  fsdp_comm_destroy(done);
  fsdp_comm_destroy(c);
  fsdp_world_destroy(w);
  return rc;
}
