/* tests/common/mpi_check.h — the harness every multi-rank test program uses,
 * under mpirun (MPI world) or fsdp-run (env:// world, gloo).
 *
 * Check runs in-process (CK_NOFORK) because forked children cannot take part in
 * the parent's MPI collectives. Each rank prints its own failures; the failure
 * count is summed over the ranks and rank 0 prints one summary line, so every
 * rank exits with the same status.
 *
 * The harness owns the program's world: MPI is initialised by fsdp_world_init
 * (MPI_THREAD_MULTIPLE) when mpi_check_join creates it, never by the harness
 * itself. A program's main is
 *
 *   static fsdp_world_t world;
 *   static int rank, nranks;
 *   int main(void) {
 *     if (mpi_check_join(&world, &rank, &nranks)) return EXIT_FAILURE;
 *     return mpi_check_run(my_suite());   // destroys the world
 *   }
 *
 * mpi_check_join_gpu does the same and picks this rank's GPU first (exit 77
 * without one); mpi_check_solo adds a world of one beside the shared one. The
 * failure count is reduced over MPI_COMM_WORLD when MPI is up, else over the
 * shared world's own backend (fsdp-run), else (a world of one) it is simply
 * this process's. */
#ifndef FSDP_TESTS_COMMON_MPI_CHECK_H
#define FSDP_TESTS_COMMON_MPI_CHECK_H

#include <check.h>

#include "fsdp/world.h"

/* Creates the harness's shared world (FSDP_LAUNCH_AUTO: MPI under mpirun,
 * env:// under fsdp-run) and stores it, this rank and the world size through
 * the pointers. 0, or EXIT_FAILURE after printing why. */
int mpi_check_join(fsdp_world_t *world, int *rank, int *nranks);

/* mpi_check_join for a GPU program: first 77 (skipped, with a line saying
 * why) where no CUDA device is usable or fsdp has no CUDA; after the join,
 * makes device local rank % device count current (ranks share devices where
 * there are fewer devices than local ranks). 0, 77 or EXIT_FAILURE. */
int mpi_check_join_gpu(fsdp_world_t *world, int *rank, int *nranks);

/* A world of one (FSDP_LAUNCH_SINGLE) beside the shared one, for references
 * every rank computes alone; created on first call, NULL (after printing why)
 * when it cannot be. Call it after mpi_check_join. */
fsdp_world_t mpi_check_solo(void);

/* Runs every test of s (CK_NOFORK), frees s, reduces the failure count over
 * the ranks, destroys the harness's worlds (the solo one first), and returns
 * EXIT_SUCCESS when no rank had a failure, else EXIT_FAILURE. Collective. */
int mpi_check_run(Suite *s);

#endif
