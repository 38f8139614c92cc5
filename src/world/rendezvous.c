/* src/world/rendezvous.c — the env:// bootstrap (world/rendezvous.h), as a
 * torchrun-style launcher (fsdp-run) sets it up: rank 0 serves the store at
 * MASTER_PORT, every rank connects to MASTER_ADDR:MASTER_PORT (rank 0 over
 * loopback), registers, and rank 0 announces a verdict once all WORLD_SIZE
 * ranks are in or the rendezvous timeout has passed. The verdict names the
 * ranks that never joined, so every rank that reached the store fails with
 * the same list instead of hanging.
 *
 * The store belongs to the job FSDP_RUN_ID names (fsdp-run sets it), so a
 * rank of another job that reaches it on the same port is turned away before
 * it can claim a RANK. Under fsdp-run a rank also tells the launcher when it
 * has joined and when it has left (fsdp_env_notify), which is how fsdp-run
 * knows that a worker exiting with status 0 is still needed by its peers.
 *
 * Store keys: rdzv/claim/R (counter: a RANK given to two processes),
 * rdzv/rank/R ("WORLD_SIZE pid host"), rdzv/verdict ("ok" or "fail: why"),
 * rdzv/ack/R (a rank read a failed verdict), exit/R (the exit barrier). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/internal.h"
#include "world/rendezvous.h"
#include "world/world_internal.h"

/* Rank 0 decides this much before the rendezvous timeout (at most 1 s, a
 * tenth of short timeouts), so that the ranks waiting for its verdict read it
 * before their own deadline and every rank is gone within the timeout. */
static double verdict_margin(double timeout_s) {
  return timeout_s / 10 < 1.0 ? timeout_s / 10 : 1.0;
}

struct fsdp_env_world {
  fsdp_env_layout_t layout;
  char master[256];
  char job[FSDP_STORE_JOB_MAX + 1]; /* FSDP_RUN_ID, "" when not given */
  int port;
  double timeout_s;
  fsdp_store_server_t *server; /* rank 0 */
  fsdp_store_t *store;
  char host_address[64];
};

/* ---- environment --------------------------------------------------------- */

int fsdp_env_requested(void) { return getenv("MASTER_ADDR") || getenv("MASTER_PORT"); }

static fsdp_status_t env_int(const char *name, long lo, long hi, int *out) {
  const char *v = getenv(name);
  char *end;
  errno = 0;
  long x = v ? strtol(v, &end, 10) : 0;
  if (!v || !*v || *end || errno || x < lo || x > hi)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "env:// launch: %s='%s' is not an integer in "
                      "%ld..%ld", name, v ? v : "", lo, hi);
  *out = (int)x;
  return FSDP_SUCCESS;
}

static fsdp_status_t require_vars(void) {
  static const char *vars[] = {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
  char missing[64] = "";
  for (int i = 0; i < 4; i++)
    if (!getenv(vars[i]))
      snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s",
               *missing ? ", " : "", vars[i]);
  if (!*missing) return FSDP_SUCCESS;
  return fsdp_error(FSDP_ERR_INVALID_USAGE, "env:// launch: MASTER_ADDR or MASTER_PORT is set "
                    "but %s %s not; set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT for "
                    "every rank (fsdp-run --nproc-per-node N does), or launch with mpirun",
                    missing, strchr(missing, ',') ? "are" : "is");
}

static fsdp_status_t read_env(struct fsdp_env_world *e, int expected) {
  FSDP_TRY(require_vars());
  fsdp_env_layout_t *l = &e->layout;
  FSDP_TRY(env_int("WORLD_SIZE", 1, INT_MAX, &l->size));
  FSDP_TRY(env_int("RANK", 0, l->size - 1, &l->rank));
  FSDP_TRY(env_int("MASTER_PORT", 1, 65535, &e->port));
  snprintf(e->master, sizeof e->master, "%s", getenv("MASTER_ADDR"));
  const char *job = getenv("FSDP_RUN_ID");
  if (job && strlen(job) > FSDP_STORE_JOB_MAX)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "env:// launch: FSDP_RUN_ID='%.40s...' is longer "
                      "than %d bytes", job, FSDP_STORE_JOB_MAX);
  snprintf(e->job, sizeof e->job, "%s", job ? job : "");
  l->local_rank = l->local_size = -1;
  if (getenv("LOCAL_RANK") && getenv("LOCAL_WORLD_SIZE")) {
    FSDP_TRY(env_int("LOCAL_WORLD_SIZE", 1, l->size, &l->local_size));
    FSDP_TRY(env_int("LOCAL_RANK", 0, l->local_size - 1, &l->local_rank));
  }
  if (expected > 0 && expected != l->size)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "world: expected_world_size is %d but "
                      "WORLD_SIZE is %d; run: fsdp-run --nproc-per-node %d <program> ...",
                      expected, l->size, expected);
  return FSDP_SUCCESS;
}

/* The local address of the interface that routes to MASTER_ADDR: a UDP
 * socket "connected" there sends nothing but picks the route. */
static void find_host_address(struct fsdp_env_world *e) {
  snprintf(e->host_address, sizeof e->host_address, "127.0.0.1");
  struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *res = NULL;
  char port[16];
  snprintf(port, sizeof port, "%d", e->port);
  if (getaddrinfo(e->master, port, &hints, &res)) return;
  int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
      getsockname(fd, (struct sockaddr *)&ss, &len) == 0) {
    const void *a = ss.ss_family == AF_INET6 ? (void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
                                             : (void *)&((struct sockaddr_in *)&ss)->sin_addr;
    inet_ntop(ss.ss_family, a, e->host_address, sizeof e->host_address);
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
}

/* ---- telling fsdp-run ---------------------------------------------------- */

/* fsdp-run hands every worker one end of a datagram socket pair, named by
 * FSDP_RUN_NOTIFY="fd:inode:R" (R: the RANK it gave the worker, whatever
 * world the process makes), and judges a worker that exits with status 0 by
 * what it heard (src/tools/run_group.c): "joined R" once the process has
 * registered in a rendezvous, "left R" once it has left its world through
 * fsdp_world_destroy. The inode proves the descriptor is still that socket: a
 * program that the worker starts inherits the variable but not the
 * descriptor (close-on-exec once used). A full queue makes the send wait
 * (fsdp-run reads every round; a lost "left" would fail a worker that
 * finished); a launcher that is gone makes it fail at once, and has nothing
 * to learn. */
void fsdp_env_notify(const char *event, const char *extra) {
  const char *v = getenv("FSDP_RUN_NOTIFY");
  int fd = -1, rank = -1;
  unsigned long long ino = 0;
  struct stat st;
  if (!v || sscanf(v, "%d:%llu:%d", &fd, &ino, &rank) != 3 || fd < 0 || fstat(fd, &st) ||
      !S_ISSOCK(st.st_mode) || (unsigned long long)st.st_ino != ino)
    return;
  fcntl(fd, F_SETFD, FD_CLOEXEC);
  char msg[128];
  int n = snprintf(msg, sizeof msg, "%s %d%s%s", event, rank, extra ? " " : "", extra ? extra : "");
  while (send(fd, msg, (size_t)n, MSG_NOSIGNAL) < 0 && errno == EINTR) {
  }
}

/* Which ranks have not registered: "ranks 2, 3" into buf; returns how many. */
static int missing_ranks(struct fsdp_env_world *e, char *buf, size_t n) {
  int size = e->layout.size, count = 0;
  int *miss = malloc((size_t)size * sizeof *miss);
  if (!miss) return snprintf(buf, n, "(unknown: out of memory)"), -1;
  for (int i = 0; i < size; i++) {
    char key[48];
    int exists = 0;
    snprintf(key, sizeof key, "rdzv/rank/%d", i);
    if (fsdp_store_check(e->store, key, &exists) != FSDP_SUCCESS) {
      free(miss);
      return snprintf(buf, n, "(unknown: %s)", fsdp_last_error()), -1;
    }
    if (!exists) miss[count++] = i;
  }
  int w = snprintf(buf, n, "%s ", count == 1 ? "rank" : "ranks");
  fsdp_format_ranks(buf + w, n - (size_t)w, miss, count);
  free(miss);
  return count;
}

static fsdp_status_t timed_out(struct fsdp_env_world *e, double t0) {
  char miss[512];
  int count = missing_ranks(e, miss, sizeof miss);
  return fsdp_error(FSDP_ERR_TIMEOUT, "env:// rendezvous at %s:%d timed out after %.1f s on "
                    "rank %d: %d of %d ranks joined; missing: %s. Start every rank 0..%d with "
                    "the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE, or raise "
                    "FSDP_RENDEZVOUS_TIMEOUT_S (now %g s)", e->master, e->port,
                    fsdp_time_now() - t0, e->layout.rank,
                    count < 0 ? 0 : e->layout.size - count, e->layout.size, miss,
                    e->layout.size - 1, e->timeout_s);
}

/* ---- joining ------------------------------------------------------------- */

static fsdp_status_t connect_store(struct fsdp_env_world *e, double deadline) {
  int r0 = e->layout.rank == 0;
  if (r0) FSDP_TRY(fsdp_store_server_start(e->port, e->job, &e->server, NULL));
  double left = deadline - fsdp_time_now();
  fsdp_status_t st = fsdp_store_connect(r0 ? "127.0.0.1" : e->master, e->port, e->job,
                                        left > 0 ? left : 0, &e->store);
  if (st == FSDP_SUCCESS || r0) return st;
  char why[1024];
  snprintf(why, sizeof why, "%s", fsdp_last_error()); /* fsdp_error rewrites that buffer */
  if (st == FSDP_ERR_INVALID_USAGE) /* another job's store: reached, and turned away */
    return fsdp_error(st, "env:// rendezvous: rank %d cannot join: %s", e->layout.rank, why);
  return fsdp_error(st, "env:// rendezvous: rank %d cannot join: %s. Rank 0 serves the store "
                    "at MASTER_ADDR:MASTER_PORT (%s:%d): it has not started, has exited, or "
                    "the address is wrong", e->layout.rank, why, e->master, e->port);
}

static fsdp_status_t register_rank(struct fsdp_env_world *e) {
  char key[48], host[256] = "?", val[320];
  int64_t claims = 0;
  snprintf(key, sizeof key, "rdzv/claim/%d", e->layout.rank);
  FSDP_TRY(fsdp_store_add(e->store, key, 1, &claims));
  if (claims > 1)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "env:// rendezvous: RANK=%d was given to %lld "
                      "processes; every process needs its own RANK in 0..%d", e->layout.rank,
                      (long long)claims, e->layout.size - 1);
  gethostname(host, sizeof host - 1);
  snprintf(key, sizeof key, "rdzv/rank/%d", e->layout.rank);
  int n = snprintf(val, sizeof val, "%d %ld %s", e->layout.size, (long)getpid(), host);
  return fsdp_store_set(e->store, key, val, (size_t)n);
}

/* Rank 0: a verdict over what every rank registered ("" when all agree). */
static void check_sizes(struct fsdp_env_world *e, char *why, size_t n) {
  why[0] = '\0';
  for (int i = 0; i < e->layout.size && !why[0]; i++) {
    char key[48], *v = NULL;
    snprintf(key, sizeof key, "rdzv/rank/%d", i);
    if (fsdp_store_get(e->store, key, 0, &v, NULL) != FSDP_SUCCESS) {
      snprintf(why, n, "%s", fsdp_last_error());
      return;
    }
    int size = atoi(v);
    if (size != e->layout.size)
      snprintf(why, n, "rank %d was started with WORLD_SIZE=%d but rank 0 with WORLD_SIZE=%d",
               i, size, e->layout.size);
    fsdp_free(v);
  }
}

/* Rank 0 keeps serving a failed verdict until the ranks that joined have
 * read it, or until the rendezvous deadline when some are gone already. */
static void linger(struct fsdp_env_world *e, double deadline) {
  for (int i = 1; i < e->layout.size; i++) {
    char key[48];
    int joined = 0;
    snprintf(key, sizeof key, "rdzv/rank/%d", i);
    if (fsdp_store_check(e->store, key, &joined) || !joined) continue;
    snprintf(key, sizeof key, "rdzv/ack/%d", i);
    const char *keys[1] = {key};
    double left = deadline - fsdp_time_now();
    if (fsdp_store_wait(e->store, keys, 1, left > 0 ? left : 0, NULL)) return;
  }
}

static fsdp_status_t decide(struct fsdp_env_world *e, double t0, double deadline) {
  fsdp_status_t st = FSDP_SUCCESS;
  char verdict[1100] = "ok", why[900];
  double decide_by = deadline - verdict_margin(e->timeout_s);
  for (int i = 0; i < e->layout.size && st == FSDP_SUCCESS; i++) {
    char key[48], *v = NULL;
    double left = decide_by - fsdp_time_now();
    snprintf(key, sizeof key, "rdzv/rank/%d", i);
    st = fsdp_store_get(e->store, key, left > 0 ? left : 0, &v, NULL);
    fsdp_free(v);
  }
  if (st == FSDP_ERR_TIMEOUT) st = timed_out(e, t0);
  if (st == FSDP_SUCCESS) {
    check_sizes(e, why, sizeof why);
    if (why[0])
      st = fsdp_error(FSDP_ERR_INVALID_USAGE, "env:// rendezvous: %s; every rank must be "
                      "started with the same WORLD_SIZE", why);
  }
  if (st != FSDP_SUCCESS) snprintf(verdict, sizeof verdict, "fail %d: %s", (int)st, fsdp_last_error());
  char saved[1024];
  snprintf(saved, sizeof saved, "%s", fsdp_last_error());
  if (fsdp_store_set(e->store, "rdzv/verdict", verdict, strlen(verdict)) == FSDP_SUCCESS &&
      st != FSDP_SUCCESS)
    linger(e, deadline);
  if (st != FSDP_SUCCESS) fsdp_error_set(saved);
  return st;
}

static fsdp_status_t await_verdict(struct fsdp_env_world *e, double t0, double deadline) {
  char *v = NULL;
  double left = deadline - fsdp_time_now();
  fsdp_status_t st = fsdp_store_get(e->store, "rdzv/verdict", left > 0 ? left : 0, &v, NULL);
  if (st == FSDP_ERR_TIMEOUT) return timed_out(e, t0);
  FSDP_TRY(st);
  if (strcmp(v, "ok") == 0) {
    fsdp_free(v);
    return FSDP_SUCCESS;
  }
  char key[48];
  snprintf(key, sizeof key, "rdzv/ack/%d", e->layout.rank);
  fsdp_store_set(e->store, key, "1", 1);
  int code = FSDP_ERR_INTERNAL, at = 0;
  if (sscanf(v, "fail %d: %n", &code, &at) < 1 || at == 0 || code <= 0 ||
      code >= FSDP_STATUS_COUNT)
    code = FSDP_ERR_INTERNAL, at = 0;
  fsdp_error((fsdp_status_t)code, "%s (as rank 0 reported to rank %d)", v + at, e->layout.rank);
  fsdp_free(v);
  return (fsdp_status_t)code;
}

/* Local rank and size from the host names every rank registered. */
static fsdp_status_t derive_local(struct fsdp_env_world *e) {
  fsdp_env_layout_t *l = &e->layout;
  char mine[256] = "?";
  gethostname(mine, sizeof mine - 1);
  l->local_rank = l->local_size = 0;
  for (int i = 0; i < l->size; i++) {
    char key[48], *v = NULL, host[256];
    snprintf(key, sizeof key, "rdzv/rank/%d", i);
    FSDP_TRY(fsdp_store_get(e->store, key, 0, &v, NULL));
    int same = sscanf(v, "%*d %*d %255s", host) == 1 && strcmp(host, mine) == 0;
    fsdp_free(v);
    if (same && i < l->rank) l->local_rank++;
    l->local_size += same;
  }
  return FSDP_SUCCESS;
}

static fsdp_status_t join(struct fsdp_env_world *e) {
  double t0 = fsdp_time_now(), deadline = t0 + e->timeout_s;
  FSDP_TRY(connect_store(e, deadline));
  FSDP_TRY(register_rank(e));
  fsdp_env_notify("joined", NULL);
  FSDP_TRY(e->layout.rank == 0 ? decide(e, t0, deadline) : await_verdict(e, t0, deadline));
  if (e->layout.local_rank < 0) FSDP_TRY(derive_local(e));
  find_host_address(e);
  return FSDP_SUCCESS;
}

/* ---- lifetime ------------------------------------------------------------ */

static void env_free(struct fsdp_env_world *e) {
  fsdp_store_close(e->store);
  fsdp_store_server_stop(e->server);
  free(e);
}

fsdp_status_t fsdp_env_world_start(double timeout_s, int expected, fsdp_env_world_t **out,
                                   fsdp_env_layout_t *layout) {
  struct fsdp_env_world *e = calloc(1, sizeof *e);
  if (!e) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "env:// rendezvous: out of memory");
  e->timeout_s = timeout_s;
  fsdp_status_t st = read_env(e, expected);
  if (st == FSDP_SUCCESS) st = join(e);
  if (st != FSDP_SUCCESS) {
    fsdp_env_notify("left", NULL); /* in no world, whether or not it had registered */
    env_free(e);
    return st;
  }
  *layout = e->layout;
  *out = e;
  return FSDP_SUCCESS;
}

static void exit_barrier(struct fsdp_env_world *e) {
  char key[48];
  snprintf(key, sizeof key, "exit/%d", e->layout.rank);
  if (fsdp_store_set(e->store, key, "1", 1) != FSDP_SUCCESS || e->layout.rank != 0) return;
  double deadline = fsdp_time_now() + e->timeout_s;
  for (int i = 1; i < e->layout.size; i++) {
    const char *keys[1] = {key};
    double left = deadline - fsdp_time_now();
    snprintf(key, sizeof key, "exit/%d", i);
    if (fsdp_store_wait(e->store, keys, 1, left > 0 ? left : 0, NULL) != FSDP_SUCCESS) {
      fsdp_log(FSDP_LOG_WARN, "world: rank %d did not reach fsdp_world_destroy within %g s; "
               "rank 0 stops serving the store anyway", i, e->timeout_s);
      return;
    }
  }
}

void fsdp_env_world_stop(fsdp_env_world_t *e, int failed) {
  if (!e) return;
  if (!failed) exit_barrier(e);
  fsdp_env_notify("left", NULL); /* failed too: the program is done with its peers */
  env_free(e);
}

fsdp_store_t *fsdp_env_world_store(fsdp_env_world_t *e) { return e ? e->store : NULL; }

fsdp_status_t fsdp_env_world_store_open(fsdp_env_world_t *e, fsdp_store_t **out) {
  const char *host = e->layout.rank == 0 ? "127.0.0.1" : e->master;
  return fsdp_store_connect(host, e->port, e->job, e->timeout_s, out);
}

const char *fsdp_env_world_host_address(const fsdp_env_world_t *e) {
  return e ? e->host_address : "";
}
