/* tests/cuda/nccl_stall.c — the rank program of the NCCL watchdog test
 * (nccl_watchdog.sh): under mpirun or fsdp-run, every rank issues tagged
 * all-reduces ("unit" h.<i>) on the nccl backend on a CUDA stream, as the
 * engine does, and waits for them. With FSDP_SIM_NCCL_STALL one rank never
 * arrives at one of them; the watchdog must then report it and end the job
 * (MPI_Abort under mpirun; FSDP_ERR_TIMEOUT from the next call under
 * fsdp-run).
 * Prints "nccl-stall: rank R pid P" first so the driver can look for
 * leftovers. Exits 0 only when every collective completed, EXIT_FAILURE
 * when a call failed (the error printed), 77 without a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/mpi_check.h"
#include "comm/comm_internal.h"
#include "core/internal.h"
#include "cuda_gate.h"
#include "fsdp/fsdp.h"

#define N_COLLS 6
#define COUNT 256

/* Issues and waits for N_COLLS all-reduces; the first failure, printed. */
static fsdp_status_t run(fsdp_comm_t comm, fsdp_stream_t s, float *buf) {
  for (int i = 1; i <= N_COLLS; i++) {
    char tag[16];
    snprintf(tag, sizeof tag, "h.%d", i);
    fsdp_comm_set_tag(comm, tag);
    FSDP_TRY(fsdp_all_reduce(comm, buf, buf, COUNT, FSDP_F32, FSDP_SUM, s));
    FSDP_TRY(fsdp_stream_synchronize(s));
  }
  return FSDP_SUCCESS;
}

int main(void) {
  const int gate = fsdp_cuda_gate("nccl_stall");
  if (gate) return gate;
  fsdp_world_t world;
  int rank, nranks;
  int rc = mpi_check_join_gpu(&world, &rank, &nranks);
  if (rc) return rc;
  printf("nccl-stall: rank %d pid %d\n", rank, (int)getpid());
  fflush(stdout);
  fsdp_comm_t comm = NULL;
  fsdp_stream_t s = NULL;
  float *buf = NULL;
  fsdp_status_t st = fsdp_comm_create_backend(world, "nccl", &comm);
  if (st == FSDP_SUCCESS) st = fsdp_stream_create_cuda("stall", 1, &s);
  if (st == FSDP_SUCCESS)
    st = fsdp_device_alloc(FSDP_DEVICE_CUDA, COUNT * sizeof *buf, (void **)&buf);
  if (st == FSDP_SUCCESS) st = run(comm, s, buf);
  if (st != FSDP_SUCCESS)
    fprintf(stderr, "nccl-stall: rank %d: %s (%s)\n", rank, fsdp_last_error(),
            fsdp_status_string(st));
  if (buf) fsdp_device_free(FSDP_DEVICE_CUDA, buf);
  if (s) fsdp_stream_destroy(s);
  if (comm) fsdp_comm_destroy(comm);
  fsdp_world_destroy(world);
  return st == FSDP_SUCCESS ? EXIT_SUCCESS : EXIT_FAILURE;
}
