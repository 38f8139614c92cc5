/* fsdp/world.h — the world: which process am I, how many are we.
 *
 * fsdp_world_init finds out how the process was launched:
 *  - under mpirun (Open MPI, MPICH, PMIx), it initialises MPI with
 *    MPI_THREAD_MULTIPLE (communication streams are threads) unless the caller
 *    already did, and reads rank, size and the node-local split; the
 *    communication backend is "mpi";
 *  - under a torchrun-style launcher (fsdp-run), env://: RANK, WORLD_SIZE,
 *    MASTER_ADDR and MASTER_PORT are set (and no MPI launcher variables).
 *    Rank 0 serves a small TCP key-value store at MASTER_PORT; every rank
 *    connects to MASTER_ADDR:MASTER_PORT, registers and waits for the others.
 *    LOCAL_RANK and LOCAL_WORLD_SIZE give the node-local split (when unset it
 *    is derived from host names). The backend is "gloo" (TCP, no MPI call at
 *    all). A rendezvous that does not complete within the rendezvous timeout
 *    fails on every rank that reached the store with FSDP_ERR_TIMEOUT and the
 *    list of ranks that never joined; a rank that cannot reach the store says
 *    where it looked. GLOO_SOCKET_IFNAME picks the network interface. One
 *    env:// world per process at a time (a second one is FSDP_ERR_INVALID_USAGE);
 *  - without a launcher it is a world of one rank that needs no MPI at all.
 * Asking for more ranks than the launcher provides, or for several ranks without
 * a launcher, is an error that says how to launch instead.
 *
 * Deadlines (collective timeout, rendezvous timeout) and the desync check come
 * from the options, else from the environment (FSDP_TIMEOUT_S,
 * FSDP_RENDEZVOUS_TIMEOUT_S, FSDP_DESYNC_CHECK=0 or 1), else the defaults. They
 * apply to every communicator made from the world (fsdp/comm.h says what
 * happens when a deadline passes).
 *
 * Thread safety: init and destroy from the main thread only; the getters are safe
 * from any thread. fsdp_world_destroy of an env:// world waits (within the
 * rendezvous timeout) until every rank has called it, so that rank 0 never
 * takes the store away from ranks still using it; after a communication
 * failure it does not wait. */
#ifndef FSDP_WORLD_H
#define FSDP_WORLD_H

#include "fsdp/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_world *fsdp_world_t;

typedef enum {
  FSDP_LAUNCH_AUTO = 0, /* mpirun if its environment is present, else env:// if
                           MASTER_ADDR or MASTER_PORT is set, else single rank */
  FSDP_LAUNCH_MPI,      /* require MPI (fails clearly if MPI cannot start) */
  FSDP_LAUNCH_SINGLE,   /* one rank, no MPI, whatever the environment says */
  FSDP_LAUNCH_ENV       /* require env:// (fails naming the missing variables) */
} fsdp_launch_t;

#define FSDP_DEFAULT_TIMEOUT_S 600.0            /* a collective: 10 minutes */
#define FSDP_DEFAULT_RENDEZVOUS_TIMEOUT_S 300.0 /* env:// joining: 5 minutes */

/* World options: start from FSDP_WORLD_OPTS_INIT. size, magic and version
 * first, fields only appended (see fsdp_config_t in engine.h). */
typedef struct {
  size_t size;           /* sizeof(fsdp_world_opts_t) as the caller compiled it */
  unsigned int magic;    /* FSDP_WORLD_OPTS_MAGIC */
  unsigned int version;  /* FSDP_VERSION_CODE */
  fsdp_launch_t launch;  /* FSDP_LAUNCH_AUTO */
  int expected_world_size; /* 0: accept what the launcher gives; else must match */
  /* Deadline of every collective in seconds; 0: FSDP_TIMEOUT_S, else 600. */
  double timeout_s;
  /* env:// only: how long ranks wait for each other to join (and, at destroy,
   * for each other to leave); 0: FSDP_RENDEZVOUS_TIMEOUT_S, else 300. */
  double rendezvous_timeout_s;
  /* The desync check (fsdp/comm.h): every collective first compares a
   * fingerprint (op, unit, count, dtype, sequence number) across ranks and
   * fails on a mismatch instead of hanging or overrunning a buffer (one
   * all-gather of 72 bytes per rank per collective). 0: FSDP_DESYNC_CHECK
   * decides ("0" off, else on: the default is on); 1: on; -1: off. */
  int desync_check;
  int reserved0; /* 0; fills what would be padding (core.h) */
} fsdp_world_opts_t;
FSDP_ASSERT_NO_TAIL(fsdp_world_opts_t, reserved0);

#define FSDP_WORLD_OPTS_MAGIC 0xf5d9c0f2u
#define FSDP_WORLD_OPTS_INIT                                                         \
  {                                                                                  \
    .size = sizeof(fsdp_world_opts_t), .magic = FSDP_WORLD_OPTS_MAGIC,               \
    .version = FSDP_VERSION_CODE, .launch = FSDP_LAUNCH_AUTO, .expected_world_size = 0, \
    .timeout_s = 0.0, .rendezvous_timeout_s = 0.0, .desync_check = 0                 \
  }

/* opts may be NULL (defaults). The world owns MPI when it initialised it and
 * finalises it in fsdp_world_destroy. Errors: FSDP_ERR_INVALID_USAGE for a
 * launch that cannot work or a malformed launch variable (named, with the
 * command that would work), FSDP_ERR_INVALID_ARGUMENT for bad options,
 * FSDP_ERR_TIMEOUT for an env:// rendezvous that did not complete,
 * FSDP_ERR_COMM when MPI or the store's port fails. */
FSDP_API fsdp_status_t fsdp_world_init(fsdp_world_t *world, const fsdp_world_opts_t *opts);
FSDP_API void fsdp_world_destroy(fsdp_world_t world);

FSDP_API int fsdp_world_rank(fsdp_world_t world);
FSDP_API int fsdp_world_size(fsdp_world_t world);
FSDP_API int fsdp_world_local_rank(fsdp_world_t world);
FSDP_API int fsdp_world_local_size(fsdp_world_t world);
/* "mpi", "gloo" (env://) or "self" */
FSDP_API const char *fsdp_world_backend(fsdp_world_t world);
/* The deadline of every collective of this world, in seconds. */
FSDP_API double fsdp_world_timeout(fsdp_world_t world);

/* Ends the whole job because this rank cannot go on (a fatal error after the
 * world is up: bad input, a failed load, a failed collective), so that no
 * other rank waits for it until a deadline. Prints message (one line; NULL:
 * fsdp_last_error()) once to stderr with the status name, then:
 *  - under mpirun: MPI_Abort(MPI_COMM_WORLD, 1); the MPI launcher kills every
 *    rank, those blocked in a collective or in communicator creation
 *    included, within about a second. A rank that instead returned and called
 *    fsdp_world_destroy would block in MPI_Finalize while its peers wait;
 *  - env:// (fsdp-run): marks the world failed (no exit barrier) and exits
 *    with status 1; the launcher stops the others and names this rank as the
 *    root cause. A rank still in a collective with it fails at its deadline;
 *  - a single rank (or a NULL world): exits with status 1.
 * Use it on a trainer's error path whenever the world has more than one rank
 * and the failure may be this rank's alone. status is what failed (printed as
 * its name; FSDP_SUCCESS prints none). Main thread; never returns; engines and
 * communicators are not destroyed (the process ends). */
FSDP_API void fsdp_world_abort(fsdp_world_t world, fsdp_status_t status, const char *message)
    __attribute__((noreturn));

/* ---- elastic worlds: going on without a lost rank ---------------------------
 * Under fsdp-run --min-nproc M (one node) a worker that dies does not end the
 * job while at least M others live: fsdp-run tells each survivor, over a
 * control pipe (FSDP_RUN_CONTROL), its rank in a world of the survivors (old
 * order kept) and a fresh port where that world's rank 0 serves a new store.
 * The survivors' collectives fail meanwhile (the lost peer's connections
 * close, or the watchdog's deadline passes); each survivor then:
 *  1. destroys what it made over the old world: models, engines,
 *     communicators (fsdp_replica_disconnect keeps the snapshots);
 *  2. calls fsdp_world_rejoin, which destroys the old world (without the
 *     exit barrier: it failed) and joins the new one;
 *  3. makes its engine again over the new world (the global batch is split
 *     anew: fsdp_engine_shard_batch) and restores the training state of the
 *     newest complete snapshot (fsdp_replica_restore; or a checkpoint);
 *  4. redoes its per-rank state: the data position is the restored step's,
 *     split by the new rank and world size; per-rank buffers sized by the
 *     micro-batch are sized again; RNG streams keyed by rank are re-keyed.
 * Steps done after the snapshot are done again.
 *
 * Thread safety: fsdp_world_change_pending, fsdp_world_on_change and
 * fsdp_world_rejoin from the main thread only, like init and destroy: the
 * control pipe's unread lines and the change callback are process-wide, and
 * fsdp_world_rejoin sets RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE and MASTER_PORT in the environment (setenv) for the new
 * world, so no other thread may read the environment meanwhile. */

typedef struct {
  int generation;         /* 1 after the first change, 2 after the second, ... */
  int old_rank, old_size; /* this process in the world before (-1, 0: a joining worker) */
  int rank, size;         /* ... and in the new one */
} fsdp_world_change_t;

/* Called by fsdp_world_rejoin once the new world is up (main thread). */
typedef void (*fsdp_world_change_fn)(const fsdp_world_change_t *change, void *user);

/* 1 when the launcher can go on without a lost rank (FSDP_RUN_CONTROL set by
 * fsdp-run --min-nproc), else 0: a failure ends the job as before. */
FSDP_API int fsdp_world_elastic(void);
/* 1 in a worker fsdp-run started to join a running elastic job (fsdp-run
 * --respawn, FSDP_RUN_JOIN=1): it has no world yet and calls
 * fsdp_world_rejoin with *world NULL instead of fsdp_world_init. */
FSDP_API int fsdp_world_joining(void);
/* 1 when fsdp-run has announced a new world this process has not joined
 * (a worker joins; the others make room at their next snapshot boundary).
 * Never blocks; local: ranks may see it at different times, so a trainer
 * agrees on it (one rank's answer, broadcast) before acting. */
FSDP_API int fsdp_world_change_pending(void);
/* 1 once a collective of this world failed (a lost or timed-out peer, a
 * desync): the failure a rejoin answers; 0 otherwise (a trainer's own error,
 * which no launcher word follows). */
FSDP_API int fsdp_world_failed(fsdp_world_t world);
/* Registers fn (NULL: none) to learn of every membership change; user is
 * passed back. One callback per process; the last registration wins. */
FSDP_API void fsdp_world_on_change(fsdp_world_change_fn fn, void *user);
/* After a communication failure in an elastic world, or when a change is
 * pending: destroys *world (which must be an env:// world whose
 * communicators are all destroyed; NULL in a joining worker), waits
 * within the rendezvous timeout for the launcher's word, joins the new world
 * into *world with opts (may be NULL) and fills *change (may be NULL); then
 * calls the change callback. FSDP_ERR_UNSUPPORTED when the world is not
 * elastic (nothing is destroyed); FSDP_ERR_TIMEOUT when no word came (the
 * launcher ends the job: too few ranks left); the rendezvous' errors
 * otherwise. On an error *world is NULL (destroyed) unless UNSUPPORTED. */
FSDP_API fsdp_status_t fsdp_world_rejoin(fsdp_world_t *world, const fsdp_world_opts_t *opts,
                                         fsdp_world_change_t *change);
/* Tells fsdp-run (when it listens) that training resumed in this world from
 * the snapshot of `step`, `lost_steps` updates having been undone, so that
 * its log says so with the time since the loss. Any rank may call it; fsdp-train
 * calls it on rank 0 after the first step done in the new world. */
FSDP_API void fsdp_world_note_resumed(fsdp_world_t world, int64_t step, int64_t lost_steps);

#ifdef __cplusplus
}
#endif
#endif
