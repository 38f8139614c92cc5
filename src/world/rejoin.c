/* src/world/rejoin.c — elastic worlds (fsdp/world.h): reading fsdp-run's word
 * on the control pipe after a loss, and joining the survivors' new world. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/internal.h"
#include "world/rendezvous.h"
#include "world/world_internal.h"

static fsdp_world_change_fn change_fn;
static void *change_user;
static int generation; /* the last world fsdp-run announced that we tried */
/* Guards generation, buf and have: a watchdog thread peeks at the pipe
 * (fsdp_world_loss_announced) while the trainer may read it. */
static pthread_mutex_t word_mu = PTHREAD_MUTEX_INITIALIZER;

int fsdp_world_elastic(void) {
  const char *v = getenv("FSDP_RUN_CONTROL");
  return v && *v && atoi(v) >= 0;
}

void fsdp_world_on_change(fsdp_world_change_fn fn, void *user) {
  change_fn = fn;
  change_user = user;
}

typedef struct {
  int generation, rank, size, port;
  int local_rank, local_size; /* over several nodes; -1 on one node (all local) */
} word_t;

static char buf[4096]; /* what the control pipe said that no world used yet */
static size_t have;

/* Reads the control pipe until a "world G R S P [LR LS]" line newer than the last
 * world tried has arrived (several may be waiting: the newest wins), within
 * timeout_s; with `peek`, only what is there now (*out zero when none). */
static fsdp_status_t read_word(int fd, double timeout_s, int peek, word_t *out) {
  double deadline = fsdp_time_now() + timeout_s;
  *out = (word_t){0, 0, 0, 0, -1, -1};
  for (;;) {
    char *line = buf, *nl;
    while ((nl = memchr(line, '\n', have - (size_t)(line - buf)))) {
      word_t w = {0, 0, 0, 0, -1, -1};
      *nl = '\0';
      if (sscanf(line, "world %d %d %d %d %d %d", &w.generation, &w.rank, &w.size, &w.port,
                 &w.local_rank, &w.local_size) >= 4 &&
          w.generation > generation && w.generation > out->generation)
        *out = w;
      line = nl + 1;
    }
    if (!peek) { /* the lines read are used; a peek leaves them for the read */
      have -= (size_t)(line - buf);
      memmove(buf, line, have);
    } else {
      for (char *z = buf; z < line; z++)
        if (*z == '\0') *z = '\n';
    }
    struct pollfd p = {fd, POLLIN, 0};
    int wait_ms = out->generation || peek ? 0 : (int)((deadline - fsdp_time_now()) * 1000.0);
    if (!out->generation && !peek && wait_ms <= 0)
      return fsdp_error(FSDP_ERR_TIMEOUT, "fsdp_world_rejoin: fsdp-run said nothing within "
                        "%g s about a world of the survivors (it ends the job when fewer than "
                        "--min-nproc ranks are left)", timeout_s);
    int rc = poll(&p, 1, wait_ms);
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) {
      if (out->generation || peek) return FSDP_SUCCESS;
      continue;
    }
    if (have == sizeof buf - 1)
      return fsdp_error(FSDP_ERR_COMM, "fsdp_world_rejoin: %zu bytes on the control pipe from "
                        "fsdp-run (FSDP_RUN_CONTROL=%d) without a newline: not fsdp-run's "
                        "protocol", have, fd);
    ssize_t got = read(fd, buf + have, sizeof buf - 1 - have);
    if (got == 0 && (out->generation || peek)) return FSDP_SUCCESS;
    if (got <= 0)
      return fsdp_error(FSDP_ERR_COMM, "fsdp_world_rejoin: the control pipe from fsdp-run "
                        "(FSDP_RUN_CONTROL=%d) %s", fd, got == 0 ? "was closed: fsdp-run is "
                        "gone" : strerror(errno));
    have += (size_t)got;
  }
}

static void setenv_int(const char *name, int v) {
  char text[16];
  snprintf(text, sizeof text, "%d", v);
  setenv(name, text, 1);
}

int fsdp_world_joining(void) {
  const char *v = getenv("FSDP_RUN_JOIN");
  return fsdp_world_elastic() && v && !strcmp(v, "1");
}

int fsdp_world_change_pending(void) {
  const char *v = getenv("FSDP_RUN_CONTROL");
  word_t w;
  pthread_mutex_lock(&word_mu);
  int pending = v && read_word(atoi(v), 0, 1, &w) == FSDP_SUCCESS && w.generation > 0;
  pthread_mutex_unlock(&word_mu);
  return pending;
}

int fsdp_world_control_fd(void) {
  return fsdp_world_elastic() ? atoi(getenv("FSDP_RUN_CONTROL")) : -1;
}

int fsdp_world_loss_announced(int fd, int size, int *new_generation, int *new_size) {
  if (fd < 0 || pthread_mutex_trylock(&word_mu)) return 0;
  word_t w;
  int lost = read_word(fd, 0, 1, &w) == FSDP_SUCCESS && w.generation > 0 && w.size < size;
  pthread_mutex_unlock(&word_mu);
  if (lost) *new_generation = w.generation, *new_size = w.size;
  return lost;
}

static double join_timeout(void) {
  const char *v = getenv("FSDP_RENDEZVOUS_TIMEOUT_S");
  double t = v ? atof(v) : 0;
  return t > 0 ? t : FSDP_DEFAULT_RENDEZVOUS_TIMEOUT_S;
}

fsdp_status_t fsdp_world_rejoin(fsdp_world_t *world, const fsdp_world_opts_t *opts,
                                fsdp_world_change_t *change) {
  if (!world || (!*world && !fsdp_world_joining()))
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_world_rejoin: no world to leave (only "
                      "a worker fsdp-run starts to join, FSDP_RUN_JOIN=1, has none)");
  if (!fsdp_world_elastic() || (*world && fsdp_world_kind(*world) != FSDP_WORLD_ENV))
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "fsdp_world_rejoin: this world cannot go on "
                      "without a lost rank (that needs an env:// world under fsdp-run "
                      "--min-nproc)");
  fsdp_world_change_t c = {.old_rank = *world ? fsdp_world_rank(*world) : -1,
                           .old_size = *world ? fsdp_world_size(*world) : 0};
  double timeout_s = *world ? fsdp_world_rendezvous_timeout(*world) : join_timeout();
  if (*world) {
    fsdp_world_mark_failed(*world);
    fsdp_world_destroy(*world);
    *world = NULL;
  }
  word_t w = {0, 0, 0, 0, -1, -1};
  int fd = atoi(getenv("FSDP_RUN_CONTROL"));
  /* A rank lost while the survivors meet makes that meeting fail at its
   * deadline; fsdp-run has announced the smaller world meanwhile. */
  for (fsdp_status_t st = FSDP_ERR_TIMEOUT; st != FSDP_SUCCESS;) {
    pthread_mutex_lock(&word_mu);
    st = read_word(fd, timeout_s, 0, &w);
    if (st == FSDP_SUCCESS) generation = w.generation;
    pthread_mutex_unlock(&word_mu);
    FSDP_TRY(st);
    /* The env:// contract, for this world: a single node unless the word
     * names this node's share of it. */
    setenv_int("RANK", w.rank);
    setenv_int("WORLD_SIZE", w.size);
    setenv_int("LOCAL_RANK", w.local_size > 0 ? w.local_rank : w.rank);
    setenv_int("LOCAL_WORLD_SIZE", w.local_size > 0 ? w.local_size : w.size);
    setenv_int("MASTER_PORT", w.port);
    st = fsdp_world_init(world, opts);
    if (st != FSDP_SUCCESS && st != FSDP_ERR_TIMEOUT) return st;
    if (st != FSDP_SUCCESS)
      fsdp_log(FSDP_LOG_WARN, "world: world %d of the survivors did not meet (%s); waiting for "
               "fsdp-run's next word", w.generation, fsdp_last_error());
  }
  c.generation = w.generation;
  c.rank = fsdp_world_rank(*world);
  c.size = fsdp_world_size(*world);
  fsdp_log(FSDP_LOG_INFO, "world: rank %d of %d is now rank %d of %d (world %d after a loss)",
           c.old_rank, c.old_size, c.rank, c.size, c.generation);
  if (change) *change = c;
  if (change_fn) change_fn(&c, change_user);
  return FSDP_SUCCESS;
}

void fsdp_world_note_resumed(fsdp_world_t world, int64_t step, int64_t lost_steps) {
  if (fsdp_world_kind(world) != FSDP_WORLD_ENV) return;
  char extra[64];
  snprintf(extra, sizeof extra, "%lld %lld", (long long)step, (long long)lost_steps);
  fsdp_env_notify("resumed", extra);
}
