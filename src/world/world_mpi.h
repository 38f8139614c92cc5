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

#endif
