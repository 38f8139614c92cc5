/* tests/mpi/mpi_check.h — the harness every multi-rank test program uses,
 * under mpirun (MPI world) or fsdp-run (env:// world, gloo).
 *
 * Check runs in-process (CK_NOFORK) because forked children cannot take part in
 * the parent's MPI collectives. Each rank prints its own failures; the failure
 * count is summed over MPI_COMM_WORLD and rank 0 prints one summary line, so
 * every rank exits with the same status.
 *
 * MPI is initialised by fsdp_world_init (MPI_THREAD_MULTIPLE), never by the
 * harness itself. Two ways to use it:
 *
 *   1. Own the world:
 *        fsdp_world_t world;  fsdp_world_init(&world, NULL);
 *        int rc = fsdp_mpi_check_run(my_suite());   // after init ...
 *        fsdp_world_destroy(world);                  // ... before destroy
 *        return rc;
 *
 *   2. Let the harness own one shared world: tests (or main) call
 *      fsdp_mpi_check_world(), which creates it on first use;
 *      fsdp_mpi_check_run destroys it after the failure count is reduced.
 *        return fsdp_mpi_check_run(my_suite());
 *
 * Either way, some world must be alive when the failure count is reduced: over
 * MPI_COMM_WORLD when MPI is up, else over the shared world's own backend
 * (fsdp-run), else (a world of one) the count is simply this process's. */
#ifndef FSDP_TESTS_MPI_CHECK_H
#define FSDP_TESTS_MPI_CHECK_H

#include <check.h>

#include "fsdp/world.h"

/* Runs every test of s (CK_NOFORK), frees s, and returns EXIT_SUCCESS when no
 * rank had a failure, else EXIT_FAILURE. Collective over MPI_COMM_WORLD. */
int fsdp_mpi_check_run(Suite *s);

/* The harness's shared world (FSDP_LAUNCH_AUTO), created on first call; NULL
 * (after printing why) when it cannot be created. */
fsdp_world_t fsdp_mpi_check_world(void);

#endif
