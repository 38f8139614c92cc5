/* tests/common/mpi_check.c — Check runner for programs under mpirun or
 * fsdp-run: the program's worlds, in-process tests, per-rank failure lines,
 * and one exit status agreed by every rank. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/mpi_check.h"
#include "common/solo_world.h"
#include "fsdp/fsdp.h"

static fsdp_world_t shared_world, solo_world;

/* The shared world (the launcher's), or NULL after printing why. */
static fsdp_world_t shared_or_why(void) {
  fsdp_world_t w = NULL;
  if (fsdp_world_init(&w, NULL) == FSDP_SUCCESS) return w;
  fprintf(stderr, "mpi_check: cannot create the shared world: %s\n", fsdp_last_error());
  return NULL;
}

int mpi_check_join(fsdp_world_t *world, int *rank, int *nranks) {
  if (!shared_world) shared_world = shared_or_why();
  if (!shared_world) return EXIT_FAILURE;
  *world = shared_world;
  *rank = fsdp_world_rank(shared_world);
  *nranks = fsdp_world_size(shared_world);
  return 0;
}

int mpi_check_join_gpu(fsdp_world_t *world, int *rank, int *nranks) {
  const int devices = fsdp_cuda_device_count();
  if (devices == 0) {
    printf("mpi_check: SKIP: no usable CUDA device (or fsdp built without CUDA)\n");
    return 77;
  }
  if (mpi_check_join(world, rank, nranks)) return EXIT_FAILURE;
  if (fsdp_cuda_set_device(fsdp_world_local_rank(*world) % devices) != FSDP_SUCCESS) {
    fprintf(stderr, "mpi_check: rank %d: %s\n", *rank, fsdp_last_error());
    return EXIT_FAILURE;
  }
  return 0;
}

fsdp_world_t mpi_check_solo(void) {
  if (!solo_world && solo_world_init(&solo_world) != FSDP_SUCCESS) {
    fprintf(stderr, "mpi_check: cannot create the solo world: %s\n", fsdp_last_error());
    solo_world = NULL;
  }
  return solo_world;
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

/* Sums the counts over the shared world's ranks with the world's own backend
 * (gloo under fsdp-run); 0, or -1 after printing why. */
static int sum_over_world(double *x, int n) {
  fsdp_comm_t c = NULL;
  fsdp_status_t st = fsdp_comm_create(shared_world, &c);
  if (st == FSDP_SUCCESS) st = fsdp_all_reduce(c, x, x, (size_t)n, FSDP_F64, FSDP_SUM,
                                               FSDP_HOST_STREAM);
  fsdp_comm_destroy(c);
  if (st == FSDP_SUCCESS) return 0;
  fprintf(stderr, "mpi_check: summing failures over the ranks: %s\n", fsdp_last_error());
  return -1;
}

int mpi_check_run(Suite *s) {
  /* A program that made no world yet gets the shared one (MPI under mpirun). */
  if (!shared_world && !(shared_world = shared_or_why())) return EXIT_FAILURE;
  int rank = 0, nranks = 1, alive = mpi_alive();
  if (alive) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  } else {
    rank = fsdp_world_rank(shared_world);
    nranks = fsdp_world_size(shared_world);
  }
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK); /* children cannot join our collectives */
  srunner_run_all(sr, CK_SILENT);
  int local[2] = {srunner_ntests_failed(sr), srunner_ntests_run(sr)}, total[2];
  print_failures(sr, rank);
  fflush(stderr);
  srunner_free(sr);
  double sums[2] = {local[0], local[1]};
  if (alive) {
    MPI_Allreduce(local, total, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  } else {
    if (nranks > 1 && sum_over_world(sums, 2)) sums[0] += 1; /* cannot agree: fail */
    total[0] = (int)sums[0], total[1] = (int)sums[1];
  }
  if (rank == 0)
    printf("mpi_check: %d checks over %d rank(s), %d failed%s\n", total[1], nranks, total[0],
           getenv("FSDP_DESYNC_CHECK") ? " (desync check on)" : "");
  fsdp_world_destroy(solo_world);
  fsdp_world_destroy(shared_world);
  solo_world = shared_world = NULL;
  return total[0] == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
