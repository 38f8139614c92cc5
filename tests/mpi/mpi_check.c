/* tests/mpi/mpi_check.c — Check runner for programs under mpirun: in-process
 * tests, per-rank failure lines, and one exit status agreed by every rank. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "fsdp/core.h"
#include "mpi/mpi_check.h"

static fsdp_world_t shared_world;

fsdp_world_t fsdp_mpi_check_world(void) {
  if (shared_world) return shared_world;
  if (fsdp_world_init(&shared_world, NULL) != FSDP_SUCCESS) {
    fprintf(stderr, "mpi_check: cannot create the shared world: %s\n", fsdp_last_error());
    shared_world = NULL;
  }
  return shared_world;
}

static int mpi_alive(void) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  return inited && !finalized;
}

static void print_failures(SRunner *sr, int rank) {
  TestResult **failed = srunner_failures(sr);
  int n = srunner_ntests_failed(sr);
  for (int i = 0; i < n; i++)
    fprintf(stderr, "rank %d: %s:%d: %s: %s\n", rank, tr_lfile(failed[i]), tr_lno(failed[i]),
            tr_tcname(failed[i]), tr_msg(failed[i]));
  free(failed);
}

int fsdp_mpi_check_run(Suite *s) {
  /* A program that made no world yet gets the shared one, so MPI is up. */
  if (!mpi_alive() && !fsdp_mpi_check_world()) return EXIT_FAILURE;
  int rank = 0, nranks = 1, alive = mpi_alive();
  if (alive) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  }
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK); /* children cannot join our collectives */
  srunner_run_all(sr, CK_SILENT);
  int local[2] = {srunner_ntests_failed(sr), srunner_ntests_run(sr)}, total[2];
  print_failures(sr, rank);
  fflush(stderr);
  srunner_free(sr);
  if (alive)
    MPI_Allreduce(local, total, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  else
    total[0] = local[0], total[1] = local[1];
  if (rank == 0)
    printf("mpi_check: %d checks over %d rank(s), %d failed\n", total[1], nranks, total[0]);
  if (shared_world) fsdp_world_destroy(shared_world);
  shared_world = NULL;
  return total[0] == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
