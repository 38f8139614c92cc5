/* fsdp/world.h — the world: which process am I, how many are we.
 *
 * fsdp_world_init finds out how the process was launched:
 *  - under mpirun (Open MPI, MPICH, PMIx), it initialises MPI with
 *    MPI_THREAD_MULTIPLE (communication streams are threads) unless the caller
 *    already did, and reads rank, size and the node-local split;
 *  - without a launcher it is a world of one rank that needs no MPI at all.
 * Asking for more ranks than the launcher provides, or for several ranks without
 * a launcher, is an error that says how to launch instead.
 *
 * Thread safety: init and destroy from the main thread only; the getters are safe
 * from any thread. */
#ifndef FSDP_WORLD_H
#define FSDP_WORLD_H

#include "fsdp/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_world *fsdp_world_t;

typedef enum {
  FSDP_LAUNCH_AUTO = 0, /* mpirun if its environment is present, else single rank */
  FSDP_LAUNCH_MPI,      /* require MPI (fails clearly if MPI cannot start) */
  FSDP_LAUNCH_SINGLE    /* one rank, no MPI, whatever the environment says */
} fsdp_launch_t;

typedef struct {
  fsdp_launch_t launch;
  int expected_world_size; /* 0: accept what the launcher gives; else must match */
} fsdp_world_opts_t;

#define FSDP_WORLD_OPTS_INIT {FSDP_LAUNCH_AUTO, 0}

/* opts may be NULL (defaults). The world owns MPI when it initialised it and
 * finalises it in fsdp_world_destroy. */
FSDP_API fsdp_status_t fsdp_world_init(fsdp_world_t *world, const fsdp_world_opts_t *opts);
FSDP_API void fsdp_world_destroy(fsdp_world_t world);

FSDP_API int fsdp_world_rank(fsdp_world_t world);
FSDP_API int fsdp_world_size(fsdp_world_t world);
FSDP_API int fsdp_world_local_rank(fsdp_world_t world);
FSDP_API int fsdp_world_local_size(fsdp_world_t world);
/* "mpi" or "self" */
FSDP_API const char *fsdp_world_backend(fsdp_world_t world);

#ifdef __cplusplus
}
#endif
#endif
