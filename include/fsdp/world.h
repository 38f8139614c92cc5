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

#ifdef __cplusplus
}
#endif
#endif
