/* src/world/world_mpi.h — what the comm layer needs to know about a world.
 * Only src/world and src/comm may include this header (it pulls in mpi.h). */
#ifndef FSDP_WORLD_MPI_H
#define FSDP_WORLD_MPI_H

#include <mpi.h>

#include "fsdp/world.h"

/* 1 when the world runs over MPI, 0 for the single-rank "self" world. */
int fsdp_world_uses_mpi(fsdp_world_t world);
/* The world's own duplicate of MPI_COMM_WORLD (errors return, never abort);
 * MPI_COMM_NULL for a self world. Owned by the world: dup it, never free it. */
MPI_Comm fsdp_world_mpi_comm(fsdp_world_t world);

/* A deadline over one blocking MPI set-up call (MPI_Comm_dup, split,
 * MPI_Finalize) that no watchdog covers because no collective is in flight:
 * a thread waits timeout_s and, unless fsdp_mpi_guard_end came first, prints
 * "rank R: <what> did not complete within ..." and calls MPI_Abort, so a peer
 * that failed or stalled outside a collective cannot hang the job. NULL
 * (the call then runs unguarded, with a warning) when no thread can start. */
typedef struct fsdp_mpi_guard fsdp_mpi_guard_t;
fsdp_mpi_guard_t *fsdp_mpi_guard_begin(const char *what, int rank, double timeout_s);
void fsdp_mpi_guard_end(fsdp_mpi_guard_t *guard);

#endif
