/* src/world/world.c — world bootstrap (include/fsdp/world.h): finds out how the
 * process was launched (mpirun, env:// or nothing), starts MPI at the thread
 * level communication streams need or joins the env:// rendezvous
 * (rendezvous.c), resolves the deadlines, and answers rank/size questions. A
 * world without a launcher is a single rank that makes no MPI call at all, so
 * single-process programs never need MPI to be configured; an env:// world
 * makes none either. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"
#include "world/rendezvous.h"
#include "world/world_internal.h"
#include "world/world_mpi.h"

struct fsdp_world {
  int rank, size;
  int local_rank, local_size;
  fsdp_world_kind_t kind;
  MPI_Comm comm; /* our dup of MPI_COMM_WORLD; MPI_COMM_NULL unless MPI */
  double timeout_s, rendezvous_timeout_s;
  int desync_check;
  fsdp_env_world_t *env; /* env:// only */
  void *comm_state;      /* the comm layer's; see world_env.h */
  int next_comm_id;
  atomic_int failed;
};

/* MPI can be initialised and finalised once per process, but several worlds may
 * live at once (a test harness world plus per-test worlds). The library
 * finalises MPI only if it initialised it, when the last MPI world goes away.
 * Worlds are created and destroyed from the main thread only (world.h). */
static int mpi_started_by_us;
static int mpi_worlds_alive;
/* The env:// rendezvous is once per process too: rank 0's store owns the port. */
static int env_world_alive;

static const char *launcher_env[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                     "MPI_LOCALNRANKS"};

static int launcher_present(void) {
  for (size_t i = 0; i < sizeof launcher_env / sizeof launcher_env[0]; i++)
    if (getenv(launcher_env[i])) return 1;
  return 0;
}

static const char *thread_level_name(int level) {
  switch (level) {
  case MPI_THREAD_SINGLE:
    return "MPI_THREAD_SINGLE";
  case MPI_THREAD_FUNNELED:
    return "MPI_THREAD_FUNNELED";
  case MPI_THREAD_SERIALIZED:
    return "MPI_THREAD_SERIALIZED";
  case MPI_THREAD_MULTIPLE:
    return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown level";
}

/* Without a launcher only one rank is possible; a request for more (by option
 * or by WORLD_SIZE without MASTER_ADDR) gets told how to launch instead. */
static fsdp_status_t check_no_launcher(int expected) {
  const char *ws = getenv("WORLD_SIZE");
  long env_size = 1;
  if (ws) {
    char *end;
    env_size = strtol(ws, &end, 10);
    if (*ws == '\0' || *end != '\0' || env_size < 1 || env_size > INT_MAX)
      return fsdp_error(FSDP_ERR_INVALID_USAGE,
                        "WORLD_SIZE='%s' is not a positive integer; unset it or run: "
                        "mpirun -np <ranks> <program> ...", ws);
  }
  long want = expected > 1 ? expected : env_size;
  if (want > 1)
    return fsdp_error(FSDP_ERR_INVALID_USAGE,
                      "asked for %ld ranks (%s) but this process was not started by a "
                      "launcher; run: mpirun -np %ld <program> ... or fsdp-run "
                      "--nproc-per-node %ld <program> ...", want,
                      expected > 1 ? "expected_world_size" : "WORLD_SIZE", want, want);
  return FSDP_SUCCESS;
}

static fsdp_status_t mpi_fail(const char *what, int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "code %d", rc);
  return fsdp_error(FSDP_ERR_COMM, "world: %s failed: %s", what, text);
}

/* Makes sure MPI runs at MPI_THREAD_MULTIPLE, initialising it if nobody has. */
static fsdp_status_t mpi_start(void) {
  int inited = 0, finalized = 0, provided = MPI_THREAD_SINGLE;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (finalized)
    return fsdp_error(FSDP_ERR_INVALID_USAGE,
                      "world: MPI was already finalised in this process and cannot be "
                      "restarted; create every world before destroying the last one");
  if (!inited) {
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) return mpi_fail("MPI_Init_thread(MPI_THREAD_MULTIPLE)", rc);
    mpi_started_by_us = 1;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    if (!inited) {
      MPI_Finalize();
      mpi_started_by_us = 0;
    }
    return fsdp_error(FSDP_ERR_UNSUPPORTED,
                      "world: MPI provides %s but fsdp needs MPI_THREAD_MULTIPLE because "
                      "its communication streams are threads calling MPI concurrently; %s",
                      thread_level_name(provided),
                      inited ? "initialise MPI with MPI_Init_thread(MPI_THREAD_MULTIPLE) "
                               "or let fsdp_world_init do it"
                             : "use an MPI library built with thread support");
  }
  return FSDP_SUCCESS;
}

/* ---- set-up deadlines (world_mpi.h) ------------------------------------ */

struct fsdp_mpi_guard {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done, rank;
  double timeout_s;
  const char *what;
};

static void *guard_main(void *arg) {
  struct fsdp_mpi_guard *g = arg;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  double t = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + g->timeout_s;
  ts.tv_sec = (time_t)t;
  ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
  pthread_mutex_lock(&g->mu);
  int rc = 0;
  while (!g->done && rc == 0) rc = pthread_cond_timedwait(&g->cv, &g->mu, &ts);
  int expired = !g->done;
  pthread_mutex_unlock(&g->mu);
  if (!expired) return NULL;
  fprintf(stderr, "fsdp: rank %d: %s did not complete within the %g s timeout "
          "(FSDP_TIMEOUT_S): a peer failed or stalled outside a collective; aborting the job "
          "(MPI_Abort)\n", g->rank, g->what, g->timeout_s);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  return NULL;
}

fsdp_mpi_guard_t *fsdp_mpi_guard_begin(const char *what, int rank, double timeout_s) {
  struct fsdp_mpi_guard *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  *g = (struct fsdp_mpi_guard){.rank = rank, .timeout_s = timeout_s, .what = what};
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&g->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&g->mu, NULL);
  if (pthread_create(&g->thread, NULL, guard_main, g) == 0) return g;
  fsdp_log(FSDP_LOG_WARN, "world: no thread to watch %s; it runs without a deadline", what);
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
  free(g);
  return NULL;
}

void fsdp_mpi_guard_end(fsdp_mpi_guard_t *g) {
  if (!g) return;
  pthread_mutex_lock(&g->mu);
  g->done = 1;
  pthread_cond_signal(&g->cv);
  pthread_mutex_unlock(&g->mu);
  pthread_join(g->thread, NULL);
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
  free(g);
}

static void mpi_stop(int rank, double timeout_s) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (--mpi_worlds_alive == 0 && mpi_started_by_us) {
    if (!finalized) {
      fsdp_mpi_guard_t *g = fsdp_mpi_guard_begin("MPI_Finalize", rank, timeout_s);
      MPI_Finalize();
      fsdp_mpi_guard_end(g);
    }
    mpi_started_by_us = 0;
  }
}

/* Rank, size and the node-local split over our own dup of MPI_COMM_WORLD. */
static fsdp_status_t mpi_world_split(struct fsdp_world *w) {
  int rc = MPI_Comm_dup(MPI_COMM_WORLD, &w->comm);
  if (rc != MPI_SUCCESS) return mpi_fail("MPI_Comm_dup(MPI_COMM_WORLD)", rc);
  MPI_Comm_set_errhandler(w->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(w->comm, &w->rank);
  MPI_Comm_size(w->comm, &w->size);
  MPI_Comm node;
  rc = MPI_Comm_split_type(w->comm, MPI_COMM_TYPE_SHARED, w->rank, MPI_INFO_NULL, &node);
  if (rc != MPI_SUCCESS) {
    MPI_Comm_free(&w->comm);
    return mpi_fail("MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)", rc);
  }
  MPI_Comm_rank(node, &w->local_rank);
  MPI_Comm_size(node, &w->local_size);
  MPI_Comm_free(&node);
  w->kind = FSDP_WORLD_MPI;
  return FSDP_SUCCESS;
}

/* The split, under the collective deadline: both calls are collective, and a
 * rank that never gets here (failed before MPI_Init returned everywhere, or
 * stopped) would hold the others in them for ever. */
static fsdp_status_t mpi_world_fill(struct fsdp_world *w) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  fsdp_mpi_guard_t *g = fsdp_mpi_guard_begin("world set-up (MPI_Comm_dup, MPI_Comm_split_type)",
                                             rank, w->timeout_s);
  fsdp_status_t st = mpi_world_split(w);
  fsdp_mpi_guard_end(g);
  return st;
}

static fsdp_status_t mpi_world_init(struct fsdp_world *w, int expected) {
  FSDP_TRY(mpi_start());
  mpi_worlds_alive++;
  fsdp_status_t st = mpi_world_fill(w);
  if (st == FSDP_SUCCESS && expected > 0 && expected != w->size) {
    st = fsdp_error(FSDP_ERR_INVALID_USAGE,
                    "world: expected_world_size is %d but the launcher started %d ranks; "
                    "run: mpirun -np %d <program> ... or change expected_world_size",
                    expected, w->size, expected);
    MPI_Comm_free(&w->comm);
  }
  if (st != FSDP_SUCCESS) mpi_stop(w->rank, w->timeout_s);
  return st;
}

static void self_world_init(struct fsdp_world *w) {
  w->rank = 0;
  w->size = 1;
  w->local_rank = 0;
  w->local_size = 1;
  w->kind = FSDP_WORLD_SELF;
  w->comm = MPI_COMM_NULL;
}

static fsdp_status_t env_world_init(struct fsdp_world *w, int expected) {
  fsdp_env_layout_t l;
  if (env_world_alive)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "world: this process already has an env:// "
                      "world; create one and share it (destroy it before making another)");
  FSDP_TRY(fsdp_env_world_start(w->rendezvous_timeout_s, expected, &w->env, &l));
  env_world_alive = 1;
  w->rank = l.rank;
  w->size = l.size;
  w->local_rank = l.local_rank;
  w->local_size = l.local_size;
  w->kind = FSDP_WORLD_ENV;
  w->comm = MPI_COMM_NULL;
  return FSDP_SUCCESS;
}

static fsdp_status_t world_setup(struct fsdp_world *w, const fsdp_world_opts_t *o) {
  switch (o->launch) {
  case FSDP_LAUNCH_SINGLE:
    if (o->expected_world_size > 1)
      return fsdp_error(FSDP_ERR_INVALID_USAGE,
                        "world: FSDP_LAUNCH_SINGLE gives 1 rank but expected_world_size "
                        "is %d; use FSDP_LAUNCH_AUTO under mpirun -np %d",
                        o->expected_world_size, o->expected_world_size);
    self_world_init(w);
    return FSDP_SUCCESS;
  case FSDP_LAUNCH_MPI:
    return mpi_world_init(w, o->expected_world_size);
  case FSDP_LAUNCH_ENV:
    return env_world_init(w, o->expected_world_size);
  case FSDP_LAUNCH_AUTO:
    if (launcher_present()) return mpi_world_init(w, o->expected_world_size);
    if (fsdp_env_requested()) return env_world_init(w, o->expected_world_size);
    FSDP_TRY(check_no_launcher(o->expected_world_size));
    self_world_init(w);
    return FSDP_SUCCESS;
  }
  return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                    "fsdp_world_init: opts->launch is %d, not an fsdp_launch_t value",
                    (int)o->launch);
}

/* A deadline: the option when set, else the environment variable, else the
 * default. */
static fsdp_status_t resolve_seconds(double opt, const char *field, const char *var, double def,
                                     double *out) {
  if (opt < 0 || opt != opt)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_world_init: opts->%s is %g; use 0 "
                      "(the default) or a positive number of seconds", field, opt);
  const char *v = getenv(var);
  *out = opt > 0 ? opt : def;
  if (opt > 0 || !v) return FSDP_SUCCESS;
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (!*v || *end || errno || !(x > 0))
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "%s='%s' is not a positive number of seconds",
                      var, v);
  *out = x;
  return FSDP_SUCCESS;
}

static fsdp_status_t resolve_options(struct fsdp_world *w, const fsdp_world_opts_t *o) {
  FSDP_TRY(resolve_seconds(o->timeout_s, "timeout_s", "FSDP_TIMEOUT_S", FSDP_DEFAULT_TIMEOUT_S,
                           &w->timeout_s));
  FSDP_TRY(resolve_seconds(o->rendezvous_timeout_s, "rendezvous_timeout_s",
                           "FSDP_RENDEZVOUS_TIMEOUT_S", FSDP_DEFAULT_RENDEZVOUS_TIMEOUT_S,
                           &w->rendezvous_timeout_s));
  const char *v = getenv("FSDP_DESYNC_CHECK");
  if (v && strcmp(v, "0") != 0 && strcmp(v, "1") != 0)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "FSDP_DESYNC_CHECK='%s': use 1 (on) or 0 (off)",
                      v);
  /* On unless asked off: the option first, then the environment. */
  w->desync_check = o->desync_check ? o->desync_check == 1 : !(v && *v == '0');
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_world_init(fsdp_world_t *world, const fsdp_world_opts_t *opts) {
  fsdp_world_opts_t resolved = FSDP_WORLD_OPTS_INIT;
  if (opts)
    FSDP_TRY(fsdp_opts_import(&resolved, opts, sizeof resolved, FSDP_WORLD_OPTS_MAGIC,
                              "fsdp_world_opts_t", "FSDP_WORLD_OPTS_INIT"));
  const fsdp_world_opts_t *o = &resolved;
  if (!world) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_world_init: world is NULL");
  if (o->expected_world_size < 0)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT,
                      "fsdp_world_init: expected_world_size is %d; use 0 (any) or a "
                      "positive rank count", o->expected_world_size);
  if (o->desync_check < -1 || o->desync_check > 1)
    return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_world_init: desync_check is %d; use 0 "
                      "(FSDP_DESYNC_CHECK decides), 1 (on) or -1 (off)", o->desync_check);
  struct fsdp_world *w = fsdp_alloc(sizeof *w);
  if (!w) return fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "fsdp_world_init: cannot allocate the world");
  fsdp_status_t st = resolve_options(w, o);
  if (st == FSDP_SUCCESS) st = world_setup(w, o);
  if (st != FSDP_SUCCESS) {
    fsdp_free(w);
    return st;
  }
  /* A self world beside an MPI or env:// world (tests, tools) keeps its rank prefix. */
  if (w->kind != FSDP_WORLD_SELF || (mpi_worlds_alive == 0 && !env_world_alive))
    fsdp_log_set_rank(w->rank);
  fsdp_log(FSDP_LOG_INFO, "world: rank %d of %d (local %d of %d), backend %s, timeout %g s%s",
           w->rank, w->size, w->local_rank, w->local_size, fsdp_world_backend(w), w->timeout_s,
           w->desync_check ? "" : ", desync check off");
  *world = w;
  return FSDP_SUCCESS;
}

void fsdp_world_destroy(fsdp_world_t world) {
  if (!world) return;
  if (world->kind == FSDP_WORLD_MPI) {
    /* A caller that owns MPI may have finalised it already; freeing then is
     * erroneous, and there is nothing left to release. */
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&world->comm);
    mpi_stop(world->rank, world->timeout_s);
  }
  if (world->env) {
    fsdp_env_world_stop(world->env, atomic_load(&world->failed));
    env_world_alive = 0;
  }
  fsdp_free(world);
}

void fsdp_world_abort(fsdp_world_t world, fsdp_status_t status, const char *message) {
  fsdp_world_kind_t kind = world ? world->kind : FSDP_WORLD_SELF;
  fprintf(stderr, "%s%s%s%s\n", message ? message : fsdp_last_error(),
          status ? " [" : "", status ? fsdp_status_string(status) : "", status ? "]" : "");
  if (kind == FSDP_WORLD_MPI && world->size > 1) {
    fprintf(stderr, "fsdp: rank %d: aborting the job (MPI_Abort)\n", world->rank);
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  fflush(stderr);
  fflush(stdout);
  if (world && world->env) {
    fsdp_world_mark_failed(world);
    fsdp_env_world_stop(world->env, 1); /* closes the store without the exit barrier */
  }
  _exit(1);
}

int fsdp_world_rank(fsdp_world_t world) { return world ? world->rank : -1; }
int fsdp_world_size(fsdp_world_t world) { return world ? world->size : -1; }
int fsdp_world_local_rank(fsdp_world_t world) { return world ? world->local_rank : -1; }
int fsdp_world_local_size(fsdp_world_t world) { return world ? world->local_size : -1; }
double fsdp_world_timeout(fsdp_world_t world) { return world ? world->timeout_s : -1.0; }

const char *fsdp_world_backend(fsdp_world_t world) {
  static const char *names[] = {"self", "mpi", "gloo"};
  return world ? names[world->kind] : NULL;
}

int fsdp_world_uses_mpi(fsdp_world_t world) { return world && world->kind == FSDP_WORLD_MPI; }

MPI_Comm fsdp_world_mpi_comm(fsdp_world_t world) {
  return fsdp_world_uses_mpi(world) ? world->comm : MPI_COMM_NULL;
}

/* ---- world_env.h --------------------------------------------------------- */

fsdp_world_kind_t fsdp_world_kind(fsdp_world_t world) {
  return world ? world->kind : FSDP_WORLD_SELF;
}
int fsdp_world_desync_check(fsdp_world_t world) { return world && world->desync_check; }
double fsdp_world_rendezvous_timeout(fsdp_world_t world) {
  return world ? world->rendezvous_timeout_s : 0.0;
}
fsdp_store_t *fsdp_world_store(fsdp_world_t world) {
  return world ? fsdp_env_world_store(world->env) : NULL;
}

fsdp_status_t fsdp_world_store_open(fsdp_world_t world, fsdp_store_t **out) {
  if (!world || !world->env)
    return fsdp_error(FSDP_ERR_UNSUPPORTED, "world: only an env:// world has a store");
  return fsdp_env_world_store_open(world->env, out);
}

const char *fsdp_world_host_address(fsdp_world_t world) {
  return world ? fsdp_env_world_host_address(world->env) : "";
}

int fsdp_world_failed(fsdp_world_t world) { return world && atomic_load(&world->failed); }

void fsdp_world_mark_failed(fsdp_world_t world) {
  if (world) atomic_store(&world->failed, 1);
}

int fsdp_world_next_comm_id(fsdp_world_t world) { return world ? world->next_comm_id++ : 0; }

void *fsdp_world_comm_state(fsdp_world_t world) { return world ? world->comm_state : NULL; }
void fsdp_world_set_comm_state(fsdp_world_t world, void *state) {
  if (world) world->comm_state = state;
}
